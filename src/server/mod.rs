//! All wiring in one place, as a short list of named steps: bind the ports, open the source of
//! truth (the embedded store, or the outbox and the watches in Kubernetes mode), build the
//! services, serve, and shut down in the order that loses nothing. Every long-lived task runs
//! under the [`Supervisor`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::server::{Connected, TcpIncoming};

use crate::admin::{self, MappingSource, Readiness};
use crate::auth::keys::ServiceAccountKeys;
use crate::auth::pods::PodView;
use crate::auth::serviceaccount::{CacheSettings, ServiceAccountAuthenticator};
use crate::auth::tokenreview::TokenReviewer;
use crate::auth::tokens::StaticTokens;
use crate::auth::{Authenticator, Policy, TokenVerifier};
use crate::ca::publish::PublishStats;
use crate::ca::service::{CaService, IssueLimits};
use crate::ca::store::{SecretRoots, SqliteRoots};
use crate::ca::{Authority, Backend, CaSettings};
use crate::config::{Config, Mode};
use crate::dds::{DdsStats, RuleService};
use crate::index::catalog::Catalog;
use crate::index::{Index, Kind};
use crate::ingest::Ingest;
use crate::k8s;
use crate::k8s::cluster::ClusterView;
use crate::k8s::watch::{MappingKind, RuleKind, WatchStats};
use crate::k8s::writer::{KubeDrain, WriterStats};
use crate::metrics::{self, Metrics};
use crate::pb;
use crate::ratelimit::RateLimiter;
use crate::shutdown::signalled;
use crate::store::rules::StandaloneRules;
use crate::store::{
    self, Durable, Outbox, RuleStore, Store, StoreLimits, StoreStats, StoreWriter, StoredChange,
};
use crate::supervisor::Supervisor;
use crate::tls::{ServingIdentity, TlsConfigs, TlsStats};

/// The registration service as the health service names it.
type RegistrationServer =
    pb::snp::service_name_mapping_service_server::ServiceNameMappingServiceServer<Ingest>;

/// gRPC is HTTP/2 only.
const GRPC_ALPN: &[&[u8]] = &[b"h2"];
/// The API server calls webhooks over HTTP/1.1.
const WEBHOOK_ALPN: &[&[u8]] = &[b"http/1.1"];

pub use dubbo_cp_kit::MAX_DECODING_MESSAGE_BYTES;
/// Committed changes that may wait for the debouncer before the writer waits.
const CHANGE_FEED_CAPACITY: usize = 1024;
/// TCP keepalive of accepted connections (HTTP/2 PINGs find dead peers sooner; this catches
/// half-open connections of clients that stopped answering at the TCP level).
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// A started control plane. Dropping it does not stop it; call [`RunningServer::shutdown`].
pub struct RunningServer {
    pub grpc_addr: SocketAddr,
    /// The TLS gRPC port, when configured.
    pub tls_addr: Option<SocketAddr>,
    /// The admission webhook's HTTPS port (Kubernetes mode).
    pub webhook_addr: Option<SocketAddr>,
    /// The xDS port, when xDS is enabled.
    pub xds_addr: Option<SocketAddr>,
    /// The connected xDS clients, when xDS is enabled.
    pub xds_clients: Option<Arc<crate::xds::clients::Clients>>,
    pub admin_addr: SocketAddr,
    pub index: Arc<Index>,
    /// The discovery stream's encoding of the index (shared by every stream).
    pub encoder: Arc<crate::dds::encode::Encoder>,
    pub store_stats: Arc<StoreStats>,
    pub dds_stats: Arc<DdsStats>,
    /// API-server request counters, in Kubernetes mode.
    pub kube_stats: Option<Arc<WriterStats>>,
    pub readiness: Readiness,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl RunningServer {
    /// The started server; its task shuts everything down in order once asked to.
    fn new(config: &Config, addrs: Addrs, source: Source, edges: Edges, wiring: Wiring) -> Self {
        RunningServer {
            grpc_addr: addrs.grpc,
            tls_addr: addrs.tls,
            webhook_addr: addrs.webhook,
            xds_addr: addrs.xds,
            xds_clients: edges.xds_clients.clone(),
            admin_addr: addrs.admin,
            index: source.index,
            encoder: edges.encoder,
            store_stats: source.durable.stats().clone(),
            dds_stats: edges.dds_stats,
            kube_stats: source
                .kube
                .as_ref()
                .map(|(writer, _)| writer.sink().stats()),
            readiness: wiring.readiness.clone(),
            task: tokio::spawn(shutdown_in_order(
                wiring.tasks,
                source.writer,
                wiring.readiness,
                edges.health,
                config.shutdown_grace,
                wiring.shutdown_rx,
            )),
            shutdown: wiring.shutdown,
        }
    }

    /// Starts a graceful shutdown; [`RunningServer::wait`] returns when it is done.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Waits until the server has shut down; an error says which task failed, if one did.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("server task failed")?
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown();
        self.wait().await
    }
}

