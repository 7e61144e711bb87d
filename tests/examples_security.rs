//! docs/security.md's standalone walk-through (`examples/security/walkthrough.sh`) run as a
//! reader runs it, on moved ports: its own control plane with tokens, agents, the example
//! grpcio server (and the @grpc/grpc-js-xds one) and client, plaintext, then STRICT mTLS and RBAC
//! from `examples/rules/zero-trust.yaml`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_security_walkthrough_runs_as_written() {
    let stdout = common::walkthrough::run("security/walkthrough.sh", 3, |ports| {
        vec![
            ("PYTHON", released::python().display().to_string()),
            ("NODE_PATH", released::node_modules().display().to_string()),
            ("GREETER_PORTS", format!("{} {}", ports[0], ports[1])),
            ("XDS_PROXY", format!("127.0.0.1:{}", ports[2])),
        ]
    })
    .await;
    for expected in [
        "(plaintext)",
        "the server saw spiffe://cluster.local/ns/web/sa/frontend on 10",
        "PERMISSION_DENIED: 10 of 10",
        "UNAVAILABLE: 10 of 10",
        "== grpc-js server, STRICT and RBAC",
        "== done",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in\n{stdout}");
    }
}
