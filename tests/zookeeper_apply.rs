//! `apply --wait` in ZooKeeper mode: the rule is written to the config center, read back by the
//! watch and served before the command returns, so a `get` right after prints it (without the
//! wait it printed "No resources found": the write had not come back yet).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;

use common::zookeeper::{ZooKeeper, zk_config};
use common::*;
use tokio::io::AsyncWriteExt;

const TAG_ROUTE: &str = "apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata: {name: grey, namespace: default}
spec:
  key: shop-provider
  configVersion: v3.0
  tags:
    - name: gray
      addresses: ['10.0.0.7:20880']
";

async fn cli(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    child.wait_with_output().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_wait_returns_once_the_rule_is_served() {
    let zk = ZooKeeper::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A slow debounce, so the read-back takes a while and a command that does not wait loses.
    let mut config = zk_config(dir.path(), &zk);
    config.debounce.after = std::time::Duration::from_millis(300);
    config.debounce.max = std::time::Duration::from_millis(600);
    let server = start(config).await;
    wait_ready(server.admin_addr).await;
    let admin = server.admin_addr.to_string();

    let applied = cli(
        &["apply", "-f", "-", "--wait", "--admin", &admin],
        TAG_ROUTE,
    )
    .await;
    assert!(applied.status.success(), "{applied:?}");
    assert!(String::from_utf8_lossy(&applied.stdout).contains("created"));
    let got = cli(
        &["get", "tagroutes", "-n", "default", "--admin", &admin],
        "",
    )
    .await;
    let text = String::from_utf8_lossy(&got.stdout);
    assert!(text.contains("grey"), "{got:?}");

    // A changed spec is waited for too.
    let changed = TAG_ROUTE.replace("10.0.0.7", "10.0.0.8");
    let applied = cli(&["apply", "-f", "-", "--wait", "--admin", &admin], &changed).await;
    assert!(applied.status.success(), "{applied:?}");
    let (_, body) = http_get(
        server.admin_addr,
        "/api/v1/rules/tagroutes?namespace=default",
    )
    .await;
    assert!(body.contains("10.0.0.8"), "{body}");
    server.stop().await.unwrap();
}

/// What dubbo-cp appends to a mapping node someone wrote with spaces and empty items is written
/// back as readers should see it (dubbo-go splits without trimming).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_written_with_spaces_is_written_back_without_them() {
    let zk = ZooKeeper::start().await;
    let sdk = zk.client().await;
    common::zookeeper::put(
        &sdk,
        "/dubbo/mapping/org.demo.Spaced",
        b"java-app, go-app,,",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(zk_config(dir.path(), &zk)).await;
    wait_ready(server.admin_addr).await;
    let mut grpc = client(server.grpc_addr).await;
    let reply = grpc
        .register_service_app_mapping(request("default", "rust-app", &["org.demo.Spaced"]))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success, "{reply:?}");
    common::zookeeper::wait_node(
        &sdk,
        "/dubbo/mapping/org.demo.Spaced",
        Some("java-app,go-app,rust-app"),
    )
    .await;
    server.stop().await.unwrap();
}

/// `zookeeper.acl: read`: the nodes dubbo-cp creates are read by anyone and changed by its own
/// identity only; without the setting they stay open (SDKs append to mapping nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_acl_lets_sdks_read_our_nodes_but_not_change_them() {
    let zk = ZooKeeper::start().await;
    let sdk = zk.client().await;
    for (acl, interface) in [("read", "org.demo.Guarded"), ("open", "org.demo.Open")] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = zk_config(dir.path(), &zk);
        let auth = dir.path().join("zookeeper-auth");
        std::fs::write(&auth, "digest:dubbo-cp:s3cret\n").unwrap();
        config.zookeeper.auth = Some(auth);
        config.zookeeper.acl = acl.to_owned();
        let server = start(config).await;
        wait_ready(server.admin_addr).await;
        let mut grpc = client(server.grpc_addr).await;
        let reply = grpc
            .register_service_app_mapping(request("default", "shop", &[interface]))
            .await
            .unwrap()
            .into_inner();
        assert!(reply.success, "{reply:?}");
        let path = format!("/dubbo/mapping/{interface}");
        common::zookeeper::wait_node(&sdk, &path, Some("shop")).await;
        let written = sdk.set_data(&path, b"shop,sdk-app", None).await;
        match acl {
            "read" => assert!(
                matches!(written, Err(zookeeper_client::Error::NoAuth)),
                "{written:?}"
            ),
            _ => assert!(written.is_ok(), "{written:?}"),
        }
        server.stop().await.unwrap();
    }
}
