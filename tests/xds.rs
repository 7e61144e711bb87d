//! The xDS port of the real server: a ServiceEntry applied like any rule and a registration
//! made over gRPC reach a released gRPC client (grpcio) calling a Dubbo interface by name, with
//! real traffic between loopback backends; operators see the client in `dubbo-cp status`,
//! `/debug/xds` and `/metrics`; an endpoint removed mid-traffic and a control-plane restart
//! fail no call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use std::net::SocketAddr;

use common::xds::{apply, cli_bootstrap, greeter_entry, greeter_entry_of};
use common::{http_get, http_send, start, test_config};
use released::{Released, answers, assert_split, backend, count, settle};
use tokio::io::AsyncWriteExt;

const NODE_ID: &str = "xds-binary-test";

async fn bootstrap(xds: SocketAddr) -> String {
    let server = xds.to_string();
    cli_bootstrap(&["--xds-server", &server, "-n", "shop", "--node-id", NODE_ID]).await
}

/// Deletes the rule at `/api/v1/rules/<path>` (`<Kind>/<namespace>/<name>`).
async fn delete_rule(admin: SocketAddr, path: &str) {
    let (status, body) =
        http_send(admin, "DELETE", &format!("/api/v1/rules/{path}"), "", None).await;
    assert_eq!(status, 200, "{body}");
}

/// Starts `n` calls the client counts while the test goes on; their counts are its next line.
async fn count_in_background(client: &mut released::Proc, n: usize) {
    client
        .stdin
        .write_all(format!("count {n} running\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(client.line().await, "running");
}

async fn xds_clients(admin: SocketAddr) -> serde_json::Value {
    let (status, body) = http_get(admin, "/debug/xds").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registered_interface_reaches_a_released_client_through_the_xds_port() {
    let kind = Released::Grpcio;
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let xds = server.xds_addr.expect("xDS is on by default");
    apply(
        server.admin_addr,
        &greeter_entry(&[(port_a, 80), (port_b, 20)]),
    )
    .await;
    // A provider of application greeter registers its interface, as every Dubbo SDK does.
    common::client(server.grpc_addr)
        .await
        .register_service_app_mapping(common::request("shop", "greeter", &["org.example.Greeter"]))
        .await
        .unwrap();
    common::wait_published(&server, 1).await;

    // The interface name resolves through the mapping to greeter's endpoints, 80/20. Settled
    // first: the client may have asked before the mapping's version was built.
    let mut client =
        released::client_with(kind, "xds:///org.example.Greeter", bootstrap(xds).await);
    settle(&mut client, "a", 1, "").await;
    assert_split(&count(&mut client, 2000).await, 80);

    // Operators see it: /debug/xds, `dubbo-cp status`, /metrics.
    let listed = xds_clients(server.admin_addr).await;
    let node = &listed["clients"][0];
    assert_eq!(node["node_id"], NODE_ID, "{listed}");
    assert_eq!(node["namespace"], "shop", "{listed}");
    let listener = node["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type"] == "listener")
        .unwrap();
    assert_eq!(listener["acked"], listener["sent"], "{listed}");
    assert!(listener["nack"].is_null(), "{listed}");
    // What it was served, as a config dump: each resource expanded, acknowledged.
    let (code, body) = http_get(
        server.admin_addr,
        &format!("/debug/xds/config_dump?node={NODE_ID}"),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    let configs = dump["config"][0]["generic_xds_configs"].as_array().unwrap();
    let served = |short: &str| {
        configs
            .iter()
            .find(|c| c["type_url"].as_str().unwrap().ends_with(short))
            .unwrap_or_else(|| panic!("no {short} in {dump:#}"))
    };
    let listener = served("Listener");
    assert_eq!(listener["name"], "org.example.Greeter", "{dump:#}");
    for short in [
        "Listener",
        "RouteConfiguration",
        "Cluster",
        "ClusterLoadAssignment",
    ] {
        assert_eq!(served(short)["client_status"], "ACKED", "{dump:#}");
    }
    let mut weights: Vec<u64> = served("ClusterLoadAssignment")["xds_config"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["load_balancing_weight"].as_u64().unwrap())
        .collect();
    weights.sort();
    assert_eq!(weights, [20, 80], "{dump:#}");
    let (_, other) = http_get(server.admin_addr, "/debug/xds/config_dump?node=nobody").await;
    assert!(other.contains(r#""config":[]"#), "{other}");

    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["status", "--admin", &server.admin_addr.to_string()])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(NODE_ID) && l.contains("shop") && l.contains("listener")),
        "{stdout}"
    );
    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    for line in [
        "dubbo_cp_xds_clients 1",
        "dubbo_cp_xds_pushes_total{type=\"listener\"}",
        "dubbo_cp_xds_push_delay_seconds_count",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // a leaves while 3,000 calls run (pushed once 300 are done): none fails, and the calls
    // after it reach b alone.
    count_in_background(&mut client, 3000).await;
    apply(server.admin_addr, &greeter_entry(&[(port_b, 20)])).await;
    let during: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(
        answers(&during, "a") + answers(&during, "b"),
        3000,
        "no call failed while a left: {during}"
    );
    settle(&mut client, "b", 100, "").await;
    let counts = count(&mut client, 500).await;
    assert_eq!(answers(&counts, "b"), 500, "{counts}");

    // A restart of the control plane on the same port: calls keep flowing on the last
    // configuration, and the client is back on the new process afterwards.
    count_in_background(&mut client, 2000).await;
    server.stop().await.unwrap();
    let mut config = test_config(dir.path());
    config.xds.addr = xds;
    let server = start(config).await;
    let during: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(
        answers(&during, "b"),
        2000,
        "no call failed across the restart: {during}"
    );
    let clients = server.xds_clients.clone().unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        clients.wait_for(|list| {
            list.iter()
                .any(|c| c.node_id == NODE_ID && c.types.values().any(|t| t.acked.is_some()))
        }),
    )
    .await
    .expect("the client reconnected to the new process");
    let counts = count(&mut client, 200).await;
    assert_eq!(answers(&counts, "b"), 200, "{counts}");
    drop(client.child.start_kill());
    server.stop().await.unwrap();
}

#[tokio::test]
async fn xds_on_a_non_loopback_address_needs_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.xds.addr = "0.0.0.0:0".parse().unwrap();
    let refused = dubbo_cp::server::start(config).await.err().unwrap();
    let message = format!("{refused:#}");
    assert!(
        message.contains("xds.addr") && message.contains("--insecure-allow-unauthenticated"),
        "{message}"
    );
    // Turned off, it binds nothing and the server starts.
    let mut config = test_config(dir.path());
    config.xds.enabled = false;
    config.xds.addr = "0.0.0.0:0".parse().unwrap();
    let server = start(config).await;
    assert_eq!(server.xds_addr, None);
    let listed = xds_clients(server.admin_addr).await;
    assert_eq!(listed["enabled"], false, "{listed}");
    server.stop().await.unwrap();
}

/// A key and a CSR for it (the CA names the certificate by the SPIFFE ID it is asked for).
fn csr() -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    (pem, key.serialize_pem())
}

