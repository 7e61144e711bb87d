//! 100 Canaries progressing at once on one control plane (issue 14): the real binary in its
//! own process against the API-server fixture in this one, which also plays the Deployment
//! controller and kubelet, and a Prometheus stub every analysis queries. Prints, for a run of
//! every Canary (a new template each, to promotion) and then for a quiet period: reconciles,
//! reconcile latency p99 (from the control plane's histogram), CPU per reconcile (its
//! utime+stime), API requests and writes per reconcile (the Lease's renewals apart). Asserts
//! only that every run finished.
//!
//! `cargo bench --bench canary`

#[path = "../tests/common/apiserver.rs"]
mod apiserver;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use apiserver::ApiServer;
use serde_json::json;

const CANARIES: usize = 100;
const NS: &str = "bench";
const QUIET: Duration = Duration::from_secs(10);

struct Plane {
    child: Child,
    admin: SocketAddr,
}

impl Drop for Plane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(api: &ApiServer, prometheus: SocketAddr, dir: &std::path::Path) -> anyhow::Result<Plane> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args([
            "serve",
            "--mode",
            "kubernetes",
            "--kube-api-server",
            &api.url(),
        ])
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(["--tls-addr", "127.0.0.1:0", "--webhook-addr", "127.0.0.1:0"])
        .args(["--auth-token-review", "false", "--webhook-enabled", "false"])
        .args(["--canary-prometheus", &format!("http://{prometheus}")])
        .arg("--data-dir")
        .arg(dir)
        .env("RUST_LOG", "warn,dubbo_cp::server=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = loop {
        let line = lines.next().context("dubbo-cp exited")??;
        if line.contains("dubbo-cp serving") {
            break line;
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let admin = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("admin_addr="))
        .and_then(|v| v.parse().ok())
        .context("no admin_addr")?;
    Ok(Plane { child, admin })
}

/// utime + stime of `pid`, seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name; 100 ticks/s.
    (ticks(11) + ticks(12)) / 100.0
}

async fn metrics(admin: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    stream.read_to_string(&mut out).await?;
    Ok(out)
}

/// A snapshot of what is counted.
#[derive(Clone)]
struct Snapshot {
    at: Instant,
    cpu: f64,
    reconciles: f64,
    writes: f64,
    buckets: Vec<(f64, f64)>,
    requests: BTreeMap<String, u64>,
}

fn value(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn snapshot(plane: &Plane, api: &ApiServer) -> anyhow::Result<Snapshot> {
    let text = metrics(plane.admin).await?;
    let buckets = text
        .lines()
        .filter_map(|l| l.strip_prefix("dubbo_cp_canary_duration_seconds_bucket{le=\""))
        .filter_map(|l| {
            let (le, rest) = l.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse().ok()?))
        })
        .collect();
    Ok(Snapshot {
        at: Instant::now(),
        cpu: cpu_seconds(plane.child.id()),
        reconciles: value(&text, "dubbo_cp_canary_reconciles_total"),
        writes: value(&text, "dubbo_cp_canary_api_writes_total"),
        buckets,
        requests: api.requests_per_resource(),
    })
}

