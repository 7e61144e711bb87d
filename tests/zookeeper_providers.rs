//! Providers registered in ZooKeeper by a released Dubbo SDK (PyPI `apache-dubbo`, Triple, an
//! ephemeral node per provider) reach a released gRPC client (grpcio over `xds:///`) through
//! dubbo-cp in ZooKeeper mode, by interface name; DynamicConfig weights apply to them; a provider
//! whose session ends leaves the endpoints.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::zookeeper::ZooKeeper;
use common::*;
use released::{Released, answers, assert_split, count, settle};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The released Python SDK under test, with its ZooKeeper registry (kazoo).
const DUBBO_PYTHON: &str = "apache-dubbo[zookeeper]==3.0.0b1";
const SERVICE: &str = "dubbo.test.Echo";

/// A virtual environment with the SDK, made once per target directory by the test itself.
fn dubbo_python() -> PathBuf {
    released::venv("apache-dubbo-3.0.0b1", DUBBO_PYTHON, "import dubbo, kazoo")
}

/// One provider process of the SDK answering `name`; its port once it is registered.
async fn provider(zk: &ZooKeeper, name: &str) -> (tokio::process::Child, u16) {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/zookeeper/dubbo_provider.py");
    let mut child = tokio::process::Command::new(dubbo_python())
        .arg(script)
        .args([&zk.address(), SERVICE, name, "ignored-by-the-sdk"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the provider started within a minute")
        .unwrap()
        .expect("a port");
    (child, line.trim().parse().unwrap())
}

/// Waits (up to 30 s) until client `node`'s acknowledged load assignment has these endpoint
/// weights.
async fn wait_weights(admin: std::net::SocketAddr, node: &str, wanted: &[u64]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = http_get(admin, &format!("/debug/xds/config_dump?node={node}")).await;
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let acked_weights = dump["config"][0]["generic_xds_configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                c["type_url"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("ClusterLoadAssignment"))
                    && c["client_status"] == "ACKED"
            })
            .map(|c| {
                let mut weights: Vec<u64> = c["xds_config"]["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|l| l["load_balancing_weight"].as_u64())
                    .collect();
                weights.sort();
                weights
            })
            .any(|weights| weights == wanted);
        if acked_weights {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "weights {wanted:?} never acknowledged: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_sdks_providers_are_called_by_interface_over_xds() {
    let zk = ZooKeeper::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.zookeeper.address = Some(zk.address());
    config.debounce.after = Duration::from_millis(20);
    config.debounce.max = Duration::from_millis(200);
    let server = start(config).await;
    wait_ready(server.admin_addr).await;
    let (mut a, port_a) = provider(&zk, "a").await;
    let (_b, _) = provider(&zk, "b").await;

    // dubbo-python writes no mapping node; its providers' URLs name the interface.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !admin_mappings(server.admin_addr)
        .await
        .contains_key(&("default".to_owned(), SERVICE.to_owned()))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the providers' interface never mapped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A released gRPC client calls the interface by name and reaches both providers. (grpcio
    // only: with the SDK's Python server, a grpcio channel stalled once a grpc-js channel had
    // also called the same providers, while new channels still got answers; grpc-js is proven
    // against registry endpoints below, in front of grpcio servers.)
    let xds = server.xds_addr.expect("xDS is on by default").to_string();
    let mut client = released::client_with(
        Released::Grpcio,
        &format!("xds:///{SERVICE}"),
        bootstrap(&xds, "default", "zk-client"),
    );
    settle(&mut client, "a", 1, "").await;
    settle(&mut client, "b", 1, "").await;

    // DynamicConfig weights apply to registry endpoints as to any: a 400, b the default 100.
    let weights = weight_of(port_a, 400);
    let (status, body) =
        http_send(server.admin_addr, "POST", "/api/v1/apply", &weights, None).await;
    assert_eq!(status, 200, "{body}");
    // Counted once the client acknowledged the weighted endpoints (and settled: it applies a
    // version a moment after its ACK).
    wait_weights(server.admin_addr, "zk-client", &[100, 400]).await;
    settle(&mut client, "a", 1, "").await;
    assert_split(&count(&mut client, 2000).await, 80);

    // A provider whose process dies leaves the endpoints when its session ends (the SDK's
    // ephemeral node goes); every call then reaches b.
    a.kill().await.unwrap();
    settle(&mut client, "b", 50, "").await;
    let counts = count(&mut client, 500).await;
    assert_eq!(answers(&counts, "b"), 500, "{counts}");
    server.stop().await.unwrap();
}

/// A DynamicConfig giving the provider on `port` the weight `weight`.
fn weight_of(port: u16, weight: u32) -> String {
    format!(
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: DynamicConfig\n\
         metadata: {{name: weights, namespace: default}}\nspec:\n  key: {SERVICE}\n  \
         scope: application\n  configVersion: v3.0\n  \
         configs: [{{addresses: ['127.0.0.1:{port}'], parameters: {{weight: '{weight}'}}}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_replica_fails_no_call_of_clients_that_reconnect_to_another() {
    let zk = ZooKeeper::start().await;
    let (_a, _) = provider(&zk, "a").await;
    let (_b, port_b) = provider(&zk, "b").await;
    // Two replicas behind one address, as behind a Service: the second takes the port once
    // the first is gone.
    let xds = format!("127.0.0.1:{}", common::kube_local::free_port());
    let address = zk.address();
    let args = ["--zookeeper", address.as_str(), "--xds-addr", xds.as_str()];
    let (dir_1, dir_2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut first = spawn_binary(dir_1.path(), &args);
    wait_ready(first.admin_addr).await;
    let mut client = released::client_with(
        Released::Grpcio,
        &format!("xds:///{SERVICE}"),
        bootstrap(&xds, "default", "zk-client"),
    );
    settle(&mut client, "a", 1, "").await;
    settle(&mut client, "b", 1, "").await;

    // 3,000 calls; once 300 are done the replica serving the client is SIGKILLed and another
    // starts on its address.
    use tokio::io::AsyncWriteExt;
    client
        .stdin
        .write_all(b"count 3000 running\n")
        .await
        .unwrap();
    assert_eq!(client.line().await, "running");
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = spawn_binary(dir_2.path(), &args);
    let counts: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(
        answers(&counts, "a") + answers(&counts, "b"),
        3000,
        "every call answered: {counts}"
    );

    // The client now follows the second replica: its weights reach the client.
    wait_ready(second.admin_addr).await;
    let weights = weight_of(port_b, 0);
    let (status, body) =
        http_send(second.admin_addr, "POST", "/api/v1/apply", &weights, None).await;
    assert_eq!(status, 200, "{body}");
    // A weight of 0 takes no calls: the endpoint is left out.
    wait_weights(second.admin_addr, "zk-client", &[100]).await;
    settle(&mut client, "a", 20, "").await;
    let counts = count(&mut client, 200).await;
    assert_eq!(answers(&counts, "a"), 200, "{counts}");
}

/// An application-level instance as Dubbo Java 3's `ZookeeperServiceDiscovery` registers it
/// (Curator's `ServiceInstance` JSON, its protocols in `dubbo.endpoints`). Dubbo Java cannot run
/// here, so the node is written as it writes it; the backend behind it is a released gRPC server.
fn java_instance(application: &str, port: u16) -> String {
    let endpoints = format!(r#"[{{"port":{port},"protocol":"tri"}}]"#);
    serde_json::json!({
        "name": application,
        "id": format!("127.0.0.1:{port}"),
        "address": "127.0.0.1",
        "port": 20880,
        "sslPort": null,
        "payload": {
            "@class": "org.apache.dubbo.registry.zookeeper.ZookeeperInstance",
            "id": format!("127.0.0.1:{port}"),
            "name": application,
            "metadata": {
                "dubbo.endpoints": endpoints,
                "dubbo.metadata.revision": "4f3a9c0b6c1f",
                "dubbo.metadata.storage-type": "local",
            },
        },
        "registrationTimeUTC": 1_764_000_000_000_u64,
        "serviceType": "DYNAMIC",
        "uriSpec": null,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_level_instances_are_called_through_the_mapping() {
    let zk = ZooKeeper::start().await;
    let sdk = zk.client().await;
    let (_a, port_a) = released::backend(Released::Grpcio, "a").await;
    let (_b, port_b) = released::backend(Released::Grpcio, "b").await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.zookeeper.address = Some(zk.address());
    let server = start(config).await;
    wait_ready(server.admin_addr).await;
    // What a Java provider of application `shop` writes: its mapping and its instances.
    common::zookeeper::put(&sdk, "/dubbo/mapping/org.demo.Echo", b"shop").await;
    for port in [port_a, port_b] {
        common::zookeeper::put(
            &sdk,
            &format!("/services/shop/127.0.0.1:{port}"),
            java_instance("shop", port).as_bytes(),
        )
        .await;
    }
    // Both released xDS clients, grpcio and @grpc/grpc-js-xds, reach both instances.
    let xds = server.xds_addr.expect("xDS is on by default").to_string();
    let mut clients = Vec::new();
    for (kind, node) in [
        (Released::Grpcio, "py-client"),
        (Released::GrpcJs, "js-client"),
    ] {
        let mut client = released::client_with(
            kind,
            "xds:///org.demo.Echo",
            bootstrap(&xds, "default", node),
        );
        settle(&mut client, "a", 1, "").await;
        settle(&mut client, "b", 1, "").await;
        clients.push(client);
    }
    // An instance that goes (its session ended) leaves.
    sdk.delete(&format!("/services/shop/127.0.0.1:{port_b}"), None)
        .await
        .unwrap();
    for client in &mut clients {
        settle(client, "a", 50, "").await;
        let counts = count(client, 200).await;
        assert_eq!(answers(&counts, "a"), 200, "{counts}");
    }
    server.stop().await.unwrap();
}
