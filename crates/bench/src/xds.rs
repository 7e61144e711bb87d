//! xDS fan-out: the real binary in its own process serving `services` ServiceEntries of
//! `endpoints` endpoints each, `streams` ADS streams (raw clients on Envoy's protos, state of
//! the world or `--delta`, ACKing every response) each holding the clusters and load
//! assignments of a few services and of one every stream shares. One endpoint of the shared
//! service changes per round; the time from the change's durable apply to the last stream's
//! ACK of the new load assignment is the number, with the server's memory per stream, the
//! resources it encoded per round and both processes' CPU. `--storm` then restarts the server
//! on the same port and data and times every stream's reconnection (gRPC's backoff), counting
//! stream failures by code ("transport" when tonic made the status of a failed connection, which
//! gRPC's own clients report as UNAVAILABLE, not the server).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dubbo_cp::coalesce::Coalesced;
use tonic::transport::Channel;

use super::fanout::{admin_get, cpu_seconds, rss_kib, spawn_server_in};
use super::load::{ms, percentiles};
use super::xds_load::{Count, GrpcJs, Load, Streams};
use super::xds_streams::{Acks, client};

const NAMESPACE: &str = "bench";

#[derive(clap::Args, Clone)]
pub struct XdsArgs {
    /// ADS streams.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// Streams per HTTP/2 connection.
    #[arg(long, default_value_t = 100)]
    streams_per_connection: usize,
    /// ServiceEntries, one service each.
    #[arg(long, default_value_t = 500)]
    services: usize,
    /// Endpoints per service.
    #[arg(long, default_value_t = 10)]
    endpoints: usize,
    /// Services each stream holds besides the shared one.
    #[arg(long, default_value_t = 4)]
    per_stream: usize,
    /// Endpoint changes measured.
    #[arg(long, default_value_t = 30)]
    rounds: usize,
    /// Incremental (delta) streams instead of state of the world.
    #[arg(long)]
    delta: bool,
    /// After the rounds, restart the server and time the reconnection of every stream.
    #[arg(long)]
    storm: bool,
    /// The streams on released @grpc/grpc-js in a Node.js process of its own, installed with
    /// npm under this directory when missing, instead of tonic in this process.
    #[arg(long, value_name = "DIR")]
    grpc_js: Option<std::path::PathBuf>,
    /// Node.js processes the grpc-js streams are shared among (one runs JavaScript on one core).
    #[arg(long, default_value_t = 1)]
    grpc_js_processes: usize,
    /// The in-process client: tonic's, or the lean one on the h2 crate (every stream of a
    /// connection in one task, so the load generator takes less of the cores it shares with
    /// the server; it does not reconnect, so not with `--storm`).
    #[arg(long, value_enum, default_value_t = Client::Tonic)]
    client: Client,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Client {
    Tonic,
    H2,
}

fn cluster(service: usize) -> String {
    format!("outbound|7070||svc-{service}.{NAMESPACE}.svc.cluster.local")
}

/// The ServiceEntry of service `i`; `extra` adds an endpoint (the change a round makes).
fn entry(i: usize, endpoints: usize, extra: Option<usize>) -> String {
    let mut addresses: Vec<String> = (0..endpoints)
        .map(|j| format!("10.{}.{}.{}", i / 250, i % 250, j + 1))
        .collect();
    if let Some(round) = extra {
        addresses.push(format!("10.255.{}.{}", round / 250, round % 250 + 1));
    }
    let endpoints: Vec<String> = addresses
        .iter()
        .map(|a| format!("{{address: {a}}}"))
        .collect();
    format!(
        "apiVersion: dubbo.apache.org/v1alpha1\nkind: ServiceEntry\nmetadata: {{name: svc-{i}, namespace: {NAMESPACE}}}\n\
         spec: {{hosts: [svc-{i}], ports: [{{number: 7070, name: grpc}}], endpoints: [{}]}}\n",
        endpoints.join(", ")
    )
}

async fn apply(admin: SocketAddr, manifest: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    let request = format!(
        "POST /api/v1/apply HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\
         Content-Type: application/yaml\r\nContent-Length: {}\r\n\r\n{manifest}",
        manifest.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    if !response.starts_with("HTTP/1.1 200") {
        bail!(
            "apply failed: {}",
            response.lines().last().unwrap_or_default()
        );
    }
    Ok(())
}

async fn metric(admin: SocketAddr, name: &str) -> anyhow::Result<f64> {
    Ok(admin_get(admin, "/metrics")
        .await?
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0))
}

/// The server's own view of the streams once every stream ACKed the last round: how many it
/// serves and how many are not current (a response unacknowledged or rejected, or a version
/// behind). Waited on, as the last ACKs may still be on their way; an error when the server
/// does not see every stream current within `timeout` (a client whose ACKs the server does not
/// take for ACKs would be pushed the slow way, and the numbers would not be the server's).
async fn server_view(
    admin: SocketAddr,
    streams: usize,
    timeout: Duration,
) -> anyhow::Result<(u64, u64)> {
    let deadline = Instant::now() + timeout;
    loop {
        let response = admin_get(admin, "/debug/xds?limit=1").await?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body)
            .unwrap_or_default();
        let view: serde_json::Value =
            serde_json::from_str(body).with_context(|| format!("/debug/xds answered {body:?}"))?;
        let (total, stale) = (
            view["total"].as_u64().unwrap_or(0),
            view["stale"].as_u64().unwrap_or(u64::MAX),
        );
        if total == streams as u64 && stale == 0 {
            return Ok((total, stale));
        }
        if Instant::now() > deadline {
            bail!(
                "the server sees {total} streams, {stale} not current, {timeout:?} after the last ACK"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A channel to the xDS port whose writes go out once per poll of its connection task, as
/// gRPC's own clients batch theirs (grpc-go's writer flushes when its queue is empty): without
/// it the load generator makes a system call per ACK, on the two cores the server runs on.
async fn xds_channel(xds: SocketAddr) -> anyhow::Result<Channel> {
    let connector = tower::service_fn(move |_: http::Uri| async move {
        let tcp = tokio::net::TcpStream::connect(xds).await?;
        tcp.set_nodelay(true)?;
        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Coalesced::new(tcp)))
    });
    Ok(Channel::from_shared(format!("http://{xds}"))?
        .connect_with_connector(connector)
        .await?)
}

/// The streams, on tonic in this process or on grpc-js in Node.js processes.
async fn start_load(args: &XdsArgs, xds: SocketAddr) -> anyhow::Result<Load> {
    let per_connection = args.streams_per_connection.max(1);
    if let Some(prefix) = &args.grpc_js {
        let target = xds.to_string();
        let processes = args.grpc_js_processes.clamp(1, args.streams.max(1));
        let mut started = Vec::new();
        for p in 0..processes {
            let first = args.streams * p / processes;
            let streams = Streams {
                target: &target,
                first,
                streams: args.streams * (p + 1) / processes - first,
                per_connection,
                services: args.services,
                per_stream: args.per_stream,
                delta: args.delta,
            };
            started.push(GrpcJs::spawn(prefix, streams).await?);
        }
        return Ok(Load::GrpcJs(started));
    }
    let acks = Arc::new(Acks::default());
    let connections = args.streams.div_ceil(per_connection);
    if args.client == Client::H2 {
        for c in 0..connections {
            let streams = (c * per_connection..((c + 1) * per_connection).min(args.streams))
                .map(|i| names(args, i))
                .collect();
            let client = super::xds_h2::connect(xds, &acks).await?;
            let (acks, delta) = (acks.clone(), args.delta);
            tokio::spawn(async move {
                if let Err(error) =
                    super::xds_h2::run_streams(client, xds, streams, delta, acks.clone()).await
                {
                    acks.failed_with("Unavailable transport", &format!("{error:#}"));
                }
            });
        }
        return Ok(Load::InProcess {
            acks,
            streams: args.streams,
            mark: 0,
            client: "h2 (lean)",
        });
    }
    let mut channels = Vec::new();
    for _ in 0..connections {
        channels.push(xds_channel(xds).await?);
    }
    for i in 0..args.streams {
        let channel = channels[i % connections].clone();
        tokio::spawn(client(i, channel, names(args, i), args.delta, acks.clone()));
    }
    Ok(Load::InProcess {
        acks,
        streams: args.streams,
        mark: 0,
        client: "tonic",
    })
}

/// Stream `i`'s cluster names: the shared service 0's, and `per_stream` others spread over the
/// rest.
fn names(args: &XdsArgs, i: usize) -> Vec<String> {
    let mut services = vec![0];
    services
        .extend((0..args.per_stream).map(|k| 1 + (i * args.per_stream + k) % (args.services - 1)));
    services.iter().map(|s| cluster(*s)).collect()
}

/// `measure` of each process, added up.
fn sum<T: std::iter::Sum>(
    pids: &[u32],
    measure: impl Fn(u32) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    pids.iter().map(|pid| measure(*pid)).sum()
}

pub async fn run(args: XdsArgs) -> anyhow::Result<()> {
    if args.storm && args.client == Client::H2 {
        bail!("--storm needs a client that reconnects: --client tonic, or --grpc-js");
    }
    if args.grpc_js.is_some() && args.client == Client::H2 {
        bail!("--grpc-js and --client h2 are two load generators: choose one");
    }
    let mut server = spawn_server_in(tempfile::tempdir()?, &[])?;
    let xds = server.xds_addr.context("the server serves no xDS")?;
    let admin = server.admin_addr;
    let pid = server.child.id();
    // Applied in batches: one manifest of 10,000 entries would be one huge request.
    for chunk in (0..args.services).collect::<Vec<_>>().chunks(500) {
        let manifest: String = chunk
            .iter()
            .map(|i| entry(*i, args.endpoints, None))
            .collect::<Vec<_>>()
            .join("---\n");
        apply(admin, &manifest).await?;
    }
    let before = rss_kib(pid)?;

    let opened = Instant::now();
    let mut load = start_load(&args, xds).await?;
    load.wait(Count::Subscribed, Duration::from_secs(600))
        .await?;
    let subscribe_time = opened.elapsed();
    // Let the last ACKs land before memory is read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid)?;
    let client_rss = sum(&load.pids(), rss_kib)?;

    let server_cpu = cpu_seconds(&pid.to_string())?;
    let client_cpu = sum(&load.pids(), |pid| cpu_seconds(&pid.to_string()))?;
    let mut latencies = Vec::new();
    let mut encodes = Vec::new();
    for round in 0..args.rounds {
        load.mark().await?;
        let encoded = metric(admin, "dubbo_cp_xds_resource_encodes_total").await?;
        apply(admin, &entry(0, args.endpoints, Some(round))).await?;
        let changed = Instant::now();
        load.wait(Count::Endpoint, Duration::from_secs(120)).await?;
        latencies.push(changed.elapsed());
        // Pushes are done; the counter has every encoding of the round.
        encodes.push(metric(admin, "dubbo_cp_xds_resource_encodes_total").await? - encoded);
    }
    let server_cpu = cpu_seconds(&pid.to_string())? - server_cpu;
    let client_cpu = sum(&load.pids(), |pid| cpu_seconds(&pid.to_string()))? - client_cpu;
    let (total, stale) = match server_view(admin, args.streams, Duration::from_secs(30)).await {
        Ok(view) => view,
        Err(error) => bail!("{error:#}; stream failures: {}", load.errors().await?),
    };
    let (p50, p99, max) = percentiles(&mut latencies);
    let per_stream = (after.saturating_sub(before)) as f64 / args.streams as f64;
    encodes.sort_by(f64::total_cmp);
    println!(
        "xds: {} {} streams ({} per connection) on {}, {} services x {} endpoints, {} rounds",
        args.streams,
        if args.delta {
            "delta"
        } else {
            "state-of-the-world"
        },
        args.streams_per_connection,
        load.describe().await?,
        args.services,
        args.endpoints,
        args.rounds
    );
    println!(
        "  subscribed and ACKed in {:.0} ms; server RSS {} KiB before streams, {} KiB after: {:.1} KiB per stream (cache included); load generator RSS {} KiB",
        ms(subscribe_time),
        before,
        after,
        per_stream,
        client_rss
    );
    println!(
        "  endpoint change (durable apply) -> last stream's ACK: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (xds.debounce 100 ms included)",
        ms(p50),
        ms(p99),
        ms(max)
    );
    println!(
        "  CPU over the rounds: server {:.2} s, load generator {:.2} s ({:.0} ms and {:.0} ms per round)",
        server_cpu,
        client_cpu,
        server_cpu * 1000.0 / args.rounds.max(1) as f64,
        client_cpu * 1000.0 / args.rounds.max(1) as f64
    );
    println!(
        "  resources encoded per round: median {} (distinct resources the streams hold: {}), not per stream",
        encodes.get(encodes.len() / 2).copied().unwrap_or_default(),
        2 * (1 + (args.streams * args.per_stream).min(args.services - 1))
    );
    println!(
        "  the server's view after the rounds (/debug/xds): {total} streams, {stale} not current (unacknowledged, rejected or behind)"
    );
    if args.storm {
        let xds_port = xds.to_string();
        let admin_port = admin.to_string();
        let client_cpu = sum(&load.pids(), |pid| cpu_seconds(&pid.to_string()))?;
        let restarted = Instant::now();
        server = server.restart(&["--xds-addr", &xds_port, "--admin-addr", &admin_port])?;
        let serving = restarted.elapsed();
        let server_cpu = cpu_seconds(&server.child.id().to_string())?;
        load.wait(Count::Reconnected, Duration::from_secs(300))
            .await?;
        println!(
            "  restart: every stream back and ACKed in {:.0} ms (the old server draining and the new one serving: {:.0} ms; gRPC's backoff from 1 s)",
            ms(restarted.elapsed()),
            ms(serving)
        );
        println!(
            "  CPU over the storm: new server {:.2} s, load generator {:.2} s; stream failures by code: {}",
            cpu_seconds(&server.child.id().to_string())? - server_cpu,
            sum(&load.pids(), |pid| cpu_seconds(&pid.to_string()))? - client_cpu,
            load.errors().await?
        );
        println!(
            "  failures a gRPC client reports as other than UNAVAILABLE (a status of another code from the server{}): {}",
            if args.grpc_js.is_some() {
                ", or grpc-js's own"
            } else {
                ""
            },
            load.beyond_unavailable().await?
        );
    } else {
        println!("  stream failures by code: {}", load.errors().await?);
    }
    load.finish().await?;
    drop(server);
    Ok(())
}
