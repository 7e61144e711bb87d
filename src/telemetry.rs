//! Logging set-up, shared with the agent: the kit's (`dubbo_cp_kit::telemetry`).
pub use dubbo_cp_kit::telemetry::{LogFormat, init};
