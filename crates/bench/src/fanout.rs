//! Fan-out: the real `dubbo-cp` binary in its own process (so its memory is its own), N streams
//! over a bounded number of connections, one registration, and the time until every stream has
//! it. Debounce is off in the server, so the time measured starts at the durable ack and is the
//! push itself.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dubbo_cp::pb::dds::ObserveRequest;
use dubbo_cp::pb::snp::ServiceMappingRequest;
use dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use prost::bytes::Buf;
use prost::encoding;
use tokio::sync::{Barrier, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

use super::FanoutArgs;
use super::load::{ms, percentiles};

const SNP_TYPE: &str = "dubbo.apache.org/v1alpha1/ServiceNameMapping";

pub struct ServerProcess {
    pub child: Child,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The xDS port, when xDS is on.
    pub xds_addr: Option<SocketAddr>,
    _data_dir: tempfile::TempDir,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn_server() -> anyhow::Result<ServerProcess> {
    spawn_server_in(tempfile::tempdir()?, &["--debounce-enable", "false"])
}

/// The real binary serving `data_dir` with `extra` flags; returns once it reports serving.
pub fn spawn_server_in(
    data_dir: tempfile::TempDir,
    extra: &[&str],
) -> anyhow::Result<ServerProcess> {
    let (child, grpc_addr, admin_addr, xds_addr) = spawn_process(data_dir.path(), extra)?;
    Ok(ServerProcess {
        child,
        grpc_addr,
        admin_addr,
        xds_addr,
        _data_dir: data_dir,
    })
}

impl ServerProcess {
    /// Stops the server (SIGTERM, as an orchestrator does) and starts it again on the same
    /// data with `extra` flags (its ports, to come back where clients reconnect).
    pub fn restart(mut self, extra: &[&str]) -> anyhow::Result<ServerProcess> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        self.child.wait()?;
        let (child, grpc_addr, admin_addr, xds_addr) = spawn_process(self._data_dir.path(), extra)?;
        self.child = child;
        self.grpc_addr = grpc_addr;
        self.admin_addr = admin_addr;
        self.xds_addr = xds_addr;
        Ok(self)
    }
}

/// Listening addresses every server gets unless `extra` names them: any free port.
const DEFAULT_ADDRS: [&str; 5] = [
    "--grpc-addr",
    "--admin-addr",
    "--tls-addr",
    "--webhook-addr",
    "--xds-addr",
];

type Spawned = (Child, SocketAddr, SocketAddr, Option<SocketAddr>);

fn spawn_process(data_dir: &std::path::Path, extra: &[&str]) -> anyhow::Result<Spawned> {
    let binary = std::env::current_exe()?.with_file_name("dubbo-cp");
    let mut command = Command::new(&binary);
    command.arg("serve");
    for flag in DEFAULT_ADDRS.iter().filter(|flag| !extra.contains(flag)) {
        command.args([flag, "127.0.0.1:0"]);
    }
    let mut child = command
        .args([
            "--new-streams-per-second",
            "1000000",
            "--new-streams-burst",
            "1000000",
        ])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "warn,dubbo_cp::server=info")
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "cannot start {} (build it with cargo build --release)",
                binary.display()
            )
        })?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let (grpc_addr, admin_addr, xds_addr) = loop {
        let Some(line) = lines.next() else {
            bail!("dubbo-cp exited before serving")
        };
        let line = line?;
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(name))
                .and_then(|addr| addr.parse::<SocketAddr>().ok())
        };
        if let (Some(grpc), Some(admin)) = (field("grpc_addr="), field("admin_addr=")) {
            break (grpc, admin, field("xds_addr="));
        }
    };
    // Keep draining its output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((child, grpc_addr, admin_addr, xds_addr))
}

/// Whether `/readyz` on `admin` answers 200.
pub async fn readyz(admin: SocketAddr) -> anyhow::Result<bool> {
    Ok(admin_get(admin, "/readyz")
        .await?
        .starts_with("HTTP/1.1 200"))
}

/// The whole HTTP/1.1 response (status line, headers, body) to `GET path` on `admin`.
pub async fn admin_get(admin: SocketAddr, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .context("no VmRSS")
}

/// CPU time (user + system) a process has used, in seconds.
pub fn cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    Ok((ticks(11) + ticks(12)) / 100.0)
}

/// One fan-out measurement.
pub struct FanoutResult {
    pub streams: usize,
    pub connect: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub rss_per_stream_kib: f64,
    pub server_cpu: f64,
    pub client_cpu: f64,
    pub received: usize,
    /// `GET /debug/clients` with every stream open (issue 13), and its size.
    pub status_read: Duration,
    pub status_bytes: usize,
    /// `GET /metrics` then (walks every stream for `dds_streams_not_synced`).
    pub scrape: Duration,
}

