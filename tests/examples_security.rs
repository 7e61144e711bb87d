//! docs/security.md's standalone walk-through (`examples/security/walkthrough.sh`) run as a
//! reader runs it, on moved ports: its own control plane with tokens, agents, the example
//! grpcio server (and the @grpc/grpc-js-xds one) and client, plaintext, then STRICT mTLS and RBAC
//! from `examples/rules/zero-trust.yaml`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use std::path::Path;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_security_walkthrough_runs_as_written() {
    // Eight free ports, held together while they are picked so that none comes twice.
    let held: Vec<std::net::TcpListener> = (0..7)
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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/security/walkthrough.sh");
    let run = tokio::process::Command::new("bash")
        .arg(script)
        .env("PATH", path)
        .env("HOME", home.path())
        .env("PYTHON", released::python())
        .env("NODE_PATH", released::node_modules())
        .envs([
            ("DUBBO_CP_GRPC_ADDR", at(0)),
            ("DUBBO_CP_SERVER", at(0)),
            ("DUBBO_CP_ADMIN_ADDR", at(1)),
            ("DUBBO_CP_ADMIN", at(1)),
            ("DUBBO_CP_XDS_ADDR", at(2)),
            ("DUBBO_CP_XDS_SERVER", at(2)),
            ("DUBBO_CP_TLS_ADDR", at(3)),
            ("GREETER_PORTS", format!("{} {}", ports[4], ports[5])),
            ("XDS_PROXY", at(6)),
        ])
        .env_remove("DUBBO_CA_ADDRESS")
        .env_remove("DUBBO_CP_TOKEN")
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
        "(plaintext)",
        "the server saw spiffe://cluster.local/ns/web/sa/frontend on 10",
        "PERMISSION_DENIED: 10 of 10",
        "UNAVAILABLE: 10 of 10",
        "== grpc-js server, STRICT and RBAC",
        "== done",
    ] {
        assert!(
            stdout.contains(expected),
            "no {expected:?} in\n{stdout}\n{stderr}"
        );
    }
}
