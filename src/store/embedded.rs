//! The embedded store: SQLite in WAL mode, written by one thread that group-commits everything
//! queued since its last commit, so many concurrent registrations share one fsync.
//!
//! A registration is acknowledged only after the transaction holding it has committed. The set
//! of committed pairs is mirrored in memory, so re-registering what is stored costs a lookup and
//! no write.
//!
//! In Kubernetes mode the same table is the local outbox: pairs stay in it until they have been
//! written to the API server ([`EmbeddedStore::complete`]), and pairs the watch already shows in
//! the cluster (`StoreOptions::present_elsewhere`) are not written at all.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, params};
use tokio::sync::{mpsc, oneshot};

use super::{RegisterOutcome, StoreError, StoredChange};
use crate::mapping::{MappingDelta, MappingKey, Registration, SharedMappings, contains_pair};

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "dubbo-cp.db";
/// Held with an exclusive lock while a process uses the data directory.
const LOCK_FILE: &str = "dubbo-cp.lock";
const SCHEMA_VERSION: i64 = 1;

#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Pairs stored elsewhere (the watched cluster state in Kubernetes mode); a registration
    /// whose pairs are all there or here needs no write.
    pub present_elsewhere: Option<Arc<SharedMappings>>,
    /// Registrations that may wait for the writer; beyond this callers are refused at once.
    pub queue_capacity: usize,
    /// Most registrations one transaction takes.
    pub max_batch: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            present_elsewhere: None,
            queue_capacity: 8192,
            max_batch: 4096,
        }
    }
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
}

impl Default for StoreStats {
    fn default() -> Self {
        Self {
            commit_seconds: crate::metrics::latency_histogram(),
            errors: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            pairs_written: AtomicU64::new(0),
            already_stored: AtomicU64::new(0),
        }
    }
}

enum Command {
    Register {
        registration: Registration,
        reply: oneshot::Sender<Result<RegisterOutcome, StoreError>>,
    },
    /// Removes pairs that reached their final store (Kubernetes mode).
    Complete(MappingDelta),
    Shutdown,
}

/// What is committed here, and what is known to be stored elsewhere.
#[derive(Clone)]
struct Known {
    committed: Arc<SharedMappings>,
    elsewhere: Option<Arc<SharedMappings>>,
}

impl Known {
    fn contains(&self, key: &MappingKey, application: &str) -> bool {
        contains_pair(&self.committed, key, application)
            || self
                .elsewhere
                .as_ref()
                .is_some_and(|elsewhere| contains_pair(elsewhere, key, application))
    }
}

/// Handle for registering and reading; cheap to clone.
#[derive(Clone)]
pub struct EmbeddedStore {
    known: Known,
    stats: Arc<StoreStats>,
    queue: mpsc::Sender<Command>,
    /// The revision in effect when the store was opened (already bumped past every earlier one).
    opened_revision: i64,
}

/// Owns the writer thread; [`StoreWriter::shutdown`] commits what is queued and stops it.
pub struct StoreWriter {
    queue: mpsc::Sender<Command>,
    thread: std::thread::JoinHandle<()>,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `data_dir` and starts its writer thread. Every commit that
    /// adds something is sent on `changes` with its revision.
    pub fn open(
        data_dir: &Path,
        options: StoreOptions,
        changes: mpsc::Sender<StoredChange>,
    ) -> Result<(EmbeddedStore, StoreWriter), StoreError> {
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
        prepare_schema(&conn)?;
        let opened_revision = bump_revision(&mut conn)?;
        let known = Known {
            committed: Arc::new(load_all(&conn)?),
            elsewhere: options.present_elsewhere.clone(),
        };

        let (queue, rx) = mpsc::channel(options.queue_capacity.max(1));
        let stats = Arc::new(StoreStats::default());
        let writer = Writer {
            conn,
            known: known.clone(),
            stats: stats.clone(),
            changes,
            max_batch: options.max_batch.max(1),
            _lock: lock,
            revision: opened_revision,
        };
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(dir_error)?;
        let store = EmbeddedStore {
            known,
            stats,
            queue: queue.clone(),
            opened_revision,
        };
        Ok((store, StoreWriter { queue, thread }))
    }

