//! Durations as a user writes them to the real binary (`serve --print-config` prints what was
//! read, or the refusal): a unit is required in flags, variables and YAML strings; a YAML
//! integer is nanoseconds, as the reference control plane writes them (wire.md §4).

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

/// `serve --print-config` with `args` and `env`, and no other `DUBBO_CP_*` variable.
fn print_config(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"));
    for (name, _) in std::env::vars() {
        if name.starts_with("DUBBO_CP_") {
            command.env_remove(name);
        }
    }
    command
        .arg("serve")
        .args(args)
        .arg("--print-config")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// The `debounce:` section's `after:` as printed.
fn debounce_after(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout.clone()).unwrap();
    let section = printed.split_once("\ndebounce:\n").unwrap().1;
    section
        .lines()
        .find_map(|line| line.trim().strip_prefix("after: "))
        .unwrap()
        .to_owned()
}

/// The refusal: a failed exit and standard error.
fn refusal(output: &Output) -> String {
    assert!(!output.status.success(), "accepted");
    String::from_utf8(output.stderr.clone()).unwrap()
}

const FORM: &str = "has no unit; write a duration with its unit, such as 200ms, 2s, 1m";

#[test]
fn a_flag_needs_a_unit() {
    assert_eq!(
        debounce_after(&print_config(&["--debounce-after", "200ms"], &[])),
        "200ms"
    );
    let refused = refusal(&print_config(&["--debounce-after", "10"], &[]));
    assert!(
        refused.contains(&format!("--debounce-after: \"10\" {FORM}")),
        "{refused}"
    );
}

#[test]
fn a_variable_needs_a_unit_and_is_named_when_refused() {
    assert_eq!(
        debounce_after(&print_config(&[], &[("DUBBO_CP_DEBOUNCE_AFTER", "2s")])),
        "2s"
    );
    let refused = refusal(&print_config(&[], &[("DUBBO_CP_DEBOUNCE_AFTER", "10")]));
    assert!(
        refused.contains(&format!(
            "DUBBO_CP_DEBOUNCE_AFTER (--debounce-after): \"10\" {FORM}"
        )),
        "{refused}"
    );
}

#[test]
fn a_yaml_string_needs_a_unit_and_a_yaml_integer_is_nanoseconds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dubbo-cp.yaml");
    let config = ["--config", file.to_str().unwrap()];
    std::fs::write(&file, "debounce:\n  after: 2s\n").unwrap();
    assert_eq!(debounce_after(&print_config(&config, &[])), "2s");
    // The reference control plane's form.
    std::fs::write(&file, "debounce:\n  after: 100000000\n").unwrap();
    assert_eq!(debounce_after(&print_config(&config, &[])), "100ms");
    std::fs::write(&file, "debounce:\n  after: \"10\"\n").unwrap();
    let refused = refusal(&print_config(&config, &[]));
    assert!(
        refused.contains(&format!("debounce.after: \"10\" {FORM}")),
        "{refused}"
    );
}
