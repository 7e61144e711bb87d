//! `dubbo-cp agent --out DIR`: the certificate half of istio-agent. It obtains a workload
//! certificate from the CA (`AuthorityService/CreateIdentity`, a fresh P-256 key each time)
//! and keeps it in DIR as `cert-chain.pem`, `key.pem` and `root-cert.pem`, where gRPC's
//! `file_watcher` certificate provider (gRFC A29) re-reads it. It renews at the CA's
//! `refresh_time` (else half-way), at once when the CA bundle file changes, keeps the last good
//! files while the CA cannot be reached, and says how it is doing on `/healthz` and `/metrics`.
//!
//! A program of its own that runs beside workloads, not the control plane: it depends on the
//! CA's protocol (compiled here from `proto/ca.proto`) and the kit, never on the server's crates
//! (`tests/architecture.rs`). `dubbo-cp agent` runs it.
#![forbid(unsafe_code)]

mod files;
mod http;
mod issue;
mod pb;
mod pki;
mod xds_proxy;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use dubbo_cp_kit::backoff::jittered_backoff;
use dubbo_cp_kit::duration::DurationArg;
use dubbo_cp_kit::metrics::ReasonLabel;
use dubbo_cp_kit::telemetry::LogFormat;

/// The failure reasons, each a series from the start (0 until it happens).
const REASONS: [&str; 7] = [
    "unreachable",
    "refused",
    "bad_response",
    "token",
    "ca_cert",
    "write",
    "internal",
];
/// Retries after a failure start this far apart and double up to [`RETRY_MAX`], jittered.
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// The least time between two certificates, whatever their validity says: a CA that hands out
/// certificates about to expire (a root near its end) is not asked in a tight loop.
const MIN_RENEWAL_GAP: Duration = Duration::from_secs(1);

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The directory to keep `cert-chain.pem`, `key.pem` and `root-cert.pem` in (created when
    /// missing). One agent per directory.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The CA: `host:port` or `https://host:port` (TLS, verified with --ca-cert-file; the
    /// control plane's TLS port, 30062), or `http://host:port` (its plain gRPC port, 30060).
    /// Unset, the CLI's `DUBBO_CP_SERVER` (what every other command talks to), else
    /// `http://127.0.0.1:30060`.
    #[arg(long, env = "DUBBO_CA_ADDRESS")]
    pub ca_address: Option<String>,
    /// The CA's root bundle (PEM): verifies the CA over TLS, and is compared every
    /// --poll-interval: when its roots change (a rotation), the certificate is issued again.
    /// In Kubernetes the `dubbo-ca-cert` ConfigMap's `ca.crt`.
    #[arg(long, env = "DUBBO_CA_CERT_PATH", value_name = "FILE")]
    pub ca_cert_file: Option<PathBuf>,
    /// A file holding the bearer token, read at every request (projected service-account
    /// tokens rotate); without it the request carries no token.
    #[arg(long, env = "DUBBO_OIDC_TOKEN", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// `authorization-type` sent with the token.
    #[arg(long, env = "DUBBO_OIDC_TOKEN_TYPE", default_value = "dubbo-ca-token")]
    pub token_type: String,
    /// `host:port` to serve `/metrics` (Prometheus text) and `/healthz` on.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "once")]
    pub metrics_address: Option<String>,
    /// Write the files once and exit (init containers, scripts): exit status 1, with the
    /// reason, when no certificate could be had.
    #[arg(long)]
    pub once: bool,
    /// Renew at least this long before the certificate expires (gRPC re-reads the files only
    /// every 60 s), but never before half of its remaining validity.
    #[arg(long, default_value = "2m", value_parser = DurationArg)]
    pub renew_before: Duration,
    /// How often the CA bundle file and the files in --out are checked.
    #[arg(long, default_value = "5s", value_parser = DurationArg)]
    pub poll_interval: Duration,
    /// Also serve a plaintext xDS port here (`127.0.0.1:15010`), forwarding each stream to
    /// --xds-address over TLS with this workload's certificate: for gRPC libraries that cannot
    /// authenticate to the control plane themselves (@grpc/grpc-js-xds).
    #[arg(
        long,
        value_name = "HOST:PORT",
        conflicts_with = "once",
        requires = "xds_address"
    )]
    pub xds_proxy: Option<std::net::SocketAddr>,
    /// The control plane's TLS port as its certificate names it (`localhost:30062`,
    /// `dubbo-cp.dubbo-system.svc:30062`), for --xds-proxy.
    #[arg(long, env = "DUBBO_CP_XDS_ADDRESS", value_name = "HOST:PORT")]
    pub xds_address: Option<String>,
    /// `text` or `json`; the level comes from `RUST_LOG` (default `info`).
    #[arg(long, env = "DUBBO_CP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The agent's series, `dubbo_cp_agent_*`.
