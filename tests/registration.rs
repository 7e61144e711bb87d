//! Registration over real gRPC against a real server on 127.0.0.1:0.
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use common::{Mappings, admin_mappings, channel, client, http_get, request, start, test_config};
use dubbo_cp::pb::dubbo::networking::v1alpha1::service_name_mapping_service_client::ServiceNameMappingServiceClient as NetworkingClient;
use tonic::Code;

#[tokio::test]
async fn register_then_reregister_without_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let mut client = client(server.grpc_addr).await;

    let reply = client
        .register_service_app_mapping(request(
            "default",
            "demo-provider",
            &[
                "org.apache.dubbo.demo.DemoService",
                "org.apache.dubbo.demo.GreetService",
            ],
        ))
        .await
        .map(|r| r.into_inner());
    let reply = reply.unwrap();
    assert!(reply.success, "{reply:?}");
    let stats = server.store_stats.clone();
    assert_eq!(stats.commits.load(Ordering::Relaxed), 1);
    assert_eq!(stats.pairs_written.load(Ordering::Relaxed), 2);

    // The same again, in another order and with a duplicate: answered without a write.
    let again = client
        .register_service_app_mapping(request(
            "default",
            "demo-provider",
            &[
                "org.apache.dubbo.demo.GreetService",
                "org.apache.dubbo.demo.DemoService",
                "org.apache.dubbo.demo.DemoService",
            ],
        ))
        .await
        .map(|r| r.into_inner())
        .unwrap();
    assert!(again.success);
    assert_eq!(again.message, "already registered");
    assert_eq!(
        stats.commits.load(Ordering::Relaxed),
        1,
        "re-registration wrote"
    );
    assert_eq!(stats.pairs_written.load(Ordering::Relaxed), 2);

    let stored = admin_mappings(server.admin_addr).await;
    let apps = stored.get(&("default".into(), "org.apache.dubbo.demo.DemoService".into()));
    assert_eq!(apps, Some(&BTreeSet::from(["demo-provider".to_string()])));
    assert_eq!(stored.len(), 2);
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn both_service_paths_register() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let mut legacy = client(server.grpc_addr).await;
    let mut networking = NetworkingClient::new(channel(server.grpc_addr).await);

    let a = legacy
        .register_service_app_mapping(request("ns", "app-a", &["I"]))
        .await;
    assert!(a.map(|r| r.into_inner().success).unwrap_or(false));
    let b = networking
        .register_service_app_mapping(request("ns", "app-b", &["I"]))
        .await;
    assert!(b.map(|r| r.into_inner().success).unwrap_or(false));
    // Validation applies on the second path too.
    let bad = networking
        .register_service_app_mapping(request("NS", "app-b", &["I"]))
        .await;
    assert_eq!(bad.err().map(|s| s.code()), Some(Code::InvalidArgument));

    let stored = admin_mappings(server.admin_addr).await;
    let apps = stored
        .get(&("ns".into(), "I".into()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        apps,
        BTreeSet::from(["app-a".to_string(), "app-b".to_string()])
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn invalid_requests_are_refused_naming_the_field_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let mut client = client(server.grpc_addr).await;
    let long_app = "a".repeat(254);
    let long_iface = "i".repeat(1025);
    let too_many: Vec<String> = (0..1001).map(|i| format!("I{i}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();

    let cases: Vec<(&str, &str, Vec<&str>, &str)> = vec![
        ("", "app", vec!["I"], "namespace"),
        ("Default", "app", vec!["I"], "namespace"),
        ("-ns", "app", vec!["I"], "namespace"),
        ("ns_1", "app", vec!["I"], "namespace"),
        ("ns", "", vec!["I"], "applicationName"),
        ("ns", "my app", vec!["I"], "applicationName"),
        ("ns", "a,b", vec!["I"], "applicationName"),
        ("ns", "a\u{1}b", vec!["I"], "applicationName"),
        ("ns", &long_app, vec!["I"], "applicationName"),
        ("ns", "app", vec![], "interfaceNames"),
        ("ns", "app", vec!["ok", ""], "interfaceNames[1]"),
        ("ns", "app", vec!["a b"], "interfaceNames[0]"),
        ("ns", "app", vec!["a\u{7f}b"], "interfaceNames[0]"),
        ("ns", "app", vec![&long_iface], "interfaceNames[0]"),
        ("ns", "app", too_many, "interfaceNames"),
    ];
    for (namespace, application, interfaces, field) in cases {
        let status = client
            .register_service_app_mapping(request(namespace, application, &interfaces))
            .await
            .err()
            .unwrap_or_else(|| {
                panic!(
                    "accepted {namespace:?}/{application:?}/{} interfaces",
                    interfaces.len()
                )
            });
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "message {:?} does not name {field}",
            status.message()
        );
    }
    assert_eq!(server.store_stats.commits.load(Ordering::Relaxed), 0);
    assert!(admin_mappings(server.admin_addr).await.is_empty());
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn oversized_request_is_refused_and_the_server_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let mut client = client(server.grpc_addr).await;
    let huge = "x".repeat(2 * 1024 * 1024);
    let status = client
        .register_service_app_mapping(request("ns", "app", &[&huge]))
        .await
        .err();
    assert_eq!(
        status.map(|s| s.code()),
        Some(Code::OutOfRange),
        "a 2 MiB request was accepted"
    );
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_rejections_total{reason=\"message_size\"} 1\n"),
        "{metrics}"
    );
    let ok = client
        .register_service_app_mapping(request("ns", "app", &["I"]))
        .await;
    assert!(ok.is_ok());
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_fifty_registrations_each_store_exactly_the_union() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let addr = server.grpc_addr;
    let clients: Vec<_> = (0..200)
        .map(|c| {
            tokio::spawn(async move {
                let mut client = client(addr).await;
                let namespace = format!("ns-{}", c % 4);
                let application = format!("app-{}", c % 50);
                for r in 0..50 {
                    let interfaces = [
                        format!("org.example.Service{r}"),
                        format!("org.example.Shared{}", c % 7),
                    ];
                    let interfaces: Vec<&str> = interfaces.iter().map(String::as_str).collect();
                    let reply = client
                        .register_service_app_mapping(common::request(
                            &namespace,
                            &application,
                            &interfaces,
                        ))
                        .await;
                    match reply {
                        Ok(reply) => assert!(reply.into_inner().success),
                        Err(status) => panic!("client {c} registration {r}: {status}"),
                    }
                }
            })
        })
        .collect();
    for task in clients {
        assert!(task.await.is_ok());
    }

    let mut expected = Mappings::new();
    for c in 0..200 {
        for r in 0..50 {
            for interface in [
                format!("org.example.Service{r}"),
                format!("org.example.Shared{}", c % 7),
            ] {
                expected
                    .entry((format!("ns-{}", c % 4), interface))
                    .or_default()
                    .insert(format!("app-{}", c % 50));
            }
        }
    }
    let stored = admin_mappings(server.admin_addr).await;
    assert_eq!(stored, expected);
    let pairs: usize = expected.values().map(BTreeSet::len).sum();
    let stats = server.store_stats.clone();
    assert_eq!(
        stats.pairs_written.load(Ordering::Relaxed) as usize,
        pairs,
        "a pair was written twice"
    );
    let commits = stats.commits.load(Ordering::Relaxed);
    assert!(
        commits < 10_000,
        "no group commit: {commits} commits for 10,000 registrations"
    );
    assert!(server.stop().await.is_ok());

    // What the admin port reported is what the database file holds.
    let reopened = start(test_config(dir.path())).await;
    assert_eq!(admin_mappings(reopened.admin_addr).await, expected);
    assert!(reopened.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_gets_resource_exhausted_quickly_and_refused_requests_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.ingest.queue_capacity = 1;
    config.ingest.max_batch = 1;
    let server = start(config).await;
    let channel = channel(server.grpc_addr).await;
    let started = std::time::Instant::now();
    let calls: Vec<_> = (0..1000)
        .map(|i| {
            let mut client = dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient::new(channel.clone());
            tokio::spawn(async move {
                let app = format!("app-{i}");
                let result = client.register_service_app_mapping(request("ns", &app, &["I"])).await;
                (app, result.map(|r| r.into_inner().success).map_err(|s| s.code()))
            })
        })
        .collect();
    let mut accepted = BTreeSet::new();
    let mut exhausted = BTreeSet::new();
    for call in calls {
        match call.await {
            Ok((app, Ok(true))) => {
                accepted.insert(app);
            }
            Ok((app, Err(Code::ResourceExhausted))) => {
                exhausted.insert(app);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    assert!(!exhausted.is_empty(), "a one-slot queue never filled");
    let stored = admin_mappings(server.admin_addr).await;
    let stored_apps = stored
        .get(&("ns".into(), "I".into()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        stored_apps, accepted,
        "stored differs from what was acknowledged"
    );
    println!(
        "flood: {} accepted, {} exhausted in {elapsed:?}",
        accepted.len(),
        exhausted.len()
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn health_readiness_and_reflection() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    assert_eq!(http_get(server.admin_addr, "/healthz").await.0, 200);
    assert_eq!(http_get(server.admin_addr, "/readyz").await.0, 200);

    let mut health =
        tonic_health::pb::health_client::HealthClient::new(channel(server.grpc_addr).await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "v1alpha1.ServiceNameMappingService".into(),
        })
        .await
        .map(|r| r.into_inner().status);
    assert_eq!(
        status.ok(),
        Some(tonic_health::pb::health_check_response::ServingStatus::Serving as i32)
    );

    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel(server.grpc_addr).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let first = responses
        .message()
        .await
        .ok()
        .flatten()
        .and_then(|r| r.message_response);
    let Some(MessageResponse::ListServicesResponse(list)) = first else {
        panic!("no service list")
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "v1alpha1.ServiceNameMappingService",
        "dubbo.networking.v1alpha1.ServiceNameMappingService",
        "org.apache.dubbo.auth.v1alpha1.RuleService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.contains(expected),
            "{expected} missing from {names:?}"
        );
    }

    let readiness = server.readiness.clone();
    let admin = server.admin_addr;
    assert!(server.stop().await.is_ok());
    assert!(!readiness.is_ready());
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "admin port still open after shutdown"
    );
}

#[tokio::test]
async fn interfaces_differing_in_case_are_distinct_on_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let mut client = client(server.grpc_addr).await;
    // Before: all three were the object `x-y/ns`, and each overwrote the other on the stream.
    for (app, interface) in [("a", "x.Y"), ("b", "x.y"), ("c", "x-y")] {
        let reply = client
            .register_service_app_mapping(request("ns", app, &[interface]))
            .await;
        assert!(reply.is_ok_and(|r| r.into_inner().success));
    }
    common::wait_published(&server, 3).await;
    let mut observer = common::Observer::open(server.grpc_addr).await;
    observer.subscribe(common::SNP_TYPE).await;
    let state = common::mappings_of(&observer.next().await);
    let by_interface: std::collections::BTreeMap<String, (String, BTreeSet<String>)> = state
        .into_iter()
        .map(|(key, (interface, apps))| (interface, (key, apps)))
        .collect();
    assert_eq!(by_interface.len(), 3, "{by_interface:?}");
    assert_eq!(
        by_interface["x.Y"].0, "x-y/ns",
        "the first keeps the reference name"
    );
    assert_eq!(by_interface["x.y"].1, BTreeSet::from(["b".to_string()]));
    assert_eq!(by_interface["x-y"].1, BTreeSet::from(["c".to_string()]));
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn applications_per_key_are_capped_with_a_clear_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.ingest.max_applications_per_key = 3;
    let server = start(config).await;
    let mut client = client(server.grpc_addr).await;
    for app in ["a", "b", "c"] {
        let reply = client
            .register_service_app_mapping(request("ns", app, &["x.I"]))
            .await;
        assert!(reply.is_ok_and(|r| r.into_inner().success));
    }
    let refused = client
        .register_service_app_mapping(request("ns", "d", &["x.I"]))
        .await;
    let status = refused.err().unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("ns/x.I"), "{}", status.message());
    assert!(
        status.message().contains("maxApplicationsPerKey"),
        "{}",
        status.message()
    );
    assert_eq!(admin_mappings(server.admin_addr).await.len(), 1);
    assert!(server.stop().await.is_ok());
}
