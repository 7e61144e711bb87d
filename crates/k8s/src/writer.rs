//! Upserts of ServiceNameMapping objects: the Kubernetes mode's [`Sink`] behind the outbox's
//! per-key queue ([`crate::store::drain`]: one worker per key, `maxParallelWrites` keys at once,
//! parking).
//!
//! Each upsert reads the object, adds the applications and writes with the resourceVersion
//! precondition (create when missing). Its outcome is classified for the queue:
//! - transient (409, 429, 5xx, no answer): retried after a per-key jittered backoff (409 short,
//!   429 as the server says, others growing to 10 s);
//! - permanent (403, 404 when the CRD is missing, 400/422 from validation or an admission
//!   webhook, 413 or an etcd "too large", no free object name): the key is parked with its
//!   reason and retried slowly (`kubernetes.parkedRetryInterval`), while every other key keeps
//!   flowing.
//!
//! Every request is paced by a client-side token bucket. Pairs stay in the outbox until written,
//! so nothing acknowledged is lost whatever the API server answers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::cluster::ClusterView;
use super::crd::{INTERFACE_LABEL, ServiceNameMapping};
use crate::mapping::registrants::{self, Pending, Registrants};
use crate::mapping::{MappingKey, candidate_names, label_value};
use crate::metrics::{CodeLabel, latency_histogram};
use crate::ratelimit::RateLimiter;
use crate::store::drain::{Failure, Sink, jittered_backoff};

/// Declared with the other settings (keys of the `kubernetes` section).
pub use crate::config::WriterConfig;

/// Counters for logs, tests, benchmarks and `/metrics`.
#[derive(Debug)]
pub struct WriterStats {
    /// Seconds per API request.
    pub request_seconds: Histogram,
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
    /// Other failures (API errors, unreachable server).
    pub errors: AtomicU64,
}

impl Default for WriterStats {
    fn default() -> Self {
        Self {
            request_seconds: latency_histogram(),
            errors_by_code: Family::default(),
            requests: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            unchanged: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }
}

/// A key that failed for a reason retrying soon cannot fix (shared with ZooKeeper mode).
pub use crate::store::ParkedKey;

/// Why one upsert attempt did not land.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("conflict: the object changed meanwhile")]
    Conflict,
    #[error("every name {0:?} is held by another interface")]
    NoFreeName(Vec<String>),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upserted {
    Written,
    AlreadyPresent,
}

/// The Kubernetes mode's writes of one key (the queue in front of it is the outbox's drain).
pub struct KubeWriter {
    client: Client,
    limiter: RateLimiter,
    cluster: Arc<ClusterView>,
    stats: Arc<WriterStats>,
}

/// The queue of acknowledged pairs in front of the API server.
pub type KubeDrain = crate::store::drain::Drain<KubeWriter>;

impl KubeWriter {
    pub fn new(client: Client, config: WriterConfig, cluster: Arc<ClusterView>) -> Self {
        Self {
            client,
            limiter: RateLimiter::new(config.qps, config.burst),
            cluster,
            stats: Arc::new(WriterStats::default()),
        }
    }

    /// The writer behind its queue (`kubernetes.maxParallelWrites`, `parkedRetryInterval`).
    pub fn drain(self, config: WriterConfig) -> Arc<KubeDrain> {
        Arc::new(KubeDrain::new(
            Arc::new(self),
            config.max_parallel,
            config.parked_retry,
        ))
    }

    pub fn stats(&self) -> Arc<WriterStats> {
        self.stats.clone()
    }

