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
/// 4: new pairs are committed to `journal` first (see `sql::write_pairs`).
const SCHEMA_VERSION: i64 = 4;

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
    /// Times the journal was moved into the keyed tables.
    pub journal_folds: AtomicU64,
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
            journal_folds: AtomicU64::new(0),
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
            "store_journal_folds",
            "Times the store moved its journal of new pairs into the keyed tables",
            self,
            |s| s.journal_folds.load(Ordering::Relaxed),
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
        let found: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: data_dir.to_path_buf(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        prepare_schema(&conn)?;
        restrict_permissions(data_dir).map_err(dir_error)?;
        let opened_revision = bump_revision(&mut conn)?;
        // Whatever the last run left in the journal (it stopped without folding) is loaded from
        // the keyed tables like the rest.
        fold(&mut conn)?;
        let committed = load_all(&conn)?;
        let table_rows = committed.iter().map(|entry| entry.value().len()).sum();
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
            journal_rows: 0,
            table_rows,
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

#[cfg(test)]
mod journal_tests;
mod sql;
mod writer;

use sql::*;
use writer::*;
