//! The durable queue both modes share: SQLite in WAL mode, written by one thread that
//! group-commits everything queued since its last commit, so many concurrent registrations share
//! one fsync. A registration is acknowledged only after the transaction holding it committed.
//!
//! The committed pairs are mirrored in memory, so re-registering what is stored costs a lookup
//! and no write. Memory is bounded: the queue in registrations and in bytes, the applications per
//! key by [`StoreLimits::max_applications_per_key`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use rusqlite::{Connection, params};
use tokio::sync::{mpsc, oneshot};

use super::{RegisterOutcome, StoreError, StoreLimits, StoredChange};
use crate::mapping::registrants::{self, PODLESS, Pending, SharedRegistrants};
use crate::mapping::{
    MappingDelta, MappingKey, Registration, SharedMappings, candidate_names, contains_pair,
};

/// Pending registrant records per key (Kubernetes mode), written with their pairs.
pub type PendingRegistrants = BTreeMap<MappingKey, Pending>;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "dubbo-cp.db";

/// The data directory holds the CA's private key (standalone): only the owner may read it,
/// whatever the umask.
fn restrict_permissions(data_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Best effort: a volume's root (fsGroup) may belong to someone else; the files are ours.
    if let Err(err) = std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700)) {
        tracing::warn!(error = %err, dir = %data_dir.display(), "cannot make the data directory private");
    }
    for name in [DB_FILE, "dubbo-cp.db-wal", "dubbo-cp.db-shm", LOCK_FILE] {
        match std::fs::set_permissions(data_dir.join(name), std::fs::Permissions::from_mode(0o600))
        {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
            _ => {}
        }
    }
    Ok(())
}
/// Held with an exclusive lock while a process uses the data directory.
const LOCK_FILE: &str = "dubbo-cp.lock";
const SCHEMA_VERSION: i64 = 3;

/// What the table means, and so what the writer does besides committing.
#[derive(Clone)]
pub(super) enum Role {
    /// The truth: every new key gets a persisted object name.
    Store,
    /// Pending writes: pairs stored elsewhere (the watched cluster) need no write, nor do
    /// registering pods the cluster's objects already record.
    Outbox {
        elsewhere: Arc<SharedMappings>,
        recorded: Arc<SharedRegistrants>,
    },
}

/// Counters that tests, benchmarks, logs and `/metrics` read.
#[derive(Debug)]
pub struct StoreStats {
    /// Seconds per transaction, fsync included.
    pub commit_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Transactions that failed.
    pub errors: AtomicU64,
    /// Transactions committed.
    pub commits: AtomicU64,
    /// (key, application) pairs inserted.
    pub pairs_written: AtomicU64,
    /// Registrations answered from memory without a write.
    pub already_stored: AtomicU64,
    /// (key, application) pairs an operator removed (`dubbo-cp unregister`).
    pub pairs_removed: AtomicU64,
    /// Registrations waiting for the writer, and their bytes.
    pub queued: AtomicUsize,
    pub queued_bytes: AtomicUsize,
}

impl Default for StoreStats {
    fn default() -> Self {
        Self {
            commit_seconds: crate::metrics::latency_histogram(),
            errors: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            pairs_written: AtomicU64::new(0),
            already_stored: AtomicU64::new(0),
            pairs_removed: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
        }
    }
}

impl StoreStats {
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        use crate::metrics::{scraped_counter, scraped_gauge};
        registry.register(
            "store_commit_duration_seconds",
            "Seconds per store transaction (including fsync)",
            self.commit_seconds.clone(),
        );
        scraped_counter(
            registry,
            "store_commits",
            "Store transactions committed",
            self,
            |s| s.commits.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "store_pairs_written",
            "(interface, application) pairs written to the store",
            self,
            |s| s.pairs_written.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "store_pairs_removed",
            "(interface, application) pairs an operator removed with unregister",
            self,
            |s| s.pairs_removed.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "store_errors",
            "Store transactions that failed",
            self,
            |s| s.errors.load(Ordering::Relaxed),
        );
        scraped_gauge(
            registry,
            "ingest_queue_depth",
            "Registrations waiting for a commit",
            self,
            |s| s.queued.load(Ordering::Relaxed) as i64,
        );
        scraped_gauge(
            registry,
            "ingest_queue_bytes",
            "Bytes of the registrations waiting for a commit",
            self,
            |s| s.queued_bytes.load(Ordering::Relaxed) as i64,
        );
    }
}