/// The source of truth of the mode, and the handles the rest of the wiring needs of it.
struct Source {
    /// Starts at the store's revision, which every start moves past the last one.
    index: Arc<Index>,
    durable: Durable,
    writer: StoreWriter,
    mappings: MappingSource,
    kube: Option<(Arc<KubeDrain>, Outbox)>,
    /// The rules as served, and (standalone) where they are written.
    catalog: Arc<Catalog>,
    standalone_rules: Option<Arc<StandaloneRules>>,
    /// ZooKeeper mode's writer, rules, view and services.
    zookeeper: Option<ZkParts>,
}

/// What every step shares: the shutdown signal, readiness, the task supervisor, the metrics.
struct Wiring {
    shutdown: watch::Sender<bool>,
    shutdown_rx: watch::Receiver<bool>,
    readiness: Readiness,
    tasks: Supervisor,
    metrics: Arc<Metrics>,
    registry: Registry,
}

impl Wiring {
    fn new() -> Wiring {
        let (shutdown, shutdown_rx) = watch::channel(false);
        let readiness = Readiness::default();
        let tasks = Supervisor::new(shutdown.clone(), readiness.clone());
        let metrics = Arc::new(Metrics::default());
        let mut registry = Registry::with_prefix("dubbo_cp");
        metrics.register_metrics(&mut registry);
        Wiring {
            shutdown,
            shutdown_rx,
            readiness,
            tasks,
            metrics,
            registry,
        }
    }
}

/// Who may do what, and the CA that backs it.
struct Security {
    authority: Option<Authority>,
    policy: Policy,
}

/// The discovery stream's shared parts the admin port and the caller read too.
struct Edges {
    encoder: Arc<crate::dds::encode::Encoder>,
    dds_stats: Arc<DdsStats>,
    clients: Arc<crate::dds::clients::Clients>,
    xds_clients: Option<Arc<crate::xds::clients::Clients>>,
    /// What the xDS edge serves, for the split operators ask about.
    xds_snapshots: Option<tokio::sync::watch::Receiver<Arc<crate::xds::snapshot::Snapshot>>>,
    health: tonic_health::server::HealthReporter,
}

/// The gRPC services every gRPC port serves.
type Services = (
    Ingest,
    RuleService,
    tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
    Option<CaService>,
    Option<crate::xds::server::Ads>,
);

/// Starts the control plane; returns once every port accepts connections.
pub async fn start(config: Config) -> anyhow::Result<RunningServer> {
    check_config(&config)?;
    let mut wiring = Wiring::new();
    let listeners = Listeners::bind(&config).await?;
    let kube_client = match config.effective_mode() {
        Mode::Kubernetes => Some(k8s::client(config.kubernetes.api_server.as_deref()).await?),
        Mode::Standalone | Mode::Zookeeper => None,
    };
    let source = open_source(&config, kube_client.as_ref(), &mut wiring).await?;
    let security = open_security(&config, kube_client.as_ref(), &source, &mut wiring).await?;
    let (services, edges) = grpc_services(&config, &source, &security, &mut wiring).await;
    let addrs = listeners.addrs()?;
    let admin_listener = serve_grpc(
        &config,
        listeners,
        services,
        &security,
        kube_client.as_ref(),
        &mut wiring,
    )?;
    serve_admin(
        &config,
        admin_listener,
        (&source, &security, &edges),
        kube_client,
        &mut wiring,
    );
    wiring.readiness.set(true);
    announce(&addrs);
    Ok(RunningServer::new(&config, addrs, source, edges, wiring))
}

/// Settings that are wrong together, refused before anything is bound or opened.
fn check_config(config: &Config) -> anyhow::Result<()> {
    check_bind_policy(config)?;
    if let Some(dir) = &config.rules.dir {
        store::rules_dir::check_dir(dir)?;
    }
    Ok(())
}

