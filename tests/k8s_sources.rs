//! The health of each kind's source in Kubernetes mode, against the API-server fixture answering
//! as a real kube-apiserver does: a CRD that is not installed (a plain-text `404 page not found`)
//! or deleted while running, and a kind whose list or watch keeps failing. What is said of them
//! (the log, `/readyz`, `/debug/sources`, `dubbo-cp status`) and what is still served.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::apiserver::ApiServer;
use common::{Observer, SNP_TYPE, channel, http_get, mappings_of, start, type_of, wait_ready};
use dubbo_cp::config::Config;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn config(dir: &std::path::Path, api: &ApiServer) -> Config {
    let mut config = common::kubernetes_config(dir, api.url());
    config.debounce.after = Duration::from_millis(10);
    config.debounce.max = Duration::from_millis(100);
    // Anonymous clients and admin calls on loopback, as in the other Kubernetes tests.
    config.auth.token_review = Some(false);
    config
}

/// Every log line of this test binary (the server runs in-process); tests tell theirs apart by
/// the CRD they break.
fn log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOG.get_or_init(|| {
        struct Capture;
        impl std::io::Write for Capture {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                log().lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| Capture)
            .try_init();
        Mutex::new(Vec::new())
    })
}

fn log_lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&log().lock().unwrap())
        .lines()
        .filter(|line| line.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// `/debug/sources`' entry for `kind`.
async fn source(admin: SocketAddr, kind: &str) -> Value {
    let (code, body) = http_get(admin, "/debug/sources").await;
    assert_eq!(code, 200, "{body}");
    let sources: Value = serde_json::from_str(&body).unwrap();
    sources
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == kind)
        .unwrap_or_else(|| panic!("no source {kind} in {sources}"))
        .clone()
}

/// Waits (within [`WAIT`]) until `kind`'s source is in `state`; returns its entry.
async fn wait_source(admin: SocketAddr, kind: &str, state: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let source = source(admin, kind).await;
        if source["state"] == state {
            return source;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{kind} never became {state}: {source}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `key`s of the objects in a response.
fn keys(response: &dubbo_cp::dds::ObserveResponse) -> BTreeSet<String> {
    response
        .data
        .decode()
        .unwrap()
        .iter()
        .map(|any| dubbo_cp::resources::object_key(any).unwrap())
        .collect()
}

/// Reads `observer` until a response of `ty` holding `key` arrives (acknowledging the others).
async fn wait_for_key(observer: &mut Observer, ty: &str, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(response) = observer.next_within(wait).await else {
            panic!("{key} of {ty} never arrived");
        };
        observer.ack(&response).await;
        if response.r#type == ty && keys(&response).contains(key) {
            return;
        }
    }
}

fn tag_route(address: &str) -> Value {
    json!({"key": "p", "configVersion": "v3.0", "tags": [{"name": "g", "addresses": [address]}]})
}

