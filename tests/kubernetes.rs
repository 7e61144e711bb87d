//! Kubernetes mode against the stateful API-server fixture, with the real `kube::Client`.
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::apiserver::ApiServer;
use common::{Observer, SNP_TYPE, client, http_get, mappings_of, request, start};
use dubbo_cp::config::Config;
use dubbo_cp::server::RunningServer;
use serde_json::json;

fn k8s_config(dir: &std::path::Path, api: &ApiServer) -> Config {
    let mut config = common::kubernetes_config(dir, api.url());
    // These tests are about storage; authentication has its own (tests/tokenreview.rs).
    config.auth.token_review = Some(false);
    config
}

async fn register(server: &RunningServer, namespace: &str, app: &str, interfaces: &[&str]) {
    let reply = client(server.grpc_addr)
        .await
        .register_service_app_mapping(request(namespace, app, interfaces))
        .await;
    match reply {
        Ok(reply) => assert!(reply.into_inner().success),
        Err(status) => panic!("registration failed: {status}"),
    }
}

/// Waits until `check` holds, polling; panics with `what` after `limit`.
async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_ready(server: &RunningServer) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while http_get(server.admin_addr, "/readyz").await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Written pairs leave the outbox just after the write lands.
async fn wait_outbox_empty(server: &RunningServer) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = http_get(server.admin_addr, "/debug/outbox").await;
        let outbox: dubbo_cp::admin::OutboxView =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        if outbox.pending.is_empty() {
            return;
        }
        let outbox = body;
        assert!(
            tokio::time::Instant::now() < deadline,
            "written pairs left in the outbox: {outbox}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Debounce flushes so far (watch and outbox feed), from `/metrics`.
async fn flush_count(server: &RunningServer) -> u64 {
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("dubbo_cp_debounce_flush_size_count "))
        .and_then(|value| value.trim().parse().ok())
        .expect("no flush count in {metrics}")
}

