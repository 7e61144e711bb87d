//! The certificate authority for workload identity (wire.md §6).
//!
//! One task owns the roots ([`Authority::open`] then [`Authority::run`]): it loads or creates
//! them in their backend ([`store`]), rotates them (on request, or at two thirds of the root's
//! life), drops retiring roots once nothing they issued can still be valid, and in Kubernetes
//! mode follows the Secret so every replica serves the same roots. Everything else reads the
//! current [`Bundle`] from a `watch` channel: the gRPC services ([`service`]), `dubbo-jwt`
//! authentication, the TLS port's certificate (the binary's `tls`) and the ConfigMap publisher
//! ([`publish`]).

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_auth as auth;
use dubbo_cp_kit::{ratelimit, shutdown};

pub mod authority;
pub mod config;
pub mod ensemble;
pub mod fleet;
pub mod pb;
pub mod publish;
pub mod service;
pub mod store;
mod view;

pub use view::{CaView, RootView};

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::StreamExt;

pub use authority::{Bundle, IssueError, Issued, Root, Subject};
pub use config::CaConfig;
use store::{CaStoreError, SecretRoots, SqliteRoots, StoredRoots};

/// How the roots are made and used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaSettings {
    pub root_validity: Duration,
    pub cert_validity: Duration,
    /// Replace a managed root at two thirds of its life.
    pub auto_rotate: bool,
}

/// Where the roots live.
pub enum Backend {
    Sqlite(Arc<SqliteRoots>),
    /// Kubernetes mode: the Secret is the truth; `cache` (the data directory's database)
    /// keeps the last roots read, so a restart during an API-server outage still serves them.
    Secret {
        secret: SecretRoots,
        cache: Arc<SqliteRoots>,
    },
    /// `--ca-cert`/`--ca-key`: used as is, never written.
    Files(StoredRoots),
    /// ZooKeeper mode with `zookeeper.auth`: the roots in the ensemble, shared by every
    /// replica; `cache` as for the Secret.
    Ensemble {
        roots: ensemble::EnsembleRoots,
        cache: Arc<SqliteRoots>,
    },
}

/// A backend's version of what it holds (SQLite row version, Secret resourceVersion); `None`
/// for files, and for roots served from the cache until the Secret is read again.
type Version = Option<String>;

/// Longest wait for the API server when loading the roots; then the cache is used.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

impl Backend {
    async fn load_or_create(
        &self,
        settings: CaSettings,
    ) -> Result<(StoredRoots, Version), CaStoreError> {
        let generate = move || StoredRoots::generate(settings.root_validity, SystemTime::now());
        match self {
            Backend::Files(roots) => Ok((roots.clone(), None)),
            Backend::Secret { secret, .. } => {
                let (roots, rv) = within(secret.load_or_create(generate)).await??;
                self.remember(&roots).await;
                Ok((roots, Some(rv)))
            }
            Backend::Ensemble { roots, .. } => {
                let (roots, version) = within(roots.load_or_create(generate)).await??;
                self.remember(&roots).await;
                Ok((roots, Some(version)))
            }
            Backend::Sqlite(db) => {
                let db = db.clone();
                blocking(move || {
                    if let Some((roots, version)) = db.load()? {
                        return Ok((roots, Some(version.to_string())));
                    }
                    let roots = generate()?;
                    let version = db.write(&roots, None)?;
                    tracing::info!("created the CA root");
                    Ok((roots, Some(version.to_string())))
                })
                .await
            }
        }
    }

