//! Released xDS clients, grpcio (Python) and @grpc/grpc-js-xds (Node.js), routed by what the
//! server pushes, proven by real traffic: backends on loopback answer their names, and the
//! client counts who answered. Each scenario runs once per client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The released clients under test.
const GRPCIO: &str = "grpcio==1.85.3";
const GRPC_JS_XDS: [&str; 2] = ["@grpc/grpc-js-xds@1.14.1", "@grpc/grpc-js@1.14.7"];

#[derive(Clone, Copy, Debug)]
enum Released {
    Grpcio,
    GrpcJs,
}

/// A virtual environment with grpcio, made once per target directory by this test itself, so a
/// fresh machine needs only python3 (pip fetches the wheel from PyPI).
fn python() -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(GRPCIO.replace("==", "-"));
    let python = venv.join("bin/python");
    let has_grpc = |python: &PathBuf| {
        std::process::Command::new(python)
            .args(["-c", "import grpc"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_grpc(&python) {
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 is needed for the grpcio tests");
        assert!(made.success(), "python3 -m venv {} failed", venv.display());
        let installed = std::process::Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                GRPCIO,
            ])
            .status()
            .unwrap();
        assert!(installed.success(), "pip install {GRPCIO} failed");
    }
    python
}

/// `node_modules` with @grpc/grpc-js-xds, installed once per target directory by this test
/// itself from the npm registry.
fn node_modules() -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let prefix = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("grpc-js-xds-1.14.1");
    let modules = prefix.join("node_modules");
    if !modules.join("@grpc/grpc-js-xds/package.json").is_file() {
        let installed = std::process::Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(&prefix)
            .args(GRPC_JS_XDS)
            .status()
            .expect("npm is needed for the grpc-js-xds tests");
        assert!(installed.success(), "npm install {GRPC_JS_XDS:?} failed");
    }
    modules
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(name)
}

/// A process of the script, stopped when dropped.
struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    fn spawn(kind: Released, args: &[&str], env: &[(&str, String)]) -> Proc {
        let mut command = match kind {
            Released::Grpcio => {
                let mut command = Command::new(python());
                command.arg(script("grpc_xds.py"));
                command
            }
            Released::GrpcJs => {
                let mut command = Command::new("node");
                command
                    .arg(script("grpc_xds.js"))
                    .env("NODE_PATH", node_modules());
                command
            }
        };
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Proc {
            child,
            stdin,
            lines,
        }
    }

    async fn line(&mut self) -> String {
        self.lines.next_line().await.unwrap().expect("a line")
    }
}

async fn backend(kind: Released, name: &str) -> (Proc, u16) {
    let mut proc = Proc::spawn(kind, &["backend", name], &[]);
    let port = proc.line().await.trim().parse().unwrap();
    (proc, port)
}

