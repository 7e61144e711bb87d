//! What the watch sees of the mapping nodes, for the outbox: a pair a node lists needs no write.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::mapping::registrants::{Pods, SharedRegistrants};
use crate::mapping::{MappingKey, SharedMappings};

/// The mappings in the ensemble; the watch is its only writer.
#[derive(Default)]
pub struct ZkView {
    applications: Arc<SharedMappings>,
    /// Every application of a mapping node, pinned: ZooKeeper keeps no registering pods, so a
    /// pair the node lists needs no write whoever registers it again.
    registrants: Arc<SharedRegistrants>,
}

impl ZkView {
    /// The applications per key, shared with the outbox.
    pub fn applications(&self) -> Arc<SharedMappings> {
        self.applications.clone()
    }

    /// The pinned records per key, shared with the outbox.
    pub fn registrants(&self) -> Arc<SharedRegistrants> {
        self.registrants.clone()
    }

    pub(crate) fn set(&self, key: &MappingKey, applications: &[String]) {
        if applications.is_empty() {
            self.remove(key);
            return;
        }
        self.applications
            .insert(key.clone(), applications.iter().cloned().collect());
        self.registrants.insert(
            key.clone(),
            applications
                .iter()
                .map(|app| (app.clone(), Pods::Pinned))
                .collect(),
        );
    }

    pub(crate) fn remove(&self, key: &MappingKey) {
        self.applications.remove(key);
        self.registrants.remove(key);
    }

    /// Replaces everything with a fresh list.
    pub(crate) fn reset<'a>(
        &self,
        listed: impl IntoIterator<Item = (&'a MappingKey, &'a [String])>,
    ) {
        let listed: BTreeMap<&MappingKey, &[String]> = listed.into_iter().collect();
        self.applications.retain(|key, _| listed.contains_key(key));
        self.registrants.retain(|key, _| listed.contains_key(key));
        for (key, applications) in listed {
            self.set(key, applications);
        }
    }
}
