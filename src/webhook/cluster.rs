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
use super::inject::{CA_LABEL, REGISTRY_LABELS};

fn wanted(key: &str) -> bool {
    key == CA_LABEL || REGISTRY_LABELS.iter().any(|(label, _)| *label == key)
}

/// The labels of `labels` the webhook reads, with value `"true"`.
fn kept(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, v)| wanted(k) && v.as_str() == "true")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[derive(Default)]
pub struct ClusterLookup {
    /// Namespace -> its injection labels (only namespaces that have some).
    namespaces: RwLock<HashMap<String, BTreeMap<String, String>>>,
    /// (namespace, registry label) -> Service names carrying it.
    services: RwLock<HashMap<(String, String), BTreeSet<String>>>,
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
    fn set_namespace(map: &mut HashMap<String, BTreeMap<String, String>>, ns: &Namespace) {
        let labels = kept(ns.labels());
        if labels.is_empty() {
            map.remove(&ns.name_any());
        } else {
            map.insert(ns.name_any(), labels);
        }
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
