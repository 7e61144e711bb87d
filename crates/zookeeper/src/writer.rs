//! Acknowledged pairs from the outbox into mapping nodes, as Dubbo Java's
//! `MetadataServiceNameMapping` writes them: read the node and its version, append the missing
//! applications, and set it with that version as the compare-and-swap ticket (create it, with
//! its parents, when missing). A lost ticket (another replica or an SDK wrote meanwhile) is read
//! again at once; other failures wait a growing, jittered time. Pairs leave the outbox only once
//! their node lists them, so nothing acknowledged is lost, whatever the ensemble does.
//!
//! A node whose value cannot be read is never overwritten: its key is *parked* with the reason
//! (`/debug/outbox`, a log line) and tried again every `zookeeper.parkedRetryInterval`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, Error};

use crate::mapping::{MappingDelta, MappingKey};
use crate::session::Session;
use crate::stats::{ZkStats, now};
use crate::store::{Outbox, ParkedKey};

/// Tickets one attempt may lose in a row before it waits like any failure (Java's
/// `cas-retry-times` default).
const CAS_TRIES: u32 = 10;
/// The longest wait before a key is tried again after an error.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Why one attempt at a key did not land.
#[derive(Debug, PartialEq)]
enum Failure {
    /// Try again after this long.
    Transient(Duration),
    /// Park with this reason.
    Permanent(String),
}

#[derive(Default)]
struct Queue {
    /// Applications still to write, per key.
    wanted: BTreeMap<MappingKey, BTreeSet<String>>,
    /// When each key not in flight may be tried next.
    due: BTreeMap<MappingKey, Instant>,
    in_flight: HashSet<MappingKey>,
    /// Consecutive failures per key.
    attempts: HashMap<MappingKey, u32>,
    parked: BTreeMap<MappingKey, ParkedKey>,
}

pub struct ZkWriter {
    session: Arc<Session>,
    stats: Arc<ZkStats>,
    max_parallel: usize,
    parked_retry: Duration,
    queue: Mutex<Queue>,
    wake: Notify,
}

/// The outcome of one finished attempt.
struct Attempt {
    key: MappingKey,
    applications: BTreeSet<String>,
    result: Result<(), Failure>,
}

