//! The discovery stream over real gRPC against a real server on 127.0.0.1:0.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{
    Observer, SNP_TYPE, TAG_TYPE, channel, client, mappings_of, request, start, test_config,
};
use dubbo_cp::config::Config;
use tonic::Code;

/// Debounce off, so each registration is published at once and tests need no waiting.
fn fast_config(dir: &std::path::Path) -> Config {
    let mut config = test_config(dir);
    config.debounce.enable = false;
    config
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
        .unwrap_or_else(|| panic!("missing mapping in {state:?}"));
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
    assert!(
        observer
            .next_within(Duration::from_millis(500))
            .await
            .is_none()
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn changes_before_an_ack_coalesce_into_one_response_with_the_newest_state() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    for app in ["a", "b", "c"] {
        register(server.grpc_addr, "ns", app, &["I"]).await;
    }
    common::wait_published_apps(&server, "i/ns", 3).await;
    // Wrong nonces: ignored, nothing sent, nothing wedged.
    observer.send("999", SNP_TYPE).await;
    observer.send("", "dubbo.apache.org/v1alpha1/Unknown").await;
    observer.send("", "").await;
    assert!(
        observer
            .next_within(Duration::from_millis(300))
            .await
            .is_none()
    );

    observer.ack(&first).await;
    let second = observer.next().await;
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
    assert!(
        observer
            .next_within(Duration::from_millis(300))
            .await
            .is_none(),
        "same state sent twice"
    );
    assert!(
        server
            .dds_stats
            .stale_nonces
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn a_first_message_with_a_nonce_does_not_subscribe() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.send("1", SNP_TYPE).await;
    register(server.grpc_addr, "ns", "app", &["I"]).await;
    assert!(
        observer
            .next_within(Duration::from_millis(300))
            .await
            .is_none()
    );
    observer.subscribe(SNP_TYPE).await;
    assert_eq!(observer.next().await.nonce, "1");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_client_does_not_delay_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(fast_config(dir.path())).await;
    // A state of about 1 MiB, far above any HTTP/2 window, so the stuck client's response cannot
    // be delivered.
    let long_interfaces: Vec<String> = (0..1000)
        .map(|i| format!("org.example.{}.Service{i}", "x".repeat(900)))
        .collect();
    let interfaces: Vec<&str> = long_interfaces.iter().map(String::as_str).collect();
    register(server.grpc_addr, "ns", "app", &interfaces).await;

    // The stuck client subscribes on its own connection and never reads.
    let stuck = Observer::open(server.grpc_addr).await;
    stuck.subscribe(SNP_TYPE).await;
    let mut others = Vec::new();
    for _ in 0..10 {
        let mut observer = Observer::open(server.grpc_addr).await;
        observer.subscribe(SNP_TYPE).await;
        // The publish may trail the ack of the big registration: read until the state has it.
        let mut state = observer.next().await;
        observer.ack(&state).await;
        while mappings_of(&state).len() < 1000 {
            state = observer.next().await;
            observer.ack(&state).await;
        }
        assert_eq!(mappings_of(&state).len(), 1000);
        others.push(observer);
    }
    for round in 0..3 {
        register(
            server.grpc_addr,
            "ns",
            &format!("app-{round}"),
            &["org.example.Small"],
        )
        .await;
        for observer in &mut others {
            let response = observer.next().await;
            assert!(mappings_of(&response).contains_key("org-example-small/ns"));
            observer.ack(&response).await;
        }
    }
    drop(stuck);
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
    // The server advertises two streams per connection: a third waits, it is not accepted.
    let third = tokio::spawn(Observer::connect(connection.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third stream was opened on a two-stream connection"
    );
    drop(open.pop());
    let third = tokio::time::timeout(Duration::from_secs(5), third).await;
    assert!(
        matches!(third, Ok(Ok(Ok(_)))),
        "the waiting stream did not get the freed slot"
    );
    assert!(server.stop().await.is_ok());
}
