//! The ADS protocol over a real socket, seen by a raw client built on Envoy's protos: nothing
//! before the sources are synced, an answer per subscription, ACKed versions not resent, a new
//! version pushed when it changes what the client holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use dubbo_cp_xds::{CLUSTER, ENDPOINT, LISTENER};

struct Client {
    requests: mpsc::Sender<DiscoveryRequest>,
    responses: Streaming<DiscoveryResponse>,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Client {
        Client::connect_raw(addr).await.unwrap()
    }

    async fn connect_raw(addr: std::net::SocketAddr) -> Result<Client, tonic::Status> {
        let mut ads = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (requests, rx) = mpsc::channel(16);
        let responses = ads
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Client {
            requests,
            responses,
        })
    }

    async fn send(&self, type_url: &str, names: &[&str], version: &str, nonce: &str) {
        let request = DiscoveryRequest {
            type_url: type_url.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        };
        self.requests.send(request).await.unwrap();
    }

    /// Rejects `response` (a NACK): its nonce, the last good version, and why.
    async fn nack(&self, names: &[&str], good: &str, response: &DiscoveryResponse, why: &str) {
        let request = DiscoveryRequest {
            type_url: response.type_url.clone(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            version_info: good.into(),
            response_nonce: response.nonce.clone(),
            error_detail: Some(envoy_types::pb::google::rpc::Status {
                code: 3,
                message: why.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.requests.send(request).await.unwrap();
    }

    async fn next(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(10), self.responses.message())
            .await
            .expect("a response within 10 s")
            .unwrap()
            .expect("the stream is open")
    }

    /// Whether a response arrives within `wait` (used only to show that none does).
    async fn silent_for(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.responses.message())
            .await
            .is_err()
    }
}

fn ports_of(response: &DiscoveryResponse) -> Vec<String> {
    let assignment = ClusterLoadAssignment::decode(response.resources[0].value.as_slice()).unwrap();
    let mut found: Vec<String> = assignment
        .endpoints
        .iter()
        .flat_map(|l| l.lb_endpoints.iter())
        .map(|lb| format!("{lb:?}"))
        .collect();
    found.sort();
    found
}

#[tokio::test]
async fn nothing_is_answered_before_the_sources_are_synced_then_everything_asked() {
    let server = support::Server::start().await;
    let mut client = Client::connect(server.addr).await;
    client.send(LISTENER, &["greeter:7070"], "", "").await;
    // An answer now would say the listener does not exist. A negative can only be shown over a
    // window; the version check below is what fails if the unsynced state was answered.
    assert!(client.silent_for(Duration::from_millis(300)).await);
    server.publish(vec![support::greeter("default", &[(9001, 1)])]);
    let listeners = client.next().await;
    assert_eq!(listeners.type_url, LISTENER);
    assert_eq!(listeners.version_info, "1");
    assert_eq!(listeners.resources.len(), 1);
}

#[tokio::test]
async fn acked_versions_are_not_resent_and_changes_are_pushed() {
    let server = support::Server::start().await;
    server.publish(vec![support::greeter("default", &[(9001, 1)])]);
    let mut client = Client::connect(server.addr).await;
    let cluster = "outbound|7070||greeter.default.svc.cluster.local";
    client.send(ENDPOINT, &[cluster], "", "").await;
    let first = client.next().await;
    assert_eq!(
        (first.type_url.as_str(), first.version_info.as_str()),
        (ENDPOINT, "1")
    );
    client.send(ENDPOINT, &[cluster], "1", &first.nonce).await;
    server.acked(ENDPOINT, "1").await;

    // Version 2 changes nothing this client holds. A listener request answered at version 2
    // shows the stream has it; no endpoints come before or with it.
    server.publish(vec![
        support::greeter("default", &[(9001, 1)]),
        support::greeter("other", &[(9009, 1)]),
    ]);
    server.published_to_all("2").await;
    client.send(LISTENER, &["greeter:7070"], "", "").await;
    let listeners = client.next().await;
    assert_eq!(
        (listeners.type_url.as_str(), listeners.version_info.as_str()),
        (LISTENER, "2")
    );

    // Version 3 changes its endpoints, published while the client's next request (an ACK of
    // the listeners that also asks for another one) is on its way: the request must not
    // swallow the push.
    server.publish(vec![support::greeter("default", &[(9001, 1), (9002, 1)])]);
    client
        .send(
            LISTENER,
            &["greeter:7070", "greeter.default:7070"],
            "2",
            &listeners.nonce,
        )
        .await;
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|r: &DiscoveryResponse| r.type_url == ENDPOINT)
    {
        seen.push(client.next().await);
    }
    let pushed = seen.iter().find(|r| r.type_url == ENDPOINT).unwrap();
    assert_eq!(pushed.version_info, "3");
    assert_ne!(pushed.nonce, first.nonce);
    assert_eq!(ports_of(pushed).len(), 2);
    assert_ne!(ports_of(pushed), ports_of(&first));
}