pub async fn run(args: FanoutArgs) -> anyhow::Result<()> {
    println!(
        "# dubbo-cp-bench fanout: {} mappings in every state, {} streams per connection, debounce off",
        args.mappings, args.streams_per_connection
    );
    println!(
        "{:>8} {:>10} {:>9} {:>9} {:>9} {:>12} {:>13} {:>13} {:>12} {:>10} {:>10} {:>9}",
        "streams",
        "connect_s",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "rss_per_kib",
        "server_cpu_ms",
        "client_cpu_ms",
        "received",
        "status_ms",
        "status_kib",
        "scrape_ms"
    );
    for &streams in &args.streams {
        let r = measure(streams, args.streams_per_connection, args.mappings).await?;
        println!(
            "{:>8} {:>10.2} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>13.0} {:>13.0} {:>12} {:>10.1} {:>10.0} {:>9.1}",
            r.streams,
            r.connect.as_secs_f64(),
            ms(r.p50),
            ms(r.p99),
            ms(r.max),
            r.rss_per_stream_kib,
            r.server_cpu * 1000.0,
            r.client_cpu * 1000.0,
            format!("{}/{}", r.received, r.streams),
            ms(r.status_read),
            r.status_bytes as f64 / 1024.0,
            ms(r.scrape)
        );
    }
    Ok(())
}

/// Starts a server with `mappings` stored, opens `streams` streams, pushes one change.
pub async fn measure(
    streams: usize,
    streams_per_connection: usize,
    mappings: usize,
) -> anyhow::Result<FanoutResult> {
    let server = spawn_server()?;
    let addr = format!("http://{}", server.grpc_addr);
    let mut sdk =
        ServiceNameMappingServiceClient::new(Channel::from_shared(addr.clone())?.connect().await?);
    for i in 0..mappings {
        sdk.register_service_app_mapping(ServiceMappingRequest {
            namespace: "bench".into(),
            application_name: "seed".into(),
            interface_names: vec![format!("org.apache.dubbo.bench.Seed{i}")],
        })
        .await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_kib(server.child.id())?;

    let mut open = open_streams(&addr, streams, streams_per_connection, SNP_TYPE, |_| None).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_kib(server.child.id())?;

    let server_pid = server.child.id().to_string();
    let server_cpu = cpu_seconds(&server_pid)?;
    let client_cpu = cpu_seconds("self")?;
    sdk.register_service_app_mapping(ServiceMappingRequest {
        namespace: "bench".into(),
        application_name: "the-change".into(),
        interface_names: vec!["org.apache.dubbo.bench.Changed".into()],
    })
    .await?;
    let acked = Instant::now();
    let latencies = collect_latencies(&mut open, streams, acked).await;
    let server_cpu = cpu_seconds(&server_pid)? - server_cpu;
    let client_cpu = cpu_seconds("self")? - client_cpu;
    // What an operator's look costs with every stream open.
    let started = Instant::now();
    let (_, status) = admin_request(server.admin_addr, "GET", "/debug/clients", "").await?;
    let status_read = started.elapsed();
    let started = Instant::now();
    admin_request(server.admin_addr, "GET", "/metrics", "").await?;
    let scrape = started.elapsed();
    drop(server);
    let mut result = open.finish(
        latencies,
        rss_after.saturating_sub(rss_before),
        server_cpu,
        client_cpu,
    );
    result.status_read = status_read;
    result.status_bytes = status.len();
    result.scrape = scrape;
    Ok(result)
}

/// What the load generator reads of a response: the head. The state bytes are received but
/// skipped, so the generator's own decoding does not compete with the server for the CPUs.
#[derive(Debug, Default)]
struct ResponseHead {
    nonce: String,
    r#type: String,
}

struct HeadDecoder;

impl Decoder for HeadDecoder {
    type Item = ResponseHead;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<ResponseHead>, Status> {
        let mut head = ResponseHead::default();
        let bad = |err: prost::DecodeError| Status::internal(err.to_string());
        while buf.has_remaining() {
            let (tag, wire_type) = encoding::decode_key(buf).map_err(bad)?;
            let ctx = encoding::DecodeContext::default();
            match tag {
                1 => encoding::string::merge(wire_type, &mut head.nonce, buf, ctx).map_err(bad)?,
                2 => encoding::string::merge(wire_type, &mut head.r#type, buf, ctx).map_err(bad)?,
                _ => encoding::skip_field(wire_type, tag, buf, ctx).map_err(bad)?,
            }
        }
        Ok(Some(head))
    }
}

#[derive(Clone, Copy, Default)]
struct HeadOnlyCodec;

impl Codec for HeadOnlyCodec {
    type Encode = ObserveRequest;
    type Decode = ResponseHead;
    type Encoder = <ProstCodec<ObserveRequest, ObserveRequest> as Codec>::Encoder;
    type Decoder = HeadDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<ObserveRequest, ObserveRequest>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        HeadDecoder
    }
}

/// Subscribes to `type` (with a bearer token when given), acknowledges the first state,
/// reports when the next one arrives, and then holds the stream open until aborted.
async fn observe_as(
    channel: Channel,
    r#type: &str,
    token: Option<String>,
    subscribed: Arc<Barrier>,
    received: mpsc::UnboundedSender<Instant>,
) -> anyhow::Result<()> {
    let (requests, rx) = mpsc::channel(4);
    let subscribe = ObserveRequest {
        nonce: String::new(),
        r#type: r#type.into(),
    };
    requests.send(subscribe).await?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static(dubbo_cp::dds::OBSERVE_PATH);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
    }
    let mut responses = grpc
        .streaming(request, path, HeadOnlyCodec)
        .await?
        .into_inner();
    let first = responses.message().await?.context("stream ended")?;
    requests
        .send(ObserveRequest {
            nonce: first.nonce,
            r#type: first.r#type,
        })
        .await?;
    subscribed.wait().await;
    let next = responses.message().await?.context("stream ended")?;
    let _ = received.send(Instant::now());
    requests
        .send(ObserveRequest {
            nonce: next.nonce,
            r#type: next.r#type,
        })
        .await?;
    std::future::pending::<()>().await;
    Ok(())
}

