//! What a newcomer meets in the first hour, on the real binary: the README's quick start run as
//! written, the examples the docs use, and a second `serve` on a machine whose ports are taken
//! saying every port it cannot have and how to move each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repository().join(path)).unwrap()
}

/// The `n`th (from 0) ```sh block of `text`.
fn sh_block(text: &str, n: usize) -> &str {
    let block = text.split("```sh\n").nth(n + 1).expect("no such sh block");
    block.split("```").next().unwrap()
}

/// The README's quick start, run by bash from the repository's root as a newcomer runs it: the
/// commands as written, on ports moved away from the defaults by the quick start's own `export`
/// (each port it names replaced by a free one), with a fresh data directory
/// (`DUBBO_CP_DATA_DIR`). The one line not run is the build: the binary under test is put on the
/// `PATH` instead (the test asserts the line is there, as written).
#[test]
fn the_readme_quick_start_runs_as_written_on_moved_ports() {
    let readme = read("README.md");
    let section = readme
        .split("## Quick start")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let commands = sh_block(section, 0);
    let build = r#"cargo build --release && export PATH="$PWD/target/release:$PATH""#;
    assert!(
        commands.contains(build),
        "the build line changed:\n{commands}"
    );
    // The quick start's way to move every port, with free ports for the ones it names.
    let mut moves = sh_block(section, 1).to_owned();
    let ports: std::collections::BTreeSet<String> = moves
        .split("127.0.0.1:")
        .skip(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect())
        .collect();
    assert_eq!(ports.len(), 4, "four ports moved:\n{moves}");
    // Six free ports, held together while they are picked so that none comes twice.
    let held: Vec<std::net::TcpListener> = (0..6)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut free = held.iter().map(|l| l.local_addr().unwrap().port());
    for port in &ports {
        let free = free.next().unwrap();
        moves = moves.replace(&format!("127.0.0.1:{port}"), &format!("127.0.0.1:{free}"));
    }
    let greeter_ports = format!("{} {}", free.next().unwrap(), free.next().unwrap());
    drop(held);
    for variable in [
        "DUBBO_CP_GRPC_ADDR",
        "DUBBO_CP_ADMIN_ADDR",
        "DUBBO_CP_XDS_ADDR",
        "DUBBO_CP_TLS_ADDR",
        "DUBBO_CP_SERVER",
        "DUBBO_CP_ADMIN",
        "DUBBO_CP_XDS_SERVER",
    ] {
        assert!(
            moves.contains(&format!("{variable}=")),
            "{variable} not moved:\n{moves}"
        );
    }
    let data = tempfile::tempdir().unwrap();
    let binaries = PathBuf::from(env!("CARGO_BIN_EXE_dubbo-cp"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!("{}:{}", binaries.display(), std::env::var("PATH").unwrap());
    // What runs: the moves, then the commands; whatever the script left running is stopped.
    let script = format!(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n{moves}\n{}",
        commands.replace(build, "")
    );
    let output = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(repository())
        .env("PATH", path)
        .env("DUBBO_CP_DATA_DIR", data.path().join("data"))
        .env("PYTHON", released::python())
        .env("GREETER_PORTS", greeter_ports)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("ready after"), "{stdout}");
    assert!(
        stdout.contains("registered 1 new interface mapping"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("org.example.Greeter") && l.contains("greeter")),
        "get mappings:\n{stdout}"
    );
    assert!(
        data.path().join("data").exists(),
        "the data directory was not used"
    );
    // The walk-through's split: 80/20 over 1,000 calls, within 6 points.
    for (who, share) in [("a", 80), ("b", 20)] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{who} answered ")))
            .unwrap_or_else(|| panic!("{who} answered nothing:\n{stdout}"));
        let count: i64 = line.split(' ').nth(2).unwrap().parse().unwrap();
        assert!((count / 10 - share).abs() <= 6, "{line}");
    }
}

/// Every manifest of examples/ is shown by a doc as it is in the file, with the file's path
/// beside it (the docs run the examples, they do not copy them); the rules apply in standalone
/// with `dubbo-cp apply -f examples/rules` and `get` lists every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_is_in_the_docs_and_the_rules_apply() {
    let mut docs = vec![("README.md".to_owned(), read("README.md"))];
    for entry in std::fs::read_dir(repository().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
            docs.push((name.clone(), read(&name)));
        }
    }
    let mut manifests = 0;
    for dir in [
        "examples/rules",
        "examples/kubernetes",
        "examples/xds",
        "examples/security",
        "examples/zookeeper",
    ] {
        for entry in std::fs::read_dir(repository().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            manifests += 1;
            let file = format!("{dir}/{}", path.file_name().unwrap().to_string_lossy());
            let body = read(&file);
            let shown = docs
                .iter()
                .find(|(_, text)| text.contains(&body))
                .unwrap_or_else(|| panic!("no doc shows {file} as it is"));
            assert!(
                shown.1.contains(&file),
                "{} shows {file} without naming it",
                shown.0
            );
        }
    }
    assert!(manifests >= 11, "{manifests} manifests");

    let dir = tempfile::tempdir().unwrap();
    let server = common::start(common::test_config(dir.path())).await;
    let admin = server.admin_addr.to_string();
    let cli = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .args(args)
            .args(["--admin", &admin])
            .current_dir(repository())
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let applied = cli(&["apply", "-f", "examples/rules"]);
    for (kind, names) in [
        ("tagroutes", &["shop-grey"][..]),
        ("conditionroutes", &["comment-route"]),
        ("dynamicconfigs", &["shop-weight"]),
        ("authenticationpolicies", &["strict-mtls", "strict"]),
        (
            "authorizationpolicies",
            &["shop-callers", "callers", "no-delete"],
        ),
        ("serviceentries", &["greeter"]),
    ] {
        let listed = cli(&["get", kind]);
        for name in names {
            // Whole names: `strict` is in `strict-mtls` too.
            let applied_it = applied.lines().any(|l| {
                l.split_whitespace()
                    .any(|w| w.ends_with(&format!("/{name}")))
            });
            assert!(applied_it, "{name} not applied:\n{applied}");
            let listed_it = listed
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(name));
            assert!(listed_it, "{kind} {name} not listed:\n{listed}");
        }
    }
}

