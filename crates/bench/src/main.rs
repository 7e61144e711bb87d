//! Load generator for dubbo-cp. Prints numbers; asserts nothing.
//!
//! `dubbo-cp-bench register` drives `registerServiceAppMapping` with a fixed number of requests
//! in flight over a bounded number of connections and reports throughput and latency. Without
//! `--server` it starts an in-process control plane on a fresh temporary data directory.
//! `dubbo-cp-bench fanout` measures the discovery stream; `dubbo-cp-bench all` runs everything
//! side by side (see BENCHMARKS.md).

use anyhow::Context;
use clap::{Parser, Subcommand};
use dubbo_cp::config::Config;
use dubbo_cp::pb::snp::ServiceMappingRequest;
use dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use tonic::transport::Channel;

use load::{RunResult, ms, request_mix, run_load};

mod all;
mod ca;
mod ceiling;
mod fanout;
mod load;
mod separate;
mod xds;
mod xds_h2;
mod xds_load;
mod xds_streams;
mod zk;
mod zkmode;

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
    /// Everything side by side in one run: ceiling, dubbo-cp, ZooKeeper, coalescing, fan-out,
    /// cold start; medians of several runs as Markdown.
    All(all::AllArgs),
    /// Registration throughput with the real binary, the ceiling and this load generator each
    /// in its own process: durable new pairs and present pairs against the ceiling.
    Separate(separate::SeparateArgs),
    /// Fan-out of one rule change to streams in many namespaces, each seeing its own
    /// namespace's authentication policies (filtered views, one encoding per distinct view).
    FanoutRules(RulesFanoutArgs),
    /// ZooKeeper mode against the SDK way (each client's own CAS) and standalone, the real
    /// binary in its own process, every acknowledged pair looked for in ZooKeeper afterwards.
    Zookeeper(zkmode::ZkModeArgs),
    /// Serve the bare-tonic ceiling on `--addr` until killed (used by `separate`).
    /// Certificates issued per second: a cold start of many pods, one CreateIdentity each.
    Ca(ca::CaArgs),
    /// xDS fan-out with the real binary: ADS streams over ServiceEntries, an endpoint change to
    /// the last stream's ACK, memory per stream, encodings per change.
    Xds(xds::XdsArgs),
    Ceiling {
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: std::net::SocketAddr,
    },
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
struct RulesFanoutArgs {
    /// Streams to open (comma-separated for several runs).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    streams: Vec<usize>,
    /// Streams per HTTP/2 connection.
    #[arg(long, default_value_t = 500)]
    streams_per_connection: usize,
    /// Namespaces the streams (and the policies) are spread over.
    #[arg(long, default_value_t = 50)]
    namespaces: usize,
    /// AuthenticationPolicies stored before the streams open.
    #[arg(long, default_value_t = 200)]
    policies: usize,
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
        Command::All(args) => all::run(args).await,
        Command::Separate(args) => separate::run(args).await,
        Command::Zookeeper(args) => zkmode::run(args).await,
        Command::FanoutRules(args) => fanout::run_rules(args).await,
        Command::Ca(args) => ca::run(args).await,
        Command::Xds(args) => xds::run(args).await,
        Command::Ceiling { addr } => separate::serve_ceiling(addr).await,
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
        let (target, server, _dir) = match &args.server {
            Some(addr) => (addr.clone(), None, None),
            None => {
                let (server, dir) = start_in_process(Config::default()).await?;
                (
                    format!("http://{}", server.grpc_addr),
                    Some(server),
                    Some(dir),
                )
            }
        };
        let result = drive_grpc(
            &target,
            args.requests,
            in_flight,
            args.connections,
            run,
            args.interfaces,
        )
        .await?;
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

/// An in-process control plane on ephemeral ports and a fresh data directory.
async fn start_in_process(
    base: Config,
) -> anyhow::Result<(dubbo_cp::server::RunningServer, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let config = Config {
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        admin_addr: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.path().to_path_buf(),
        tls: dubbo_cp::config::TlsConfig {
            addr: ([127, 0, 0, 1], 0).into(),
            ..base.tls
        },
        webhook: dubbo_cp::config::WebhookConfig {
            addr: ([127, 0, 0, 1], 0).into(),
            ..base.webhook
        },
        ..base
    };
    Ok((dubbo_cp::server::start(config).await?, dir))
}

/// Drives `registerServiceAppMapping` at `target` with the shared request mix.
async fn drive_grpc(
    target: &str,
    requests: usize,
    in_flight: usize,
    connections: usize,
    run: usize,
    interfaces: usize,
) -> anyhow::Result<RunResult> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections.max(1) {
        let channel = Channel::from_shared(target.to_owned())?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {target}"))?;
        clients.push(ServiceNameMappingServiceClient::new(channel));
    }
    run_load(requests, in_flight, |i| {
        let mut client = clients[i % clients.len()].clone();
        let (application, interface) = request_mix(run, i);
        let interface_names = (0..interfaces.max(1))
            .map(|k| {
                if k == 0 {
                    interface.clone()
                } else {
                    format!("{interface}.{k}")
                }
            })
            .collect();
        let request = ServiceMappingRequest {
            namespace: "bench".into(),
            application_name: application,
            interface_names,
        };
        async move {
            client
                .register_service_app_mapping(request)
                .await
                .is_ok_and(|r| r.get_ref().success)
        }
    })
    .await
}