    /// The roots last read from the Secret, when it cannot be read now.
    async fn cached(&self) -> Option<StoredRoots> {
        let (Backend::Secret { cache, .. } | Backend::Ensemble { cache, .. }) = self else {
            return None;
        };
        let cache = cache.clone();
        match blocking(move || cache.load()).await {
            Ok(found) => found.map(|(roots, _)| roots),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the cached CA roots");
                None
            }
        }
    }

    /// Keeps what the Secret holds in the cache (Kubernetes mode; best effort).
    async fn remember(&self, roots: &StoredRoots) {
        let (Backend::Secret { cache, .. } | Backend::Ensemble { cache, .. }) = self else {
            return;
        };
        let (cache, roots) = (cache.clone(), roots.clone());
        if let Err(err) = blocking(move || cache.overwrite(&roots)).await {
            tracing::warn!(error = %err, "cannot cache the CA roots");
        }
    }

    async fn write(
        &self,
        roots: &StoredRoots,
        expected: Version,
    ) -> Result<(StoredRoots, Version), CaStoreError> {
        match self {
            Backend::Files(_) => Err(CaStoreError::Unmanaged(
                "the CA root comes from --ca-cert/--ca-key files; replace the files to change it"
                    .to_owned(),
            )),
            Backend::Secret { secret, .. } => {
                let (roots, rv) = within(secret.write(roots, expected)).await??;
                self.remember(&roots).await;
                Ok((roots, Some(rv)))
            }
            Backend::Ensemble { roots: node, .. } => {
                let (roots, version) = within(node.write(roots, expected)).await??;
                self.remember(&roots).await;
                Ok((roots, Some(version)))
            }
            Backend::Sqlite(db) => {
                let db = db.clone();
                let roots = roots.clone();
                let expected = expected.and_then(|v| v.parse::<i64>().ok());
                blocking(move || {
                    let version = db.write(&roots, expected)?;
                    Ok((roots, Some(version.to_string())))
                })
                .await
            }
        }
    }

    async fn reload(&self) -> Result<Option<(StoredRoots, Version)>, CaStoreError> {
        match self {
            Backend::Files(roots) => Ok(Some((roots.clone(), None))),
            Backend::Secret { secret, .. } => {
                match within(secret.api.get_opt(store::SECRET_NAME)).await?? {
                    Some(s) => {
                        let (roots, rv) = SecretRoots::read(&s)?;
                        self.remember(&roots).await;
                        Ok(Some((roots, Some(rv))))
                    }
                    None => Ok(None),
                }
            }
            Backend::Ensemble { roots, .. } => {
                let found = within(roots.read()).await??;
                if let Some((roots, _)) = &found {
                    self.remember(roots).await;
                }
                Ok(found.map(|(roots, version)| (roots, Some(version))))
            }
            Backend::Sqlite(db) => {
                let db = db.clone();
                blocking(move || Ok(db.load()?.map(|(r, v)| (r, Some(v.to_string()))))).await
            }
        }
    }
}

/// `call`, or `Unavailable` when the API server does not answer within [`LOAD_TIMEOUT`].
async fn within<T>(call: impl std::future::Future<Output = T>) -> Result<T, CaStoreError> {
    tokio::time::timeout(LOAD_TIMEOUT, call)
        .await
        .map_err(|_| CaStoreError::Unavailable(format!("no answer within {LOAD_TIMEOUT:?}")))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CaStoreError> + Send + 'static,
) -> Result<T, CaStoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CaStoreError::Unmanaged(format!("CA store task failed: {e}")))?
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RootLabels {
    fingerprint: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssueLabels {
    pub rpc: &'static str,
    pub result: &'static str,
}

/// The CA's metrics.
#[derive(Default)]
pub struct CaStats {
    /// Certificates asked for, by RPC and result (`issued`, `bad_csr`, `bad_signature`,
    /// `unsupported_key`, `unauthenticated`, `rate_limited`, `busy`, `error`).
    pub issued: Family<IssueLabels, Counter>,
    /// Unix time at which each trusted root expires.
    root_expiry: Family<RootLabels, Gauge>,
    rotations: Counter,
}

impl CaStats {
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "ca_certificates",
            "Certificate requests by RPC and result",
            self.issued.clone(),
        );
        registry.register(
            "ca_root_expiry_timestamp_seconds",
            "When each trusted CA root expires (unix seconds), by fingerprint and state",
            self.root_expiry.clone(),
        );
        registry.register(
            "ca_rotations",
            "CA roots replaced by this process",
            self.rotations.clone(),
        );
    }

    pub fn count(&self, rpc: &'static str, result: &'static str) {
        self.issued
            .get_or_create(&IssueLabels { rpc, result })
            .inc();
    }

    fn publish(&self, bundle: &Bundle) {
        self.root_expiry.clear();
        for (i, root) in bundle.trusted().enumerate() {
            let labels = RootLabels {
                fingerprint: root.fingerprint.replace(':', "")[..16].to_owned(),
                state: if i == 0 { "active" } else { "retiring" },
            };
            self.root_expiry
                .get_or_create(&labels)
                .set(authority::unix_seconds(root.not_after));
        }
    }
}