fn report(label: &str, before: &Snapshot, after: &Snapshot) {
    let reconciles = after.reconciles - before.reconciles;
    let count = |s: &Snapshot, le: f64| {
        s.buckets
            .iter()
            .find(|(b, _)| *b == le)
            .map_or(0.0, |(_, c)| *c)
    };
    // The smallest bucket bound holding the quantile (the histogram's resolution).
    let quantile = |q: f64| {
        after
            .buckets
            .iter()
            .map(|(le, _)| (*le, count(after, *le) - count(before, *le)))
            .find(|(_, n)| *n >= q * reconciles)
            .map_or(f64::NAN, |(le, _)| le)
    };
    let (p50, p99) = (quantile(0.5), quantile(0.99));
    if std::env::var_os("CANARY_BENCH_BUCKETS").is_some() {
        for (le, n) in &after.buckets {
            eprintln!("le {le}: {}", n - count(before, *le));
        }
    }
    let requests: u64 = after
        .requests
        .iter()
        .filter(|(resource, _)| resource.as_str() != "leases")
        .map(|(resource, n)| n - before.requests.get(resource).copied().unwrap_or(0))
        .sum();
    let leases = after.requests.get("leases").copied().unwrap_or(0)
        - before.requests.get("leases").copied().unwrap_or(0);
    let cpu = after.cpu - before.cpu;
    let per = |x: f64| {
        if reconciles > 0.0 {
            x / reconciles
        } else {
            f64::NAN
        }
    };
    println!(
        "| {label} | {:.1} s | {reconciles:.0} | <= {:.2} ms | <= {:.2} ms | {:.2} ms | {:.2} | {:.2} | {leases} |",
        after.at.duration_since(before.at).as_secs_f64(),
        p50 * 1000.0,
        p99 * 1000.0,
        per(cpu) * 1000.0,
        per(requests as f64),
        per(after.writes - before.writes),
    );
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let api = ApiServer::start().await;
    api.create_namespace(NS);
    for i in 0..CANARIES {
        api.put_deployment(NS, &format!("app-{i}"), 2, "app:1");
    }
    // The Deployment controller and kubelet: every Deployment whose spec moved is rolled out.
    let kubelet = api.clone();
    tokio::spawn(async move {
        loop {
            for (n, deployment) in kubelet.objects_of("deployments", NS).iter().enumerate() {
                let behind = deployment["status"]["observedGeneration"].as_i64()
                    != deployment["metadata"]["generation"].as_i64()
                    || deployment["status"]["replicas"] != deployment["spec"]["replicas"];
                if behind {
                    let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
                    kubelet.roll_out(NS, name, &format!("10.{}.{}.", n / 250, n % 250));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // Prometheus: every success rate is 100 %.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let prometheus = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/api/v1/query",
        axum::routing::get(|| async {
            axum::Json(json!({"status": "success", "data": {"resultType": "vector",
                "result": [{"metric": {}, "value": [1.0, "100"]}]}}))
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir()?;
    let plane = spawn(&api, prometheus, dir.path())?;
    for i in 0..CANARIES {
        let name = format!("app-{i}");
        api.put_object(
            "canaries",
            NS,
            &name,
            json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
                   "metadata": {"name": name, "namespace": NS},
                   "spec": {"targetRef": {"name": name},
                            "analysis": {"interval": "1s", "threshold": 3, "maxWeight": 50, "stepWeight": 10,
                                         "metrics": [{"name": "request-success-rate", "thresholdRange": {"min": 99}}]}}}),
        );
    }
    let all_in = |phase: &'static str| {
        move |api: &ApiServer| {
            let canaries = api.objects_of("canaries", NS);
            canaries.len() == CANARIES && canaries.iter().all(|c| c["status"]["phase"] == phase)
        }
    };
    api.wait_for(
        "all Initialized",
        Duration::from_secs(120),
        all_in("Initialized"),
    )
    .await;
    println!(
        "| period | wall | reconciles | reconcile p50 | reconcile p99 | CPU per reconcile | API requests per reconcile | API writes per reconcile | Lease requests |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");

    let start = snapshot(&plane, &api).await?;
    for i in 0..CANARIES {
        api.set_image(NS, &format!("app-{i}"), "app:2");
    }
    api.wait_for(
        "all Succeeded",
        Duration::from_secs(300),
        all_in("Succeeded"),
    )
    .await;
    let done = snapshot(&plane, &api).await?;
    report(
        &format!("{CANARIES} runs, template change to promotion"),
        &start,
        &done,
    );

    // Quiet: every Canary idle, requeued each interval.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let quiet = snapshot(&plane, &api).await?;
    tokio::time::sleep(QUIET).await;
    let after = snapshot(&plane, &api).await?;
    report(
        &format!("{CANARIES} idle Canaries, {} s", QUIET.as_secs()),
        &quiet,
        &after,
    );
    Ok(())
}
