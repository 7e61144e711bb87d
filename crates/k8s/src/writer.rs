//! Upserts of ServiceNameMapping objects through a per-key work queue, controller style.
//!
//! The debounce flush hands merged pairs to [`KubeWriter::enqueue`] and returns at once. The
//! queue keeps, per key, the applications still to write; a key is written by at most one worker
//! at a time, and at most `maxParallelWrites` keys are written at once. Each upsert reads the
//! object, adds the applications and writes with the resourceVersion precondition (create when
//! missing). The outcome decides what happens to that key alone:
//! - written: the pairs leave the outbox; applications that arrived meanwhile go again;
//! - transient (409, 429, 5xx, no answer): retried after a per-key jittered backoff (409 short,
//!   429 as the server says, others growing to 10 s);
//! - permanent (403, 404 when the CRD is missing, 400/422 from validation or an admission
//!   webhook, 413 or an etcd "too large", no free object name): the key is *parked* with its
//!   reason (log line with the key, `/debug/outbox`, a gauge) and retried slowly
//!   (`kubernetes.parkedRetryInterval`), while every other key keeps flowing.
//!
//! Every request is paced by a client-side token bucket. Pairs stay in the outbox until written,
//! so nothing acknowledged is lost whatever the API server answers.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cluster::ClusterView;
use super::crd::{INTERFACE_LABEL, ServiceNameMapping};
use crate::mapping::registrants::{self, Pending, Registrants};
use crate::mapping::{MappingDelta, MappingKey, candidate_names, label_value};
use crate::metrics::{CodeLabel, latency_histogram};
use crate::ratelimit::RateLimiter;
use crate::store::Outbox;

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
    /// Times a key was parked.
    pub parked: AtomicU64,
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
            parked: AtomicU64::new(0),
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

/// What to do with a key after a failed attempt.
#[derive(Debug, PartialEq)]
enum Failure {
    /// Retry after this long.
    Transient(Duration),
    /// Park with this reason.
    Permanent(String),
}

/// One finished upsert of a key: what it tried to write, and how it went.
struct Attempt {
    key: MappingKey,
    applications: BTreeSet<String>,
    registrants: Pending,
    result: Result<(), Failure>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upserted {
    Written,
    AlreadyPresent,
}

/// Per-key bookkeeping of the queue.
#[derive(Default)]
struct Queue {
    /// Applications still to write, per key.
    wanted: BTreeMap<MappingKey, BTreeSet<String>>,
    /// Keys due now, each at most once (see `scheduled`).
    ready: VecDeque<MappingKey>,
    /// Keys waiting for their retry time.
    delayed: BinaryHeap<Reverse<(Instant, MappingKey)>>,
    /// Keys in `ready` or `delayed`.
    scheduled: HashSet<MappingKey>,
    in_flight: HashSet<MappingKey>,
    /// Consecutive failures per key, for its backoff.
    attempts: HashMap<MappingKey, u32>,
    parked: BTreeMap<MappingKey, ParkedKey>,
}

impl Queue {
    fn schedule_now(&mut self, key: MappingKey) {
        if !self.in_flight.contains(&key) && self.scheduled.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    fn schedule_at(&mut self, key: MappingKey, at: Instant) {
        if self.scheduled.insert(key.clone()) {
            self.delayed.push(Reverse((at, key)));
        }
    }

    /// Moves delayed keys whose time has come to `ready`; returns the next deadline.
    fn promote_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some(Reverse((at, _))) = self.delayed.peek() {
            if *at > now {
                return Some(*at);
            }
            if let Some(Reverse((_, key))) = self.delayed.pop() {
                self.ready.push_back(key);
            }
        }
        None
    }
}

pub struct KubeWriter {
    client: Client,
    limiter: RateLimiter,
    config: WriterConfig,
    cluster: Arc<ClusterView>,
    stats: Arc<WriterStats>,
    queue: Mutex<Queue>,
    wake: Notify,
}

impl KubeWriter {
    pub fn new(client: Client, config: WriterConfig, cluster: Arc<ClusterView>) -> Self {
        Self {
            client,
            limiter: RateLimiter::new(config.qps, config.burst),
            config,
            cluster,
            stats: Arc::new(WriterStats::default()),
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
        }
    }