enum Command {
    Register {
        registration: Registration,
        bytes: usize,
        reply: oneshot::Sender<Result<RegisterOutcome, StoreError>>,
    },
    /// Removes pairs that reached their final store (Kubernetes mode).
    Complete(MappingDelta, PendingRegistrants),
    /// An operator removes an application (standalone): from these interfaces, or every one.
    Unregister {
        namespace: String,
        application: String,
        interfaces: Option<BTreeSet<String>>,
        reply: oneshot::Sender<Result<MappingDelta, StoreError>>,
    },
    Shutdown,
}

/// What is committed here, and what is known to be stored elsewhere.
#[derive(Clone)]
pub(super) struct Known {
    pub committed: Arc<SharedMappings>,
    /// Object name per key (standalone).
    pub names: Arc<DashMap<MappingKey, String>>,
    /// Registering pods committed here and not yet on the objects (Kubernetes mode).
    pub registrants: Arc<DashMap<MappingKey, Pending>>,
    pub role: Role,
}

impl Known {
    fn contains(&self, key: &MappingKey, application: &str) -> bool {
        contains_pair(&self.committed, key, application)
            || match &self.role {
                Role::Outbox { elsewhere, .. } => contains_pair(elsewhere, key, application),
                Role::Store => false,
            }
    }

    /// Whether `pod` registering `application` for `key` needs no write: the standalone store
    /// keeps no pods; the outbox has it pending, or the cluster's object records it.
    fn recorded(&self, key: &MappingKey, application: &str, pod: &str) -> bool {
        match &self.role {
            Role::Store => true,
            Role::Outbox { recorded, .. } => {
                registrants::is_pending(self.registrants.get(key).as_deref(), application, pod)
                    || registrants::is_recorded(recorded.get(key).as_deref(), application, pod)
            }
        }
    }

    /// Stored with its pod: nothing to write.
    fn holds(&self, key: &MappingKey, registration: &Registration) -> bool {
        let pod = registration.pod.as_deref().unwrap_or(PODLESS);
        self.contains(key, &registration.application)
            && self.recorded(key, &registration.application, pod)
    }

    /// Applications `key` holds here and elsewhere.
    fn applications_of(&self, key: &MappingKey) -> usize {
        let here = self.committed.get(key);
        let elsewhere = match &self.role {
            Role::Outbox { elsewhere, .. } => elsewhere.get(key),
            Role::Store => None,
        };
        match (here, elsewhere) {
            (Some(here), Some(elsewhere)) => {
                elsewhere.len() + here.iter().filter(|app| !elsewhere.contains(*app)).count()
            }
            (Some(one), None) | (None, Some(one)) => one.len(),
            (None, None) => 0,
        }
    }
}

/// Handle for registering and reading; cheap to clone.
#[derive(Clone)]
pub(super) struct Db {
    pub known: Known,
    pub stats: Arc<StoreStats>,
    queue: mpsc::Sender<Command>,
    limits: StoreLimits,
    /// The revision in effect when the store was opened (already bumped past every earlier one).
    pub opened_revision: i64,
}

/// Owns the writer thread; [`StoreWriter::shutdown`] commits what is queued and stops it.
pub struct StoreWriter {
    queue: mpsc::Sender<Command>,
    thread: std::thread::JoinHandle<()>,
    exited: Option<oneshot::Receiver<()>>,
}