    /// Makes `registration` durable. Returns once it is committed, or at once when everything in
    /// it is stored already or the queue is full.
    pub async fn register(
        &self,
        registration: Registration,
    ) -> Result<RegisterOutcome, StoreError> {
        if self.is_stored(&registration) {
            self.stats.already_stored.fetch_add(1, Ordering::Relaxed);
            return Ok(RegisterOutcome::AlreadyStored);
        }
        let (reply, answer) = oneshot::channel();
        let command = Command::Register {
            registration,
            reply,
        };
        match self.queue.try_send(command) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(StoreError::Busy(self.queue.max_capacity()));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(StoreError::ShuttingDown),
        }
        answer.await.unwrap_or(Err(StoreError::ShuttingDown))
    }

    fn is_stored(&self, registration: &Registration) -> bool {
        registration
            .keys()
            .all(|key| self.known.contains(&key, &registration.application))
    }

    /// Everything committed, sorted.
    pub fn snapshot(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        self.known
            .committed
            .iter()
            .map(|entry| (entry.key().clone(), entry.value().clone()))
            .collect()
    }

    /// Number of committed (key, application) pairs.
    pub fn pair_count(&self) -> usize {
        self.known
            .committed
            .iter()
            .map(|entry| entry.value().len())
            .sum()
    }

    /// The committed applications of one key.
    pub fn applications(&self, key: &MappingKey) -> Option<BTreeSet<String>> {
        self.known.committed.get(key).map(|apps| apps.clone())
    }

    /// Removes pairs that have reached their final store (Kubernetes mode: the API server), so
    /// they are not written again after a restart. Returns once the removal is committed.
    pub async fn complete(&self, pairs: MappingDelta) -> Result<(), StoreError> {
        self.queue
            .send(Command::Complete(pairs))
            .await
            .map_err(|_| StoreError::ShuttingDown)
    }

    pub fn opened_revision(&self) -> i64 {
        self.opened_revision
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Registrations waiting for the writer.
    pub fn queue_depth(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }
}

impl StoreWriter {
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
    max_batch: usize,
    /// Keeps the data directory locked for as long as the writer runs.
    _lock: File,
    revision: i64,
}

type Pending = (
    Registration,
    oneshot::Sender<Result<RegisterOutcome, StoreError>>,
);

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut batch: Vec<Pending> = Vec::with_capacity(self.max_batch);
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
                        reply,
                    } => batch.push((registration, reply)),
                    Command::Complete(pairs) => {
                        // Registrations queued before it are committed first, so a pair
                        // registered again meanwhile is not lost by the removal.
                        self.commit(&mut batch);
                        self.remove(&pairs);
                    }
                    Command::Shutdown => stopping = true,
                }
                if !stopping && batch.len() < self.max_batch {
                    next = rx.try_recv().ok();
                }
            }
            self.commit(&mut batch);
        }
    }

    fn remove(&mut self, pairs: &MappingDelta) {
        if let Err(err) = delete_pairs(&mut self.conn, pairs) {
            // They stay in the outbox and are written again (a no-op upsert) after a restart.
            tracing::warn!(error = %err, "cannot remove written pairs from the outbox");
            return;
        }
        for (key, apps) in pairs.iter() {
            if let Some(mut stored) = self.known.committed.get_mut(key) {
                stored.retain(|app| !apps.contains(app));
            }
            self.known
                .committed
                .remove_if(key, |_, stored| stored.is_empty());
        }
    }

    /// Writes the new pairs of a batch in one transaction and answers every caller in it.
    fn commit(&mut self, batch: &mut Vec<Pending>) {
        if batch.is_empty() {
            return;
        }
        let mut new_pairs = MappingDelta::default();
        let mut added_per_registration = Vec::with_capacity(batch.len());
        for (registration, _) in batch.iter() {
            let mut added = 0;
            for key in registration.keys() {
                let stored = self.known.contains(&key, &registration.application);
                if !stored && !new_pairs.contains(&key, &registration.application) {
                    new_pairs.add(key, registration.application.clone());
                    added += 1;
                }
            }
            added_per_registration.push(added);
        }

        if new_pairs.is_empty() {
            self.stats
                .already_stored
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            for (_, reply) in batch.drain(..) {
                let _ = reply.send(Ok(RegisterOutcome::AlreadyStored));
            }
            return;
        }

        let started = std::time::Instant::now();
        let written = write_pairs(&mut self.conn, &new_pairs, self.revision + 1);
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
                for (key, apps) in new_pairs.iter() {
                    self.known
                        .committed
                        .entry(key.clone())
                        .or_default()
                        .extend(apps.iter().cloned());
                }
                for ((_, reply), added) in batch.drain(..).zip(added_per_registration) {
                    let outcome = if added == 0 {
                        RegisterOutcome::AlreadyStored
                    } else {
                        RegisterOutcome::Stored { added }
                    };
                    // A caller that gave up waiting is still stored; nothing to tell it.
                    let _ = reply.send(Ok(outcome));
                }
                let change = StoredChange {
                    delta: new_pairs,
                    revision: self.revision,
                };
                if self.changes.blocking_send(change).is_err() {
                    tracing::warn!("change feed closed; stored changes are no longer published");
                }
            }
            Err(err) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %err, registrations = batch.len(), "commit failed");
                let message = err.to_string();
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::Storage(message.clone())));
                }
            }
        }
    }
}

