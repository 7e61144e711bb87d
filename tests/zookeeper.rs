//! ZooKeeper mode against a real ZooKeeper (Debian's package, started per test): mappings both
//! ways, byte for byte as Dubbo's metadata report keeps them; rules in the config center; bad
//! nodes reported and skipped; replicas and an SDK writer converging; the ensemble going away.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::zookeeper::{ZooKeeper, get, put, sdk_register, wait_mappings, wait_node, zk_config};
use common::*;
use tonic::Code;

/// Registers over `grpc` and returns the answer (a refusal fails the test).
async fn registered(
    grpc: &mut dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient<tonic::transport::Channel>,
    namespace: &str,
    application: &str,
    interfaces: &[&str],
) -> dubbo_cp::pb::snp::ServiceMappingResponse {
    let reply = grpc
        .register_service_app_mapping(request(namespace, application, interfaces))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success, "{reply:?}");
    reply
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

    registered(
        &mut grpc,
        "default",
        "shop",
        &["org.demo.Greeter", "org.demo.Cart"],
    )
    .await;
    wait_node(&sdk, "/dubbo/mapping/org.demo.Greeter", Some("shop")).await;
    wait_node(&sdk, "/dubbo/mapping/org.demo.Cart", Some("shop")).await;
    // Appended in order, no spaces; an application whose name another contains is its own item.
    registered(&mut grpc, "default", "sho", &["org.demo.Greeter"]).await;
    wait_node(&sdk, "/dubbo/mapping/org.demo.Greeter", Some("shop,sho")).await;
    // Registering again writes nothing: the next write after it is the next new pair's alone.
    let writes = metric(server.admin_addr, "dubbo_cp_zookeeper_writes_total").await;
    let again = registered(&mut grpc, "default", "shop", &["org.demo.Greeter"]).await;
    assert_eq!(again.message, "already registered");
    registered(&mut grpc, "default", "next", &["org.demo.Next"]).await;
    wait_node(&sdk, "/dubbo/mapping/org.demo.Next", Some("next")).await;
    assert_eq!(
        metric(server.admin_addr, "dubbo_cp_zookeeper_writes_total").await,
        writes + 1.0
    );

    // Another namespace is another Dubbo group.
    registered(&mut grpc, "shop", "cart", &["org.demo.Cart"]).await;
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
    assert!(
        refused.message().contains("namespace") && refused.message().contains("\"dubbo\""),
        "{}",
        refused.message()
    );
    let refused = grpc
        .register_service_app_mapping(request("default", "x", &["org/demo"]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("interfaceNames"),
        "{}",
        refused.message()
    );
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
    sdk.delete("/dubbo/mapping/org.demo.Greeter", None)
        .await
        .unwrap();
    wait_mappings(server.admin_addr, "an SDK's delete", |m| {
        !m.contains_key(&key("default", "org.demo.Greeter"))
    })
    .await;

    // Garbage and an oversized value are reported and skipped; the rest keeps flowing.
    put(&sdk, "/dubbo/mapping/org.demo.Garbage", &[0xff, 0xfe, 0x00]).await;
    put(
        &sdk,
        "/dubbo/mapping/org.demo.Huge",
        &vec![b'a'; 300 * 1024],
    )
    .await;
    put(
        &sdk,
        "/dubbo/config/dubbo/shop.tag-router",
        b"tags: [unclosed",
    )
    .await;
    put(&sdk, "/dubbo/org.demo.Greeter/providers/not-a-url", b"").await;
    // A node another system keeps to itself (its ACL) is reported, and stops nothing.
    let owner = zookeeper_client::Client::connector()
        .with_auth("digest", b"owner:secret")
        .connect(&zk.address())
        .await
        .unwrap();
    owner
        .create(
            "/dubbo/mapping/org.demo.Secret",
            b"theirs",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::creator_all()),
        )
        .await
        .unwrap();
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
        assert!(
            unreadable.get(path).is_some(),
            "{path} not reported: {unreadable}"
        );
    }
    // `dubbo-cp status` and the dashboard show the same.
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["status", "--admin", &server.admin_addr.to_string()])
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(
        printed.contains("ZooKeeper") && printed.contains(&format!("connected: {}", zk.address())),
        "{printed}"
    );
    let admin = server.admin_addr;
    tokio::task::spawn_blocking(move || {
        let mut browser = common::browser::Browser::open(&format!("http://{admin}/ui"));
        browser.wait_for(
            r#"document.querySelector('#sources tr[data-source="ZooKeeper"][data-state="connected"]') !== null
               && document.querySelector('#sources tr[data-source="/dubbo/mapping/org.demo.Garbage"][data-state="unreadable"]') !== null"#,
        );
        let shot = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("zookeeper-dashboard.png");
        browser.screenshot(&shot);
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "ZooKeeper dashboard screenshot: {}", shot.display());
    })
    .await
    .unwrap();

    // A garbage node is never overwritten: the registration is acknowledged, and parked.
    let mut grpc = client(server.grpc_addr).await;
    registered(&mut grpc, "default", "app", &["org.demo.Garbage"]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, outbox) = http_get(server.admin_addr, "/debug/outbox").await;
        if outbox.contains("org.demo.Garbage") && outbox.contains("not overwritten") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never parked: {outbox}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (data, _) = sdk
        .get_data("/dubbo/mapping/org.demo.Garbage")
        .await
        .unwrap();
    assert_eq!(data, vec![0xff, 0xfe, 0x00]);
    server.stop().await.unwrap();
}

