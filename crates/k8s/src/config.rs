//! The `kubernetes` and `mapping` sections of the configuration.

use std::time::Duration;

use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// Kubernetes mode: where the API server is and how it is written to.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, clap::Args)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesConfig {
    /// API server URL (unset: from KUBECONFIG, `~/.kube/config` or the in-cluster account).
    #[arg(
        id = "kubernetes.apiServer",
        long = "kube-api-server",
        env = "DUBBO_CP_KUBE_API_SERVER"
    )]
    pub api_server: Option<String>,
    /// The writer's settings, flat in the section (serde checks unknown keys of the section).
    #[serde(flatten)]
    #[command(flatten)]
    pub writer: WriterConfig,
}

/// The per-key write queue ([`crate::writer`]); keys of the `kubernetes` section.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
// No deny_unknown_fields: flattened into `KubernetesConfig`, which denies them.
#[serde(default, rename_all = "camelCase")]
pub struct WriterConfig {
    /// API requests per second to the Kubernetes API server, on average.
    #[arg(id = "kubernetes.qps", long = "kube-qps", env = "DUBBO_CP_KUBE_QPS")]
    #[default(50.0)]
    pub qps: f64,
    /// API requests at once after a quiet period.
    #[arg(
        id = "kubernetes.burst",
        long = "kube-burst",
        env = "DUBBO_CP_KUBE_BURST"
    )]
    #[default(100)]
    pub burst: u32,
    /// Keys upserted at the same time.
    #[arg(
        id = "kubernetes.maxParallelWrites",
        long = "kube-max-parallel-writes",
        env = "DUBBO_CP_KUBE_MAX_PARALLEL_WRITES"
    )]
    #[serde(rename = "maxParallelWrites")]
    #[default(16)]
    pub max_parallel: usize,
    /// How often a key parked by a permanent error (403, 422, too large...) is tried again.
    #[arg(id = "kubernetes.parkedRetryInterval", long = "kube-parked-retry-interval",
          env = "DUBBO_CP_KUBE_PARKED_RETRY_INTERVAL", value_parser = DurationArg)]
    #[serde(rename = "parkedRetryInterval", with = "duration")]
    #[default(Duration::from_secs(60))]
    pub parked_retry: Duration,
}

/// The lifecycle of mappings (Kubernetes mode).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct MappingConfig {
    /// An application leaves a mapping once none of the pods that registered it has existed
    /// for this long (`0` never); applications registered without a pod identity stay.
    #[arg(id = "mapping.expireAfter", long = "mapping-expire-after",
          env = "DUBBO_CP_MAPPING_EXPIRE_AFTER", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(24 * 3600))]
    pub expire_after: Duration,
}
