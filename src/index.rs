//! The state the discovery stream reads: per kind, the current objects, a revision, and the
//! objects encoded once for every stream to share.
//!
//! Each kind is published through a `watch` channel, so a reader always sees a whole state,
//! never a partial one, and a reader that falls behind skips straight to the newest. A new state
//! is published only when something really changed, and then always with a higher revision.
//! Standalone mode feeds it from the store's change feed; a Kubernetes watch can feed it the same
//! way (`apply` for events, `reset` after a list).

use std::collections::BTreeMap;
use std::sync::Arc;

use prost_types::Any;
use tokio::sync::watch;

use crate::dds::wire::EncodedData;

/// The kinds a discovery-stream client can subscribe to (wire.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ServiceNameMapping,
    TagRoute,
    ConditionRoute,
    DynamicConfig,
    AuthenticationPolicy,
    AuthorizationPolicy,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::ServiceNameMapping,
        Kind::TagRoute,
        Kind::ConditionRoute,
        Kind::DynamicConfig,
        Kind::AuthenticationPolicy,
        Kind::AuthorizationPolicy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::ServiceNameMapping => "ServiceNameMapping",
            Kind::TagRoute => "TagRoute",
            Kind::ConditionRoute => "ConditionRoute",
            Kind::DynamicConfig => "DynamicConfig",
            Kind::AuthenticationPolicy => "AuthenticationPolicy",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
        }
    }

    /// `<group>/<version>/<Kind>`, as clients put it in `ObserveRequest.type`.
    pub fn type_name(self) -> &'static str {
        match self {
            Kind::ServiceNameMapping => "dubbo.apache.org/v1alpha1/ServiceNameMapping",
            Kind::TagRoute => "dubbo.apache.org/v1alpha1/TagRoute",
            Kind::ConditionRoute => "dubbo.apache.org/v1alpha1/ConditionRoute",
            Kind::DynamicConfig => "dubbo.apache.org/v1alpha1/DynamicConfig",
            Kind::AuthenticationPolicy => "dubbo.apache.org/v1alpha1/AuthenticationPolicy",
            Kind::AuthorizationPolicy => "dubbo.apache.org/v1alpha1/AuthorizationPolicy",
        }
    }

    pub fn from_type_name(type_name: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.type_name() == type_name)
    }

    /// Type URL of the `<Kind>ToClient` messages in `ObserveResponse.data`.
    pub fn type_url(self) -> &'static str {
        match self {
            Kind::ServiceNameMapping => {
                "type.googleapis.com/dubbo.apache.org.v1alpha1.ServiceNameMappingToClient"
            }
            Kind::TagRoute => "type.googleapis.com/dubbo.apache.org.v1alpha1.TagRouteToClient",
            Kind::ConditionRoute => {
                "type.googleapis.com/dubbo.apache.org.v1alpha1.ConditionRouteToClient"
            }
            Kind::DynamicConfig => {
                "type.googleapis.com/dubbo.apache.org.v1alpha1.DynamicConfigToClient"
            }
            Kind::AuthenticationPolicy => {
                "type.googleapis.com/dubbo.apache.org.v1alpha1.AuthenticationPolicyToClient"
            }
            Kind::AuthorizationPolicy => {
                "type.googleapis.com/dubbo.apache.org.v1alpha1.AuthorizationPolicyToClient"
            }
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// One kind at one revision.
#[derive(Debug)]
pub struct KindSnapshot {
    pub revision: i64,
    /// Objects by client key (`<name>/<namespace>`).
    pub objects: BTreeMap<String, Any>,
    /// `objects` encoded as `ObserveResponse.data`, built once for all streams.
    pub data: EncodedData,
    /// When this state was published, for the push-delay metric.
    pub published: tokio::time::Instant,
}

impl KindSnapshot {
    fn new(revision: i64, objects: BTreeMap<String, Any>) -> Self {
        let data = EncodedData::encode(objects.values());
        KindSnapshot {
            revision,
            objects,
            data,
            published: tokio::time::Instant::now(),
        }
    }
}

/// Owner of every kind's state; the only writer of their channels.
pub struct Index {
    kinds: Vec<watch::Sender<Arc<KindSnapshot>>>,
    /// False until the initial state of every source is in; streams are refused until then.
    loaded: watch::Sender<bool>,
}

impl Index {
    /// Every kind empty at `revision`, not yet loaded.
    pub fn new(revision: i64) -> Self {
        let kinds = Kind::ALL
            .iter()
            .map(|_| watch::Sender::new(Arc::new(KindSnapshot::new(revision, BTreeMap::new()))))
            .collect();
        Index {
            kinds,
            loaded: watch::Sender::new(false),
        }
    }

    fn sender(&self, kind: Kind) -> &watch::Sender<Arc<KindSnapshot>> {
        &self.kinds[kind.slot()]
    }

    /// Upserts and deletes objects of `kind`. Publishes only if something changed, at a revision
    /// above the current one (`revision` where that is higher). Returns whether it published.
    pub fn apply(
        &self,
        kind: Kind,
        upserts: impl IntoIterator<Item = (String, Any)>,
        deletes: impl IntoIterator<Item = String>,
        revision: i64,
    ) -> bool {
        let upserts: Vec<(String, Any)> = upserts.into_iter().collect();
        let deletes: Vec<String> = deletes.into_iter().collect();
        self.sender(kind).send_if_modified(|current| {
            let changed = upserts
                .iter()
                .any(|(key, any)| current.objects.get(key) != Some(any))
                || deletes.iter().any(|key| current.objects.contains_key(key));
            if !changed {
                return false;
            }
            let mut objects = current.objects.clone();
            for key in &deletes {
                objects.remove(key);
            }
            objects.extend(upserts.iter().cloned());
            *current = Arc::new(KindSnapshot::new(
                revision.max(current.revision + 1),
                objects,
            ));
            true
        })
    }

    /// Replaces the whole state of `kind` (after a list). Publishes only if it differs.
    pub fn reset(&self, kind: Kind, objects: BTreeMap<String, Any>, revision: i64) -> bool {
        self.sender(kind).send_if_modified(|current| {
            if current.objects == objects {
                return false;
            }
            let revision = revision.max(current.revision + 1);
            *current = Arc::new(KindSnapshot::new(revision, objects));
            true
        })
    }

    pub fn current(&self, kind: Kind) -> Arc<KindSnapshot> {
        self.sender(kind).borrow().clone()
    }

    pub fn subscribe(&self, kind: Kind) -> watch::Receiver<Arc<KindSnapshot>> {
        self.sender(kind).subscribe()
    }

    pub fn mark_loaded(&self) {
        self.loaded.send_replace(true);
    }

    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(value: &[u8]) -> Any {
        Any {
            type_url: Kind::TagRoute.type_url().to_owned(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn type_names_round_trip_and_unknowns_are_rejected() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_type_name(kind.type_name()), Some(kind));
            assert_eq!(
                kind.type_name(),
                format!("dubbo.apache.org/v1alpha1/{}", kind.name())
            );
            assert_eq!(
                kind.type_url(),
                format!(
                    "type.googleapis.com/dubbo.apache.org.v1alpha1.{}ToClient",
                    kind.name()
                )
            );
        }
        assert_eq!(
            Kind::ServiceNameMapping.type_name(),
            "dubbo.apache.org/v1alpha1/ServiceNameMapping"
        );
        assert_eq!(
            Kind::ServiceNameMapping.type_url(),
            "type.googleapis.com/dubbo.apache.org.v1alpha1.ServiceNameMappingToClient"
        );
        for unknown in [
            "",
            "ServiceNameMapping",
            "dubbo.apache.org/v1alpha1/",
            "x/v1/TagRoute",
        ] {
            assert_eq!(Kind::from_type_name(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn publishes_only_real_changes_with_rising_revisions() {
        let index = Index::new(5);
        let mut rx = index.subscribe(Kind::TagRoute);
        rx.mark_unchanged();
        assert!(index.apply(Kind::TagRoute, [("a/ns".into(), any(b"1"))], [], 0));
        assert!(rx.has_changed().unwrap_or(false));
        assert_eq!(index.current(Kind::TagRoute).revision, 6);
        rx.mark_unchanged();

        assert!(
            !index.apply(Kind::TagRoute, [("a/ns".into(), any(b"1"))], [], 0),
            "same object twice"
        );
        assert!(!index.apply(Kind::TagRoute, [], ["missing/ns".to_string()], 0));
        assert!(!rx.has_changed().unwrap_or(true));

        assert!(index.apply(Kind::TagRoute, [("a/ns".into(), any(b"2"))], [], 100));
        assert_eq!(index.current(Kind::TagRoute).revision, 100);
        assert!(index.apply(Kind::TagRoute, [], ["a/ns".to_string()], 0));
        let current = index.current(Kind::TagRoute);
        assert_eq!(current.revision, 101);
        assert!(current.objects.is_empty());
        // Other kinds are untouched.
        assert_eq!(index.current(Kind::ServiceNameMapping).revision, 5);
    }

    #[test]
    fn reset_replaces_and_skips_identical_states() {
        let index = Index::new(1);
        let state: BTreeMap<String, Any> =
            [("a".to_string(), any(b"1")), ("b".to_string(), any(b"2"))].into();
        assert!(index.reset(Kind::DynamicConfig, state.clone(), 1));
        assert!(!index.reset(Kind::DynamicConfig, state, 9));
        let current = index.current(Kind::DynamicConfig);
        assert_eq!(current.revision, 2);
        assert_eq!(current.data.decode().map(|v| v.len()).ok(), Some(2));
    }
}
