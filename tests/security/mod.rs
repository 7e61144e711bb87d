//! Zero trust with released gRPC on both ends: workloads whose certificates `dubbo-cp agent`
//! keeps, their xDS bootstraps, the shipped example servers (examples/security/, grpcio and
//! @grpc/grpc-js-xds) and the client drivers `secure.py` and `secure.js` calling through the
//! control plane.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::released::Released;

const CERT_CHAIN: &str = "cert-chain.pem";
const KEY: &str = "key.pem";
const ROOT_CERT: &str = "root-cert.pem";

/// The client driver of `kind` (tests/security/).
fn script(kind: Released) -> PathBuf {
    let name = match kind {
        Released::Grpcio => "secure.py",
        Released::GrpcJs => "secure.js",
    };
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/security")
        .join(name)
}

/// The shipped example server of `kind` (examples/security/, what docs/security.md runs).
fn example_server(kind: Released) -> PathBuf {
    let name = match kind {
        Released::Grpcio => "server.py",
        Released::GrpcJs => "server.js",
    };
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/security")
        .join(name)
}

/// A workload's identity on disk: the directory `dubbo-cp agent` keeps its files in, and the
/// agent itself (stopped when dropped).
pub struct Workload {
    pub dir: PathBuf,
    pub namespace: String,
    agent: Child,
}

