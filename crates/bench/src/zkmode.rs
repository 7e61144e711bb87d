//! ZooKeeper mode against the SDK way and standalone, side by side in one run, each level on a
//! fresh ZooKeeper (Debian's package) and a fresh data directory:
//! - the SDK way: every client does its own compare-and-swap on `/dubbo/mapping/<interface>`
//!   (read, append, write with the version; random wait below 100 ms on a lost ticket, 10 tries),
//!   as Dubbo Java's `MetadataServiceNameMapping` does;
//! - dubbo-cp in ZooKeeper mode: the real binary in its own process, acknowledging once a
//!   registration is in its outbox and merging bursts into one write per node;
//! - dubbo-cp standalone: the real binary, its embedded store;
//! - the bare-tonic ceiling in its own process (a server that answers `success` doing nothing):
//!   what any server measured this way can reach on this machine.
//!
//! After each ZooKeeper run every pair acknowledged is looked for in its node: `lost` counts those
//! missing (for dubbo-cp, once the outbox has drained; `drain` is how long that took after the
//! last acknowledgement).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::bail;

use super::fanout::spawn_server_in;
use super::load::{RunResult, ms, request_mix, run_load};
use super::{drive_grpc, zk};

#[derive(clap::Args, Clone)]
pub struct ZkModeArgs {
    /// Repetitions; the table shows each run's figures.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Registrations per concurrency level.
    #[arg(long, default_value_t = 4_000)]
    requests: usize,
    #[arg(long, value_delimiter = ',', default_value = "16,128,1024")]
    concurrency: Vec<usize>,
    /// Connections (HTTP/2 or ZooKeeper sessions) the requests share.
    #[arg(long, default_value_t = 16)]
    connections: usize,
}

/// The pairs of the request mix, by interface.
fn expected(run: usize, requests: usize) -> BTreeMap<String, BTreeSet<String>> {
    let mut pairs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for i in 0..requests {
        let (application, interface) = request_mix(run, i);
        pairs.entry(interface).or_default().insert(application);
    }
    pairs
}

