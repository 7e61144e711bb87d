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