#[derive(Default)]
struct AgentMetrics {
    issued: Counter,
    failures: Family<ReasonLabel, Counter>,
    expiry: Gauge,
    roots: Gauge,
}

impl AgentMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "agent_certificates_issued",
            "Workload certificates obtained from the CA and written",
            self.issued.clone(),
        );
        registry.register(
            "agent_renewal_failures",
            "Certificate requests that gave no certificate, by reason",
            self.failures.clone(),
        );
        registry.register(
            "agent_certificate_expiry_seconds",
            "When the certificate on disk expires (unix seconds)",
            self.expiry.clone(),
        );
        registry.register(
            "agent_roots",
            "Trusted roots in root-cert.pem",
            self.roots.clone(),
        );
        for reason in REASONS {
            drop(self.failures.get_or_create(&ReasonLabel { reason }));
        }
    }

    fn on_disk(&self, leaf: &pki::Leaf, roots: usize) {
        self.expiry.set(pki::unix_seconds(leaf.not_after));
        self.roots.set(i64::try_from(roots).unwrap_or(i64::MAX));
    }
}

/// What the health endpoint reads besides the files.
#[derive(Debug, Default)]
pub struct Status {
    pub last_failure: Option<String>,
    pub renew_at: Option<SystemTime>,
}

/// Shared with the HTTP server.
pub struct Shared {
    pub dir: PathBuf,
    pub registry: Registry,
    status: Mutex<Status>,
}

impl Shared {
    pub fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Agent {
    ca: issue::Ca,
    dir: PathBuf,
    renew_before: Duration,
    poll: Duration,
    metrics: AgentMetrics,
    shared: Arc<Shared>,
}

/// The CA the agent asks: `--ca-address`/`DUBBO_CA_ADDRESS`, else the control plane the other
/// commands use (`DUBBO_CP_SERVER`, where a bare `host:port` is the plain gRPC port), so one
/// moved port moves both.
fn ca_address(given: Option<&str>) -> String {
    if let Some(given) = given {
        return given.to_owned();
    }
    match std::env::var("DUBBO_CP_SERVER") {
        Ok(server) if server.contains("://") => server,
        Ok(server) if !server.trim().is_empty() => format!("http://{}", server.trim()),
        _ => "http://127.0.0.1:30060".to_owned(),
    }
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    dubbo_cp_kit::telemetry::init(args.log_format);
    let ca = issue::Ca::new(
        &ca_address(args.ca_address.as_deref()),
        args.ca_cert_file.clone(),
        args.token_file.clone(),
        &args.token_type,
    )?;
    anyhow::ensure!(
        !args.poll_interval.is_zero(),
        "--poll-interval must be above zero"
    );
    prepare(&args.out)?;
    let metrics = AgentMetrics::default();
    let mut registry = Registry::with_prefix("dubbo_cp");
    metrics.register(&mut registry);
    let proxy_stats = xds_proxy::ProxyStats::default();
    if args.xds_proxy.is_some() {
        proxy_stats.register(&mut registry);
    }
    let shared = Arc::new(Shared {
        dir: args.out.clone(),
        registry,
        status: Mutex::default(),
    });
    let agent = Agent {
        ca,
        dir: args.out.clone(),
        renew_before: args.renew_before,
        poll: args.poll_interval,
        metrics,
        shared: shared.clone(),
    };
    if args.once {
        return agent
            .renew("--once")
            .await
            .map(drop)
            .map_err(|failure| anyhow::anyhow!(failure.message));
    }
    if let Some(address) = &args.metrics_address {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|err| {
                anyhow::anyhow!("--metrics-address {address:?}: cannot listen: {err}")
            })?;
        let bound = listener.local_addr()?;
        tracing::info!(metrics_address = %bound, "serving /metrics and /healthz");
        let router = http::router(shared);
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, router).await {
                tracing::error!(error = %err, "the metrics server stopped");
            }
        });
    }
    // Checked before anything runs: a bad address is a clear error at start.
    let proxy = match (args.xds_proxy, args.xds_address.as_deref()) {
        (Some(listen), Some(upstream)) => {
            anyhow::ensure!(
                listen.ip().is_loopback(),
                "--xds-proxy {listen}: must be a loopback address (127.0.0.1, ::1): every stream \
                 on it reaches the control plane as this workload"
            );
            Some((
                listen,
                xds_proxy::Proxy::new(upstream, args.out.clone(), proxy_stats)?,
            ))
        }
        _ => None,
    };
    let proxy = async move {
        match proxy {
            Some((listen, proxy)) => xds_proxy::serve(listen, proxy).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = agent.run() => Ok(()),
        result = proxy => result,
        result = dubbo_cp_kit::shutdown::terminated() => result.map_err(anyhow::Error::from),
    }
}

