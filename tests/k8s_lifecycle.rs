//! Kubernetes mode against the API-server fixture: applications expire once the pods that
//! registered them are gone (and never while one lives, whatever races), and replicas prove
//! whether they serve the same state, also through a partition; the reverse lookup.

// Tests and their helpers: a failure is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::apiserver::ApiServer;
use common::sa_tokens::{Claims, Issuer};
use common::{Observer, SNP_TYPE, client, http_get, metric, request, start};
use dubbo_cp::config::Config;
use dubbo_cp::server::RunningServer;
use serde_json::json;

const EXPIRE: Duration = Duration::from_secs(1);
/// The object `org.example.Greeter` is stored as.
const OBJECT: &str = "org-example-greeter";

fn config(dir: &std::path::Path, api_url: String) -> Config {
    let mut config = common::kubernetes_config(dir, api_url);
    config.mapping.expire_after = EXPIRE;
    config.auth.admins = vec!["demo/ops".into()];
    config
}

/// A token of the admin identity `demo/ops`, bound to no pod.
fn admin_token(issuer: &Issuer) -> String {
    issuer.mint(&Claims {
        pod: None,
        ..Claims::bound("demo", "ops", ("", ""))
    })
}

/// `app` registers `org.example.Greeter` in `demo` from pod `pod`.
async fn register_from(server: &RunningServer, issuer: &Issuer, pod: (&str, &str)) {
    register_app_from(server, issuer, "app", pod).await;
}

async fn register_app_from(
    server: &RunningServer,
    issuer: &Issuer,
    application: &str,
    pod: (&str, &str),
) {
    let token = issuer.mint(&Claims::bound("demo", "provider", pod));
    let mut call = tonic::Request::new(request("demo", application, &["org.example.Greeter"]));
    call.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let reply = client(server.grpc_addr)
        .await
        .register_service_app_mapping(call)
        .await;
    assert!(
        reply.as_ref().is_ok_and(|r| r.get_ref().success),
        "{reply:?}"
    );
}