    pub fn stats(&self) -> Arc<WriterStats> {
        self.stats.clone()
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds pairs to write; returns at once.
    pub fn enqueue(&self, pairs: MappingDelta) {
        let mut queue = self.queue();
        for (key, applications) in pairs.into_inner() {
            queue
                .wanted
                .entry(key.clone())
                .or_default()
                .extend(applications);
            queue.schedule_now(key);
        }
        drop(queue);
        self.wake.notify_one();
    }

    /// Keys parked by a permanent error, with their reasons.
    pub fn parked(&self) -> Vec<ParkedKey> {
        self.queue().parked.values().cloned().collect()
    }

    /// Keys with applications still to write.
    pub fn pending_keys(&self) -> usize {
        self.queue().wanted.len()
    }

    /// Runs the queue until shutdown. What is not written stays in the outbox for the next start.
    pub async fn run(self: Arc<Self>, outbox: Outbox, mut shutdown: watch::Receiver<bool>) {
        let mut workers: JoinSet<Attempt> = JoinSet::new();
        loop {
            let next_deadline = self.start_due(&mut workers, &outbox);
            tokio::select! {
                () = crate::shutdown::signalled(&mut shutdown) => break,
                () = self.wake.notified() => {}
                Some(done) = workers.join_next(), if !workers.is_empty() => match done {
                    Ok(attempt) => self.finish(&outbox, attempt).await,
                    Err(err) => tracing::error!(error = %err, "an upsert task failed"),
                },
                () = sleep_until(next_deadline) => {}
            }
        }
        workers.shutdown().await;
    }

    /// Starts upserts of due keys while there are free workers; returns the next retry time.
    fn start_due(
        self: &Arc<Self>,
        workers: &mut JoinSet<Attempt>,
        outbox: &Outbox,
    ) -> Option<Instant> {
        let mut queue = self.queue();
        let next = queue.promote_due(Instant::now());
        while workers.len() < self.config.max_parallel.max(1) {
            let Some(key) = queue.ready.pop_front() else {
                break;
            };
            queue.scheduled.remove(&key);
            let Some(applications) = queue.wanted.get(&key).cloned() else {
                continue;
            };
            queue.in_flight.insert(key.clone());
            // Read now: what is recorded later goes with the next attempt, and only what this
            // one wrote leaves the outbox.
            // Only the pods of the applications this attempt writes: a pod of another
            // application (its pair not queued yet) stays pending and goes with that pair.
            let mut registrants = outbox.registrants_of(&key);
            registrants.retain(|app, _| applications.contains(app));
            let writer = self.clone();
            workers.spawn(async move {
                let result = writer.upsert(&key, &applications, &registrants).await;
                Attempt {
                    key,
                    applications,
                    registrants,
                    result,
                }
            });
        }
        next
    }

    async fn finish(&self, outbox: &Outbox, attempt: Attempt) {
        let Attempt {
            key,
            applications: written,
            registrants,
            result,
        } = attempt;
        let now = Instant::now();
        let done = {
            let mut queue = self.queue();
            queue.in_flight.remove(&key);
            match result {
                Ok(()) => {
                    queue.attempts.remove(&key);
                    if queue.parked.remove(&key).is_some() {
                        tracing::info!(%key, "parked key written");
                    }
                    // Pods recorded while this write was in flight go with the next one.
                    let unwritten: Vec<String> = outbox
                        .registrants_of(&key)
                        .into_iter()
                        .filter(|(app, pods)| {
                            let done = registrants.get(app);
                            pods.iter().any(|pod| done.is_none_or(|d| !d.contains(pod)))
                        })
                        .map(|(app, _)| app)
                        .collect();
                    let left = queue.wanted.get_mut(&key).map(|apps| {
                        apps.retain(|app| !written.contains(app));
                        apps.len()
                    });
                    let left = if unwritten.is_empty() {
                        left
                    } else {
                        let apps = queue.wanted.entry(key.clone()).or_default();
                        apps.extend(unwritten);
                        Some(apps.len())
                    };
                    match left {
                        Some(0) | None => {
                            queue.wanted.remove(&key);
                        }
                        Some(_) => queue.schedule_now(key.clone()),
                    }
                    true
                }
                Err(Failure::Transient(delay)) => {
                    *queue.attempts.entry(key.clone()).or_default() += 1;
                    queue.schedule_at(key.clone(), now + delay);
                    false
                }
                Err(Failure::Permanent(reason)) => {
                    *queue.attempts.entry(key.clone()).or_default() += 1;
                    self.stats.parked.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%key, %reason, retry_in = ?self.config.parked_retry,
                        "cannot write this mapping; parked (its pairs stay in the outbox)");
                    let since = SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    queue.parked.insert(
                        key.clone(),
                        ParkedKey {
                            namespace: key.namespace.clone(),
                            interface_name: key.interface.clone(),
                            reason,
                            since,
                        },
                    );
                    queue.schedule_at(key.clone(), now + self.config.parked_retry);
                    false
                }
            }
        };
        if done {
            let mut pairs = MappingDelta::default();
            for application in written {
                pairs.add(key.clone(), application);
            }
            let registrants = BTreeMap::from([(key.clone(), registrants)]);
            if let Err(err) = outbox.complete(pairs, registrants).await {
                // As a `dyn Error`, so the log line carries the sources too.
                let error: &dyn std::error::Error = &err;
                tracing::warn!(error, %key, "written pairs stay in the outbox");
            }
        }
    }