/// `greeter` in `default` (A) and in `other` (B) with these endpoints.
fn services(a: &[(u16, u32)], b: &[(u16, u32)]) -> Vec<dubbo_cp_domain::service::Service> {
    vec![support::greeter("default", a), support::greeter("other", b)]
}

const A: &str = "outbound|7070||greeter.default.svc.cluster.local";
const B: &str = "outbound|7070||greeter.other.svc.cluster.local";

/// A server publishing A and B with one endpoint each, and a client connected to it.
async fn two_services() -> (support::Server, Client) {
    let server = support::Server::start().await;
    server.publish(services(&[(9001, 1)], &[(9101, 1)]));
    let client = Client::connect(server.addr).await;
    (server, client)
}

/// A load assignment's cluster and its number of endpoints.
fn counted(any: &envoy_types::pb::google::protobuf::Any) -> (String, usize) {
    let assignment = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
    let endpoints = assignment
        .endpoints
        .iter()
        .map(|l| l.lb_endpoints.len())
        .sum();
    (assignment.cluster_name, endpoints)
}

#[tokio::test]
async fn a_version_where_only_endpoints_moved_pushes_them_and_nothing_else() {
    let (server, mut client) = two_services().await;
    let (a, b) = (A, B);
    for type_url in [CLUSTER, ENDPOINT] {
        client.send(type_url, &[a, b], "", "").await;
        let response = client.next().await;
        assert_eq!(response.resources.len(), 2);
        client.send(type_url, &[a, b], "1", &response.nonce).await;
        server.acked(type_url, "1").await;
    }
    let assignments = |response: &DiscoveryResponse| -> Vec<(String, usize)> {
        let mut found: Vec<(String, usize)> = response.resources.iter().map(counted).collect();
        found.sort();
        found
    };

    // Only a's endpoints move: its load assignment comes (alone: load assignments need not be
    // resent unchanged), and no clusters (they encode alike).
    server.publish_following(services(&[(9001, 1), (9002, 1)], &[(9101, 1)]));
    let pushed = client.next().await;
    assert_eq!(
        (pushed.type_url.as_str(), pushed.version_info.as_str()),
        (ENDPOINT, "2")
    );
    assert_eq!(assignments(&pushed), [(a.to_owned(), 2)]);
    client.send(ENDPOINT, &[a, b], "2", &pushed.nonce).await;
    server.acked(ENDPOINT, "2").await;
    assert!(
        client.silent_for(Duration::from_millis(300)).await,
        "no cluster push"
    );
    // Nothing but a's assignment was looked up: b's is the one the stream holds, and the
    // clusters were skipped. The version encoded one resource.
    assert_eq!(server.snapshots.borrow().encodes(), 1);

    // Two versions in a row, b's then a's change: a stream that takes only the last in hand
    // (it did not hold the one before) looks everything up, and has both.
    server.publish_following(services(&[(9001, 1), (9002, 1)], &[(9101, 1), (9102, 1)]));
    server.publish_following(services(&[(9001, 1)], &[(9101, 1), (9102, 1)]));
    let mut last = client.next().await;
    while last.version_info != "4" {
        assert_eq!(last.type_url, ENDPOINT);
        client
            .send(ENDPOINT, &[a, b], &last.version_info, &last.nonce)
            .await;
        last = client.next().await;
    }
    assert_eq!(last.type_url, ENDPOINT);
    assert!(assignments(&last).contains(&(a.to_owned(), 1)));
    server.published_to_all("4").await;
    // What the client holds, response by response: both services' latest.
    let held = &server.clients.list()[0].types[ENDPOINT].held;
    let holds: Vec<(String, usize)> = held
        .values()
        .map(|held| counted(held.resource.as_ref().unwrap()))
        .collect();
    assert_eq!(holds, [(a.to_owned(), 1), (b.to_owned(), 2)]);
    assert_eq!(
        server.clients.list()[0].types[CLUSTER].sent.as_deref(),
        Some("1")
    );
}