async fn eventually<F: AsyncFnMut() -> bool>(what: &str, mut condition: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pods the object records for `app`, or `None` without the object or the record.
fn recorded(api: &ApiServer) -> Option<Vec<String>> {
    recorded_for(api, "app")
}

fn recorded_for(api: &ApiServer, application: &str) -> Option<Vec<String>> {
    let object = api.get("demo", OBJECT)?;
    let text = object["metadata"]["annotations"]["dubbo.apache.org/registrants"].as_str()?;
    let record: serde_json::Value = serde_json::from_str(text).ok()?;
    let entries: Vec<String> = serde_json::from_value(record[application].clone()).ok()?;
    // Entries are `<name>/<uid>`; the tests name pods.
    Some(
        entries
            .iter()
            .map(|e| e.split('/').next().unwrap_or_default().to_owned())
            .collect(),
    )
}

/// Waits until every given replica has scanned `scans` more times (each scan judges every
/// record), so "not removed" is asserted after the decision was really taken.
async fn wait_scans(servers: &[&RunningServer], scans: f64) {
    for server in servers {
        let name = "dubbo_cp_mapping_expiry_scans_total";
        let start = metric(server.admin_addr, name).await;
        eventually("expiry scans", async || {
            metric(server.admin_addr, name).await >= start + scans
        })
        .await;
    }
}

/// Scans that span more than the expiry period (one every `EXPIRE / 4`).
const PERIOD_OF_SCANS: f64 = 6.0;

async fn setup() -> (ApiServer, Issuer) {
    common::sa_tokens::cluster_with_provider().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_expires_only_after_its_last_pod_is_gone_for_the_period() {
    let (api, issuer) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), api.url())).await;
    common::wait_ready(server.admin_addr).await;
    register_from(&server, &issuer, ("provider-1", "uid-1")).await;
    eventually("the pod recorded", async || {
        recorded(&api) == Some(vec!["provider-1".into()])
    })
    .await;
    let watcher = issuer.mint(&Claims::bound("demo", "consumer", ("provider-1", "uid-1")));
    let mut observer =
        Observer::connect_as(common::channel(server.grpc_addr).await, Some(&watcher))
            .await
            .unwrap();
    common::wait_published(&server, 1).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    assert_eq!(common::mappings_of(&first).len(), 1);
    observer.ack(&first).await;

    // A live pod: many periods pass, the application stays.
    wait_scans(&[&server], 2.0 * PERIOD_OF_SCANS).await;
    assert_eq!(api.applications("demo", OBJECT), vec!["app"]);
    assert_eq!(
        metric(server.admin_addr, "dubbo_cp_mapping_pending_expiries").await,
        0.0
    );

    // Its pod goes; a new pod registers during the countdown, which cancels it.
    api.delete_pod("demo", "provider-1");
    eventually("the countdown started", async || {
        metric(server.admin_addr, "dubbo_cp_mapping_pending_expiries").await == 1.0
    })
    .await;
    api.put_pod(
        "demo",
        "provider-2",
        "uid-2",
        json!({"app": "provider"}),
        &["10.0.0.8"],
    );
    register_from(&server, &issuer, ("provider-2", "uid-2")).await;
    eventually("the new pod recorded", async || {
        recorded(&api) == Some(vec!["provider-1".into(), "provider-2".into()])
    })
    .await;
    // The reverse lookup counts the registering pods the object records.
    eventually("the lookup counts both pods", async || {
        let token = admin_token(&issuer);
        let (_, body) = common::http_send(
            server.admin_addr,
            "GET",
            "/debug/applications?namespace=demo",
            "",
            Some(&token),
        )
        .await;
        let views: Vec<dubbo_cp::admin::ApplicationView> =
            serde_json::from_str(&body).unwrap_or_default();
        views.len() == 1 && views[0].registering_pods == Some(2)
    })
    .await;
    wait_scans(&[&server], 2.0 * PERIOD_OF_SCANS).await;
    assert_eq!(api.applications("demo", OBJECT), vec!["app"]);
    assert_eq!(
        metric(server.admin_addr, "dubbo_cp_mapping_pending_expiries").await,
        0.0
    );
    assert_eq!(
        metric(
            server.admin_addr,
            "dubbo_cp_mapping_expired_applications_total"
        )
        .await,
        0.0
    );

    // The last pod goes: after the period the application leaves the object (its last one,
    // so the object goes) and the stream.
    api.delete_pod("demo", "provider-2");
    eventually("the application expired", async || {
        api.get("demo", OBJECT).is_none()
    })
    .await;
    // Counted once the API server has answered the delete, which is a moment after the
    // object is gone from the fixture's store.
    eventually("the expiry counted", async || {
        metric(
            server.admin_addr,
            "dubbo_cp_mapping_expired_applications_total",
        )
        .await
            == 1.0
    })
    .await;
    let after = observer.next().await;
    assert!(
        common::mappings_of(&after).is_empty(),
        "{:?}",
        common::mappings_of(&after)
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podless_registrations_pin_and_two_replicas_racing_a_removal_keep_the_live_application() {
    let (api, issuer) = setup().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start(config(dir_a.path(), api.url())).await;
    let b = start(config(dir_b.path(), api.url())).await;
    common::wait_ready(a.admin_addr).await;
    common::wait_ready(b.admin_addr).await;

    // Every request takes a while, so the removal's read-then-write and the registration's
    // write overlap.
    api.set_latency(Duration::from_millis(40));
    for round in 0..3 {
        let old = format!("old-{round}");
        let new = format!("new-{round}");
        api.put_pod("demo", &old, &old, json!({}), &["10.0.1.1"]);
        register_from(&a, &issuer, (&old, &old)).await;
        eventually("the old pod recorded", async || {
            recorded(&api).is_some_and(|pods| pods.contains(&old))
        })
        .await;
        api.delete_pod("demo", &old);
        for server in [&a, &b] {
            eventually("both replicas count down", async || {
                metric(server.admin_addr, "dubbo_cp_mapping_pending_expiries").await == 1.0
            })
            .await;
        }
        // Just as the removal comes due on both replicas, a new pod registers through b.
        tokio::time::sleep(EXPIRE - Duration::from_millis(100 * round)).await;
        api.put_pod("demo", &new, &new, json!({}), &["10.0.1.2"]);
        register_from(&b, &issuer, (&new, &new)).await;
        eventually("the new pod recorded", async || {
            recorded(&api).is_some_and(|pods| pods.contains(&new))
        })
        .await;
        wait_scans(&[&a, &b], PERIOD_OF_SCANS).await;
        assert_eq!(
            api.applications("demo", OBJECT),
            vec!["app"],
            "round {round}"
        );
        api.delete_pod("demo", &new);
        eventually("expired before the next round", async || {
            api.get("demo", OBJECT).is_none()
        })
        .await;
    }

    // A pod registering while the write of another's record is in flight is written too
    // (the in-flight write takes only what it read).
    for pod in ["during-1", "during-2"] {
        api.put_pod("demo", pod, pod, json!({}), &["10.0.3.1"]);
    }
    // Slow enough that the second registration lands inside the first one's upsert.
    api.set_latency(Duration::from_millis(400));
    let requests = api.mapping_object_requests();
    register_from(&a, &issuer, ("during-1", "during-1")).await;
    eventually("the first record's write started", async || {
        api.mapping_object_requests() > requests
    })
    .await;
    register_from(&a, &issuer, ("during-2", "during-2")).await;
    eventually("both pods recorded", async || {
        recorded(&api).is_some_and(|pods| {
            pods.contains(&"during-1".to_owned()) && pods.contains(&"during-2".to_owned())
        })
    })
    .await;
    api.set_latency(Duration::ZERO);

    // A registration without a pod identity (an admin's token bound to no pod here) pins
    // the application: its pods going never removes it.
    api.put_pod("demo", "pinned-pod", "pinned-pod", json!({}), &["10.0.2.1"]);
    register_from(&a, &issuer, ("pinned-pod", "pinned-pod")).await;
    let unbound = issuer.mint(&Claims {
        pod: None,
        ..Claims::bound("demo", "provider", ("", ""))
    });
    let mut call = tonic::Request::new(request("demo", "app", &["org.example.Greeter"]));
    call.metadata_mut().insert(
        "authorization",
        format!("Bearer {unbound}").parse().unwrap(),
    );
    let reply = client(a.grpc_addr)
        .await
        .register_service_app_mapping(call)
        .await;
    assert!(reply.is_ok_and(|r| r.into_inner().success));
    eventually("pinned", async || recorded(&api) == Some(vec![])).await;
    api.delete_pod("demo", "pinned-pod");
    wait_scans(&[&a, &b], 2.0 * PERIOD_OF_SCANS).await;
    assert_eq!(api.applications("demo", OBJECT), vec!["app"]);
    assert!(a.stop().await.is_ok());
    assert!(b.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_of_another_application_committed_during_a_retry_is_recorded_with_its_pair() {
    let (api, issuer) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), api.url());
    // B's registration waits in the debounce while A's write is retried.
    config.debounce.after = Duration::from_secs(1);
    config.debounce.max = Duration::from_secs(5);
    let server = start(config).await;
    common::wait_ready(server.admin_addr).await;
    api.put_pod("demo", "pod-a2", "uid-a2", json!({}), &["10.0.4.1"]);
    api.put_pod("demo", "pod-b", "uid-b", json!({}), &["10.0.4.2"]);
    register_app_from(&server, &issuer, "a", ("provider-1", "uid-1")).await;
    eventually("A recorded", async || recorded_for(&api, "a").is_some()).await;
    // A's next update fails once (its read and its write reach the fixture); B registers
    // during the retry's backoff.
    api.fail_next_writes(1);
    let requests = api.mapping_object_requests();
    register_app_from(&server, &issuer, "a", ("pod-a2", "uid-a2")).await;
    eventually("A's update failed", async || {
        api.mapping_object_requests() >= requests + 2
    })
    .await;
    register_app_from(&server, &issuer, "b", ("pod-b", "uid-b")).await;
    eventually("B recorded with its pod", async || {
        recorded_for(&api, "b") == Some(vec!["pod-b".into()])
    })
    .await;
    assert_eq!(
        recorded_for(&api, "a"),
        Some(vec!["pod-a2".into(), "provider-1".into()])
    );
    assert!(server.stop().await.is_ok());
}

/// A TCP relay to the fixture that can be cut: one replica's own network partition.
struct Relay {
    addr: SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = open.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    continue; // dropped: connection refused in effect
                }
                let mut cut_rx = cut_rx.clone();
                let counter = counter.clone();
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = cut_rx.wait_for(|cut| *cut) => {}
                        }
                    }
                    counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        });
        Relay { addr, cut, open }
    }

    /// Cuts every connection; returns once none is left.
    async fn partition(&self) {
        self.cut.send_replace(true);
        eventually("the relay's connections closed", async || {
            self.open.load(std::sync::atomic::Ordering::SeqCst) == 0
        })
        .await;
    }
}