impl Workload {
    /// Starts `dubbo-cp agent` for the holder of `token` (a token-file entry) against the CA on
    /// the gRPC port `grpc`, and waits for its files.
    pub async fn start(
        root: &Path,
        name: &str,
        namespace: &str,
        token: &str,
        grpc: std::net::SocketAddr,
        extra: &[String],
    ) -> Workload {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, token).unwrap();
        let out = dir.join("certs");
        let agent = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .arg("agent")
            .arg("--out")
            .arg(&out)
            .arg("--ca-address")
            .arg(format!("http://{grpc}"))
            .arg("--token-file")
            .arg(&token_file)
            .args(extra)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let workload = Workload {
            dir: out,
            namespace: namespace.to_owned(),
            agent,
        };
        workload.wait_for_files().await;
        workload
    }

    async fn wait_for_files(&self) {
        for _ in 0..600 {
            if [CERT_CHAIN, KEY, ROOT_CERT]
                .iter()
                .all(|f| self.dir.join(f).is_file())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the agent wrote no certificate in {}", self.dir.display());
    }

    pub fn certificate(&self) -> String {
        std::fs::read_to_string(self.dir.join(CERT_CHAIN)).unwrap()
    }

    /// The xDS bootstrap of this workload: the TLS port at `tls` with its own certificate (the
    /// control plane knows it by its SPIFFE ID), the certificate provider on the agent's
    /// directory, re-read every `refresh`.
    pub fn bootstrap(&self, tls: std::net::SocketAddr, node: &str, refresh: &str) -> String {
        let file = |name: &str| self.dir.join(name).to_str().unwrap().to_owned();
        self.bootstrap_with(
            &[
                "--xds-server",
                &format!("localhost:{}", tls.port()),
                "--ca-file",
                &file(ROOT_CERT),
                "--cert-file",
                &file(CERT_CHAIN),
                "--key-file",
                &file(KEY),
            ],
            node,
            refresh,
        )
    }

    /// The same, reaching the plain xDS port (the agent's proxy) at `xds` with no credentials
    /// (grpc-js reads no other channel credentials).
    pub fn plain_bootstrap(&self, xds: std::net::SocketAddr, node: &str, refresh: &str) -> String {
        self.bootstrap_with(&["--xds-server", &xds.to_string()], node, refresh)
    }

    fn bootstrap_with(&self, server: &[&str], node: &str, refresh: &str) -> String {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
            .arg("bootstrap")
            .args(server)
            .args(["-n", &self.namespace, "--node-id", node])
            .args(["--certificates", self.dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let mut bootstrap: Value = serde_json::from_slice(&output.stdout).unwrap();
        bootstrap["certificate_providers"]["default"]["config"]["refresh_interval"] =
            Value::from(refresh);
        bootstrap.to_string()
    }
}

/// A process of `secure.py` or `secure.js`, stopped when dropped.
pub struct Proc(pub crate::released::Proc);

impl Proc {
    fn spawn(kind: Released, args: &[&str], env: &[(&str, String)]) -> Proc {
        Proc(crate::released::Proc::spawn_script(
            kind,
            &script(kind),
            args,
            env,
        ))
    }

    /// The next line; a process that says nothing for 3 minutes fails the test.
    pub async fn line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(180), self.0.line())
            .await
            .expect("an answer within 3 minutes")
    }

    async fn ask(&mut self, command: &str) -> Value {
        self.0
            .stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        let line = self.line().await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// `n` calls of `method`: how many ended with each code, and the peers the server saw.
    pub async fn call(&mut self, n: usize, method: &str) -> Value {
        self.ask(&format!("call {n} {method}")).await
    }

    /// `n` calls of `method`, `pause_ms` apart.
    pub async fn call_paced(&mut self, n: usize, method: &str, pause_ms: u64) -> Value {
        self.ask(&format!("call {n} {method} {pause_ms}")).await
    }

    /// Calls `method` until `outcome` (`OK` or a code name) comes `run` times in a row: a
    /// client applies what it acknowledged a moment later, and a server drains its old
    /// connections, so a test settles before it counts.
    pub async fn settle(&mut self, outcome: &str, run: usize, method: &str) -> u64 {
        let settled = self.ask(&format!("settle {outcome} {run} {method}")).await;
        assert_eq!(
            settled["settled"], true,
            "never {outcome} on {method}: {settled}"
        );
        settled["calls"].as_u64().unwrap()
    }
}

/// An xDS-enabled server answering `name` on `127.0.0.1:port`, configured by `bootstrap`;
/// returns once it was started (it serves when its listener arrives).
pub async fn server(
    kind: Released,
    name: &str,
    port: u16,
    bootstrap: String,
    env: &[(&str, String)],
) -> Proc {
    let mut all = vec![("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap)];
    all.extend(env.iter().cloned());
    let port = port.to_string();
    let mut proc = Proc(crate::released::Proc::spawn_script(
        kind,
        &example_server(kind),
        &["127.0.0.1", &port, name],
        &all,
    ));
    let line = proc.line().await;
    assert!(line.contains(" started on "), "{line}");
    proc
}

/// A client of `target`, with xDS credentials (`mode` "xds") or none ("plain").
pub fn client(kind: Released, target: &str, mode: &str, bootstrap: String) -> Proc {
    Proc::spawn(
        kind,
        &["client", target, mode],
        &[("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap)],
    )
}

/// A port nothing listens on now, for a server that must know its port before it binds (the
/// listener it asks for is named by it).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

pub fn count(result: &Value, code: &str) -> u64 {
    result[code].as_u64().unwrap_or(0)
}

/// The admin token of the tests' token files.
pub const ADMIN: &str = "admin-token";

/// Applies `manifest` through the admin API as [`ADMIN`].
pub async fn apply(admin: std::net::SocketAddr, manifest: &str) {
    let (status, body) =
        crate::common::http_send(admin, "POST", "/api/v1/apply", manifest, Some(ADMIN)).await;
    assert_eq!(status, 200, "{body}");
}

/// The greeter of namespace shop (host `greeter`, port 7070) served on 127.0.0.1:`port`: the
/// address its xDS-enabled server binds, by which its listener is found.
pub fn greeter_entry(port: u16) -> String {
    format!(
        "apiVersion: dubbo.apache.org/v1alpha1
kind: ServiceEntry
metadata: {{name: greeter, namespace: shop}}
spec:
  hosts: [greeter]
  ports: [{{number: 7070, name: grpc, protocol: GRPC}}]
  endpoints: [{{address: 127.0.0.1, ports: {{grpc: {port}}}, labels: {{app: greeter}}}}]
"
    )
}
