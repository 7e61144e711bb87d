//! The `dds` section of the configuration.

use std::time::Duration;

use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The discovery stream, `RuleService/Observe`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct DdsConfig {
    /// A response the transport has not taken within this time ends the stream.
    #[arg(id = "dds.sendTimeout", long = "dds-send-timeout", env = "DUBBO_CP_DDS_SEND_TIMEOUT",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(5))]
    pub send_timeout: Duration,
    /// New streams admitted per second on average; beyond it `UNAVAILABLE`.
    #[arg(
        id = "dds.newStreamsPerSecond",
        long = "new-streams-per-second",
        env = "DUBBO_CP_NEW_STREAMS_PER_SECOND"
    )]
    #[default(1000.0)]
    pub new_streams_per_second: f64,
    /// New streams admitted at once after a quiet period.
    #[arg(
        id = "dds.newStreamsBurst",
        long = "new-streams-burst",
        env = "DUBBO_CP_NEW_STREAMS_BURST"
    )]
    #[default(2000)]
    pub new_streams_burst: u32,
    /// Streams open at once over all connections; beyond it `RESOURCE_EXHAUSTED`.
    #[arg(
        id = "dds.maxStreams",
        long = "dds-max-streams",
        env = "DUBBO_CP_DDS_MAX_STREAMS"
    )]
    #[default(100_000)]
    pub max_streams: usize,
}
