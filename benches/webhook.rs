//! Admission reviews per second and their latency: a Kubernetes-mode control plane against the
//! API-server fixture, called like the API server calls it (HTTPS, keep-alive connections, one
//! review in flight per connection), with a pod that asks for the CA and a ZooKeeper registry
//! (the most work a review can be). Two loads: as many reviews as 64 connections can send, and
//! a steady 1,000 reviews per second. Prints the numbers; asserts only that every review was
//! answered with a patch.
//!
//! `cargo bench --bench webhook`

#[path = "../tests/common/apiserver.rs"]
mod apiserver;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use apiserver::ApiServer;
use base64::Engine;
use dubbo_cp::config::{Config, Mode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const CONNECTIONS: usize = 64;
const CLOSED_LOOP_REVIEWS: usize = 20_000;
const STEADY_RATE: u64 = 1_000;
const STEADY_SECONDS: u64 = 5;

/// One keep-alive HTTPS connection speaking just enough HTTP/1.1.
struct Connection {
    tls: TlsStream<TcpStream>,
    buffer: Vec<u8>,
}

impl Connection {
    async fn open(addr: SocketAddr, root: &str) -> anyhow::Result<Connection> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pem::parse(root)?.into_contents().into())?;
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("localhost".try_into()?, tcp)
            .await?;
        Ok(Connection {
            tls,
            buffer: Vec::new(),
        })
    }

    /// Sends a review and reads the answer's body.
    async fn review(&mut self, body: &[u8]) -> anyhow::Result<Vec<u8>> {
        let head = format!(
            "POST /mutating-services?timeout=10s HTTP/1.1\r\nHost: localhost\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.tls.write_all(head.as_bytes()).await?;
        self.tls.write_all(body).await?;
        let mut chunk = [0u8; 16 * 1024];
        let header_end = loop {
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let read = self.tls.read(&mut chunk).await?;
            anyhow::ensure!(read > 0, "connection closed");
            self.buffer.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&self.buffer[..header_end]).to_ascii_lowercase();
        anyhow::ensure!(head.starts_with("http/1.1 200"), "answer: {head}");
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .context("no content-length")?;
        while self.buffer.len() < header_end + length {
            let read = self.tls.read(&mut chunk).await?;
            anyhow::ensure!(read > 0, "connection closed");
            self.buffer.extend_from_slice(&chunk[..read]);
        }
        let body = self.buffer[header_end..header_end + length].to_vec();
        self.buffer.drain(..header_end + length);
        Ok(body)
    }
}

