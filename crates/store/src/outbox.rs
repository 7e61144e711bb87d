//! The Kubernetes-mode outbox: acknowledged pairs not yet written to the API server. A pair is
//! committed here before its registration is acknowledged and leaves once the upsert that holds
//! it landed ([`Outbox::complete`]); what is left at start is written first. Pairs the watched
//! cluster already holds are acknowledged without any write.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::db::PendingRegistrants;
use super::db::{Db, Role, StoreWriter};
use super::{RegisterOutcome, StoreError, StoreLimits, StoreStats, StoredChange};
use crate::mapping::registrants::{Pending, SharedRegistrants};
use crate::mapping::{MappingDelta, MappingKey, Registration, SharedMappings};

/// Handle to the outbox; cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    db: Db,
}

impl Outbox {
    /// Opens (or creates) the outbox in `data_dir`. `cluster` is what the watch sees in the
    /// cluster: registrations whose pairs are all there need no write.
    pub fn open(
        data_dir: &Path,
        cluster: (Arc<SharedMappings>, Arc<SharedRegistrants>),
        limits: StoreLimits,
        changes: mpsc::Sender<StoredChange>,
    ) -> Result<(Outbox, StoreWriter), StoreError> {
        let role = Role::Outbox {
            elsewhere: cluster.0,
            recorded: cluster.1,
        };
        let (db, writer) = Db::open(data_dir, role, limits, changes)?;
        Ok((Outbox { db }, writer))
    }

    pub async fn register(
        &self,
        registration: Registration,
    ) -> Result<RegisterOutcome, StoreError> {
        self.db.register(registration).await
    }

    /// Every acknowledged pair not yet written, sorted.
    pub fn pending(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        self.db.snapshot()
    }

    /// Number of pending (key, application) pairs.
    pub fn pending_pairs(&self) -> usize {
        self.db
            .known
            .committed
            .iter()
            .map(|entry| entry.value().len())
            .sum()
    }

    /// Whether `application` waits here to be written to `key`'s object.
    pub fn holds(&self, key: &MappingKey, application: &str) -> bool {
        crate::mapping::contains_pair(&self.db.known.committed, key, application)
    }

    /// The registering pods committed for `key` and not yet on its object.
    pub fn registrants_of(&self, key: &MappingKey) -> Pending {
        self.db
            .known
            .registrants
            .get(key)
            .map(|pending| pending.clone())
            .unwrap_or_default()
    }

    /// Removes pairs (and the pods recorded with them) that are in the cluster now, so they are
    /// not written again after a restart.
    pub async fn complete(
        &self,
        pairs: MappingDelta,
        registrants: PendingRegistrants,
    ) -> Result<(), StoreError> {
        self.db.complete(pairs, registrants).await
    }

    /// Bumped at every start, so an index that starts from it does not go backwards as far.
    pub fn opened_revision(&self) -> i64 {
        self.db.opened_revision
    }

    pub fn stats(&self) -> &Arc<StoreStats> {
        &self.db.stats
    }

    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        crate::metrics::scraped_gauge(
            registry,
            "outbox_pending_pairs",
            "Acknowledged pairs not yet written to the API server or the ZooKeeper ensemble",
            &Arc::new(self.clone()),
            |outbox| i64::try_from(outbox.pending_pairs()).unwrap_or(i64::MAX),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(app: &str, interfaces: &[&str]) -> Registration {
        Registration {
            namespace: "ns".into(),
            application: app.into(),
            interfaces: interfaces.iter().map(|s| s.to_string()).collect(),
            pod: None,
        }
    }

    /// An outbox in `dir` that sees `cluster` with its `recorded` pods.
    fn open(
        dir: &Path,
        cluster: &Arc<SharedMappings>,
        recorded: &Arc<SharedRegistrants>,
    ) -> (Outbox, StoreWriter) {
        let (tx, _rx) = mpsc::channel(16);
        Outbox::open(
            dir,
            (cluster.clone(), recorded.clone()),
            StoreLimits::default(),
            tx,
        )
        .unwrap()
    }

    async fn close(writer: StoreWriter) {
        tokio::task::spawn_blocking(move || writer.shutdown())
            .await
            .unwrap();
    }

    fn pinned(key: &MappingKey, app: &str) -> Arc<SharedRegistrants> {
        let recorded = Arc::new(SharedRegistrants::new());
        recorded
            .entry(key.clone())
            .or_default()
            .insert(app.into(), crate::mapping::registrants::Pods::Pinned);
        recorded
    }

    #[tokio::test]
    async fn completed_pairs_leave_and_pairs_in_the_cluster_are_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Arc::new(SharedMappings::new());
        let in_cluster = MappingKey::new("ns", "In-cluster");
        cluster
            .entry(in_cluster.clone())
            .or_default()
            .insert("app".into());
        let recorded = pinned(&in_cluster, "app");
        let (outbox, writer) = open(dir.path(), &cluster, &recorded);
        let present = outbox.register(registration("app", &["In-cluster"])).await;
        assert_eq!(present.ok(), Some(RegisterOutcome::AlreadyStored));
        assert_eq!(
            outbox
                .stats()
                .commits
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );

        let outcome = outbox.register(registration("app", &["I1", "I2"])).await;
        assert_eq!(outcome.ok(), Some(RegisterOutcome::Stored { added: 2 }));
        assert_eq!(outbox.pending_pairs(), 2);
        let mut written = MappingDelta::default();
        let i1 = MappingKey::new("ns", "I1");
        written.add(i1.clone(), "app".into());
        // With the record the writer read and wrote (a pod-less registration).
        let record = outbox.registrants_of(&i1);
        assert_eq!(record["app"].iter().collect::<Vec<_>>(), vec![""]);
        outbox
            .complete(written, BTreeMap::from([(i1, record)]))
            .await
            .unwrap();
        close(writer).await;

        let (reopened, writer) = open(dir.path(), &cluster, &recorded);
        let left: Vec<MappingKey> = reopened.pending().into_keys().collect();
        assert_eq!(
            left,
            vec![MappingKey::new("ns", "I2")],
            "completed pair still in the outbox"
        );
        close(writer).await;
    }

