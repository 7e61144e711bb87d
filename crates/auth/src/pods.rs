//! The pods of the cluster, as far as authentication needs them: a bound service-account token
//! names its pod, and that pod must still exist with the token's UID. A watch keeps a trimmed
//! copy of every pod (name, UID, IPs, labels, annotations), so checking a token costs no API
//! request and keeps working through an API-server outage; a pod the watch has not seen yet
//! (created a moment ago) is read once with a GET.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::{AuthError, PodInfo};
use crate::ratelimit::RateLimiter;
use crate::shutdown::signalled;

/// Longest wait for a pod GET; the caller is told to retry rather than hang.
const GET_TIMEOUT: Duration = Duration::from_secs(5);
/// Annotations that are large and say nothing about identity.
const SKIPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// What is known of a pod named by a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLookup {
    Found(Arc<PodInfo>),
    /// The API server says there is no such pod.
    Missing,
}

/// Pods by (namespace, name), kept by a watch.
pub struct PodView {
    client: kube::Client,
    pods: DashMap<(String, String), Arc<PodInfo>>,
    /// The first list is in: a pod missing from the view may still be new, never old.
    synced: AtomicBool,
    /// Paces the GETs of pods the watch has not seen, shared with TokenReviews.
    requests: Arc<RateLimiter>,
}

impl PodView {
    pub fn new(client: kube::Client, requests: Arc<RateLimiter>) -> Self {
        Self {
            client,
            pods: DashMap::new(),
            synced: AtomicBool::new(false),
            requests,
        }
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Whether the watch sees the recorded pod `entry` (`<name>/<uid>`, see
    /// [`crate::mapping::registrants::pod_entry`]) in `namespace` now: that name with that UID.
    pub fn contains(&self, namespace: &str, entry: &str) -> bool {
        let (name, uid) = crate::mapping::registrants::split_entry(entry);
        self.pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .is_some_and(|pod| uid.is_none_or(|uid| pod.uid == uid))
    }

    /// The pod `namespace/name`: from the watch, else one paced GET.
    pub async fn lookup(&self, namespace: &str, name: &str) -> Result<PodLookup, AuthError> {
        if let Some(pod) = self.pods.get(&(namespace.to_owned(), name.to_owned())) {
            return Ok(PodLookup::Found(pod.clone()));
        }
        if !self.requests.try_acquire() {
            return Err(AuthError::Unavailable(
                "too many API requests for authentication right now; retry shortly".into(),
            ));
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = tokio::time::timeout(GET_TIMEOUT, api.get_opt(name))
            .await
            .map_err(|_| AuthError::Unavailable(format!("no answer for pod {namespace}/{name}")))?
            .map_err(|err| AuthError::Unavailable(format!("cannot read pod: {err}")))?;
        Ok(match pod.as_ref().and_then(pod_info) {
            Some(info) => PodLookup::Found(Arc::new(info)),
            None => PodLookup::Missing,
        })
    }

    /// Keeps the view until shutdown: list, watch, resume, re-list after 410 (kube-runtime).
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let events = watcher(api, watcher::Config::default()).default_backoff();
        tokio::pin!(events);
        // A re-list builds the new view beside the old one, which keeps serving until it is done.
        let mut relist: Option<HashMap<(String, String), Arc<PodInfo>>> = None;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = signalled(&mut shutdown) => return,
            };
            match event {
                None => return,
                Some(Err(err)) => tracing::warn!(error = %err, "pod watch failed; retrying"),
                Some(Ok(Event::Init)) => relist = Some(HashMap::new()),
                Some(Ok(Event::InitApply(pod))) => {
                    if let (Some(relist), Some(key), Some(info)) =
                        (relist.as_mut(), key_of(&pod), pod_info(&pod))
                    {
                        relist.insert(key, Arc::new(info));
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    let listed = relist.take().unwrap_or_default();
                    self.pods.retain(|key, _| listed.contains_key(key));
                    for (key, info) in listed {
                        self.pods.insert(key, info);
                    }
                    self.synced.store(true, Ordering::Release);
                    tracing::debug!(pods = self.pods.len(), "pods listed");
                }
                Some(Ok(Event::Apply(pod))) => {
                    if let (Some(key), Some(info)) = (key_of(&pod), pod_info(&pod)) {
                        self.pods.insert(key, Arc::new(info));
                    }
                }
                Some(Ok(Event::Delete(pod))) => {
                    if let Some(key) = key_of(&pod) {
                        self.pods.remove(&key);
                    }
                }
            }
        }
    }
}

fn key_of(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// The parts of a pod an identity carries; `None` for a pod without a name or UID.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let meta = &pod.metadata;
    let mut ips: Vec<String> = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|ip| ip.ip.clone()).collect())
        .unwrap_or_default();
    if ips.is_empty()
        && let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone())
    {
        ips.push(ip);
    }
    let annotations: BTreeMap<String, String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !SKIPPED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(PodInfo {
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        ips,
        labels: meta.labels.clone().unwrap_or_default(),
        annotations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_trimmed_to_what_an_identity_needs() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "demo", "uid": "u1",
                "labels": {"app": "provider"},
                "annotations": {"a": "b", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}
        }))
        .unwrap();
        let info = pod_info(&pod).unwrap();
        assert_eq!(info.name, "p");
        assert_eq!(info.uid, "u1");
        assert_eq!(info.ips, vec!["10.0.0.1", "fd00::1"]);
        assert_eq!(info.labels.get("app").map(String::as_str), Some("provider"));
        assert_eq!(info.annotations.len(), 1);

        let no_uid: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert!(pod_info(&no_uid).is_none());
    }
}
