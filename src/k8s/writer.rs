//! Upserts of ServiceNameMapping objects: read, union, write with the resourceVersion
//! precondition. A 409 is re-read and retried with jittered backoff; API errors and an
//! unreachable API server are retried with capped backoff until the write lands, while the
//! registration stays in the local outbox. Requests are paced by a client-side token bucket and
//! keys are written in parallel up to a bound.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::crd::{INTERFACE_LABEL, ServiceNameMapping};
use crate::mapping::{MappingDelta, MappingKey, label_value, object_name};
use crate::metrics::{CodeLabel, latency_histogram};
use crate::ratelimit::RateLimiter;
use crate::store::EmbeddedStore;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriterConfig {
    /// API requests per second, on average.
    pub qps: f64,
    /// API requests at once after a quiet period.
    pub burst: u32,
    /// Keys written at the same time.
    pub max_parallel: usize,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            qps: 50.0,
            burst: 100,
            max_parallel: 16,
        }
    }
}

/// Counters for logs, tests, benchmarks and `/metrics`.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Seconds per API request.
    pub request_seconds: RequestHistogram,
    /// Failed API requests by HTTP code (0: no answer).
    pub errors_by_code: Family<CodeLabel, Counter>,
    /// Requests sent to the API server (reads and writes).
    pub requests: AtomicU64,
    /// Creates and updates that succeeded.
    pub writes: AtomicU64,
    /// Upserts that found everything present and wrote nothing.
    pub unchanged: AtomicU64,
    /// 409 answers (stale resourceVersion, or created meanwhile).
    pub conflicts: AtomicU64,
    /// Other failures (API errors, unreachable server), each retried.
    pub errors: AtomicU64,
}

/// The request-latency histogram, with the shared buckets by default.
#[derive(Debug, Clone)]
pub struct RequestHistogram(pub Histogram);

impl Default for RequestHistogram {
    fn default() -> Self {
        Self(latency_histogram())
    }
}

impl std::ops::Deref for RequestHistogram {
    type Target = Histogram;

    fn deref(&self) -> &Histogram {
        &self.0
    }
}

/// Why one upsert attempt did not land.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("conflict: the object changed meanwhile")]
    Conflict,
    #[error("object {name} holds interface {found:?}, not {wanted:?}")]
    NameCollision {
        name: String,
        found: String,
        wanted: String,
    },
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upserted {
    Written,
    AlreadyPresent,
}

pub struct KubeWriter {
    client: Client,
    limiter: RateLimiter,
    config: WriterConfig,
    stats: Arc<WriterStats>,
}

impl KubeWriter {
    pub fn new(client: Client, config: WriterConfig) -> Self {
        Self {
            client,
            limiter: RateLimiter::new(config.qps, config.burst),
            config,
            stats: Arc::new(WriterStats::default()),
        }
    }

    pub fn stats(&self) -> Arc<WriterStats> {
        self.stats.clone()
    }

    /// Writes every key of `pairs` (in parallel up to the bound) and removes each from the
    /// outbox once it is in the cluster. Returns when all are written.
    pub async fn write_all(self: &Arc<Self>, pairs: MappingDelta, outbox: &EmbeddedStore) {
        let permits = Arc::new(Semaphore::new(self.config.max_parallel.max(1)));
        let mut writes = JoinSet::new();
        for (key, applications) in pairs.into_inner() {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let writer = self.clone();
            let outbox = outbox.clone();
            writes.spawn(async move {
                writer.upsert_until_written(&key, &applications).await;
                let mut done = MappingDelta::default();
                for application in applications {
                    done.add(key.clone(), application);
                }
                if let Err(err) = outbox.complete(done).await {
                    tracing::warn!(error = %err, %key, "written pairs stay in the outbox");
                }
                drop(permit);
            });
        }
        while writes.join_next().await.is_some() {}
    }