fn bootstrap(server: &support::Server) -> String {
    serde_json::json!({
        "xds_servers": [{
            "server_uri": server.addr.to_string(),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        // grpc-js-xds refuses a bootstrap without a locality.
        "node": {"id": "released-client-test", "locality": {}},
    })
    .to_string()
}

/// Makes `count` calls and returns who answered them.
async fn count(client: &mut Proc, count: usize) -> serde_json::Value {
    count_with(client, count, "").await
}

/// Calls with `metadata` until `who` answers `run` calls in a row ("error": until calls fail),
/// so what is counted next runs on the version the client acknowledged: the client rebuilds its
/// balancer a moment after the ACK. Fails after 5,000 calls.
async fn settle(client: &mut Proc, who: &str, run: usize, metadata: &str) {
    client
        .stdin
        .write_all(format!("settle {who} {run} {metadata}\n").as_bytes())
        .await
        .unwrap();
    let settled: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(settled["settled"], true, "{who} never answered: {settled}");
}

/// Makes `count` calls with `metadata` (`key=value` words) and returns who answered them.
async fn count_with(client: &mut Proc, count: usize, metadata: &str) -> serde_json::Value {
    client
        .stdin
        .write_all(format!("count {count} {metadata}\n").as_bytes())
        .await
        .unwrap();
    serde_json::from_str(&client.line().await).unwrap()
}

/// Asserts that a and b answered every call of `counts`, a within 5 points of `percent`: with
/// 2,000 calls a wrong verdict comes with probability about 2e-8.
fn assert_split(counts: &serde_json::Value, percent: u64) {
    let a = answers(counts, "a");
    let total = a + answers(counts, "b");
    assert_eq!(total, 2000, "every call answered by a or b: {counts}");
    let wanted = percent * total / 100;
    let slack = 5 * total / 100;
    assert!(
        a.abs_diff(wanted) <= slack,
        "a answered {a} of {total}, wanted {percent}% +/- 5: {counts}"
    );
}

/// A client process calling `target` through the xDS server.
fn client(kind: Released, server: &support::Server, target: &str) -> Proc {
    Proc::spawn(
        kind,
        &["client", target],
        &[("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap(server))],
    )
}

fn answers(counts: &serde_json::Value, who: &str) -> u64 {
    counts[who].as_u64().unwrap_or(0)
}

async fn endpoint_weights_split_traffic_and_shifts_move_it_without_a_failed_call(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    server.publish(vec![support::greeter(
        "default",
        &[(port_a, 80), (port_b, 20)],
    )]);
    let mut client = client(kind, &server, "xds:///greeter:7070");
    // The first call waits for the configuration, so every call counted ran on it. With 2,000
    // calls an 80/20 split lands within 5 points except with probability about 2e-8.
    assert_split(&count(&mut client, 2000).await, 80);

    // 0/100: a weight of 0 takes no traffic. Counted once the client acknowledged it and b
    // answered 100 calls in a row (under 80/20 that happens with probability 1e-70).
    let version = server.publish(vec![support::greeter(
        "default",
        &[(port_a, 0), (port_b, 100)],
    )]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "b", 100, "").await;
    let counts = count(&mut client, 2000).await;
    assert_eq!(answers(&counts, "b"), 2000, "all to b: {counts}");

    // 50/50, pushed once 300 of 3,000 calls are done: none of them fails across the switch.
    client
        .stdin
        .write_all(b"count 3000 running\n")
        .await
        .unwrap();
    assert_eq!(client.line().await, "running");
    let version = server.publish(vec![support::greeter(
        "default",
        &[(port_a, 50), (port_b, 50)],
    )]);
    let during: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(
        answers(&during, "a") + answers(&during, "b"),
        3000,
        "no call failed across the switch: {during}"
    );
    // The first 300 ran on 0/100; a answering some of the rest shows the switch came mid-run.
    assert!(
        answers(&during, "b") >= 300 && answers(&during, "a") > 0,
        "the switch landed while calls ran: {during}"
    );
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "a", 1, "").await;
    assert_split(&count(&mut client, 2000).await, 50);
    drop(client.child.start_kill());
}

fn tag_route(force: bool, gray: &[String]) -> dubbo_cp_domain::rules::TagRouteSpec {
    serde_json::from_value(serde_json::json!({
        "key": "greeter", "configVersion": "v3.0", "force": force,
        "tags": [{"name": "gray", "addresses": gray}],
    }))
    .unwrap()
}

async fn a_tag_route_sends_tagged_calls_to_its_endpoints_with_dubbos_fallback(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_g, port_g) = backend(kind, "g").await;
    let server = support::Server::start().await;
    let greeter = support::greeter("default", &[(port_a, 1), (port_g, 1)]);
    let gray = vec![format!("127.0.0.1:{port_g}")];
    server.publish_with_tags(vec![greeter.clone()], vec![tag_route(false, &gray)]);
    let mut client = client(kind, &server, "xds:///greeter:7070");
    let only = |counts: &serde_json::Value, who: &str, n: u64| {
        assert_eq!(answers(counts, who), n, "{counts}");
    };
    // Tagged calls reach the tagged endpoint; untagged ones never do.
    only(
        &count_with(&mut client, 200, "dubbo-tag=gray").await,
        "g",
        200,
    );
    only(&count(&mut client, 200).await, "a", 200);
    // Tags compare exactly, as in Dubbo: GRAY is a tag nobody has.
    only(
        &count_with(&mut client, 100, "dubbo-tag=GRAY").await,
        "a",
        100,
    );
    // A tag nobody has falls back to the untagged endpoints, unless the call forces it.
    only(
        &count_with(&mut client, 200, "dubbo-tag=blue").await,
        "a",
        200,
    );
    let forced = count_with(&mut client, 50, "dubbo-tag=blue dubbo-force-tag=true").await;
    only(&forced, "error", 50);

    // The gray address gone: without force, gray calls fall back to the endpoints in no tag,
    // which g now is too (the rule no longer lists it); with force they fail.
    let gone = vec!["127.0.0.1:1".to_string()];
    let version = server.publish_with_tags(vec![greeter.clone()], vec![tag_route(false, &gone)]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "a", 1, "dubbo-tag=gray").await;
    let fallback = count_with(&mut client, 200, "dubbo-tag=gray").await;
    assert_eq!(
        answers(&fallback, "a") + answers(&fallback, "g"),
        200,
        "{fallback}"
    );
    assert!(
        answers(&fallback, "a") > 0 && answers(&fallback, "g") > 0,
        "{fallback}"
    );
    let version = server.publish_with_tags(vec![greeter], vec![tag_route(true, &gone)]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "error", 1, "dubbo-tag=gray").await;
    only(
        &count_with(&mut client, 50, "dubbo-tag=gray").await,
        "error",
        50,
    );
    drop(client.child.start_kill());
}

async fn a_dubbo_interface_name_reaches_the_applications_its_mapping_lists(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    server.publish_with_mappings(
        vec![
            support::app_service("greeter-svc", "greeter", port_a),
            support::app_service("billing-svc", "billing", port_b),
        ],
        vec![("org.example.Shared", vec!["greeter", "billing"])],
    );
    // An application name: that application's services.
    let mut by_application = client(kind, &server, "xds:///greeter");
    let counts = count(&mut by_application, 200).await;
    assert_eq!(answers(&counts, "a"), 200, "{counts}");
    // An interface served by two applications of one endpoint each: an even split.
    let mut by_interface = client(kind, &server, "xds:///org.example.Shared:7070");
    assert_split(&count(&mut by_interface, 2000).await, 50);
    drop(by_application.child.start_kill());
    drop(by_interface.child.start_kill());
}

fn dynamic_config(overrides: serde_json::Value) -> dubbo_cp_domain::rules::DynamicConfigSpec {
    serde_json::from_value(serde_json::json!({
        "key": "greeter", "scope": "application", "configVersion": "v3.0",
        "configs": overrides,
    }))
    .unwrap()
}

async fn dynamic_config_weights_and_disabled_instances_move_traffic(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    // Both at Dubbo's default weight, b overridden to 25 by address: 100/25 is 80/20.
    let greeter = support::greeter("default", &[(port_a, 100), (port_b, 100)]);
    let b = format!("127.0.0.1:{port_b}");
    server.publish_with_configs(
        vec![greeter.clone()],
        vec![dynamic_config(serde_json::json!([
            {"side": "provider", "addresses": [b], "parameters": {"weight": "25"}},
        ]))],
    );
    let mut client = client(kind, &server, "xds:///greeter:7070");
    assert_split(&count(&mut client, 2000).await, 80);
    // b disabled: no call reaches it once the client applied the version.
    let version = server.publish_with_configs(
        vec![greeter],
        vec![dynamic_config(serde_json::json!([
            {"addresses": [b], "parameters": {"disabled": "true"}},
        ]))],
    );
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "a", 100, "").await;
    let counts = count(&mut client, 1000).await;
    assert_eq!(answers(&counts, "a"), 1000, "{counts}");
    drop(client.child.start_kill());
}

macro_rules! per_client {
    ($($scenario:ident),* $(,)?) => {
        mod grpcio {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    super::$scenario(super::Released::Grpcio).await;
                }
            )*
        }
        mod grpc_js_xds {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    super::$scenario(super::Released::GrpcJs).await;
                }
            )*
        }
    };
}

per_client!(
    endpoint_weights_split_traffic_and_shifts_move_it_without_a_failed_call,
    a_tag_route_sends_tagged_calls_to_its_endpoints_with_dubbos_fallback,
    a_dubbo_interface_name_reaches_the_applications_its_mapping_lists,
    dynamic_config_weights_and_disabled_instances_move_traffic,
);
