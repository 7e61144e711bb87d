//! Replicas stay in hearing across ensemble restarts (a real ZooKeeper, Debian's package): the
//! whole ensemble stopped and started again under two replicas whose sessions survive, and a
//! three-server ensemble restarted one server at a time. After each, an SDK's next write must
//! reach every replica.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::zookeeper::{Ensemble, ZooKeeper, sdk_register, zk_config};
use common::*;

/// How long a write may take to reach a replica before the test calls it unheard. The goal is
/// 1 s (measured and printed); the limit is wider so a loaded CI machine does not fail a replica
/// that hears: one that does not hear never does (12 s and more were measured before the fix).
const HEARD_WITHIN: Duration = Duration::from_secs(5);

/// Waits until the replica's session is up again (`/debug/sources`).
async fn wait_connected(admin: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = http_get(admin, "/debug/sources").await;
        if body.contains("\"state\":\"connected\"") {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `interface` -> `application` as an SDK does and returns how long each replica took
/// to serve it.
async fn sdk_write_heard(
    sdk: &zookeeper_client::Client,
    replicas: &[SocketAddr],
    interface: &str,
    application: &str,
) -> Vec<Duration> {
    assert!(sdk_register(sdk, interface, application).await);
    let written = Instant::now();
    let mut took = Vec::new();
    for admin in replicas {
        loop {
            let mappings = admin_mappings(*admin).await;
            let key = ("default".to_owned(), interface.to_owned());
            if mappings
                .get(&key)
                .is_some_and(|apps| apps.contains(application))
            {
                took.push(written.elapsed());
                break;
            }
            assert!(
                written.elapsed() < HEARD_WITHIN,
                "replica {admin} did not hear {interface} -> {application} within {HEARD_WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    took
}

/// Two SDK writes after a reconnection: the first may still be read by the re-list the
/// reconnection started; the second, written once the first was served everywhere, only the
/// watch can bring.
async fn heard_after_reconnection(
    sdk: &zookeeper_client::Client,
    replicas: &[SocketAddr],
    label: &str,
) -> Vec<Duration> {
    sdk_write_heard(sdk, replicas, &format!("org.demo.{label}"), "java-app").await;
    sdk_write_heard(sdk, replicas, &format!("org.demo.{label}.Next"), "java-app").await
}

/// The replica's `zookeeper_rewatches_total`.
async fn rewatches(admin: SocketAddr) -> f64 {
    metric(admin, "dubbo_cp_zookeeper_rewatches_total").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_restart_leaves_no_replica_deaf() {
    let mut zk = ZooKeeper::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start(zk_config(dir_a.path(), &zk)).await;
    let b = start(zk_config(dir_b.path(), &zk)).await;
    let replicas = [a.admin_addr, b.admin_addr];
    for admin in replicas {
        wait_ready(admin).await;
    }
    let sdk = zk.client().await;
    let before = sdk_write_heard(&sdk, &replicas, "org.demo.Before", "java-app").await;
    println!("before any restart: heard in {before:?}");
    drop(sdk);

    for round in 0..3 {
        let sessions = [
            metric(a.admin_addr, "dubbo_cp_zookeeper_sessions_total").await,
            metric(b.admin_addr, "dubbo_cp_zookeeper_sessions_total").await,
        ];
        // Stopped and started on the same port with the same data: the sessions survive.
        zk.stop();
        zk.resume_serving().await;
        for admin in replicas {
            wait_connected(admin).await;
        }
        let sdk = zk.client().await;
        let took = heard_after_reconnection(&sdk, &replicas, &format!("After{round}")).await;
        println!("restart {round}: heard in {took:?}");
        // The case this guards: a session that survived the restart.
        let after = [
            metric(a.admin_addr, "dubbo_cp_zookeeper_sessions_total").await,
            metric(b.admin_addr, "dubbo_cp_zookeeper_sessions_total").await,
        ];
        if after == sessions {
            for admin in replicas {
                assert!(rewatches(admin).await >= f64::from(round + 1));
            }
        }
    }
    // The count of nodes watched is current, not the last re-list's.
    let (_, body) = http_get(a.admin_addr, "/debug/sources").await;
    assert!(body.contains("(7 nodes watched)"), "{body}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_servers_leaves_no_replica_deaf() {
    let mut ensemble = Ensemble::start().await;
    let address = ensemble.address();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = |dir: &std::path::Path| {
        let mut config = test_config(dir);
        config.zookeeper.address = Some(address.clone());
        config.zookeeper.session_timeout = Duration::from_secs(8);
        config.debounce.after = Duration::from_millis(20);
        config.debounce.max = Duration::from_millis(200);
        config.shutdown_grace = Duration::from_secs(2);
        config
    };
    let a = start(config(dir_a.path())).await;
    let b = start(config(dir_b.path())).await;
    let replicas = [a.admin_addr, b.admin_addr];
    for admin in replicas {
        wait_ready(admin).await;
    }
    for server in 0..3 {
        ensemble.stop(server);
        // The other two serve (a new leader, when the stopped one led) before the SDK writes.
        for other in (0..3).filter(|other| *other != server) {
            ensemble.wait_serving(other).await;
        }
        // Each replica was on one of the three: at least one stop moved each to another.
        let sdk = ensemble.client().await;
        let took = heard_after_reconnection(&sdk, &replicas, &format!("Without{server}")).await;
        println!("server {server} stopped: heard in {took:?}");
        ensemble.resume(server).await;
    }
    for admin in replicas {
        assert!(
            rewatches(admin).await >= 1.0,
            "no reconnection happened at {admin}"
        );
    }
    let sdk = ensemble.client().await;
    let took = sdk_write_heard(&sdk, &replicas, "org.demo.AfterAll", "go-app").await;
    println!("after the rolling restart: heard in {took:?}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
