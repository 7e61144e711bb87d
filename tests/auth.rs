//! Who may register and observe, and the bounds every caller meets.
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Observer, SNP_TYPE, channel, client, http_get, request, start, test_config};
use dubbo_cp::config::Config;
use dubbo_cp::pb::snp::{ServiceMappingRequest, ServiceMappingResponse};
use tonic::Code;

const TOKENS: &str = "tokens:
  - token: demo-token
    namespace: demo
    identity: demo/provider
  - token: ops-token
    namespace: ops
    identity: ops/admin
";

fn auth_config(dir: &Path, tokens: &str) -> Config {
    let file = dir.join("tokens.yaml");
    assert!(std::fs::write(&file, tokens).is_ok());
    let mut config = test_config(&dir.join("data"));
    config.auth.token_file = Some(file);
    config.auth.admins = vec!["ops/admin".into()];
    config.auth.reload_interval = Duration::from_millis(50);
    config
}

async fn register_as(
    addr: std::net::SocketAddr,
    token: Option<&str>,
    namespace: &str,
    app: &str,
) -> Result<ServiceMappingResponse, tonic::Status> {
    let mut call: tonic::Request<ServiceMappingRequest> =
        tonic::Request::new(request(namespace, app, &["I"]));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().unwrap();
        call.metadata_mut().insert("authorization", value);
    }
    client(addr)
        .await
        .register_service_app_mapping(call)
        .await
        .map(|r| r.into_inner())
}

fn code<T>(result: Result<T, tonic::Status>) -> Option<Code> {
    result.err().map(|status| status.code())
}

#[tokio::test]
async fn tokens_are_checked_and_callers_stay_in_their_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(auth_config(dir.path(), TOKENS)).await;
    let addr = server.grpc_addr;

    let ok = register_as(addr, Some("demo-token"), "demo", "app").await;
    assert!(ok.map(|r| r.success).unwrap_or(false));
    assert_eq!(
        code(register_as(addr, None, "demo", "app").await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(register_as(addr, Some("wrong"), "demo", "app").await),
        Some(Code::Unauthenticated)
    );
    let denied = register_as(addr, Some("demo-token"), "other", "app").await;
    let denied = denied.expect_err("cross-namespace registration accepted");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(
        denied.message().starts_with("namespace: "),
        "{}",
        denied.message()
    );
    // The admin identity may register anywhere.
    assert!(
        register_as(addr, Some("ops-token"), "other", "app")
            .await
            .is_ok()
    );

    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_registrations_total{result=\"unauthenticated\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_registrations_total{result=\"denied\"} 1"),
        "{metrics}"
    );
    let stored = common::admin_mappings_as(server.admin_addr, Some("ops-token")).await;
    assert_eq!(
        stored.len(),
        2,
        "a refused registration was stored: {stored:?}"
    );
    // The read-only views and the dashboard's data need an admin too; the page itself holds
    // no data.
    for path in [
        "/debug/mappings",
        "/debug/clients",
        "/debug/digest",
        "/debug/applications",
    ] {
        let (status, _) = http_get(server.admin_addr, path).await;
        assert_eq!(status, 401, "{path}");
        let (status, _) =
            common::http_send(server.admin_addr, "GET", path, "", Some("demo-token")).await;
        assert_eq!(status, 403, "{path}");
    }
    assert_eq!(http_get(server.admin_addr, "/ui").await.0, 200);
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn legacy_answers_are_ok_with_success_false() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = auth_config(dir.path(), TOKENS);
    config.auth.legacy_answers = true;
    let server = start(config).await;
    let missing = register_as(server.grpc_addr, None, "demo", "app")
        .await
        .unwrap();
    assert!(!missing.success);
    assert!(
        missing.message.contains("authorization"),
        "{}",
        missing.message
    );
    let denied = register_as(server.grpc_addr, Some("demo-token"), "other", "app")
        .await
        .unwrap();
    assert!(!denied.success);
    // Bad input is still INVALID_ARGUMENT: that is not an authorization answer.
    assert_eq!(
        code(register_as(server.grpc_addr, Some("demo-token"), "Demo", "app").await),
        Some(Code::InvalidArgument)
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn the_token_file_is_reloaded_and_a_broken_one_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(auth_config(dir.path(), TOKENS)).await;
    let file = dir.path().join("tokens.yaml");
    assert_eq!(
        code(register_as(server.grpc_addr, Some("new-token"), "demo", "a").await),
        Some(Code::Unauthenticated)
    );

    // Modification times can be coarse: wait so the rewrite is seen as a change.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let added = format!("{TOKENS}  - token: new-token\n    namespace: demo\n");
    assert!(std::fs::write(&file, added).is_ok());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while register_as(server.grpc_addr, Some("new-token"), "demo", "a")
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "new token never accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(std::fs::write(&file, "tokens: [not valid").is_ok());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        register_as(server.grpc_addr, Some("new-token"), "demo", "b")
            .await
            .is_ok(),
        "tokens lost on a bad reload"
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn observe_requires_a_token_when_authentication_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(auth_config(dir.path(), TOKENS)).await;
    let refused = Observer::connect_as(channel(server.grpc_addr).await, None)
        .await
        .err();
    assert_eq!(refused.map(|s| s.code()), Some(Code::Unauthenticated));
    let wrong = Observer::connect_as(channel(server.grpc_addr).await, Some("wrong"))
        .await
        .err();
    assert_eq!(wrong.map(|s| s.code()), Some(Code::Unauthenticated));
    let mut observer = Observer::connect_as(channel(server.grpc_addr).await, Some("demo-token"))
        .await
        .unwrap();
    observer.subscribe(SNP_TYPE).await;
    assert_eq!(observer.next().await.nonce, "1");
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn with_authentication_a_non_loopback_address_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = auth_config(dir.path(), TOKENS);
    config.grpc_addr = ([0, 0, 0, 0], 0).into();
    let server = start(config).await;
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], server.grpc_addr.port()));
    assert!(
        register_as(local, Some("demo-token"), "demo", "app")
            .await
            .is_ok()
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn each_bound_is_a_clear_status_and_a_metric() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = auth_config(dir.path(), TOKENS);
    config.ingest.rate_per_caller = 0.001;
    config.ingest.burst_per_caller = 2;
    config.dds.max_streams = 1;
    let server = start(config).await;
    let addr = server.grpc_addr;

    // Per-identity registration rate: the third call in a burst of two is refused; another
    // identity is not affected.
    for app in ["a", "b"] {
        assert!(
            register_as(addr, Some("demo-token"), "demo", app)
                .await
                .is_ok()
        );
    }
    let limited = register_as(addr, Some("demo-token"), "demo", "c")
        .await
        .err();
    let limited = limited.expect("rate limit not applied");
    assert_eq!(limited.code(), Code::ResourceExhausted);
    assert!(
        limited.message().contains("demo/provider"),
        "{}",
        limited.message()
    );
    assert!(
        register_as(addr, Some("ops-token"), "demo", "d")
            .await
            .is_ok()
    );

    // Concurrent streams.
    let mut first = Observer::connect_as(channel(addr).await, Some("demo-token"))
        .await
        .unwrap();
    first.subscribe(SNP_TYPE).await;
    let _ = first.next().await;
    let second = Observer::connect_as(channel(addr).await, Some("demo-token"))
        .await
        .err();
    assert_eq!(second.map(|s| s.code()), Some(Code::ResourceExhausted));

    // Interfaces per request and message size.
    let many: Vec<String> = (0..1001).map(|i| format!("I{i}")).collect();
    let mut call = tonic::Request::new(ServiceMappingRequest {
        namespace: "demo".into(),
        application_name: "x".into(),
        interface_names: many,
    });
    call.metadata_mut()
        .insert("authorization", "Bearer ops-token".parse().unwrap());
    assert_eq!(
        code(client(addr).await.register_service_app_mapping(call).await),
        Some(Code::InvalidArgument)
    );
    let mut huge = tonic::Request::new(request("demo", "x", &[&"i".repeat(2 * 1024 * 1024)]));
    huge.metadata_mut()
        .insert("authorization", "Bearer ops-token".parse().unwrap());
    let status = client(addr)
        .await
        .register_service_app_mapping(huge)
        .await
        .err();
    assert!(status.is_some(), "a 2 MiB request was accepted");

    let (_, metrics) = http_get(server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_rejections_total{reason=\"caller_rate\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_rejections_total{reason=\"max_streams\"} 1"),
        "{metrics}"
    );
    assert!(server.stop().await.is_ok());
}

