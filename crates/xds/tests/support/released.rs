//! Released xDS clients as test processes: grpcio (Python) and @grpc/grpc-js-xds (Node.js),
//! installed by the tests themselves, backends that answer their names, and clients that count
//! who answered. Shared by this crate's tests and the workspace's (`tests/xds.rs`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The released clients under test.
const GRPCIO: &str = "grpcio==1.85.3";
const GRPC_JS_XDS: [&str; 2] = ["@grpc/grpc-js-xds@1.14.1", "@grpc/grpc-js@1.14.7"];

#[derive(Clone, Copy, Debug)]
pub enum Released {
    Grpcio,
    GrpcJs,
}

/// A virtual environment with grpcio, made once per target directory by this test itself, so a
/// fresh machine needs only python3 (pip fetches the wheel from PyPI).
pub fn python() -> PathBuf {
    venv(&GRPCIO.replace("==", "-"), GRPCIO, "import grpc")
}

/// A virtual environment `name` under the target directory with `requirement` installed (from
/// PyPI), made once: `check` (Python) says whether it is there already.
pub fn venv(name: &str, requirement: &str, check: &str) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin/python");
    let present = |python: &PathBuf| {
        std::process::Command::new(python)
            .args(["-c", check])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !present(&python) {
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 is needed for the released-client tests");
        assert!(made.success(), "python3 -m venv {} failed", venv.display());
        let installed = std::process::Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            // Several requirements, separated by spaces.
            .args(requirement.split_whitespace())
            .status()
            .unwrap();
        assert!(installed.success(), "pip install {requirement} failed");
    }
    python
}

/// `node_modules` with @grpc/grpc-js-xds, installed once per target directory by this test
/// itself from the npm registry.
pub fn node_modules() -> PathBuf {
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

/// The support scripts, from this crate's tests or from the workspace root's.
fn script(name: &str) -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let crate_dir = if here.ends_with("crates/xds") {
        here
    } else {
        here.join("crates/xds")
    };
    crate_dir.join("tests/support").join(name)
}

/// A process of the script, stopped when dropped.
pub struct Proc {
    pub child: Child,
    pub stdin: ChildStdin,
    pub lines: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    pub fn spawn(kind: Released, args: &[&str], env: &[(&str, String)]) -> Proc {
        let name = match kind {
            Released::Grpcio => "grpc_xds.py",
            Released::GrpcJs => "grpc_xds.js",
        };
        Proc::spawn_script(kind, &script(name), args, env)
    }

    /// `script` (Python for grpcio, Node.js for grpc-js) with the released library.
    pub fn spawn_script(
        kind: Released,
        script: &std::path::Path,
        args: &[&str],
        env: &[(&str, String)],
    ) -> Proc {
        let mut command = match kind {
            Released::Grpcio => Command::new(python()),
            Released::GrpcJs => {
                let mut command = Command::new("node");
                command.env("NODE_PATH", node_modules());
                command
            }
        };
        command
            .arg(script)
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

    pub async fn line(&mut self) -> String {
        self.lines.next_line().await.unwrap().expect("a line")
    }
}

pub async fn backend(kind: Released, name: &str) -> (Proc, u16) {
    backend_on(kind, name, "127.0.0.1").await
}

/// A backend answering `name` on `host` (any loopback address: `127.0.1.1` plays a pod's IP).
pub async fn backend_on(kind: Released, name: &str, host: &str) -> (Proc, u16) {
    let mut proc = Proc::spawn(kind, &["backend", name, host], &[]);
    let port = proc.line().await.trim().parse().unwrap();
    (proc, port)
}

/// Makes `count` calls and returns who answered them.
pub async fn count(client: &mut Proc, count: usize) -> serde_json::Value {
    count_with(client, count, "").await
}

/// Calls with `metadata` until `who` answers `run` calls in a row ("error": until calls fail),
/// so what is counted next runs on the version the client acknowledged: the client rebuilds its
/// balancer a moment after the ACK. Fails after 5,000 calls.
pub async fn settle(client: &mut Proc, who: &str, run: usize, metadata: &str) {
    client
        .stdin
        .write_all(format!("settle {who} {run} {metadata}\n").as_bytes())
        .await
        .unwrap();
    let settled: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(settled["settled"], true, "{who} never answered: {settled}");
}

/// Makes `count` calls with `metadata` (`key=value` words) and returns who answered them.
pub async fn count_with(client: &mut Proc, count: usize, metadata: &str) -> serde_json::Value {
    client
        .stdin
        .write_all(format!("count {count} {metadata}\n").as_bytes())
        .await
        .unwrap();
    serde_json::from_str(&client.line().await).unwrap()
}

/// Asserts that a and b answered every call of `counts`, a within 5 points of `percent`: with
/// 2,000 calls a wrong verdict comes with probability about 2e-8.
pub fn assert_split(counts: &serde_json::Value, percent: u64) {
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

pub fn answers(counts: &serde_json::Value, who: &str) -> u64 {
    counts[who].as_u64().unwrap_or(0)
}

/// A client process calling `target` with the xDS bootstrap `bootstrap` (JSON).
pub fn client_with(kind: Released, target: &str, bootstrap: String) -> Proc {
    Proc::spawn(
        kind,
        &["client", target],
        &[("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap)],
    )
}

/// A client process calling `target` with environment `env` (the bootstrap among it).
pub fn client_with_env(kind: Released, target: &str, env: &[(&str, String)]) -> Proc {
    Proc::spawn(kind, &["client", target], env)
}
