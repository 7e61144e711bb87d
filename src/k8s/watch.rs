//! The watch of ServiceNameMapping objects: list, then watch from the list's resourceVersion,
//! resume after disconnects and re-list after 410 Gone (kube-runtime's watcher does these). Each
//! change reaches the index exactly as the control plane's own writes do, so kubectl edits flow
//! out to every discovery stream. After each (re-)list the whole state is reconciled, so objects
//! deleted while the watch was down disappear, and only real changes are pushed.
//!
//! Objects are read as dynamic objects and converted one by one: one that does not deserialize
//! is logged and skipped instead of failing the whole list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::crd::{ServiceNameMapping, ServiceNameMappingSpec};
use crate::index::{Index, Kind};
use crate::mapping::{MappingKey, SharedMappings, client_key};
use crate::resources::mapping_any;
use crate::shutdown::signalled;

/// One object as the control plane understands it.
#[derive(Debug, Clone, PartialEq)]
struct WatchedMapping {
    key: MappingKey,
    applications: BTreeSet<String>,
}

/// The watched objects, by client key; mirrored into the index and the shared cluster state.
struct ClusterState {
    objects: BTreeMap<String, WatchedMapping>,
    index: Arc<Index>,
    cluster: Arc<SharedMappings>,
}

impl ClusterState {
    fn apply(&mut self, client_key: String, mapping: WatchedMapping) {
        let any = mapping_any(
            &client_key,
            &mapping.key.interface,
            mapping.applications.iter().cloned(),
        );
        let previous = self.objects.insert(client_key.clone(), mapping.clone());
        self.refresh_cluster(&mapping.key);
        if let Some(previous) = previous.filter(|p| p.key != mapping.key) {
            self.refresh_cluster(&previous.key);
        }
        self.index
            .apply(Kind::ServiceNameMapping, [(client_key, any)], [], 0);
    }

    fn delete(&mut self, client_key: String) {
        if let Some(removed) = self.objects.remove(&client_key) {
            self.refresh_cluster(&removed.key);
        }
        self.index
            .apply(Kind::ServiceNameMapping, [], [client_key], 0);
    }

    /// Replaces everything with a fresh list; the index publishes only if the state differs.
    fn reset(&mut self, objects: BTreeMap<String, WatchedMapping>) {
        let anys = objects
            .iter()
            .map(|(client_key, m)| {
                let any = mapping_any(client_key, &m.key.interface, m.applications.iter().cloned());
                (client_key.clone(), any)
            })
            .collect();
        self.objects = objects;
        self.cluster.clear();
        for mapping in self.objects.values() {
            self.cluster
                .entry(mapping.key.clone())
                .or_default()
                .extend(mapping.applications.iter().cloned());
        }
        self.index.reset(Kind::ServiceNameMapping, anys, 0);
    }

    /// Recomputes the shared applications of `key` from every object that holds it.
    fn refresh_cluster(&self, key: &MappingKey) {
        let applications: BTreeSet<String> = self
            .objects
            .values()
            .filter(|m| &m.key == key)
            .flat_map(|m| m.applications.iter().cloned())
            .collect();
        if applications.is_empty() {
            self.cluster.remove(key);
        } else {
            self.cluster.insert(key.clone(), applications);
        }
    }
}

fn client_key_of(object: &DynamicObject) -> Option<String> {
    let name = object.metadata.name.as_deref()?;
    Some(client_key(
        name,
        object.metadata.namespace.as_deref().unwrap_or_default(),
    ))
}

/// Converts one object; `None` (with a log line) when it is not a usable mapping.
fn parse(object: &DynamicObject) -> Option<(String, WatchedMapping)> {
    let client_key = client_key_of(object)?;
    let spec = object.data.get("spec").cloned().unwrap_or_default();
    let spec: ServiceNameMappingSpec = match serde_json::from_value(spec) {
        Ok(spec) => spec,
        Err(err) => {
            tracing::warn!(object = %client_key, error = %err, "skipping a ServiceNameMapping that does not deserialize");
            return None;
        }
    };
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let mapping = WatchedMapping {
        key: MappingKey::new(namespace, spec.interface_name),
        applications: spec.application_names.into_iter().collect(),
    };
    Some((client_key, mapping))
}

/// Runs the watch until shutdown. Marks the index loaded after the first complete list.
pub async fn run(
    client: Client,
    index: Arc<Index>,
    cluster: Arc<SharedMappings>,
    mut shutdown: watch::Receiver<bool>,
) {
    let resource = ApiResource::erase::<ServiceNameMapping>(&());
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let events = watcher(api, watcher::Config::default()).default_backoff();
    tokio::pin!(events);
    let mut state = ClusterState {
        objects: BTreeMap::new(),
        index: index.clone(),
        cluster,
    };
    let mut listing: Option<BTreeMap<String, WatchedMapping>> = None;
    loop {
        let event = tokio::select! {
            () = signalled(&mut shutdown) => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(err)) => {
                tracing::warn!(error = %err, "ServiceNameMapping watch failed; retrying")
            }
            Some(Ok(Event::Init)) => listing = Some(BTreeMap::new()),
            Some(Ok(Event::InitApply(object))) => {
                if let (Some(listing), Some((client_key, mapping))) =
                    (listing.as_mut(), parse(&object))
                {
                    listing.insert(client_key, mapping);
                }
            }
            Some(Ok(Event::InitDone)) => {
                let listed = listing.take().unwrap_or_default();
                tracing::info!(objects = listed.len(), "ServiceNameMapping list applied");
                state.reset(listed);
                index.mark_loaded();
            }
            Some(Ok(Event::Apply(object))) => {
                if let Some((client_key, mapping)) = parse(&object) {
                    state.apply(client_key, mapping);
                }
            }
            Some(Ok(Event::Delete(object))) => {
                if let Some(client_key) = client_key_of(&object) {
                    state.delete(client_key);
                }
            }
        }
    }
}
