//! Jittered exponential backoff, for every retry loop (the outbox's writers, the agent).

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// `base * 2^attempt` capped at `cap`, then a random point in its upper half, so replicas that
/// collided do not retry in lockstep.
pub fn jittered_backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exponential = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    let half = exponential / 2;
    half + half.mul_f64(random_unit())
}

/// A random number in [0, 1): std's randomly keyed hasher is a fine source for jitter.
fn random_unit() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}