#[tokio::test]
async fn load_assignments_a_client_rejected_are_sent_again_with_the_next_change() {
    let (server, mut client) = two_services().await;
    let (a, b) = (A, B);
    client.send(ENDPOINT, &[a, b], "", "").await;
    let first = client.next().await;
    client.send(ENDPOINT, &[a, b], "1", &first.nonce).await;
    server.acked(ENDPOINT, "1").await;
    // Both change; the client rejects the response.
    server.publish(services(&[(9002, 1)], &[(9102, 1)]));
    let rejected = client.next().await;
    assert_eq!(rejected.resources.len(), 2);
    client.nack(&[a, b], "1", &rejected, "bad endpoints").await;
    server
        .clients
        .wait_for(|clients| clients[0].types[ENDPOINT].nack.is_some())
        .await;
    // Only b changes next: a goes again too, as the client holds its version 1, not 2.
    server.publish_following(services(&[(9002, 1)], &[(9103, 1)]));
    let next = client.next().await;
    let mut names: Vec<(String, usize)> = next.resources.iter().map(counted).collect();
    names.sort();
    assert_eq!(names, [(a.to_owned(), 1), (b.to_owned(), 1)]);
    client.send(ENDPOINT, &[a, b], "3", &next.nonce).await;
    server.acked(ENDPOINT, "3").await;
    // Acknowledged, only what changes is sent again.
    server.publish_following(services(&[(9002, 1), (9003, 1)], &[(9103, 1)]));
    let last = client.next().await;
    assert_eq!(
        last.resources.iter().map(counted).collect::<Vec<_>>(),
        [(a.to_owned(), 2)]
    );
}

