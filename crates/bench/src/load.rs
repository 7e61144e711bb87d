//! The one load generator every target is driven by: a fixed number of requests, a bounded
//! number in flight, latency of each, throughput of the whole.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

pub struct RunResult {
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub errors: usize,
}

/// The application and interface of request `i` of run `run`: every request a new pair, spread
/// over 1,000 interfaces, so every registration must be stored.
pub fn request_mix(run: usize, i: usize) -> (String, String) {
    (
        format!("app-{run}-{i}"),
        format!("org.apache.dubbo.bench.Service{}", i % 1000),
    )
}

/// Runs `op(i)` for `i` in `0..requests` with at most `in_flight` at once; `op` says whether the
/// registration succeeded.
pub async fn run_load<F, Fut>(requests: usize, in_flight: usize, op: F) -> anyhow::Result<RunResult>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(in_flight.max(1)));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(requests);
    for i in 0..requests {
        let permit = permits.clone().acquire_owned().await?;
        let call = op(i);
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let ok = call.await;
            drop(permit);
            (sent.elapsed(), ok)
        }));
    }
    let mut latencies = Vec::with_capacity(tasks.len());
    let mut errors = 0;
    for task in tasks {
        let (latency, ok) = task.await?;
        latencies.push(latency);
        errors += usize::from(!ok);
    }
    let elapsed = started.elapsed();
    let (p50, p99, max) = percentiles(&mut latencies);
    Ok(RunResult {
        per_second: requests as f64 / elapsed.as_secs_f64(),
        p50,
        p99,
        max,
        errors,
    })
}

/// p50, p99 and max of `samples` (sorted in place); zero when empty.
pub fn percentiles(samples: &mut [Duration]) -> (Duration, Duration, Duration) {
    if samples.is_empty() {
        return Default::default();
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99), samples[samples.len() - 1])
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
