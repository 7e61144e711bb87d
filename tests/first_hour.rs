//! What a newcomer meets in the first hour, on the real binary: a second `serve` on a machine
//! whose ports are taken says every port it cannot have and how to move each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

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