impl ZkWriter {
    pub fn new(session: Arc<Session>, max_parallel: usize, parked_retry: Duration) -> Self {
        ZkWriter {
            stats: session.stats().clone(),
            session,
            max_parallel: max_parallel.max(1),
            parked_retry,
            queue: Mutex::default(),
            wake: Notify::new(),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds pairs to write; returns at once.
    pub fn enqueue(&self, pairs: MappingDelta) {
        let mut queue = self.queue();
        let now = Instant::now();
        for (key, applications) in pairs.into_inner() {
            queue
                .wanted
                .entry(key.clone())
                .or_default()
                .extend(applications);
            if !queue.in_flight.contains(&key) && !queue.parked.contains_key(&key) {
                queue.due.insert(key, now);
            }
        }
        drop(queue);
        self.wake.notify_one();
    }

    /// Keys parked with their reasons.
    pub fn parked(&self) -> Vec<ParkedKey> {
        self.queue().parked.values().cloned().collect()
    }

    /// Keys with applications still to write.
    pub fn pending_keys(&self) -> usize {
        self.queue().wanted.len()
    }

    /// Runs until shutdown; what is not written stays in the outbox for the next start.
    pub async fn run(self: Arc<Self>, outbox: Outbox, mut shutdown: watch::Receiver<bool>) {
        let mut workers: JoinSet<Attempt> = JoinSet::new();
        loop {
            let next = self.start_due(&mut workers);
            tokio::select! {
                () = crate::shutdown::signalled(&mut shutdown) => break,
                () = self.wake.notified() => {}
                Some(done) = workers.join_next(), if !workers.is_empty() => match done {
                    Ok(attempt) => self.finish(&outbox, attempt).await,
                    Err(err) => tracing::error!(error = %err, "a mapping write task failed"),
                },
                () = sleep_until(next) => {}
            }
        }
        workers.shutdown().await;
    }

    /// Starts due keys while workers are free; returns the next due time.
    fn start_due(self: &Arc<Self>, workers: &mut JoinSet<Attempt>) -> Option<Instant> {
        let mut queue = self.queue();
        let now = Instant::now();
        let mut next = None;
        let due: Vec<MappingKey> = queue
            .due
            .iter()
            .filter_map(|(key, at)| {
                if *at <= now {
                    Some(key.clone())
                } else {
                    next = Some(next.map_or(*at, |n: Instant| n.min(*at)));
                    None
                }
            })
            .take(self.max_parallel.saturating_sub(workers.len()))
            .collect();
        for key in due {
            queue.due.remove(&key);
            let Some(applications) = queue.wanted.get(&key).cloned() else {
                continue;
            };
            queue.in_flight.insert(key.clone());
            let writer = self.clone();
            workers.spawn(async move {
                let result = writer.attempt(&key, &applications).await;
                Attempt {
                    key,
                    applications,
                    result,
                }
            });
        }
        if workers.len() >= self.max_parallel {
            // Full: the next finished worker wakes the loop.
            return None;
        }
        next
    }

    async fn finish(&self, outbox: &Outbox, attempt: Attempt) {
        let Attempt {
            key,
            applications,
            result,
        } = attempt;
        let written = {
            let mut queue = self.queue();
            queue.in_flight.remove(&key);
            match result {
                Ok(()) => {
                    queue.attempts.remove(&key);
                    if queue.parked.remove(&key).is_some() {
                        tracing::info!(%key, "parked mapping written");
                    }
                    let left = queue.wanted.get_mut(&key).map(|apps| {
                        apps.retain(|app| !applications.contains(app));
                        apps.len()
                    });
                    if left.unwrap_or(0) == 0 {
                        queue.wanted.remove(&key);
                    } else {
                        queue.due.insert(key.clone(), Instant::now());
                    }
                    true
                }
                Err(failure) => {
                    let attempts = queue.attempts.entry(key.clone()).or_default();
                    *attempts += 1;
                    let delay = match failure {
                        Failure::Transient(delay) => delay,
                        Failure::Permanent(reason) => {
                            tracing::warn!(%key, %reason, retry_in = ?self.parked_retry,
                                "cannot write this mapping; parked (its pairs stay in the outbox)");
                            queue.parked.insert(
                                key.clone(),
                                ParkedKey {
                                    namespace: key.namespace.clone(),
                                    interface_name: key.interface.clone(),
                                    reason,
                                    since: now(),
                                },
                            );
                            self.parked_retry
                        }
                    };
                    queue.due.insert(key.clone(), Instant::now() + delay);
                    false
                }
            }
        };
        if written {
            let mut pairs = MappingDelta::default();
            for application in applications {
                pairs.add(key.clone(), application);
            }
            // Every pod recorded for these applications, up to now: ZooKeeper keeps no pods, so
            // once the node lists an application nothing of it is left to write.
            let mut registrants = outbox.registrants_of(&key);
            registrants.retain(|app, _| pairs.contains(&key, app));
            let registrants = BTreeMap::from([(key.clone(), registrants)]);
            if let Err(err) = outbox.complete(pairs, registrants).await {
                let error: &dyn std::error::Error = &err;
                tracing::warn!(error, %key, "written pairs stay in the outbox");
            }
        }
        self.wake.notify_one();
    }

    /// One attempt at a key: up to [`CAS_TRIES`] read-append-write rounds.
    async fn attempt(
        &self,
        key: &MappingKey,
        applications: &BTreeSet<String>,
    ) -> Result<(), Failure> {
        let failures = self.queue().attempts.get(key).copied().unwrap_or(0);
        let path =
            crate::layout::mapping_path(key).map_err(|err| Failure::Permanent(err.to_string()))?;
        let Some(client) = self.session.client() else {
            return Err(Failure::Transient(backoff(failures)));
        };
        for _ in 0..CAS_TRIES {
            match cas_once(&client, &path, applications).await {
                Ok(true) => {
                    ZkStats::count(&self.stats.writes);
                    return Ok(());
                }
                Ok(false) => {
                    ZkStats::count(&self.stats.unchanged);
                    return Ok(());
                }
                Err(Round::Lost) => {
                    ZkStats::count(&self.stats.conflicts);
                    tokio::time::sleep(jitter(Duration::from_millis(20))).await;
                }
                Err(Round::Unreadable(reason)) => return Err(Failure::Permanent(reason)),
                Err(Round::Failed(err)) => {
                    ZkStats::count(&self.stats.retries);
                    self.stats.error(format!("write {path}: {err}"));
                    return Err(match err {
                        Error::NoAuth | Error::InvalidAcl | Error::BadArguments(_) => {
                            Failure::Permanent(format!("{path}: {err}"))
                        }
                        _ => Failure::Transient(backoff(failures)),
                    });
                }
            }
        }
        Err(Failure::Transient(backoff(failures)))
    }
}

/// How one read-append-write round ended, when it did not land.
enum Round {
    /// The ticket was lost: read again.
    Lost,
    Unreadable(String),
    Failed(Error),
}

/// One round; true when it wrote, false when every application was listed already.
async fn cas_once(
    client: &Client,
    path: &str,
    applications: &BTreeSet<String>,
) -> Result<bool, Round> {
    match client.get_data(path).await {
        Ok((data, stat)) => {
            if let Err(err) = crate::mapping_value::parse(&data) {
                return Err(Round::Unreadable(format!(
                    "{path}: the value {err}; it is not overwritten (fix or delete the node)"
                )));
            }
            let current = String::from_utf8_lossy(&data);
            let Some(next) = crate::mapping_value::append(&current, applications) else {
                return Ok(false);
            };
            if next.len() > crate::mapping_value::MAX_VALUE_BYTES {
                return Err(Round::Unreadable(format!(
                    "{path}: appending would make the value {} bytes, over the {}-byte limit \
                     its readers keep to",
                    next.len(),
                    crate::mapping_value::MAX_VALUE_BYTES
                )));
            }
            match client
                .set_data(path, next.as_bytes(), Some(stat.version))
                .await
            {
                Ok(_) => Ok(true),
                Err(Error::BadVersion | Error::NoNode) => Err(Round::Lost),
                Err(err) => Err(Round::Failed(err)),
            }
        }
        Err(Error::NoNode) => {
            let Some(value) = crate::mapping_value::append("", applications) else {
                return Ok(false);
            };
            let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
            if let Some((parent, _)) = path.rsplit_once('/')
                && let Err(err) = client.mkdir(parent, &options).await
            {
                return Err(Round::Failed(err));
            }
            match client.create(path, value.as_bytes(), &options).await {
                Ok(_) => Ok(true),
                Err(Error::NodeExists) => Err(Round::Lost),
                Err(err) => Err(Round::Failed(err)),
            }
        }
        Err(err) => Err(Round::Failed(err)),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// 100 ms doubling per failure up to [`MAX_BACKOFF`], jittered.
fn backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(100).saturating_mul(1 << failures.min(6));
    jitter(base.min(MAX_BACKOFF)) + base.min(MAX_BACKOFF) / 2
}

/// A random duration below `limit`.
fn jitter(limit: Duration) -> Duration {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let limit_ms = limit.as_millis().max(1) as u64;
    Duration::from_millis(bits % limit_ms)
}

/// The ZooKeeper-mode write stage: pairs the outbox committed, merged by the debouncer, handed
/// to the writer's queue. Runs until the outbox's change feed closes.
pub async fn feed(
    config: crate::debounce::DebounceConfig,
    changes: tokio::sync::mpsc::Receiver<crate::store::StoredChange>,
    writer: Arc<ZkWriter>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    crate::debounce::run(
        config,
        changes,
        |batch: crate::debounce::Batch<crate::store::StoredChange>| {
            metrics.flushed(batch.events, batch.first_event);
            writer.enqueue(batch.value.delta);
            std::future::ready(())
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert!(backoff(0) >= Duration::from_millis(50));
        assert!(backoff(0) < Duration::from_millis(150));
        assert!(backoff(30) <= MAX_BACKOFF + MAX_BACKOFF / 2);
        assert!(backoff(30) >= MAX_BACKOFF / 2);
    }
}
