//! The `zookeeper` section of the configuration.

use std::time::Duration;

use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// ZooKeeper mode: the ensemble that holds mappings, rules and providers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ZooKeeperConfig {
    /// ZooKeeper mode: the ensemble `host:port[,host:port...][/chroot]`, as Dubbo's
    /// `zookeeper://` addresses name it; unset, the mode is standalone or Kubernetes.
    #[arg(
        id = "zookeeper.address",
        long = "zookeeper",
        env = "DUBBO_CP_ZOOKEEPER"
    )]
    pub address: Option<String>,
    /// Session timeout asked of the ensemble (it grants one within its own bounds).
    #[arg(id = "zookeeper.sessionTimeout", long = "zookeeper-session-timeout",
          env = "DUBBO_CP_ZOOKEEPER_SESSION_TIMEOUT", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(10))]
    pub session_timeout: Duration,
    /// Mapping nodes written at the same time.
    #[arg(
        id = "zookeeper.maxParallelWrites",
        long = "zookeeper-max-parallel-writes",
        env = "DUBBO_CP_ZOOKEEPER_MAX_PARALLEL_WRITES"
    )]
    #[default(16)]
    pub max_parallel_writes: usize,
    /// How often a mapping whose node cannot be written as it is (its value unreadable, its
    /// path refused) is tried again.
    #[arg(id = "zookeeper.parkedRetryInterval", long = "zookeeper-parked-retry-interval",
          env = "DUBBO_CP_ZOOKEEPER_PARKED_RETRY_INTERVAL", value_parser = DurationArg)]
    #[serde(rename = "parkedRetryInterval", with = "duration")]
    #[default(Duration::from_secs(30))]
    pub parked_retry: Duration,
}