impl Db {
    /// Opens (or creates) the database in `data_dir` and starts its writer thread. Every commit
    /// that adds something is sent on `changes` with its revision.
    pub fn open(
        data_dir: &Path,
        role: Role,
        limits: StoreLimits,
        changes: mpsc::Sender<StoredChange>,
    ) -> Result<(Db, StoreWriter), StoreError> {
        let dir_error = |source| StoreError::DataDir {
            path: data_dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(dir_error)?;
        let lock = File::create(data_dir.join(LOCK_FILE)).map_err(dir_error)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked(data_dir.to_path_buf()));
            }
            Err(std::fs::TryLockError::Error(err)) => return Err(dir_error(err)),
        }
        let mut conn = Connection::open(data_dir.join(DB_FILE))?;
        // Rule writes (their own connection, see `store::rules`) may hold the write lock briefly.
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        prepare_schema(&conn)?;
        restrict_permissions(data_dir).map_err(dir_error)?;
        let opened_revision = bump_revision(&mut conn)?;
        let committed = load_all(&conn)?;
        let pending_registrants = load_registrants(&conn)?;
        let mut taken: HashMap<String, HashSet<String>> = HashMap::new();
        let names = DashMap::new();
        if matches!(role, Role::Store) {
            for (key, name) in load_names(&mut conn, &committed)? {
                taken
                    .entry(key.namespace.clone())
                    .or_default()
                    .insert(name.clone());
                names.insert(key, name);
            }
        }
        let known = Known {
            committed: Arc::new(committed),
            names: Arc::new(names),
            registrants: Arc::new(pending_registrants),
            role,
        };

        let (queue, rx) = mpsc::channel(limits.queue_capacity.max(1));
        let stats = Arc::new(StoreStats::default());
        let (exit_tx, exited) = oneshot::channel();
        let writer = Writer {
            conn,
            known: known.clone(),
            stats: stats.clone(),
            changes,
            limits,
            taken,
            _lock: lock,
            revision: opened_revision,
            _exit: exit_tx,
        };
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(dir_error)?;
        let db = Db {
            known,
            stats,
            queue: queue.clone(),
            limits,
            opened_revision,
        };
        Ok((
            db,
            StoreWriter {
                queue,
                thread,
                exited: Some(exited),
            },
        ))
    }

    /// Makes `registration` durable. Returns once it is committed, or at once when everything in
    /// it is stored already or the queue is full (in registrations or bytes).
    pub async fn register(
        &self,
        registration: Registration,
    ) -> Result<RegisterOutcome, StoreError> {
        if self.is_stored(&registration) {
            self.stats.already_stored.fetch_add(1, Ordering::Relaxed);
            return Ok(RegisterOutcome::AlreadyStored);
        }
        let bytes = registration.size_bytes();
        let queued = self.stats.queued_bytes.fetch_add(bytes, Ordering::SeqCst);
        if queued + bytes > self.limits.queue_bytes {
            self.stats.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
            return Err(StoreError::Busy(format!(
                "{queued} bytes of registrations waiting, ingest.queueBytes is {}",
                self.limits.queue_bytes
            )));
        }
        let (reply, answer) = oneshot::channel();
        let command = Command::Register {
            registration,
            bytes,
            reply,
        };
        // Counted before the send: the writer may take it (and count it down) at once.
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        match self.queue.try_send(command) {
            Ok(()) => {}
            Err(err) => {
                self.stats.queued.fetch_sub(1, Ordering::SeqCst);
                self.stats.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
                return Err(match err {
                    mpsc::error::TrySendError::Full(_) => StoreError::Busy(format!(
                        "{} registrations waiting",
                        self.queue.max_capacity()
                    )),
                    mpsc::error::TrySendError::Closed(_) => StoreError::ShuttingDown,
                });
            }
        }
        answer.await.unwrap_or(Err(StoreError::ShuttingDown))
    }

    fn is_stored(&self, registration: &Registration) -> bool {
        registration
            .keys()
            .all(|key| self.known.holds(&key, registration))
    }

    /// Everything committed, sorted.
    pub fn snapshot(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        self.known
            .committed
            .iter()
            .map(|entry| (entry.key().clone(), entry.value().clone()))
            .collect()
    }

    /// Removes `application` from `interfaces` (all of its interfaces when `None`) of
    /// `namespace`, durably and as a new revision; returns the pairs removed. Registrations
    /// queued before it are committed first, so they are removed too; later ones add back.
    pub async fn unregister(
        &self,
        namespace: String,
        application: String,
        interfaces: Option<BTreeSet<String>>,
    ) -> Result<MappingDelta, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Command::Unregister {
                namespace,
                application,
                interfaces,
                reply,
            })
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        answer.await.unwrap_or(Err(StoreError::ShuttingDown))
    }

    /// Removes pairs that have reached their final store. Returns once the removal is queued
    /// behind every registration queued before it.
    pub async fn complete(
        &self,
        pairs: MappingDelta,
        registrants: PendingRegistrants,
    ) -> Result<(), StoreError> {
        self.queue
            .send(Command::Complete(pairs, registrants))
            .await
            .map_err(|_| StoreError::ShuttingDown)
    }
}

