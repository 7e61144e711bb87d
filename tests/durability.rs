//! The real binary: SIGKILL after acknowledged registrations loses none of them (standalone, and
//! in Kubernetes mode during an API-server outage); SIGTERM finishes in-flight work and exits 0.
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{admin_mappings, client, request, spawn_binary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_registrations_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut process = spawn_binary(dir.path(), &[]);
    let addr = process.grpc_addr;

    // A batch that is fully acknowledged before the kill.
    let mut acked: BTreeSet<(String, String)> = BTreeSet::new();
    let mut sdk = client(addr).await;
    for i in 0..100 {
        let app = format!("app-{i}");
        let iface = format!("org.example.Service{}", i % 10);
        let reply = sdk
            .register_service_app_mapping(request("default", &app, &[&iface]))
            .await;
        assert!(reply.map(|r| r.into_inner().success).unwrap_or(false));
        acked.insert((iface, app));
    }

    // More registrations in flight while the process is killed: whatever was acknowledged must
    // survive too.
    let in_flight_acked = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let acked = in_flight_acked.clone();
            tokio::spawn(async move {
                let mut sdk = client(addr).await;
                for i in 0.. {
                    let app = format!("flood-{w}-{i}");
                    let iface = format!("org.example.Flood{}", i % 5);
                    match sdk
                        .register_service_app_mapping(request("default", &app, &[&iface]))
                        .await
                    {
                        Ok(reply) if reply.get_ref().success => {
                            acked
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((iface, app));
                        }
                        _ => break,
                    }
                }
            })
        })
        .collect();
    // Killed in the middle of the flood: once a good number are acknowledged, others are in
    // flight.
    wait_until(Duration::from_secs(20), "200 flood acks", async || {
        in_flight_acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
            >= 200
    })
    .await;
    // Child::kill sends SIGKILL.
    assert!(process.child.kill().is_ok());
    assert!(process.child.wait().is_ok());
    for writer in writers {
        let _ = writer.await;
    }
    let flood = in_flight_acked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    assert!(
        !flood.is_empty(),
        "no registration was acknowledged while flooding"
    );
    acked.extend(flood);

    let restarted = spawn_binary(dir.path(), &[]);
    let stored = admin_mappings(restarted.admin_addr).await;
    let stored_pairs: BTreeSet<(String, String)> = stored
        .into_iter()
        .flat_map(|((_, iface), apps)| apps.into_iter().map(move |app| (iface.clone(), app)))
        .collect();
    let lost: Vec<_> = acked.difference(&stored_pairs).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged registrations lost, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    println!(
        "{} acknowledged registrations all survived SIGKILL",
        acked.len()
    );
    let mut restarted = restarted;
    let _ = restarted.child.kill();
    let _ = restarted.child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_registrations_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut process = spawn_binary(dir.path(), &[]);
    let addr = process.grpc_addr;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let acked = acked.clone();
            tokio::spawn(async move {
                let mut sdk = client(addr).await;
                for i in 0.. {
                    let app = format!("app-{w}-{i}");
                    match sdk
                        .register_service_app_mapping(request("default", &app, &["I"]))
                        .await
                    {
                        Ok(reply) if reply.get_ref().success => {
                            acked.lock().unwrap_or_else(|e| e.into_inner()).push(app);
                        }
                        _ => break,
                    }
                }
            })
        })
        .collect();
    wait_until(Duration::from_secs(20), "200 acks", async || {
        acked.lock().unwrap_or_else(|e| e.into_inner()).len() >= 200
    })
    .await;
    let pid = process.child.id().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(
        sent.map(|s| s.success()).unwrap_or(false),
        "could not send SIGTERM"
    );
    let status = process.child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after SIGTERM: {status:?}"
    );
    let logs: Vec<String> = process.logs.try_iter().collect();
    assert!(
        logs.iter().any(|l| l.contains("shutdown complete")),
        "{logs:#?}"
    );
    for writer in writers {
        let _ = writer.await;
    }

    let acked: BTreeSet<String> = acked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    assert!(!acked.is_empty());
    let restarted = spawn_binary(dir.path(), &[]);
    let stored = admin_mappings(restarted.admin_addr).await;
    let apps = stored
        .get(&("default".into(), "I".into()))
        .cloned()
        .unwrap_or_default();
    assert!(
        acked.is_subset(&apps),
        "{} acknowledged, {} stored",
        acked.len(),
        apps.len()
    );
    let mut restarted = restarted;
    let _ = restarted.child.kill();
    let _ = restarted.child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_and_restart_the_first_state_has_everything_at_a_higher_revision() {
    use common::{Observer, SNP_TYPE, mappings_of};

    let dir = tempfile::tempdir().unwrap();
    let mut process = spawn_binary(dir.path(), &["--debounce-enable", "false"]);
    let mut observer = Observer::open(process.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let mut highest = observer.next().await;
    observer.ack(&highest).await;

    let mut acked: BTreeSet<(String, String)> = BTreeSet::new();
    let mut sdk = client(process.grpc_addr).await;
    for i in 0..50 {
        let app = format!("app-{i}");
        let iface = format!("org.example.Service{}", i % 7);
        let reply = sdk
            .register_service_app_mapping(request("default", &app, &[&iface]))
            .await;
        assert!(reply.map(|r| r.into_inner().success).unwrap_or(false));
        acked.insert((iface, app));
    }
    // Read what the stream pushed until it has everything (each response acknowledged).
    loop {
        let pairs: usize = mappings_of(&highest)
            .values()
            .map(|(_, apps)| apps.len())
            .sum();
        if pairs == acked.len() {
            break;
        }
        highest = observer.next().await;
        observer.ack(&highest).await;
    }
    assert!(process.child.kill().is_ok());
    assert!(process.child.wait().is_ok());

    let mut restarted = spawn_binary(dir.path(), &[]);
    let mut observer = Observer::open(restarted.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let first = observer.next().await;
    assert!(
        first.revision > highest.revision,
        "revision {} after restart, {} before",
        first.revision,
        highest.revision
    );
    let received: BTreeSet<(String, String)> = mappings_of(&first)
        .into_values()
        .flat_map(|(iface, apps)| apps.into_iter().map(move |app| (iface.clone(), app)))
        .collect();
    assert_eq!(received, acked);
    let _ = restarted.child.kill();
    let _ = restarted.child.wait();
}

/// Waits until `check` holds, checking every 10 ms; panics naming `what` after `limit`.
async fn wait_until(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The real binary in Kubernetes mode against the API-server fixture. Callers are not
/// authenticated: this is about the outbox (TokenReview has its own tests).
fn spawn_kubernetes_binary(
    data_dir: &std::path::Path,
    config: &std::path::Path,
    api: &common::apiserver::ApiServer,
) -> common::Process {
    let url = api.url();
    let config = config.to_string_lossy().into_owned();
    spawn_binary(
        data_dir,
        &[
            "--mode",
            "kubernetes",
            "--kube-api-server",
            &url,
            "--config",
            &config,
        ],
    )
}

/// The pending (namespace, interface, application) triples `/debug/outbox` reports.
async fn outbox_pending(admin: std::net::SocketAddr) -> BTreeSet<(String, String, String)> {
    let (status, body) = common::http_get(admin, "/debug/outbox").await;
    assert_eq!(status, 200, "{body}");
    let outbox: dubbo_cp::admin::OutboxView =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    outbox
        .pending
        .into_iter()
        .flat_map(|view| {
            let (namespace, interface) = (view.namespace, view.interface_name);
            view.application_names
                .into_iter()
                .map(move |app| (namespace.clone(), interface.clone(), app))
        })
        .collect()
}

/// Kubernetes mode keeps acknowledged registrations in the outbox under `--data-dir` until they
/// are in the cluster: a SIGKILL during an API-server outage, and a restart on the same data dir
/// still inside the outage, lose none of them, and each is written once the API server is back.
/// (The StatefulSet in deploy/ keeps that data dir across pod deletion; tests/manifests.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_mode_writes_every_acknowledged_pair_after_sigkill_during_an_api_outage() {
    use common::apiserver::ApiServer;

    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("dubbo-cp.yaml");
    std::fs::write(&config, "auth:\n  tokenReview: false\n").unwrap();

    let mut process = spawn_kubernetes_binary(dir.path(), &config, &api);
    let admin = process.admin_addr;
    // Running normally first: listed, watching, ready.
    wait_until(Duration::from_secs(20), "readiness", async || {
        common::http_get(admin, "/readyz").await.0 == 200
    })
    .await;

    api.set_down(true);
    let requests_at_outage = api.requests();
    let mut acked: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut sdk = client(process.grpc_addr).await;
    for i in 0..40 {
        let namespace = if i % 2 == 0 { "demo" } else { "other" };
        let app = format!("app-{i}");
        let interfaces = [
            format!("org.example.Service{}", i % 5),
            format!("org.example.Shared{}", i % 3),
        ];
        let interfaces: Vec<&str> = interfaces.iter().map(String::as_str).collect();
        let reply = sdk
            .register_service_app_mapping(request(namespace, &app, &interfaces))
            .await;
        assert!(
            reply.map(|r| r.into_inner().success).unwrap_or(false),
            "registration {i} not acknowledged during the outage"
        );
        for interface in interfaces {
            acked.insert((namespace.into(), interface.into(), app.clone()));
        }
    }
    // The writer is retrying against the outage when the process dies.
    wait_until(
        Duration::from_secs(10),
        "a write attempt in the outage",
        async || api.requests() > requests_at_outage,
    )
    .await;
    assert!(process.child.kill().is_ok(), "SIGKILL failed");
    assert!(process.child.wait().is_ok());
    assert!(
        api.stored_pairs().is_empty(),
        "something reached the API server during the outage"
    );

    // Restarted on the same data dir, still in the outage: everything acknowledged is pending.
    let mut restarted = spawn_kubernetes_binary(dir.path(), &config, &api);
    assert_eq!(outbox_pending(restarted.admin_addr).await, acked);

    api.set_down(false);
    let written = api
        .wait_for_pairs(Duration::from_secs(30), |stored| acked.is_subset(stored))
        .await;
    let stored = api.stored_pairs();
    let missing: Vec<_> = acked.difference(&stored).collect();
    assert!(
        written,
        "{} of {} acknowledged pairs never written, e.g. {:?}",
        missing.len(),
        acked.len(),
        missing.first()
    );
    assert_eq!(stored, acked, "pairs nobody registered were written");
    // Written pairs leave the outbox, so a later restart does not write them again.
    wait_until(Duration::from_secs(10), "an empty outbox", async || {
        outbox_pending(restarted.admin_addr).await.is_empty()
    })
    .await;
    println!(
        "{} acknowledged pairs survived SIGKILL during the outage and were written",
        acked.len()
    );
    let _ = restarted.child.kill();
    let _ = restarted.child.wait();
}
