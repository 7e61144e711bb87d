//! `dubbo-cp agent`, the real binary as its own process against a real control plane: the three
//! files where gRPC's file_watcher reads them (key 0600, the chain verifying against the roots,
//! the caller's SPIFFE ID), a restart that keeps valid files, re-issuing when the CA bundle
//! changes, renewal before expiry, a rotated root reaching root-cert.pem, and the last files
//! kept byte for byte while the CA refuses or cannot be reached, as /healthz, the metrics and
//! the log say.

// Tests and their helpers: a failure is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{http_get, http_send, metric, start, test_config};
use dubbo_cp::config::Config;
use dubbo_cp::xds::bootstrap::{CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE};
use serde_json::Value;
use tokio::time::Instant;

const SPIFFE: &str = "spiffe://cluster.local/ns/demo/sa/provider";
const TOKENS: &str = "tokens:
  - token: sdk
    namespace: demo
    serviceAccount: provider
  - token: ops-token
    namespace: ops
    identity: ops/admin
";
const ISSUED: &str = "dubbo_cp_agent_certificates_issued_total";

/// A standalone control plane whose static tokens give `sdk` the SPIFFE ID above, issuing
/// certificates valid for `validity`.
fn config(dir: &Path, validity: Duration) -> Config {
    let tokens = dir.join("tokens.yaml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let mut config = test_config(&dir.join("data"));
    config.auth.token_file = Some(tokens);
    config.auth.admins = vec!["ops/admin".into()];
    config.ca.cert_validity = validity;
    // The agents here renew every few seconds; the default pace (1/s, 5 at once) is not what
    // is tested.
    config.ca.issues_per_second = 100.0;
    config.ca.issue_burst = 100;
    config
}

/// Replaces `file` atomically, as a kubelet swaps a projected volume.
fn replace(file: &Path, content: &str) {
    let temporary = file.with_extension("tmp");
    std::fs::write(&temporary, content).unwrap();
    std::fs::rename(&temporary, file).unwrap();
}

/// `dubbo-cp agent` as a child process, its log lines collected.
struct Agent {
    child: Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// Every line read so far.
    log: Vec<String>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"));
    command.arg("agent").args(args).env("RUST_LOG", "info");
    // What the webhook injects must not leak in from the test's environment.
    for var in [
        "DUBBO_CA_ADDRESS",
        "DUBBO_CP_SERVER",
        "DUBBO_CA_CERT_PATH",
        "DUBBO_OIDC_TOKEN",
        "DUBBO_OIDC_TOKEN_TYPE",
        "DUBBO_CP_LOG_FORMAT",
    ] {
        command.env_remove(var);
    }
    command
}

impl Agent {
    fn spawn(args: &[&str]) -> Agent {
        let mut child = agent_command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cannot spawn dubbo-cp agent");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Agent {
            child,
            lines,
            log: Vec::new(),
        }
    }

    /// The first line from now on holding every one of `needles`.
    async fn wait_log(&mut self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!("no line with {needles:?}; log:\n{}", self.log.join("\n"))
                })
                .unwrap_or_else(|| panic!("the agent exited; log:\n{}", self.log.join("\n")));
            self.log.push(line.clone());
            if needles.iter().all(|needle| line.contains(needle)) {
                return line;
            }
        }
    }

    /// The address it serves /metrics and /healthz on.
    async fn metrics_address(&mut self) -> SocketAddr {
        let line = self.wait_log(&["metrics_address="]).await;
        line.split_whitespace()
            .find_map(|word| word.strip_prefix("metrics_address="))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
    }
}

/// The three files, as bytes (empty when missing).
fn files(dir: &Path) -> [Vec<u8>; 3] {
    [CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE]
        .map(|name| std::fs::read(dir.join(name)).unwrap_or_default())
}

fn certificates(pem_bytes: &[u8]) -> Vec<Vec<u8>> {
    pem::parse_many(pem_bytes)
        .unwrap()
        .into_iter()
        .filter(|block| block.tag() == "CERTIFICATE")
        .map(pem::Pem::into_contents)
        .collect()
}

