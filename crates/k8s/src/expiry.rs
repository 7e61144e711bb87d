//! Applications whose registering pods are all gone leave their mappings; a live one never does.
//!
//! Each ServiceNameMapping records which pods registered each application (see
//! [`crate::mapping::registrants`]). Every scan, this loop checks those pods against the pod
//! watch: an application whose recorded pods have all been missing for `mapping.expireAfter`
//! is due. Before removing it, the object is read fresh and the decision taken again on what
//! it records now (a re-registration adds a pod that exists); the write carries the
//! resourceVersion it was read at, so a registration or another replica writing meanwhile makes
//! it fail with 409 and the next scan decides again. An application whose pair still waits in
//! this replica's outbox is never removed. Pinned applications (registered without a pod
//! identity) and applications without a record never expire.
//!
//! One window remains: a new pod's registration acknowledged just before the removal's write
//! lands reaches the object only after it (its write waits for the debounce and one upsert), so
//! consumers may see the application leave and come back within that time. It is never lost:
//! the pair stays in the outbox until written, and the writer re-creates what was removed.
//!
//! The countdown lives in memory: after a restart it starts again, which only ever delays a
//! removal.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use tokio::sync::watch;
use tokio::time::Instant;

use super::cluster::ClusterView;
use super::crd::ServiceNameMapping;
use crate::auth::pods::PodView;
use crate::mapping::MappingKey;
use crate::mapping::registrants::{self, Pods};
use crate::store::Outbox;

/// Removals per scan at most, so a mass expiry (a namespace deleted) does not flood the API
/// server; the rest are due again at the next scan.
const MAX_REMOVALS_PER_SCAN: usize = 50;
/// API requests per second the expiry loop makes at most (reads of objects and pods, writes):
/// it is background work and must not take the registrations' share of the API server.
const REQUESTS_PER_SECOND: f64 = 10.0;
/// Longest wait for one API request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the expiry loop counts (`/metrics`).
#[derive(Debug, Default)]
pub struct ExpiryStats {
    /// Applications removed because their pods were gone.
    pub expired: AtomicU64,
    /// Applications whose pods are all gone, counting down.
    pub pending: AtomicI64,
    /// Scans done.
    pub scans: AtomicU64,
    /// Removals that lost a race (409) or failed; decided again at the next scan.
    pub aborted: AtomicU64,
}

impl ExpiryStats {
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        use crate::metrics::{scraped_counter, scraped_gauge};
        scraped_counter(
            registry,
            "mapping_expired_applications",
            "Applications removed from mappings because no pod that registered them existed for mapping.expireAfter",
            self,
            |s| s.expired.load(Ordering::Relaxed),
        );
        scraped_gauge(
            registry,
            "mapping_pending_expiries",
            "Applications whose registering pods are all gone, waiting out mapping.expireAfter",
            self,
            |s| s.pending.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "mapping_expiry_scans",
            "Scans of the registrant records against the pod watch",
            self,
            |s| s.scans.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "mapping_expiry_aborted",
            "Removals given up because the object changed (a registration, another replica) or the write failed",
            self,
            |s| s.aborted.load(Ordering::Relaxed),
        );
    }
}

/// Since when each recorded pod has been missing from the pod watch.
#[derive(Debug, Default)]
pub struct Countdown {
    missing_since: HashMap<(String, String), Instant>,
}

/// What the countdown says about one application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A recorded pod exists.
    Alive,
    /// Every recorded pod is gone, the last one for less than `expireAfter`.
    Waiting,
    /// Every recorded pod has been gone for `expireAfter`.
    Due,
}

