//! Incremental xDS over a real socket, seen by a raw client built on Envoy's protos: the first
//! answer holds what was asked, later ones only what changed, and removals by name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use dubbo_cp_xds::{CLUSTER, ENDPOINT};

async fn next(responses: &mut tonic::Streaming<DeltaDiscoveryResponse>) -> DeltaDiscoveryResponse {
    tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("a response within 10 s")
        .unwrap()
        .expect("the stream is open")
}

fn names(response: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut names: Vec<String> = response.resources.iter().map(|r| r.name.clone()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_delta_stream_sees_only_changed_resources_and_removals() {
    let server = support::Server::start().await;
    let shop = |port: u16| support::greeter("shop", &[(port, 1)]);
    server.publish(vec![support::greeter("default", &[(9001, 1)]), shop(9101)]);
    let mut ads = AggregatedDiscoveryServiceClient::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let (requests, rx) = mpsc::channel(16);
    let mut responses = ads
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Envoy's way: every cluster (wildcard), then the endpoints of the ones it uses.
    requests
        .send(DeltaDiscoveryRequest {
            type_url: CLUSTER.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let clusters = next(&mut responses).await;
    let default = "outbound|7070||greeter.default.svc.cluster.local";
    let in_shop = "outbound|7070||greeter.shop.svc.cluster.local";
    assert_eq!(names(&clusters), [default, in_shop]);
    requests
        .send(DeltaDiscoveryRequest {
            type_url: CLUSTER.into(),
            response_nonce: clusters.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    requests
        .send(DeltaDiscoveryRequest {
            type_url: ENDPOINT.into(),
            resource_names_subscribe: vec![default.into(), in_shop.into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let endpoints = next(&mut responses).await;
    assert_eq!(names(&endpoints), [default, in_shop]);
    requests
        .send(DeltaDiscoveryRequest {
            type_url: ENDPOINT.into(),
            response_nonce: endpoints.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    server.acked(ENDPOINT, "1").await;

    // One service's endpoints change: one load assignment is sent, no cluster. (This version
    // and the next say what moved, as the control plane's do when only services moved.)
    server.publish_following(vec![support::greeter("default", &[(9001, 1)]), shop(9102)]);
    let changed = next(&mut responses).await;
    assert_eq!(changed.type_url, ENDPOINT);
    assert_eq!(names(&changed), [in_shop]);
    assert!(changed.removed_resources.is_empty());
    requests
        .send(DeltaDiscoveryRequest {
            type_url: ENDPOINT.into(),
            response_nonce: changed.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();

    // The shop service goes: its endpoints and then its cluster are removed by name (the
    // cluster last: make before break).
    server.publish_following(vec![support::greeter("default", &[(9001, 1)])]);
    let mut removed = Vec::new();
    for _ in 0..2 {
        let response = next(&mut responses).await;
        assert!(response.resources.is_empty(), "{response:?}");
        removed.push((
            response.type_url.clone(),
            response.removed_resources.clone(),
        ));
    }
    assert_eq!(
        removed,
        [
            (ENDPOINT.to_string(), vec![in_shop.to_string()]),
            (CLUSTER.to_string(), vec![in_shop.to_string()]),
        ]
    );

    // The client stops asking for every cluster (not answered). At the next version, although
    // only endpoints moved, the cluster it no longer subscribes to is said removed, as a full
    // look-up finds.
    requests
        .send(DeltaDiscoveryRequest {
            type_url: CLUSTER.into(),
            resource_names_unsubscribe: vec!["*".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    server
        .clients
        .wait_for(|clients| clients[0].types.get(CLUSTER).is_some_and(|t| !t.wildcard))
        .await;
    server.publish_following(vec![support::greeter("default", &[(9002, 1)])]);
    let mut types = Vec::new();
    while !types
        .iter()
        .any(|(t, _): &(String, Vec<String>)| t == CLUSTER)
    {
        let response = next(&mut responses).await;
        types.push((
            response.type_url.clone(),
            response.removed_resources.clone(),
        ));
    }
    assert!(
        types.contains(&(CLUSTER.to_string(), vec![default.to_string()])),
        "{types:?}"
    );
}