#[tokio::test]
async fn unknown_types_are_ignored_and_oversized_subscriptions_end_the_stream() {
    let server = support::Server::start().await;
    server.publish(vec![support::greeter("default", &[(9001, 1)])]);
    let mut client = Client::connect(server.addr).await;
    // Envoy asks for secrets over ADS too: not answered, and the stream goes on.
    client
        .send(
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            &["s"],
            "",
            "",
        )
        .await;
    client.send(LISTENER, &["greeter:7070"], "", "").await;
    assert_eq!(client.next().await.type_url, LISTENER);
    let names: Vec<String> = (0..=10_000).map(|i| format!("n{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    client.send(ENDPOINT, &names, "", "").await;
    let status = tokio::time::timeout(Duration::from_secs(10), client.responses.message())
        .await
        .expect("an answer")
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("at most 10000"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn streams_past_the_limit_are_refused_and_a_closed_one_frees_its_place() {
    let server = support::Server::start_with(1).await;
    server.publish(vec![]);
    let mut first = Client::connect(server.addr).await;
    first.send(LISTENER, &[], "", "").await;
    first.next().await;
    let Err(refused) = Client::connect_raw(server.addr).await else {
        panic!("one stream at most");
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("1 xDS streams"),
        "{}",
        refused.message()
    );
    drop(first);
    server.clients.wait_for(|clients| clients.is_empty()).await;
    let mut third = Client::connect(server.addr).await;
    third.send(LISTENER, &[], "", "").await;
    assert_eq!(third.next().await.type_url, LISTENER);
    assert!(
        Client::connect_raw(server.addr).await.is_err(),
        "the third holds the one place"
    );
}

#[tokio::test]
async fn a_removed_service_leaves_its_listener_before_its_cluster() {
    let server = support::Server::start().await;
    server.publish(vec![
        support::greeter("default", &[(9001, 1)]),
        support::greeter("shop", &[(9101, 1)]),
    ]);
    let mut client = Client::connect(server.addr).await;
    client.send(CLUSTER, &[], "", "").await;
    let clusters = client.next().await;
    assert_eq!(clusters.resources.len(), 2);
    client.send(CLUSTER, &[], "1", &clusters.nonce).await;
    client.send(LISTENER, &["greeter.shop:7070"], "", "").await;
    let listeners = client.next().await;
    assert_eq!(listeners.resources.len(), 1);
    client
        .send(LISTENER, &["greeter.shop:7070"], "1", &listeners.nonce)
        .await;
    server.acked(LISTENER, "1").await;

    server.publish(vec![support::greeter("default", &[(9001, 1)])]);
    let first = client.next().await;
    let second = client.next().await;
    assert_eq!(
        (first.type_url.as_str(), first.resources.len()),
        (LISTENER, 0),
        "the listener goes first"
    );
    assert_eq!(
        (second.type_url.as_str(), second.resources.len()),
        (CLUSTER, 1),
        "then the cluster"
    );
}

#[tokio::test]
async fn a_nack_keeps_that_client_on_its_last_good_version_while_others_move_on() {
    let server = support::Server::start().await;
    server.publish(vec![support::greeter("default", &[(9001, 1)])]);
    let cluster = "outbound|7070||greeter.default.svc.cluster.local";
    let mut rejecting = Client::connect(server.addr).await;
    let mut accepting = Client::connect(server.addr).await;
    for client in [&mut rejecting, &mut accepting] {
        client.send(ENDPOINT, &[cluster], "", "").await;
        let first = client.next().await;
        client.send(ENDPOINT, &[cluster], "1", &first.nonce).await;
    }
    server.acked(ENDPOINT, "1").await;

    // Version 2: one client rejects it, the other takes it.
    server.publish(vec![support::greeter("default", &[(9001, 1), (9002, 1)])]);
    let pushed = rejecting.next().await;
    assert_eq!(pushed.version_info, "2");
    rejecting
        .nack(&[cluster], "1", &pushed, "cannot apply: locality weight")
        .await;
    let taken = accepting.next().await;
    accepting
        .send(ENDPOINT, &[cluster], "2", &taken.nonce)
        .await;
    fn status(clients: &[dubbo_cp_xds::clients::ClientStatus], acked: &str, nacked: bool) -> bool {
        clients.iter().any(|c| {
            c.types
                .get(ENDPOINT)
                .is_some_and(|t| t.acked.as_deref() == Some(acked) && t.nack.is_some() == nacked)
        })
    }
    let both = server
        .clients
        .wait_for(|clients| status(clients, "1", true) && status(clients, "2", false));
    tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .unwrap_or_else(|_| panic!("{:?}", server.clients.list()));
    let views = server.clients.views();
    let nack = views
        .iter()
        .flat_map(|c| c.types.iter())
        .find_map(|t| t.nack.clone())
        .unwrap();
    assert_eq!(
        (nack.version.as_str(), nack.message.as_str()),
        ("2", "cannot apply: locality weight")
    );
    let nacks = server
        .stats
        .nacks
        .get_or_create(&dubbo_cp_xds::stats::TypeLabel::of(ENDPOINT))
        .get();
    assert_eq!(nacks, 1);
    // The rejected version is not sent again; the stream stays open.
    assert!(rejecting.silent_for(Duration::from_millis(300)).await);

    // The next good version reaches it, and its ACK clears the rejection.
    server.publish(vec![support::greeter("default", &[(9001, 1), (9003, 1)])]);
    let next = rejecting.next().await;
    assert_eq!(next.version_info, "3");
    rejecting.send(ENDPOINT, &[cluster], "3", &next.nonce).await;
    let cleared = server
        .clients
        .wait_for(|clients| status(clients, "3", false));
    tokio::time::timeout(Duration::from_secs(10), cleared)
        .await
        .unwrap_or_else(|_| panic!("{:?}", server.clients.list()));
}

/// `message`, or a failure after 10 s: a hang fails the test instead of stalling it.
async fn within<T>(message: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), message)
        .await
        .expect("within 10 s")
}

#[tokio::test]
async fn at_shutdown_every_stream_ends_unavailable_even_one_opened_after_it() {
    let (down, shutdown) = tokio::sync::watch::channel(false);
    let server = support::Server::start_with_shutdown(shutdown).await;
    server.publish(vec![support::greeter("default", &[(9001, 1)])]);
    let cluster = "outbound|7070||greeter.default.svc.cluster.local";
    let mut open = Client::connect(server.addr).await;
    open.send(ENDPOINT, &[cluster], "", "").await;
    open.next().await;
    down.send(true).unwrap();
    let ended = |result: Result<Option<DiscoveryResponse>, tonic::Status>| match result {
        Err(status) => status.code(),
        Ok(Some(_)) => tonic::Code::Ok,
        Ok(None) => panic!("the stream ended OK; a client would not know to reconnect"),
    };
    assert_eq!(
        ended(within(open.responses.message()).await),
        tonic::Code::Unavailable
    );
    // A stream opened during the shutdown (a client reconnecting to a draining server) may be
    // answered first, but it too ends UNAVAILABLE. The stream's loop picks among ready
    // branches at random, so several streams take each path; before, one sending its answer
    // when it saw the shutdown ended OK.
    for _ in 0..20 {
        let mut late = Client::connect(server.addr).await;
        late.send(ENDPOINT, &[cluster], "", "").await;
        loop {
            match ended(within(late.responses.message()).await) {
                tonic::Code::Ok => continue,
                code => {
                    assert_eq!(code, tonic::Code::Unavailable);
                    break;
                }
            }
        }
    }
}
