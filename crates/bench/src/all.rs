//! Everything side by side, in one process and one run, so every figure can be a ratio to a
//! baseline measured under the same conditions: the bare-tonic ceiling, dubbo-cp with durable
//! acknowledgements, the ZooKeeper way, write coalescing, fan-out and cold start. Repeated
//! `--runs` times; prints medians with min and max as Markdown.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dubbo_cp::config::Config;
use dubbo_cp::pb::dds::ObserveRequest;
use dubbo_cp::pb::dds::rule_service_client::RuleServiceClient;
use dubbo_cp::pb::snp::ServiceMappingRequest;
use dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::load::{RunResult, ms, request_mix, run_load};
use super::{ceiling, drive_grpc, fanout, start_in_process, zk};

#[derive(clap::Args, Clone)]
pub struct AllArgs {
    /// Repetitions; the tables show the median, min and max.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Requests per concurrency level for the gRPC targets.
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    /// Requests per concurrency level for ZooKeeper (it is much slower).
    #[arg(long, default_value_t = 4_000)]
    zk_requests: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,16,128,1024")]
    concurrency: Vec<usize>,
    /// Connections (HTTP/2 or ZooKeeper sessions) the requests share.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    streams: Vec<usize>,
    /// Mappings stored before the cold start.
    #[arg(long, default_value_t = 100_000)]
    cold_start_mappings: usize,
    /// Skip the ZooKeeper baseline (for machines without Debian's zookeeper package).
    #[arg(long)]
    skip_zookeeper: bool,
}

/// Samples of one figure across runs.
#[derive(Default)]
struct Samples(BTreeMap<String, Vec<f64>>);

impl Samples {
    fn add(&mut self, name: impl Into<String>, value: f64) {
        self.0.entry(name.into()).or_default().push(value);
    }

    fn median(&self, name: &str) -> Option<f64> {
        let mut values = self.0.get(name)?.clone();
        values.sort_by(f64::total_cmp);
        Some(values[values.len() / 2])
    }

    /// `median (min–max)`.
    fn cell(&self, name: &str, decimals: usize) -> String {
        let Some(values) = self.0.get(name) else {
            return "-".into();
        };
        let mut values = values.clone();
        values.sort_by(f64::total_cmp);
        let (min, max, median) = (
            values[0],
            values[values.len() - 1],
            values[values.len() / 2],
        );
        format!("{median:.decimals$} ({min:.decimals$}–{max:.decimals$})")
    }

    fn record_load(&mut self, target: &str, in_flight: usize, result: &RunResult) {
        self.add(format!("{target}/{in_flight}/rps"), result.per_second);
        self.add(format!("{target}/{in_flight}/p50"), ms(result.p50));
        self.add(format!("{target}/{in_flight}/p99"), ms(result.p99));
        self.add(format!("{target}/{in_flight}/errors"), result.errors as f64);
    }
}

pub async fn run(args: AllArgs) -> anyhow::Result<()> {
    let mut samples = Samples::default();
    let cold_dir = prepare_cold_start(args.cold_start_mappings).await?;
    for run in 0..args.runs {
        eprintln!("run {}/{}", run + 1, args.runs);
        let bare = ceiling::start().await?;
        for &in_flight in &args.concurrency {
            let result = drive_grpc(
                &format!("http://{bare}"),
                args.requests,
                in_flight,
                args.connections,
                run,
                1,
            )
            .await?;
            samples.record_load("ceiling", in_flight, &result);
        }
        for &in_flight in &args.concurrency {
            let (server, _dir) = start_in_process(Config::default()).await?;
            let target = format!("http://{}", server.grpc_addr);
            let result =
                drive_grpc(&target, args.requests, in_flight, args.connections, run, 1).await?;
            samples.record_load("dubbo-cp", in_flight, &result);
            server.stop().await?;
        }
        if !args.skip_zookeeper {
            let server = zk::start().await?;
            let mut clients = Vec::new();
            for _ in 0..args.connections.max(1) {
                clients.push(zookeeper_client::Client::connect(&server.address()).await?);
            }
            for &in_flight in &args.concurrency {
                let result = run_load(args.zk_requests, in_flight, |i| {
                    let client = clients[i % clients.len()].clone();
                    let (application, interface) = request_mix(run, i);
                    // A fresh node set per level, so every level starts from empty nodes.
                    zk::register(client, format!("c{in_flight}.{interface}"), application)
                })
                .await?;
                samples.record_load("zookeeper", in_flight, &result);
            }
        }
        coalescing(&mut samples).await?;
        for &streams in &args.streams {
            let result = fanout::measure(streams, 500, 100).await?;
            samples.add(format!("fanout/{streams}/p50"), ms(result.p50));
            samples.add(format!("fanout/{streams}/p99"), ms(result.p99));
            samples.add(format!("fanout/{streams}/max"), ms(result.max));
            samples.add(format!("fanout/{streams}/rss"), result.rss_per_stream_kib);
            samples.add(format!("fanout/{streams}/received"), result.received as f64);
        }
        samples.add("cold/ms", cold_start(&cold_dir).await?);
    }
    print_report(&args, &samples);
    Ok(())
}

