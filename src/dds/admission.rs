//! A token bucket that admits new streams at a bounded rate, so a mass reconnect after a
//! restart cannot starve the process.

use std::sync::Mutex;

use tokio::time::Instant;

pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    /// Tokens available and when they were last counted.
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            per_second: per_second.max(0.0),
            burst,
            bucket: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one token if there is one.
    pub fn try_acquire(&self) -> bool {
        let mut bucket = self
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let (tokens, last) = *bucket;
        let refilled = (tokens + (now - last).as_secs_f64() * self.per_second).min(self.burst);
        if refilled >= 1.0 {
            *bucket = (refilled - 1.0, now);
            true
        } else {
            *bucket = (refilled, now);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn burst_then_steady_rate() {
        let limiter = RateLimiter::new(10.0, 5);
        let admitted = (0..20).filter(|_| limiter.try_acquire()).count();
        assert_eq!(admitted, 5, "burst");
        tokio::time::advance(Duration::from_millis(250)).await;
        let admitted = (0..20).filter(|_| limiter.try_acquire()).count();
        assert_eq!(admitted, 2, "10/s for 250 ms");
        tokio::time::advance(Duration::from_secs(60)).await;
        let admitted = (0..20).filter(|_| limiter.try_acquire()).count();
        assert_eq!(admitted, 5, "refill is capped at the burst");
    }
}
