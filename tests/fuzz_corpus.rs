//! Replays the committed fuzz seeds (fuzz/seeds/<target>/) through the same harnesses the fuzz
//! targets run, so CI checks them without a fuzzer.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

fn replay(target: &str, harness: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/seeds/<target>") {
        let data = std::fs::read(entry.unwrap().path()).expect("a seed file");
        harness(&data);
        count += 1;
    }
    assert!(count > 0, "no seeds in {}", dir.display());
}

#[test]
fn registration_seeds() {
    replay("registration", dubbo_cp::fuzzing::registration);
}

#[test]
fn observe_seeds() {
    replay("observe", dubbo_cp::fuzzing::observe);
}

#[test]
fn debounce_seeds() {
    replay("debounce", dubbo_cp::fuzzing::debounce);
}

#[test]
fn condition_route_seeds() {
    replay("condition_route", dubbo_cp::fuzzing::condition_route);
}

#[test]
fn webhook_review_seeds() {
    replay("webhook_review", dubbo_cp::fuzzing::webhook_review);
}

#[test]
fn authorization_policy_seeds() {
    replay(
        "authorization_policy",
        dubbo_cp::fuzzing::authorization_policy,
    );
}