/// The source of truth of the mode, with its metrics and the writer thread under supervision.
async fn open_source(
    config: &Config,
    kube_client: Option<&kube::Client>,
    wiring: &mut Wiring,
) -> anyhow::Result<Source> {
    let Wiring {
        metrics,
        registry,
        tasks,
        ..
    } = wiring;
    let mut source = match kube_client {
        Some(client) => open_kubernetes(config, client, metrics, registry, tasks).await?,
        None if config.effective_mode() == Mode::Zookeeper => {
            open_zookeeper(config, metrics, registry, tasks).await?
        }
        None => open_store(config, metrics, registry, tasks).await?,
    };
    source.index.register_metrics(registry);
    source.durable.stats().register_metrics(registry);
    if let Some(exited) = source.writer.take_exit_signal() {
        tasks.spawn("store writer", async move {
            let _ = exited.await;
            Ok(())
        });
    }
    Ok(source)
}

/// The admin port (HTTP) until shutdown: health, metrics (every one is registered by now), the
/// read-only views, the rule and CA APIs.
fn serve_admin(
    config: &Config,
    listener: TcpListener,
    (source, security, edges): (&Source, &Security, &Edges),
    kube_client: Option<kube::Client>,
    wiring: &mut Wiring,
) {
    let state = admin::AdminState {
        readiness: wiring.readiness.clone(),
        index: source.index.clone(),
        encoder: edges.encoder.clone(),
        mappings: source.mappings.clone(),
        outbox: source.kube.clone(),
        zookeeper: source.zookeeper.as_ref().map(|zk| admin::ZkAdmin {
            writer: zk.writer.clone(),
            outbox: zk.outbox.clone(),
            stats: zk.stats.clone(),
        }),
        registry: Arc::new(std::mem::take(&mut wiring.registry)),
        rules: admin::RuleAdmin {
            catalog: source.catalog.clone(),
            standalone: source.standalone_rules.clone(),
            zookeeper: source.zookeeper.as_ref().map(|zk| zk.rules.clone()),
            policy: security.policy.clone(),
            root_namespace: config.rules.root_namespace.clone(),
        },
        ca: security.authority.clone(),
        clients: edges.clients.clone(),
        xds_clients: edges.xds_clients.clone(),
        xds_snapshots: edges.xds_snapshots.clone(),
        canaries: kube_client.filter(|_| config.canary.enabled),
    };
    let listener = listener.tap_io(|tcp| {
        // Small responses (probes, /metrics) should not wait for Nagle.
        let _ = tcp.set_nodelay(true);
    });
    let serve = axum::serve(
        listener,
        admin::router(state).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(wait_for_shutdown(wiring.shutdown_rx.clone()));
    wiring.tasks.spawn("admin server", async move {
        serve.await.context("admin server failed")
    });
}

fn announce(addrs: &Addrs) {
    let Addrs {
        grpc: grpc_addr,
        admin: admin_addr,
        ..
    } = addrs;
    let xds_addr = addrs.xds.map(|addr| addr.to_string());
    let xds_addr = xds_addr.as_deref().unwrap_or("off");
    match addrs.tls {
        Some(tls_addr) => {
            tracing::info!(%grpc_addr, %tls_addr, %admin_addr, %xds_addr, "dubbo-cp serving");
        }
        None => tracing::info!(%grpc_addr, %admin_addr, %xds_addr, "dubbo-cp serving"),
    }
    // Where an operator looks first; the admin port's `/` redirects there too.
    tracing::info!("dashboard at http://{admin_addr}/ui");
}

/// Every port, bound before anything else starts, so a port in use fails the start at once.
struct Listeners {
    grpc: TcpListener,
    tls: Option<(TcpListener, ServingIdentity)>,
    admin: TcpListener,
    webhook: Option<TcpListener>,
    xds: Option<TcpListener>,
}

/// Where the ports listen (an address given with port 0 has its real port here).
#[derive(Clone, Copy)]
struct Addrs {
    grpc: SocketAddr,
    tls: Option<SocketAddr>,
    admin: SocketAddr,
    webhook: Option<SocketAddr>,
    xds: Option<SocketAddr>,
}

/// A port `serve` listens on, and how a user moves it.
#[derive(Clone, Copy)]
struct Port {
    what: &'static str,
    flag: &'static str,
    env: &'static str,
    key: &'static str,
}

const GRPC_PORT: Port = Port {
    what: "gRPC port",
    flag: "grpc-addr",
    env: "DUBBO_CP_GRPC_ADDR",
    key: "grpcAddr",
};
const ADMIN_PORT: Port = Port {
    what: "admin port",
    flag: "admin-addr",
    env: "DUBBO_CP_ADMIN_ADDR",
    key: "adminAddr",
};
const WEBHOOK_PORT: Port = Port {
    what: "webhook port",
    flag: "webhook-addr",
    env: "DUBBO_CP_WEBHOOK_ADDR",
    key: "webhook.addr",
};
const XDS_PORT: Port = Port {
    what: "xDS port",
    flag: "xds-addr",
    env: "DUBBO_CP_XDS_ADDR",
    key: "xds.addr",
};
const TLS_PORT: Port = Port {
    what: "TLS gRPC port",
    flag: "tls-addr",
    env: "DUBBO_CP_TLS_ADDR",
    key: "tls.addr",
};

impl Listeners {
    async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        // Every port is tried, and every one that cannot be had is named with the flag, the
        // variable and the file's key that move it: a second `serve` on one machine learns all
        // it must change at once, not one port per attempt.
        let mut failures = Vec::new();
        let mut bind = async |addr: SocketAddr, port: Port| match TcpListener::bind(addr).await {
            Ok(listener) => Some(listener),
            Err(err) => {
                failures.push(format!(
                    "cannot listen on {addr} for the {}: {err}; move it with --{} ({}, `{}` in the config file)",
                    port.what, port.flag, port.env, port.key
                ));
                None
            }
        };
        let grpc = bind(config.grpc_addr, GRPC_PORT).await;
        let admin = bind(config.admin_addr, ADMIN_PORT).await;
        let webhook =
            if config.mode == Mode::Kubernetes && config.webhook.enabled && config.ca.enabled {
                bind(config.webhook.addr, WEBHOOK_PORT).await
            } else {
                None
            };
        let xds = if config.xds.enabled {
            bind(config.xds.addr, XDS_PORT).await
        } else {
            None
        };
        let tls = match serving_identity(config)? {
            Some(tls) => bind(config.tls.addr, TLS_PORT).await.map(|l| (l, tls)),
            None => None,
        };
        if !failures.is_empty() {
            anyhow::bail!("{}", failures.join("\n"));
        }
        let (Some(grpc), Some(admin)) = (grpc, admin) else {
            anyhow::bail!("the gRPC and admin ports were not bound");
        };
        Ok(Listeners {
            xds,
            webhook,
            grpc,
            tls,
            admin,
        })
    }

    fn addrs(&self) -> anyhow::Result<Addrs> {
        Ok(Addrs {
            grpc: self.grpc.local_addr()?,
            admin: self.admin.local_addr()?,
            tls: self.tls.as_ref().map(|(l, _)| l.local_addr()).transpose()?,
            webhook: self
                .webhook
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
            xds: self.xds.as_ref().map(TcpListener::local_addr).transpose()?,
        })
    }
}

