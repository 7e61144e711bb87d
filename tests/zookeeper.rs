//! ZooKeeper mode against a real ZooKeeper (Debian's package, started per test): mappings both
//! ways, byte for byte as Dubbo's metadata report keeps them; rules in the config center; bad
//! nodes reported and skipped; replicas and an SDK writer converging; the ensemble going away.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::zookeeper::{ZooKeeper, get, put, sdk_register};
use common::*;
use dubbo_cp::config::Config;
use tonic::Code;

/// ZooKeeper mode on `zk`, with a short debounce and shutdown.
fn zk_config(data_dir: &std::path::Path, zk: &ZooKeeper) -> Config {
    let mut config = test_config(data_dir);
    config.zookeeper.address = Some(zk.address());
    config.zookeeper.session_timeout = Duration::from_secs(4);
    config.debounce.after = Duration::from_millis(20);
    config.debounce.max = Duration::from_millis(200);
    config.shutdown_grace = Duration::from_secs(2);
    config
}

/// Waits (up to 20 s) until `check` holds of the admin port's mappings.
async fn wait_mappings(admin: std::net::SocketAddr, what: &str, check: impl Fn(&Mappings) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mappings = admin_mappings(admin).await;
        if check(&mappings) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never; mappings are {mappings:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 20 s) until the node at `path` holds `expected` (None: gone).
async fn wait_node(client: &zookeeper_client::Client, path: &str, expected: Option<&str>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let value = get(client, path).await;
        if value.as_deref() == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} holds {value:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn apps(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn key(namespace: &str, interface: &str) -> (String, String) {
    (namespace.to_owned(), interface.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_land_in_mapping_nodes_as_dubbo_writes_them() {
    let zk = ZooKeeper::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(zk_config(dir.path(), &zk)).await;
    wait_ready(server.admin_addr).await;
    let mut grpc = client(server.grpc_addr).await;
    let sdk = zk.client().await;

    let reply = grpc
        .register_service_app_mapping(request("default", "shop", &["org.demo.Greeter", "org.demo.Cart"]))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success, "{reply:?}");
    wait_node(&sdk, "/dubbo/mapping/org.demo.Greeter", Some("shop")).await;
    wait_node(&sdk, "/dubbo/mapping/org.demo.Cart", Some("shop")).await;
    // Appended in order, no spaces; an application whose name another contains is its own item.
    grpc.register_service_app_mapping(request("default", "sho", &["org.demo.Greeter"]))
        .await
        .unwrap();
    wait_node(&sdk, "/dubbo/mapping/org.demo.Greeter", Some("shop,sho")).await;
    // Registering again writes nothing.
    let writes = metric(server.admin_addr, "dubbo_cp_zookeeper_writes_total").await;
    let again = grpc
        .register_service_app_mapping(request("default", "shop", &["org.demo.Greeter"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.message, "already registered");
    assert_eq!(metric(server.admin_addr, "dubbo_cp_zookeeper_writes_total").await, writes);

    // Another namespace is another Dubbo group.
    grpc.register_service_app_mapping(request("shop", "cart", &["org.demo.Cart"]))
        .await
        .unwrap();
    wait_node(&sdk, "/shop/mapping/org.demo.Cart", Some("cart")).await;
    wait_mappings(server.admin_addr, "both namespaces", |m| {
        m.get(&key("default", "org.demo.Greeter")) == Some(&apps(&["shop", "sho"]))
            && m.get(&key("shop", "org.demo.Cart")) == Some(&apps(&["cart"]))
    })
    .await;

    // What has no node is refused before it is acknowledged, naming the field and the value.
    let refused = grpc
        .register_service_app_mapping(request("dubbo", "x", &["org.demo.Greeter"]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("namespace") && refused.message().contains("\"dubbo\""), "{}", refused.message());
    let refused = grpc
        .register_service_app_mapping(request("default", "x", &["org/demo"]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("interfaceNames"), "{}", refused.message());
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_sdks_write_is_served_and_bad_nodes_are_skipped() {
    let zk = ZooKeeper::start().await;
    let sdk = zk.client().await;
    // Written before dubbo-cp starts: the first list reads it.
    put(&sdk, "/dubbo/mapping/org.demo.Before", b"a, b,,a").await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(zk_config(dir.path(), &zk)).await;
    wait_ready(server.admin_addr).await;
    wait_mappings(server.admin_addr, "listed at start", |m| {
        m.get(&key("default", "org.demo.Before")) == Some(&apps(&["a", "b"]))
    })
    .await;

    // Written, edited, deleted by an SDK while dubbo-cp watches.
    assert!(sdk_register(&sdk, "org.demo.Greeter", "java-app").await);
    wait_mappings(server.admin_addr, "an SDK's write", |m| {
        m.get(&key("default", "org.demo.Greeter")) == Some(&apps(&["java-app"]))
    })
    .await;
    assert!(sdk_register(&sdk, "org.demo.Greeter", "go-app").await);
    wait_mappings(server.admin_addr, "an SDK's append", |m| {
        m.get(&key("default", "org.demo.Greeter")) == Some(&apps(&["java-app", "go-app"]))
    })
    .await;
    sdk.delete("/dubbo/mapping/org.demo.Greeter", None).await.unwrap();
    wait_mappings(server.admin_addr, "an SDK's delete", |m| {
        !m.contains_key(&key("default", "org.demo.Greeter"))
    })
    .await;

    // Garbage and an oversized value are reported and skipped; the rest keeps flowing.
    put(&sdk, "/dubbo/mapping/org.demo.Garbage", &[0xff, 0xfe, 0x00]).await;
    put(&sdk, "/dubbo/mapping/org.demo.Huge", &vec![b'a'; 300 * 1024]).await;
    put(&sdk, "/dubbo/config/dubbo/shop.tag-router", b"tags: [unclosed").await;
    put(&sdk, "/dubbo/org.demo.Greeter/providers/not-a-url", b"").await;
    assert!(sdk_register(&sdk, "org.demo.After", "after").await);
    wait_mappings(server.admin_addr, "a good node after bad ones", |m| {
        m.get(&key("default", "org.demo.After")) == Some(&apps(&["after"]))
    })
    .await;
    let (_, sources) = http_get(server.admin_addr, "/debug/sources").await;
    let sources: Vec<serde_json::Value> = serde_json::from_str(&sources).unwrap();
    let zk_row = sources
        .iter()
        .find(|row| row["kind"] == "ZooKeeper")
        .expect("a ZooKeeper row");
    assert_eq!(zk_row["state"], "connected", "{zk_row}");
    let unreadable = &zk_row["detail"]["unreadable"];
    for path in [
        "/dubbo/mapping/org.demo.Garbage",
        "/dubbo/mapping/org.demo.Huge",
        "/dubbo/config/dubbo/shop.tag-router",
        "/dubbo/org.demo.Greeter/providers/not-a-url",
    ] {
        assert!(unreadable.get(path).is_some(), "{path} not reported: {unreadable}");
    }
    // A garbage node is never overwritten: the registration is acknowledged, and parked.
    let mut grpc = client(server.grpc_addr).await;
    let reply = grpc
        .register_service_app_mapping(request("default", "app", &["org.demo.Garbage"]))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, outbox) = http_get(server.admin_addr, "/debug/outbox").await;
        if outbox.contains("org.demo.Garbage") && outbox.contains("not overwritten") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never parked: {outbox}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (data, _) = sdk.get_data("/dubbo/mapping/org.demo.Garbage").await.unwrap();
    assert_eq!(data, vec![0xff, 0xfe, 0x00]);
    server.stop().await.unwrap();
}