#[test]
fn a_busy_port_is_named_with_the_flag_and_variable_that_move_it_all_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let first = common::spawn_binary(dir.path(), &[]);
    let grpc = first.grpc_addr.to_string();
    let admin = first.admin_addr.to_string();
    let other = tempfile::tempdir().unwrap();
    let second = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["serve", "--grpc-addr", &grpc, "--admin-addr", &admin])
        .args(["--tls-addr", "127.0.0.1:0", "--xds-addr", "127.0.0.1:0"])
        .args(["--webhook-addr", "127.0.0.1:0", "--data-dir"])
        .arg(other.path())
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    for (addr, flag, env) in [
        (&grpc, "--grpc-addr", "DUBBO_CP_GRPC_ADDR"),
        (&admin, "--admin-addr", "DUBBO_CP_ADMIN_ADDR"),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains(&format!("cannot listen on {addr}"))
                    && l.contains(&format!("move it with {flag} ({env}"))),
            "{flag} in:\n{stderr}"
        );
    }
    drop(first);
}

/// A Canary applied without Kubernetes is refused as Kubernetes-only, naming the standalone way
/// (a DynamicConfig weight), and the example docs/canary.md gives for it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_in_standalone_says_it_is_kubernetes_only_and_what_to_use_instead() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::start(common::test_config(dir.path())).await;
    let canary = "apiVersion: dubbo.apache.org/v1alpha1\nkind: Canary\n\
                  metadata: {name: shop, namespace: demo}\nspec: {}\n";
    let (status, body) =
        common::http_send(server.admin_addr, "POST", "/api/v1/apply", canary, None).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("Kubernetes-only") && body.contains("DynamicConfig"),
        "{body}"
    );
    // The example of docs/canary.md "Without Kubernetes", as written there.
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/canary.md")).unwrap();
    let section = docs.split("## Without Kubernetes").nth(1).unwrap();
    let example = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap();
    let (status, body) =
        common::http_send(server.admin_addr, "POST", "/api/v1/apply", example, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(server.stop().await.is_ok());
}

/// `--server` names the gRPC port in every command; the bootstrap's xDS address is
/// `--xds-server` (`DUBBO_CP_XDS_SERVER`), and its old spelling still works with a warning.
#[test]
fn the_bootstraps_xds_address_has_its_own_flag_and_the_old_spelling_warns() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .arg("bootstrap")
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let bootstrap: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        (
            bootstrap["xds_servers"][0]["server_uri"]
                .as_str()
                .unwrap()
                .to_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (uri, warned) = run(&["--xds-server", "10.0.0.5:15010"], &[]);
    assert_eq!((uri.as_str(), warned.as_str()), ("10.0.0.5:15010", ""));
    let (uri, _) = run(&[], &[("DUBBO_CP_XDS_SERVER", "10.0.0.6:15010")]);
    assert_eq!(uri, "10.0.0.6:15010");
    let (uri, warned) = run(&["--server", "10.0.0.7:15010"], &[]);
    assert_eq!(uri, "10.0.0.7:15010");
    assert!(
        warned.contains("deprecated") && warned.contains("--xds-server"),
        "{warned}"
    );
}

/// `status --wait-ready` waits through a port nobody listens on until its timeout, and fails at
/// once on an answer that will not change (a port that is not the admin port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_ready_waits_only_for_what_can_change() {
    let wait_ready = |admin: String, timeout: &str| {
        let timeout = timeout.to_owned();
        async move {
            let started = std::time::Instant::now();
            let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
                .args([
                    "status",
                    "--wait-ready",
                    "--wait-timeout",
                    &timeout,
                    "--admin",
                ])
                .arg(admin)
                .output()
                .await
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            (output.status.success(), stderr, started.elapsed())
        }
    };
    // Nobody listens: waited through, then the timeout says what was last seen.
    let nobody = format!("127.0.0.1:{}", common::kube_local::free_port());
    let (ok, stderr, took) = wait_ready(nobody, "500ms").await;
    assert!(!ok);
    assert!(
        stderr.contains("not ready within 500ms") && stderr.contains("cannot connect"),
        "{stderr}"
    );
    assert!(took >= std::time::Duration::from_millis(500), "{took:?}");

    // The gRPC port is not the admin port: no answer there will become ready.
    let dir = tempfile::tempdir().unwrap();
    let server = common::start(common::test_config(dir.path())).await;
    let (ok, stderr, _) = wait_ready(server.grpc_addr.to_string(), "1h").await;
    assert!(!ok);
    assert!(!stderr.contains("not ready within"), "{stderr}");

    // The admin port of a ready server: ready at once.
    let (ok, stderr, _) = wait_ready(server.admin_addr.to_string(), "10s").await;
    assert!(ok, "{stderr}");
}
