//! The examples' walk-through scripts run as a reader runs them: the binary under test on
//! `PATH`, a fresh `HOME`, and the control plane's four ports moved to free ones through the
//! README's variables.

use std::path::Path;
use std::time::Duration;

/// Runs `examples/<script>` with `env` besides, on moved ports; `extra_ports` more free ports
/// are handed to `env` first. Returns standard output; a failed script fails the test.
pub async fn run(
    script: &str,
    extra_ports: usize,
    env: impl FnOnce(&[u16]) -> Vec<(&'static str, String)>,
) -> String {
    // Held together while they are picked so that none comes twice.
    let held: Vec<std::net::TcpListener> = (0..4 + extra_ports)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    drop(held);
    let at = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let binary = Path::new(env!("CARGO_BIN_EXE_dubbo-cp"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let home = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(script);
    let run = tokio::process::Command::new("bash")
        .arg(script)
        .env("PATH", path)
        .env("HOME", home.path())
        .envs([
            ("DUBBO_CP_GRPC_ADDR", at(0)),
            ("DUBBO_CP_SERVER", at(0)),
            ("DUBBO_CP_ADMIN_ADDR", at(1)),
            ("DUBBO_CP_ADMIN", at(1)),
            ("DUBBO_CP_XDS_ADDR", at(2)),
            ("DUBBO_CP_XDS_SERVER", at(2)),
            ("DUBBO_CP_TLS_ADDR", at(3)),
        ])
        .envs(env(&ports[4..]))
        .env_remove("DUBBO_CA_ADDRESS")
        .env_remove("DUBBO_CP_TOKEN")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the walk-through ended within 5 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    println!("{stdout}");
    stdout
}