/// `dubbo-cp get` of an auth kind names each policy's audience and how many open discovery
/// streams receive it, and warns while none does: a client receives only its own namespace's
/// and the root namespace's policies, so an applied policy can look served and reach nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_of_an_auth_policy_says_who_receives_it_and_warns_while_nobody_connected_does() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(auth_config(dir.path(), TOKENS)).await;
    let admin = server.admin_addr.to_string();
    let manifest = dir.path().join("policy.yaml");
    std::fs::write(
        &manifest,
        include_str!("../examples/rules/authentication-policy.yaml"),
    )
    .unwrap();
    let cli = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"));
        command
            .args(args)
            .args(["--admin", &admin, "--token", "ops-token"]);
        let output = command.output().unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    cli(&["apply", "-f", manifest.to_str().unwrap()]);

    let get = || cli(&["get", "authenticationpolicies", "-n", "demo"]);
    // Nobody subscribed to the kind: one note, not a warning per policy.
    let (stdout, stderr) = get();
    assert!(stdout.contains("0/0"), "{stdout}");
    assert!(
        stderr.contains("note: no discovery-stream client subscribes"),
        "{stderr}"
    );

    // Only a client of another namespace subscribes: it does not receive demo's policy.
    let kind = "dubbo.apache.org/v1alpha1/AuthenticationPolicy";
    // A client subscribed with `token`, and how many policies it was sent.
    let subscribed = async |token: &str| {
        let mut observer = Observer::connect_as(channel(server.grpc_addr).await, Some(token))
            .await
            .unwrap();
        observer.subscribe(kind).await;
        let objects = observer.next().await.data.decode().unwrap().len();
        (observer, objects)
    };
    let (_ops, objects) = subscribed("ops-token").await;
    assert_eq!(objects, 0);
    let (stdout, stderr) = get();
    assert!(
        stdout.contains("RECEIVING") && stdout.contains("AUDIENCE"),
        "{stdout}"
    );
    assert!(stdout.contains("0/1"), "{stdout}");
    assert!(stdout.contains("clients of namespace demo"), "{stdout}");
    assert!(
        stderr.contains(
            "warning: demo/strict-mtls: none of the 1 discovery streams subscribed to its kind \
             receives it"
        ) && stderr.contains("only the policies of namespace \"dubbo-system\""),
        "{stderr}"
    );
    // docs/rules.md quotes the line as it is printed.
    let warning = stderr.lines().find(|l| l.starts_with("warning:")).unwrap();
    assert!(
        include_str!("../docs/rules.md").contains(warning),
        "docs/rules.md does not quote: {warning}"
    );

    // A client authenticated in `demo` receives it: counted, and no warning.
    let (_demo, objects) = subscribed("demo-token").await;
    assert_eq!(objects, 1);
    let (stdout, stderr) = get();
    assert!(stdout.contains("1/2"), "{stdout}");
    assert!(!stderr.contains("warning"), "{stderr}");
}
