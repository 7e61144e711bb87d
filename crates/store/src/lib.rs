//! Where registrations become durable before they are acknowledged.
//!
//! Both modes commit registrations the same way (one SQLite file under the data directory, one
//! writer thread that group-commits, see [`db`]), but what the table means differs:
//! - [`Store`] (standalone): the truth. Pairs stay forever; each key has a persisted object name.
//! - [`Outbox`] (Kubernetes mode): pending writes. Pairs leave once they are in the cluster, and
//!   pairs the cluster already holds are not written at all.

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name (the domain's `rules` is named in full:
// this crate's own `rules` module is the rule table).
use dubbo_cp_debounce as debounce;
use dubbo_cp_domain::{mapping, resource};
use dubbo_cp_index as index;
use dubbo_cp_kit::{metrics, shutdown};

mod db;
pub mod drain;
mod embedded;
mod outbox;
pub mod rules;
pub mod rules_dir;

use crate::debounce::Merge;
use crate::mapping::{MappingDelta, MappingKey};

pub use db::StoreWriter;
pub use db::{DB_FILE, StoreStats};
pub use embedded::{Store, StoredObject, load_index, publish};
pub use outbox::Outbox;
pub use rules::RuleStore;

/// A key of the outbox whose write failed for a reason retrying soon cannot fix (a refused
/// write, a node or object that cannot be read); its pairs stay in the outbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedKey {
    pub namespace: String,
    pub interface_name: String,
    pub reason: String,
    /// Unix seconds of the failure.
    pub since: u64,
}

/// Where the registration service makes registrations durable, by mode.
#[derive(Clone)]
pub enum Durable {
    Store(Store),
    Outbox(Outbox),
    /// An outbox whose sink cannot hold every key (ZooKeeper: a namespace or interface that
    /// names no node): each key is checked before anything is committed.
    Checked(Outbox, fn(&MappingKey) -> Result<(), String>),
}

impl Durable {
    pub async fn register(
        &self,
        registration: crate::mapping::Registration,
    ) -> Result<RegisterOutcome, StoreError> {
        match self {
            Durable::Store(store) => store.register(registration).await,
            Durable::Outbox(outbox) => outbox.register(registration).await,
            Durable::Checked(outbox, check) => {
                for key in registration.keys() {
                    check(&key).map_err(StoreError::Refused)?;
                }
                outbox.register(registration).await
            }
        }
    }

    pub fn stats(&self) -> &std::sync::Arc<StoreStats> {
        match self {
            Durable::Store(store) => store.stats(),
            Durable::Outbox(outbox) | Durable::Checked(outbox, _) => outbox.stats(),
        }
    }
}

/// What became of one registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterOutcome {
    /// Everything was stored before; nothing was written.
    AlreadyStored,
    /// `added` new (interface, application) pairs were committed.
    Stored { added: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The registration names something the mode's sink cannot hold; the message names the
    /// field, the value and why.
    #[error("{0}")]
    Refused(String),
    #[error("ingest queue is full ({0}); retry later")]
    Busy(String),
    #[error(
        "{key} already has {limit} applications (ingest.maxApplicationsPerKey); \
         remove stale ones or raise the limit"
    )]
    TooManyApplications { key: MappingKey, limit: usize },
    #[error("the control plane is shutting down; retry against another replica or later")]
    ShuttingDown,
    #[error("storage failed")]
    Storage(#[from] rusqlite::Error),
    /// A commit failed; every caller in it gets this, sharing the one source (logged once).
    #[error("commit failed")]
    CommitFailed(#[source] std::sync::Arc<rusqlite::Error>),
    #[error("cannot use data directory {path}")]
    DataDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("data directory {0} is in use by another dubbo-cp process")]
    Locked(std::path::PathBuf),
    /// A later dubbo-cp wrote the database in a format this one does not know; reading it
    /// could miss what that version stored.
    #[error(
        "the database in {path} has schema version {found}; this dubbo-cp reads up to {supported}: \
         run the newer dubbo-cp, which folds its journal on shutdown, or restore a backup"
    )]
    NewerSchema {
        path: std::path::PathBuf,
        found: i64,
        supported: i64,
    },
}

/// Limits on what the durable queue and the stored state may hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreLimits {
    /// Registrations that may wait for the writer; beyond this callers are refused at once.
    pub queue_capacity: usize,
    /// Bytes those waiting registrations may occupy; beyond this callers are refused at once.
    pub queue_bytes: usize,
    /// Most registrations one transaction takes.
    pub max_batch: usize,
    /// Most applications one (namespace, interface) may hold.
    pub max_applications_per_key: usize,
    /// Journal rows (new pairs committed in arrival order) that trigger a fold into the keyed
    /// tables under load, or 1/8 of the pairs stored if more (that eighth at most 131,072); an
    /// idle writer folds sooner. A burst of fewer new pairs is folded after it, so none of its
    /// registrations waits behind a fold.
    pub fold_rows: usize,
    /// How long a writer with unfolded journal rows waits for more work before folding them.
    pub fold_idle: std::time::Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            queue_capacity: 8192,
            queue_bytes: 64 * 1024 * 1024,
            max_batch: 4096,
            max_applications_per_key: 1000,
            fold_rows: 65_536,
            fold_idle: std::time::Duration::from_secs(1),
        }
    }
}

/// Committed changes on their way to the next stage: what was added, and the store revision that
/// includes it. Merging keeps the union and the newest revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredChange {
    pub delta: MappingDelta,
    pub revision: i64,
}

impl Merge for StoredChange {
    fn merge(&mut self, other: Self) {
        self.delta.merge(other.delta);
        self.revision = self.revision.max(other.revision);
    }
}

/// A registration without a pod, as the tests make them.
#[cfg(test)]
pub(crate) fn test_registration(
    namespace: &str,
    application: &str,
    interfaces: &[&str],
) -> mapping::Registration {
    mapping::Registration {
        namespace: namespace.into(),
        application: application.into(),
        interfaces: interfaces.iter().map(|s| s.to_string()).collect(),
        pod: None,
    }
}
