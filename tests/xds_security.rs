//! Zero trust for proxyless gRPC, with released gRPC on both ends and real traffic: certificates
//! from our CA kept on disk by `dubbo-cp agent`, an xDS-enabled grpcio server (gRFC A36) that
//! takes its mTLS and RBAC from AuthenticationPolicy and AuthorizationPolicy, and grpcio clients
//! that get mTLS to it with no configuration of their own (auto mTLS). Policy edits change the
//! outcome of live traffic with no restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;
mod security;

use std::net::SocketAddr;
use std::time::Instant;

use common::{http_send, start, test_config};
use released::Released;
use security::{ADMIN, Workload, apply, client, count, free_port, greeter_entry, server};

const TOKENS: &str = "tokens:
  - {token: admin-token, namespace: ops, identity: ops-admin}
  - {token: shop-token, namespace: shop, serviceAccount: greeter}
  - {token: a-token, namespace: a, serviceAccount: client}
  - {token: b-token, namespace: b, serviceAccount: client}
";
const TARGET: &str = "xds:///greeter.shop:7070";
const GET: &str = "/org.example.Greeter/SayHello";
const DELETE: &str = "/org.example.Greeter/Delete";
const A: &str = "spiffe://cluster.local/ns/a/sa/client";

/// The control plane with the test's tokens, its certificates valid for `validity`.
async fn control_plane(
    dir: &std::path::Path,
    validity: Option<std::time::Duration>,
) -> dubbo_cp::server::RunningServer {
    let tokens = dir.join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut config = test_config(&dir.join("data"));
    config.auth.token_file = Some(tokens);
    config.auth.admins = vec!["ops-admin".into()];
    if let Some(validity) = validity {
        config.ca.cert_validity = validity;
    }
    start(config).await
}

const STRICT: &str = "apiVersion: dubbo.apache.org/v1alpha1
kind: AuthenticationPolicy
metadata: {name: strict, namespace: shop}
spec: {action: STRICT}
";

fn allow_from(namespace: &str) -> String {
    format!(
        "apiVersion: dubbo.apache.org/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: callers, namespace: shop}}
spec:
  action: ALLOW
  rules: [{{from: {{namespaces: [{namespace}]}}}}]
"
    )
}