    /// One attempt at a key, classified.
    async fn upsert(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
        registrants: &Pending,
    ) -> Result<(), Failure> {
        let attempt = self.queue().attempts.get(key).copied().unwrap_or(0);
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
        use crate::metrics::{scraped_counter, scraped_gauge};
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
        scraped_gauge(
            registry,
            "outbox_parked_keys",
            "Keys whose write failed for a reason retrying soon cannot fix (see /debug/outbox)",
            self,
            |w| w.queue().parked.len() as i64,
        );
        scraped_gauge(
            registry,
            "kube_write_queue_keys",
            "Keys with applications waiting to be written",
            self,
            |w| w.queue().wanted.len() as i64,
        );
    }
}

/// The Kubernetes-mode write stage: acknowledged pairs, merged by the debouncer, are handed to
/// the queue (one upsert per key per flush at most); a flush never waits for the API server.
/// Runs until the outbox's change feed closes.
pub async fn feed(
    config: crate::debounce::DebounceConfig,
    changes: tokio::sync::mpsc::Receiver<crate::store::StoredChange>,
    writer: Arc<KubeWriter>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    crate::debounce::run(
        config,
        changes,
        |batch: crate::debounce::Batch<crate::store::StoredChange>| {
            metrics.flushed(batch.events, batch.first_event);
            tracing::debug!(
                events = batch.events,
                keys = batch.value.delta.len(),
                waited_ms = batch.first_event.elapsed().as_millis() as u64,
                "upserts queued"
            );
            writer.enqueue(batch.value.delta);
            std::future::ready(())
        },
    )
    .await;
}

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

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
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

    #[test]
    fn a_key_is_scheduled_once_and_not_while_in_flight() {
        let mut queue = Queue::default();
        let key = MappingKey::new("ns", "I");
        queue.schedule_now(key.clone());
        queue.schedule_now(key.clone());
        assert_eq!(queue.ready.len(), 1);
        let taken = queue.ready.pop_front();
        queue.scheduled.remove(&key);
        queue.in_flight.insert(key.clone());
        queue.schedule_now(key.clone());
        assert!(queue.ready.is_empty(), "scheduled while in flight");
        assert_eq!(taken, Some(key.clone()));
        queue.in_flight.remove(&key);
        let now = Instant::now();
        queue.schedule_at(key.clone(), now + Duration::from_secs(1));
        assert_eq!(queue.promote_due(now), Some(now + Duration::from_secs(1)));
        assert!(queue.ready.is_empty());
        assert_eq!(queue.promote_due(now + Duration::from_secs(1)), None);
        assert_eq!(queue.ready.len(), 1);
    }
}
