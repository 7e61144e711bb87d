//! The Kubernetes-mode outbox: acknowledged pairs not yet written to the API server. A pair is
//! committed here before its registration is acknowledged and leaves once the upsert that holds
//! it landed ([`Outbox::complete`]); what is left at start is written first. Pairs the watched
//! cluster already holds are acknowledged without any write.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::db::{Db, Role, StoreWriter};
use super::{RegisterOutcome, StoreError, StoreLimits, StoreStats, StoredChange};
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
        cluster: Arc<SharedMappings>,
        limits: StoreLimits,
        changes: mpsc::Sender<StoredChange>,
    ) -> Result<(Outbox, StoreWriter), StoreError> {
        let role = Role::Outbox { elsewhere: cluster };
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

    /// Removes pairs that are in the cluster now, so they are not written again after a restart.
    pub async fn complete(&self, pairs: MappingDelta) -> Result<(), StoreError> {
        self.db.complete(pairs).await
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
            "Acknowledged pairs not yet written to the API server",
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
        }
    }

    async fn close(writer: StoreWriter) {
        tokio::task::spawn_blocking(move || writer.shutdown())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn completed_pairs_leave_and_pairs_in_the_cluster_are_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Arc::new(SharedMappings::new());
        cluster
            .entry(MappingKey::new("ns", "In-cluster"))
            .or_default()
            .insert("app".into());
        let (tx, _rx) = mpsc::channel(16);
        let (outbox, writer) =
            Outbox::open(dir.path(), cluster.clone(), StoreLimits::default(), tx).unwrap();
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
        written.add(MappingKey::new("ns", "I1"), "app".into());
        outbox.complete(written).await.unwrap();
        close(writer).await;

        let (tx, _rx) = mpsc::channel(16);
        let (reopened, writer) =
            Outbox::open(dir.path(), cluster, StoreLimits::default(), tx).unwrap();
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
        let (outbox, writer) = Outbox::open(dir.path(), cluster, limits, tx).unwrap();
        let refused = outbox.register(registration("c", &["I"])).await;
        assert!(
            matches!(refused, Err(StoreError::TooManyApplications { .. })),
            "{refused:?}"
        );
        close(writer).await;
    }
}