impl Countdown {
    /// Judges `pods` of `namespace` at `now`, noting when each was first seen missing.
    pub fn judge(
        &mut self,
        namespace: &str,
        pods: &BTreeSet<String>,
        exists: impl Fn(&str) -> bool,
        expire_after: Duration,
        now: Instant,
    ) -> Verdict {
        let mut alive = false;
        let mut latest_loss: Option<Instant> = None;
        for pod in pods {
            let id = (namespace.to_owned(), pod.clone());
            if exists(pod) {
                self.missing_since.remove(&id);
                alive = true;
            } else {
                let since = *self.missing_since.entry(id).or_insert(now);
                latest_loss = Some(latest_loss.map_or(since, |l| l.max(since)));
            }
        }
        match latest_loss {
            _ if alive => Verdict::Alive,
            Some(lost) if now.duration_since(lost) >= expire_after => Verdict::Due,
            _ => Verdict::Waiting,
        }
    }

    /// Pods of `pods` missing for at least `expire_after`: what a record of a live application
    /// can drop (it keeps a live pod), so records of rolling deployments stay small.
    pub fn long_gone(
        &self,
        namespace: &str,
        pods: &BTreeSet<String>,
        expire_after: Duration,
        now: Instant,
    ) -> BTreeSet<String> {
        pods.iter()
            .filter(|pod| {
                self.missing_since
                    .get(&(namespace.to_owned(), (*pod).clone()))
                    .is_some_and(|since| now.duration_since(*since) >= expire_after)
            })
            .cloned()
            .collect()
    }

    /// Forgets pods no record names any more.
    pub fn retain(&mut self, recorded: &HashSet<(String, String)>) {
        self.missing_since.retain(|id, _| recorded.contains(id));
    }
}

/// What a rewrite of a record does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Expire,
    Prune,
}

/// The expiry loop of one replica.
pub struct Expiry {
    client: kube::Client,
    cluster: Arc<ClusterView>,
    pods: Arc<PodView>,
    outbox: Outbox,
    expire_after: Duration,
    stats: Arc<ExpiryStats>,
    limiter: crate::ratelimit::RateLimiter,
}

impl Expiry {
    pub fn new(
        client: kube::Client,
        cluster: Arc<ClusterView>,
        pods: Arc<PodView>,
        outbox: Outbox,
        expire_after: Duration,
    ) -> Self {
        Self {
            client,
            cluster,
            pods,
            outbox,
            expire_after,
            stats: Arc::new(ExpiryStats::default()),
            limiter: crate::ratelimit::RateLimiter::new(REQUESTS_PER_SECOND, 20),
        }
    }

    pub fn stats(&self) -> Arc<ExpiryStats> {
        self.stats.clone()
    }

    /// How often records are checked: often enough that removal comes soon after it is due.
    fn scan_interval(&self) -> Duration {
        (self.expire_after / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
    }

    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut countdown = Countdown::default();
        let mut ticks = tokio::time::interval(self.scan_interval());
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = crate::shutdown::signalled(&mut shutdown) => return,
                _ = ticks.tick() => {}
            }
            // Before the first pod list every pod looks missing.
            if !self.pods.is_synced() {
                continue;
            }
            let mut due = self.scan(&mut countdown);
            // Start elsewhere each scan, so entries that keep failing do not starve the rest.
            if !due.is_empty() {
                let start = self.stats.scans.load(Ordering::Relaxed) as usize % due.len();
                due.rotate_left(start);
            }
            for (key, application) in due.into_iter().take(MAX_REMOVALS_PER_SCAN) {
                if *shutdown.borrow() {
                    return;
                }
                self.remove(&key, &application, &mut countdown).await;
            }
            self.stats.scans.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Judges every tracked application; returns what to rewrite: applications due, and
    /// records of live applications that name pods long gone.
    fn scan(&self, countdown: &mut Countdown) -> Vec<(MappingKey, String)> {
        let now = Instant::now();
        let mut recorded = HashSet::new();
        let mut due = Vec::new();
        let mut waiting = 0i64;
        for (key, applications, record) in self.cluster.records() {
            for (application, pods) in &record {
                let Pods::Tracked(pods) = pods else { continue };
                if !applications.contains(application) {
                    continue;
                }
                recorded.extend(pods.iter().map(|p| (key.namespace.clone(), p.clone())));
                let verdict = countdown.judge(
                    &key.namespace,
                    pods,
                    |pod| self.pods.contains(&key.namespace, pod),
                    self.expire_after,
                    now,
                );
                match verdict {
                    Verdict::Alive => {
                        let stale =
                            countdown.long_gone(&key.namespace, pods, self.expire_after, now);
                        if !stale.is_empty() {
                            due.push((key.clone(), application.clone()));
                        }
                    }
                    // A registration of it waits to be written here: it is coming back.
                    _ if self.outbox.holds(&key, application) => {}
                    Verdict::Waiting => waiting += 1,
                    Verdict::Due => due.push((key.clone(), application.clone())),
                }
            }
        }
        countdown.retain(&recorded);
        self.stats.pending.store(waiting, Ordering::Relaxed);
        due
    }