/// Pairs of `expected` not in their node under `<root>/mapping/<interface>` (the SDK way
/// writes Dubbo's default group `/dubbo`; the gRPC load registers in namespace `bench`, whose
/// root is `/bench`).
async fn missing(
    client: &zookeeper_client::Client,
    root: &str,
    expected: &BTreeMap<String, BTreeSet<String>>,
) -> anyhow::Result<usize> {
    let mut missing = 0;
    for (interface, applications) in expected {
        let path = format!("{root}/mapping/{interface}");
        let mut tries = 0;
        let listed: BTreeSet<String> = loop {
            match client.get_data(&path).await {
                Ok((data, _)) => {
                    break String::from_utf8_lossy(&data)
                        .split(',')
                        .map(str::to_owned)
                        .collect();
                }
                Err(zookeeper_client::Error::NoNode) => break BTreeSet::new(),
                // A connection lost under the load's tail: read again.
                Err(err) if tries < 20 => {
                    tries += 1;
                    eprintln!("reading {path}: {err}; again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(err) => bail!("reading {path}: {err}"),
            }
        };
        missing += applications.difference(&listed).count();
    }
    Ok(missing)
}

fn row(
    target: &str,
    in_flight: usize,
    result: &RunResult,
    lost: Option<usize>,
    drain: Option<Duration>,
) {
    let lost = lost.map_or("-".to_owned(), |n| n.to_string());
    let drain = drain.map_or("-".to_owned(), |d| format!("{:.0}", ms(d)));
    println!(
        "| {target} | {in_flight} | {:.0} | {:.2} | {:.2} | {} | {lost} | {drain} |",
        result.per_second,
        ms(result.p50),
        ms(result.p99),
        result.errors
    );
}

/// A GET on the admin port; the body.
async fn admin_get(admin: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
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

/// How long a mapping an SDK writes takes to be served (`/debug/mappings`, polled every
/// millisecond), over `samples` writes, each to a new node, with the default debounce.
async fn watch_latency(samples: usize) -> anyhow::Result<Vec<Duration>> {
    let server = zk::start().await?;
    let replica = spawn_server_in(tempfile::tempdir()?, &["--zookeeper", &server.address()])?;
    while !super::fanout::readyz(replica.admin_addr).await? {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = zookeeper_client::Client::connect(&server.address()).await?;
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let interface = format!("org.apache.dubbo.bench.Watched{i}");
        let written = Instant::now();
        if !zk::register(client.clone(), interface.clone(), "sdk-app".to_owned()).await {
            bail!("the SDK's write of {interface} failed");
        }
        let needle = format!("\"{interface}\"");
        loop {
            if admin_get(replica.admin_addr, "/debug/mappings")
                .await?
                .contains(&needle)
            {
                break;
            }
            if written.elapsed() > Duration::from_secs(30) {
                bail!("{interface} was not served within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        latencies.push(written.elapsed());
    }
    latencies.sort();
    Ok(latencies)
}

pub async fn run(args: ZkModeArgs) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "# ZooKeeper mode: {} registrations per level (new pairs over 1,000 interfaces), {} connections, {cpus} cpus",
        args.requests, args.connections
    );
    println!("| target | in flight | req/s | p50 ms | p99 ms | errors | lost | drain ms |");
    println!("|---|---|---|---|---|---|---|---|");
    for run in 0..args.runs {
        let pairs = expected(run, args.requests);
        for &in_flight in &args.concurrency {
            // The SDK way.
            let server = zk::start().await?;
            let mut clients = Vec::new();
            for _ in 0..args.connections.max(1) {
                clients.push(zookeeper_client::Client::connect(&server.address()).await?);
            }
            let result = run_load(args.requests, in_flight, |i| {
                let client = clients[i % clients.len()].clone();
                let (application, interface) = request_mix(run, i);
                zk::register(client, interface, application)
            })
            .await?;
            let lost = missing(&clients[0], "/dubbo", &pairs).await?;
            row(
                "SDK way (CAS per client)",
                in_flight,
                &result,
                Some(lost),
                None,
            );
            drop(clients);
            drop(server);

            // dubbo-cp in ZooKeeper mode, its own process.
            let server = zk::start().await?;
            let address = server.address();
            let replica = spawn_server_in(tempfile::tempdir()?, &["--zookeeper", &address])?;
            let target = format!("http://{}", replica.grpc_addr);
            let result =
                drive_grpc(&target, args.requests, in_flight, args.connections, run, 1).await?;
            let acked = Instant::now();
            let reader = zookeeper_client::Client::connect(&address).await?;
            let deadline = acked + Duration::from_secs(300);
            let lost = loop {
                let lost = missing(&reader, "/bench", &pairs).await?;
                if lost == 0 || Instant::now() > deadline {
                    break lost;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            row(
                "dubbo-cp, ZooKeeper mode",
                in_flight,
                &result,
                Some(lost),
                Some(acked.elapsed()),
            );
            drop(replica);
            drop(server);

            // dubbo-cp standalone, its own process.
            let replica = spawn_server_in(tempfile::tempdir()?, &[])?;
            let target = format!("http://{}", replica.grpc_addr);
            let result =
                drive_grpc(&target, args.requests, in_flight, args.connections, run, 1).await?;
            row("dubbo-cp, standalone", in_flight, &result, None, None);
            drop(replica);

            // The ceiling, its own process.
            let ceiling = super::separate::spawn_ceiling()?;
            let target = format!("http://{}", ceiling.addr);
            let result =
                drive_grpc(&target, args.requests, in_flight, args.connections, run, 1).await?;
            row("bare tonic (ceiling)", in_flight, &result, None, None);
            drop(ceiling);
        }
    }
    let latencies = watch_latency(50).await?;
    println!();
    println!(
        "SDK write to served by dubbo-cp (debounce 100 ms), 50 writes: p50 {:.0} ms, max {:.0} ms",
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() - 1])
    );
    Ok(())
}
