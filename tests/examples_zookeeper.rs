//! docs/zookeeper.md's walk-through (`examples/zookeeper/walkthrough.sh`) run as a reader runs it,
//! on moved ports against a real ZooKeeper (Debian's): providers registered as Dubbo's SDKs
//! register them, a released grpcio client calling the interface by name, a weight and a tag rule
//! applied through dubbo-cp and seen in the split of the calls and in the config center.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use std::path::Path;
use std::time::Duration;

use common::zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zookeeper_walkthrough_runs_as_written() {
    let zk = ZooKeeper::start().await;
    let python = released::venv(
        "grpcio-1.85.3-kazoo-2.11.0",
        "grpcio==1.85.3 kazoo==2.11.0",
        "import grpc, kazoo",
    );
    // Six free ports, held together while they are picked so that none comes twice.
    let held: Vec<std::net::TcpListener> = (0..6)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    drop(held);
    let at = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let binary = Path::new(env!("CARGO_BIN_EXE_dubbo-cp"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let home = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/zookeeper/walkthrough.sh");
    let run = tokio::process::Command::new("bash")
        .arg(script)
        .env("PATH", path)
        .env("HOME", home.path())
        .env("PYTHON", python)
        .env("ZOOKEEPER", zk.address())
        .env("CALLS", "300")
        .envs([
            ("DUBBO_CP_GRPC_ADDR", at(0)),
            ("DUBBO_CP_SERVER", at(0)),
            ("DUBBO_CP_ADMIN_ADDR", at(1)),
            ("DUBBO_CP_ADMIN", at(1)),
            ("DUBBO_CP_XDS_ADDR", at(2)),
            ("DUBBO_CP_XDS_SERVER", at(2)),
            ("DUBBO_CP_TLS_ADDR", at(3)),
            ("GREETER_PORTS", format!("{} {}", ports[4], ports[5])),
        ])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the walk-through ended within 5 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    println!("{stdout}");
    for expected in [
        "== DynamicConfig: a weighs 400, b 100",
        "//#weight=400                  80.0%",
        "a answered 300 of 300 calls (100%)",
        "route 2: dubbo-tag=gray",
        "/dubbo/config/dubbo/greeter.configurators:",
        "/dubbo/config/dubbo/greeter.tag-router:",
        "== done",
    ] {
        assert!(
            stdout.contains(expected),
            "no {expected:?} in\n{stdout}\n{stderr}"
        );
    }
}
