//! The binary's command line: configuration precedence and the `register` client.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::{admin_mappings, start, test_config};

fn print_config(file: &std::path::Path, env: &[(&str, &str)], flags: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["serve", "--print-config", "--config"])
        .arg(file)
        .args(flags)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a client sub-command of the real binary to completion.
async fn run_client(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(args)
        .output()
        .await
        .unwrap()
}

#[test]
fn flags_beat_environment_beats_file_beats_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dubbo-cp.yaml");
    let yaml = "grpcAddr: 127.0.0.1:1001\nadminAddr: 127.0.0.1:1002\ndataDir: /from/file\n\
                debounce:\n  after: 100000000\n  max: 20s\n  enable: true\n";
    assert!(std::fs::write(&file, yaml).is_ok());

    let only_file = print_config(&file, &[], &[]);
    assert!(
        only_file.contains("grpcAddr: 127.0.0.1:1001"),
        "{only_file}"
    );
    assert!(
        only_file.contains("after: 100ms"),
        "nanoseconds not read: {only_file}"
    );
    assert!(
        only_file.contains("queueCapacity: 8192"),
        "default missing: {only_file}"
    );

    let env = [
        ("DUBBO_CP_GRPC_ADDR", "127.0.0.1:2001"),
        ("DUBBO_CP_DATA_DIR", "/from/env"),
        ("DUBBO_CP_DEBOUNCE_ENABLE", "false"),
    ];
    let with_env = print_config(&file, &env, &[]);
    assert!(with_env.contains("grpcAddr: 127.0.0.1:2001"), "{with_env}");
    assert!(with_env.contains("dataDir: /from/env"), "{with_env}");
    assert!(with_env.contains("enable: false"), "{with_env}");
    assert!(with_env.contains("adminAddr: 127.0.0.1:1002"), "{with_env}");

    let with_flags = print_config(
        &file,
        &env,
        &["--grpc-addr", "127.0.0.1:3001", "--debounce-max", "2500ms"],
    );
    assert!(
        with_flags.contains("grpcAddr: 127.0.0.1:3001"),
        "{with_flags}"
    );
    assert!(with_flags.contains("max: 2s 500ms"), "{with_flags}");
    assert!(with_flags.contains("dataDir: /from/env"), "{with_flags}");
}

#[test]
fn bad_config_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    assert!(std::fs::write(&file, "debounce:\n  aftr: 1s\n").is_ok());
    let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("aftr"), "{stderr}");
}

#[test]
fn refuses_a_non_loopback_address_without_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args([
            "serve",
            "--grpc-addr",
            "0.0.0.0:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--tls-addr",
            "127.0.0.1:0",
            "--webhook-addr",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--insecure-allow-unauthenticated"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_subcommand_talks_to_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let addr = format!("http://{}", server.grpc_addr);
    let output = run_client(&[
        "register",
        "--server",
        &addr,
        "-n",
        "default",
        "-a",
        "demo-provider",
        "org.apache.dubbo.demo.DemoService",
    ])
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("success: true"));

    let bad = run_client(&[
        "register",
        "--server",
        &addr,
        "-n",
        "Bad",
        "-a",
        "demo-provider",
        "I",
    ])
    .await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("InvalidArgument"));

    let stored = admin_mappings(server.admin_addr).await;
    assert_eq!(stored.len(), 1);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_mappings_prints_the_state_from_the_discovery_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(common::undebounced_config(dir.path())).await;
    let mut client = common::client(server.grpc_addr).await;
    for (ns, app) in [("default", "demo-provider"), ("other", "other-provider")] {
        let reply = client
            .register_service_app_mapping(common::request(
                ns,
                app,
                &["org.apache.dubbo.demo.DemoService"],
            ))
            .await;
        assert!(reply.is_ok());
    }
    common::wait_published(&server, 2).await;
    let addr = format!("http://{}", server.grpc_addr);
    let output = run_client(&[
        "get", "mappings", "--server", &addr, "-n", "default", "-o", "json",
    ])
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let state: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let objects = state["objects"].as_array().cloned().unwrap_or_default();
    assert_eq!(objects.len(), 1, "{state}");
    assert_eq!(
        objects[0]["key"],
        "org-apache-dubbo-demo-demoservice/default"
    );
    assert_eq!(objects[0]["applicationNames"][0], "demo-provider");
    assert!(state["revision"].as_i64().unwrap_or(0) > 0);

    let text = run_client(&["get", "mappings", "--server", &addr]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("org-apache-dubbo-demo-demoservice/other\torg.apache.dubbo.demo.DemoService\tother-provider"), "{text}");
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_get_and_delete_rules_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::start(common::test_config(dir.path())).await;
    let admin = server.admin_addr.to_string();
    let manifest = dir.path().join("grey.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: grey, namespace: demo}\nspec:\n  key: demo-provider\n  configVersion: v3.0\n  tags: [{name: grey, addresses: [10.0.0.1]}]\n",
    )
    .unwrap();
    let path = manifest.to_str().unwrap();
    let applied = run_client(&["apply", "--admin", &admin, "-f", path]).await;
    assert!(applied.status.success(), "{applied:?}");
    assert_eq!(
        String::from_utf8_lossy(&applied.stdout),
        "TagRoute demo/grey created\n"
    );
    let again = run_client(&["apply", "--admin", &admin, "-f", path]).await;
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "TagRoute demo/grey unchanged\n"
    );
    let got = run_client(&[
        "get",
        "tagroutes",
        "--admin",
        &admin,
        "-n",
        "demo",
        "-o",
        "yaml",
    ])
    .await;
    assert!(got.status.success(), "{got:?}");
    let list: serde_yaml::Value = serde_yaml::from_slice(&got.stdout).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "grey");
    assert_eq!(list["items"][0]["metadata"]["namespace"], "demo");
    assert_eq!(
        list["items"][0]["spec"]["tags"][0]["addresses"][0],
        "10.0.0.1"
    );

    // A broken manifest: a clear message naming the field, a failing exit status.
    std::fs::write(&manifest, "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: grey, namespace: demo}\nspec: {key: \"\", configVersion: v3.0, tags: []}\n").unwrap();
    let refused = run_client(&["apply", "--admin", &admin, "-f", path]).await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("spec.key"), "{stderr}");

    let deleted = run_client(&[
        "delete",
        "tagroutes",
        "grey",
        "-n",
        "demo",
        "--admin",
        &admin,
    ])
    .await;
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout),
        "TagRoute demo/grey deleted\n"
    );
    let after = run_client(&["get", "tagroutes", "--admin", &admin, "-o", "json"]).await;
    let list: serde_json::Value = serde_json::from_slice(&after.stdout).unwrap();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    server.stop().await.unwrap();
}
