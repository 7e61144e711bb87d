//! The per-key work queue that moves the outbox's acknowledged pairs to the mode's truth (the API
//! server's ServiceNameMapping objects, ZooKeeper's mapping nodes), controller style. Each mode
//! supplies the one write of a key ([`Sink`]); the queue is the same for both.
//!
//! The debounce flush hands merged pairs to [`Drain::enqueue`] and returns at once. The queue
//! keeps, per key, the applications still to write; a key is written by at most one worker at a
//! time, and at most `max_parallel` keys at once. The outcome of a write decides what happens to
//! that key alone:
//! - written: the pairs (and the pods recorded with them) leave the outbox; applications that
//!   arrived meanwhile, or pods recorded while the write was in flight, go again;
//! - [`Failure::Transient`]: retried after the delay the sink chose;
//! - [`Failure::Permanent`]: the key is *parked* with its reason (log line, `/debug/outbox`, a
//!   gauge) and retried every `parked_retry`, while every other key keeps flowing.
//!
//! Pairs stay in the outbox until written, so nothing acknowledged is lost whatever the truth
//! answers; what is not written at shutdown is written first at the next start.

pub use dubbo_cp_kit::backoff::jittered_backoff;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus_client::registry::Registry;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::mapping::registrants::Pending;
use crate::mapping::{MappingDelta, MappingKey};
use crate::{Outbox, ParkedKey, StoredChange};

/// What to do with a key after a failed write.
#[derive(Debug, PartialEq)]
pub enum Failure {
    /// Retry after this long.
    Transient(Duration),
    /// Park with this reason.
    Permanent(String),
}

/// One write of a key to the mode's truth.
pub trait Sink: Send + Sync + 'static {
    /// Writes `applications` of `key` (with the pods `registrants` records for them);
    /// `failures` counts this key's failed writes in a row before this one.
    fn write(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
        registrants: &Pending,
        failures: u32,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
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

/// One finished write of a key: what it tried to write, and how it went.
struct Attempt {
    key: MappingKey,
    applications: BTreeSet<String>,
    registrants: Pending,
    result: Result<(), Failure>,
}

/// The queue in front of a [`Sink`].
pub struct Drain<S> {
    sink: Arc<S>,
    max_parallel: usize,
    parked_retry: Duration,
    /// Times a key was parked.
    parked_total: AtomicU64,
    queue: Mutex<Queue>,
    wake: Notify,
}

impl<S: Sink> Drain<S> {
    pub fn new(sink: Arc<S>, max_parallel: usize, parked_retry: Duration) -> Self {
        Drain {
            sink,
            max_parallel: max_parallel.max(1),
            parked_retry,
            parked_total: AtomicU64::new(0),
            queue: Mutex::default(),
            wake: Notify::new(),
        }
    }

    pub fn sink(&self) -> &Arc<S> {
        &self.sink
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

    /// Times a key was parked.
    pub fn parked_total(&self) -> u64 {
        self.parked_total.load(Ordering::Relaxed)
    }

    /// The queue's gauges: parked keys (`outbox_parked_keys`) and keys waiting, under `queued`.
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut Registry,
        queued: (&'static str, &'static str),
    ) {
        use crate::metrics::scraped_gauge;
        scraped_gauge(
            registry,
            "outbox_parked_keys",
            "Keys whose write failed for a reason retrying soon cannot fix (see /debug/outbox)",
            self,
            |d| d.queue().parked.len() as i64,
        );
        scraped_gauge(registry, queued.0, queued.1, self, |d| {
            d.queue().wanted.len() as i64
        });
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
                    Err(err) => tracing::error!(error = %err, "a mapping write task failed"),
                },
                () = sleep_until(next_deadline) => {}
            }
        }
        workers.shutdown().await;
    }

    /// Starts writes of due keys while there are free workers; returns the next retry time.
    fn start_due(&self, workers: &mut JoinSet<Attempt>, outbox: &Outbox) -> Option<Instant> {
        let mut queue = self.queue();
        let next = queue.promote_due(Instant::now());
        while workers.len() < self.max_parallel {
            let Some(key) = queue.ready.pop_front() else {
                break;
            };
            queue.scheduled.remove(&key);
            let Some(applications) = queue.wanted.get(&key).cloned() else {
                continue;
            };
            queue.in_flight.insert(key.clone());
            let failures = queue.attempts.get(&key).copied().unwrap_or(0);
            // Read now: what is recorded later goes with the next write, and only what this
            // one wrote leaves the outbox. Only the pods of the applications this write holds:
            // a pod of another application (its pair not queued yet) goes with that pair.
            let mut registrants = outbox.registrants_of(&key);
            registrants.retain(|app, _| applications.contains(app));
            let sink = self.sink.clone();
            workers.spawn(async move {
                let result = sink
                    .write(&key, &applications, &registrants, failures)
                    .await;
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
                    self.parked_total.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%key, %reason, retry_in = ?self.parked_retry,
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
                    queue.schedule_at(key.clone(), now + self.parked_retry);
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
}

/// The write stage of an outbox: committed pairs, merged by the debouncer, handed to the queue
/// (one write per key per flush at most); a flush never waits for the truth. Runs until the
/// outbox's change feed closes.
pub async fn feed<S: Sink>(
    config: crate::debounce::DebounceConfig,
    changes: mpsc::Receiver<StoredChange>,
    drain: Arc<Drain<S>>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    crate::debounce::run(
        config,
        changes,
        |batch: crate::debounce::Batch<StoredChange>| {
            metrics.flushed(batch.events, batch.first_event);
            tracing::debug!(
                events = batch.events,
                keys = batch.value.delta.len(),
                waited_ms = batch.first_event.elapsed().as_millis() as u64,
                "writes queued"
            );
            drain.enqueue(batch.value.delta);
            std::future::ready(())
        },
    )
    .await;
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
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