const DENY_DELETE: &str = "apiVersion: dubbo.apache.org/v1alpha1
kind: AuthorizationPolicy
metadata: {name: no-delete, namespace: shop}
spec:
  action: DENY
  rules: [{when: {key: method, values: [{value: Delete}]}}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_servers_enforce_mtls_and_rbac_from_policies_on_live_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control_plane(dir.path(), None).await;
    let (admin, grpc, tls) = (cp.admin_addr, cp.grpc_addr, cp.tls_addr.unwrap());
    let port = free_port();
    apply(admin, &greeter_entry(port)).await;

    let root = dir.path().join("workloads");
    let shop = Workload::start(&root, "shop", "shop", "shop-token", grpc, &[]).await;
    let a = Workload::start(&root, "a", "a", "a-token", grpc, &[]).await;
    let b = Workload::start(&root, "b", "b", "b-token", grpc, &[]).await;

    let started = Instant::now();
    let mut greeter_server = server(
        Released::Grpcio,
        "greeter",
        port,
        shop.bootstrap(tls, "greeter-0.shop", "1s"),
        &[],
    )
    .await;
    let mut from_a = client(
        Released::Grpcio,
        TARGET,
        "xds",
        a.bootstrap(tls, "client-a", "1s"),
    );
    let mut from_b = client(
        Released::Grpcio,
        TARGET,
        "xds",
        b.bootstrap(tls, "client-b", "1s"),
    );
    let mut plain = client(
        Released::Grpcio,
        TARGET,
        "plain",
        a.bootstrap(tls, "plain-a", "1s"),
    );

    // No policy: plaintext, everyone in. The server serves once its listener arrives.
    from_a.settle("OK", 5, GET).await;
    println!(
        "measured: an xDS-enabled grpcio server answered its first call {} ms after start() returned",
        started.elapsed().as_millis()
    );
    let calls = from_a.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");
    assert_eq!(
        calls["peers"][""], 20,
        "plaintext: no peer identity: {calls}"
    );
    plain.settle("OK", 5, GET).await;

    // STRICT: the server requires client certificates; xDS-credential clients get mTLS from
    // their clusters with no configuration, a client without xDS credentials cannot connect.
    apply(admin, STRICT).await;
    plain.settle("UNAVAILABLE", 5, GET).await;
    from_a.settle("OK", 20, GET).await;
    let calls = from_a.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");
    assert_eq!(
        calls["peers"][A], 20,
        "the server saw the caller's SPIFFE ID: {calls}"
    );
    from_b.settle("OK", 5, GET).await;

    // RBAC: only namespace a.
    apply(admin, &allow_from("a")).await;
    from_b.settle("PERMISSION_DENIED", 5, GET).await;
    let calls = from_a.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");

    // A DENY on one method denies that method only.
    apply(admin, DENY_DELETE).await;
    from_a.settle("PERMISSION_DENIED", 5, DELETE).await;
    let calls = from_a.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");

    // An edit flips live traffic, the server untouched.
    apply(admin, &allow_from("b")).await;
    from_a.settle("PERMISSION_DENIED", 5, GET).await;
    from_b.settle("OK", 5, GET).await;
    let calls = from_b.call(20, DELETE).await;
    assert_eq!(count(&calls, "PERMISSION_DENIED"), 20, "{calls}");

    // Operators see which server runs mTLS and what it enforces.
    let (status, body) = http_send(admin, "GET", "/debug/xds", "", Some(ADMIN)).await;
    assert_eq!(status, 200);
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let servers: Vec<serde_json::Value> = view["clients"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["servers"].as_array().cloned().unwrap_or_default())
        .collect();
    let greeter = servers
        .iter()
        .find(|s| s["address"] == format!("127.0.0.1:{port}"))
        .unwrap_or_else(|| panic!("no server listener in /debug/xds: {body}"));
    assert_eq!(greeter["tls"], "STRICT", "{greeter}");
    assert_eq!(greeter["tlsPolicy"], "shop/strict", "{greeter}");
    assert_eq!(
        greeter["allow"],
        serde_json::json!(["shop/callers"]),
        "{greeter}"
    );
    assert_eq!(
        greeter["deny"],
        serde_json::json!(["shop/no-delete"]),
        "{greeter}"
    );
    assert_eq!(greeter["service"], "shop/greeter", "{greeter}");
    assert_eq!(greeter["notEnforced"], serde_json::json!([]), "{greeter}");
    // What the server (grpcio, xDS-enabled) and its mTLS client were sent renders as a config
    // dump: the listener's DownstreamTlsContext and both RBAC filters, the client's cluster with
    // its UpstreamTlsContext.
    for (node, expected) in [
        (
            "greeter-0.shop",
            "envoy.extensions.filters.http.rbac.v3.RBAC",
        ),
        ("greeter-0.shop", "DownstreamTlsContext"),
        ("client-b", "UpstreamTlsContext"),
    ] {
        let path = format!("/debug/xds/config_dump?node={node}");
        let (status, body) = http_send(admin, "GET", &path, "", Some(ADMIN)).await;
        assert_eq!(status, 200, "{node}: {body}");
        // A dump that cannot be rendered is listed with an `error` instead.
        assert!(!body.contains("\"error\""), "{node}: {body}");
        assert!(body.contains(expected), "{node}: no {expected} in {body}");
    }
    let path = "/debug/xds/config_dump?node=greeter-0.shop";
    let (_, body) = http_send(admin, "GET", path, "", Some(ADMIN)).await;
    // Both filters; ALLOW is the enum's default, which protobuf JSON leaves out.
    for expected in [
        "\"envoy.filters.http.rbac\"",
        "\"envoy.filters.http.rbac.DENY\"",
        "\"action\":\"DENY\"",
    ] {
        assert!(body.contains(expected), "no {expected} in {body}");
    }
    // `dubbo-cp get` counts the servers enforcing each policy (no discovery-stream client here).
    for (kind, policy) in [
        ("authenticationpolicies", "shop/strict"),
        ("authorizationpolicies", "shop/callers"),
        ("authorizationpolicies", "shop/no-delete"),
    ] {
        let path = format!("/api/v1/rules/{kind}?audience=true");
        let (status, body) = http_send(admin, "GET", &path, "", Some(ADMIN)).await;
        assert_eq!(status, 200, "{body}");
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(list["audiences"][policy]["xdsServers"], 1, "{body}");
        assert_eq!(list["subscribers"], 0, "{body}");
    }
    // The same through the CLI: enforced, so neither a warning nor a note.
    for kind in ["authenticationpolicies", "authorizationpolicies"] {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .args(["get", kind, "-n", "shop", "--token", ADMIN])
            .arg("--admin")
            .arg(admin.to_string())
            .output()
            .await
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert!(output.status.success(), "{stderr}");
        assert!(stdout.contains("XDS SERVERS"), "{stdout}");
        assert!(
            !stderr.contains("warning") && !stderr.contains("note"),
            "{stderr}"
        );
    }
    assert_eq!(
        common::metric(admin, "dubbo_cp_xds_servers_mtls").await,
        1.0
    );
    assert_eq!(
        common::metric(admin, "dubbo_cp_xds_servers_rbac").await,
        1.0
    );
    assert!(
        greeter_server.0.child.try_wait().unwrap().is_none(),
        "the same server process served every policy"
    );
    cp.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_renew_under_live_mtls_traffic_with_no_call_failing() {
    let dir = tempfile::tempdir().unwrap();
    // Renewed every 5 s (half-life), so the run below spans several renewals on both ends.
    let cp = control_plane(dir.path(), Some(std::time::Duration::from_secs(10))).await;
    let (admin, grpc, tls) = (cp.admin_addr, cp.grpc_addr, cp.tls_addr.unwrap());
    let port = free_port();
    apply(admin, &greeter_entry(port)).await;
    apply(admin, STRICT).await;
    let root = dir.path().join("workloads");
    let shop = Workload::start(&root, "shop", "shop", "shop-token", grpc, &[]).await;
    let a = Workload::start(&root, "a", "a", "a-token", grpc, &[]).await;
    let _server = server(
        Released::Grpcio,
        "greeter",
        port,
        shop.bootstrap(tls, "greeter-0.shop", "1s"),
        &[],
    )
    .await;
    let mut from_a = client(
        Released::Grpcio,
        TARGET,
        "xds",
        a.bootstrap(tls, "client-a", "1s"),
    );
    from_a.settle("OK", 5, GET).await;
    let (server_before, client_before) = (shop.certificate(), a.certificate());
    // 2,000 calls over at least 12 s.
    let calls = from_a.call_paced(2000, GET, 6).await;
    assert_eq!(
        count(&calls, "OK"),
        2000,
        "no call failed while certificates renewed: {calls}"
    );
    assert_eq!(calls["peers"][A], 2000, "{calls}");
    assert_ne!(
        shop.certificate(),
        server_before,
        "the server's certificate was renewed"
    );
    assert_ne!(
        a.certificate(),
        client_before,
        "the client's certificate was renewed"
    );
    // The first certificates have expired by now: a new connection handshakes with the
    // renewed ones on both ends.
    let mut fresh = client(
        Released::Grpcio,
        TARGET,
        "xds",
        a.bootstrap(tls, "client-a2", "1s"),
    );
    let calls = fresh.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");
    cp.stop().await.unwrap();
}

/// The agent's xDS proxy on a free port, forwarding to the TLS port `tls`.
fn proxied(tls: SocketAddr) -> (SocketAddr, Vec<String>) {
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let args = vec![
        "--xds-proxy".to_owned(),
        listen.to_string(),
        "--xds-address".to_owned(),
        format!("localhost:{}", tls.port()),
    ];
    (listen, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_js_servers_and_clients_enforce_the_same_through_the_agents_xds_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let cp = control_plane(dir.path(), None).await;
    let (admin, grpc, tls) = (cp.admin_addr, cp.grpc_addr, cp.tls_addr.unwrap());
    let port = free_port();
    apply(admin, &greeter_entry(port)).await;
    apply(admin, STRICT).await;
    apply(admin, &allow_from("a")).await;
    apply(admin, DENY_DELETE).await;

    // grpc-js reads only `insecure` control-plane credentials: each reaches the control plane
    // through its agent, which forwards the stream with the workload's certificate.
    let root = dir.path().join("workloads");
    let (shop_xds, shop_args) = proxied(tls);
    let (a_xds, a_args) = proxied(tls);
    let (b_xds, b_args) = proxied(tls);
    let shop = Workload::start(&root, "shop", "shop", "shop-token", grpc, &shop_args).await;
    let a = Workload::start(&root, "a", "a", "a-token", grpc, &a_args).await;
    let b = Workload::start(&root, "b", "b", "b-token", grpc, &b_args).await;
    let rbac = [("GRPC_XDS_EXPERIMENTAL_RBAC", "true".to_owned())];
    let _server = server(
        Released::GrpcJs,
        "greeter-js",
        port,
        shop.plain_bootstrap(shop_xds, "greeter-js.shop", "1s"),
        &rbac,
    )
    .await;
    let mut js_a = client(
        Released::GrpcJs,
        TARGET,
        "xds",
        a.plain_bootstrap(a_xds, "js-a", "1s"),
    );
    let mut js_b = client(
        Released::GrpcJs,
        TARGET,
        "xds",
        b.plain_bootstrap(b_xds, "js-b", "1s"),
    );
    let mut js_plain = client(
        Released::GrpcJs,
        TARGET,
        "plain",
        a.plain_bootstrap(a_xds, "js-plain", "1s"),
    );
    // And a grpcio client of the grpc-js server, on the TLS port with its own certificate.
    let mut py_a = client(
        Released::Grpcio,
        TARGET,
        "xds",
        a.bootstrap(tls, "py-a", "1s"),
    );

    js_a.settle("OK", 5, GET).await;
    let calls = js_a.call(20, GET).await;
    assert_eq!(count(&calls, "OK"), 20, "{calls}");
    assert_eq!(
        calls["peers"][A], 20,
        "the grpc-js server saw the caller's SPIFFE ID: {calls}"
    );
    let calls = js_a.call(10, DELETE).await;
    assert_eq!(count(&calls, "PERMISSION_DENIED"), 10, "{calls}");
    js_b.settle("PERMISSION_DENIED", 5, GET).await;
    js_plain.settle("UNAVAILABLE", 5, GET).await;
    py_a.settle("OK", 5, GET).await;
    let calls = py_a.call(20, GET).await;
    assert_eq!(calls["peers"][A], 20, "{calls}");

    // An edit flips live traffic on the grpc-js server too.
    apply(admin, &allow_from("b")).await;
    js_a.settle("PERMISSION_DENIED", 5, GET).await;
    js_b.settle("OK", 5, GET).await;
    cp.stop().await.unwrap();
}
