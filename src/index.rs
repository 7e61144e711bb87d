//! The state the discovery stream reads: per kind, the current objects and a revision. It is
//! published through a `watch` channel, so readers always see a whole state, never a partial one,
//! and a reader that falls behind skips straight to the newest state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::sync::watch;

use crate::mapping::MappingKey;
use crate::store::StoredChange;

/// All mappings at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingSnapshot {
    pub revision: i64,
    pub mappings: BTreeMap<MappingKey, BTreeSet<String>>,
}

/// Owner of the mapping state; the only writer of its `watch` channel.
pub struct MappingIndex {
    state: watch::Sender<Arc<MappingSnapshot>>,
}

impl MappingIndex {
    pub fn new(initial: MappingSnapshot) -> Self {
        Self {
            state: watch::Sender::new(Arc::new(initial)),
        }
    }

    /// Adds the committed change. Publishes a new snapshot only when something was new, so
    /// subscribers are never woken for an unchanged state. Returns whether it published.
    pub fn apply(&self, change: StoredChange) -> bool {
        self.state.send_if_modified(|current| {
            let added = change.delta.iter().any(|(key, apps)| {
                current
                    .mappings
                    .get(key)
                    .is_none_or(|stored| !apps.is_subset(stored))
            });
            if !added {
                return false;
            }
            let mut next = MappingSnapshot::clone(current);
            for (key, apps) in change.delta.into_inner() {
                next.mappings.entry(key).or_default().extend(apps);
            }
            next.revision = change.revision.max(current.revision + 1);
            *current = Arc::new(next);
            true
        })
    }

    pub fn current(&self) -> Arc<MappingSnapshot> {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<MappingSnapshot>> {
        self.state.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::MappingDelta;

    fn change(pairs: &[(&str, &str, &str)], revision: i64) -> StoredChange {
        let mut delta = MappingDelta::default();
        for (ns, iface, app) in pairs {
            delta.add(MappingKey::new(*ns, *iface), app.to_string());
        }
        StoredChange { delta, revision }
    }

    #[test]
    fn publishes_only_real_changes_with_rising_revisions() {
        let index = MappingIndex::new(MappingSnapshot {
            revision: 5,
            ..Default::default()
        });
        let mut rx = index.subscribe();
        rx.mark_unchanged();
        assert!(index.apply(change(&[("ns", "I", "a")], 6)));
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        assert!(
            !index.apply(change(&[("ns", "I", "a")], 7)),
            "same pair published twice"
        );
        assert!(!rx.has_changed().unwrap_or(true));
        // A lower revision than the current one still moves the revision forward.
        assert!(index.apply(change(&[("ns", "I", "b")], 3)));
        let current = index.current();
        assert_eq!(current.revision, 7);
        assert_eq!(
            current
                .mappings
                .get(&MappingKey::new("ns", "I"))
                .map(|a| a.len()),
            Some(2)
        );
    }
}
