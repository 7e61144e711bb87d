//! What the webhook reads of the cluster, from watches rather than a list per admission: the
//! injection labels of every namespace, and the Services carrying a registry label. Only those
//! labels are kept, so memory grows with what asks for injection, not with the cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::Lookup;
use super::agent::AGENT_LABEL;
use super::inject::{CA_LABEL, REGISTRY_LABELS};
use super::xds::XDS_LABEL;

fn wanted(key: &str) -> bool {
    [CA_LABEL, XDS_LABEL, AGENT_LABEL].contains(&key)
        || REGISTRY_LABELS.iter().any(|(label, _)| *label == key)
}

/// The labels of `labels` the webhook reads, with value `"true"`.
fn kept(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, v)| wanted(k) && v.as_str() == "true")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

pub struct ClusterLookup {
    /// Every namespace -> its injection labels (often none).
    namespaces: RwLock<HashMap<String, BTreeMap<String, String>>>,
    /// (namespace, registry label) -> Service names carrying it.
    services: RwLock<HashMap<(String, String), BTreeSet<String>>>,
    /// Both watches have listed once.
    synced: watch::Sender<bool>,
    client: Client,
}

impl Lookup for ClusterLookup {
    fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        self.namespaces
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(namespace)
            .cloned()
            .unwrap_or_default()
    }

    fn service_with_label(&self, namespace: &str, label: &str) -> Option<String> {
        self.services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_owned(), label.to_owned()))
            .and_then(|names| names.first().cloned())
    }
}

impl ClusterLookup {
    pub fn new(client: Client) -> ClusterLookup {
        ClusterLookup {
            namespaces: RwLock::default(),
            services: RwLock::default(),
            synced: watch::channel(false).0,
            client,
        }
    }