/// A token gRPC can read as a JWT (it reads the expiry; the signature is the server's business):
/// static tokens are compared whole, so any well-formed one will do.
fn jwt_shaped_token() -> String {
    use base64::Engine as _;
    let part = |json: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
    };
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 7200;
    format!(
        "{}.{}.c2ln",
        part(serde_json::json!({"alg": "RS256", "typ": "JWT"})),
        part(serde_json::json!({"sub": "greeter-client", "exp": exp}))
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_bootstrap_credentials_reach_the_tls_port_with_a_certificate_or_a_token() {
    let kind = Released::Grpcio;
    let (_a, port_a) = backend(kind, "a").await;
    let dir = tempfile::tempdir().unwrap();
    let token = jwt_shaped_token();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        format!(
            "tokens:\n  - token: {token}\n    namespace: shop\n    identity: shop/greeter-client\n  \
             - token: ops\n    namespace: ops\n    identity: ops/admin\n"
        ),
    )
    .unwrap();
    let mut config = test_config(&dir.path().join("data"));
    config.auth.token_file = Some(tokens);
    config.auth.admins = vec!["ops/admin".into()];
    let server = start(config).await;
    let admin = server.admin_addr;
    let tls = server.tls_addr.expect("the CA serves the TLS port");
    let (status, body) = http_send(
        admin,
        "POST",
        "/api/v1/apply",
        &greeter_entry(&[(port_a, 100)]),
        Some("ops"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut sdk = common::client(server.grpc_addr).await;
    let mut register =
        tonic::Request::new(common::request("shop", "greeter", &["org.example.Greeter"]));
    register
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    sdk.register_service_app_mapping(register).await.unwrap();
    common::wait_published(&server, 1).await;

    // A workload certificate from our CA, as the CA API issues it.
    let (csr, key) = csr();
    let spiffe = "spiffe://cluster.local/ns/shop/sa/greeter-client";
    let issue = serde_json::json!({"csr": csr, "spiffeId": spiffe}).to_string();
    let (status, body) = http_send(admin, "POST", "/api/v1/ca/issue", &issue, Some("ops")).await;
    assert_eq!(status, 200, "{body}");
    let issued: serde_json::Value = serde_json::from_str(&body).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let roots: Vec<String> = serde_json::from_value(issued["trustCerts"].clone()).unwrap();
    let ca_file = write("roots.pem", &roots.concat());
    let cert_file = write("client.pem", issued["certPem"].as_str().unwrap());
    let key_file = write("client.key", &key);
    let token_file = write("token.jwt", &token);
    let server_uri = format!("localhost:{}", tls.port());

    // mTLS (gRFC A65's TLS channel credentials): our root verifies the port's certificate
    // (issued by the same CA for "localhost"), our certificate is the identity. The node says
    // no namespace: the certificate's is the client's.
    let by_certificate = serde_json::json!({
        "xds_servers": [{
            "server_uri": server_uri,
            "channel_creds": [{"type": "tls", "config": {
                "ca_certificate_file": ca_file,
                "certificate_file": cert_file,
                "private_key_file": key_file,
            }}],
            "server_features": ["xds_v3"],
        }],
        "node": {"id": "tls-client", "locality": {}},
    })
    .to_string();
    // A bearer token from a file (gRFC A97's call credentials), as `dubbo-cp bootstrap`
    // writes it and the webhook injects it with a projected service-account token.
    let by_token = cli_bootstrap(&[
        "--xds-server",
        &server_uri,
        "-n",
        "shop",
        "--node-id",
        "token-client",
        "--ca-file",
        &ca_file,
        "--token-file",
        &token_file,
    ])
    .await;
    let mut clients = vec![
        released::client_with(kind, "xds:///org.example.Greeter", by_certificate),
        released::client_with_env(
            kind,
            "xds:///org.example.Greeter",
            &[
                ("GRPC_XDS_BOOTSTRAP_CONFIG", by_token),
                (dubbo_cp::xds::bootstrap::CALL_CREDS_ENV, "true".into()),
            ],
        ),
    ];
    for client in &mut clients {
        settle(client, "a", 1, "").await;
        let counts = count(client, 200).await;
        assert_eq!(answers(&counts, "a"), 200, "{counts}");
    }
    let (status, body) = http_send(admin, "GET", "/debug/xds", "", Some("ops")).await;
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    for node in ["tls-client", "token-client"] {
        let client = listed["clients"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["node_id"] == node)
            .unwrap_or_else(|| panic!("{node} in {listed}"));
        assert_eq!(client["namespace"], "shop", "{listed}");
    }
    for client in &mut clients {
        drop(client.child.start_kill());
    }
    server.stop().await.unwrap();
}

/// A ServiceEntry in `namespace` named `name` whose hosts are a DNS name and a short name, on
/// port 50051, with one endpoint on `port`.
fn payments_entry(namespace: &str, name: &str, hosts: &[&str], port: u16) -> String {
    serde_json::json!({
        "apiVersion": "dubbo.apache.org/v1alpha1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "hosts": hosts,
            "ports": [{"number": 50051, "name": "grpc", "protocol": "GRPC"}],
            "endpoints": [{"address": "127.0.0.1", "ports": {"grpc": port}}],
        },
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_entrys_dns_name_is_served_verbatim_to_released_clients_in_any_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let xds = server.xds_addr.expect("xDS is on by default");
    // A wildcard host is refused with the field, the value and why.
    let wildcard = payments_entry("billing", "all", &["*.payments.internal"], 1);
    let (status, body) =
        http_send(server.admin_addr, "POST", "/api/v1/apply", &wildcard, None).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("spec.hosts[0]")
            && body.contains("*.payments.internal")
            && body.contains("wildcard"),
        "{body}"
    );
    for kind in [Released::Grpcio, Released::GrpcJs] {
        let (_a, port_a) = backend(kind, "a").await;
        let (_b, port_b) = backend(kind, "b").await;
        let hosts = ["api.payments.internal", "payments"];
        // The same DNS name in two namespaces: the oldest entry is served (billing's, although
        // shop's comes first by name), the other waits its turn.
        apply(
            server.admin_addr,
            &payments_entry("billing", "zz-payments", &hosts, port_a),
        )
        .await;
        apply(
            server.admin_addr,
            &payments_entry("shop", "payments", &hosts, port_b),
        )
        .await;
        // A client in namespace shop asks for the DNS name as written, not in a Kubernetes form.
        let mut client = released::client_with(
            kind,
            "xds:///api.payments.internal:50051",
            bootstrap(xds).await,
        );
        let counts = count(&mut client, 200).await;
        assert_eq!(answers(&counts, "a"), 200, "{kind:?}: {counts}");
        // The short name stays one service per namespace: shop's own.
        let mut short = released::client_with(kind, "xds:///payments:50051", bootstrap(xds).await);
        let counts = count(&mut short, 200).await;
        assert_eq!(answers(&counts, "b"), 200, "{kind:?}: {counts}");
        // The oldest entry gone, the other one serves the name, and no call fails on the way.
        count_in_background(&mut client, 2000).await;
        delete_rule(server.admin_addr, "ServiceEntry/billing/zz-payments").await;
        let during: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
        assert_eq!(
            answers(&during, "a") + answers(&during, "b"),
            2000,
            "{kind:?}: no call failed as the name moved: {during}"
        );
        settle(&mut client, "b", 100, "").await;
        delete_rule(server.admin_addr, "ServiceEntry/shop/payments").await;
        drop(client.child.start_kill());
        drop(short.child.start_kill());
    }
    server.stop().await.unwrap();
}

/// A DynamicConfig `name` in `shop` of `scope` keyed `key` with `configs`.
fn dynamic_config(name: &str, scope: &str, key: &str, configs: serde_json::Value) -> String {
    serde_json::json!({
        "apiVersion": "dubbo.apache.org/v1alpha1",
        "kind": "DynamicConfig",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"key": key, "scope": scope, "configVersion": "v3.0", "configs": configs},
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn overrides_select_endpoints_by_match_and_reach_an_interfaces_applications() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let xds = server.xds_addr.expect("xDS is on by default");
    common::client(server.grpc_addr)
        .await
        .register_service_app_mapping(common::request("shop", "greeter", &["org.example.Greeter"]))
        .await
        .unwrap();
    common::wait_published(&server, 1).await;
    for kind in [Released::Grpcio, Released::GrpcJs] {
        let (_a, port_a) = backend(kind, "a").await;
        let (_b, port_b) = backend(kind, "b").await;
        let endpoint = |port: u16, version: &str| serde_json::json!({"address": "127.0.0.1", "ports": {"grpc": port}, "labels": {"version": version}});
        let entry = greeter_entry_of(vec![endpoint(port_a, "v1"), endpoint(port_b, "v2")]);
        apply(server.admin_addr, &entry).await;
        // The application's override selects its v1 endpoint by label: no call reaches a.
        let version =
            |v: &str| serde_json::json!({"param": [{"key": "version", "value": {"exact": v}}]});
        apply(
            server.admin_addr,
            &dynamic_config(
                "v1-off",
                "application",
                "greeter",
                serde_json::json!([{"match": version("v1"), "parameters": {"disabled": "true"}}]),
            ),
        )
        .await;
        let mut client =
            released::client_with(kind, "xds:///org.example.Greeter", bootstrap(xds).await);
        settle(&mut client, "b", 100, "").await;
        let counts = count(&mut client, 500).await;
        assert_eq!(answers(&counts, "b"), 500, "{kind:?}: {counts}");
        // The interface's own override reaches the application its mapping lists, after the
        // application's: v2 at 25 against v1's 100 once v1 is back, 80/20.
        apply(
            server.admin_addr,
            &dynamic_config(
                "v2-light",
                "service",
                "org.example.Greeter",
                serde_json::json!([{"match": version("v2"), "parameters": {"weight": "25"}}]),
            ),
        )
        .await;
        delete_rule(server.admin_addr, "DynamicConfig/shop/v1-off").await;
        settle(&mut client, "a", 1, "").await;
        assert_split(&count(&mut client, 2000).await, 80);
        delete_rule(server.admin_addr, "DynamicConfig/shop/v2-light").await;
        drop(client.child.start_kill());
    }
    server.stop().await.unwrap();
}
