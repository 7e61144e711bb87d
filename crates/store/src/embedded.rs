//! The standalone store: the embedded database is the truth. Pairs are never removed by the
//! control plane, and every key has an object name chosen once (see
//! [`crate::mapping::candidate_names`]) and persisted with its first pair, so interfaces that
//! differ only in letter case are distinct objects and a key's name never changes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::db::{Db, Role, StoreWriter};
use super::{RegisterOutcome, StoreError, StoreLimits, StoreStats, StoredChange};
use crate::debounce::{self, Batch, DebounceConfig};
use crate::index::{Change, Index, Kind};
use crate::mapping::{MappingKey, Registration};
use crate::metrics::Metrics;
use crate::resource::mapping_object;

/// One stored mapping as the discovery stream shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub name: String,
    pub applications: BTreeSet<String>,
}

/// Handle to the standalone store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Db,
}

impl Store {
    /// Opens (or creates) the store in `data_dir` and starts its writer thread. Every commit that
    /// adds something is sent on `changes` with its revision.
    pub fn open(
        data_dir: &Path,
        limits: StoreLimits,
        changes: mpsc::Sender<StoredChange>,
    ) -> Result<(Store, StoreWriter), StoreError> {
        let (db, writer) = Db::open(data_dir, Role::Store, limits, changes)?;
        Ok((Store { db }, writer))
    }

    /// Makes `registration` durable; see [`Db::register`].
    pub async fn register(
        &self,
        registration: Registration,
    ) -> Result<RegisterOutcome, StoreError> {
        self.db.register(registration).await
    }

    /// Every stored mapping, sorted.
    pub fn mappings(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        self.db.snapshot()
    }

    /// One stored mapping with its object name.
    pub fn object(&self, key: &MappingKey) -> Option<StoredObject> {
        let name = self.db.known.names.get(key)?.clone();
        let applications = self.db.known.committed.get(key)?.clone();
        Some(StoredObject { name, applications })
    }

    /// Every stored mapping with its object name.
    pub fn objects(&self) -> Vec<(MappingKey, StoredObject)> {
        self.mappings()
            .into_keys()
            .filter_map(|key| self.object(&key).map(|object| (key, object)))
            .collect()
    }

    /// Removes `application` from `interfaces` of `namespace` (every one when `None`); see
    /// [`Db::unregister`]. Returns the interfaces it left.
    pub async fn unregister(
        &self,
        namespace: &str,
        application: &str,
        interfaces: Option<BTreeSet<String>>,
    ) -> Result<Vec<String>, StoreError> {
        let removed = self
            .db
            .unregister(namespace.to_owned(), application.to_owned(), interfaces)
            .await?;
        Ok(removed
            .iter()
            .map(|(key, _)| key.interface.clone())
            .collect())
    }

    /// How clients key the object of `key` (its name stays with the key once chosen).
    fn client_key(&self, key: &MappingKey) -> Option<String> {
        let name = self.db.known.names.get(key)?;
        Some(crate::mapping::client_key(&name, &key.namespace))
    }

    pub fn opened_revision(&self) -> i64 {
        self.db.opened_revision
    }

    pub fn stats(&self) -> &Arc<StoreStats> {
        &self.db.stats
    }
}