    /// One attempt at a key (`attempt` failed ones before it), classified.
    async fn upsert(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
        registrants: &Pending,
        attempt: u32,
    ) -> Result<(), Failure> {
        match self.upsert_once(key, applications, registrants).await {
            Ok(Upserted::Written) => {
                self.stats.writes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Ok(Upserted::AlreadyPresent) => {
                self.stats.unchanged.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(err) => {
                let failure = classify(&err, attempt);
                match &failure {
                    Failure::Transient(delay) => {
                        if matches!(err, AttemptError::Conflict) {
                            self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%key, attempt, "conflict; re-reading");
                        } else {
                            self.stats.errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(%key, attempt, error = %err, retry_in = ?delay, "upsert failed; retrying");
                        }
                    }
                    Failure::Permanent(_) => {
                        self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(failure)
            }
        }
    }

    /// Finds the object for `key` (one that already holds the interface, else the first free
    /// candidate name) and writes the union.
    async fn upsert_once(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
        pending: &Pending,
    ) -> Result<Upserted, AttemptError> {
        let api: Api<ServiceNameMapping> = Api::namespaced(self.client.clone(), &key.namespace);
        let mut names = self.cluster.names_of(key);
        for candidate in candidate_names(&key.interface) {
            if !names.contains(&candidate) {
                names.push(candidate);
            }
        }
        for name in &names {
            let Some(mut existing) = self.request(api.get_opt(name)).await? else {
                let mut object = ServiceNameMapping::for_key(name, key, applications);
                let mut record = Registrants::new();
                if registrants::merge(&mut record, pending) {
                    registrants::fit(&mut record);
                    object.metadata.annotations = Some(BTreeMap::from([(
                        registrants::ANNOTATION.to_owned(),
                        registrants::format(&record),
                    )]));
                }
                return match self
                    .request(api.create(&PostParams::default(), &object))
                    .await
                {
                    Ok(_) => Ok(Upserted::Written),
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        Err(AttemptError::Conflict)
                    }
                    Err(err) => Err(err.into()),
                };
            };
            if existing.spec.interface_name != key.interface {
                continue;
            }
            let mut union: BTreeSet<String> =
                existing.spec.application_names.iter().cloned().collect();
            let before = union.len();
            union.extend(applications.iter().cloned());
            // An unreadable record is replaced: applications it no longer names never expire.
            let mut record = existing
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(registrants::ANNOTATION))
                .and_then(|text| registrants::parse(text))
                .unwrap_or_default();
            let mut recorded = registrants::merge(&mut record, pending);
            // Entries of applications no longer in the object (a kubectl edit) go too.
            let before_cleanup = record.len();
            record.retain(|app, _| union.contains(app));
            recorded |= record.len() != before_cleanup;
            if recorded {
                registrants::fit(&mut record);
            }
            if union.len() == before && !recorded {
                return Ok(Upserted::AlreadyPresent);
            }
            existing.spec.application_names = union.into_iter().collect();
            if recorded {
                existing
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(
                        registrants::ANNOTATION.to_owned(),
                        registrants::format(&record),
                    );
            }
            existing
                .metadata
                .labels
                .get_or_insert_default()
                .entry(INTERFACE_LABEL.to_owned())
                .or_insert_with(|| label_value(&key.interface));
            // `existing` still carries the resourceVersion it was read at: the precondition.
            return match self
                .request(api.replace(name, &PostParams::default(), &existing))
                .await
            {
                Ok(_) => Ok(Upserted::Written),
                // 404: deleted since the read (kubectl, or an expiry on another replica): the
                // retry reads again and creates it. Not the permanent 404 of a missing CRD.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                    Err(AttemptError::Conflict)
                }
                Err(err) => Err(err.into()),
            };
        }
        Err(AttemptError::NoFreeName(names))
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

    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        use crate::metrics::scraped_counter;
        let stats = &self.stats;
        registry.register(
            "kube_request_duration_seconds",
            "Seconds per request to the Kubernetes API server",
            stats.request_seconds.clone(),
        );
        registry.register(
            "kube_errors",
            "Failed Kubernetes API requests by HTTP code (0: no answer)",
            stats.errors_by_code.clone(),
        );
        scraped_counter(
            registry,
            "kube_requests",
            "Requests sent to the Kubernetes API server",
            stats,
            |s| s.requests.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "kube_writes",
            "Creates and updates that succeeded",
            stats,
            |s| s.writes.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "kube_conflicts",
            "409 answers to creates and updates",
            stats,
            |s| s.conflicts.load(Ordering::Relaxed),
        );
    }
}

impl Sink for KubeWriter {
    fn write(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
        registrants: &Pending,
        failures: u32,
    ) -> impl std::future::Future<Output = Result<(), Failure>> + Send {
        self.upsert(key, applications, registrants, failures)
    }
}

/// The gauge of keys waiting in the Kubernetes mode's queue.
pub const QUEUE_GAUGE: (&str, &str) = (
    "kube_write_queue_keys",
    "Keys with applications waiting to be written",
);

/// Transient or permanent, and how long to wait.
fn classify(err: &AttemptError, attempt: u32) -> Failure {
    let backoff = |base, cap| Failure::Transient(jittered_backoff(attempt, base, cap));
    match err {
        AttemptError::Conflict => backoff(Duration::from_millis(10), Duration::from_secs(1)),
        AttemptError::NoFreeName(names) => Failure::Permanent(format!(
            "name collision: every name {names:?} is held by another interface"
        )),
        AttemptError::Kube(kube::Error::Api(status)) => match status.code {
            // Wait as the server says (Status.details.retryAfterSeconds, which the API server
            // sets beside the Retry-After header).
            429 => Failure::Transient(
                status
                    .details
                    .as_ref()
                    .map(|details| Duration::from_secs(details.retry_after_seconds.into()))
                    .filter(|wait| !wait.is_zero())
                    .unwrap_or(Duration::from_secs(1)),
            ),
            400 | 403 | 404 | 405 | 413 | 415 | 422 => Failure::Permanent(format!(
                "{} {}: {}",
                status.code, status.reason, status.message
            )),
            // etcd refuses objects over its request size limit with a 500.
            500 if status.message.contains("too large") => {
                Failure::Permanent(format!("{} {}", status.code, status.message))
            }
            _ => backoff(Duration::from_millis(200), Duration::from_secs(10)),
        },
        AttemptError::Kube(_) => backoff(Duration::from_millis(200), Duration::from_secs(10)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> AttemptError {
        AttemptError::Kube(kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            reason: "Test".into(),
            ..Default::default()
        })))
    }

    #[test]
    fn errors_are_classified() {
        for code in [400, 403, 404, 413, 422] {
            assert!(
                matches!(classify(&api_error(code, "x"), 0), Failure::Permanent(_)),
                "{code}"
            );
        }
        for code in [409, 500, 502, 503, 504] {
            assert!(
                matches!(classify(&api_error(code, "x"), 0), Failure::Transient(_)),
                "{code}"
            );
        }
        assert!(matches!(
            classify(&api_error(500, "etcdserver: request is too large"), 0),
            Failure::Permanent(_)
        ));
        assert!(matches!(
            classify(&AttemptError::NoFreeName(vec!["a".into()]), 0),
            Failure::Permanent(_)
        ));
        assert!(matches!(
            classify(&AttemptError::Conflict, 0),
            Failure::Transient(d) if d <= Duration::from_millis(10)
        ));
    }
}
