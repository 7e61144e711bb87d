//! All wiring in one place: open the store, load the index, start the debouncer, serve gRPC and
//! the admin port, and shut down in the order that loses nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::admin::{self, MappingSource, Readiness};
use crate::auth::tokenreview::TokenReviewer;
use crate::auth::tokens::StaticTokens;
use crate::auth::{Authenticator, Policy};
use crate::config::Config;
use crate::config::Mode;
use crate::dds::{DdsStats, RuleService};
use crate::debounce::{self, Batch};
use crate::index::{Index, Kind};
use crate::ingest::Ingest;
use crate::k8s;
use crate::k8s::writer::{KubeWriter, WriterStats};
use crate::mapping::{MappingDelta, SharedMappings};
use crate::metrics::{self, Metrics};
use crate::pb;
use crate::resources::mapping_object;
use crate::shutdown::signalled;
use crate::store::{EmbeddedStore, StoreOptions, StoredChange};

/// The registration service as the health service names it.
type RegistrationServer =
    pb::snp::service_name_mapping_service_server::ServiceNameMappingServiceServer<Ingest>;

/// Largest request a client may send.
pub const MAX_DECODING_MESSAGE_BYTES: usize = 1024 * 1024;
/// Committed changes that may wait for the debouncer before the writer waits.
const CHANGE_FEED_CAPACITY: usize = 1024;

/// A started control plane. Dropping it does not stop it; call [`RunningServer::shutdown`].
pub struct RunningServer {
    pub grpc_addr: SocketAddr,
    /// The TLS gRPC port, when configured.
    pub tls_addr: Option<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub store: EmbeddedStore,
    pub index: Arc<Index>,
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

    /// Waits until the server has shut down.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("server task failed")?
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown();
        self.wait().await
    }
}