    /// Before a review: waits until the watches have listed once, and reads a namespace the
    /// watch has not delivered yet (created just before its pods) from the API server. The
    /// caller bounds the wait.
    pub async fn prepare(&self, namespace: &str) {
        let mut synced = self.synced.subscribe();
        let _ = synced.wait_for(|synced| *synced).await;
        let known = self
            .namespaces
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(namespace);
        if known {
            return;
        }
        match Api::<Namespace>::all(self.client.clone())
            .get_opt(namespace)
            .await
        {
            Ok(Some(ns)) => Self::set_namespace(
                &mut self.namespaces.write().unwrap_or_else(|p| p.into_inner()),
                &ns,
            ),
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(error = %err, namespace, "webhook: cannot read the namespace")
            }
        }
    }

    fn set_namespace(map: &mut HashMap<String, BTreeMap<String, String>>, ns: &Namespace) {
        map.insert(ns.name_any(), kept(ns.labels()));
    }

    fn set_service(
        map: &mut HashMap<(String, String), BTreeSet<String>>,
        service: &Service,
        present: bool,
    ) {
        let namespace = service.namespace().unwrap_or_default();
        let name = service.name_any();
        let labels = kept(service.labels());
        for (label, _) in REGISTRY_LABELS {
            let key = (namespace.clone(), label.to_owned());
            if present && labels.contains_key(label) {
                map.entry(key).or_default().insert(name.clone());
            } else if let Some(names) = map.get_mut(&key) {
                names.remove(&name);
                if names.is_empty() {
                    map.remove(&key);
                }
            }
        }
    }

    /// Follows namespaces and Services until shutdown.
    pub async fn run(self: Arc<Self>, client: Client, mut shutdown: watch::Receiver<bool>) {
        let mut namespaces = Box::pin(
            watcher(
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff(),
        );
        let mut services = Box::pin(
            watcher(Api::<Service>::all(client), watcher::Config::default()).default_backoff(),
        );
        let mut ns_relist: Option<HashMap<String, BTreeMap<String, String>>> = None;
        let mut svc_relist: Option<HashMap<(String, String), BTreeSet<String>>> = None;
        let (mut ns_listed, mut svc_listed) = (false, false);
        loop {
            tokio::select! {
                _ = crate::shutdown::signalled(&mut shutdown) => return,
                Some(event) = namespaces.next() => match event {
                    Ok(Event::Init) => ns_relist = Some(HashMap::new()),
                    Ok(Event::InitApply(ns)) => {
                        if let Some(map) = ns_relist.as_mut() {
                            Self::set_namespace(map, &ns);
                        }
                    }
                    Ok(Event::InitDone) => {
                        if let Some(map) = ns_relist.take() {
                            *self.namespaces.write().unwrap_or_else(|p| p.into_inner()) = map;
                        }
                        ns_listed = true;
                        if svc_listed {
                            self.synced.send_replace(true);
                        }
                    }
                    Ok(Event::Apply(ns)) => {
                        Self::set_namespace(&mut self.namespaces.write().unwrap_or_else(|p| p.into_inner()), &ns);
                    }
                    Ok(Event::Delete(ns)) => {
                        self.namespaces.write().unwrap_or_else(|p| p.into_inner()).remove(&ns.name_any());
                    }
                    Err(err) => tracing::warn!(error = %err, "webhook: namespace watch failed"),
                },
                Some(event) = services.next() => match event {
                    Ok(Event::Init) => svc_relist = Some(HashMap::new()),
                    Ok(Event::InitApply(service)) => {
                        if let Some(map) = svc_relist.as_mut() {
                            Self::set_service(map, &service, true);
                        }
                    }
                    Ok(Event::InitDone) => {
                        if let Some(map) = svc_relist.take() {
                            *self.services.write().unwrap_or_else(|p| p.into_inner()) = map;
                        }
                        svc_listed = true;
                        if ns_listed {
                            self.synced.send_replace(true);
                        }
                    }
                    Ok(Event::Apply(service)) => {
                        Self::set_service(&mut self.services.write().unwrap_or_else(|p| p.into_inner()), &service, true);
                    }
                    Ok(Event::Delete(service)) => {
                        Self::set_service(&mut self.services.write().unwrap_or_else(|p| p.into_inner()), &service, false);
                    }
                    Err(err) => tracing::warn!(error = %err, "webhook: Service watch failed"),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kube::api::ObjectMeta;

    fn service(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }
    }

    #[test]
    fn services_by_label_first_by_name_and_removed_when_unlabelled_or_deleted() {
        let mut map = HashMap::new();
        let zk = "registry-zookeeper-inject";
        ClusterLookup::set_service(&mut map, &service("demo", "zk-b", &[(zk, "true")]), true);
        ClusterLookup::set_service(&mut map, &service("demo", "zk-a", &[(zk, "true")]), true);
        ClusterLookup::set_service(&mut map, &service("demo", "other", &[(zk, "false")]), true);
        let first = |map: &HashMap<(String, String), BTreeSet<String>>| {
            map.get(&("demo".to_owned(), zk.to_owned()))
                .and_then(|s| s.first().cloned())
        };
        assert_eq!(first(&map).as_deref(), Some("zk-a"));
        // The label removed by an edit, then the other one deleted.
        ClusterLookup::set_service(&mut map, &service("demo", "zk-a", &[]), true);
        assert_eq!(first(&map).as_deref(), Some("zk-b"));
        ClusterLookup::set_service(&mut map, &service("demo", "zk-b", &[(zk, "true")]), false);
        assert!(map.is_empty(), "{map:?}");
    }

    #[test]
    fn only_injection_labels_with_true_are_kept() {
        let labels: BTreeMap<String, String> = [
            ("dubbo-ca.inject", "true"),
            ("dubbo-xds.inject", "true"),
            ("dubbo-agent.inject", "true"),
            ("registry-nacos-inject", "false"),
            ("app", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let kept: Vec<String> = kept(&labels).into_keys().collect();
        assert_eq!(
            kept,
            ["dubbo-agent.inject", "dubbo-ca.inject", "dubbo-xds.inject"]
        );
    }
}