/// One rule change fanned out to `streams` clients in `namespaces` namespaces that each see
/// their own namespace's authentication policies (`policies` in all) plus the root namespace's.
pub async fn measure_rules(
    streams: usize,
    streams_per_connection: usize,
    namespaces: usize,
    policies: usize,
) -> anyhow::Result<(FanoutResult, f64)> {
    let data_dir = tempfile::tempdir()?;
    let mut tokens = String::from(
        "tokens:\n  - {token: admin-token, namespace: dubbo-system, identity: admin}\n",
    );
    for ns in 0..namespaces {
        tokens.push_str(&format!("  - {{token: token-{ns}, namespace: ns-{ns}}}\n"));
    }
    let token_file = data_dir.path().join("tokens.yaml");
    std::fs::write(&token_file, tokens)?;
    let token_path = token_file.to_string_lossy().into_owned();
    let server = spawn_server_in(
        data_dir,
        &[
            "--debounce-enable",
            "false",
            "--token-file",
            &token_path,
            "--auth-admins",
            "admin",
        ],
    )?;
    let mut manifests = String::new();
    for i in 0..policies {
        manifests.push_str(&format!(
            "---\napiVersion: dubbo.apache.org/v1alpha1\nkind: AuthenticationPolicy\nmetadata: {{name: p{i}, namespace: ns-{}}}\nspec: {{action: STRICT}}\n",
            i % namespaces.max(1)
        ));
    }
    admin_post(server.admin_addr, "/api/v1/apply", &manifests).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_kib(server.child.id())?;
    let addr = format!("http://{}", server.grpc_addr);
    let kind = "dubbo.apache.org/v1alpha1/AuthenticationPolicy";
    let spread = namespaces.max(1);
    let mut open = open_streams(&addr, streams, streams_per_connection, kind, |i| {
        Some(format!("token-{}", i % spread))
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_kib(server.child.id())?;
    let server_pid = server.child.id().to_string();
    let server_cpu = cpu_seconds(&server_pid)?;
    let client_cpu = cpu_seconds("self")?;
    let views_before = view_assemblies(server.admin_addr).await?;
    // The change: a root-namespace policy, which reaches every client. The clock starts
    // before the request: the server publishes before it answers, right after its commit.
    let applied = Instant::now();
    admin_post(
        server.admin_addr,
        "/api/v1/apply",
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: AuthenticationPolicy\nmetadata: {name: everyone, namespace: dubbo-system}\nspec: {action: PERMISSIVE}\n",
    )
    .await?;
    let latencies = collect_latencies(&mut open, streams, applied).await;
    let server_cpu = cpu_seconds(&server_pid)? - server_cpu;
    let client_cpu = cpu_seconds("self")? - client_cpu;
    let encodings = view_assemblies(server.admin_addr).await? - views_before;
    drop(server);
    let result = open.finish(
        latencies,
        rss_after.saturating_sub(rss_before),
        server_cpu,
        client_cpu,
    );
    Ok((result, encodings))
}

/// POSTs `body` to the admin API as the bench's admin identity.
async fn admin_post(admin: SocketAddr, path: &str, body: &str) -> anyhow::Result<String> {
    let (status, answer) = admin_request(admin, "POST", path, body).await?;
    if status != 200 {
        bail!("{path}: HTTP {status}: {answer}");
    }
    Ok(answer)
}

async fn admin_request(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\
         Authorization: Bearer admin-token\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// `dubbo_cp_index_view_assemblies_total{kind="AuthenticationPolicy"}` from `/metrics`.
async fn view_assemblies(admin: SocketAddr) -> anyhow::Result<f64> {
    let (_, body) = admin_request(admin, "GET", "/metrics", "").await?;
    Ok(body
        .lines()
        .find(|line| {
            line.starts_with("dubbo_cp_index_view_assemblies_total")
                && line.contains("AuthenticationPolicy")
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0))
}

/// `dubbo-cp-bench fanout-rules`.
pub async fn run_rules(args: super::RulesFanoutArgs) -> anyhow::Result<()> {
    println!(
        "# dubbo-cp-bench fanout-rules: {} AuthenticationPolicies over {} namespaces, one root-namespace change, {} streams per connection, debounce off",
        args.policies, args.namespaces, args.streams_per_connection
    );
    println!(
        "{:>8} {:>10} {:>9} {:>9} {:>9} {:>12} {:>13} {:>10} {:>12}",
        "streams",
        "connect_s",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "rss_per_kib",
        "server_cpu_ms",
        "encodings",
        "received"
    );
    for &streams in &args.streams {
        let (r, encodings) = measure_rules(
            streams,
            args.streams_per_connection,
            args.namespaces,
            args.policies,
        )
        .await?;
        println!(
            "{:>8} {:>10.2} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>13.0} {:>10.0} {:>12}",
            r.streams,
            r.connect.as_secs_f64(),
            ms(r.p50),
            ms(r.p99),
            ms(r.max),
            r.rss_per_stream_kib,
            r.server_cpu * 1000.0,
            encodings,
            format!("{}/{}", r.received, r.streams)
        );
    }
    Ok(())
}

/// Streams open and subscribed, each reporting when its next state arrives.
struct OpenStreams {
    holders: Vec<tokio::task::JoinHandle<()>>,
    received: mpsc::UnboundedReceiver<Instant>,
    connect: Duration,
}

/// Opens `streams` streams over connections of `per_connection` streams each, subscribed to
/// `kind` with the token `token(i)`; returns once every stream has its first state.
async fn open_streams(
    addr: &str,
    streams: usize,
    per_connection: usize,
    kind: &'static str,
    token: impl Fn(usize) -> Option<String>,
) -> anyhow::Result<OpenStreams> {
    let connections = streams.div_ceil(per_connection.max(1));
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        channels.push(Channel::from_shared(addr.to_owned())?.connect().await?);
    }
    let subscribed = Arc::new(Barrier::new(streams + 1));
    let (received_tx, received) = mpsc::unbounded_channel::<Instant>();
    let started = Instant::now();
    let mut holders = Vec::with_capacity(streams);
    for i in 0..streams {
        let channel = channels[i % channels.len()].clone();
        let subscribed = subscribed.clone();
        let received = received_tx.clone();
        let token = token(i);
        holders.push(tokio::spawn(async move {
            if let Err(err) = observe_as(channel, kind, token, subscribed, received).await {
                eprintln!("stream {i}: {err:#}");
            }
        }));
    }
    drop(received_tx);
    subscribed.wait().await;
    Ok(OpenStreams {
        holders,
        received,
        connect: started.elapsed(),
    })
}

impl OpenStreams {
    /// Closes the streams and sums up one measurement.
    fn finish(
        self,
        mut latencies: Vec<Duration>,
        rss_growth_kib: u64,
        server_cpu: f64,
        client_cpu: f64,
    ) -> FanoutResult {
        let streams = self.holders.len();
        for holder in self.holders {
            holder.abort();
        }
        let received = latencies.len();
        let (p50, p99, max) = percentiles(&mut latencies);
        FanoutResult {
            streams,
            connect: self.connect,
            p50,
            p99,
            max,
            rss_per_stream_kib: rss_growth_kib as f64 / streams.max(1) as f64,
            server_cpu,
            client_cpu,
            received,
            status_read: Duration::ZERO,
            status_bytes: 0,
            scrape: Duration::ZERO,
        }
    }
}

/// The delay from `since` to each stream's receipt, waiting at most a minute.
async fn collect_latencies(
    open: &mut OpenStreams,
    streams: usize,
    since: Instant,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(streams);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while latencies.len() < streams {
        match tokio::time::timeout_at(deadline, open.received.recv()).await {
            Ok(Some(at)) => latencies.push(at.saturating_duration_since(since)),
            _ => break,
        }
    }
    latencies
}
