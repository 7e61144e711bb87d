//! Load generator for dubbo-cp. Prints numbers; asserts nothing.
//!
//! `dubbo-cp-bench register` drives `registerServiceAppMapping` with a fixed number of requests
//! in flight over a bounded number of connections and reports throughput and latency. Without
//! `--server` it starts an in-process control plane on a fresh temporary data directory.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use dubbo_cp::config::Config;
use dubbo_cp::pb::snp::ServiceMappingRequest;
use dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

#[derive(Parser)]
#[command(name = "dubbo-cp-bench", about = "Load generator for dubbo-cp")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Registration throughput and latency.
    Register(RegisterArgs),
    /// Discovery-stream fan-out: time for one change to reach N streams, and memory per stream.
    Fanout(FanoutArgs),
}

#[derive(clap::Args, Clone)]
struct FanoutArgs {
    /// Streams to open (comma-separated for several runs).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    streams: Vec<usize>,
    /// Streams per HTTP/2 connection.
    #[arg(long, default_value_t = 500)]
    streams_per_connection: usize,
    /// Mappings stored before the streams open (the size of every state sent).
    #[arg(long, default_value_t = 100)]
    mappings: usize,
}

#[derive(clap::Args, Clone)]
struct RegisterArgs {
    /// gRPC address of a running control plane; without it one is started in-process.
    #[arg(long)]
    server: Option<String>,
    /// Requests in flight at once (comma-separated for several runs).
    #[arg(long, value_delimiter = ',', default_value = "1,16,128,1024")]
    concurrency: Vec<usize>,
    /// HTTP/2 connections the requests share.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Requests per run.
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    /// Interfaces per request.
    #[arg(long, default_value_t = 1)]
    interfaces: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Register(args) => register(args).await,
        Command::Fanout(args) => fanout::run(args).await,
    }
}

async fn register(args: RegisterArgs) -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "# dubbo-cp-bench register: {} requests per run, {} interface(s) each, {} connections, {cpus} cpus",
        args.requests, args.interfaces, args.connections
    );
    println!(
        "{:>11} {:>12} {:>10} {:>10} {:>10} {:>8}",
        "in_flight", "req/s", "p50_ms", "p99_ms", "max_ms", "errors"
    );
    for (run, &in_flight) in args.concurrency.iter().enumerate() {
        // Each run gets a fresh server (and data directory), so every registration is new and
        // pays for a durable commit.
        let dir = tempfile::tempdir()?;
        let (target, server) = match &args.server {
            Some(addr) => (addr.clone(), None),
            None => {
                let config = Config {
                    grpc_addr: ([127, 0, 0, 1], 0).into(),
                    admin_addr: ([127, 0, 0, 1], 0).into(),
                    data_dir: dir.path().to_path_buf(),
                    ..Config::default()
                };
                let server = dubbo_cp::server::start(config).await?;
                (format!("http://{}", server.grpc_addr), Some(server))
            }
        };
        let result = drive(&target, &args, in_flight, run).await?;
        println!(
            "{:>11} {:>12.0} {:>10.3} {:>10.3} {:>10.3} {:>8}",
            in_flight,
            result.per_second,
            ms(result.p50),
            ms(result.p99),
            ms(result.max),
            result.errors
        );
        if let Some(server) = server {
            server.stop().await?;
        }
    }
    Ok(())
}

struct RunResult {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    errors: usize,
}

async fn drive(
    target: &str,
    args: &RegisterArgs,
    in_flight: usize,
    run: usize,
) -> anyhow::Result<RunResult> {
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections.max(1) {
        let channel = Channel::from_shared(target.to_owned())?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {target}"))?;
        clients.push(ServiceNameMappingServiceClient::new(channel));
    }
    let permits = std::sync::Arc::new(Semaphore::new(in_flight));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.requests);
    for i in 0..args.requests {
        let permit = permits.clone().acquire_owned().await?;
        let mut client = clients[i % clients.len()].clone();
        let request = ServiceMappingRequest {
            namespace: "bench".into(),
            application_name: format!("app-{run}-{i}"),
            interface_names: (0..args.interfaces)
                .map(|k| format!("org.apache.dubbo.bench.Service{}", (i + k) % 1000))
                .collect(),
        };
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let ok = client
                .register_service_app_mapping(request)
                .await
                .is_ok_and(|r| r.get_ref().success);
            drop(permit);
            (sent.elapsed(), ok)
        }));
    }
    let mut latencies = Vec::with_capacity(tasks.len());
    let mut errors = 0;
    for task in tasks {
        let (latency, ok) = task.await?;
        latencies.push(latency);
        if !ok {
            errors += 1;
        }
    }
    let elapsed = started.elapsed();
    let (p50, p99, max) = percentiles(&mut latencies);
    Ok(RunResult {
        per_second: args.requests as f64 / elapsed.as_secs_f64(),
        p50,
        p99,
        max,
        errors,
    })
}

mod fanout;

/// p50, p99 and max of `samples` (sorted in place); zero when empty.
fn percentiles(samples: &mut [Duration]) -> (Duration, Duration, Duration) {
    if samples.is_empty() {
        return Default::default();
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99), samples[samples.len() - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
