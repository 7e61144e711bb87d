//! Helpers shared by the integration tests: a real server on 127.0.0.1:0, real gRPC clients,
//! a tiny HTTP client for the admin port, and the real binary as a child process.
#![allow(dead_code)]
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod apiserver;
pub mod browser;
pub mod gates;
pub mod kube_local;
pub mod sa_tokens;
pub mod walkthrough;
pub mod xds;
pub mod zookeeper;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dubbo_cp::admin::MappingView;
use dubbo_cp::config::Config;
use dubbo_cp::pb::snp::ServiceMappingRequest;
use dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use dubbo_cp::server::{self, RunningServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

pub type Mappings = BTreeMap<(String, String), BTreeSet<String>>;

pub fn test_config(data_dir: &Path) -> Config {
    Config {
        grpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: data_dir.to_path_buf(),
        tls: dubbo_cp::config::TlsConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..dubbo_cp::config::TlsConfig::default()
        },
        webhook: dubbo_cp::config::WebhookConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..dubbo_cp::config::WebhookConfig::default()
        },
        xds: dubbo_cp::config::XdsConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..dubbo_cp::config::XdsConfig::default()
        },
        ..Config::default()
    }
}

/// [`test_config`] with every registration flushed on its own (debounce off), so tests wait on
/// the publication, not on a timer.
pub fn undebounced_config(data_dir: &Path) -> Config {
    let mut config = test_config(data_dir);
    config.debounce.enable = false;
    config
}

/// [`test_config`] in Kubernetes mode against the API server at `api_url` (the fixture), with a
/// short shutdown grace.
pub fn kubernetes_config(data_dir: &Path, api_url: String) -> Config {
    let mut config = test_config(data_dir);
    config.mode = dubbo_cp::config::Mode::Kubernetes;
    config.kubernetes.api_server = Some(api_url);
    config.shutdown_grace = Duration::from_secs(2);
    // Only the canary tests (tests/canary.rs) run the canary controller: elsewhere its Lease
    // and watches would be requests the tests do not count on.
    config.canary.enabled = false;
    config
}

/// Kubernetes mode with the canary controller, as the canary tests run it: quick debounce, no
/// TokenReview, the Prometheus at `prometheus` (a URL), queries bounded at 2 s and a 2 s lease.
pub fn canary_config(data_dir: &Path, api_url: String, prometheus: String) -> Config {
    let mut config = kubernetes_config(data_dir, api_url);
    config.debounce.after = Duration::from_millis(10);
    config.debounce.max = Duration::from_millis(50);
    config.auth.token_review = Some(false);
    config.canary.enabled = true;
    config.canary.prometheus = Some(prometheus);
    config.canary.query_timeout = Duration::from_secs(2);
    config.canary.lease_duration = Duration::from_secs(2);
    config
}

