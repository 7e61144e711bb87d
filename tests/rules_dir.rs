//! `serve --rules-dir` as a user runs it: the real binary re-applies the directory when a file
//! changes and only then (its own reads of the files are not changes), and a path that is not a
//! directory stops it at once with the path named.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::spawn_binary;

const GREY: &str = "apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata:
  name: shop-grey
  namespace: demo
spec:
  key: shop
  configVersion: v3.0
  tags:
    - name: grey
      addresses: [\"10.0.0.1:20880\"]
";

/// `dubbo_cp_rules_dir_applies_total` of the running binary.
async fn applies(admin: std::net::SocketAddr) -> f64 {
    common::metric(admin, "dubbo_cp_rules_dir_applies_total").await
}

#[tokio::test]
async fn the_directory_is_applied_again_after_an_edit_and_then_not_again() {
    let data = tempfile::tempdir().unwrap();
    let rules = data.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(rules.join("grey.yaml"), GREY).unwrap();
    let process = spawn_binary(data.path(), &["--rules-dir", rules.to_str().unwrap()]);
    // Applied once at start, before the ports serve.
    assert_eq!(applies(process.admin_addr).await, 1.0);
    // The edit: applied once, after the settle time.
    std::fs::write(
        rules.join("grey.yaml"),
        GREY.replace("key: shop", "key: shop-v2"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while applies(process.admin_addr).await < 2.0 {
        assert!(Instant::now() < deadline, "the edit was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Then nothing more: each apply reads the files, and those reads must not count as edits
    // (they re-applied the directory every settle period, 200 ms, forever). This is the one
    // wait for an absence: five settle periods.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        applies(process.admin_addr).await,
        2.0,
        "applied again without a change"
    );
}

/// Runs `serve` with `args`; returns its exit status and standard error, failing the test if
/// it has not exited within 20 s.
fn serve_exits(data: &std::path::Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .arg("serve")
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(["--xds-addr", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dubbo-cp kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[test]
fn a_rules_directory_that_is_missing_or_a_file_stops_serve_naming_the_path() {
    let data = tempfile::tempdir().unwrap();
    let missing = data.path().join("no-such-dir");
    let (status, stderr) = serve_exits(data.path(), &["--rules-dir", missing.to_str().unwrap()]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!(
            "rules directory {} does not exist",
            missing.display()
        )),
        "{stderr}"
    );
    let file = data.path().join("rules.yaml");
    std::fs::write(&file, GREY).unwrap();
    let (status, stderr) = serve_exits(data.path(), &["--rules-dir", file.to_str().unwrap()]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!(
            "rules directory {} is not a directory",
            file.display()
        )),
        "{stderr}"
    );
}
