//! Where registrations become durable. `embedded` is the standalone default: a SQLite file that
//! is the source of truth.

pub mod embedded;

use crate::debounce::Merge;
use crate::mapping::MappingDelta;

pub use embedded::{EmbeddedStore, StoreOptions, StoreStats, StoreWriter};

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
    #[error("ingest queue is full ({0} registrations waiting); retry later")]
    Busy(usize),
    #[error("the control plane is shutting down; retry against another replica or later")]
    ShuttingDown,
    #[error("storage failed: {0}")]
    Storage(String),
    #[error("cannot use data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("data directory {0} is in use by another dubbo-cp process")]
    Locked(std::path::PathBuf),
}

impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> Self {
        StoreError::Storage(err.to_string())
    }
}

/// Committed changes on their way to the index: what was added, and the store revision that
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