fn percentile(samples: &mut [Duration], q: f64) -> f64 {
    samples.sort_unstable();
    let at = ((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1));
    samples.get(at).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Runs `per_connection` reviews on every connection, each waiting for `pace` (if any) before
/// sending; returns the latencies and the wall time.
async fn load(
    connections: Vec<Connection>,
    per_connection: usize,
    pace: Option<Duration>,
    body: Arc<Vec<u8>>,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut connection) in connections.into_iter().enumerate() {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_connection);
            let mut ticks = pace.map(|pace| {
                // Spread the connections over the period so the rate is steady.
                let offset = pace.mul_f64(i as f64 / CONNECTIONS as f64);
                tokio::time::interval_at(tokio::time::Instant::now() + offset, pace)
            });
            for _ in 0..per_connection {
                if let Some(ticks) = ticks.as_mut() {
                    ticks.tick().await;
                }
                let sent = Instant::now();
                let answer = connection.review(&body).await?;
                latencies.push(sent.elapsed());
                let answer: serde_json::Value = serde_json::from_slice(&answer)?;
                anyhow::ensure!(
                    answer["response"]["patch"].is_string(),
                    "no patch: {answer}"
                );
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok((all, started.elapsed()))
}

/// One line of the table: reviews per second, p50, p99 and max in ms, and the count.
fn print_row(label: &str, latencies: &mut [Duration], elapsed: Duration) {
    let count = latencies.len();
    println!(
        "{:<26} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>9}",
        label,
        count as f64 / elapsed.as_secs_f64(),
        percentile(latencies, 0.5),
        percentile(latencies, 0.99),
        percentile(latencies, 1.0),
        count
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let api = ApiServer::start().await;
    api.create_labelled_namespace("demo", json!({"dubbo-ca.inject": "true"}));
    api.put_object(
        "services",
        "demo",
        "zookeeper",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "zookeeper", "labels": {"registry-zookeeper-inject": "true"}}}),
    );
    let dir = tempfile::tempdir()?;
    let config = Config {
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        admin_addr: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        mode: Mode::Kubernetes,
        tls: dubbo_cp::config::TlsConfig {
            addr: ([127, 0, 0, 1], 0).into(),
            ..Config::default().tls
        },
        webhook: dubbo_cp::config::WebhookConfig {
            addr: ([127, 0, 0, 1], 0).into(),
            ..Config::default().webhook
        },
        auth: dubbo_cp::config::AuthConfig {
            token_review: Some(false),
            ..Config::default().auth
        },
        kubernetes: dubbo_cp::config::KubernetesConfig {
            api_server: Some(api.url()),
            ..Config::default().kubernetes
        },
        ..Config::default()
    };
    let server = dubbo_cp::server::start(config).await?;
    let webhook = server.webhook_addr.context("no webhook port")?;
    api.wait_for("the CA's Secret", Duration::from_secs(20), |api| {
        api.object("secrets", "dubbo-system", "dubbo-ca-secret")
            .is_some()
    })
    .await;
    let secret = api
        .object("secrets", "dubbo-system", "dubbo-ca-secret")
        .context("no Secret")?;
    let root = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["cert.pem"].as_str().context("no cert.pem")?)?,
    )?;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "provider-", "namespace": "demo",
                     "labels": {"app": "provider", "registry-zookeeper-inject": "true"}},
        "spec": {"containers": [
            {"name": "app", "image": "provider:1", "env": [{"name": "JAVA_OPTS", "value": "-Xmx1g"}],
             "ports": [{"containerPort": 20880}]},
            {"name": "sidecar", "image": "log:1"}]}});
    let body = Arc::new(serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "operation": "CREATE", "namespace": "demo", "object": pod}}))?);
    // The namespace's label arrives through a watch: wait until a review injects the CA.
    let mut probe = Connection::open(webhook, &root).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer: serde_json::Value = serde_json::from_slice(&probe.review(&body).await?)?;
        let patch = answer["response"]["patch"].as_str().unwrap_or_default();
        let patch = base64::engine::general_purpose::STANDARD.decode(patch)?;
        if String::from_utf8_lossy(&patch).contains("dubbo-ca-token") {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the namespace label never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "# webhook: {CONNECTIONS} keep-alive HTTPS connections, one review in flight each, pod with CA + ZooKeeper injection, {} bytes per review, {cpus} cpus",
        body.len()
    );
    println!(
        "{:<26} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "load", "reviews/s", "p50_ms", "p99_ms", "max_ms", "reviews"
    );
    let mut open = Vec::new();
    for _ in 0..CONNECTIONS {
        open.push(Connection::open(webhook, &root).await?);
    }
    let (mut latencies, elapsed) =
        load(open, CLOSED_LOOP_REVIEWS / CONNECTIONS, None, body.clone()).await?;
    print_row("64 in flight (max rate)", &mut latencies, elapsed);
    let mut open = Vec::new();
    for _ in 0..CONNECTIONS {
        open.push(Connection::open(webhook, &root).await?);
    }
    let per_connection = (STEADY_RATE * STEADY_SECONDS) as usize / CONNECTIONS;
    let pace = Duration::from_secs_f64(CONNECTIONS as f64 / STEADY_RATE as f64);
    let (mut latencies, elapsed) = load(open, per_connection, Some(pace), body.clone()).await?;
    print_row("steady 1,000/s", &mut latencies, elapsed);
    server.stop().await?;
    Ok(())
}