    /// The recorded pods the API server says are gone (not found, or that name now belongs
    /// to another pod); any other answer keeps a pod.
    async fn confirmed_gone(&self, namespace: &str, pods: &BTreeSet<String>) -> BTreeSet<String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let mut gone = BTreeSet::new();
        for entry in pods {
            let (name, uid) = registrants::split_entry(entry);
            self.limiter.acquire().await;
            match tokio::time::timeout(REQUEST_TIMEOUT, api.get_opt(name)).await {
                Ok(Ok(None)) => {
                    gone.insert(entry.clone());
                }
                Ok(Ok(Some(pod))) if uid.is_some() && pod.metadata.uid.as_deref() != uid => {
                    gone.insert(entry.clone());
                }
                Ok(Ok(Some(_))) => {
                    tracing::info!(
                        namespace,
                        pod = entry,
                        "a recorded pod exists though the watch misses it"
                    );
                }
                _ => {}
            }
        }
        gone
    }

    /// Removes `application` from `key`'s object if, read fresh, it is still due; or drops the
    /// long-gone pods from the record of a live one.
    async fn remove(&self, key: &MappingKey, application: &str, countdown: &mut Countdown) {
        let api: Api<ServiceNameMapping> = Api::namespaced(self.client.clone(), &key.namespace);
        for name in self.cluster.names_of(key) {
            self.limiter.acquire().await;
            let fresh = match tokio::time::timeout(REQUEST_TIMEOUT, api.get_opt(&name)).await {
                Ok(Ok(Some(object))) => object,
                Ok(Ok(None)) => continue,
                Ok(Err(err)) => {
                    tracing::warn!(%key, error = %err, "cannot read a mapping to expire; next scan");
                    self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(_) => {
                    self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            if fresh.spec.interface_name != key.interface
                || !fresh
                    .spec
                    .application_names
                    .iter()
                    .any(|a| a == application)
            {
                continue;
            }
            let Some(mut record) = fresh
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(registrants::ANNOTATION))
                .and_then(|text| registrants::parse(text))
            else {
                continue;
            };
            // The decision again, on what the object records now.
            let Some(Pods::Tracked(pods)) = record.get(application).cloned() else {
                continue;
            };
            let now = Instant::now();
            let verdict = countdown.judge(
                &key.namespace,
                &pods,
                |pod| self.pods.contains(&key.namespace, pod),
                self.expire_after,
                now,
            );
            let mut updated = fresh.clone();
            let (action, gone) = match verdict {
                Verdict::Due if !self.outbox.holds(key, application) => {
                    record.remove(application);
                    updated.spec.application_names.retain(|a| a != application);
                    (Action::Expire, pods)
                }
                Verdict::Alive => {
                    let stale = countdown.long_gone(&key.namespace, &pods, self.expire_after, now);
                    if stale.is_empty() {
                        continue;
                    }
                    let live: BTreeSet<String> = pods.difference(&stale).cloned().collect();
                    record.insert(application.to_owned(), Pods::Tracked(live));
                    (Action::Prune, stale)
                }
                _ => continue,
            };
            // The watch may lag or be cut: before an application goes, or a pod leaves a
            // record, the pods are asked for one by one; any answer but "gone" keeps them.
            let confirmed = self.confirmed_gone(&key.namespace, &gone).await;
            if confirmed != gone {
                self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // A registration committed here while the pods were asked for: it is coming back.
            if action == Action::Expire && self.outbox.holds(key, application) {
                return;
            }
            let annotations = updated.metadata.annotations.get_or_insert_default();
            if record.is_empty() {
                annotations.remove(registrants::ANNOTATION);
            } else {
                annotations.insert(
                    registrants::ANNOTATION.to_owned(),
                    registrants::format(&record),
                );
            }
            self.limiter.acquire().await;
            let result = if updated.spec.application_names.is_empty() {
                // Its last application: the object goes, if nobody wrote it since the read.
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: fresh.metadata.resource_version.clone(),
                        uid: fresh.metadata.uid.clone(),
                    }),
                    ..DeleteParams::default()
                };
                tokio::time::timeout(REQUEST_TIMEOUT, api.delete(&name, &params))
                    .await
                    .map(|r| r.map(|_| ()))
            } else {
                // `updated` carries the resourceVersion it was read at: the precondition.
                tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    api.replace(&name, &PostParams::default(), &updated),
                )
                .await
                .map(|r| r.map(|_| ()))
            };
            match result {
                Ok(Ok(())) if action == Action::Expire => {
                    self.stats.expired.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%key, application, pods = ?gone, after = ?self.expire_after,
                        "application expired: none of its registering pods exists");
                }
                Ok(Ok(())) => {
                    tracing::debug!(%key, application, pods = ?gone, "long-gone pods dropped from the record");
                }
                Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                    self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%key, application, "mapping changed meanwhile; decided again next scan");
                }
                Ok(Err(err)) => {
                    self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%key, application, error = %err, "cannot expire an application; next scan");
                }
                Err(_) => {
                    self.stats.aborted.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn due_only_after_the_last_pod_has_been_gone_for_the_whole_period() {
        let mut countdown = Countdown::default();
        let expire = Duration::from_secs(60);
        let recorded = pods(&["p1", "p2"]);
        let mut alive: HashSet<&str> = ["p1", "p2"].into();
        let judge = |c: &mut Countdown, alive: &HashSet<&str>| {
            c.judge(
                "ns",
                &recorded,
                |p| alive.contains(p),
                expire,
                Instant::now(),
            )
        };
        assert_eq!(judge(&mut countdown, &alive), Verdict::Alive);
        alive.remove("p1");
        assert_eq!(judge(&mut countdown, &alive), Verdict::Alive);
        tokio::time::advance(Duration::from_secs(50)).await;
        alive.remove("p2");
        assert_eq!(judge(&mut countdown, &alive), Verdict::Waiting);
        // p1 has been gone 60 s, p2 only 10 s: still waiting.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(judge(&mut countdown, &alive), Verdict::Waiting);
        tokio::time::advance(Duration::from_secs(50)).await;
        assert_eq!(judge(&mut countdown, &alive), Verdict::Due);
        // A pod that comes back (a StatefulSet's pod, same name) cancels it.
        alive.insert("p2");
        assert_eq!(judge(&mut countdown, &alive), Verdict::Alive);
        alive.remove("p2");
        assert_eq!(
            judge(&mut countdown, &alive),
            Verdict::Waiting,
            "counts from zero again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_registering_pod_cancels_the_countdown() {
        let mut countdown = Countdown::default();
        let expire = Duration::from_secs(60);
        let none = |_: &str| false;
        let now = Instant::now;
        assert_eq!(
            countdown.judge("ns", &pods(&["old"]), none, expire, now()),
            Verdict::Waiting
        );
        tokio::time::advance(Duration::from_secs(59)).await;
        // The record now names a pod that exists (a re-registration).
        let with_new = pods(&["old", "new"]);
        assert_eq!(
            countdown.judge("ns", &with_new, |p| p == "new", expire, now()),
            Verdict::Alive
        );
        // A pod recorded but never seen existing counts from when it was first missed.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            countdown.judge("ns", &with_new, none, expire, now()),
            Verdict::Waiting
        );
        countdown.retain(&HashSet::new());
        assert!(countdown.missing_since.is_empty());
    }
}