type Reply = oneshot::Sender<Result<(), String>>;

/// A handle on the running CA: the current roots, and rotation on request.
#[derive(Clone)]
pub struct Authority {
    /// `None` only in Kubernetes mode, between a first start during an API-server outage
    /// (nothing cached yet) and the first successful read of the Secret.
    bundle: watch::Receiver<Option<Arc<Bundle>>>,
    rotate: mpsc::Sender<Reply>,
    pub settings: CaSettings,
    pub stats: Arc<CaStats>,
    /// The SPIFFE trust domain this CA issues in (`tls.trustDomain`); an admin's `ca issue`
    /// for another one is refused unless asked for explicitly.
    pub trust_domain: Arc<str>,
    /// ZooKeeper mode: whether the replicas on the ensemble trust each other's roots.
    fleet: Option<fleet::FleetView>,
}

/// What callers are told while the roots are not loaded.
pub const NOT_READY: &str =
    "the CA has not loaded its roots yet (Secret dubbo-ca-secret cannot be read); retry shortly";

/// The task that owns the roots; see [`Authority::open`].
pub struct Manager {
    backend: Backend,
    settings: CaSettings,
    /// `None` until the roots could be loaded (see [`Authority`]).
    stored: Option<StoredRoots>,
    version: Version,
    bundle: watch::Sender<Option<Arc<Bundle>>>,
    rotate: mpsc::Receiver<Reply>,
    stats: Arc<CaStats>,
    /// The ensemble's roots node changed and could not be read: read it again at the next
    /// tick (no other notification comes until it changes again).
    follow_again: bool,
}

impl Authority {
    /// Loads (or creates) the roots; the returned manager must be run to rotate and follow
    /// them. Fails when stored or given roots are unusable, naming why. In Kubernetes mode an
    /// unreachable API server does not fail the start: the cached roots are served (or none,
    /// on a first start) until the Secret can be read.
    pub async fn open(
        backend: Backend,
        settings: CaSettings,
    ) -> Result<(Authority, Manager), CaStoreError> {
        let loaded = match backend.load_or_create(settings).await {
            Ok(loaded) => Some(loaded),
            Err(err @ (CaStoreError::Kube(_) | CaStoreError::Unavailable(_))) => {
                match backend.cached().await {
                    Some(roots) => {
                        tracing::warn!(error = %err, "cannot read Secret {}; serving the cached CA roots until it can be read", store::SECRET_NAME);
                        Some((roots, None))
                    }
                    None => {
                        tracing::warn!(error = %err, "cannot read Secret {} and nothing is cached; the CA starts once it can be read", store::SECRET_NAME);
                        None
                    }
                }
            }
            Err(err) => return Err(err),
        };
        let stats = Arc::new(CaStats::default());
        let (tx, rx) = watch::channel(None);
        let (rotate_tx, rotate_rx) = mpsc::channel(8);
        let mut manager = Manager {
            backend,
            settings,
            stored: None,
            version: None,
            bundle: tx,
            rotate: rotate_rx,
            stats: stats.clone(),
            follow_again: false,
        };
        if let Some((stored, version)) = loaded {
            let bundle = stored.bundle(settings.cert_validity, SystemTime::now())?;
            (manager.stored, manager.version) = (Some(stored), version);
            manager.publish(bundle);
            // Down past the rotation time (or the root expired): rotate before serving.
            if manager.rotation_due() && manager.version.is_some() {
                match manager.rotate_now().await {
                    Ok(()) | Err(CaStoreError::Conflict) => {}
                    Err(err) => return Err(err),
                }
            }
        }
        Ok((
            Authority {
                bundle: rx,
                rotate: rotate_tx,
                settings,
                stats,
                trust_domain: crate::auth::DEFAULT_TRUST_DOMAIN.into(),
                fleet: None,
            },
            manager,
        ))
    }