impl StoreWriter {
    /// Resolves when the writer thread has ended, for whatever reason.
    pub fn take_exit_signal(&mut self) -> Option<oneshot::Receiver<()>> {
        self.exited.take()
    }

    /// Commits everything queued before this call, then stops the writer. Blocks.
    pub fn shutdown(self) {
        // The writer may already be gone (its receiver dropped); then there is nothing to wait for.
        let _ = self.queue.blocking_send(Command::Shutdown);
        if self.thread.join().is_err() {
            tracing::error!("store writer thread panicked");
        }
    }
}

struct Writer {
    conn: Connection,
    known: Known,
    stats: Arc<StoreStats>,
    changes: mpsc::Sender<StoredChange>,
    limits: StoreLimits,
    /// Object names in use per namespace (standalone), so a new key never takes a used one.
    taken: HashMap<String, HashSet<String>>,
    /// Keeps the data directory locked for as long as the writer runs.
    _lock: File,
    revision: i64,
    /// Dropped when the thread ends, which tells the supervisor.
    _exit: oneshot::Sender<()>,
}

type Reply = oneshot::Sender<Result<RegisterOutcome, StoreError>>;

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut batch: Vec<(Registration, Reply)> = Vec::with_capacity(self.limits.max_batch);
        let mut stopping = false;
        while !stopping {
            let Some(first) = rx.blocking_recv() else {
                break;
            };
            let mut next = Some(first);
            while let Some(command) = next.take() {
                match command {
                    Command::Register {
                        registration,
                        bytes,
                        reply,
                    } => {
                        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
                        self.stats.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
                        batch.push((registration, reply));
                    }
                    Command::Complete(pairs, registrants) => {
                        // Registrations queued before it are committed first, so a pair
                        // registered again meanwhile is not lost by the removal.
                        self.commit(&mut batch);
                        self.remove(&pairs, &registrants);
                    }
                    Command::Unregister {
                        namespace,
                        application,
                        interfaces,
                        reply,
                    } => {
                        self.commit(&mut batch);
                        let removed =
                            self.unregister(&namespace, &application, interfaces.as_ref());
                        let _ = reply.send(removed);
                    }
                    Command::Shutdown => stopping = true,
                }
                if !stopping && batch.len() < self.limits.max_batch {
                    next = rx.try_recv().ok();
                }
            }
            self.commit(&mut batch);
        }
    }

    /// Deletes an application's pairs in one transaction with a new revision, then publishes the
    /// keys it left (the publisher reads what each key holds now).
    fn unregister(
        &mut self,
        namespace: &str,
        application: &str,
        interfaces: Option<&BTreeSet<String>>,
    ) -> Result<MappingDelta, StoreError> {
        let mut removed = MappingDelta::default();
        for entry in self.known.committed.iter() {
            let key = entry.key();
            if key.namespace == namespace
                && interfaces.is_none_or(|wanted| wanted.contains(&key.interface))
                && entry.value().contains(application)
            {
                removed.add(key.clone(), application.to_owned());
            }
        }
        if removed.is_empty() {
            return Ok(removed);
        }
        let none = PendingRegistrants::new();
        if let Err(err) = delete_pairs(&mut self.conn, &removed, &none, Some(self.revision + 1)) {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::CommitFailed(Arc::new(err)));
        }
        self.revision += 1;
        self.stats
            .pairs_removed
            .fetch_add(removed.pairs() as u64, Ordering::Relaxed);
        self.forget(&removed);
        let change = StoredChange {
            delta: removed.clone(),
            revision: self.revision,
        };
        if self.changes.blocking_send(change).is_err() {
            tracing::warn!("change feed closed; stored changes are no longer published");
        }
        Ok(removed)
    }

    fn remove(&mut self, pairs: &MappingDelta, registrants: &PendingRegistrants) {
        // A pod recorded while the write was in flight keeps its pair pending, so the writer
        // (now, or after a restart) writes it too.
        let mut done = MappingDelta::default();
        for (key, apps) in pairs.iter() {
            let pending = self.known.registrants.get(key);
            let written = registrants.get(key);
            for app in apps {
                let unwritten = pending
                    .as_ref()
                    .and_then(|p| p.get(app))
                    .is_some_and(|pods| {
                        let written = written.and_then(|w| w.get(app));
                        pods.iter()
                            .any(|pod| written.is_none_or(|w| !w.contains(pod)))
                    });
                if !unwritten {
                    done.add(key.clone(), app.clone());
                }
            }
        }
        if let Err(err) = delete_pairs(&mut self.conn, &done, registrants, None) {
            // They stay in the outbox and are written again (a no-op upsert) after a restart.
            tracing::warn!(error = %err, "cannot remove written pairs from the outbox");
            return;
        }
        self.forget(&done);
        for (key, written) in registrants {
            if let Some(mut pending) = self.known.registrants.get_mut(key) {
                for (application, pods) in written {
                    if let Some(left) = pending.get_mut(application) {
                        left.retain(|pod| !pods.contains(pod));
                        if left.is_empty() {
                            pending.remove(application);
                        }
                    }
                }
            }
            self.known
                .registrants
                .remove_if(key, |_, pending| pending.is_empty());
        }
    }

    /// Drops removed pairs from the in-memory mirror.
    fn forget(&self, pairs: &MappingDelta) {
        for (key, apps) in pairs.iter() {
            if let Some(mut stored) = self.known.committed.get_mut(key) {
                stored.retain(|app| !apps.contains(app));
            }
            self.known
                .committed
                .remove_if(key, |_, stored| stored.is_empty());
        }
    }

    /// A name for a new key (standalone): its first candidate no other key of the namespace
    /// holds. Deterministic given the order keys arrive in, and persisted, so it never changes.
    fn assign_name(&mut self, key: &MappingKey) -> String {
        let taken = self.taken.entry(key.namespace.clone()).or_default();
        let candidates = candidate_names(&key.interface);
        let name = candidates
            .iter()
            .find(|name| !taken.contains(*name))
            .cloned()
            .unwrap_or_else(|| {
                // All three taken: only possible for a crafted 64-bit hash collision.
                let last = candidates.last().cloned().unwrap_or_default();
                (2..)
                    .map(|n| format!("{last}-{n}"))
                    .find(|name| !taken.contains(name))
                    .unwrap_or(last)
            });
        taken.insert(name.clone());
        name
    }

    /// Writes the new pairs of a batch in one transaction and answers every caller in it.
    fn commit(&mut self, batch: &mut Vec<(Registration, Reply)>) {
        if batch.is_empty() {
            return;
        }
        let mut new_pairs = MappingDelta::default();
        let mut new_registrants = PendingRegistrants::new();
        let mut outcomes: Vec<Result<usize, StoreError>> = Vec::with_capacity(batch.len());
        let limit = self.limits.max_applications_per_key;
        let tracks_pods = matches!(self.known.role, Role::Outbox { .. });
        for (registration, _) in batch.iter() {
            let application = &registration.application;
            let pod = registration.pod.as_deref().unwrap_or(PODLESS);
            // Keys where the pair, or the pod's record of it, is new.
            let fresh: Vec<MappingKey> = registration
                .keys()
                .filter(|key| {
                    !self.known.holds(key, registration)
                        && !(new_pairs.contains(key, application)
                            && (!tracks_pods
                                || registrants::is_pending(
                                    new_registrants.get(key),
                                    application,
                                    pod,
                                )))
                })
                .collect();
            let full = fresh.iter().find(|key| {
                let new_application =
                    !self.known.contains(key, application) && !new_pairs.contains(key, application);
                let pending = new_pairs.applications(key).map_or(0, BTreeSet::len);
                new_application && self.known.applications_of(key) + pending >= limit
            });
            if let Some(key) = full {
                outcomes.push(Err(StoreError::TooManyApplications {
                    key: key.clone(),
                    limit,
                }));
                continue;
            }
            outcomes.push(Ok(fresh.len()));
            for key in fresh {
                if tracks_pods {
                    // While a key cannot be written (parked), pods keep arriving: past what one
                    // record holds, the application is pinned instead of growing the table.
                    let waiting = self
                        .known
                        .registrants
                        .get(&key)
                        .and_then(|p| p.get(application).map(BTreeSet::len))
                        .unwrap_or(0)
                        + new_registrants
                            .get(&key)
                            .and_then(|p| p.get(application).map(BTreeSet::len))
                            .unwrap_or(0);
                    let pod = if waiting >= registrants::MAX_PODS_PER_APPLICATION {
                        PODLESS
                    } else {
                        pod
                    };
                    registrants::add_pending(
                        new_registrants.entry(key.clone()).or_default(),
                        application,
                        pod,
                    );
                }
                new_pairs.add(key, application.clone());
            }
        }

        if new_pairs.is_empty() {
            self.answer(batch, outcomes);
            return;
        }

        let new_names: Vec<(MappingKey, String)> = match self.known.role {
            Role::Store => new_pairs
                .iter()
                .map(|(key, _)| key.clone())
                .filter(|key| !self.known.names.contains_key(key))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|key| {
                    let name = self.assign_name(&key);
                    (key, name)
                })
                .collect(),
            Role::Outbox { .. } => Vec::new(),
        };
        let started = std::time::Instant::now();
        let written = write_pairs(
            &mut self.conn,
            &new_pairs,
            &new_registrants,
            &new_names,
            self.revision + 1,
        );
        self.stats
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        match written {
            Ok(()) => {
                self.revision += 1;
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .pairs_written
                    .fetch_add(new_pairs.pairs() as u64, Ordering::Relaxed);
                for (key, name) in new_names {
                    self.known.names.insert(key, name);
                }
                for (key, apps) in new_pairs.iter() {
                    self.known
                        .committed
                        .entry(key.clone())
                        .or_default()
                        .extend(apps.iter().cloned());
                }
                for (key, pending) in new_registrants {
                    let mut known = self.known.registrants.entry(key).or_default();
                    for (application, pods) in pending {
                        known.entry(application).or_default().extend(pods);
                    }
                }
                self.answer(batch, outcomes);
                let change = StoredChange {
                    delta: new_pairs,
                    revision: self.revision,
                };
                if self.changes.blocking_send(change).is_err() {
                    tracing::warn!("change feed closed; stored changes are no longer published");
                }
            }
            Err(err) => {
                // Names chosen for this batch were not persisted: give them back.
                for (key, name) in &new_names {
                    if let Some(taken) = self.taken.get_mut(&key.namespace) {
                        taken.remove(name);
                    }
                }
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %err, registrations = batch.len(), "commit failed");
                let source = Arc::new(err);
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::CommitFailed(source.clone())));
                }
            }
        }
    }

    fn answer(
        &self,
        batch: &mut Vec<(Registration, Reply)>,
        outcomes: Vec<Result<usize, StoreError>>,
    ) {
        for ((_, reply), outcome) in batch.drain(..).zip(outcomes) {
            let outcome = outcome.map(|added| {
                if added == 0 {
                    self.stats.already_stored.fetch_add(1, Ordering::Relaxed);
                    RegisterOutcome::AlreadyStored
                } else {
                    RegisterOutcome::Stored { added }
                }
            });
            // A caller that gave up waiting is still stored; nothing to tell it.
            let _ = reply.send(outcome);
        }
    }
}

