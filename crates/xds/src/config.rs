//! The `xds` section of the configuration.

use std::net::SocketAddr;
use std::time::Duration;

use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The xDS port: Envoy's Aggregated Discovery Service for gRPC clients and Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct XdsConfig {
    /// Serve xDS.
    #[arg(id = "xds.enabled", long = "xds-enabled", env = "DUBBO_CP_XDS_ENABLED",
          action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    #[default(true)]
    pub enabled: bool,
    /// Address of the xDS port (plain gRPC; the TLS port serves xDS too). Istio's is 15010.
    #[arg(id = "xds.addr", long = "xds-addr", env = "DUBBO_CP_XDS_ADDR")]
    #[default(SocketAddr::from(([127, 0, 0, 1], 15010)))]
    pub addr: SocketAddr,
    /// How long after a change to services, mappings or rules the new version is built: a burst
    /// of changes within it costs one push.
    #[arg(id = "xds.debounce", long = "xds-debounce", env = "DUBBO_CP_XDS_DEBOUNCE",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_millis(100))]
    pub debounce: Duration,
    /// Streams open at once (state of the world and incremental); beyond it
    /// `RESOURCE_EXHAUSTED`.
    #[arg(
        id = "xds.maxStreams",
        long = "xds-max-streams",
        env = "DUBBO_CP_XDS_MAX_STREAMS"
    )]
    #[default(crate::server::DEFAULT_MAX_STREAMS)]
    pub max_streams: usize,
}
