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
use crate::k8s::writer::{KubeWriter, WriterStats};
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
    kube: Option<(Arc<KubeWriter>, Outbox)>,
    /// The rules as served, and (standalone) where they are written.
    catalog: Arc<Catalog>,
    standalone_rules: Option<Arc<StandaloneRules>>,
}

/// Starts the control plane; returns once every port accepts connections.
pub async fn start(config: Config) -> anyhow::Result<RunningServer> {
    check_bind_policy(&config)?;
    if let Some(dir) = &config.rules.dir {
        store::rules_dir::check_dir(dir)?;
    }
    let (shutdown, shutdown_rx) = watch::channel(false);
    let readiness = Readiness::default();
    let mut tasks = Supervisor::new(shutdown.clone(), readiness.clone());
    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::with_prefix("dubbo_cp");
    metrics.register_metrics(&mut registry);

    let listeners = Listeners::bind(&config).await?;
    let kube_client = match config.mode {
        Mode::Kubernetes => Some(k8s::client(config.kubernetes.api_server.as_deref()).await?),
        Mode::Standalone => None,
    };
    let mut source = match &kube_client {
        None => open_store(&config, &metrics, &mut registry, &mut tasks).await?,
        Some(client) => {
            open_kubernetes(&config, client, &metrics, &mut registry, &mut tasks).await?
        }
    };
    let index = source.index.clone();
    index.register_metrics(&mut registry);
    source.durable.stats().register_metrics(&mut registry);
    if let Some(exited) = source.writer.take_exit_signal() {
        tasks.spawn("store writer", async move {
            let _ = exited.await;
            Ok(())
        });
    }

    let authority = open_ca(&config, kube_client.as_ref(), &mut registry, &mut tasks).await?;
    let (policy, pods) = auth_policy(
        &config,
        kube_client.as_ref(),
        &mut registry,
        &mut tasks,
        shutdown_rx.clone(),
    )?;
    start_expiry(
        &config,
        &source,
        kube_client.as_ref().zip(pods),
        &mut registry,
        &mut tasks,
    );
    if let Some(client) = &kube_client {
        start_canaries(&config, client, &mut registry, &mut tasks);
    }
    let policy = policy.with_dubbo_jwt(
        authority
            .clone()
            .map(|a| Arc::new(a) as Arc<dyn TokenVerifier>),
    );
    let ingest = Ingest::new(
        source.durable.clone(),
        &config.ingest,
        policy.clone(),
        metrics.clone(),
    );
    let encoder = Arc::new(crate::dds::encode::Encoder::default());
    encoder.register_metrics(&mut registry);
    let rules = RuleService::new(
        index.clone(),
        encoder.clone(),
        config.dds,
        policy.clone(),
        metrics.clone(),
        shutdown_rx.clone(),
    );
    let dds_stats = rules.stats();
    dds_stats.register_metrics(&mut registry);
    let clients = rules.clients();
    clients.register_metrics(index.clone(), &mut registry);
    registry.register_collector(Box::new(crate::digest::DigestMetric(
        index.clone(),
        encoder.clone(),
    )));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RegistrationServer>().await;
    let ca_service = authority.clone().map(|authority| {
        CaService::new(
            authority,
            policy.clone(),
            IssueLimits {
                per_second: config.ca.issues_per_second,
                burst: config.ca.issue_burst,
                concurrency: std::thread::available_parallelism()
                    .map(|n| n.get() / 2)
                    .unwrap_or(1),
            },
        )
    });
    let services = (ingest, rules, health_service, ca_service);

    let Listeners {
        grpc,
        tls,
        admin: admin_listener,
        webhook: webhook_listener,
        grpc_addr,
        tls_addr,
        admin_addr,
        webhook_addr,
    } = listeners;
    let tls_stats = Arc::new(TlsStats::default());
    tls_stats.register_metrics(&mut registry);
    if let (Some(listener), Some(authority), Some(client)) =
        (webhook_listener, &authority, &kube_client)
    {
        start_webhook(
            &config,
            (
                listener,
                tls_addr.map_or(config.tls.addr.port(), |addr| addr.port()),
            ),
            authority,
            client,
            tls_stats.clone(),
            &mut registry,
            &mut tasks,
        )?;
    }
    if let Some((listener, identity)) = tls {
        let stats = tls_stats.clone();
        let (configs, maintain) = TlsConfigs::start(
            identity,
            config.tls.client_ca_file.clone(),
            authority.clone(),
            stats.clone(),
            GRPC_ALPN,
            shutdown_rx.clone(),
        )?;
        tasks.spawn("TLS certificate", async move {
            maintain.await;
            Ok(())
        });
        let incoming = crate::tls::incoming(listener, configs.current, TCP_KEEPALIVE, stats);
        let serve = grpc_serve(
            &config,
            metrics.clone(),
            services.clone(),
            incoming,
            shutdown_rx.clone(),
        )?;
        tasks.spawn("TLS gRPC server", async move {
            serve.await.context("TLS gRPC server failed")
        });
    }
    let serve = grpc_serve(
        &config,
        metrics.clone(),
        services,
        // Our own listener, so NODELAY and keepalive must be set on the incoming stream.
        TcpIncoming::from(grpc)
            .with_nodelay(Some(true))
            .with_keepalive(Some(TCP_KEEPALIVE)),
        shutdown_rx.clone(),
    )?;
    tasks.spawn("gRPC server", async move {
        serve.await.context("gRPC server failed")
    });

    let admin_state = admin::AdminState {
        readiness: readiness.clone(),
        index: index.clone(),
        encoder: encoder.clone(),
        mappings: source.mappings.clone(),
        outbox: source.kube.clone(),
        registry: Arc::new(registry),
        rules: admin::RuleAdmin {
            catalog: source.catalog.clone(),
            standalone: source.standalone_rules.clone(),
            policy: policy.clone(),
        },
        ca: authority.clone(),
        clients,
        canaries: kube_client.clone().filter(|_| config.canary.enabled),
    };
    let admin_listener = admin_listener.tap_io(|tcp| {
        // Small responses (probes, /metrics) should not wait for Nagle.
        let _ = tcp.set_nodelay(true);
    });
    let admin_serve = axum::serve(
        admin_listener,
        admin::router(admin_state).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(wait_for_shutdown(shutdown_rx.clone()));
    tasks.spawn("admin server", async move {
        admin_serve.await.context("admin server failed")
    });

    readiness.set(true);
    match tls_addr {
        Some(tls_addr) => tracing::info!(%grpc_addr, %tls_addr, %admin_addr, "dubbo-cp serving"),
        None => tracing::info!(%grpc_addr, %admin_addr, "dubbo-cp serving"),
    }
    // Where an operator looks first; the admin port's `/` redirects there too.
    tracing::info!("dashboard at http://{admin_addr}/ui");
    let store_stats = source.durable.stats().clone();
    let kube_stats = source.kube.as_ref().map(|(writer, _)| writer.stats());
    let task = tokio::spawn(shutdown_in_order(
        tasks,
        source.writer,
        readiness.clone(),
        health,
        config.shutdown_grace,
        shutdown_rx,
    ));
    Ok(RunningServer {
        grpc_addr,
        tls_addr,
        webhook_addr,
        admin_addr,
        index,
        encoder,
        store_stats,
        dds_stats,
        kube_stats,
        readiness,
        shutdown,
        task,
    })
}

/// Every port, bound before anything else starts, so a port in use fails the start at once.
struct Listeners {
    grpc: TcpListener,
    tls: Option<(TcpListener, ServingIdentity)>,
    admin: TcpListener,
    webhook: Option<TcpListener>,
    grpc_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    admin_addr: SocketAddr,
    webhook_addr: Option<SocketAddr>,
}

impl Listeners {
    async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let bind = |addr: SocketAddr, what: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot bind the {what} {addr}"))
        };
        let grpc = bind(config.grpc_addr, "gRPC port").await?;
        let admin = bind(config.admin_addr, "admin port").await?;
        let webhook =
            if config.mode == Mode::Kubernetes && config.webhook.enabled && config.ca.enabled {
                Some(bind(config.webhook.addr, "webhook port").await?)
            } else {
                None
            };
        let tls = match serving_identity(config)? {
            Some(tls) => Some((bind(config.tls.addr, "TLS gRPC port").await?, tls)),
            None => None,
        };
        Ok(Listeners {
            grpc_addr: grpc.local_addr()?,
            admin_addr: admin.local_addr()?,
            tls_addr: tls.as_ref().map(|(l, _)| l.local_addr()).transpose()?,
            webhook_addr: webhook.as_ref().map(TcpListener::local_addr).transpose()?,
            webhook,
            grpc,
            tls,
            admin,
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

use grpc::*;
use kubernetes::*;
use security::*;
use sources::*;