    /// Issues in `trust_domain` (the default is Kubernetes' `cluster.local`). An empty
    /// `tls.trustDomain` only means client certificates of any domain are accepted; the
    /// identities the control plane names itself are still `cluster.local`'s (see
    /// [`crate::auth`]), so that stays the CA's own.
    pub fn with_trust_domain(mut self, trust_domain: &str) -> Self {
        self.trust_domain = if trust_domain.is_empty() {
            crate::auth::DEFAULT_TRUST_DOMAIN.into()
        } else {
            trust_domain.into()
        };
        self
    }

    /// Follows the replicas of a fleet (ZooKeeper mode), see [`fleet`].
    pub fn with_fleet(mut self, fleet: fleet::FleetView) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// Why this replica's root is not the fleet's, if it is not (ZooKeeper mode).
    pub fn fleet_problem(&self) -> Option<String> {
        self.fleet.as_ref().and_then(fleet::FleetView::problem)
    }

    /// The roots now; `None` while they are not loaded.
    pub fn current(&self) -> Option<Arc<Bundle>> {
        self.bundle.borrow().clone()
    }

    /// Changes of the roots (loaded, rotated, dropped, another replica's write).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Bundle>>> {
        self.bundle.clone()
    }

    /// Replaces the active root now; the old one stays trusted until what it issued expired.
    pub async fn rotate(&self) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        self.rotate
            .send(reply)
            .await
            .map_err(|_| "the CA is shutting down".to_owned())?;
        answer
            .await
            .map_err(|_| "the CA is shutting down".to_owned())?
    }

    /// The `dubbo-jwt` check: the SPIFFE ID of a token signed by a trusted root.
    pub fn verify_token(&self, token: &str) -> Result<(String, SystemTime), String> {
        match self.current() {
            Some(bundle) => bundle.verify_token(token),
            None => Err(NOT_READY.to_owned()),
        }
    }
}

fn log_roots(bundle: &Bundle) {
    for (i, root) in bundle.trusted().enumerate() {
        tracing::info!(
            state = if i == 0 { "active" } else { "retiring" },
            fingerprint = %root.fingerprint,
            not_after = %humantime::format_rfc3339_seconds(root.not_after),
            managed = bundle.managed,
            "CA root"
        );
    }
}

/// Longest sleep between checks, so a changed wall clock is noticed.
const MAX_SLEEP: Duration = Duration::from_secs(300);
/// Pause after a failed attempt before the next.
const RETRY: Duration = Duration::from_secs(5);