fn delete_pairs(conn: &mut Connection, pairs: &MappingDelta) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
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

fn write_pairs(conn: &mut Connection, pairs: &MappingDelta, revision: i64) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT OR IGNORE INTO mapping (namespace, interface, application) VALUES (?1, ?2, ?3)",
        )?;
        for (key, apps) in pairs.iter() {
            for app in apps {
                insert.execute(params![key.namespace, key.interface, app])?;
            }
        }
        tx.execute(
            "UPDATE meta SET value = ?1 WHERE name = 'revision'",
            params![revision],
        )?;
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(ns: &str, app: &str, interfaces: &[&str]) -> Registration {
        Registration {
            namespace: ns.into(),
            application: app.into(),
            interfaces: interfaces.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn open(dir: &Path) -> (EmbeddedStore, StoreWriter, mpsc::Receiver<StoredChange>) {
        let (tx, rx) = mpsc::channel(1024);
        match EmbeddedStore::open(dir, StoreOptions::default(), tx) {
            Ok((store, writer)) => (store, writer, rx),
            Err(err) => panic!("open failed: {err}"),
        }
    }

    async fn close(writer: StoreWriter) {
        assert!(
            tokio::task::spawn_blocking(move || writer.shutdown())
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn stores_reloads_and_skips_what_is_stored() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (store, writer, mut changes) = open(dir.path());
        let first_revision = store.opened_revision();
        let outcome = store
            .register(registration("ns", "app", &["I1", "I2"]))
            .await;
        assert_eq!(outcome.ok(), Some(RegisterOutcome::Stored { added: 2 }));
        let change = changes.recv().await.unwrap_or_default();
        assert_eq!(change.delta.pairs(), 2);
        assert_eq!(change.revision, first_revision + 1);

        let again = store
            .register(registration("ns", "app", &["I2", "I1"]))
            .await;
        assert_eq!(again.ok(), Some(RegisterOutcome::AlreadyStored));
        let partly = store
            .register(registration("ns", "app", &["I1", "I3"]))
            .await;
        assert_eq!(partly.ok(), Some(RegisterOutcome::Stored { added: 1 }));
        assert_eq!(store.stats().commits.load(Ordering::Relaxed), 2);
        assert_eq!(store.stats().pairs_written.load(Ordering::Relaxed), 3);
        close(writer).await;

        let (reopened, writer, _changes) = open(dir.path());
        assert!(
            reopened.opened_revision() > first_revision + 2,
            "revision went backwards"
        );
        let snapshot = reopened.snapshot();
        assert_eq!(snapshot.len(), 3);
        let apps = snapshot
            .get(&MappingKey::new("ns", "I3"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            apps.into_iter().collect::<Vec<_>>(),
            vec!["app".to_string()]
        );
        close(writer).await;
    }

    #[tokio::test]
    async fn completed_pairs_leave_and_pairs_present_elsewhere_are_not_written() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let elsewhere = Arc::new(SharedMappings::new());
        elsewhere
            .entry(MappingKey::new("ns", "In-cluster"))
            .or_default()
            .insert("app".into());
        let (tx, _rx) = mpsc::channel(16);
        let options = StoreOptions {
            present_elsewhere: Some(elsewhere),
            ..StoreOptions::default()
        };
        let (store, writer) =
            EmbeddedStore::open(dir.path(), options, tx).unwrap_or_else(|e| panic!("{e}"));
        let present = store
            .register(registration("ns", "app", &["In-cluster"]))
            .await;
        assert_eq!(present.ok(), Some(RegisterOutcome::AlreadyStored));
        assert_eq!(store.stats().commits.load(Ordering::Relaxed), 0);

        let outcome = store
            .register(registration("ns", "app", &["I1", "I2"]))
            .await;
        assert_eq!(outcome.ok(), Some(RegisterOutcome::Stored { added: 2 }));
        let mut written = MappingDelta::default();
        written.add(MappingKey::new("ns", "I1"), "app".into());
        assert!(store.complete(written).await.is_ok());
        close(writer).await;

        let (reopened, writer, _changes) = open(dir.path());
        let left: Vec<MappingKey> = reopened.snapshot().into_keys().collect();
        assert_eq!(
            left,
            vec![MappingKey::new("ns", "I2")],
            "completed pair still in the outbox"
        );
        close(writer).await;
    }

    #[tokio::test]
    async fn second_process_on_the_same_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (_store, writer, _changes) = open(dir.path());
        let (tx, _rx) = mpsc::channel(1);
        let second = EmbeddedStore::open(dir.path(), StoreOptions::default(), tx);
        assert!(matches!(second, Err(StoreError::Locked(_))));
        close(writer).await;
    }

    #[tokio::test]
    async fn concurrent_registrations_share_commits() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (store, writer, _changes) = open(dir.path());
        let tasks: Vec<_> = (0..500)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .register(registration("ns", &format!("app-{i}"), &["I1"]))
                        .await
                })
            })
            .collect();
        for task in tasks {
            let outcome = task.await.ok().and_then(|r| r.ok());
            assert_eq!(outcome, Some(RegisterOutcome::Stored { added: 1 }));
        }
        let commits = store.stats().commits.load(Ordering::Relaxed);
        assert!((1..=500).contains(&commits));
        assert_eq!(
            store
                .snapshot()
                .get(&MappingKey::new("ns", "I1"))
                .map(|a| a.len()),
            Some(500)
        );
        close(writer).await;
    }

    #[tokio::test]
    async fn full_queue_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        // The change feed has room for one change and nobody reads it, so the writer blocks after
        // its second commit and the one-slot queue fills up.
        let (tx, _rx) = mpsc::channel(1);
        let options = StoreOptions {
            queue_capacity: 1,
            max_batch: 1,
            ..StoreOptions::default()
        };
        let (store, writer) = match EmbeddedStore::open(dir.path(), options, tx) {
            Ok(opened) => opened,
            Err(err) => panic!("{err}"),
        };
        let mut busy = 0;
        let mut waiting = Vec::new();
        for i in 0..10 {
            let store = store.clone();
            let reg = registration("ns", &format!("app-{i}"), &["I"]);
            let task = tokio::spawn(async move { store.register(reg).await });
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            if task.is_finished() {
                if let Ok(Err(StoreError::Busy(_))) = task.await {
                    busy += 1;
                }
            } else {
                waiting.push(task);
            }
        }
        assert!(busy >= 5, "only {busy} of 10 refused with a full queue");
        drop(_rx);
        for task in waiting {
            task.abort();
        }
        drop(writer);
    }
}