    async fn upsert_until_written(&self, key: &MappingKey, applications: &BTreeSet<String>) {
        let api: Api<ServiceNameMapping> = Api::namespaced(self.client.clone(), &key.namespace);
        let name = object_name(&key.interface);
        let mut attempt = 0u32;
        loop {
            let (base, cap) = match self.upsert_once(&api, &name, key, applications).await {
                Ok(Upserted::Written) => {
                    self.stats.writes.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Ok(Upserted::AlreadyPresent) => {
                    self.stats.unchanged.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(AttemptError::Conflict) => {
                    self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%key, attempt, "conflict; re-reading");
                    (Duration::from_millis(10), Duration::from_secs(1))
                }
                Err(AttemptError::Kube(kube::Error::Api(status))) if status.code == 429 => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    // Wait as the server says (Status.details.retryAfterSeconds, which the API
                    // server sets beside the Retry-After header).
                    let retry_after = status
                        .details
                        .as_ref()
                        .map(|details| Duration::from_secs(details.retry_after_seconds.into()))
                        .filter(|wait| !wait.is_zero())
                        .unwrap_or(Duration::from_secs(1));
                    tracing::warn!(%key, attempt, ?retry_after, "API server asks to slow down (429)");
                    tokio::time::sleep(retry_after).await;
                    attempt = attempt.saturating_add(1);
                    continue;
                }
                Err(err) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%key, attempt, error = %err, "upsert failed; retrying");
                    (Duration::from_millis(200), Duration::from_secs(10))
                }
            };
            tokio::time::sleep(jittered_backoff(attempt, base, cap)).await;
            attempt = attempt.saturating_add(1);
        }
    }

    async fn upsert_once(
        &self,
        api: &Api<ServiceNameMapping>,
        name: &str,
        key: &MappingKey,
        applications: &BTreeSet<String>,
    ) -> Result<Upserted, AttemptError> {
        let Some(mut existing) = self.request(api.get_opt(name)).await? else {
            let object = ServiceNameMapping::for_key(key, applications);
            return match self
                .request(api.create(&PostParams::default(), &object))
                .await
            {
                Ok(_) => Ok(Upserted::Written),
                Err(kube::Error::Api(status)) if status.code == 409 => Err(AttemptError::Conflict),
                Err(err) => Err(err.into()),
            };
        };
        if existing.spec.interface_name != key.interface {
            return Err(AttemptError::NameCollision {
                name: name.to_owned(),
                found: existing.spec.interface_name,
                wanted: key.interface.clone(),
            });
        }
        let mut union: BTreeSet<String> = existing.spec.application_names.iter().cloned().collect();
        let before = union.len();
        union.extend(applications.iter().cloned());
        if union.len() == before {
            return Ok(Upserted::AlreadyPresent);
        }
        existing.spec.application_names = union.into_iter().collect();
        existing
            .metadata
            .labels
            .get_or_insert_default()
            .entry(INTERFACE_LABEL.to_owned())
            .or_insert_with(|| label_value(&key.interface));
        // `existing` still carries the resourceVersion it was read at: the precondition.
        match self
            .request(api.replace(name, &PostParams::default(), &existing))
            .await
        {
            Ok(_) => Ok(Upserted::Written),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(AttemptError::Conflict),
            Err(err) => Err(err.into()),
        }
    }

    /// Waits for the rate limiter, then runs and times one API request.
    async fn request<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        self.limiter.acquire().await;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = call.await;
        self.stats
            .request_seconds
            .observe(started.elapsed().as_secs_f64());
        if let Err(err) = &result {
            let code = match err {
                kube::Error::Api(status) => status.code.to_string(),
                _ => "0".to_owned(),
            };
            self.stats
                .errors_by_code
                .get_or_create(&CodeLabel { code })
                .inc();
        }
        result
    }
}

/// `base * 2^attempt` capped at `cap`, then a random point in its upper half, so replicas that
/// collided do not retry in lockstep.
fn jittered_backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(5);
        for attempt in 0..40 {
            let exponential = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
            let delay = jittered_backoff(attempt, base, cap);
            assert!(
                delay >= exponential / 2 && delay <= exponential,
                "{attempt}: {delay:?}"
            );
        }
        let samples: BTreeSet<Duration> =
            (0..20).map(|_| jittered_backoff(10, base, cap)).collect();
        assert!(samples.len() > 10, "no jitter: {samples:?}");
    }
}
