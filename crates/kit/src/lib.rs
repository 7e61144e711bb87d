//! dubbo-cp's process kit: what every component shares and none owns.
//!
//! - [`shutdown`]: the process-wide shutdown signal.
//! - [`ratelimit`]: the token bucket behind every admission limit.
//! - [`duration`]: duration settings (`100ms`, `10s`): the parser, clap's value parser, serde.
//! - [`metrics`]: Prometheus helpers (buckets, scraped counters, rendering) and the gRPC edge's
//!   counters (registrations, rejections, debounce flushes).
//! - [`backoff`]: jittered exponential backoff.
//! - [`telemetry`]: logging set-up (text or JSON, `RUST_LOG`), for the server and the agent.
//! - [`workload`]: the names of the workload certificate's files, which the agent writes and
//!   gRPC bootstraps name.
//!
//! Depends on no other dubbo-cp crate.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod duration;
pub mod metrics;
pub mod ratelimit;
pub mod shutdown;
pub mod telemetry;
pub mod workload;

/// An error and its sources as one line, each cause once (transport errors often repeat their
/// source's text).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(err) = next {
        let text = err.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

/// Largest request a client may send on any gRPC port: the transport refuses bigger ones with
/// `OUT_OF_RANGE` before a handler runs (counted by [`metrics::CountOversize`]).
pub const MAX_DECODING_MESSAGE_BYTES: usize = 1024 * 1024;
