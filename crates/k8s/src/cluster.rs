//! What the ServiceNameMapping watch sees in the cluster, for the two other users of it: the
//! outbox (a pair the cluster holds needs no write) and the writer (which object already holds
//! an interface, and which names are taken).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;

use crate::mapping::registrants::{Pods, Registrants, SharedRegistrants};
use crate::mapping::{MappingKey, SharedMappings};

/// One watched object as the control plane understands it.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchedMapping {
    pub key: MappingKey,
    pub applications: BTreeSet<String>,
    /// Its registrant record (annotation); empty when it has none or it does not parse.
    pub registrants: Registrants,
}

/// The watched mappings; the watch is its only writer.
#[derive(Default)]
pub struct ClusterView {
    /// Objects by client key (`<name>/<namespace>`).
    objects: Mutex<BTreeMap<String, (String, WatchedMapping)>>,
    /// Applications per key, the union over every object holding it.
    applications: Arc<SharedMappings>,
    /// Names of the objects holding each key.
    names: DashMap<MappingKey, BTreeSet<String>>,
    /// Registering pods per key, merged over every object holding it (pinned wins).
    registrants: Arc<SharedRegistrants>,
}

impl ClusterView {
    /// The applications per key, shared with the outbox.
    pub fn applications(&self) -> Arc<SharedMappings> {
        self.applications.clone()
    }

    /// The registrant records per key, shared with the outbox.
    pub fn registrants(&self) -> Arc<SharedRegistrants> {
        self.registrants.clone()
    }

    /// Every key with a registrant record and its applications, for the expiry loop.
    pub fn records(&self) -> Vec<(MappingKey, BTreeSet<String>, Registrants)> {
        self.registrants
            .iter()
            .map(|entry| {
                let applications = self
                    .applications
                    .get(entry.key())
                    .map(|apps| apps.clone())
                    .unwrap_or_default();
                (entry.key().clone(), applications, entry.value().clone())
            })
            .collect()
    }

    /// Names of the objects that hold `key`, sorted.
    pub fn names_of(&self, key: &MappingKey) -> Vec<String> {
        self.names
            .get(key)
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn snapshot(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        self.applications
            .iter()
            .map(|entry| (entry.key().clone(), entry.value().clone()))
            .collect()
    }

    pub fn apply(&self, client_key: &str, name: &str, mapping: WatchedMapping) {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        let key = mapping.key.clone();
        let previous = objects.insert(client_key.to_owned(), (name.to_owned(), mapping));
        self.refresh(&objects, &key);
        if let Some((_, previous)) = previous.filter(|(_, p)| p.key != key) {
            self.refresh(&objects, &previous.key);
        }
    }

    pub fn delete(&self, client_key: &str) {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, removed)) = objects.remove(client_key) {
            self.refresh(&objects, &removed.key);
        }
    }

    /// Replaces everything with a fresh list.
    pub fn reset(&self, listed: BTreeMap<String, (String, WatchedMapping)>) {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        *objects = listed;
        self.applications.clear();
        self.names.clear();
        self.registrants.clear();
        for (name, mapping) in objects.values() {
            self.applications
                .entry(mapping.key.clone())
                .or_default()
                .extend(mapping.applications.iter().cloned());
            self.names
                .entry(mapping.key.clone())
                .or_default()
                .insert(name.clone());
            if !mapping.registrants.is_empty() {
                union(
                    &mut self.registrants.entry(mapping.key.clone()).or_default(),
                    &mapping.registrants,
                );
            }
        }
    }

    /// Recomputes the applications and names of `key` from every object that holds it.
    fn refresh(&self, objects: &BTreeMap<String, (String, WatchedMapping)>, key: &MappingKey) {
        let holding = objects.values().filter(|(_, m)| &m.key == key);
        let mut applications = BTreeSet::new();
        let mut names = BTreeSet::new();
        let mut registrants = Registrants::new();
        for (name, mapping) in holding {
            applications.extend(mapping.applications.iter().cloned());
            names.insert(name.clone());
            union(&mut registrants, &mapping.registrants);
        }
        if registrants.is_empty() {
            self.registrants.remove(key);
        } else {
            self.registrants.insert(key.clone(), registrants);
        }
        if names.is_empty() {
            self.applications.remove(key);
            self.names.remove(key);
        } else {
            self.applications.insert(key.clone(), applications);
            self.names.insert(key.clone(), names);
        }
    }
}

/// Adds `other`'s records to `into`: pods add up, and a pinned application stays pinned.
fn union(into: &mut Registrants, other: &Registrants) {
    for (application, pods) in other {
        match (into.get_mut(application), pods) {
            (Some(Pods::Pinned), _) => {}
            (Some(known), Pods::Pinned) => *known = Pods::Pinned,
            (Some(Pods::Tracked(known)), Pods::Tracked(more)) => known.extend(more.iter().cloned()),
            (None, pods) => {
                into.insert(application.clone(), pods.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(interface: &str, apps: &[&str]) -> WatchedMapping {
        WatchedMapping {
            key: MappingKey::new("ns", interface),
            applications: apps.iter().map(|a| a.to_string()).collect(),
            registrants: Registrants::new(),
        }
    }

    #[test]
    fn union_over_objects_and_names_per_key() {
        let view = ClusterView::default();
        view.apply("a/ns", "a", mapping("I", &["x"]));
        view.apply("b/ns", "b", mapping("I", &["y"]));
        let key = MappingKey::new("ns", "I");
        assert_eq!(view.names_of(&key), vec!["a", "b"]);
        assert_eq!(view.snapshot().get(&key).map(BTreeSet::len), Some(2));
        // An edit that moves object b to another interface.
        view.apply("b/ns", "b", mapping("J", &["y"]));
        assert_eq!(view.names_of(&key), vec!["a"]);
        view.delete("a/ns");
        assert!(view.names_of(&key).is_empty());
        assert!(!view.applications().contains_key(&key));
    }
}