impl Manager {
    /// Rotates, drops and follows the roots until shutdown.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut secret_events = match &self.backend {
            Backend::Secret { secret, .. } => Some(Box::pin(
                watcher(
                    secret.api.clone(),
                    watcher::Config::default()
                        .fields(&format!("metadata.name={}", store::SECRET_NAME)),
                )
                .default_backoff(),
            ) as SecretEvents),
            _ => None,
        };
        let mut ensemble_changes = match &self.backend {
            Backend::Ensemble { roots, .. } => Some(roots.changes()),
            _ => None,
        };
        let mut seen_secret = false;
        loop {
            let wait = self
                .next_deadline()
                .map(|at| at.duration_since(SystemTime::now()).unwrap_or_default())
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP);
            tokio::select! {
                _ = crate::shutdown::signalled(&mut shutdown) => return,
                () = tokio::time::sleep(wait) => {
                    if self.follow_again {
                        self.follow_ensemble().await;
                    }
                    if let Err(err) = self.tick().await {
                        tracing::warn!(error = %err, "CA root maintenance failed; retrying");
                        tokio::time::sleep(RETRY).await;
                    }
                }
                Some(reply) = self.rotate.recv() => {
                    let result = self.rotate_now().await.map_err(|e| e.to_string());
                    let _ = reply.send(result);
                }
                Some(event) = next_event(&mut secret_events) => match event {
                    Ok(Event::Apply(secret) | Event::InitApply(secret)) => {
                        seen_secret = true;
                        self.adopt(&secret).await;
                    }
                    Ok(Event::Init) => seen_secret = false,
                    Ok(Event::InitDone) if !seen_secret => self.recreate().await,
                    Ok(Event::Delete(_)) => self.recreate().await,
                    Ok(_) => {}
                    Err(err) => tracing::warn!(error = %err, "watch of Secret {} failed", store::SECRET_NAME),
                },
                Some(()) = next_change(&mut ensemble_changes) => self.follow_ensemble().await,
            }
        }
    }

    fn bundle(&self) -> Option<Arc<Bundle>> {
        self.bundle.borrow().clone()
    }

    fn rotation_due(&self) -> bool {
        let (Some(stored), Some(bundle)) = (&self.stored, self.bundle()) else {
            return false;
        };
        stored.managed
            && self.settings.auto_rotate
            && SystemTime::now() >= store::rotation_time(bundle.signer.root())
    }

    fn next_deadline(&self) -> Option<SystemTime> {
        if self.follow_again {
            return Some(SystemTime::now() + RETRY);
        }
        let (Some(stored), Some(bundle)) = (&self.stored, self.bundle()) else {
            // Not loaded yet: try again soon.
            return Some(SystemTime::now() + RETRY);
        };
        let root = bundle.signer.root();
        let rotation =
            (stored.managed && self.settings.auto_rotate).then(|| store::rotation_time(root));
        let drop = (!bundle.retiring.is_empty())
            .then(|| store::drop_time(root, self.settings.cert_validity));
        let expiry = bundle.retiring.iter().map(|r| r.not_after).min();
        [rotation, drop, expiry].into_iter().flatten().min()
    }

    async fn tick(&mut self) -> Result<(), CaStoreError> {
        let (Some(stored), Some(current)) = (self.stored.clone(), self.bundle()) else {
            let (stored, version) = self.backend.load_or_create(self.settings).await?;
            let bundle = stored.bundle(self.settings.cert_validity, SystemTime::now())?;
            tracing::info!("CA roots loaded");
            (self.stored, self.version) = (Some(stored), version);
            self.publish(bundle);
            return Ok(());
        };
        if self.rotation_due() {
            tracing::info!(fingerprint = %current.signer.root().fingerprint, "CA root at two thirds of its life: rotating");
            return self.rotate_now().await;
        }
        let bundle = stored.bundle(self.settings.cert_validity, SystemTime::now())?;
        if bundle.retiring.len() != current.retiring.len() {
            tracing::info!(
                dropped = current.retiring.len().saturating_sub(bundle.retiring.len()),
                "retiring CA roots dropped: every certificate they issued has expired"
            );
            let pruned = stored.pruned(&bundle);
            self.publish(bundle);
            // Best effort: the bundle already leaves them out whatever the store holds.
            if stored.managed && self.version.is_some() {
                match self.backend.write(&pruned, self.version.clone()).await {
                    Ok((stored, version)) => (self.stored, self.version) = (Some(stored), version),
                    Err(CaStoreError::Conflict) => self.reload().await?,
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(())
    }

    async fn rotate_now(&mut self) -> Result<(), CaStoreError> {
        let (Some(stored), Some(current)) = (self.stored.clone(), self.bundle()) else {
            return Err(CaStoreError::Unavailable(NOT_READY.to_owned()));
        };
        if !stored.managed {
            return Err(CaStoreError::Unmanaged(match self.backend {
                Backend::Files(_) => {
                    "the CA root comes from --ca-cert/--ca-key; replace the files to rotate it"
                        .to_owned()
                }
                _ => format!(
                    "the CA root was provided by the operator (Secret {} without annotation {}); replace the Secret to rotate it",
                    store::SECRET_NAME,
                    store::MANAGED_ANNOTATION
                ),
            }));
        }
        let now = SystemTime::now();
        let next = stored.rotated(&current, self.settings.root_validity, now)?;
        match self.backend.write(&next, self.version.clone()).await {
            Ok((stored, version)) => {
                let bundle = stored.bundle(self.settings.cert_validity, now)?;
                (self.stored, self.version) = (Some(stored), version);
                self.stats.rotations.inc();
                tracing::info!(
                    old = %current.signer.root().fingerprint,
                    new = %bundle.signer.root().fingerprint,
                    "CA root rotated: issuing from the new root, the old one stays trusted until its certificates expire"
                );
                self.publish(bundle);
                Ok(())
            }
            Err(CaStoreError::Conflict) => {
                // Another replica wrote first; take what it wrote.
                self.reload().await?;
                Err(CaStoreError::Conflict)
            }
            Err(err) => Err(err),
        }
    }

    async fn reload(&mut self) -> Result<(), CaStoreError> {
        if let Some((stored, version)) = self.backend.reload().await? {
            let bundle = stored.bundle(self.settings.cert_validity, SystemTime::now())?;
            (self.stored, self.version) = (Some(stored), version);
            self.publish(bundle);
        }
        Ok(())
    }

    /// Another writer's Secret (a replica's rotation, an operator's edit), or the Secret read
    /// again after an outage.
    async fn adopt(&mut self, secret: &Secret) {
        let (stored, version) = match SecretRoots::read(secret) {
            Ok(read) => read,
            Err(err) => {
                tracing::error!(error = %err, "Secret {} is unusable; still serving the roots loaded before", store::SECRET_NAME);
                return;
            }
        };
        let from = format!("Secret {}", store::SECRET_NAME);
        self.adopt_stored(stored, Some(version), &from).await;
    }

    /// Roots read from the shared store (`from`): served unless they are what is served already
    /// or older than it.
    async fn adopt_stored(&mut self, stored: StoredRoots, version: Version, from: &str) {
        if self.stored.as_ref() == Some(&stored) {
            self.version = version;
            return;
        }
        // A watch event older than what we read since (our own rotation, then the event of the
        // state before it): never go back to a root that is retiring.
        let stale = self.bundle().is_some_and(|current| {
            let active = stored.cert_pem.trim();
            current.retiring.iter().any(|r| r.pem.trim() == active)
        });
        if stale {
            tracing::debug!("ignoring stale CA roots from {from}");
            return;
        }
        match stored.bundle(self.settings.cert_validity, SystemTime::now()) {
            Ok(bundle) => {
                tracing::info!(fingerprint = %bundle.signer.root().fingerprint, "CA roots read from {from}");
                self.backend.remember(&stored).await;
                (self.stored, self.version) = (Some(stored), version);
                self.publish(bundle);
            }
            Err(err) => {
                tracing::error!(error = %err, "{from} holds unusable CA roots; still serving the roots loaded before")
            }
        }
    }

    /// The roots' node changed (another replica's rotation, or read again after a
    /// reconnection): take what it holds now, or write ours back if it is gone.
    async fn follow_ensemble(&mut self) {
        self.follow_again = false;
        match self.backend.reload().await {
            Ok(Some((stored, version))) => self.adopt_stored(stored, version, "the ensemble").await,
            Ok(None) => self.recreate().await,
            Err(err) => {
                tracing::warn!(error = %err, retry_in = ?RETRY, "cannot read the CA roots from the ensemble");
                self.follow_again = true;
            }
        }
    }

    /// The Secret is gone: write back the roots we serve, so peers keep trusting them (or,
    /// with none loaded yet, create it now that the API server answers).
    async fn recreate(&mut self) {
        let Some(stored) = self.stored.clone() else {
            if let Err(err) = self.tick().await {
                tracing::warn!(error = %err, "cannot load the CA roots yet");
            }
            return;
        };
        if !stored.managed {
            tracing::warn!(
                "the operator's Secret {} is gone; still serving its root",
                store::SECRET_NAME
            );
            return;
        }
        match self.backend.write(&stored, None).await {
            Ok((stored, version)) => {
                tracing::warn!(
                    "Secret {} was missing; wrote the roots being served",
                    store::SECRET_NAME
                );
                (self.stored, self.version) = (Some(stored), version);
            }
            // Another replica recreated it; its Secret arrives through the watch.
            Err(CaStoreError::Conflict) => {}
            Err(err) => {
                tracing::warn!(error = %err, "cannot recreate Secret {}", store::SECRET_NAME)
            }
        }
    }

    fn publish(&self, bundle: Bundle) {
        self.stats.publish(&bundle);
        log_roots(&bundle);
        self.bundle.send_replace(Some(Arc::new(bundle)));
    }
}

type SecretEvents = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<Event<Secret>, watcher::Error>> + Send>,
>;

async fn next_change(changes: &mut Option<mpsc::Receiver<()>>) -> Option<()> {
    match changes {
        Some(changes) => changes.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_event(
    events: &mut Option<SecretEvents>,
) -> Option<Result<Event<Secret>, watcher::Error>> {
    match events {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

impl crate::auth::TokenVerifier for Authority {
    fn verify(&self, token: &str) -> Result<(String, SystemTime), String> {
        self.verify_token(token)
    }
}