fn set(items: &[&str]) -> Vec<String> {
    let set: BTreeSet<String> = items.iter().map(|s| s.to_string()).collect();
    set.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_then_union_then_no_write_for_what_is_there() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api)).await;
    let name = "org-apache-dubbo-demo-demoservice";

    register(
        &server,
        "demo",
        "app-a",
        &["org.apache.dubbo.demo.DemoService"],
    )
    .await;
    eventually(Duration::from_secs(10), "the object", || {
        api.applications("demo", name) == set(&["app-a"])
    })
    .await;
    let object = api.get("demo", name).unwrap_or_default();
    assert_eq!(
        object["spec"]["interfaceName"],
        "org.apache.dubbo.demo.DemoService"
    );
    assert_eq!(
        object["metadata"]["labels"]["interface"],
        "org.apache.dubbo.demo.DemoService"
    );

    register(
        &server,
        "demo",
        "app-b",
        &["org.apache.dubbo.demo.DemoService"],
    )
    .await;
    eventually(Duration::from_secs(10), "the union", || {
        api.applications("demo", name) == set(&["app-a", "app-b"])
    })
    .await;
    assert_eq!(api.writes(), 2);

    // Once the watch shows it, registering it again writes nothing, locally or remotely: a
    // later registration of another key is the next commit and the next write.
    common::wait_published_apps(&server, &format!("{name}/demo"), 2).await;
    let commits = server.store_stats.commits.load(Ordering::SeqCst);
    register(
        &server,
        "demo",
        "app-a",
        &["org.apache.dubbo.demo.DemoService"],
    )
    .await;
    register(&server, "demo", "app-c", &["org.apache.dubbo.demo.Later"]).await;
    eventually(Duration::from_secs(10), "the later object", || {
        api.applications("demo", "org-apache-dubbo-demo-later") == set(&["app-c"])
    })
    .await;
    wait_outbox_empty(&server).await;
    assert_eq!(
        server.store_stats.commits.load(Ordering::SeqCst),
        commits + 1,
        "an already present registration was committed to the outbox"
    );
    assert_eq!(
        api.writes(),
        3,
        "an already present registration was written"
    );
    assert_eq!(
        api.writes_per_object()
            .get(&("demo".to_string(), name.to_string())),
        Some(&2)
    );
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_kube_writes_total 3\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_outbox_pending_pairs 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_kube_request_duration_seconds_count"),
        "{metrics}"
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_and_server_errors_are_retried_until_written() {
    let api = ApiServer::start().await;
    api.kubectl_apply(
        "demo",
        "i",
        json!({"interfaceName": "I", "applicationNames": ["other"]}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api)).await;
    api.conflict_next_updates(2);
    register(&server, "demo", "app", &["I"]).await;
    eventually(Duration::from_secs(15), "the union after conflicts", || {
        api.applications("demo", "i") == set(&["app", "other"])
    })
    .await;
    let stats = server.kube_stats.clone().unwrap_or_default();
    assert!(stats.conflicts.load(Ordering::Relaxed) >= 2);

    // 429 with Retry-After: the write waits as told, then lands.
    api.throttle_next_requests(1, 2);
    let throttled = std::time::Instant::now();
    register(&server, "demo", "app", &["K"]).await;
    eventually(Duration::from_secs(15), "the create after a 429", || {
        api.applications("demo", "k") == set(&["app"])
    })
    .await;
    assert!(
        throttled.elapsed() >= Duration::from_secs(2),
        "Retry-After not honoured"
    );

    api.fail_next_writes(3);
    register(&server, "demo", "app", &["J"]).await;
    eventually(Duration::from_secs(15), "the create after 500s", || {
        api.applications("demo", "j") == set(&["app"])
    })
    .await;
    assert!(stats.errors.load(Ordering::Relaxed) >= 3);
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_kube_errors_total{code=\"500\"} 3\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_kube_errors_total{code=\"409\"} 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_kube_errors_total{code=\"429\"} 1\n"),
        "{metrics}"
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thirty_second_outage_and_a_restart_lose_nothing() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api)).await;
    api.set_down(true);
    let outage = std::time::Instant::now();
    for i in 0..10 {
        register(&server, "demo", &format!("app-{i}"), &["I"]).await;
    }
    // A restart in the middle of the outage, once the writer has failed against it: the outbox
    // is on disk.
    let stats = server.kube_stats.clone().unwrap_or_default();
    eventually(
        Duration::from_secs(10),
        "a failed write in the outage",
        || stats.errors.load(Ordering::SeqCst) > 0,
    )
    .await;
    assert!(server.stop().await.is_ok());
    let server = start(k8s_config(dir.path(), &api)).await;
    for i in 10..20 {
        register(&server, "demo", &format!("app-{i}"), &["I"]).await;
    }
    let (_, outbox) = http_get(server.admin_addr, "/debug/outbox").await;
    assert!(
        outbox.contains("app-0") && outbox.contains("app-19"),
        "{outbox}"
    );
    assert_eq!(
        http_get(server.admin_addr, "/readyz").await.0,
        503,
        "ready without a list"
    );
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(outage.elapsed())).await;
    assert_eq!(api.object_count(), 0);
    api.set_down(false);

    let apps: Vec<String> = (0..20).map(|i| format!("app-{i}")).collect();
    let expected = set(&apps.iter().map(String::as_str).collect::<Vec<_>>());
    eventually(
        Duration::from_secs(30),
        "every registration after the outage",
        || api.applications("demo", "i") == expected,
    )
    .await;
    wait_ready(&server).await;
    wait_outbox_empty(&server).await;
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_edit_delete_reach_a_discovery_client() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api)).await;
    wait_ready(&server).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    assert!(mappings_of(&first).is_empty());
    observer.ack(&first).await;

    api.kubectl_apply(
        "ns",
        "hand-made",
        json!({"interfaceName": "x.Hello", "applicationNames": ["a"]}),
    );
    let created = observer.next().await;
    observer.ack(&created).await;
    let state = mappings_of(&created);
    assert_eq!(
        state
            .get("hand-made/ns")
            .map(|(i, a)| (i.as_str(), a.len())),
        Some(("x.Hello", 1))
    );

    // An object that does not deserialize is skipped; the watch goes on.
    api.kubectl_apply("ns", "broken", json!({"interfaceName": 42}));
    api.kubectl_apply(
        "ns",
        "hand-made",
        json!({"interfaceName": "x.Hello", "applicationNames": ["a", "b"]}),
    );
    let edited = observer.next().await;
    observer.ack(&edited).await;
    let state = mappings_of(&edited);
    assert!(!state.contains_key("broken/ns"));
    assert_eq!(state.get("hand-made/ns").map(|(_, a)| a.len()), Some(2));

    api.kubectl_delete("ns", "hand-made");
    let deleted = observer.next().await;
    assert!(mappings_of(&deleted).is_empty());
    assert!(deleted.revision > edited.revision && edited.revision > created.revision);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_causes_a_relist_that_removes_what_was_deleted_meanwhile() {
    let api = ApiServer::start().await;
    api.kubectl_apply(
        "ns",
        "a",
        json!({"interfaceName": "A", "applicationNames": ["x"]}),
    );
    api.kubectl_apply(
        "ns",
        "b",
        json!({"interfaceName": "B", "applicationNames": ["x"]}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api)).await;
    wait_ready(&server).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    assert_eq!(mappings_of(&first).len(), 2);
    observer.ack(&first).await;

    api.block_watches(true).await;
    api.kubectl_delete("ns", "b");
    api.expire_resource_versions();
    api.block_watches(false).await;
    let relisted = observer
        .next_within(Duration::from_secs(20))
        .await
        .expect("no push after the re-list");
    let keys: Vec<String> = mappings_of(&relisted).into_keys().collect();
    assert_eq!(keys, vec!["a/ns".to_string()]);
    assert!(
        api.gone_served() >= 1,
        "the watch never resumed from an expired resourceVersion"
    );
    observer.ack(&relisted).await;

    // Another re-list with nothing changed pushes nothing: once it went through the debouncer
    // into the index, no push was counted, and the next response is a later change.
    let (gone, flushes) = (api.gone_served(), flush_count(&server).await);
    let pushes = server.dds_stats.pushes.load(Ordering::SeqCst);
    api.expire_resource_versions();
    eventually(
        Duration::from_secs(20),
        "a 410 for the resumed watch",
        || api.gone_served() > gone,
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while flush_count(&server).await == flushes {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the re-list never reached the index"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.dds_stats.pushes.load(Ordering::SeqCst),
        pushes,
        "an unchanged re-list was pushed"
    );
    api.kubectl_apply(
        "ns",
        "c",
        json!({"interfaceName": "C", "applicationNames": ["x"]}),
    );
    let next = observer.next().await;
    let keys: Vec<String> = mappings_of(&next).into_keys().collect();
    assert_eq!(keys, vec!["a/ns".to_string(), "c/ns".to_string()]);
    assert!(next.revision > relisted.revision);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_and_no_streams_until_the_first_list() {
    let api = ApiServer::start().await;
    api.set_down(true);
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api)).await;
    assert_eq!(http_get(server.admin_addr, "/readyz").await.0, 503);
    let refused = Observer::connect(common::channel(server.grpc_addr).await)
        .await
        .err();
    assert_eq!(refused.map(|s| s.code()), Some(tonic::Code::Unavailable));
    api.set_down(false);
    wait_ready(&server).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    assert_eq!(observer.next().await.nonce, "1");
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_registering_the_same_keys_converge_to_the_union() {
    let api = ApiServer::start().await;
    let dirs = [tempfile::tempdir(), tempfile::tempdir()].map(|d| d.unwrap());
    let mut replicas = Vec::new();
    for dir in &dirs {
        let mut config = k8s_config(dir.path(), &api);
        // Tight debounce so the replicas' upserts overlap and race.
        config.debounce.after = Duration::from_millis(1);
        replicas.push(start(config).await);
    }
    let interfaces: Vec<String> = (0..5).map(|i| format!("org.example.Service{i}")).collect();
    let mut tasks = Vec::new();
    for app in 0..20 {
        let addr = replicas[app % 2].grpc_addr;
        let interfaces = interfaces.clone();
        tasks.push(tokio::spawn(async move {
            let interfaces: Vec<&str> = interfaces.iter().map(String::as_str).collect();
            let reply = client(addr)
                .await
                .register_service_app_mapping(request("demo", &format!("app-{app}"), &interfaces))
                .await;
            assert!(reply.map(|r| r.into_inner().success).unwrap_or(false));
        }));
    }
    for task in tasks {
        assert!(task.await.is_ok());
    }
    let expected: Vec<String> = {
        let all: BTreeSet<String> = (0..20).map(|i| format!("app-{i}")).collect();
        all.into_iter().collect()
    };
    for i in 0..5 {
        let name = format!("org-example-service{i}");
        eventually(Duration::from_secs(30), &name, || {
            api.applications("demo", &name) == expected
        })
        .await;
    }
    for replica in replicas {
        assert!(replica.stop().await.is_ok());
    }
}

/// Waits until the index's mapping state satisfies `check`.
async fn wait_index(
    server: &RunningServer,
    what: &str,
    check: impl Fn(&dubbo_cp::index::KindSnapshot) -> bool,
) {
    let mut rx = server
        .index
        .subscribe(dubbo_cp::index::Kind::ServiceNameMapping);
    let done = tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|s| check(s))).await;
    assert!(matches!(done, Ok(Ok(_))), "timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interfaces_differing_in_case_are_distinct_objects() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api)).await;
    wait_ready(&server).await;
    // Before: x.Y and x.y shared the object `x-y`, the writer retried the collision forever and
    // z.Z, acknowledged after them, was never written.
    register(&server, "ns", "upper", &["x.Y"]).await;
    // Written before the next one arrives; within one flush, whichever lands first wins.
    wait_outbox_empty(&server).await;
    register(&server, "ns", "lower", &["x.y"]).await;
    register(&server, "ns", "other", &["z.Z"]).await;
    wait_outbox_empty(&server).await;
    assert_eq!(api.object_count(), 3);
    assert_eq!(
        api.applications("ns", "x-y"),
        vec!["upper"],
        "first come keeps the name"
    );
    assert_eq!(api.applications("ns", "z-z"), vec!["other"]);
    wait_index(&server, "three objects", |s| s.objects.len() == 3).await;

    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let state = mappings_of(&observer.next().await);
    let interfaces: BTreeSet<&str> = state.values().map(|(i, _)| i.as_str()).collect();
    assert_eq!(interfaces, BTreeSet::from(["x.Y", "x.y", "z.Z"]));
    let lower = state
        .iter()
        .find(|(_, (interface, _))| interface == "x.y")
        .map(|(key, (_, apps))| (key.clone(), apps.clone()));
    let (lower_key, lower_apps) = lower.unwrap();
    assert_ne!(lower_key, "x-y/ns");
    assert_eq!(lower_apps, BTreeSet::from(["lower".to_string()]));

    // A second registration of x.y finds its own object, not the reference-named one.
    register(&server, "ns", "lower-2", &["x.y"]).await;
    wait_outbox_empty(&server).await;
    assert_eq!(api.object_count(), 3);
    let name = lower_key.trim_end_matches("/ns");
    assert_eq!(api.applications("ns", name), vec!["lower", "lower-2"]);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_api_server_refuses_is_parked_and_the_rest_keeps_flowing() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = k8s_config(dir.path(), &api);
    config.kubernetes.writer.parked_retry = Duration::from_millis(300);
    let server = start(config).await;
    wait_ready(&server).await;
    api.refuse_writes_to("ns", "a-refused", 422);
    register(&server, "ns", "app", &["a.Refused"]).await;
    register(&server, "ns", "app", &["b.Fine"]).await;
    register(&server, "ns", "app", &["c.Fine"]).await;
    eventually(Duration::from_secs(10), "the fine keys written", || {
        api.applications("ns", "b-fine") == vec!["app"]
            && api.applications("ns", "c-fine") == vec!["app"]
    })
    .await;
    // The refused key is parked with its reason, and still pending in the outbox.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let outbox = loop {
        let (_, body) = http_get(server.admin_addr, "/debug/outbox").await;
        let outbox: dubbo_cp::admin::OutboxView = serde_json::from_str(&body).unwrap();
        // The fine keys leave the outbox just after their writes land.
        if !outbox.parked.is_empty() && outbox.pending.len() == 1 {
            break outbox;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing parked: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(outbox.parked[0].interface_name, "a.Refused");
    assert!(
        outbox.parked[0].reason.contains("422"),
        "{:?}",
        outbox.parked[0]
    );
    assert_eq!(outbox.pending.len(), 1);
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_outbox_parked_keys 1"),
        "{metrics}"
    );

    // Once the API server accepts it, the slow retry writes it.
    api.allow_writes_to("ns", "a-refused");
    wait_outbox_empty(&server).await;
    assert_eq!(api.applications("ns", "a-refused"), vec!["app"]);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_watch_events_costs_one_encode_per_changed_object_per_window() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = k8s_config(dir.path(), &api);
    // A window long enough that the whole burst lands in one or two of them.
    config.debounce.after = Duration::from_millis(500);
    let server = start(config).await;
    wait_ready(&server).await;
    let kind = dubbo_cp::index::Kind::ServiceNameMapping;
    let (stats, encoding) = (server.index.stats(), server.encoder.stats());
    let (encodes, publishes) = (encoding.encodes_of(kind), stats.publishes_of(kind));
    // 10 objects, 100 edits each: 1,000 watch events.
    for round in 0..100 {
        for object in 0..10 {
            let apps: Vec<String> = (0..=round).map(|a| format!("app-{a}")).collect();
            api.kubectl_apply(
                "ns",
                &format!("obj-{object}"),
                json!({"interfaceName": format!("x.I{object}"), "applicationNames": apps}),
            );
        }
    }
    wait_index(&server, "the last edit", |s| {
        // Every state seen is encoded, as a discovery stream reading it would.
        server.encoder.state(s);
        s.objects.len() == 10
            && s.objects.values().all(|o| match &o.value {
                dubbo_cp::index::Resource::Mapping { applications, .. } => {
                    applications.len() == 100
                }
                _ => false,
            })
    })
    .await;
    let windows = stats.publishes_of(kind) - publishes;
    let encoded = encoding.encodes_of(kind) - encodes;
    println!("1,000 watch events: {windows} published states, {encoded} object encodes");
    assert!(windows <= 5, "{windows} assemblies for one burst");
    assert!(
        encoded <= 10 * windows,
        "{encoded} encodes over {windows} windows of 10 objects"
    );
    assert!(server.stop().await.is_ok());
}
