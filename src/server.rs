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

/// Standalone: the embedded store is the truth; its change feed is debounced into the index.
async fn open_store(
    config: &Config,
    metrics: &Arc<Metrics>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<Source> {
    let (changes_tx, changes) = mpsc::channel::<StoredChange>(CHANGE_FEED_CAPACITY);
    let data_dir = config.data_dir.clone();
    let limits = store_limits(config);
    let (store, writer) =
        tokio::task::spawn_blocking(move || Store::open(&data_dir, limits, changes_tx))
            .await
            .context("store open task failed")?
            .with_context(|| format!("cannot open the store in {}", config.data_dir.display()))?;
    let index = Arc::new(Index::new(store.opened_revision()));
    let catalog = Arc::new(Catalog::default());
    let rules = open_rules(config, &index, &catalog, store.opened_revision()).await?;
    if let Some(dir) = &config.rules.dir {
        // Watched first, so a change during the first apply is not missed.
        let watching = store::rules_dir::watch(dir)?;
        // Applied before the index is marked loaded: clients never see a state without it.
        let (first_rules, first_catalog, first_dir) = (rules.clone(), catalog.clone(), dir.clone());
        let mut state = store::rules_dir::DirState::default();
        state.stats().register_metrics(registry);
        let state = tokio::task::spawn_blocking(move || {
            store::rules_dir::apply_once(&first_rules, &first_catalog, &first_dir, &mut state);
            state
        })
        .await
        .context("rules directory task failed")?;
        let reload = store::rules_dir::run(
            rules.clone(),
            catalog.clone(),
            dir.clone(),
            state,
            watching,
            tasks.shutdown_receiver(),
        );
        tasks.spawn("rules directory", reload);
    }
    store::load_index(&store, &index);
    tracing::info!(
        mappings = index.current(Kind::ServiceNameMapping).objects.len(),
        revision = store.opened_revision(),
        data_dir = %config.data_dir.display(),
        "store opened"
    );
    let publish = store::publish(
        config.debounce,
        changes,
        store.clone(),
        index.clone(),
        metrics.clone(),
    );
    tasks.spawn("store publisher", async move {
        publish.await;
        Ok(())
    });
    Ok(Source {
        index,
        durable: Durable::Store(store.clone()),
        writer,
        mappings: MappingSource::Store(store),
        kube: None,
        catalog,
        standalone_rules: Some(rules),
    })
}

/// Standalone rules: the store's rule table (same file, its own connection) into the index.
async fn open_rules(
    config: &Config,
    index: &Arc<Index>,
    catalog: &Arc<Catalog>,
    revision: i64,
) -> anyhow::Result<Arc<StandaloneRules>> {
    let data_dir = config.data_dir.clone();
    let (store, rules) = tokio::task::spawn_blocking(move || RuleStore::open(&data_dir))
        .await
        .context("rule store open task failed")?
        .context("cannot open the rule store")?;
    tracing::info!(rules = rules.len(), "rules loaded");
    Ok(Arc::new(StandaloneRules::new(
        store,
        rules,
        index.clone(),
        catalog.clone(),
        config.rules.root_namespace.clone(),
        revision,
    )))
}

/// Kubernetes mode: registrations wait in the outbox until the per-key writer has put them in
/// the cluster; the watch of the objects is the only way into the index.
async fn open_kubernetes(
    config: &Config,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<Source> {
    anyhow::ensure!(
        config.rules.dir.is_none(),
        "rules.dir (--rules-dir) is for standalone mode; in Kubernetes mode apply the manifests with kubectl"
    );
    let cluster = Arc::new(ClusterView::default());
    let catalog = Arc::new(Catalog::default());
    let (changes_tx, changes) = mpsc::channel::<StoredChange>(CHANGE_FEED_CAPACITY);
    let data_dir = config.data_dir.clone();
    let limits = store_limits(config);
    let known = (cluster.applications(), cluster.registrants());
    let (outbox, writer) =
        tokio::task::spawn_blocking(move || Outbox::open(&data_dir, known, limits, changes_tx))
            .await
            .context("outbox open task failed")?
            .with_context(|| format!("cannot open the outbox in {}", config.data_dir.display()))?;
    outbox.register_metrics(registry);
    let index = Arc::new(Index::new(outbox.opened_revision()));

    let kube_writer = Arc::new(KubeWriter::new(
        client.clone(),
        config.kubernetes.writer,
        cluster.clone(),
    ));
    kube_writer.register_metrics(registry);
    // What was acknowledged but not yet written before the last stop goes out first.
    let pending = outbox.pending();
    tracing::info!(pending = pending.len(), data_dir = %config.data_dir.display(), "outbox opened");
    let mut delta = crate::mapping::MappingDelta::default();
    for (key, apps) in pending {
        for app in apps {
            delta.add(key.clone(), app);
        }
    }
    kube_writer.enqueue(delta);

    let shutdown = tasks.shutdown_receiver();
    let run = kube_writer.clone().run(outbox.clone(), shutdown.clone());
    tasks.spawn("Kubernetes writer", async move {
        run.await;
        Ok(())
    });
    let feed = k8s::writer::feed(
        config.debounce,
        changes,
        kube_writer.clone(),
        metrics.clone(),
    );
    tasks.spawn("outbox feed", async move {
        feed.await;
        Ok(())
    });

    let watch_stats = Arc::new(WatchStats::default());
    watch_stats.register_metrics(registry);
    let mappings = Arc::new(MappingKind {
        cluster: cluster.clone(),
    });
    let watch = k8s::watch::run(
        mappings,
        client.clone(),
        index.clone(),
        config.debounce,
        metrics.clone(),
        watch_stats.clone(),
        shutdown,
    );
    tasks.spawn("ServiceNameMapping watch", async move {
        watch.await;
        Ok(())
    });
    // One watch per rule kind, through the same debounce stage; each marks its kind loaded
    // after its first list.
    for kind in crate::rules::RULE_KINDS {
        let watched = Arc::new(RuleKind {
            kind,
            catalog: catalog.clone(),
            root_namespace: config.rules.root_namespace.clone(),
        });
        let watch = k8s::watch::run(
            watched,
            client.clone(),
            index.clone(),
            config.debounce,
            metrics.clone(),
            watch_stats.clone(),
            tasks.shutdown_receiver(),
        );
        // Named by the plural, as `kubectl get` names them.
        tasks.spawn(kind.plural(), async move {
            watch.await;
            Ok(())
        });
    }
    Ok(Source {
        index,
        durable: Durable::Outbox(outbox.clone()),
        writer,
        mappings: MappingSource::Cluster(cluster),
        kube: Some((kube_writer, outbox)),
        catalog,
        standalone_rules: None,
    })
}

fn store_limits(config: &Config) -> StoreLimits {
    StoreLimits {
        queue_capacity: config.ingest.queue_capacity,
        queue_bytes: config.ingest.queue_bytes,
        max_batch: config.ingest.max_batch,
        max_applications_per_key: config.ingest.max_applications_per_key,
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

/// The authentication and authorization of the configuration: a token file (watched for
/// changes), service-account tokens in Kubernetes mode, or none.
fn auth_policy(
    config: &Config,
    kube_client: Option<&kube::Client>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(Policy, Option<Arc<PodView>>)> {
    let policy = |authenticator: Option<Arc<dyn Authenticator>>| {
        Policy::new(
            authenticator,
            config.auth.admins.clone(),
            config.auth.legacy_answers,
        )
        .with_trust_domain(Some(config.tls.trust_domain.clone()))
    };
    if config.uses_token_review() {
        let client =
            kube_client.context("service-account authentication needs a Kubernetes client")?;
        let (authenticator, pods) = service_accounts(config, client, registry, tasks);
        return Ok((policy(Some(authenticator)), Some(pods)));
    }
    let Some(path) = &config.auth.token_file else {
        return Ok((policy(None), None));
    };
    let (tokens, modified) = StaticTokens::open(path)?;
    let reload = config.auth.reload_interval;
    let watched = tokens.clone();
    tasks.spawn("token file watch", async move {
        tokio::select! {
            () = watched.watch(reload, modified) => {}
            () = signalled(&mut shutdown) => {}
        }
        Ok(())
    });
    Ok((policy(Some(tokens)), None))
}

/// Kubernetes mode with pod-bound tokens: applications whose registering pods are gone leave
/// their mappings after `mapping.expireAfter`. Without pod identities nothing can expire.
fn start_expiry(
    config: &Config,
    source: &Source,
    cluster: Option<(&kube::Client, Arc<PodView>)>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) {
    let (Some((client, pods)), Some((_, outbox)), MappingSource::Cluster(view)) =
        (cluster, &source.kube, &source.mappings)
    else {
        return;
    };
    if config.mapping.expire_after.is_zero() {
        tracing::info!("mapping.expireAfter is 0: applications never expire");
        return;
    }
    let expiry = k8s::expiry::Expiry::new(
        client.clone(),
        view.clone(),
        pods,
        outbox.clone(),
        config.mapping.expire_after,
    );
    expiry.stats().register_metrics(registry);
    let run = expiry.run(tasks.shutdown_receiver());
    tasks.spawn("mapping expiry", async move {
        run.await;
        Ok(())
    });
}

/// Kubernetes mode: the canary controller, behind its Lease.
fn start_canaries(
    config: &Config,
    client: &kube::Client,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) {
    let settings = &config.canary;
    if !settings.enabled {
        return;
    }
    let identity = settings.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "dubbo-cp".to_owned());
        format!("{host}-{}", std::process::id())
    });
    let elector = crate::canary::lease::Elector::new(
        client.clone(),
        &settings.lease_namespace,
        "dubbo-cp-canary",
        &identity,
        settings.lease_duration,
    );
    let stats = Arc::new(crate::canary::stats::CanaryStats::default());
    stats.register_metrics(registry);
    let run = crate::canary::controller::run(
        client.clone(),
        elector,
        crate::canary::reconcile::Settings {
            prometheus: settings.prometheus.clone(),
            query_timeout: settings.query_timeout,
        },
        stats,
        tasks.shutdown_receiver(),
    );
    tasks.spawn("canary controller", async move {
        run.await;
        Ok(())
    });
}

/// Kubernetes authentication: the cluster's token keys and its pods, both kept by background
/// tasks, in front of a paced TokenReview.
fn service_accounts(
    config: &Config,
    client: &kube::Client,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> (Arc<dyn Authenticator>, Arc<PodView>) {
    let auth = &config.auth;
    let requests = Arc::new(RateLimiter::new(
        auth.token_reviews_per_second,
        auth.token_reviews_burst,
    ));
    let keys = Arc::new(ServiceAccountKeys::new(
        client.clone(),
        auth.keys_refresh_interval,
    ));
    let refresh = keys
        .clone()
        .run(auth.keys_refresh_interval, tasks.shutdown_receiver());
    tasks.spawn("service-account keys", async move {
        refresh.await;
        Ok(())
    });
    let pods = Arc::new(PodView::new(client.clone(), requests.clone()));
    let watch = pods.clone().run(tasks.shutdown_receiver());
    tasks.spawn("pod watch", async move {
        watch.await;
        Ok(())
    });
    let authenticator = ServiceAccountAuthenticator::new(
        keys,
        pods.clone(),
        TokenReviewer::new(client.clone()),
        requests,
        auth.api_audiences.clone(),
        CacheSettings {
            ttl: auth.cache_ttl,
            negative_ttl: auth.negative_cache_ttl,
            max_bytes: auth.cache_bytes,
        },
    );
    authenticator.stats().register_metrics(registry);
    (Arc::new(authenticator), pods)
}

/// Refuses to serve an unauthenticated control plane beyond loopback unless told to.
fn check_bind_policy(config: &Config) -> anyhow::Result<()> {
    let tls_exposed = (config.tls.cert_file.is_some() || config.ca.enabled)
        && !config.tls.addr.ip().is_loopback();
    if (config.grpc_addr.ip().is_loopback() && !tls_exposed) || config.authenticates() {
        return Ok(());
    }
    if !config.insecure_allow_unauthenticated {
        anyhow::bail!(
            "refusing to serve unauthenticated registrations on {}: bind a loopback address, or pass \
             --insecure-allow-unauthenticated to accept that anyone who reaches this port can steer traffic",
            config.grpc_addr
        );
    }
    tracing::warn!(
        grpc_addr = %config.grpc_addr,
        "INSECURE: serving without authentication on a non-loopback address; anyone who reaches \
         this port can register mappings"
    );
    Ok(())
}

/// The admission webhook: its HTTPS server with a certificate from the CA, the watches it reads
/// and the configuration object it keeps.
fn start_webhook(
    config: &Config,
    // The webhook's listener, and the TLS port pods are told to ask for certificates on.
    (listener, tls_port): (TcpListener, u16),
    authority: &Authority,
    client: &kube::Client,
    tls_stats: Arc<TlsStats>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<()> {
    use crate::webhook::{self, cluster::ClusterLookup, configuration};
    let (service, namespace) = (&config.ca.service_name, &config.ca.namespace);
    let mut names = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        "localhost".to_owned(),
    ];
    if let Some(url) = &config.webhook.url {
        let host = http::Uri::try_from(url.as_str())
            .ok()
            .and_then(|uri| uri.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
            .with_context(|| format!("webhook.url {url:?} has no host"))?;
        names.push(host);
    }
    let addr = listener.local_addr()?;
    let (configs, maintain) = TlsConfigs::start(
        ServingIdentity::Ca { names },
        None,
        Some(authority.clone()),
        tls_stats.clone(),
        WEBHOOK_ALPN,
        tasks.shutdown_receiver(),
    )?;
    tasks.spawn("webhook certificate", async move {
        maintain.await;
        Ok(())
    });
    let lookup = Arc::new(ClusterLookup::new(client.clone()));
    let watches = lookup
        .clone()
        .run(client.clone(), tasks.shutdown_receiver());
    tasks.spawn("webhook watches", async move {
        watches.await;
        Ok(())
    });
    let stats = Arc::new(webhook::WebhookStats::default());
    stats.register_metrics(registry);
    let hook = webhook::Webhook {
        lookup: lookup.clone(),
        cluster: Some(lookup),
        slots: Arc::new(tokio::sync::Semaphore::new(webhook::MAX_CONCURRENT_REVIEWS)),
        ca_address: config
            .webhook
            .ca_address
            .clone()
            .unwrap_or_else(|| format!("{service}.{namespace}.svc:{tls_port}"))
            .into(),
        timeout: config.webhook.timeout,
        stats,
    };
    let incoming = crate::tls::incoming(listener, configs.current, TCP_KEEPALIVE, tls_stats);
    let serve = axum::serve(
        crate::tls::TlsListener { incoming, addr },
        webhook::router(hook),
    )
    .with_graceful_shutdown(wait_for_shutdown(tasks.shutdown_receiver()));
    tasks.spawn("webhook server", async move {
        serve.await.context("webhook server failed")
    });
    let target = configuration::Target {
        url: config.webhook.url.clone(),
        service: service.clone(),
        namespace: namespace.clone(),
        port: addr.port(),
        // A little more than our own deadline, so the API server sees our answer (never more
        // than 10 s, the default it would wait).
        timeout_seconds: u32::try_from(config.webhook.timeout.as_secs() + 1)
            .unwrap_or(10)
            .clamp(1, 10),
    };
    let config_stats = Arc::new(configuration::ConfigurationStats::default());
    config_stats.register_metrics(registry);
    let keep = configuration::run(
        client.clone(),
        target,
        authority.clone(),
        config_stats,
        tasks.shutdown_receiver(),
    );
    tasks.spawn("webhook configuration", async move {
        keep.await;
        Ok(())
    });
    Ok(())
}

/// Where the TLS port's certificate comes from: the given files, else the CA; no TLS port
/// without either.
fn serving_identity(config: &Config) -> anyhow::Result<Option<ServingIdentity>> {
    match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert), Some(key)) => Ok(Some(ServingIdentity::Files {
            cert: cert.clone(),
            key: key.clone(),
        })),
        (Some(_), None) | (None, Some(_)) => {
            anyhow::bail!("tls.certFile and tls.keyFile go together: give both or neither")
        }
        (None, None) if config.ca.enabled => {
            let (service, namespace) = (&config.ca.service_name, &config.ca.namespace);
            Ok(Some(ServingIdentity::Ca {
                names: vec![
                    "localhost".to_owned(),
                    format!("{service}.{namespace}.svc"),
                    format!("{service}.{namespace}.svc.cluster.local"),
                ],
            }))
        }
        (None, None) => Ok(None),
    }
}

/// The certificate authority: its roots in the store (standalone), Secret `dubbo-ca-secret`
/// (Kubernetes), or the operator's files; in Kubernetes mode the roots are also published to
/// every namespace.
async fn open_ca(
    config: &Config,
    kube_client: Option<&kube::Client>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<Option<Authority>> {
    let ca = &config.ca;
    if !ca.enabled {
        return Ok(None);
    }
    let settings = CaSettings {
        root_validity: ca.root_validity,
        cert_validity: ca.cert_validity,
        auto_rotate: ca.auto_rotate,
    };
    let backend = match (&ca.cert_file, &ca.key_file, kube_client) {
        (Some(cert), Some(key), _) => Backend::Files(crate::ca::store::from_files(cert, key)?),
        (Some(_), None, _) | (None, Some(_), _) => {
            anyhow::bail!("ca.certFile and ca.keyFile go together: give both or neither")
        }
        (None, None, Some(client)) => {
            let data_dir = config.data_dir.clone();
            let cache = tokio::task::spawn_blocking(move || SqliteRoots::open(&data_dir.join(store::DB_FILE)))
                .await
                .context("CA cache open task failed")??;
            Backend::Secret {
                secret: SecretRoots::new(client.clone(), &ca.namespace),
                cache: Arc::new(cache),
            }
        }
        (None, None, None) => {
            let data_dir = config.data_dir.clone();
            let roots = tokio::task::spawn_blocking(move || SqliteRoots::open(&data_dir.join(store::DB_FILE)))
                .await
                .context("CA store open task failed")??;
            Backend::Sqlite(Arc::new(roots))
        }
    };
    let (authority, manager) = Authority::open(backend, settings)
        .await
        .context("cannot start the certificate authority")?;
    let authority = authority.with_trust_domain(&config.tls.trust_domain);
    authority.stats.register_metrics(registry);
    let shutdown = tasks.shutdown_receiver();
    tasks.spawn("CA roots", async move {
        manager.run(shutdown).await;
        Ok(())
    });
    if let Some(client) = kube_client {
        let stats = Arc::new(PublishStats::default());
        stats.register_metrics(registry);
        let publish = crate::ca::publish::run(
            client.clone(),
            authority.clone(),
            stats,
            tasks.shutdown_receiver(),
        );
        tasks.spawn("CA ConfigMaps", async move {
            publish.await;
            Ok(())
        });
    }
    Ok(Some(authority))
}

/// The gRPC server on `incoming` (plain TCP, or TLS connections), until shutdown: every
/// service and the connection settings.
fn grpc_serve<H, I, IO>(
    config: &Config,
    metrics: Arc<Metrics>,
    (ingest, rules, health, ca): (
        Ingest,
        RuleService,
        tonic_health::pb::health_server::HealthServer<H>,
        Option<CaService>,
    ),
    incoming: I,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<
    impl std::future::Future<Output = Result<(), tonic::transport::Error>> + use<H, I, IO>,
>
where
    H: tonic_health::pb::health_server::Health,
    I: tokio_stream::Stream<Item = Result<IO, std::io::Error>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + Unpin + Send + 'static,
{
    // grpcurl and most tools speak v1alpha; newer clients v1.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::ingest::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(crate::dds::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(crate::ca::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let snp_service =
        pb::snp::service_name_mapping_service_server::ServiceNameMappingServiceServer::new(
            ingest.clone(),
        )
        .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES);
    let networking_service =
        pb::dubbo::networking::v1alpha1::service_name_mapping_service_server::ServiceNameMappingServiceServer::new(ingest)
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES);
    let authority = ca.clone().map(|ca| {
        pb::ca::authority_service_server::AuthorityServiceServer::new(ca)
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
    });
    let certificates = ca.map(|ca| {
        pb::ca::dubbo_certificate_service_server::DubboCertificateServiceServer::new(ca)
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
    });
    let grpc = &config.grpc;
    Ok(tonic::transport::Server::builder()
        .layer(metrics::CountOversize::layer(metrics))
        // Detect dead peers: long-lived streams would otherwise pin memory forever.
        .http2_keepalive_interval(Some(grpc.keepalive_interval))
        .http2_keepalive_timeout(Some(grpc.keepalive_timeout))
        // Old connections are closed (after a grace period) so clients rebalance across replicas.
        .max_connection_age(grpc.max_connection_age)
        .max_connection_age_grace(grpc.max_connection_age_grace)
        .max_concurrent_streams(grpc.max_concurrent_streams)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(snp_service)
        .add_service(networking_service)
        .add_service(rules)
        .add_optional_service(authority)
        .add_optional_service(certificates)
        .serve_with_incoming_shutdown(incoming, wait_for_shutdown(shutdown)))
}

async fn wait_for_shutdown(mut rx: watch::Receiver<bool>) {
    signalled(&mut rx).await;
}