/// Starts the control plane; returns once both ports accept connections.
pub async fn start(config: Config) -> anyhow::Result<RunningServer> {
    check_bind_policy(&config)?;

    let (shutdown, shutdown_rx) = watch::channel(false);
    let (changes_tx, changes_rx) = mpsc::channel::<StoredChange>(CHANGE_FEED_CAPACITY);
    // In Kubernetes mode, the watched cluster state: what is there needs no write.
    let cluster = (config.mode == Mode::Kubernetes).then(|| Arc::new(SharedMappings::new()));
    let store_options = StoreOptions {
        present_elsewhere: cluster.clone(),
        queue_capacity: config.ingest.queue_capacity,
        max_batch: config.ingest.max_batch,
    };
    let replay = changes_tx.clone();
    let data_dir = config.data_dir.clone();
    let (store, writer) = tokio::task::spawn_blocking(move || {
        EmbeddedStore::open(&data_dir, store_options, changes_tx)
    })
    .await
    .context("store open task failed")?
    .with_context(|| format!("cannot open the store in {}", config.data_dir.display()))?;
    let index = Arc::new(Index::new(store.opened_revision()));
    let metrics = Arc::new(Metrics::default());

    let kube_client = match config.mode {
        Mode::Kubernetes => Some(k8s::client(config.kubernetes.api_server.as_deref()).await?),
        Mode::Standalone => None,
    };
    let (debouncer, cluster_watch, kube_stats) = match cluster.clone() {
        None => {
            let objects = store
                .snapshot()
                .iter()
                .map(|(key, apps)| mapping_object(key, apps))
                .collect();
            index.reset(Kind::ServiceNameMapping, objects, store.opened_revision());
            index.mark_loaded();
            tracing::info!(
                mappings = index.current(Kind::ServiceNameMapping).objects.len(),
                revision = store.opened_revision(),
                data_dir = %config.data_dir.display(),
                "store opened"
            );
            let debouncer = tokio::spawn({
                let (index, store, metrics) = (index.clone(), store.clone(), metrics.clone());
                async move {
                    publish_changes(config.debounce, changes_rx, store, index, metrics).await;
                    Ok(())
                }
            });
            (debouncer, None, None)
        }
        Some(cluster) => {
            let client = kube_client
                .clone()
                .context("Kubernetes mode without a Kubernetes client")?;
            let cluster_watch = tokio::spawn({
                let (client, index, shutdown) =
                    (client.clone(), index.clone(), shutdown_rx.clone());
                async move {
                    k8s::watch::run(client, index, cluster, shutdown).await;
                    Ok(())
                }
            });
            let kube_writer = Arc::new(KubeWriter::new(client, config.kubernetes.writer));
            let kube_stats = kube_writer.stats();
            // What was acknowledged but not yet written before the last stop goes out first.
            let pending = store.snapshot();
            tracing::info!(pending = pending.len(), data_dir = %config.data_dir.display(), "outbox opened");
            if !pending.is_empty() {
                let mut delta = MappingDelta::default();
                for (key, apps) in pending {
                    for app in apps {
                        delta.add(key.clone(), app);
                    }
                }
                let change = StoredChange {
                    delta,
                    revision: store.opened_revision(),
                };
                replay
                    .send(change)
                    .await
                    .context("change feed closed at start")?;
            }
            let debouncer = tokio::spawn({
                let (store, metrics) = (store.clone(), metrics.clone());
                async move {
                    write_to_kubernetes(config.debounce, changes_rx, kube_writer, store, metrics)
                        .await;
                    Ok(())
                }
            });
            (debouncer, Some(cluster_watch), Some(kube_stats))
        }
    };
    // Only the store writer may keep the feed open, so its exit ends the debouncer.
    drop(replay);

    let grpc_listener = TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("cannot bind the gRPC port {}", config.grpc_addr))?;
    let admin_listener = TcpListener::bind(config.admin_addr)
        .await
        .with_context(|| format!("cannot bind the admin port {}", config.admin_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;

    let readiness = Readiness::default();
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RegistrationServer>().await;

    let policy = auth_policy(&config, kube_client.as_ref(), shutdown_rx.clone())?;
    let ingest = Ingest::new(
        store.clone(),
        &config.ingest,
        policy.clone(),
        metrics.clone(),
    );
    let rules = RuleService::new(
        index.clone(),
        config.dds,
        policy,
        metrics.clone(),
        shutdown_rx.clone(),
    );
    let dds_stats = rules.stats();
    // The TLS port serves the same services; its clients may present SPIFFE certificates.
    let (tls_addr, grpc_tls) = match tls_settings(&config)? {
        None => (None, None),
        Some(tls) => {
            let listener = TcpListener::bind(config.tls.addr)
                .await
                .with_context(|| format!("cannot bind the TLS gRPC port {}", config.tls.addr))?;
            let addr = listener.local_addr()?;
            let serve = grpc_serve(
                &config,
                metrics.clone(),
                Some(tls),
                (ingest.clone(), rules.clone(), health_service.clone()),
                listener,
                shutdown_rx.clone(),
            )?;
            let task = tokio::spawn(async move { serve.await.context("TLS gRPC server failed") });
            (Some(addr), Some(task))
        }
    };
    let grpc_serve = grpc_serve(
        &config,
        metrics.clone(),
        None,
        (ingest, rules, health_service),
        grpc_listener,
        shutdown_rx.clone(),
    )?;
    let grpc = tokio::spawn(async move { grpc_serve.await.context("gRPC server failed") });
    let mappings = match &cluster {
        Some(cluster) => MappingSource::Cluster(cluster.clone()),
        None => MappingSource::Store(store.clone()),
    };
    let registry = Arc::new(metrics::registry(metrics::Sources {
        metrics: metrics.clone(),
        store: store.clone(),
        dds: dds_stats.clone(),
        kube: kube_stats.clone(),
    }));
    let admin_serve = axum::serve(
        admin_listener,
        admin::router(admin::AdminState {
            readiness: readiness.clone(),
            index: index.clone(),
            mappings,
            outbox: store.clone(),
            registry,
        }),
    )
    .with_graceful_shutdown(wait_for_shutdown(shutdown_rx.clone()));
    let admin = tokio::spawn(async move { admin_serve.await.context("admin server failed") });
    readiness.set(true);
    match tls_addr {
        Some(tls_addr) => tracing::info!(%grpc_addr, %tls_addr, %admin_addr, "dubbo-cp serving"),
        None => tracing::info!(%grpc_addr, %admin_addr, "dubbo-cp serving"),
    }

    let task = tokio::spawn({
        let readiness = readiness.clone();
        let grace = config.shutdown_grace;
        async move {
            wait_for_shutdown(shutdown_rx).await;
            tracing::info!("shutting down: finishing in-flight registrations");
            readiness.set(false);
            health.set_not_serving::<RegistrationServer>().await;
            finish_within(grace, "gRPC server", grpc).await;
            if let Some(grpc_tls) = grpc_tls {
                finish_within(grace, "TLS gRPC server", grpc_tls).await;
            }
            if let Some(cluster_watch) = cluster_watch {
                finish_within(grace, "ServiceNameMapping watch", cluster_watch).await;
            }
            // Every acknowledged registration is committed; the writer commits what is queued.
            tokio::task::spawn_blocking(move || writer.shutdown())
                .await
                .context("store writer shutdown failed")?;
            // The writer's exit closed the change feed: the debouncer publishes what is pending.
            finish_within(grace, "debouncer", debouncer).await;
            finish_within(grace, "admin server", admin).await;
            tracing::info!("shutdown complete");
            Ok(())
        }
    });

    Ok(RunningServer {
        grpc_addr,
        tls_addr,
        admin_addr,
        store,
        index,
        dds_stats,
        kube_stats,
        readiness,
        shutdown,
        task,
    })
}

/// The authentication and authorization of the configuration: a token file (watched for
/// changes), TokenReview in Kubernetes mode, or none.
fn auth_policy(
    config: &Config,
    kube_client: Option<&kube::Client>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Policy> {
    let policy = |authenticator: Option<Arc<dyn Authenticator>>| {
        Policy::new(
            authenticator,
            config.auth.admins.clone(),
            config.auth.legacy_answers,
        )
    };
    if config.uses_token_review() {
        let client = kube_client.context("TokenReview needs a Kubernetes client")?;
        let reviewer = TokenReviewer::new(client.clone(), config.auth.cache_ttl);
        return Ok(policy(Some(Arc::new(reviewer))));
    }
    let Some(path) = &config.auth.token_file else {
        return Ok(policy(None));
    };
    let (tokens, modified) = StaticTokens::open(path)?;
    let reload = config.auth.reload_interval;
    let watched = tokens.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = watched.watch(reload, modified) => {}
            () = signalled(&mut shutdown) => {}
        }
    });
    Ok(policy(Some(tokens)))
}

