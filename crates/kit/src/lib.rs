//! dubbo-cp's process kit: what every component shares and none owns.
//!
//! - [`shutdown`]: the process-wide shutdown signal.
//! - [`ratelimit`]: the token bucket behind every admission limit.
//! - [`duration`]: duration settings (`100ms`, `10s`): the parser, clap's value parser, serde.
//! - [`metrics`]: Prometheus helpers (buckets, scraped counters, rendering) and the gRPC edge's
//!   counters (registrations, rejections, debounce flushes).
//!
//! Depends on no other dubbo-cp crate.
#![forbid(unsafe_code)]

pub mod duration;
pub mod metrics;
pub mod ratelimit;
pub mod shutdown;

/// Largest request a client may send on any gRPC port: the transport refuses bigger ones with
/// `OUT_OF_RANGE` before a handler runs (counted by [`metrics::CountOversize`]).
pub const MAX_DECODING_MESSAGE_BYTES: usize = 1024 * 1024;