/// The leaf of `cert-chain.pem`: serial, notAfter (unix seconds) and URI SANs.
struct Leaf {
    serial: String,
    not_after: i64,
    uris: Vec<String>,
}

fn leaf(dir: &Path) -> Option<Leaf> {
    let chain = std::fs::read(dir.join(CERT_CHAIN_FILE)).ok()?;
    let der = certificates(&chain).into_iter().next()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let uris = common::uri_sans(&der);
    Some(Leaf {
        serial: cert.tbs_certificate.raw_serial_as_string(),
        not_after: cert.validity().not_after.timestamp(),
        uris,
    })
}

/// Whether the leaf of `cert-chain.pem` is signed by the root `root` (DER).
fn signed_by(dir: &Path, root: &[u8]) -> bool {
    let chain = certificates(&std::fs::read(dir.join(CERT_CHAIN_FILE)).unwrap());
    let (_, cert) = x509_parser::parse_x509_certificate(&chain[0]).unwrap();
    let (_, root) = x509_parser::parse_x509_certificate(root).unwrap();
    cert.issuer() == root.subject() && cert.verify_signature(Some(root.public_key())).is_ok()
}

/// Whether the leaf verifies against one of the roots in `root-cert.pem`.
fn verifies_against_root_cert(dir: &Path) -> bool {
    let roots = certificates(&std::fs::read(dir.join(ROOT_CERT_FILE)).unwrap());
    !roots.is_empty() && roots.iter().any(|root| signed_by(dir, root))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Waits (polling, within `within`) until `done` holds; panics naming `what`.
async fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The same for a condition that needs to ask over HTTP.
async fn until_async<F: Future<Output = bool>>(
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> F,
) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The CA as the admin API shows it (as the admin).
async fn ca_view(admin: SocketAddr) -> Value {
    let (status, body) = http_send(admin, "GET", "/api/v1/ca", "", Some("ops-token")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Every trusted root, PEM, the active one first: what the `dubbo-ca-cert` ConfigMap holds.
async fn bundle(admin: SocketAddr) -> String {
    let view = ca_view(admin).await;
    view["trustPems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pem| pem.as_str().unwrap().to_owned())
        .collect()
}

async fn rotate(admin: SocketAddr) {
    let (status, body) = http_send(admin, "POST", "/api/v1/ca/rotate", "", Some("ops-token")).await;
    assert_eq!(status, 200, "{body}");
}

/// `dubbo-cp agent --once` over the TLS port `tls` (`host:port`), trusting `ca_file`.
fn once_over_tls(out: &Path, tls: &str, ca_file: &Path, token: &Path) -> std::process::Output {
    agent_command(&[
        "--out",
        path(out),
        "--ca-address",
        tls,
        "--ca-cert-file",
        path(ca_file),
        "--token-file",
        path(token),
        "--once",
    ])
    .output()
    .unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_the_files_keeps_them_across_a_restart_and_follows_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), Duration::from_secs(3600))).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "sdk\n").unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, bundle(server.admin_addr).await).unwrap();
    // A directory that does not exist yet.
    let out: PathBuf = dir.path().join("run/certs");

    // --once over TLS (host:port is TLS; the port's certificate names localhost).
    let tls = format!("localhost:{}", server.tls_addr.unwrap().port());
    let once = once_over_tls(&out, &tls, &ca_file, &token);
    assert!(once.status.success(), "{once:?}");
    let stdout = String::from_utf8_lossy(&once.stdout);
    assert!(
        stdout.contains("workload certificate issued") && stdout.contains(SPIFFE),
        "{stdout}"
    );
    let mode = std::fs::metadata(out.join(KEY_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "key.pem is private");
    let first = leaf(&out).unwrap();
    assert_eq!(first.uris, [SPIFFE], "the caller's SPIFFE ID only");
    assert!(verifies_against_root_cert(&out));
    assert_eq!(
        certificates(&std::fs::read(out.join(ROOT_CERT_FILE)).unwrap()),
        certificates(&std::fs::read(&ca_file).unwrap()),
        "root-cert.pem holds the trusted roots"
    );
    assert!((first.not_after - now() - 3600).abs() <= 5);
    let written = files(&out);

    // Started again on valid files: it serves them, and says when it will renew.
    let mut agent = Agent::spawn(&[
        "--out",
        path(&out),
        "--ca-address",
        &format!("http://{}", server.grpc_addr),
        "--ca-cert-file",
        path(&ca_file),
        "--token-file",
        path(&token),
        "--metrics-address",
        "127.0.0.1:0",
        "--poll-interval",
        "200ms",
    ]);
    let metrics = agent.metrics_address().await;
    agent
        .wait_log(&["using the certificate already in the directory", SPIFFE])
        .await;
    let (status, body) = http_get(metrics, "/healthz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(SPIFFE), "{body}");
    assert_eq!(
        metric(metrics, "dubbo_cp_agent_certificate_expiry_seconds").await,
        first.not_after as f64
    );
    assert_eq!(metric(metrics, "dubbo_cp_agent_roots").await, 1.0);

    // A rotation, then the bundle file changes (as the ConfigMap does): issued again at once,
    // from the new root, with both roots trusted.
    rotate(server.admin_addr).await;
    let rotated = bundle(server.admin_addr).await;
    let new_root = certificates(rotated.as_bytes()).remove(0);
    replace(&ca_file, &rotated);
    agent
        .wait_log(&["workload certificate issued", "CA bundle changed"])
        .await;
    let second = leaf(&out).unwrap();
    assert_ne!(second.serial, first.serial);
    assert!(signed_by(&out, &new_root), "issued by the new root");
    let roots = certificates(&std::fs::read(out.join(ROOT_CERT_FILE)).unwrap());
    assert_eq!(roots.len(), 2);
    assert!(roots.contains(&new_root));
    assert_ne!(files(&out), written);
    // One issuance in all: the restart itself asked for nothing.
    assert_eq!(metric(metrics, ISSUED).await, 1.0);
    assert_eq!(metric(metrics, "dubbo_cp_agent_roots").await, 2.0);
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_certificates_are_renewed_before_expiry_and_a_rotated_root_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), Duration::from_secs(4))).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "sdk").unwrap();
    let out = dir.path().join("certs");
    let _agent = Agent::spawn(&[
        "--out",
        path(&out),
        "--ca-address",
        &format!("http://{}", server.grpc_addr),
        "--token-file",
        path(&token),
    ]);
    until("the first certificate", Duration::from_secs(15), || {
        leaf(&out).is_some()
    })
    .await;
    // Each certificate is replaced (new serial) while it is still valid.
    let mut previous = leaf(&out).unwrap();
    for _ in 0..2 {
        let mut replaced = None;
        until("a renewal", Duration::from_secs(10), || {
            replaced = leaf(&out).filter(|l| l.serial != previous.serial);
            replaced.is_some()
        })
        .await;
        assert!(
            now() < previous.not_after,
            "renewed before {} expired",
            previous.serial
        );
        previous = replaced.unwrap();
        assert!(verifies_against_root_cert(&out));
    }
    // A rotation reaches root-cert.pem with the next renewal (no bundle file here).
    let before = bundle(server.admin_addr).await;
    rotate(server.admin_addr).await;
    let new_root = certificates(bundle(server.admin_addr).await.as_bytes()).remove(0);
    assert!(!certificates(before.as_bytes()).contains(&new_root));
    until(
        "the new root in root-cert.pem",
        Duration::from_secs(10),
        || {
            std::fs::read(out.join(ROOT_CERT_FILE))
                .is_ok_and(|roots| certificates(&roots).contains(&new_root))
        },
    )
    .await;
    until(
        "a certificate of the new root",
        Duration::from_secs(10),
        || signed_by(&out, &new_root),
    )
    .await;
    assert!(verifies_against_root_cert(&out));
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_or_unreachable_the_last_files_stay_as_they_are() {
    // Nothing listens there: no files, 503, a warning naming the address.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    let nowhere = format!("http://{closed}");
    let mut lost = Agent::spawn(&[
        "--out",
        path(&empty),
        "--ca-address",
        &nowhere,
        "--metrics-address",
        "127.0.0.1:0",
    ]);
    let lost_metrics = lost.metrics_address().await;
    lost.wait_log(&[
        "no certificate from the CA",
        &nowhere,
        "reason=\"unreachable\"",
    ])
    .await;
    let (status, body) = http_get(lost_metrics, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("missing") && body.contains(&nowhere),
        "{body}"
    );
    assert!(files(&empty).iter().all(Vec::is_empty), "nothing written");

    let server = start(config(dir.path(), Duration::from_secs(4))).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "sdk").unwrap();
    let out = dir.path().join("certs");
    let ca = format!("http://{}", server.grpc_addr);
    let mut agent = Agent::spawn(&[
        "--out",
        path(&out),
        "--ca-address",
        &ca,
        "--token-file",
        path(&token),
        "--metrics-address",
        "127.0.0.1:0",
    ]);
    let metrics = agent.metrics_address().await;
    agent.wait_log(&["workload certificate issued"]).await;
    assert_eq!(http_get(metrics, "/healthz").await.0, 200);

    // A token the CA does not know (the file is read at every request): refused, with the
    // CA's message; the files stay as they were, and go stale.
    replace(&token, "stolen");
    let refused = agent
        .wait_log(&["no certificate from the CA", "refused"])
        .await;
    assert!(
        refused.contains("unauthenticated: invalid token") && refused.contains(&ca),
        "{refused}"
    );
    let kept = files(&out);
    let failures =
        |reason: &str| format!("dubbo_cp_agent_renewal_failures_total{{reason=\"{reason}\"}}");
    until_async(
        "503 once the kept certificate expired",
        Duration::from_secs(10),
        || async {
            let (status, body) = http_get(metrics, "/healthz").await;
            status == 503 && body.contains("expired") && body.contains("invalid token")
        },
    )
    .await;
    until_async("a second refusal", Duration::from_secs(10), || async {
        metric(metrics, &failures("refused")).await >= 2.0
    })
    .await;
    assert_eq!(files(&out), kept, "byte for byte");

    // The right token again: issued, healthy.
    replace(&token, "sdk");
    agent.wait_log(&["workload certificate issued"]).await;
    assert_eq!(http_get(metrics, "/healthz").await.0, 200);

    // The CA goes away: the last files are kept, retries back off.
    assert!(server.stop().await.is_ok());
    let unreachable = ["no certificate from the CA", "reason=\"unreachable\""];
    let first = agent.wait_log(&unreachable).await;
    assert!(first.contains(&format!("ca={ca}")), "{first}");
    let since = Instant::now();
    let kept = files(&out);
    assert!(leaf(&out).is_some());
    for _ in 0..2 {
        let retry = agent.wait_log(&unreachable).await;
        assert!(
            retry.contains(&format!("cannot connect to the CA at {ca}")),
            "{retry}"
        );
    }
    // Jittered doubling from 1 s: the next two retries come after at least 0.5 s + 1 s.
    assert!(
        since.elapsed() >= Duration::from_millis(1400),
        "retried too fast: 2 retries in {:?}",
        since.elapsed()
    );
    assert!(metric(metrics, &failures("unreachable")).await >= 3.0);
    until_async(
        "503 once the kept certificate expired",
        Duration::from_secs(10),
        || async {
            let (status, body) = http_get(metrics, "/healthz").await;
            status == 503 && body.contains("expired") && body.contains("cannot connect")
        },
    )
    .await;
    assert_eq!(files(&out), kept, "byte for byte");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = dir.path().join("out");
    for (args, needles) in [
        (
            vec!["--out", path(&out), "--ca-address", "grpc://ca:1"],
            vec!["--ca-address", "grpc://ca:1"],
        ),
        (
            vec!["--out", path(&out), "--ca-address", "ca.example:30062"],
            vec!["--ca-cert-file", "TLS"],
        ),
        (
            vec!["--out", path(&out), "--ca-address", "http://ca"],
            vec!["--ca-address", "no port"],
        ),
        (vec!["--out", path(&file)], vec!["--out", "not a directory"]),
        (
            vec!["--out", path(&out), "--renew-before", "10"],
            vec!["--renew-before", "unit"],
        ),
        (
            vec!["--out", path(&out), "--metrics-address", "nowhere"],
            vec!["--metrics-address", "nowhere"],
        ),
        (
            vec![
                "--out",
                path(&out),
                "--once",
                "--ca-address",
                "http://127.0.0.1:1",
            ],
            vec!["cannot connect to the CA at http://127.0.0.1:1"],
        ),
    ] {
        let output = agent_command(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        // 2: refused by the argument parser; 1: refused by the agent.
        assert!(
            matches!(output.status.code(), Some(1 | 2)),
            "{args:?}: {output:?}"
        );
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_follows_dubbo_cp_server_and_names_its_settings_when_the_ca_is_away() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), Duration::from_secs(3600))).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "sdk\n").unwrap();
    // The README's moved ports set DUBBO_CP_SERVER (a bare host:port is the plain gRPC port):
    // the agent follows it when no --ca-address or DUBBO_CA_ADDRESS is given.
    let out = dir.path().join("certs");
    let once = agent_command(&["--out", path(&out), "--token-file", path(&token), "--once"])
        .env("DUBBO_CP_SERVER", server.grpc_addr.to_string())
        .output()
        .unwrap();
    assert!(once.status.success(), "{once:?}");
    assert!(out.join(CERT_CHAIN_FILE).is_file());

    // A CA that is not there: the message names the settings that move it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let away = dir.path().join("away");
    let failed = agent_command(&[
        "--out",
        path(&away),
        "--token-file",
        path(&token),
        "--once",
        "--ca-address",
        &address,
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success());
    assert!(
        stderr.contains("--ca-address") && stderr.contains("DUBBO_CA_ADDRESS"),
        "{stderr}"
    );

    // A bootstrap names the agent's files by absolute paths, whatever directory it was made in.
    let bootstrap = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .current_dir(dir.path())
        .args([
            "bootstrap",
            "--xds-server",
            "127.0.0.1:1",
            "--certificates",
            "./certs",
        ])
        .output()
        .unwrap();
    assert!(bootstrap.status.success(), "{bootstrap:?}");
    let json: Value = serde_json::from_slice(&bootstrap.stdout).unwrap();
    let file = json["certificate_providers"]["default"]["config"]["certificate_file"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        Path::new(&file).is_absolute() && file.ends_with("/certs/cert-chain.pem"),
        "{file}"
    );
    server.stop().await.unwrap();
}

/// docs/agent.md's TLS variant as written: `dubbo-cp ca root > ca.pem` against a control plane
/// with a token file and no admin token at hand, then the agent over the TLS port trusting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_steps_of_the_docs_work_without_an_admin_identity() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), Duration::from_secs(3600))).await;
    let root = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["ca", "root", "--admin", &server.admin_addr.to_string()])
        .env_remove("DUBBO_CP_TOKEN")
        .output()
        .unwrap();
    assert!(root.status.success(), "{root:?}");
    let pem = String::from_utf8(root.stdout).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &pem).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "sdk\n").unwrap();
    let out = dir.path().join("certs");
    let tls = format!("localhost:{}", server.tls_addr.unwrap().port());
    let once = once_over_tls(&out, &tls, &ca_file, &token);
    assert!(once.status.success(), "{once:?}");
    assert!(out.join(CERT_CHAIN_FILE).is_file());
    server.stop().await.unwrap();
}
