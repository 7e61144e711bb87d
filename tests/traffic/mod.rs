//! Real traffic and real metrics for the canary tests: Dubbo providers on loopback (one process
//! per pod, released grpcio, exporting Dubbo's provider metrics), a client that calls the whole
//! run and counts who answered, and Debian's Prometheus scraping the providers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use dubbo_cp::canary::http::HttpClient;
use dubbo_cp::canary::prometheus::{Endpoint, QueryError};
use dubbo_cp::canary::template::Credentials;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

pub mod sdk;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/traffic/provider.py")
}

/// A process of the script, stopped when dropped.
pub struct Proc {
    pub child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    fn spawn(args: &[&str], env: &[(&str, String)]) -> Proc {
        let mut command = Command::new(crate::released::python());
        command
            .arg(script())
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

    /// The next line; a process that says nothing for 5 minutes fails the test rather than
    /// hanging it (a client whose calls each time out after 10 s would take hours).
    async fn line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(300), self.lines.next_line())
            .await
            .expect("an answer within 5 minutes")
            .unwrap()
            .expect("a line")
    }

    async fn ask(&mut self, command: &str) -> Value {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        serde_json::from_str(&self.line().await).unwrap()
    }
}

/// How a build behaves: the share of calls it fails (gRPC INTERNAL) and how slow each call is.
#[derive(Clone, Copy, Debug, Default)]
pub struct Build {
    pub fail_percent: u32,
    pub delay_ms: u32,
}

/// One pod's provider: answers `name` on `host` (a loopback address playing the pod's IP).
pub struct Provider {
    _proc: Proc,
    pub grpc_port: u16,
    pub metrics_port: u16,
}

impl Provider {
    pub async fn start(name: &str, host: &str, application: &str, build: Build) -> Provider {
        let mut proc = Proc::spawn(
            &[
                "provider",
                name,
                host,
                application,
                &build.fail_percent.to_string(),
                &build.delay_ms.to_string(),
            ],
            &[],
        );
        let line = proc.line().await;
        let (grpc, metrics) = line.trim().split_once(' ').expect("two ports");
        Provider {
            _proc: proc,
            grpc_port: grpc.parse().unwrap(),
            metrics_port: metrics.parse().unwrap(),
        }
    }
}

/// A released grpcio client calling `target` over xDS from its first command on.
pub struct Client(Proc);