/// `--out` as a directory that exists.
fn prepare(dir: &std::path::Path) -> anyhow::Result<()> {
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!("--out {}: not a directory", dir.display());
    }
    std::fs::create_dir_all(dir)
        .map_err(|err| anyhow::anyhow!("--out {}: cannot create it: {err}", dir.display()))
}

/// When to renew a certificate valid from `start` (when it was issued) until `not_after`: at
/// the CA's `refresh` when it says one within that span, else half-way; never later than
/// `margin` before expiry, unless that would be before half-way (a short-lived certificate).
fn renewal_time(
    start: SystemTime,
    not_after: SystemTime,
    refresh: Option<SystemTime>,
    margin: Duration,
) -> SystemTime {
    let lifetime = not_after.duration_since(start).unwrap_or_default();
    let half = start + lifetime / 2;
    let suggested = refresh
        .filter(|at| *at > start && *at < not_after)
        .unwrap_or(half);
    let latest = not_after
        .checked_sub(margin)
        .map_or(half, |at| at.max(half));
    suggested.min(latest)
}

/// The roots of a bundle, in an order that does not matter to the comparison.
fn root_set(mut roots: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    roots.sort();
    roots.dedup();
    roots
}

/// The CA bundle file as last read.
#[derive(Default)]
struct BundleWatch {
    seen: Option<Vec<u8>>,
    /// Said once until it is readable again.
    unreadable: bool,
}

impl Agent {
    /// Asks the CA, writes the files, and counts it; the time of the next renewal.
    async fn renew(&self, reason: &str) -> Result<SystemTime, issue::Failure> {
        let issued = self.ca.issue().await?;
        let now = SystemTime::now();
        let renew_at = renewal_time(
            now,
            issued.leaf.not_after,
            issued.refresh,
            self.renew_before,
        )
        .max(now + MIN_RENEWAL_GAP);
        let new = files::NewFiles {
            key_pem: &issued.key_pem,
            chain: &issued.chain,
            roots: &issued.roots,
        };
        files::write(&self.dir, &new).map_err(|message| issue::Failure {
            reason: "write",
            message,
        })?;
        self.metrics.issued.inc();
        self.metrics.on_disk(&issued.leaf, issued.roots.len());
        {
            let mut status = self.shared.status();
            status.last_failure = None;
            status.renew_at = Some(renew_at);
        }
        tracing::info!(
            spiffe_id = issued.leaf.spiffe_id.as_deref().unwrap_or("(none)"),
            not_after = %pki::rfc3339(issued.leaf.not_after),
            renew_at = %pki::rfc3339(renew_at),
            serial = %issued.leaf.serial,
            roots = issued.roots.len(),
            reason,
            out = %self.dir.display(),
            "workload certificate issued"
        );
        Ok(renew_at)
    }

    /// When to ask first, from what DIR holds (a restart keeps serving valid files).
    fn start(&self) -> (SystemTime, &'static str) {
        let now = SystemTime::now();
        match files::inspect(&self.dir) {
            Ok(on_disk) if on_disk.leaf.not_after > now => {
                self.metrics.on_disk(&on_disk.leaf, on_disk.roots.len());
                let at = renewal_time(
                    on_disk.leaf.not_before,
                    on_disk.leaf.not_after,
                    None,
                    self.renew_before,
                )
                .max(now);
                self.shared.status().renew_at = Some(at);
                tracing::info!(
                    spiffe_id = on_disk.leaf.spiffe_id.as_deref().unwrap_or("(none)"),
                    not_after = %pki::rfc3339(on_disk.leaf.not_after),
                    renew_at = %pki::rfc3339(at),
                    out = %self.dir.display(),
                    "using the certificate already in the directory"
                );
                (at, "renewal due")
            }
            Ok(on_disk) => {
                self.metrics.on_disk(&on_disk.leaf, on_disk.roots.len());
                tracing::info!(
                    not_after = %pki::rfc3339(on_disk.leaf.not_after),
                    out = %self.dir.display(),
                    "the certificate in the directory has expired; asking for a new one"
                );
                (now, "expired")
            }
            Err(why) => {
                tracing::info!(out = %self.dir.display(), "no usable certificate ({why}); asking for one");
                (now, "no certificate")
            }
        }
    }