/// The standalone publish stage: committed changes, merged by the debouncer, go to the index,
/// each changed key with all its stored applications. Runs until the change feed closes (the
/// writer stopped) and everything received is published.
pub async fn publish(
    config: DebounceConfig,
    changes: mpsc::Receiver<StoredChange>,
    store: Store,
    index: Arc<Index>,
    metrics: Arc<Metrics>,
) {
    debounce::run(config, changes, |batch: Batch<StoredChange>| {
        metrics.flushed(batch.events, batch.first_event);
        let revision = batch.value.revision;
        let keys = batch.value.delta.len();
        let objects: Vec<Change> = batch
            .value
            .delta
            .iter()
            .filter_map(|(key, _)| match store.object(key) {
                Some(object) => {
                    let (client_key, any) = mapping_object(&object.name, key, &object.applications);
                    Some(Change::Upsert(client_key, any))
                }
                // Its last application was unregistered.
                None => store.client_key(key).map(Change::Delete),
            })
            .collect();
        let changed = index.apply(Kind::ServiceNameMapping, objects, revision);
        tracing::debug!(
            events = batch.events,
            keys,
            revision,
            changed,
            waited_ms = batch.first_event.elapsed().as_millis() as u64,
            "published stored changes"
        );
        std::future::ready(())
    })
    .await;
}

