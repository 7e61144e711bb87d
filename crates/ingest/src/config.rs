//! The `ingest` section of the configuration.

use std::time::Duration;

use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The registration service and the queue in front of the store.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct IngestConfig {
    /// Registrations that may wait for a commit; beyond it callers get `RESOURCE_EXHAUSTED`.
    #[arg(
        id = "ingest.queueCapacity",
        long = "ingest-queue-capacity",
        env = "DUBBO_CP_INGEST_QUEUE_CAPACITY"
    )]
    #[default(8192)]
    pub queue_capacity: usize,
    /// Bytes (64 MiB by default) the registrations waiting for a commit may occupy; beyond it
    /// `RESOURCE_EXHAUSTED`.
    #[arg(
        id = "ingest.queueBytes",
        long = "ingest-queue-bytes",
        env = "DUBBO_CP_INGEST_QUEUE_BYTES"
    )]
    #[default(64 * 1024 * 1024)]
    pub queue_bytes: usize,
    /// Most registrations committed in one transaction.
    #[arg(
        id = "ingest.maxBatch",
        long = "ingest-max-batch",
        env = "DUBBO_CP_INGEST_MAX_BATCH"
    )]
    #[default(4096)]
    pub max_batch: usize,
    /// How long a caller waits for its commit before it gets `UNAVAILABLE`.
    #[arg(id = "ingest.commitTimeout", long = "commit-timeout", env = "DUBBO_CP_COMMIT_TIMEOUT",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(10))]
    pub commit_timeout: Duration,
    /// Registrations per second one authenticated identity may send on average; beyond it
    /// `RESOURCE_EXHAUSTED` (without authentication the bounded queue is the limit).
    #[arg(
        id = "ingest.ratePerCaller",
        long = "ingest-rate-per-caller",
        env = "DUBBO_CP_INGEST_RATE_PER_CALLER"
    )]
    #[default(200.0)]
    pub rate_per_caller: f64,
    /// Registrations one identity may send at once after a quiet period.
    #[arg(
        id = "ingest.burstPerCaller",
        long = "ingest-burst-per-caller",
        env = "DUBBO_CP_INGEST_BURST_PER_CALLER"
    )]
    #[default(2000)]
    pub burst_per_caller: u32,
    /// Most applications one (namespace, interface) may hold; a registration that would add one
    /// more gets `RESOURCE_EXHAUSTED` naming the key.
    #[arg(
        id = "ingest.maxApplicationsPerKey",
        long = "ingest-max-applications-per-key",
        env = "DUBBO_CP_INGEST_MAX_APPLICATIONS_PER_KEY"
    )]
    #[default(1000)]
    pub max_applications_per_key: usize,
}
