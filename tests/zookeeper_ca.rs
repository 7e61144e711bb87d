//! Replicas of one fleet on a real ZooKeeper share one certificate authority: the first replica
//! creates the root and its key in the ensemble under an ACL only dubbo-cp's `zookeeper.auth`
//! identity passes, the others use it, a rotation on one reaches the other's agents, and
//! released grpcio servers and clients whose agents were served by different replicas talk over
//! STRICT mTLS. A client of a foreign root is refused; a replica with a root of its own is loud.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;
mod security;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::zookeeper::ZooKeeper;
use common::{http_get, http_send, start, test_config};
use released::Released;
use security::{ADMIN, Workload, apply, client, count, free_port, greeter_entry, server};
use serde_json::Value;

const TOKENS: &str = "tokens:
  - {token: admin-token, namespace: ops, identity: ops-admin}
  - {token: shop-token, namespace: shop, serviceAccount: greeter}
  - {token: a-token, namespace: a, serviceAccount: client}
";
const TARGET: &str = "xds:///greeter.shop:7070";
const GET: &str = "/org.example.Greeter/SayHello";
const CREDENTIALS: &str = "dubbo-cp:s3cret";
const ROOTS_NODE: &str = "/dubbo-cp/.ca/roots";
/// The released Python SDK's environment, which carries kazoo (tests/zookeeper_providers.rs).
const DUBBO_PYTHON: &str = "apache-dubbo[zookeeper]==3.0.0b1";

/// The greeter on `port`, STRICT for namespace shop.
fn strict_greeter(port: u16) -> String {
    format!(
        "{}---
apiVersion: dubbo.apache.org/v1alpha1
kind: AuthenticationPolicy
metadata: {{name: strict, namespace: shop}}
spec: {{action: STRICT}}
",
        greeter_entry(port)
    )
}

/// A replica's configuration: the test's tokens, and ZooKeeper mode on `zk` when given, with
/// the shared identity when `auth`.
fn replica(dir: &Path, zk: Option<&ZooKeeper>, auth: bool) -> dubbo_cp::config::Config {
    std::fs::create_dir_all(dir).unwrap();
    let tokens = dir.join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut config = test_config(&dir.join("data"));
    config.auth.token_file = Some(tokens);
    config.auth.admins = vec!["ops-admin".into()];
    config.debounce.after = Duration::from_millis(20);
    config.debounce.max = Duration::from_millis(200);
    // Agents renew at half of it, and take the bundle of the replica that serves them then.
    config.ca.cert_validity = Duration::from_secs(10);
    if let Some(zk) = zk {
        config.zookeeper.address = Some(zk.address());
        config.zookeeper.session_timeout = Duration::from_secs(4);
        if auth {
            let file = dir.join("zookeeper-auth");
            std::fs::write(&file, format!("digest:{CREDENTIALS}\n")).unwrap();
            config.zookeeper.auth = Some(file);
        }
    }
    config
}

