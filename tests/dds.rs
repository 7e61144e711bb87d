//! The discovery stream over real gRPC against a real server on 127.0.0.1:0.
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;

use common::{
    Observer, SNP_TYPE, TAG_TYPE, channel, client, mappings_of, request, start, test_config,
};
use dubbo_cp::config::Config;
use dubbo_cp::index::{Change, Kind};
use tonic::Code;

/// Debounce off, so each registration is published at once and tests need no waiting.
fn fast_config(dir: &std::path::Path) -> Config {
    common::undebounced_config(dir)
}

async fn register(addr: std::net::SocketAddr, namespace: &str, app: &str, interfaces: &[&str]) {
    let reply = client(addr)
        .await
        .register_service_app_mapping(request(namespace, app, interfaces))
        .await;
    assert!(reply.map(|r| r.into_inner().success).unwrap_or(false));
}

#[tokio::test]
async fn existing_state_on_subscribe_then_changes_after_ack() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    register(
        server.grpc_addr,
        "dubbo-demo",
        "demo-provider",
        &["org.apache.dubbo.demo.DemoService"],
    )
    .await;
    // The state must be there before the subscribe.
    common::wait_published(&server, 1).await;

    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    assert_eq!(first.r#type, SNP_TYPE);
    assert_eq!(first.nonce, "1");
    assert!(first.revision > 0);
    let state = mappings_of(&first);
    let (interface, apps) = state
        .get("org-apache-dubbo-demo-demoservice/dubbo-demo")
        .cloned()
        .expect("missing mapping in {state:?}");
    assert_eq!(interface, "org.apache.dubbo.demo.DemoService");
    assert_eq!(apps, BTreeSet::from(["demo-provider".to_string()]));
    for any in first.data.decode().unwrap_or_default() {
        assert_eq!(
            any.type_url,
            "type.googleapis.com/dubbo.apache.org.v1alpha1.ServiceNameMappingToClient"
        );
    }

    observer.ack(&first).await;
    register(
        server.grpc_addr,
        "dubbo-demo",
        "second-provider",
        &["org.apache.dubbo.demo.DemoService"],
    )
    .await;
    let second = observer.next().await;
    assert_eq!(second.nonce, "2");
    assert!(second.revision > first.revision);
    let apps = mappings_of(&second)
        .get("org-apache-dubbo-demo-demoservice/dubbo-demo")
        .map(|(_, a)| a.len());
    assert_eq!(apps, Some(2));
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn another_kind_receives_nothing_for_mapping_changes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(TAG_TYPE).await;
    let first = observer.next().await;
    assert_eq!(first.r#type, TAG_TYPE);
    assert_eq!(
        first.data.decode().map(|d| d.len()).ok(),
        Some(0),
        "an empty state is a valid state"
    );
    observer.ack(&first).await;
    register(server.grpc_addr, "ns", "app", &["I"]).await;
    common::wait_published(&server, 1).await;
    // A later change of the subscribed kind: the next response must be it, so nothing was sent
    // for the mapping change before it.
    let rule = dubbo_cp::rules::parse_manifests(
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: t, namespace: ns}\n\
         spec: {key: app, configVersion: v3.0, tags: [{name: grey, addresses: [10.0.0.1]}]}\n",
    )
    .unwrap()
    .remove(0);
    let value = dubbo_cp::index::Resource::Rule(rule.spec.clone());
    let tag = dubbo_cp::dds::encode::to_any("t/ns", &value);
    assert!(
        server
            .index
            .apply(Kind::TagRoute, [Change::Upsert("t/ns".into(), value)], 0)
    );
    let next = observer.next().await;
    assert_eq!(next.r#type, TAG_TYPE);
    assert_eq!(next.nonce, "2");
    assert_eq!(next.data.decode().ok(), Some(vec![tag]));
    assert_eq!(
        server.dds_stats.pushes.load(Ordering::SeqCst),
        2,
        "a push besides the two TagRoute states"
    );
    assert!(server.stop().await.is_ok());
}

/// Waits until the server has counted `n` stale nonces: every request sent before the one that
/// made it `n` has been handled (a stream handles its requests in order).
async fn wait_stale_nonces(server: &dubbo_cp::server::RunningServer, n: u64) {
    let stale = &server.dds_stats.stale_nonces;
    let counted = tokio::time::timeout(Duration::from_secs(10), async {
        while stale.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "{} stale nonces counted, waited for {n}",
        stale.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn changes_before_an_ack_coalesce_into_one_response_with_the_newest_state() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let pushes = || server.dds_stats.pushes.load(Ordering::SeqCst);
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    for app in ["a", "b", "c"] {
        register(server.grpc_addr, "ns", app, &["I"]).await;
    }
    common::wait_published_apps(&server, "i/ns", 3).await;
    // Wrong nonces: ignored, nothing sent, nothing wedged. The last one is counted once the
    // others were handled.
    observer.send("999", SNP_TYPE).await;
    observer.send("", "dubbo.apache.org/v1alpha1/Unknown").await;
    observer.send("", "").await;
    observer.send("998", SNP_TYPE).await;
    wait_stale_nonces(&server, 2).await;
    assert_eq!(pushes(), 1, "a wrong nonce released a response");

    observer.ack(&first).await;
    let second = observer.next().await;
    assert_eq!(second.nonce, "2");
    let apps = mappings_of(&second)
        .get("i/ns")
        .map(|(_, a)| a.clone())
        .unwrap_or_default();
    assert_eq!(
        apps,
        BTreeSet::from(["a".to_string(), "b".to_string(), "c".to_string()])
    );
    observer.ack(&second).await;
    // The stale nonce again and a repeated subscribe: no duplicate.
    observer.ack(&first).await;
    observer.subscribe(SNP_TYPE).await;
    observer.send("997", SNP_TYPE).await;
    wait_stale_nonces(&server, 4).await;
    assert_eq!(pushes(), 2, "the same state was sent twice");
    // And the next response is the next change.
    register(server.grpc_addr, "ns", "d", &["I"]).await;
    let third = observer.next().await;
    assert_eq!(third.nonce, "3");
    assert_eq!(
        mappings_of(&third).get("i/ns").map(|(_, a)| a.len()),
        Some(4)
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn a_first_message_with_a_nonce_does_not_subscribe() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.send("1", SNP_TYPE).await;
    // Handled as a stale nonce, not as a subscription.
    wait_stale_nonces(&server, 1).await;
    register(server.grpc_addr, "ns", "app", &["I"]).await;
    common::wait_published(&server, 1).await;
    assert_eq!(server.dds_stats.pushes.load(Ordering::SeqCst), 0);
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    assert_eq!(first.nonce, "1");
    assert!(mappings_of(&first).contains_key("i/ns"));
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_reaches_a_hundred_concurrent_streams() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let mut connections = Vec::new();
    for _ in 0..10 {
        connections.push(channel(server.grpc_addr).await);
    }
    let mut observers = Vec::new();
    for i in 0..100 {
        // Ten connections, ten streams each.
        let connection = connections[i % connections.len()].clone();
        let mut observer = Observer::connect(connection).await.unwrap();
        observer.subscribe(SNP_TYPE).await;
        let first = observer.next().await;
        observer.ack(&first).await;
        observers.push(observer);
    }
    register(server.grpc_addr, "ns", "app", &["org.example.Hello"]).await;
    let receivers: Vec<_> = observers
        .into_iter()
        .map(|mut observer| {
            tokio::spawn(async move {
                let response = observer.next().await;
                mappings_of(&response).contains_key("org-example-hello/ns")
            })
        })
        .collect();
    for receiver in receivers {
        assert_eq!(receiver.await.ok(), Some(true));
    }
    assert!(server.stop().await.is_ok());
}

/// A gRPC message as it goes on the wire: not compressed, big-endian length, message.
fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + body.len());
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

/// A raw HTTP/2 connection (no gRPC library) whose streams may receive `window` bytes before
/// the client releases them.
async fn raw_h2(addr: SocketAddr, window: u32) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake(tcp)
        .await
        .unwrap();
    // Drives the connection: reads frames into the streams' buffers, answers PINGs.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// Opens `Observe` on a raw connection and subscribes to `type`. The response body is returned
/// unread; the request stream is kept open.
async fn raw_observe(
    send: h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    r#type: &str,
) -> (h2::RecvStream, h2::SendStream<Bytes>) {
    let mut send = send.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://{addr}/org.apache.dubbo.auth.v1alpha1.RuleService/Observe"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut requests) = send.send_request(request, false).unwrap();
    let subscribe = dubbo_cp::pb::dds::ObserveRequest {
        nonce: String::new(),
        r#type: r#type.into(),
    };
    requests.send_data(grpc_frame(&subscribe), false).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers().get("grpc-status").is_none(),
        "stream refused: {:?}",
        response.headers()
    );
    (response.into_body(), requests)
}

/// The stuck client's stream window: far below one full state.
const STUCK_WINDOW: u32 = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_client_does_not_delay_the_others() {
    const OTHERS: usize = 10;
    const ROUNDS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    // A state of about 200 KB, far above the stuck client's window (and HTTP/2's default 64 KiB).
    let long_interfaces: Vec<String> = (0..200)
        .map(|i| format!("org.example.{}.Service{i}", "x".repeat(900)))
        .collect();
    let interfaces: Vec<&str> = long_interfaces.iter().map(String::as_str).collect();
    register(server.grpc_addr, "ns", "app", &interfaces).await;
    common::wait_published(&server, 200).await;

    // The stuck client: its own connection; it subscribes, then never reads and never releases
    // flow-control window. Once the server has filled the window, that stream's transport is
    // stalled with most of the response still to send.
    let (mut stuck, _stuck_requests) = raw_observe(
        raw_h2(server.grpc_addr, STUCK_WINDOW).await,
        server.grpc_addr,
        SNP_TYPE,
    )
    .await;
    let filled = tokio::time::timeout(Duration::from_secs(10), async {
        while stuck.flow_control().used_capacity() < STUCK_WINDOW as usize {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        filled.is_ok(),
        "the server sent {} bytes to the stuck client, not its whole window",
        stuck.flow_control().used_capacity()
    );

    let mut others = Vec::new();
    for _ in 0..OTHERS {
        let mut observer = Observer::open(server.grpc_addr).await;
        observer.subscribe(SNP_TYPE).await;
        let state = observer.next().await;
        assert_eq!(mappings_of(&state).len(), 200);
        observer.ack(&state).await;
        others.push(observer);
    }
    // Each other client reads in its own task and reports every application it sees appear,
    // with when, then acknowledges.
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let readers: Vec<_> = others
        .into_iter()
        .enumerate()
        .map(|(id, mut observer)| {
            let seen_tx = seen_tx.clone();
            tokio::spawn(async move {
                let mut known = BTreeSet::new();
                loop {
                    let response = observer.next().await;
                    let at = Instant::now();
                    let apps = mappings_of(&response)
                        .remove("org-example-small/ns")
                        .map(|(_, apps)| apps)
                        .unwrap_or_default();
                    for app in apps.difference(&known) {
                        let _ = seen_tx.send((id, app.clone(), at));
                    }
                    known = apps;
                    observer.ack(&response).await;
                }
            })
        })
        .collect();

    // Every change reaches every other client, in order, while the stuck one stays stuck.
    let mut latencies = Vec::new();
    for round in 0..ROUNDS {
        let app = format!("app-{round}");
        let registered = Instant::now();
        register(server.grpc_addr, "ns", &app, &["org.example.Small"]).await;
        let mut reached = BTreeSet::new();
        while reached.len() < OTHERS {
            let report = tokio::time::timeout(Duration::from_secs(10), seen.recv()).await;
            let Ok(Some((id, appeared, at))) = report else {
                panic!("{app} reached only {reached:?} within 10 s");
            };
            assert_eq!(appeared, app, "client {id}");
            assert!(reached.insert(id), "client {id} saw {app} twice");
            latencies.push(at - registered);
        }
    }
    for reader in readers {
        reader.abort();
    }
    latencies.sort();
    let percentile = |p: f64| latencies[((latencies.len() as f64 * p).ceil() as usize).max(1) - 1];
    println!(
        "{} deliveries to {OTHERS} clients beside a stuck one (registration sent to state received): \
         p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        percentile(0.50),
        percentile(0.99),
        latencies[latencies.len() - 1]
    );

    // The stuck stream was stalled the whole time: still open, its window still full. Read now,
    // it holds the whole first state, of which the window let through a fraction.
    assert!(!stuck.is_end_stream());
    assert_eq!(stuck.flow_control().used_capacity(), STUCK_WINDOW as usize);
    let mut received: Vec<u8> = Vec::new();
    let frame_len = |received: &[u8]| {
        (received.len() >= 5).then(|| {
            5 + u32::from_be_bytes([received[1], received[2], received[3], received[4]]) as usize
        })
    };
    while frame_len(&received).is_none_or(|len| received.len() < len) {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stuck.data()).await;
        let Ok(Some(Ok(chunk))) = chunk else {
            panic!("the stuck stream ended after {} bytes", received.len());
        };
        stuck.flow_control().release_capacity(chunk.len()).unwrap();
        received.extend_from_slice(&chunk);
    }
    let len = frame_len(&received).unwrap_or_default();
    let first =
        <dubbo_cp::dds::ObserveResponse as prost::Message>::decode(&received[5..len]).unwrap();
    assert_eq!(first.nonce, "1");
    assert_eq!(mappings_of(&first).len(), 200);
    println!(
        "the stuck client's first response: {len} bytes, {STUCK_WINDOW} let through while stuck"
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn observe_is_unavailable_until_the_initial_state_is_loaded() {
    let index = Arc::new(dubbo_cp::index::Index::new(1));
    let (_shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
    let service = dubbo_cp::dds::RuleService::new(
        index.clone(),
        Default::default(),
        Default::default(),
        Default::default(),
        Default::default(),
        shutdown_rx,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let refused = Observer::connect(channel(addr).await).await.err();
    assert_eq!(refused.map(|s| s.code()), Some(Code::Unavailable));

    index.mark_all_loaded();
    let mut observer = Observer::open(addr).await;
    observer.subscribe(SNP_TYPE).await;
    assert_eq!(observer.next().await.revision, 1);
}

#[tokio::test]
async fn new_streams_beyond_the_admission_rate_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fast_config(dir.path());
    config.dds.new_streams_burst = 3;
    config.dds.new_streams_per_second = 0.001;
    let server = start(config).await;
    let channel = channel(server.grpc_addr).await;
    let mut admitted = Vec::new();
    for _ in 0..3 {
        admitted.push(Observer::connect(channel.clone()).await.unwrap());
    }
    let refused = Observer::connect(channel).await.err();
    assert_eq!(refused.map(|s| s.code()), Some(Code::Unavailable));
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let _ = observer.next().await;
    let started = std::time::Instant::now();
    assert!(server.stop().await.is_ok());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "an open stream held up shutdown"
    );
}

#[tokio::test]
async fn an_oversized_request_ends_that_stream_with_an_error_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let mut bad = Observer::open(server.grpc_addr).await;
    bad.send("", &"x".repeat(100 * 1024)).await;
    let ended = tokio::time::timeout(Duration::from_secs(5), bad.responses_mut().message()).await;
    let status = match ended {
        Ok(Err(status)) => status,
        other => panic!("expected an error status, got {other:?}"),
    };
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    let (_, metrics) = common::http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_rejections_total{reason=\"message_size\"} 1\n"),
        "{metrics}"
    );

    let mut good = Observer::open(server.grpc_addr).await;
    good.subscribe(SNP_TYPE).await;
    assert_eq!(good.next().await.nonce, "1");
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn other_methods_of_the_rule_service_are_unimplemented() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let mut grpc = tonic::client::Grpc::new(channel(server.grpc_addr).await);
    assert!(grpc.ready().await.is_ok());
    let path =
        http::uri::PathAndQuery::from_static("/org.apache.dubbo.auth.v1alpha1.RuleService/Nope");
    let codec = tonic_prost::ProstCodec::<
        dubbo_cp::pb::dds::ObserveRequest,
        dubbo_cp::pb::dds::ObserveRequest,
    >::default();
    let result = grpc
        .unary(
            tonic::Request::new(dubbo_cp::pb::dds::ObserveRequest::default()),
            path,
            codec,
        )
        .await;
    assert_eq!(result.err().map(|s| s.code()), Some(Code::Unimplemented));
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn streams_per_connection_are_bounded_and_the_next_waits_for_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fast_config(dir.path());
    config.grpc.max_concurrent_streams = 2;
    let server = start(config).await;
    let connection = channel(server.grpc_addr).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut observer = Observer::connect(connection.clone()).await.unwrap();
        observer.subscribe(SNP_TYPE).await;
        let _ = observer.next().await;
        open.push(observer);
    }
    // The server advertises two streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS), so a
    // client does not open a third before one ends: it waits for a slot, it is not refused.
    let raw = raw_h2(server.grpc_addr, 65_535).await;
    let _raw_stream = raw_observe(raw.clone(), server.grpc_addr, SNP_TYPE).await;
    assert_eq!(raw.current_max_send_streams(), 2);
    let third = tokio::spawn(Observer::connect(connection.clone()));
    drop(open.pop());
    let third = tokio::time::timeout(Duration::from_secs(5), third).await;
    assert!(
        matches!(third, Ok(Ok(Ok(_)))),
        "the waiting stream did not get the freed slot"
    );
    assert!(server.stop().await.is_ok());
}