/// Loads the stored state into the index and marks every kind loaded (standalone serves no
/// other source yet).
pub fn load_index(store: &Store, index: &Index) {
    let objects = store
        .objects()
        .into_iter()
        .map(|(key, object)| mapping_object(&object.name, &key, &object.applications))
        .collect();
    index.reset(Kind::ServiceNameMapping, objects, store.opened_revision());
    index.mark_all_loaded();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    use crate::test_registration as registration;

    fn open_with(
        dir: &Path,
        limits: StoreLimits,
        feed: usize,
    ) -> (Store, StoreWriter, mpsc::Receiver<StoredChange>) {
        let (tx, rx) = mpsc::channel(feed);
        let (store, writer) = Store::open(dir, limits, tx).unwrap();
        (store, writer, rx)
    }

    fn open(dir: &Path) -> (Store, StoreWriter, mpsc::Receiver<StoredChange>) {
        open_with(dir, StoreLimits::default(), 1024)
    }

    async fn close(writer: StoreWriter) {
        tokio::task::spawn_blocking(move || writer.shutdown())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn stores_reloads_and_skips_what_is_stored() {
        let dir = tempfile::tempdir().unwrap();
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
        let mappings = reopened.mappings();
        assert_eq!(mappings.len(), 3);
        let apps = mappings
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
    async fn case_variants_get_distinct_names_that_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (store, writer, _changes) = open(dir.path());
        // The lower-case one comes first and keeps the reference name.
        for interface in ["x.y", "x.Y", "x-y"] {
            let outcome = store
                .register(registration("ns", "app", &[interface]))
                .await;
            assert!(matches!(outcome, Ok(RegisterOutcome::Stored { added: 1 })));
        }
        let names = |store: &Store| -> Vec<String> {
            ["x.y", "x.Y", "x-y"]
                .iter()
                .map(|i| store.object(&MappingKey::new("ns", *i)).unwrap().name)
                .collect()
        };
        let before = names(&store);
        assert_eq!(before[0], "x-y");
        assert_ne!(before[1], before[0]);
        assert_ne!(before[2], before[0]);
        assert_ne!(before[2], before[1]);
        // Another namespace may use the reference name again.
        store
            .register(registration("other", "app", &["x.Y"]))
            .await
            .unwrap();
        assert_eq!(
            store.object(&MappingKey::new("other", "x.Y")).unwrap().name,
            "x-y"
        );
        close(writer).await;
        let (reopened, writer, _changes) = open(dir.path());
        assert_eq!(names(&reopened), before, "names changed across a restart");
        close(writer).await;
    }

    #[tokio::test]
    async fn second_process_on_the_same_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, writer, _changes) = open(dir.path());
        let (tx, _rx) = mpsc::channel(1);
        let second = Store::open(dir.path(), StoreLimits::default(), tx);
        assert!(matches!(second, Err(StoreError::Locked(_))));
        close(writer).await;
    }

    #[tokio::test]
    async fn concurrent_registrations_share_commits() {
        let dir = tempfile::tempdir().unwrap();
        // The change feed holds one change and nobody reads it until every registration is
        // queued, so the writer is held after its second commit while the rest pile up.
        let (store, writer, mut changes) = open_with(dir.path(), StoreLimits::default(), 1);
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
        // Every registration is either queued or committed (each adds one pair).
        while store.stats().queued.load(Ordering::SeqCst)
            + (store.stats().pairs_written.load(Ordering::SeqCst) as usize)
            < 500
        {
            tokio::task::yield_now().await;
        }
        // The writer really is held: at most its first two commits are in, the rest wait.
        let held_commits = store.stats().commits.load(Ordering::SeqCst);
        assert!(
            held_commits <= 2,
            "{held_commits} commits before the release"
        );
        let reader = tokio::spawn(async move { while changes.recv().await.is_some() {} });
        for task in tasks {
            let outcome = task.await.unwrap();
            assert_eq!(outcome.ok(), Some(RegisterOutcome::Stored { added: 1 }));
        }
        // Without group commit (one registration per transaction) this is 500.
        let commits = store.stats().commits.load(Ordering::Relaxed);
        assert!(commits <= 50, "500 registrations took {commits} commits");
        assert_eq!(
            store
                .mappings()
                .get(&MappingKey::new("ns", "I1"))
                .map(BTreeSet::len),
            Some(500)
        );
        close(writer).await;
        reader.abort();
    }

    #[tokio::test]
    async fn full_queue_is_refused_at_once_in_count_and_in_bytes() {
        let dir = tempfile::tempdir().unwrap();
        // Nobody reads the one-slot change feed, so the writer blocks in its second commit.
        let limits = StoreLimits {
            queue_capacity: 2,
            max_batch: 1,
            ..StoreLimits::default()
        };
        let (store, _writer, _rx) = open_with(dir.path(), limits, 1);
        let spawn = |i: usize| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .register(registration("ns", &format!("app-{i}"), &["I"]))
                    .await
            })
        };
        let held: Vec<_> = (0..2).map(spawn).collect();
        while store.stats().commits.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        let queued: Vec<_> = (2..4).map(spawn).collect();
        while store.stats().queued.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        for i in 4..10 {
            let refused = store
                .register(registration("ns", &format!("app-{i}"), &["I"]))
                .await;
            assert!(
                matches!(refused, Err(StoreError::Busy(_))),
                "{i}: {refused:?}"
            );
        }
        for task in held.into_iter().chain(queued) {
            task.abort();
        }

        let dir = tempfile::tempdir().unwrap();
        let limits = StoreLimits {
            queue_bytes: 1,
            ..StoreLimits::default()
        };
        let (store, writer, _rx) = open_with(dir.path(), limits, 16);
        let refused = store.register(registration("ns", "app", &["I"])).await;
        assert!(
            matches!(&refused, Err(StoreError::Busy(m)) if m.contains("ingest.queueBytes")),
            "{refused:?}"
        );
        assert_eq!(store.stats().queued_bytes.load(Ordering::SeqCst), 0);
        close(writer).await;
    }

    #[tokio::test]
    async fn applications_per_key_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let limits = StoreLimits {
            max_applications_per_key: 2,
            ..StoreLimits::default()
        };
        let (store, writer, _rx) = open_with(dir.path(), limits, 16);
        for app in ["a", "b"] {
            store
                .register(registration("ns", app, &["I"]))
                .await
                .unwrap();
        }
        let refused = store.register(registration("ns", "c", &["I", "J"])).await;
        match refused {
            Err(err @ StoreError::TooManyApplications { .. }) => {
                assert!(err.to_string().contains("ns/I"), "{err}")
            }
            other => panic!("expected the cap, got {other:?}"),
        }
        assert!(
            store.object(&MappingKey::new("ns", "J")).is_none(),
            "nothing of it is stored"
        );
        // What is stored may be registered again.
        assert_eq!(
            store.register(registration("ns", "a", &["I"])).await.ok(),
            Some(RegisterOutcome::AlreadyStored)
        );
        close(writer).await;
    }
}