/// The rows of the `registrant` table `registrants` stands for.
fn registrant_rows(
    registrants: &PendingRegistrants,
) -> impl Iterator<Item = (&MappingKey, &String, &String)> {
    registrants.iter().flat_map(|(key, pending)| {
        pending.iter().flat_map(move |(application, pods)| {
            pods.iter().map(move |pod| (key, application, pod))
        })
    })
}

/// Deletes `pairs` and written registrant records; with `revision`, also moves the stored
/// revision to it (a change clients see).
fn delete_pairs(
    conn: &mut Connection,
    pairs: &MappingDelta,
    registrants: &PendingRegistrants,
    revision: Option<i64>,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut forget = tx.prepare_cached(
            "DELETE FROM registrant WHERE namespace = ?1 AND interface = ?2 AND application = ?3 AND pod = ?4",
        )?;
        for (key, application, pod) in registrant_rows(registrants) {
            forget.execute(params![key.namespace, key.interface, application, pod])?;
        }
        if let Some(revision) = revision {
            tx.execute(
                "UPDATE meta SET value = MAX(value, ?1) WHERE name = 'revision'",
                params![revision],
            )?;
        }
        let mut delete = tx.prepare_cached(
            "DELETE FROM mapping WHERE namespace = ?1 AND interface = ?2 AND application = ?3",
        )?;
        for (key, apps) in pairs.iter() {
            for app in apps {
                delete.execute(params![key.namespace, key.interface, app])?;
            }
        }
    }
    tx.commit()
}