async fn digest(admin: SocketAddr) -> dubbo_cp::digest::DigestView {
    let (status, body) = http_get(admin, "/debug/digest?objects=true").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn mappings(view: &dubbo_cp::digest::DigestView) -> &dubbo_cp::digest::KindDigest {
    view.kinds
        .iter()
        .find(|k| k.kind == "ServiceNameMapping")
        .unwrap()
}

fn mapping_digest(view: &dubbo_cp::digest::DigestView) -> String {
    mappings(view).digest.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_until_one_is_partitioned_and_the_reverse_lookup_reads_the_cluster() {
    let api = ApiServer::start().await;
    let target: SocketAddr = api.url().trim_start_matches("http://").parse().unwrap();
    let relay = Relay::start(target).await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut direct = config(dir_a.path(), api.url());
    direct.auth.token_review = Some(false);
    let mut relayed = config(dir_b.path(), format!("http://{}", relay.addr));
    relayed.auth.token_review = Some(false);
    let a = start(direct).await;
    let b = start(relayed).await;
    common::wait_ready(a.admin_addr).await;
    common::wait_ready(b.admin_addr).await;
    api.kubectl_apply(
        "demo",
        "greeter",
        json!({"interfaceName": "org.example.Greeter", "applicationNames": ["app1", "app2"]}),
    );
    api.kubectl_apply(
        "demo",
        "other",
        json!({"interfaceName": "org.example.Other", "applicationNames": ["app1"]}),
    );
    eventually("both replicas see both objects", async || {
        mappings(&digest(a.admin_addr).await).objects == 2
            && mappings(&digest(b.admin_addr).await).objects == 2
    })
    .await;
    assert_eq!(
        mapping_digest(&digest(a.admin_addr).await),
        mapping_digest(&digest(b.admin_addr).await)
    );

    // The reverse lookup reads what the watch sees in the cluster.
    let (_, body) = http_get(
        a.admin_addr,
        "/debug/applications?namespace=demo&application=app1",
    )
    .await;
    let found: Vec<dubbo_cp::admin::ApplicationView> = serde_json::from_str(&body).unwrap();
    assert_eq!(found.len(), 1, "{body}");
    assert_eq!(
        found[0].interfaces,
        vec!["org.example.Greeter", "org.example.Other"]
    );

    // b loses the API server; an edit reaches a only.
    relay.partition().await;
    api.kubectl_apply(
        "demo",
        "greeter",
        json!({"interfaceName": "org.example.Greeter", "applicationNames": ["app1"]}),
    );
    let before = mapping_digest(&digest(b.admin_addr).await);
    eventually("a serves the edit", async || {
        mapping_digest(&digest(a.admin_addr).await) != before
    })
    .await;
    let (_, body) = http_get(a.admin_addr, "/debug/applications?application=app2").await;
    assert_eq!(body, "[]");
    let (view_a, view_b) = (digest(a.admin_addr).await, digest(b.admin_addr).await);
    assert_eq!(
        mapping_digest(&view_b),
        before,
        "b saw the edit through the partition"
    );
    let report = dubbo_cp::digest::compare(&[view_a, view_b]);
    let mappings = report
        .iter()
        .find(|k| k.kind == "ServiceNameMapping")
        .unwrap();
    assert!(!mappings.agree);
    let differing: Vec<&str> = mappings.differing.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(differing, vec!["greeter/demo"]);
    assert!(
        report
            .iter()
            .filter(|k| k.kind != "ServiceNameMapping")
            .all(|k| k.agree)
    );

    // The partition heals: b catches up and they agree again.
    relay.cut.send_replace(false);
    eventually("b catches up", async || {
        mapping_digest(&digest(a.admin_addr).await) == mapping_digest(&digest(b.admin_addr).await)
    })
    .await;
    assert!(a.stop().await.is_ok());
    assert!(b.stop().await.is_ok());
}
