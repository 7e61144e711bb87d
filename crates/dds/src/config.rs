//! The `dds` section of the configuration.

use std::time::Duration;

use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};

/// The discovery stream, `RuleService/Observe`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct DdsConfig {
    /// A response the transport has not taken within this time ends the stream.
    #[arg(id = "dds.sendTimeout", long = "dds-send-timeout", env = "DUBBO_CP_DDS_SEND_TIMEOUT",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    pub send_timeout: Duration,
    /// New streams admitted per second on average; beyond it `UNAVAILABLE`.
    #[arg(
        id = "dds.newStreamsPerSecond",
        long = "new-streams-per-second",
        env = "DUBBO_CP_NEW_STREAMS_PER_SECOND"
    )]
    pub new_streams_per_second: f64,
    /// New streams admitted at once after a quiet period.
    #[arg(
        id = "dds.newStreamsBurst",
        long = "new-streams-burst",
        env = "DUBBO_CP_NEW_STREAMS_BURST"
    )]
    pub new_streams_burst: u32,
    /// Streams open at once over all connections; beyond it `RESOURCE_EXHAUSTED`.
    #[arg(
        id = "dds.maxStreams",
        long = "dds-max-streams",
        env = "DUBBO_CP_DDS_MAX_STREAMS"
    )]
    pub max_streams: usize,
}

impl Default for DdsConfig {
    fn default() -> Self {
        Self {
            send_timeout: Duration::from_secs(5),
            new_streams_per_second: 1000.0,
            new_streams_burst: 2000,
            max_streams: 100_000,
        }
    }
}