/// Refuses to serve an unauthenticated control plane beyond loopback unless told to.
fn check_bind_policy(config: &Config) -> anyhow::Result<()> {
    let tls_exposed = config.tls.cert_file.is_some() && !config.tls.addr.ip().is_loopback();
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

/// The TLS port's settings from the certificate, key and optional client CA files.
fn tls_settings(config: &Config) -> anyhow::Result<Option<ServerTlsConfig>> {
    let (Some(cert), Some(key)) = (&config.tls.cert_file, &config.tls.key_file) else {
        return Ok(None);
    };
    let read = |path: &std::path::PathBuf| {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
    if let Some(ca) = &config.tls.client_ca_file {
        tls = tls
            .client_ca_root(Certificate::from_pem(read(ca)?))
            .client_auth_optional(true);
    }
    Ok(Some(tls))
}

/// The gRPC server on `listener`, until shutdown: every service, the connection settings, and
/// TLS when given.
fn grpc_serve<H: tonic_health::pb::health_server::Health>(
    config: &Config,
    metrics: Arc<Metrics>,
    tls: Option<ServerTlsConfig>,
    (ingest, rules, health): (
        Ingest,
        RuleService,
        tonic_health::pb::health_server::HealthServer<H>,
    ),
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<impl std::future::Future<Output = Result<(), tonic::transport::Error>> + use<H>>
{
    // grpcurl and most tools speak v1alpha; newer clients v1.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
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
    let grpc = &config.grpc;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    Ok(builder
        .layer(metrics::CountOversize::layer(metrics))
        // Detect dead peers: long-lived streams would otherwise pin memory forever.
        .http2_keepalive_interval(Some(grpc.keepalive_interval))
        .http2_keepalive_timeout(Some(grpc.keepalive_timeout))
        .tcp_keepalive(Some(Duration::from_secs(60)))
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
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            wait_for_shutdown(shutdown),
        ))
}

/// The debounce loop of standalone mode: merged committed changes go to the index, each changed
/// key with all its committed applications.
async fn publish_changes(
    config: debounce::DebounceConfig,
    changes: mpsc::Receiver<StoredChange>,
    store: EmbeddedStore,
    index: Arc<Index>,
    metrics: Arc<Metrics>,
) {
    debounce::run(config, changes, |batch: Batch<StoredChange>| {
        observe_flush(&metrics, &batch);
        let published_keys = batch.value.delta.len();
        let revision = batch.value.revision;
        let objects: Vec<_> = batch
            .value
            .delta
            .iter()
            .filter_map(|(key, _)| {
                store
                    .applications(key)
                    .map(|apps| mapping_object(key, &apps))
            })
            .collect();
        let changed = index.apply(Kind::ServiceNameMapping, objects, [], revision);
        tracing::debug!(
            events = batch.events,
            keys = published_keys,
            revision,
            changed,
            waited_ms = batch.first_event.elapsed().as_millis() as u64,
            "published stored changes"
        );
        std::future::ready(())
    })
    .await;
}

/// The debounce loop of Kubernetes mode: merged registrations become upserts, one per key.
async fn write_to_kubernetes(
    config: debounce::DebounceConfig,
    changes: mpsc::Receiver<StoredChange>,
    writer: Arc<KubeWriter>,
    outbox: EmbeddedStore,
    metrics: Arc<Metrics>,
) {
    debounce::run(config, changes, |batch: Batch<StoredChange>| {
        observe_flush(&metrics, &batch);
        let writer = writer.clone();
        let outbox = outbox.clone();
        async move {
            let keys = batch.value.delta.len();
            writer.write_all(batch.value.delta, &outbox).await;
            tracing::debug!(
                events = batch.events,
                keys,
                waited_ms = batch.first_event.elapsed().as_millis() as u64,
                "upserts written"
            );
        }
    })
    .await;
}

fn observe_flush<T>(metrics: &Metrics, batch: &Batch<T>) {
    metrics.flush_size.observe(batch.events as f64);
    metrics
        .flush_delay
        .observe(batch.first_event.elapsed().as_secs_f64());
}

async fn wait_for_shutdown(mut rx: watch::Receiver<bool>) {
    signalled(&mut rx).await;
}

/// Waits for a component to finish; after `grace` it is abandoned with a warning.
async fn finish_within(grace: Duration, what: &str, task: JoinHandle<anyhow::Result<()>>) {
    let abort = task.abort_handle();
    match tokio::time::timeout(grace, task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => tracing::error!(error = format!("{err:#}"), "{what} failed"),
        Ok(Err(err)) => tracing::error!(error = %err, "{what} task failed"),
        Err(_) => {
            tracing::warn!(
                ?grace,
                "{what} did not finish within the shutdown grace period"
            );
            abort.abort();
        }
    }
}
