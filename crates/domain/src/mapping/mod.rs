//! Service-name mappings as the control plane understands them: which applications serve an
//! interface in a namespace. No I/O, no protobuf, no Kubernetes here.

mod name;
pub mod registrants;
mod validate;

pub use name::{candidate_names, client_key, label_value, object_name};
pub(crate) use validate::quote;
pub use validate::{
    MAX_APPLICATION_BYTES, MAX_INTERFACE_BYTES, MAX_INTERFACES_PER_REQUEST, ValidationError,
    validate_registration,
};

use std::collections::{BTreeMap, BTreeSet};

use dashmap::DashMap;

/// Applications per key, shared between tasks (committed pairs, the watched cluster state).
pub type SharedMappings = DashMap<MappingKey, BTreeSet<String>>;

/// Whether `map` holds `application` for `key`.
pub fn contains_pair(map: &SharedMappings, key: &MappingKey, application: &str) -> bool {
    map.get(key).is_some_and(|apps| apps.contains(application))
}

/// One ServiceNameMapping object: an interface within a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappingKey {
    pub namespace: String,
    pub interface: String,
}

impl MappingKey {
    pub fn new(namespace: impl Into<String>, interface: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            interface: interface.into(),
        }
    }
}

impl std::fmt::Display for MappingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.interface)
    }
}

/// A validated registration: `application` serves every interface in `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub namespace: String,
    pub application: String,
    /// Sorted and free of duplicates.
    pub interfaces: BTreeSet<String>,
    /// The registering pod, in `namespace` (Kubernetes mode, from the caller's bound token):
    /// recorded so the application can expire once its pods are gone. `None`: never expires.
    pub pod: Option<String>,
}

impl Registration {
    /// Roughly what the registration occupies in memory while it waits for a commit.
    pub fn size_bytes(&self) -> usize {
        const OVERHEAD: usize = 64;
        OVERHEAD
            + self.namespace.len()
            + self.application.len()
            + self.pod.as_ref().map_or(0, String::len)
            + self
                .interfaces
                .iter()
                .map(|interface| interface.len() + OVERHEAD)
                .sum::<usize>()
    }

    /// The (key, application) pairs this registration asks to be stored.
    pub fn keys(&self) -> impl Iterator<Item = MappingKey> + '_ {
        self.interfaces
            .iter()
            .map(|interface| MappingKey::new(self.namespace.clone(), interface.clone()))
    }
}

/// Applications to add, per key. Mappings only grow by registration, so merging two deltas is
/// a set union and the order in which deltas are merged never matters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingDelta {
    added: BTreeMap<MappingKey, BTreeSet<String>>,
}

impl MappingDelta {
    pub fn add(&mut self, key: MappingKey, application: String) {
        self.added.entry(key).or_default().insert(application);
    }

    pub fn applications(&self, key: &MappingKey) -> Option<&BTreeSet<String>> {
        self.added.get(key)
    }

    pub fn contains(&self, key: &MappingKey, application: &str) -> bool {
        self.added
            .get(key)
            .is_some_and(|apps| apps.contains(application))
    }

    /// Union of both deltas, into `self`.
    pub fn merge(&mut self, other: MappingDelta) {
        for (key, apps) in other.added {
            self.added.entry(key).or_default().extend(apps);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
    }

    /// Number of distinct keys touched.
    pub fn len(&self) -> usize {
        self.added.len()
    }

    /// Number of (key, application) pairs.
    pub fn pairs(&self) -> usize {
        self.added.values().map(BTreeSet::len).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&MappingKey, &BTreeSet<String>)> {
        self.added.iter()
    }

    pub fn into_inner(self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        self.added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_a_union_per_key() {
        let mut a = MappingDelta::default();
        a.add(MappingKey::new("ns", "I1"), "app-a".into());
        let mut b = MappingDelta::default();
        b.add(MappingKey::new("ns", "I1"), "app-b".into());
        b.add(MappingKey::new("ns", "I1"), "app-a".into());
        b.add(MappingKey::new("other", "I1"), "app-a".into());
        a.merge(b);
        assert_eq!(a.len(), 2);
        assert_eq!(a.pairs(), 3);
        let apps: Vec<_> = a
            .iter()
            .next()
            .map(|(_, apps)| apps.clone())
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(apps, vec!["app-a".to_string(), "app-b".to_string()]);
    }

    #[test]
    fn registration_becomes_one_pair_per_interface() {
        let reg = Registration {
            namespace: "ns".into(),
            application: "app".into(),
            interfaces: ["I1", "I2"].iter().map(|s| s.to_string()).collect(),
            pod: None,
        };
        let keys: Vec<MappingKey> = reg.keys().collect();
        assert_eq!(
            keys,
            vec![MappingKey::new("ns", "I1"), MappingKey::new("ns", "I2")]
        );
    }
}
