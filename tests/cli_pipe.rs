//! Every listing command, its standard output closed before it writes (`dubbo-cp status |
//! head -1` with `head` gone), ends quietly and successfully, as Unix tools do; not with
//! `failed printing to stdout: Broken pipe` and exit 101.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_commands_end_quietly_when_their_reader_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(undebounced_config(dir.path())).await;
    let mut grpc = client(server.grpc_addr).await;
    for app in ["a", "b", "c"] {
        let reply = grpc
            .register_service_app_mapping(request("shop", app, &["org.demo.Greeter"]))
            .await;
        assert!(reply.is_ok());
    }
    wait_published(&server, 1).await;
    // Something for every listing below to print.
    let (status, body) = http_send(
        server.admin_addr,
        "POST",
        "/api/v1/apply",
        "apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata: {name: grey, namespace: shop}
spec: {key: shop-provider, configVersion: v3.0, tags: [{name: gray, addresses: ['10.0.0.7:20880']}]}
---
apiVersion: dubbo.apache.org/v1alpha1
kind: ServiceEntry
metadata: {name: greeter, namespace: shop}
spec:
  hosts: [greeter]
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  endpoints: [{address: 127.0.0.1, ports: {grpc: 50051}}]
",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let grpc_addr = format!("http://{}", server.grpc_addr);
    let admin = server.admin_addr.to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["status", "--admin", &admin],
        vec!["get", "mappings", "--server", &grpc_addr, "-n", "shop"],
        vec![
            "get", "mappings", "--server", &grpc_addr, "-n", "shop", "-o", "json",
        ],
        vec!["get", "tagroutes", "--admin", &admin, "-n", "shop"],
        vec!["get", "applications", "--admin", &admin, "-n", "shop"],
        vec!["get", "serviceentries", "--admin", &admin, "-A"],
        vec!["ca", "root", "--admin", &admin],
        vec!["ca", "show", "--admin", &admin],
        vec!["status", "--compare", &admin, &admin],
        vec!["get", "tagroutes", "--admin", &admin, "--all-namespaces"],
        vec!["crd"],
    ];
    for args in commands {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the command writes anything (each writes something: the
        // same command with a reader is checked below).
        drop(child.stdout.take());
        let output = child.wait_with_output().await.unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{args:?}: {stderr}"
        );
        assert!(
            output.status.success(),
            "{args:?} ended with {:?}: {stderr}",
            output.status
        );
        let read = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .args(&args)
            .output()
            .await
            .unwrap();
        assert!(!read.stdout.is_empty(), "{args:?} prints nothing: {read:?}");
    }
    server.stop().await.unwrap();
}