/// Whether `request` was registered.
async fn registered(
    mut client: ServiceNameMappingServiceClient<Channel>,
    request: ServiceMappingRequest,
) -> bool {
    client
        .register_service_app_mapping(request)
        .await
        .is_ok_and(|r| r.get_ref().success)
}

/// A burst of 100 applications x 50 interfaces (one interface per call), then the same pairs
/// again, into a control plane with default debounce, with one discovery stream watching.
async fn coalescing(samples: &mut Samples) -> anyhow::Result<()> {
    let (server, _dir) = start_in_process(Config::default()).await?;
    let channel = Channel::from_shared(format!("http://{}", server.grpc_addr))?
        .connect()
        .await?;
    let (pushes_tx, mut pushes) = mpsc::unbounded_channel::<i64>();
    let (requests, rx) = mpsc::channel(8);
    requests
        .send(ObserveRequest {
            nonce: String::new(),
            r#type: "dubbo.apache.org/v1alpha1/ServiceNameMapping".into(),
        })
        .await?;
    let mut stream = RuleServiceClient::new(channel.clone())
        .observe(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let watcher = tokio::spawn(async move {
        while let Ok(Some(response)) = stream.message().await {
            let _ = pushes_tx.send(response.revision);
            let ack = ObserveRequest {
                nonce: response.nonce,
                r#type: response.r#type,
            };
            if requests.send(ack).await.is_err() {
                break;
            }
        }
    });
    // The initial state is not a push of the burst.
    let _initial = pushes.recv().await;
    let commits_before = server
        .store_stats
        .commits
        .load(std::sync::atomic::Ordering::Relaxed);
    let client = ServiceNameMappingServiceClient::new(channel);
    let started = Instant::now();
    let registrations = 2 * 100 * 50;
    let result = run_load(registrations, 128, |i| {
        let client = client.clone();
        let pair = i % 5000;
        let request = ServiceMappingRequest {
            namespace: "bench".into(),
            application_name: format!("app-{}", pair / 50),
            interface_names: vec![format!("org.apache.dubbo.bench.Service{}", pair % 50)],
        };
        registered(client, request)
    })
    .await?;
    // Quiet for longer than the debounce, then count.
    let mut pushed = 0usize;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(1), pushes.recv()).await {
        pushed += 1;
    }
    let settled = started.elapsed();
    let stats = server.store_stats.clone();
    samples.add("coalesce/registrations", registrations as f64);
    samples.add("coalesce/errors", result.errors as f64);
    samples.add(
        "coalesce/commits",
        (stats.commits.load(std::sync::atomic::Ordering::Relaxed) - commits_before) as f64,
    );
    samples.add(
        "coalesce/pairs",
        stats
            .pairs_written
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    samples.add("coalesce/pushes", pushed as f64);
    samples.add("coalesce/settled_ms", ms(settled) - 1000.0);
    watcher.abort();
    server.stop().await?;
    Ok(())
}

/// A data directory holding `mappings` mappings (one application, `mappings` interfaces).
async fn prepare_cold_start(mappings: usize) -> anyhow::Result<tempfile::TempDir> {
    let (server, dir) = start_in_process(Config::default()).await?;
    let channel = Channel::from_shared(format!("http://{}", server.grpc_addr))?
        .connect()
        .await?;
    let client = ServiceNameMappingServiceClient::new(channel);
    let calls = mappings.div_ceil(1000);
    let result = run_load(calls, 16, |call| {
        let client = client.clone();
        let interfaces = (call * 1000..((call + 1) * 1000).min(mappings))
            .map(|i| format!("org.apache.dubbo.cold.Service{i}"))
            .collect();
        let request = ServiceMappingRequest {
            namespace: "bench".into(),
            application_name: "cold-provider".into(),
            interface_names: interfaces,
        };
        registered(client, request)
    })
    .await?;
    anyhow::ensure!(result.errors == 0, "seeding the cold-start store failed");
    server.stop().await?;
    Ok(dir)
}

/// Milliseconds from spawning the real binary on `dir` until it is serving and ready.
async fn cold_start(dir: &tempfile::TempDir) -> anyhow::Result<f64> {
    let copy = tempfile::tempdir()?;
    for name in ["dubbo-cp.db", "dubbo-cp.db-wal", "dubbo-cp.db-shm"] {
        let from = dir.path().join(name);
        if from.exists() {
            std::fs::copy(&from, copy.path().join(name))?;
        }
    }
    let started = Instant::now();
    let server = fanout::spawn_server_in(copy, &[])?;
    let serving = started.elapsed();
    let ready = super::fanout::readyz(server.admin_addr).await?;
    anyhow::ensure!(ready, "not ready after serving");
    Ok(ms(serving))
}

fn print_report(args: &AllArgs, s: &Samples) {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into());
    println!("## Results: {} runs, medians (min–max)\n", args.runs);
    println!("Machine: {cpus} CPUs, {model}. Load generator, servers and ZooKeeper share them.\n");
    println!(
        "### Registrations ({} requests per level; ZooKeeper {}; {} connections)\n",
        args.requests, args.zk_requests, args.connections
    );
    println!(
        "| in flight | ceiling req/s | dubbo-cp req/s | ZooKeeper req/s | dubbo-cp / ceiling | dubbo-cp / ZooKeeper | ceiling p50/p99 ms | dubbo-cp p50/p99 ms | ZooKeeper p50/p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &c in &args.concurrency {
        let ratio = |a: &str, b: &str| match (
            s.median(&format!("{a}/{c}/rps")),
            s.median(&format!("{b}/{c}/rps")),
        ) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let lat = |t: &str| {
            format!(
                "{} / {}",
                s.cell(&format!("{t}/{c}/p50"), 2),
                s.cell(&format!("{t}/{c}/p99"), 2)
            )
        };
        println!(
            "| {c} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.cell(&format!("ceiling/{c}/rps"), 0),
            s.cell(&format!("dubbo-cp/{c}/rps"), 0),
            s.cell(&format!("zookeeper/{c}/rps"), 0),
            ratio("dubbo-cp", "ceiling"),
            ratio("dubbo-cp", "zookeeper"),
            lat("ceiling"),
            lat("dubbo-cp"),
            lat("zookeeper"),
        );
    }
    let errors: f64 =
        s.0.iter()
            .filter(|(k, _)| k.ends_with("/errors"))
            .flat_map(|(_, v)| v.iter())
            .sum();
    println!("\nFailed requests across all loads: {errors:.0}.\n");
    println!(
        "### Write coalescing (100 applications x 50 interfaces, each pair registered twice)\n"
    );
    println!(
        "| registrations | store commits | pairs written | pushes to one stream | settled after ms |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} |",
        s.cell("coalesce/registrations", 0),
        s.cell("coalesce/commits", 0),
        s.cell("coalesce/pairs", 0),
        s.cell("coalesce/pushes", 0),
        s.cell("coalesce/settled_ms", 0)
    );
    println!(
        "\n### Fan-out (one change, debounce off, 100 mappings per state, 500 streams per connection)\n"
    );
    println!("| streams | p50 ms | p99 ms | max ms | RSS per stream KiB | received |");
    println!("|---|---|---|---|---|---|");
    for &n in &args.streams {
        println!(
            "| {n} | {} | {} | {} | {} | {} |",
            s.cell(&format!("fanout/{n}/p50"), 1),
            s.cell(&format!("fanout/{n}/p99"), 1),
            s.cell(&format!("fanout/{n}/max"), 1),
            s.cell(&format!("fanout/{n}/rss"), 1),
            s.cell(&format!("fanout/{n}/received"), 0),
        );
    }
    println!(
        "\n### Cold start ({} stored mappings)\n",
        args.cold_start_mappings
    );
    println!(
        "| process start to ready, ms |\n|---|\n| {} |",
        s.cell("cold/ms", 0)
    );
}
