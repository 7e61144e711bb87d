//! The real binary: SIGKILL after acknowledged registrations loses none of them; SIGTERM
//! finishes in-flight work and exits 0.

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
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    tokio::time::sleep(Duration::from_millis(300)).await;
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
