//! `serve --rules-dir` as a user runs it: the real binary re-applies the directory when a file
//! changes and only then (its own reads of the files are not changes), and a path that is not a
//! directory stops it at once with the path named.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::spawn_binary;

const APPLIED: &str = "rules directory applied";

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

#[test]
fn the_directory_is_applied_again_after_an_edit_and_then_not_again() {
    let data = tempfile::tempdir().unwrap();
    let rules = data.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(rules.join("grey.yaml"), GREY).unwrap();
    let process = spawn_binary(data.path(), &["--rules-dir", rules.to_str().unwrap()]);
    // The edit: applied once, after the settle time.
    std::fs::write(
        rules.join("grey.yaml"),
        GREY.replace("key: shop", "key: shop-v2"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line = process
            .logs
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the edit was never applied");
        if line.contains(APPLIED) {
            break;
        }
    }
    // Then nothing more: each apply reads the files, and those reads must not count as edits.
    // (This is the one wait for an absence: ten settle periods.)
    let quiet_until = Instant::now() + Duration::from_secs(2);
    let mut again = Vec::new();
    while let Ok(line) = process
        .logs
        .recv_timeout(quiet_until.saturating_duration_since(Instant::now()))
    {
        if line.contains(APPLIED) {
            again.push(line);
        }
    }
    assert_eq!(
        again,
        Vec::<String>::new(),
        "applied again without a change"
    );
}

/// Runs `serve` with `args`; returns its exit status and standard error, failing the test if
/// it has not exited within 20 s.
fn serve_exits(data: &std::path::Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .arg("serve")
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
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