/// The shutdown, once asked for (SIGTERM, [`RunningServer::shutdown`], or a failed task):
/// stop taking traffic, let in-flight RPCs finish, commit what is queued, publish what is
/// pending, then stop the rest. Returns the failure, if a task failed.
async fn shutdown_in_order(
    mut tasks: Supervisor,
    writer: StoreWriter,
    readiness: Readiness,
    health: tonic_health::server::HealthReporter,
    grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    signalled(&mut shutdown).await;
    tracing::info!("shutting down: finishing in-flight registrations");
    readiness.set(false);
    health.set_not_serving::<RegistrationServer>().await;
    tasks.finish("gRPC server", grace).await;
    tasks.finish("TLS gRPC server", grace).await;
    tasks.finish("xDS server", grace).await;
    tasks.finish("ServiceNameMapping watch", grace).await;
    // Every acknowledged registration is committed; the writer commits what is queued, and its
    // exit closes the change feed, so the debouncer behind it publishes what is pending.
    tokio::task::spawn_blocking(move || writer.shutdown())
        .await
        .context("store writer shutdown failed")?;
    tasks.finish("store publisher", grace).await;
    tasks.finish("outbox feed", grace).await;
    tasks.finish_all(grace).await;
    match tasks.failure() {
        None => {
            tracing::info!("shutdown complete");
            Ok(())
        }
        Some(failure) => Err(anyhow::anyhow!(failure)),
    }
}

mod grpc;
mod kubernetes;
mod security;
mod sources;
mod zookeeper;

use grpc::*;
use kubernetes::*;
use security::*;
use sources::*;
use zookeeper::*;