    /// Whether the CA bundle file changed since last read, to roots other than those in
    /// `root-cert.pem` (the first read compares too: a restart after a rotation).
    fn bundle_changed(&self, watch: &mut BundleWatch) -> bool {
        let Some(file) = &self.ca.ca_cert_file else {
            return false;
        };
        let content = match std::fs::read(file) {
            Ok(content) => content,
            Err(err) => {
                if !watch.unreadable {
                    tracing::warn!(file = %file.display(), error = %err, "cannot read --ca-cert-file; keeping the certificate as it is");
                }
                watch.unreadable = true;
                return false;
            }
        };
        watch.unreadable = false;
        if watch.seen.as_deref() == Some(content.as_slice()) {
            return false;
        }
        let text = String::from_utf8_lossy(&content).into_owned();
        watch.seen = Some(content);
        let roots = match pki::certificates(&text) {
            Ok(roots) if !roots.is_empty() => roots,
            _ => {
                tracing::warn!(file = %file.display(), "--ca-cert-file holds no PEM certificate; ignoring this version of it");
                return false;
            }
        };
        let changed = root_set(roots) != root_set(files::roots_on_disk(&self.dir));
        if changed {
            tracing::info!(file = %file.display(), "the CA bundle holds other roots than root-cert.pem; issuing again");
        }
        changed
    }

    /// Counts, shows and logs a request that gave no certificate.
    fn failed(&self, failure: &issue::Failure, retry_in: Duration) {
        self.metrics
            .failures
            .get_or_create(&ReasonLabel {
                reason: failure.reason,
            })
            .inc();
        self.shared.status().last_failure = Some(failure.message.clone());
        // Whole milliseconds: humantime would print the jitter down to the nanosecond.
        let retry_in =
            Duration::from_millis(u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX));
        tracing::warn!(
            ca = %self.ca.address,
            reason = failure.reason,
            error = %failure.message,
            retry_in = %humantime::format_duration(retry_in),
            out = %self.dir.display(),
            "no certificate from the CA; the files in the directory are left as they are"
        );
    }

    /// Renews until the process is stopped.
    async fn run(&self) {
        let (mut due, mut reason) = self.start();
        let mut bundle = BundleWatch::default();
        let mut failures: u32 = 0;
        // Whether DIR held usable files at the last look.
        let mut usable = self.shared.status().renew_at.is_some();
        loop {
            let now = SystemTime::now();
            if self.bundle_changed(&mut bundle) {
                (due, reason) = (due.min(now), "CA bundle changed");
            }
            if usable && let Err(why) = files::inspect(&self.dir) {
                tracing::warn!(out = %self.dir.display(), "the files changed under the agent ({why}); asking again");
                (due, reason) = (now, "files changed");
            }
            if now >= due {
                match self.renew(reason).await {
                    Ok(next) => {
                        (due, reason, failures, usable) = (next, "renewal due", 0, true);
                    }
                    Err(failure) => {
                        let delay = jittered_backoff(failures, RETRY_BASE, RETRY_MAX);
                        failures = failures.saturating_add(1);
                        due = SystemTime::now() + delay;
                        usable = files::inspect(&self.dir).is_ok();
                        self.failed(&failure, delay);
                    }
                }
            }
            if let Ok(wait) = due.duration_since(SystemTime::now()) {
                tokio::time::sleep(wait.min(self.poll)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_at_the_cas_word_or_half_way_and_before_the_margin() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        let margin = Duration::from_secs(120);
        let at = |offset: u64| start + Duration::from_secs(offset);
        // The CA's word (dubbo-cp says half-way).
        assert_eq!(
            renewal_time(start, at(3600), Some(at(1800)), margin),
            at(1800)
        );
        // Nothing said, or nonsense: half-way.
        assert_eq!(renewal_time(start, at(3600), None, margin), at(1800));
        assert_eq!(
            renewal_time(start, at(3600), Some(at(7200)), margin),
            at(1800)
        );
        assert_eq!(renewal_time(start, at(3600), Some(start), margin), at(1800));
        // A CA that says "at 99 %": no later than the margin before expiry.
        assert_eq!(
            renewal_time(start, start + hour, Some(at(3564)), margin),
            at(3480)
        );
        // A certificate shorter than twice the margin: half-way all the same.
        assert_eq!(renewal_time(start, at(4), None, margin), at(2));
        // Already expired (read from disk): at its start, i.e. now once clamped.
        assert_eq!(renewal_time(start, start, None, margin), start);
    }

    #[test]
    fn root_sets_ignore_order_and_repeats() {
        let (a, b) = (vec![1u8], vec![2u8]);
        assert_eq!(
            root_set(vec![b.clone(), a.clone(), a.clone()]),
            root_set(vec![a.clone(), b.clone()])
        );
        assert_ne!(root_set(vec![a]), root_set(vec![b]));
    }
}