/// `dubbo-cp bootstrap` for a client of the xDS server at `xds` in `namespace` as `node`: the
/// JSON a gRPC client reads from `GRPC_XDS_BOOTSTRAP_CONFIG`.
pub fn bootstrap(xds: &str, namespace: &str, node: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args([
            "bootstrap",
            "--xds-server",
            xds,
            "-n",
            namespace,
            "--node-id",
            node,
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// An HTTP/1.1 response read to its end: the status code (0 if unreadable) and the body.
pub fn parse_http_response(response: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

pub async fn start(config: Config) -> RunningServer {
    server::start(config).await.expect("server did not start")
}

pub async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("cannot connect to the gRPC port")
}

pub async fn client(addr: SocketAddr) -> ServiceNameMappingServiceClient<Channel> {
    ServiceNameMappingServiceClient::new(channel(addr).await)
}

pub fn request(namespace: &str, application: &str, interfaces: &[&str]) -> ServiceMappingRequest {
    ServiceMappingRequest {
        namespace: namespace.into(),
        application_name: application.into(),
        interface_names: interfaces.iter().map(|s| s.to_string()).collect(),
    }
}

/// A plain HTTP/1.1 GET; returns the status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_send(addr, "GET", path, "", None).await
}

/// A metric's value from `/metrics`, 0 when absent.
pub async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (_, body) = http_get(admin, "/metrics").await;
    body.lines()
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// Waits until `/readyz` answers 200 (within 20 s).
pub async fn wait_ready(admin: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while http_get(admin, "/readyz").await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stored mappings as the admin port reports them.
pub async fn admin_mappings(admin: SocketAddr) -> Mappings {
    admin_mappings_as(admin, None).await
}

/// The same, as the identity of `token` (an admin when authentication is configured).
pub async fn admin_mappings_as(admin: SocketAddr, token: Option<&str>) -> Mappings {
    let (status, body) = http_send(admin, "GET", "/debug/mappings", "", token).await;
    assert_eq!(status, 200, "{body}");
    let views: Vec<MappingView> = serde_json::from_str(&body).expect("bad /debug/mappings body");
    views
        .into_iter()
        .map(|v| {
            (
                (v.namespace, v.interface_name),
                v.application_names.into_iter().collect(),
            )
        })
        .collect()
}

/// The real binary, started with `serve` on ephemeral ports.
pub struct Process {
    pub child: Child,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// Log lines printed after start-up, collected in the background.
    pub logs: std::sync::mpsc::Receiver<String>,
}

/// A test that fails half-way leaves no process behind.
impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `extra` may name a port of its own (`--xds-addr 127.0.0.1:PORT`): that one replaces the
/// ephemeral default.
pub fn spawn_binary(data_dir: &Path, extra: &[&str]) -> Process {
    let ports = [
        "--grpc-addr",
        "--admin-addr",
        "--tls-addr",
        "--webhook-addr",
        "--xds-addr",
    ]
    .into_iter()
    .filter(|flag| !extra.contains(flag))
    .flat_map(|flag| [flag, "127.0.0.1:0"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .arg("serve")
        .args(ports)
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("cannot spawn dubbo-cp");
    let stdout = child.stdout.take().expect("no stdout");
    let (tx, logs) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let line = loop {
        let line = logs
            .recv_timeout(Duration::from_secs(30))
            .expect("dubbo-cp did not report serving");
        if line.contains("dubbo-cp serving") {
            break line;
        }
    };
    let field = |name: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{name}=")))
            .and_then(|value| value.parse().ok())
            .expect("no {name} in {line:?}")
    };
    Process {
        grpc_addr: field("grpc_addr"),
        admin_addr: field("admin_addr"),
        child,
        logs,
    }
}

/// A data-plane client on one discovery stream.
pub struct Observer {
    requests: tokio::sync::mpsc::Sender<dubbo_cp::pb::dds::ObserveRequest>,
    responses: tonic::Streaming<dubbo_cp::dds::ObserveResponse>,
}

pub const SNP_TYPE: &str = "dubbo.apache.org/v1alpha1/ServiceNameMapping";
pub const TAG_TYPE: &str = "dubbo.apache.org/v1alpha1/TagRoute";

impl Observer {
    pub async fn connect(channel: Channel) -> Result<Observer, tonic::Status> {
        Observer::connect_as(channel, None).await
    }

    /// A stream that sends `authorization: Bearer <token>` when `token` is given.
    pub async fn connect_as(
        channel: Channel,
        token: Option<&str>,
    ) -> Result<Observer, tonic::Status> {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let metadata: Vec<(&str, &str)> = bearer
            .iter()
            .map(|value| ("authorization", value.as_str()))
            .collect();
        Observer::connect_with(channel, &metadata).await
    }

    /// A stream that sends these metadata entries.
    pub async fn connect_with(
        channel: Channel,
        metadata: &[(&'static str, &str)],
    ) -> Result<Observer, tonic::Status> {
        let (requests, rx) = tokio::sync::mpsc::channel(16);
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        for (key, value) in metadata {
            request.metadata_mut().insert(*key, value.parse().unwrap());
        }
        let responses = dubbo_cp::pb::dds::rule_service_client::RuleServiceClient::new(channel)
            .observe(request)
            .await?
            .into_inner();
        Ok(Observer {
            requests,
            responses,
        })
    }

    /// A new connection to `addr` with one stream on it; panics if the stream is refused.
    pub async fn open(addr: SocketAddr) -> Observer {
        Observer::connect(channel(addr).await).await.unwrap()
    }

    pub async fn send(&self, nonce: &str, r#type: &str) {
        let request = dubbo_cp::pb::dds::ObserveRequest {
            nonce: nonce.into(),
            r#type: r#type.into(),
        };
        assert!(
            self.requests.send(request).await.is_ok(),
            "request stream closed"
        );
    }

    pub fn responses_mut(&mut self) -> &mut tonic::Streaming<dubbo_cp::dds::ObserveResponse> {
        &mut self.responses
    }

    pub async fn subscribe(&self, r#type: &str) {
        self.send("", r#type).await;
    }

    pub async fn ack(&self, response: &dubbo_cp::dds::ObserveResponse) {
        self.send(&response.nonce, &response.r#type).await;
    }

    /// The next response, within `wait`.
    pub async fn next_within(&mut self, wait: Duration) -> Option<dubbo_cp::dds::ObserveResponse> {
        match tokio::time::timeout(wait, self.responses.message()).await {
            Ok(Ok(response)) => response,
            Ok(Err(status)) => panic!("stream failed: {status}"),
            Err(_) => None,
        }
    }

    pub async fn next(&mut self) -> dubbo_cp::dds::ObserveResponse {
        self.next_within(Duration::from_secs(10))
            .await
            .expect("no response within 10 s")
    }
}

/// The mappings in a response: (namespace-qualified key, interface) -> applications.
pub fn mappings_of(
    response: &dubbo_cp::dds::ObserveResponse,
) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let objects = response.data.decode().expect("bad data");
    objects
        .iter()
        .map(|any| {
            let mapping = dubbo_cp::resources::decode_mapping(any).unwrap();
            let spec = mapping.spec.unwrap_or_default();
            (
                mapping.key,
                (
                    spec.interface_name,
                    spec.application_names.into_iter().collect(),
                ),
            )
        })
        .collect()
}

/// Waits until the index holds `objects` mappings, i.e. what was acknowledged is published.
pub async fn wait_published(server: &RunningServer, objects: usize) {
    let mut rx = server
        .index
        .subscribe(dubbo_cp::index::Kind::ServiceNameMapping);
    let published = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.objects.len() >= objects),
    )
    .await;
    assert!(
        matches!(published, Ok(Ok(_))),
        "{objects} mappings not published within 10 s"
    );
}

/// Waits until the mapping under `key` has `applications` applications.
pub async fn wait_published_apps(server: &RunningServer, key: &str, applications: usize) {
    let mut rx = server
        .index
        .subscribe(dubbo_cp::index::Kind::ServiceNameMapping);
    let published = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| {
            s.objects.get(key).is_some_and(|object| {
                matches!(&object.value, dubbo_cp::index::Resource::Mapping { applications: apps, .. }
                    if apps.len() >= applications)
            })
        }),
    )
    .await;
    assert!(
        matches!(published, Ok(Ok(_))),
        "{key} not published with {applications} applications"
    );
}

/// A plain HTTP/1.1 request with a body (and a bearer token); returns the status and body.
pub async fn http_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}\
         Content-Type: application/yaml\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    parse_http_response(&response)
}

/// The type name clients subscribe to for `kind` (`TagRoute` -> `dubbo.apache.org/v1alpha1/TagRoute`).
pub fn type_of(kind: &str) -> String {
    format!("dubbo.apache.org/v1alpha1/{kind}")
}

/// A program from the distribution: the first of `names` on the PATH, else `package`
/// installed by this setup with apt-get (as root, or with password-less sudo), so a fresh CI
/// machine needs nothing beforehand.
pub fn distribution_binary(names: &[&str], package: &str) -> std::path::PathBuf {
    let find = || {
        names
            .iter()
            .flat_map(|name| {
                std::env::var_os("PATH")
                    .map(|path| {
                        std::env::split_paths(&path)
                            .map(|dir| dir.join(name))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            })
            .find(|path| path.is_file())
    };
    if let Some(path) = find() {
        return path;
    }
    install_package(package, &|| find().is_some());
    find().unwrap_or_else(|| panic!("{package} installed but none of {names:?} is on the PATH"))
}

/// Installs Debian's `package` with apt-get (as root, or with password-less sudo) unless
/// `present` says it is there already.
pub fn install_package(package: &str, present: &dyn Fn() -> bool) {
    // Tests run in parallel, and two apt-gets at once fail on dpkg's lock: one installs at a time
    // in this process, and each waits for a lock another process holds.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _installing = INSTALLING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if present() {
        return;
    }
    let apt = |args: &[&str]| {
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        let mut command = if root {
            std::process::Command::new("apt-get")
        } else {
            let mut sudo = std::process::Command::new("sudo");
            sudo.args(["-n", "apt-get"]);
            sudo
        };
        command
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    {
        // Straight to stderr: a passing test's captured output is not shown.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "installing {package} from the distribution's packages"
        );
    }
    let install = ["install", "-y", "-q", "--no-install-recommends", package];
    if !apt(&install) {
        assert!(apt(&["update", "-q"]), "apt-get update failed");
        assert!(apt(&install), "apt-get install {package} failed");
    }
}

/// The URI SANs (SPIFFE IDs) of a DER certificate.
pub fn uri_sans(der: &[u8]) -> Vec<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::URI(uri) => Some(uri.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}