fn prepare_schema(conn: &Connection) -> rusqlite::Result<()> {
    // WAL lets readers (an operator's sqlite3 shell) work beside the writer; FULL makes every
    // commit survive a power cut, not only a process crash.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS mapping (
             namespace   TEXT NOT NULL,
             interface   TEXT NOT NULL,
             application TEXT NOT NULL,
             PRIMARY KEY (namespace, interface, application)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS object_name (
             namespace TEXT NOT NULL,
             interface TEXT NOT NULL,
             name      TEXT NOT NULL,
             PRIMARY KEY (namespace, interface),
             UNIQUE (namespace, name)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS registrant (
             namespace   TEXT NOT NULL,
             interface   TEXT NOT NULL,
             application TEXT NOT NULL,
             pod         TEXT NOT NULL,
             PRIMARY KEY (namespace, interface, application, pod)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS meta (
             name  TEXT PRIMARY KEY,
             value INTEGER NOT NULL
         ) WITHOUT ROWID;
         INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 0);",
    )?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    Ok(())
}

/// Moves the revision past every earlier one, so clients never see it go backwards across a
/// restart, even when the state itself did not change.
fn bump_revision(conn: &mut Connection) -> rusqlite::Result<i64> {
    conn.query_row(
        "UPDATE meta SET value = value + 1 WHERE name = 'revision' RETURNING value",
        [],
        |row| row.get(0),
    )
}

