//! xDS fan-out: the real binary in its own process serving `services` ServiceEntries of
//! `endpoints` endpoints each, `streams` ADS streams (raw clients on Envoy's protos, ACKing every
//! response) each holding the clusters and load assignments of a few services and of one every
//! stream shares. One endpoint of the shared service changes per round; the time from the
//! change's durable apply to the last stream's ACK of the new load assignment is the number,
//! with the server's memory per stream and the resources it encoded per round.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dubbo_cp::xds::{CLUSTER, ENDPOINT};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::fanout::{rss_kib, spawn_server_in};
use super::load::{ms, percentiles};

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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0))
}

/// Counts load-assignment ACKs; a round waits until every stream has ACKed once more.
struct Acks {
    endpoint: AtomicUsize,
    changed: Notify,
    /// The run is over: streams ending now end because the server goes.
    finished: std::sync::atomic::AtomicBool,
}

/// One stream: subscribes to the clusters and load assignments of `services`, ACKs every
/// response, counts the load-assignment ones.
async fn stream(channel: Channel, services: Vec<usize>, acks: Arc<Acks>) -> anyhow::Result<()> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(8);
    let names: Vec<String> = services.iter().map(|s| cluster(*s)).collect();
    let node = envoy_types::pb::envoy::config::core::v3::Node {
        id: "bench".into(),
        ..Default::default()
    };
    let request = |type_url: &str, version: &str, nonce: &str| DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.clone(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        node: Some(node.clone()),
        ..Default::default()
    };
    tx.send(request(CLUSTER, "", "")).await?;
    tx.send(request(ENDPOINT, "", "")).await?;
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        tx.send(request(
            &response.type_url,
            &response.version_info,
            &response.nonce,
        ))
        .await?;
        if response.type_url == ENDPOINT {
            acks.endpoint.fetch_add(1, Ordering::SeqCst);
            acks.changed.notify_waiters();
        }
    }
    Ok(())
}

async fn wait_for(acks: &Acks, wanted: usize, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let notified = acks.changed.notified();
        if acks.endpoint.load(Ordering::SeqCst) >= wanted {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            bail!(
                "{} of {wanted} load-assignment ACKs within {timeout:?}",
                acks.endpoint.load(Ordering::SeqCst)
            );
        }
    }
}

pub async fn run(args: XdsArgs) -> anyhow::Result<()> {
    let server = spawn_server_in(tempfile::tempdir()?, &[])?;
    let xds = server.xds_addr.context("the server serves no xDS")?;
    let admin = server.admin_addr;
    let pid = server.child.id();
    let manifest: String = (0..args.services)
        .map(|i| entry(i, args.endpoints, None))
        .collect::<Vec<_>>()
        .join("---\n");
    apply(admin, &manifest).await?;
    let before = rss_kib(pid)?;

    let acks = Arc::new(Acks {
        endpoint: AtomicUsize::new(0),
        changed: Notify::new(),
        finished: std::sync::atomic::AtomicBool::new(false),
    });
    let connections = args.streams.div_ceil(args.streams_per_connection.max(1));
    let mut channels = Vec::new();
    for _ in 0..connections {
        channels.push(
            Channel::from_shared(format!("http://{xds}"))?
                .connect()
                .await?,
        );
    }
    let opened = Instant::now();
    for i in 0..args.streams {
        // The shared service 0, and `per_stream` others spread over the rest.
        let mut services = vec![0];
        services.extend(
            (0..args.per_stream).map(|k| 1 + (i * args.per_stream + k) % (args.services - 1)),
        );
        let channel = channels[i % connections].clone();
        let acks = acks.clone();
        tokio::spawn(async move {
            if let Err(err) = stream(channel, services, acks.clone()).await
                && !acks.finished.load(Ordering::SeqCst)
            {
                eprintln!("stream {i}: {err:#}");
            }
        });
    }
    wait_for(&acks, args.streams, Duration::from_secs(120)).await?;
    let subscribed = opened.elapsed();
    // Let the last ACKs land before memory is read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid)?;

    let mut latencies = Vec::new();
    let mut encodes = Vec::new();
    for round in 0..args.rounds {
        let acked = acks.endpoint.load(Ordering::SeqCst);
        let encoded = metric(admin, "dubbo_cp_xds_resource_encodes_total").await?;
        apply(admin, &entry(0, args.endpoints, Some(round))).await?;
        let changed = Instant::now();
        wait_for(&acks, acked + args.streams, Duration::from_secs(60)).await?;
        latencies.push(changed.elapsed());
        // Pushes are done; the counter has every encoding of the round.
        encodes.push(metric(admin, "dubbo_cp_xds_resource_encodes_total").await? - encoded);
    }
    acks.finished.store(true, Ordering::SeqCst);
    let (p50, p99, max) = percentiles(&mut latencies);
    let per_stream = (after.saturating_sub(before)) as f64 / args.streams as f64;
    encodes.sort_by(f64::total_cmp);
    println!(
        "xds: {} streams ({} per connection), {} services x {} endpoints, {} rounds",
        args.streams, args.streams_per_connection, args.services, args.endpoints, args.rounds
    );
    println!(
        "  subscribed and ACKed in {:.0} ms; server RSS {} KiB before streams, {} KiB after: {:.1} KiB per stream (cache included)",
        ms(subscribed),
        before,
        after,
        per_stream
    );
    println!(
        "  endpoint change (durable apply) -> last stream's ACK: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (xds.debounce 100 ms included)",
        ms(p50),
        ms(p99),
        ms(max)
    );
    println!(
        "  resources encoded per round: median {} (distinct resources the streams hold: {}), not per stream",
        encodes.get(encodes.len() / 2).copied().unwrap_or_default(),
        2 * (1 + (args.streams * args.per_stream).min(args.services - 1))
    );
    Ok(())
}