async fn run_cli(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(args)
        .output()
        .await
        .unwrap()
}

/// Waits (up to 20 s) until `GET /api/v1/rules/<kind>` satisfies `check`.
async fn wait_rules(
    admin: std::net::SocketAddr,
    kind: &str,
    check: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http_get(admin, &format!("/api/v1/rules/{kind}")).await;
        assert_eq!(status, 200, "{body}");
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if check(&items) {
            return items;
        }
        assert!(tokio::time::Instant::now() < deadline, "{kind}: {items:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const RULES: &str = "
apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata: {name: grey, namespace: default}
spec:
  key: shop
  configVersion: v3.0
  tags: [{name: gray, addresses: ['10.0.0.7:20880']}]
---
apiVersion: dubbo.apache.org/v1alpha1
kind: ConditionRoute
metadata: {name: no-hz, namespace: default}
spec:
  key: g1/org.demo.Greeter:1.0.0
  scope: service
  configVersion: v3.0
  force: true
  conditions: ['method=sayHello => region=hangzhou']
---
apiVersion: dubbo.apache.org/v1alpha1
kind: DynamicConfig
metadata: {name: weights, namespace: default}
spec:
  key: shop
  scope: application
  configVersion: v3.0
  configs: [{addresses: ['10.0.0.7:20880'], parameters: {weight: '50'}}]
---
apiVersion: dubbo.apache.org/v1alpha1
kind: ServiceEntry
metadata: {name: greeter, namespace: default}
spec:
  hosts: [greeter]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  endpoints: [{address: 10.0.0.1}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_are_written_where_the_sdks_read_them_and_read_back_from_anyone() {
    let zk = ZooKeeper::start().await;
    let sdk = zk.client().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(zk_config(dir.path(), &zk)).await;
    wait_ready(server.admin_addr).await;
    let admin = server.admin_addr.to_string();

    // A data-plane client on the discovery stream sees what the config center holds.
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(&type_of("TagRoute")).await;
    let empty = observer.next().await;
    assert_eq!(empty.data.len(), 0);
    observer.ack(&empty).await;

    // `dubbo-cp apply`: each object at its node, with the bytes the golden tests show.
    let manifest = dir.path().join("rules.yaml");
    std::fs::write(&manifest, RULES).unwrap();
    let path = manifest.to_str().unwrap();
    let applied = run_cli(&["apply", "--admin", &admin, "-f", path]).await;
    assert!(applied.status.success(), "{applied:?}");
    let stdout = String::from_utf8_lossy(&applied.stdout);
    assert_eq!(stdout.matches(" created").count(), 4, "{stdout}");
    for rule in dubbo_cp::rules::parse_manifests(RULES).unwrap() {
        let node = dubbo_cp::zookeeper::rules_writer::node_path(&rule).unwrap();
        let bytes =
            dubbo_cp::zookeeper::body::encode(&rule, dubbo_cp::zookeeper::body::Origin::Api)
                .unwrap();
        assert_eq!(
            get(&sdk, &node).await.as_deref(),
            Some(String::from_utf8(bytes).unwrap().as_str()),
            "{node}"
        );
    }
    assert!(
        get(&sdk, "/dubbo/config/dubbo/shop.tag-router")
            .await
            .is_some()
    );
    assert!(
        get(
            &sdk,
            "/dubbo/config/dubbo/org.demo.Greeter:1.0.0:g1.condition-router"
        )
        .await
        .is_some()
    );
    assert!(
        get(&sdk, "/dubbo/config/dubbo/shop.configurators")
            .await
            .is_some()
    );
    assert!(
        get(&sdk, "/dubbo-cp/default/serviceentries/greeter")
            .await
            .is_some()
    );
    let again = run_cli(&["apply", "--admin", &admin, "-f", path]).await;
    assert_eq!(
        String::from_utf8_lossy(&again.stdout)
            .matches(" unchanged")
            .count(),
        4
    );
    wait_rules(server.admin_addr, "TagRoute", |items| {
        items.len() == 1 && items[0]["metadata"]["name"] == "grey"
    })
    .await;
    wait_rules(server.admin_addr, "ServiceEntry", |items| items.len() == 1).await;
    let pushed = observer.next().await;
    assert_eq!(
        pushed.data.decode().unwrap().len(),
        1,
        "the TagRoute reached the stream"
    );
    assert!(pushed.revision > empty.revision);

    // A rule dubbo-admin wrote (no header, no configVersion) is read and served with a name
    // derived from its node, and left as it is.
    let admin_body = "conditions:\n- method=sayHello => region=hz\nenabled: true\nforce: false\n\
                      key: shop\npriority: 0\nruntime: true\nscope: application\n";
    put(
        &sdk,
        "/dubbo/config/dubbo/shop.condition-router",
        admin_body.as_bytes(),
    )
    .await;
    let items = wait_rules(server.admin_addr, "ConditionRoute", |items| {
        items.len() == 2
    })
    .await;
    let read = items
        .iter()
        .find(|item| item["metadata"]["name"] == "shop")
        .expect("the admin's rule, named after its key");
    assert_eq!(read["spec"]["configVersion"], "v2.7");
    assert_eq!(
        get(&sdk, "/dubbo/config/dubbo/shop.condition-router")
            .await
            .as_deref(),
        Some(admin_body)
    );

    // Two objects whose keys name one node: refused, naming both; nothing is overwritten.
    let clash = RULES
        .split("---")
        .next()
        .unwrap()
        .replace("name: grey", "name: other");
    let (status, body) = http_send(server.admin_addr, "POST", "/api/v1/apply", &clash, None).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("TagRoute default/grey") && body.contains("TagRoute default/other"),
        "{body}"
    );
    // A body dubbo-cp cannot read is never overwritten.
    put(&sdk, "/dubbo/config/dubbo/cart.tag-router", b": not yaml [").await;
    let onto_garbage = clash.replace("key: shop", "key: cart");
    let (status, body) = http_send(
        server.admin_addr,
        "POST",
        "/api/v1/apply",
        &onto_garbage,
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("cannot read"), "{body}");
    assert_eq!(
        get(&sdk, "/dubbo/config/dubbo/cart.tag-router")
            .await
            .as_deref(),
        Some(": not yaml [")
    );

    // A changed key moves the object: the old node goes in the same transaction.
    let moved = RULES
        .split("---")
        .next()
        .unwrap()
        .replace("key: shop", "key: shop-v2");
    let (status, body) = http_send(server.admin_addr, "POST", "/api/v1/apply", &moved, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("configured"), "{body}");
    assert_eq!(get(&sdk, "/dubbo/config/dubbo/shop.tag-router").await, None);
    assert!(
        get(&sdk, "/dubbo/config/dubbo/shop-v2.tag-router")
            .await
            .is_some()
    );
    wait_rules(server.admin_addr, "TagRoute", |items| {
        items.len() == 1 && items[0]["spec"]["key"] == "shop-v2"
    })
    .await;
    let (status, body) = http_send(
        server.admin_addr,
        "POST",
        "/api/v1/apply",
        RULES.split("---").next().unwrap(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        get(&sdk, "/dubbo/config/dubbo/shop-v2.tag-router").await,
        None
    );
    wait_rules(server.admin_addr, "TagRoute", |items| {
        items.len() == 1 && items[0]["spec"]["key"] == "shop"
    })
    .await;

    // An edit by hand flows in; `dubbo-cp delete` removes the node.
    let edited = get(&sdk, "/dubbo/config/dubbo/shop.tag-router")
        .await
        .unwrap()
        .replace("priority: 0", "priority: 7");
    put(
        &sdk,
        "/dubbo/config/dubbo/shop.tag-router",
        edited.as_bytes(),
    )
    .await;
    wait_rules(server.admin_addr, "TagRoute", |items| {
        items.len() == 1 && items[0]["spec"]["priority"] == 7
    })
    .await;
    let deleted = run_cli(&["delete", "--admin", &admin, "-f", path]).await;
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout)
            .matches(" deleted")
            .count(),
        4
    );
    assert_eq!(get(&sdk, "/dubbo/config/dubbo/shop.tag-router").await, None);
    assert_eq!(
        get(&sdk, "/dubbo-cp/default/serviceentries/greeter").await,
        None
    );
    wait_rules(server.admin_addr, "TagRoute", |items| items.is_empty()).await;
    // The admin's rule is deleted by its served name too.
    let (status, body) = http_send(
        server.admin_addr,
        "DELETE",
        "/api/v1/rules/ConditionRoute/default/shop",
        "",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        get(&sdk, "/dubbo/config/dubbo/shop.condition-router").await,
        None
    );
    server.stop().await.unwrap();
}

/// The applications a mapping node lists, split as dubbo-go splits them (no trim, no filter).
fn go_split(value: &str) -> Vec<String> {
    value.split(',').map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_and_an_sdk_writer_converge_on_the_union() {
    const INTERFACES: usize = 12;
    const APPS: usize = 8;
    let zk = ZooKeeper::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start(zk_config(dir_a.path(), &zk)).await;
    let b = start(zk_config(dir_b.path(), &zk)).await;
    wait_ready(a.admin_addr).await;
    wait_ready(b.admin_addr).await;
    let interfaces: Vec<String> = (0..INTERFACES).map(|i| format!("org.demo.S{i}")).collect();

    // Everyone at once: each replica's callers, and an SDK doing its own CAS.
    let mut writers = tokio::task::JoinSet::new();
    for (replica, prefix) in [(a.grpc_addr, "a"), (b.grpc_addr, "b")] {
        for app in 0..APPS {
            let interfaces = interfaces.clone();
            writers.spawn(async move {
                let mut grpc = client(replica).await;
                let names: Vec<&str> = interfaces.iter().map(String::as_str).collect();

                registered(&mut grpc, "default", &format!("{prefix}{app}"), &names).await;
            });
        }
    }
    for app in 0..APPS {
        let interfaces = interfaces.clone();
        let sdk = zk.client().await;
        writers.spawn(async move {
            for interface in &interfaces {
                assert!(sdk_register(&sdk, interface, &format!("s{app}")).await);
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }

    let expected: BTreeSet<String> = ["a", "b", "s"]
        .iter()
        .flat_map(|prefix| (0..APPS).map(move |app| format!("{prefix}{app}")))
        .collect();
    let sdk = zk.client().await;
    for interface in &interfaces {
        let path = format!("/dubbo/mapping/{interface}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let value = loop {
            let value = get(&sdk, &path).await.unwrap_or_default();
            let listed: BTreeSet<String> = go_split(&value).into_iter().collect();
            if listed == expected {
                break value;
            }
            assert!(tokio::time::Instant::now() < deadline, "{path}: {value}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // No duplicates, no empty items, no spaces: dubbo-go's split gives exactly the union.
        assert_eq!(go_split(&value).len(), expected.len(), "{path}: {value}");
    }
    for replica in [&a, &b] {
        wait_mappings(replica.admin_addr, "the union on every replica", |m| {
            interfaces
                .iter()
                .all(|i| m.get(&key("default", i)) == Some(&expected))
        })
        .await;
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_ensemble_down_registrations_are_acknowledged_and_written_when_it_returns() {
    let mut zk = ZooKeeper::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(zk_config(dir.path(), &zk)).await;
    wait_ready(server.admin_addr).await;
    let mut grpc = client(server.grpc_addr).await;
    registered(&mut grpc, "default", "before", &["org.demo.Greeter"]).await;
    wait_mappings(server.admin_addr, "written", |m| {
        m.get(&key("default", "org.demo.Greeter")) == Some(&apps(&["before"]))
    })
    .await;

    zk.stop();
    // Acknowledged from the outbox.
    registered(
        &mut grpc,
        "default",
        "during",
        &["org.demo.Greeter", "org.demo.Cart"],
    )
    .await;
    // Readiness says what is wrong, and the last state is still served.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http_get(server.admin_addr, "/readyz").await;
        if body.contains("ZooKeeper") {
            // Still ready: the last state is served, registrations are held.
            assert_eq!(status, 200, "{body}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        admin_mappings(server.admin_addr)
            .await
            .get(&key("default", "org.demo.Greeter")),
        Some(&apps(&["before"]))
    );
    assert!(metric(server.admin_addr, "dubbo_cp_outbox_pending_pairs").await >= 2.0);

    zk.resume_serving().await;
    let sdk = zk.client().await;
    wait_node(
        &sdk,
        "/dubbo/mapping/org.demo.Greeter",
        Some("before,during"),
    )
    .await;
    wait_node(&sdk, "/dubbo/mapping/org.demo.Cart", Some("during")).await;
    wait_mappings(server.admin_addr, "converged", |m| {
        m.get(&key("default", "org.demo.Greeter")) == Some(&apps(&["before", "during"]))
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while metric(server.admin_addr, "dubbo_cp_outbox_pending_pairs").await != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the outbox never drained"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await.unwrap();
}

fn signal(process: &Process, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &process.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_replica_loses_no_acknowledged_registration() {
    let mut zk = ZooKeeper::start().await;
    let dir = tempfile::tempdir().unwrap();
    let address = zk.address();
    let args = ["--zookeeper", address.as_str(), "--shutdown-grace", "2s"];
    let mut replica = spawn_binary(dir.path(), &args);
    wait_ready(replica.admin_addr).await;
    // With the ensemble away, acknowledged pairs exist only in the replica's outbox.
    zk.stop();
    let mut grpc = client(replica.grpc_addr).await;
    registered(&mut grpc, "default", "kept", &["org.demo.Greeter"]).await;
    signal(&replica, "-KILL");
    let _ = replica.child.wait();

    zk.resume_serving().await;
    replica = spawn_binary(dir.path(), &args);
    let sdk = zk.client().await;
    wait_node(&sdk, "/dubbo/mapping/org.demo.Greeter", Some("kept")).await;
    drop(replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_replaced_and_everything_read_again() {
    let zk = ZooKeeper::start().await;
    let dir = tempfile::tempdir().unwrap();
    let address = zk.address();
    let replica = spawn_binary(
        dir.path(),
        &["--zookeeper", &address, "--zookeeper-session-timeout", "1s"],
    );
    wait_ready(replica.admin_addr).await;
    assert_eq!(
        metric(replica.admin_addr, "dubbo_cp_zookeeper_sessions_total").await,
        1.0
    );
    // Frozen past its session's timeout, the replica's session expires; what is written
    // meanwhile is read by the next session's re-list.
    signal(&replica, "-STOP");
    let sdk = zk.client().await;
    assert!(sdk_register(&sdk, "org.demo.While", "java-app").await);
    // The server drops an expired session's watches: wait for that (the replica held the only
    // one, its persistent recursive watch).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !zk.four_letters("wchs").contains("Total watches:0") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            zk.four_letters("wchs")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal(&replica, "-CONT");
    wait_mappings(replica.admin_addr, "read by the new session", |m| {
        m.get(&key("default", "org.demo.While")) == Some(&apps(&["java-app"]))
    })
    .await;
    assert!(metric(replica.admin_addr, "dubbo_cp_zookeeper_sessions_total").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_directory_is_written_to_the_config_center_and_reloaded() {
    let zk = ZooKeeper::start().await;
    let sdk = zk.client().await;
    let dir = tempfile::tempdir().unwrap();
    let rules_dir = dir.path().join("rules");
    std::fs::create_dir(&rules_dir).unwrap();
    let tag_route = RULES.split("---").next().unwrap().to_owned();
    std::fs::write(rules_dir.join("grey.yaml"), &tag_route).unwrap();
    let mut config = zk_config(&dir.path().join("data"), &zk);
    config.rules.dir = Some(rules_dir.clone());
    let server = start(config).await;
    wait_ready(server.admin_addr).await;

    // Written with the directory's mark, served like any rule.
    let node = "/dubbo/config/dubbo/shop.tag-router";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if get(&sdk, node).await.is_some_and(|body| {
            body.starts_with("# dubbo-cp: TagRoute default/grey from rules-dir\n")
        }) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            get(&sdk, node).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_rules(server.admin_addr, "TagRoute", |items| items.len() == 1).await;

    // A rule applied through the API is not the directory's: a reload leaves it.
    let condition = RULES.split("---").nth(1).unwrap();
    let (status, body) =
        http_send(server.admin_addr, "POST", "/api/v1/apply", condition, None).await;
    assert_eq!(status, 200, "{body}");
    wait_rules(server.admin_addr, "ConditionRoute", |items| {
        items.len() == 1
    })
    .await;

    // The file goes: its object goes, the applied one stays.
    std::fs::remove_file(rules_dir.join("grey.yaml")).unwrap();
    wait_node(&sdk, node, None).await;
    wait_rules(server.admin_addr, "TagRoute", |items| items.is_empty()).await;
    assert!(
        get(
            &sdk,
            "/dubbo/config/dubbo/org.demo.Greeter:1.0.0:g1.condition-router"
        )
        .await
        .is_some()
    );
    server.stop().await.unwrap();
}
