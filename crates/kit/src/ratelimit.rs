//! A token bucket. It admits new discovery streams at a bounded rate (so a mass reconnect after
//! a restart cannot starve the process) and paces requests to the Kubernetes API server.

use std::sync::Mutex;
use std::time::Duration;

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
        self.take_or_wait().is_none()
    }

    /// Takes one token, waiting for it as long as needed.
    pub async fn acquire(&self) {
        while let Some(wait) = self.take_or_wait() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token and returns `None`, or returns how long until one is available.
    fn take_or_wait(&self) -> Option<Duration> {
        let mut bucket = self
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let (tokens, last) = *bucket;
        let refilled = (tokens + (now - last).as_secs_f64() * self.per_second).min(self.burst);
        if refilled >= 1.0 {
            *bucket = (refilled - 1.0, now);
            return None;
        }
        *bucket = (refilled, now);
        // A zero rate never refills; poll slowly rather than divide by zero.
        let wait = if self.per_second > 0.0 {
            (1.0 - refilled) / self.per_second
        } else {
            1.0
        };
        Some(Duration::from_secs_f64(wait.max(0.001)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test(start_paused = true)]
    async fn acquire_paces_callers_at_the_rate() {
        let limiter = RateLimiter::new(10.0, 2);
        let start = Instant::now();
        for _ in 0..12 {
            limiter.acquire().await;
        }
        // Two from the burst, ten more at 10/s.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(990) && elapsed <= Duration::from_millis(1010),
            "{elapsed:?}"
        );
    }
}
