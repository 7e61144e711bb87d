//! The `canary` section of the configuration.

use std::time::Duration;

use clap::ArgAction;
use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The canary controller (Kubernetes mode): progressive delivery of Dubbo applications.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct CanaryConfig {
    /// Run the canary controller (Kubernetes mode; needs the Canary CRD and its RBAC).
    #[arg(id = "canary.enabled", long = "canary-enabled", env = "DUBBO_CP_CANARY_ENABLED",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    #[default(true)]
    pub enabled: bool,
    /// Prometheus base URL for Canaries that name none (`http://prometheus.monitoring:9090`).
    #[arg(
        id = "canary.prometheus",
        long = "canary-prometheus",
        env = "DUBBO_CP_CANARY_PROMETHEUS"
    )]
    pub prometheus: Option<String>,
    /// PEM bundle of the CAs trusted, besides the system's, for https Prometheus, webhooks and
    /// alert receivers.
    #[arg(
        id = "canary.caFile",
        long = "canary-ca-file",
        env = "DUBBO_CP_CANARY_CA_FILE"
    )]
    pub ca_file: Option<std::path::PathBuf>,
    /// Longest time one Prometheus query may take.
    #[arg(id = "canary.queryTimeout", long = "canary-query-timeout",
          env = "DUBBO_CP_CANARY_QUERY_TIMEOUT", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(10))]
    pub query_timeout: Duration,
    /// Namespace of the Lease `dubbo-cp-canary`: one control plane at a time drives Canaries.
    #[arg(
        id = "canary.leaseNamespace",
        long = "canary-lease-namespace",
        env = "DUBBO_CP_CANARY_LEASE_NAMESPACE"
    )]
    #[default("dubbo-system".to_owned())]
    pub lease_namespace: String,
    /// How long the Lease holds without renewal before another control plane takes over.
    #[arg(id = "canary.leaseDuration", long = "canary-lease-duration",
          env = "DUBBO_CP_CANARY_LEASE_DURATION", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(15))]
    pub lease_duration: Duration,
    /// This control plane's name in the Lease (unset: the host name and process id).
    #[arg(
        id = "canary.identity",
        long = "canary-identity",
        env = "DUBBO_CP_CANARY_IDENTITY"
    )]
    pub identity: Option<String>,
}