    #[tokio::test]
    async fn the_cap_counts_applications_in_the_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Arc::new(SharedMappings::new());
        cluster
            .entry(MappingKey::new("ns", "I"))
            .or_default()
            .extend(["a".to_string(), "b".to_string()]);
        let limits = StoreLimits {
            max_applications_per_key: 2,
            ..StoreLimits::default()
        };
        let (tx, _rx) = mpsc::channel(16);
        let recorded = Arc::new(SharedRegistrants::new());
        let (outbox, writer) = Outbox::open(dir.path(), (cluster, recorded), limits, tx).unwrap();
        let refused = outbox.register(registration("c", &["I"])).await;
        assert!(
            matches!(refused, Err(StoreError::TooManyApplications { .. })),
            "{refused:?}"
        );
        close(writer).await;
    }

    #[tokio::test]
    async fn a_new_pod_or_a_podless_caller_of_a_stored_pair_is_recorded_durably_once() {
        let dir = tempfile::tempdir().unwrap();
        let key = MappingKey::new("ns", "I");
        let cluster = Arc::new(SharedMappings::new());
        cluster.entry(key.clone()).or_default().insert("app".into());
        let recorded = Arc::new(SharedRegistrants::new());
        recorded.entry(key.clone()).or_default().insert(
            "app".into(),
            crate::mapping::registrants::Pods::Tracked(["p1".to_string()].into()),
        );
        let from = |pod: Option<&str>| Registration {
            pod: pod.map(Into::into),
            ..registration("app", &["I"])
        };
        let (outbox, writer) = open(dir.path(), &cluster, &recorded);
        // The recorded pod: nothing to write.
        assert_eq!(
            outbox.register(from(Some("p1"))).await.ok(),
            Some(RegisterOutcome::AlreadyStored)
        );
        // A new pod, and a caller without a pod (which pins the application), are written.
        assert_eq!(
            outbox.register(from(Some("p2"))).await.ok(),
            Some(RegisterOutcome::Stored { added: 1 })
        );
        assert_eq!(
            outbox.register(from(Some("p2"))).await.ok(),
            Some(RegisterOutcome::AlreadyStored),
            "pending already"
        );
        assert_eq!(
            outbox.register(from(None)).await.ok(),
            Some(RegisterOutcome::Stored { added: 1 })
        );
        close(writer).await;

        // Durable: the pending record survives a restart, and leaves once written.
        let (reopened, writer) = open(dir.path(), &cluster, &recorded);
        let pending = reopened.registrants_of(&key);
        let pods: Vec<&str> = pending["app"].iter().map(String::as_str).collect();
        assert_eq!(pods, vec!["", "p2"]);
        let mut pairs = MappingDelta::default();
        pairs.add(key.clone(), "app".into());
        reopened
            .complete(pairs, BTreeMap::from([(key.clone(), pending)]))
            .await
            .unwrap();
        // The removal is queued; closing the writer finishes it.
        close(writer).await;
        assert!(reopened.registrants_of(&key).is_empty());
        assert_eq!(reopened.pending_pairs(), 0);
    }
}