impl Client {
    pub fn start(target: &str, bootstrap: String) -> Client {
        Client(Proc::spawn(
            &["client", target],
            &[("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap)],
        ))
    }

    /// A client calling `addresses` directly (`host:port`, round robin), as a load tester
    /// points at a canary's pods.
    pub fn direct(addresses: &[String]) -> Client {
        Client(Proc::spawn(
            &["client", &format!("ipv4:{}", addresses.join(","))],
            &[],
        ))
    }

    /// Who answered the next `n` calls (`injected`: the build's failures; `error`: any other).
    pub async fn count(&mut self, n: usize) -> Value {
        self.count_with(n, "").await
    }

    /// The same, each call with `metadata` (`key=value` words), as the calls after it.
    pub async fn count_with(&mut self, n: usize, metadata: &str) -> Value {
        self.0.ask(&format!("count {n} {metadata}")).await
    }

    /// Waits until `who` answered `run` calls in a row.
    pub async fn settle(&mut self, who: &str, run: usize) {
        self.settle_with(who, run, "").await;
    }

    /// The same, each call with `metadata`, as the calls after it.
    /// Returns how many calls it took.
    pub async fn settle_with(&mut self, who: &str, run: usize, metadata: &str) -> u64 {
        let settled = self.0.ask(&format!("settle {who} {run} {metadata}")).await;
        assert_eq!(settled["settled"], true, "{who} never answered: {settled}");
        settled["calls"].as_u64().unwrap()
    }

    /// The counts over every call so far.
    pub async fn totals(&mut self) -> Value {
        self.0.ask("totals").await
    }

    /// Starts the totals afresh.
    pub async fn reset_totals(&mut self) {
        self.0.ask("reset").await;
    }
}

pub fn answers(counts: &Value, who: &str) -> u64 {
    counts[who].as_u64().unwrap_or(0)
}

/// How Prometheus's web server is reached: https with a certificate for 127.0.0.1 from a test
/// CA, and basic auth (the password stored as a bcrypt hash, as Prometheus wants it).
pub struct WebConfig {
    pub ca_pem: String,
    cert_pem: String,
    key_pem: String,
    pub username: String,
    pub password: String,
}

impl WebConfig {
    pub fn generate(username: &str, password: &str) -> WebConfig {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let cert = server.signed_by(&key, &issuer).unwrap();
        WebConfig {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            username: username.to_owned(),
            password: password.to_owned(),
        }
    }
}

/// Debian's Prometheus on 127.0.0.1, scraping every second the targets the test names in a
/// file (service discovery by file, as Kubernetes' discovery would name each pod); killed when
/// dropped.
pub struct Prometheus {
    process: std::process::Child,
    pub addr: SocketAddr,
    /// Where queries go and with which credentials.
    pub endpoint: Endpoint,
    client: dubbo_cp::canary::prometheus::Prometheus,
    targets: PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Prometheus {
    pub fn start(web: Option<&WebConfig>) -> Prometheus {
        let binary = crate::common::distribution_binary(&["prometheus"], "prometheus");
        let dir = tempfile::tempdir().unwrap();
        let targets = dir.path().join("targets.json");
        std::fs::write(&targets, "[]").unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 scrape_configs:\n\
                 - job_name: dubbo\n  file_sd_configs:\n  - files: ['{}']\n    refresh_interval: 1s\n",
                targets.display()
            ),
        )
        .unwrap();
        let addr = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap()
        };
        let mut command = std::process::Command::new(binary);
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let (endpoint, roots) = match web {
            None => (Endpoint::plain(&format!("http://{addr}")), None),
            Some(web) => {
                command.arg(format!(
                    "--web.config.file={}",
                    write_web_config(dir.path(), web).display()
                ));
                let endpoint = Endpoint {
                    address: format!("https://{addr}"),
                    credentials: Some(Credentials::Basic {
                        username: web.username.clone(),
                        password: web.password.clone(),
                    }),
                    insecure: false,
                };
                (endpoint, Some(web.ca_pem.as_bytes()))
            }
        };
        Prometheus {
            process: command.spawn().unwrap(),
            addr,
            endpoint,
            client: dubbo_cp::canary::prometheus::Prometheus::new(
                HttpClient::with_roots(roots).unwrap(),
            ),
            targets,
            dir,
        }
    }

    /// Names the scrape targets: (metrics address, pod name, namespace). Written whole and
    /// renamed into place, so Prometheus never reads half a file.
    pub fn set_targets(&self, targets: &[(SocketAddr, String, String)]) {
        let groups: Vec<Value> = targets
            .iter()
            .map(|(addr, pod, namespace)| {
                json!({"targets": [addr.to_string()],
                       "labels": {"pod": pod, "namespace": namespace}})
            })
            .collect();
        let partial = self.dir.path().join("targets.json.new");
        std::fs::write(&partial, serde_json::to_vec(&groups).unwrap()).unwrap();
        std::fs::rename(&partial, &self.targets).unwrap();
    }
}

fn write_web_config(dir: &Path, web: &WebConfig) -> PathBuf {
    let cert = dir.join("web.crt");
    let key = dir.join("web.key");
    std::fs::write(&cert, &web.cert_pem).unwrap();
    std::fs::write(&key, &web.key_pem).unwrap();
    // The lowest cost bcrypt allows: Prometheus checks the hash on every request.
    let hash = bcrypt::hash(&web.password, 4).unwrap();
    let config = dir.join("web.yml");
    std::fs::write(
        &config,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n\
             basic_auth_users:\n  {}: '{}'\n",
            cert.display(),
            key.display(),
            web.username,
            hash
        ),
    )
    .unwrap();
    config
}

impl Prometheus {
    /// Runs `query` on `endpoint` (this Prometheus's, or another way in).
    pub async fn query_at(&self, endpoint: &Endpoint, query: &str) -> Result<f64, QueryError> {
        self.client
            .query(endpoint, query, Duration::from_secs(2))
            .await
    }

    /// Waits until `query` gives a value `check` accepts. Polls: an outside process says
    /// nothing when it has scraped.
    pub async fn wait_for_value(&self, query: &str, check: impl Fn(f64) -> bool) -> f64 {
        let mut last = None;
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let answer = self.query_at(&self.endpoint, query).await;
                if let Ok(value) = &answer
                    && check(*value)
                {
                    return *value;
                }
                last = Some(answer);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        waited.unwrap_or_else(|_| panic!("{query} never had the value wanted; last {last:?}"))
    }
}