/// Registering pods committed and not yet written to their objects (Kubernetes mode).
fn load_registrants(conn: &Connection) -> rusqlite::Result<DashMap<MappingKey, Pending>> {
    let pending: DashMap<MappingKey, Pending> = DashMap::new();
    let mut stmt = conn.prepare("SELECT namespace, interface, application, pod FROM registrant")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let key = MappingKey::new(row.get::<_, String>(0)?, row.get::<_, String>(1)?);
        let application: String = row.get(2)?;
        let pod: String = row.get(3)?;
        registrants::add_pending(
            pending.entry(key).or_default().value_mut(),
            &application,
            &pod,
        );
    }
    Ok(pending)
}

fn load_all(conn: &Connection) -> rusqlite::Result<SharedMappings> {
    let committed = SharedMappings::new();
    let mut stmt = conn.prepare("SELECT namespace, interface, application FROM mapping")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let key = MappingKey::new(row.get::<_, String>(0)?, row.get::<_, String>(1)?);
        committed.entry(key).or_default().insert(row.get(2)?);
    }
    Ok(committed)
}

/// The persisted object names; keys stored before names were persisted (schema 1) get theirs
/// now, in key order, and keep them from then on.
fn load_names(
    conn: &mut Connection,
    committed: &SharedMappings,
) -> rusqlite::Result<Vec<(MappingKey, String)>> {
    let mut names: Vec<(MappingKey, String)> = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT namespace, interface, name FROM object_name")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let key = MappingKey::new(row.get::<_, String>(0)?, row.get::<_, String>(1)?);
            names.push((key, row.get(2)?));
        }
    }
    let named: HashSet<&MappingKey> = names.iter().map(|(key, _)| key).collect();
    let mut unnamed: Vec<MappingKey> = committed
        .iter()
        .map(|entry| entry.key().clone())
        .filter(|key| !named.contains(key))
        .collect();
    if unnamed.is_empty() {
        return Ok(names);
    }
    unnamed.sort();
    let mut taken: HashMap<String, HashSet<String>> = HashMap::new();
    for (key, name) in &names {
        taken
            .entry(key.namespace.clone())
            .or_default()
            .insert(name.clone());
    }
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO object_name (namespace, interface, name) VALUES (?1, ?2, ?3)",
        )?;
        for key in unnamed {
            let taken = taken.entry(key.namespace.clone()).or_default();
            let Some(name) = candidate_names(&key.interface)
                .into_iter()
                .find(|name| !taken.contains(name))
            else {
                tracing::error!(%key, "no free object name; the mapping is not served");
                continue;
            };
            insert.execute(params![key.namespace, key.interface, name])?;
            taken.insert(name.clone());
            names.push((key, name));
        }
    }
    tx.commit()?;
    Ok(names)
}

fn write_pairs(
    conn: &mut Connection,
    pairs: &MappingDelta,
    registrants: &PendingRegistrants,
    names: &[(MappingKey, String)],
    revision: i64,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut record = tx.prepare_cached(
            "INSERT OR IGNORE INTO registrant (namespace, interface, application, pod) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (key, application, pod) in registrant_rows(registrants) {
            record.execute(params![key.namespace, key.interface, application, pod])?;
        }
        let mut insert = tx.prepare_cached(
            "INSERT OR IGNORE INTO mapping (namespace, interface, application) VALUES (?1, ?2, ?3)",
        )?;
        for (key, apps) in pairs.iter() {
            for app in apps {
                insert.execute(params![key.namespace, key.interface, app])?;
            }
        }
        let mut name = tx.prepare_cached(
            "INSERT INTO object_name (namespace, interface, name) VALUES (?1, ?2, ?3)",
        )?;
        for (key, object_name) in names {
            name.execute(params![key.namespace, key.interface, object_name])?;
        }
        tx.execute(
            "UPDATE meta SET value = MAX(value, ?1) WHERE name = 'revision'",
            params![revision],
        )?;
    }
    tx.commit()
}