/// The fingerprints a replica trusts, the active one first.
async fn roots(admin: SocketAddr) -> Vec<String> {
    let (status, body) = http_send(admin, "GET", "/api/v1/ca", "", Some(ADMIN)).await;
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    view["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["fingerprint"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits (up to 30 s) until `check` holds.
async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What kazoo (the Python ZooKeeper client Dubbo's Python SDK uses) gets reading the roots'
/// node, with `auth` as its digest credentials or none.
fn kazoo_reads(zk: &ZooKeeper, auth: Option<&str>) -> String {
    let python = released::venv("apache-dubbo-3.0.0b1", DUBBO_PYTHON, "import dubbo, kazoo");
    let script = "import sys
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
auth = [('digest', sys.argv[2])] if len(sys.argv) > 2 else None
zk = KazooClient(hosts=sys.argv[1], auth_data=auth)
zk.start(timeout=20)
try:
    data, _ = zk.get('/dubbo-cp/.ca/roots')
    print('READ' if b'keyPem' in data else 'EMPTY')
except NoAuthError:
    print('NoAuthError')
zk.stop()
";
    let mut command = std::process::Command::new(python);
    command.args(["-c", script, &zk.address()]);
    if let Some(auth) = auth {
        command.arg(auth);
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `dubbo-cp status --compare` of two replicas: whether it succeeded, and what it printed.
async fn compare(a: SocketAddr, b: SocketAddr) -> (bool, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["status", "--token", ADMIN, "--compare"])
        .args([a.to_string(), b.to_string()])
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_ensemble_share_one_ca_and_a_foreign_root_is_refused() {
    let zk = ZooKeeper::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = start(replica(&dir.path().join("a"), Some(&zk), true)).await;
    let b = start(replica(&dir.path().join("b"), Some(&zk), true)).await;
    common::wait_ready(a.admin_addr).await;
    common::wait_ready(b.admin_addr).await;

    // One root, created by the first replica, used by the other.
    let first = roots(a.admin_addr).await;
    assert_eq!(first.len(), 1);
    assert_eq!(roots(b.admin_addr).await, first);
    // The key's node: nobody without dubbo-cp's identity reads it.
    assert_eq!(kazoo_reads(&zk, None), "NoAuthError");
    assert_eq!(kazoo_reads(&zk, Some("someone:else")), "NoAuthError");
    assert_eq!(kazoo_reads(&zk, Some(CREDENTIALS)), "READ");
    let anonymous = zk.client().await;
    assert!(matches!(
        anonymous.get_data(ROOTS_NODE).await,
        Err(zookeeper_client::Error::NoAuth)
    ));
    // Nor may it replace them: the directory refuses a delete or a create but dubbo-cp's.
    assert!(matches!(
        anonymous.delete(ROOTS_NODE, None).await,
        Err(zookeeper_client::Error::NoAuth)
    ));
    let open =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    assert!(matches!(
        anonymous.create("/dubbo-cp/.ca/other", b"x", &open).await,
        Err(zookeeper_client::Error::NoAuth)
    ));

    // Released grpcio on both ends, their agents served by different replicas, STRICT mTLS.
    let port = free_port();
    apply(a.admin_addr, &strict_greeter(port)).await;
    let root = dir.path().join("workloads");
    let shop = Workload::start(&root, "shop", "shop", "shop-token", a.grpc_addr, &[]).await;
    let on_b = Workload::start(&root, "a", "a", "a-token", b.grpc_addr, &[]).await;
    let _greeter = server(
        Released::Grpcio,
        "greeter",
        port,
        shop.bootstrap(a.tls_addr.unwrap(), "greeter-0.shop", "1s"),
        &[],
    )
    .await;
    let mut across = client(
        Released::Grpcio,
        TARGET,
        "xds",
        on_b.bootstrap(b.tls_addr.unwrap(), "client-a", "1s"),
    );
    across.settle("OK", 5, GET).await;
    let calls = across.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");
    assert_eq!(
        calls["peers"]["spiffe://cluster.local/ns/a/sa/client"], 20,
        "{calls}"
    );
    let (agree, text) = compare(a.admin_addr, b.admin_addr).await;
    assert!(agree, "{text}");
    assert!(
        text.contains("CA roots") && text.contains("ServiceEntry"),
        "{text}"
    );

    // A workload whose certificates come from another CA (a control plane of its own, told the
    // same services) is refused by the fleet's server.
    let other = start(replica(&dir.path().join("other"), None, false)).await;
    common::wait_ready(other.admin_addr).await;
    apply(other.admin_addr, &strict_greeter(port)).await;
    let foreign = Workload::start(&root, "f", "a", "a-token", other.grpc_addr, &[]).await;
    let mut refused = client(
        Released::Grpcio,
        TARGET,
        "xds",
        foreign.bootstrap(other.tls_addr.unwrap(), "client-f", "1s"),
    );
    refused.settle("UNAVAILABLE", 5, GET).await;

    // A rotation on A reaches B, and the agents B serves (at their next renewal).
    let (status, body) =
        http_send(a.admin_addr, "POST", "/api/v1/ca/rotate", "", Some(ADMIN)).await;
    assert_eq!(status, 200, "{body}");
    let rotated = roots(a.admin_addr).await;
    assert_eq!(rotated.len(), 2, "{rotated:?}");
    assert_eq!(rotated[1], first[0]);
    // B issues from the new root (the old one may already be dropped: certificates live 10 s).
    wait_until("B issues from A's new root", async || {
        roots(b.admin_addr).await.first() == rotated.first()
    })
    .await;
    let (_, body) = http_send(a.admin_addr, "GET", "/api/v1/ca", "", Some(ADMIN)).await;
    let view: Value = serde_json::from_str(&body).unwrap();
    // Compared without line ends (the API's PEM has CRLF, the agent's files LF).
    let bare = |pem: &str| pem.split_whitespace().collect::<String>();
    let new_root = bare(view["trustPems"][0].as_str().unwrap());
    let trust = on_b.dir.join("root-cert.pem");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let held = std::fs::read_to_string(&trust).unwrap_or_default();
        if bare(&held).contains(&new_root) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "B's agent never trusted the new root:\n{new_root}\nit holds:\n{held}\nB: {:?}",
            roots(b.admin_addr).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls = across.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");

    // A replica with an operator's root of its own on the same ensemble is loud, on itself and
    // on its peers, and `status --compare` fails.
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.path().join("own.pem"), dir.path().join("own.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let mut config = replica(&dir.path().join("d"), Some(&zk), false);
    config.ca.cert_file = Some(cert_file);
    config.ca.key_file = Some(key_file);
    let d = start(config).await;
    common::wait_ready(d.admin_addr).await;
    for (replica, name) in [(d.admin_addr, "D"), (a.admin_addr, "A")] {
        wait_until(
            &format!("{name}'s /readyz names the foreign root"),
            async || {
                http_get(replica, "/readyz")
                    .await
                    .1
                    .contains("CA: the replicas on the ensemble do not trust each other's CA roots")
            },
        )
        .await;
    }
    let (_, sources) = http_send(d.admin_addr, "GET", "/debug/sources", "", Some(ADMIN)).await;
    assert!(sources.contains("\"disagreeing\""), "{sources}");
    let (agree, text) = compare(a.admin_addr, d.admin_addr).await;
    assert!(!agree, "{text}");
    assert!(text.contains("CA roots") && text.contains("NO"), "{text}");
    // Once it is gone, the fleet agrees again.
    d.stop().await.unwrap();
    wait_until("A's /readyz is quiet again", async || {
        !http_get(a.admin_addr, "/readyz").await.1.contains("CA:")
    })
    .await;

    other.stop().await.unwrap();
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