fn dynamic_config() -> Value {
    json!({"key": "p", "scope": "application", "configVersion": "v3.0",
        "configs": [{"side": "provider", "parameters": {"weight": "10"}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_answered_as_a_real_server_does_is_named_with_its_fix_and_the_rest_is_served()
{
    log();
    let api = ApiServer::start().await;
    // As after a `kubectl apply -k deploy/` that failed half-way: one CRD is not there.
    api.set_missing("dynamicconfigs", true);
    api.kubectl_apply(
        "demo",
        "greeter",
        json!({"interfaceName": "org.demo.Greeter", "applicationNames": ["greeter"]}),
    );
    api.kubectl_apply_rule("tagroutes", "TagRoute", "demo", "t", tag_route("10.0.0.1"));
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api)).await;
    let crd = "dynamicconfigs.dubbo.apache.org";

    // Ready: a missing CRD is an answer (served empty), and every place says which and how.
    wait_ready(server.admin_addr).await;
    let (code, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&format!(
            "DynamicConfig: CustomResourceDefinition {crd} is not installed: install it with \
             `kubectl apply -k deploy/` (or `dubbo-cp crd | kubectl apply -f -`)"
        )),
        "{body}"
    );
    let missing = source(server.admin_addr, "DynamicConfig").await;
    assert_eq!(
        (&missing["state"], &missing["loaded"]),
        (&json!("crd-missing"), &json!(true))
    );
    assert_eq!(
        source(server.admin_addr, "TagRoute").await["state"],
        "synced"
    );
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["status", "--admin", &server.admin_addr.to_string()])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    assert!(
        stdout.lines().any(|l| l.starts_with("DynamicConfig")
            && l.contains(crd)
            && l.contains("kubectl apply -k deploy/")),
        "{stdout}"
    );

    // The watcher keeps retrying the list; the warning is said once, naming the CRD and the fix
    // (a retry used to clear the condition first, so it was logged, and flickered, every time).
    let deadline = tokio::time::Instant::now() + WAIT;
    while api
        .requests_per_resource()
        .get("dynamicconfigs")
        .copied()
        .unwrap_or(0)
        < 3
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the list was not retried"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warnings = log_lines_with(&format!("CustomResourceDefinition {crd} is not installed"));
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("kubectl apply -k deploy/"),
        "{}",
        warnings[0]
    );

    // Mappings and the other kinds are served; the missing kind is served empty.
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(SNP_TYPE).await;
    let mappings = observer.next().await;
    assert_eq!(mappings.r#type, SNP_TYPE);
    assert_eq!(mappings_of(&mappings).len(), 1);
    observer.ack(&mappings).await;
    observer.subscribe(&type_of("TagRoute")).await;
    let tags = observer.next().await;
    assert_eq!(keys(&tags), BTreeSet::from(["t/demo".to_owned()]));
    observer.ack(&tags).await;
    let dynamic = type_of("DynamicConfig");
    observer.subscribe(&dynamic).await;
    let empty = observer.next().await;
    assert_eq!(
        (empty.r#type.as_str(), empty.data.len()),
        (dynamic.as_str(), 0)
    );
    observer.ack(&empty).await;

    // Installed later: picked up, and nothing is said of it any more.
    api.set_missing("dynamicconfigs", false);
    api.kubectl_apply_rule(
        "dynamicconfigs",
        "DynamicConfig",
        "demo",
        "d",
        dynamic_config(),
    );
    wait_for_key(&mut observer, &dynamic, "d/demo").await;
    wait_source(server.admin_addr, "DynamicConfig", "synced").await;
    let (_, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(body, "ready\n");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_deleted_while_running_keeps_the_last_state_and_is_picked_up_when_back() {
    let api = ApiServer::start().await;
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "grey",
        tag_route("10.0.0.1"),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api)).await;
    wait_ready(server.admin_addr).await;
    let ty = type_of("TagRoute");
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(&ty).await;
    let first = observer.next().await;
    assert_eq!(keys(&first), BTreeSet::from(["grey/demo".to_owned()]));
    observer.ack(&first).await;

    // The resource disappears under an open watch: the watch ends and resuming it gets the
    // plain-text 404. That is a missing CRD, not a failing watch.
    api.set_missing("tagroutes", true);
    let missing = wait_source(server.admin_addr, "TagRoute", "crd-missing").await;
    let condition = missing["condition"].as_str().unwrap();
    assert!(
        condition.contains("tagroutes.dubbo.apache.org is not installed")
            && condition.contains("serving the last state"),
        "{condition}"
    );
    let (code, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("TagRoute: CustomResourceDefinition"),
        "{body}"
    );
    // The last state is still what a new client gets (a 404 without the deletions a real CRD
    // removal sends first must not wipe every client's routes).
    let mut late = Observer::open(server.grpc_addr).await;
    late.subscribe(&ty).await;
    assert_eq!(
        keys(&late.next().await),
        BTreeSet::from(["grey/demo".to_owned()])
    );

    // Back, with an object created meanwhile: listed again, and synced.
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "blue",
        tag_route("10.0.0.2"),
    );
    api.set_missing("tagroutes", false);
    wait_for_key(&mut observer, &ty, "blue/demo").await;
    wait_source(server.admin_addr, "TagRoute", "synced").await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_failing_with_500s_holds_only_its_own_subscriptions() {
    let api = ApiServer::start().await;
    api.kubectl_apply(
        "demo",
        "greeter",
        json!({"interfaceName": "org.demo.Greeter", "applicationNames": ["greeter"]}),
    );
    api.set_failing("dynamicconfigs", Some(500));
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api)).await;

    // A mappings-only client is served as soon as mappings are in.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut mappings_only = loop {
        match Observer::connect(channel(server.grpc_addr).await).await {
            Ok(observer) => break observer,
            Err(refused) => assert!(
                tokio::time::Instant::now() < deadline,
                "streams are still refused: {refused}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    mappings_only.subscribe(SNP_TYPE).await;
    let mappings = mappings_only.next().await;
    assert_eq!(mappings_of(&mappings).len(), 1);
    mappings_only.ack(&mappings).await;

    // The failing kind's subscription is held (never an empty state), the others are answered.
    let dynamic = type_of("DynamicConfig");
    let mut both = Observer::open(server.grpc_addr).await;
    both.subscribe(&dynamic).await;
    both.subscribe(SNP_TYPE).await;
    let first = both.next().await;
    assert_eq!(first.r#type, SNP_TYPE, "only the synced kind is answered");
    both.ack(&first).await;

    // Not ready, and the body, the source and its state say which and why.
    let (code, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("DynamicConfig: the watch of dynamicconfigs.dubbo.apache.org is failing"),
        "{body}"
    );
    assert!(body.contains("500"), "{body}");
    let failing = source(server.admin_addr, "DynamicConfig").await;
    assert_eq!(
        (&failing["state"], &failing["loaded"]),
        (&json!("failing"), &json!(false))
    );

    // The storm ends: the held subscription gets its first state.
    api.kubectl_apply_rule(
        "dynamicconfigs",
        "DynamicConfig",
        "demo",
        "d",
        dynamic_config(),
    );
    api.set_failing("dynamicconfigs", None);
    wait_for_key(&mut both, &dynamic, "d/demo").await;
    wait_ready(server.admin_addr).await;

    // A storm after the list: still ready (the kind was answered), the state listed before is
    // served, and the source says it is failing until it answers again.
    api.set_failing("dynamicconfigs", Some(500));
    let failing = wait_source(server.admin_addr, "DynamicConfig", "failing").await;
    assert!(
        failing["condition"]
            .as_str()
            .unwrap()
            .contains("serving the state listed before"),
        "{failing}"
    );
    assert_eq!(http_get(server.admin_addr, "/readyz").await.0, 200);
    let mut late = Observer::open(server.grpc_addr).await;
    late.subscribe(&dynamic).await;
    assert_eq!(
        keys(&late.next().await),
        BTreeSet::from(["d/demo".to_owned()])
    );
    api.set_failing("dynamicconfigs", None);
    api.kubectl_apply_rule(
        "dynamicconfigs",
        "DynamicConfig",
        "demo",
        "e",
        dynamic_config(),
    );
    wait_for_key(&mut both, &dynamic, "e/demo").await;
    wait_source(server.admin_addr, "DynamicConfig", "synced").await;
    server.stop().await.unwrap();
}
