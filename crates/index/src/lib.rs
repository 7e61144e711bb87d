//! The state every protocol edge reads: per kind, the current objects and a revision, as domain
//! values ([`Resource`]); no protocol, no encoding.
//!
//! Each kind is published through a `watch` channel, so a reader always sees a whole state,
//! never a partial one, and a reader that falls behind skips straight to the newest. A new state
//! is published only when something really changed, and then always with a higher revision.
//!
//! Every source feeds it the same way, one debounced batch at a time ([`Index::apply`] for
//! changes, [`Index::reset`] after a list). Objects that did not change are shared between
//! revisions (`Arc`), so an edge that memoises its encoding on an object ([`Object::memo`])
//! encodes it once per change, and one that memoises on a state ([`KindSnapshot::memo`])
//! assembles it once per revision, whatever the number of streams.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use dubbo_cp_domain::rules::scope::{Audience, Endpoint};
use memo::Memo;
use prometheus_client::encoding::EncodeLabelSet;

pub use dubbo_cp_domain::kind::Kind;
pub use dubbo_cp_domain::resource::Resource;

pub mod catalog;
pub mod memo;

/// A kind as a metric label (`{kind="TagRoute"}`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// [`KindLabel`] of a kind.
pub trait Labelled {
    fn label(self) -> KindLabel;
}

impl Labelled for Kind {
    fn label(self) -> KindLabel {
        KindLabel { kind: self.name() }
    }
}

/// One object of a kind.
#[derive(Debug)]
pub struct Object {
    pub value: Resource,
    /// The clients it reaches (auth policies); `None`: every client.
    pub audience: Option<Arc<Audience>>,
    /// When its source created it (milliseconds since the epoch), where an edge orders by age
    /// (ServiceEntries declaring one host: the oldest is served).
    pub created: Option<i64>,
    /// What protocol edges derived from this object (its encoding), kept as long as it lives.
    memo: Memo,
}

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
            && self.audience == other.audience
            && self.created == other.created
    }
}

impl Object {
    pub fn new(value: Resource, audience: Option<Arc<Audience>>) -> Self {
        Self {
            value,
            audience,
            created: None,
            memo: Memo::default(),
        }
    }

    /// The edge's derivation of type `T` of this object, computed on first use.
    pub fn memo<T: std::any::Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        self.memo.get_or_init(init)
    }
}

/// One kind at one revision.
#[derive(Debug)]
pub struct KindSnapshot {
    pub kind: Kind,
    pub revision: i64,
    /// Objects by client key (`<name>/<namespace>`); shared with the next revisions.
    pub objects: BTreeMap<String, Arc<Object>>,
    /// When this state was published, for the push-delay metric.
    pub published: tokio::time::Instant,
    /// Whether any object has an audience (then clients get filtered views).
    scoped: bool,
    /// What protocol edges assembled from this state (its encoding, its views, its digest).
    memo: Memo,
}

impl KindSnapshot {
    /// The positions (in key order) of the objects whose audience includes `endpoint`, or
    /// `None` when it sees the whole state.
    pub fn included_for(&self, endpoint: &Endpoint) -> Option<Vec<u32>> {
        if !self.scoped {
            return None;
        }
        Some(
            self.objects
                .values()
                .enumerate()
                .filter(|(_, object)| {
                    object
                        .audience
                        .as_ref()
                        .is_none_or(|a| a.includes(endpoint))
                })
                .map(|(i, _)| u32::try_from(i).unwrap_or(u32::MAX))
                .collect(),
        )
    }

    /// Whether clients get filtered views of this state.
    pub fn is_scoped(&self) -> bool {
        self.scoped
    }

    /// The edge's derivation of type `T` of this state, computed once per revision.
    pub fn memo<T: std::any::Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        self.memo.get_or_init(init)
    }
}

/// One change to a kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Upsert(String, Resource),
    /// An object that reaches only the clients of its audience.
    Scoped(String, Resource, Arc<Audience>),
    /// An object whose age its readers order by, created at the given milliseconds.
    Dated(String, Resource, i64),
    Delete(String),
}

/// What the index counts, per kind.
#[derive(Debug, Default)]
pub struct IndexStats {
    /// Objects in the current state.
    pub objects: Family<KindLabel, Gauge>,
    /// States published (one per debounced batch that changed something).
    pub publishes: Family<KindLabel, Counter>,
}

impl IndexStats {
    pub fn publishes_of(&self, kind: Kind) -> u64 {
        self.publishes.get_or_create(&kind.label()).get()
    }
}

/// The writers' side of one kind: only [`Index::apply`] and [`Index::reset`] take its lock.
struct Slot {
    objects: Mutex<BTreeMap<String, Arc<Object>>>,
    published: watch::Sender<Arc<KindSnapshot>>,
    loaded: AtomicBool,
    /// Why the kind's source is not healthy (a missing CRD, a failing watch), for `/readyz`
    /// and `dubbo-cp status`; None when it is. One per kind.
    condition: Mutex<Option<SourceCondition>>,
}

/// Why a kind's source is not healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceProblem {
    /// The kind's CRD is not installed (the API server answers 404 for its resource).
    CrdMissing,
    /// Listing or watching the kind fails (RBAC, an API-server error, the network).
    Failing,
}

/// What is said of a kind's source that is not healthy: the problem and a message naming the
/// resource, the last error or the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceCondition {
    pub problem: SourceProblem,
    pub message: String,
}

/// Owner of every kind's state; the only writer of their channels.
pub struct Index {
    slots: Vec<Slot>,
    /// True once every kind's initial state is in; streams are refused until then.
    loaded: watch::Sender<bool>,
    stats: IndexStats,
}

impl Index {
    /// Every kind empty at `revision`, not yet loaded.
    pub fn new(revision: i64) -> Self {
        let slots = Kind::ALL
            .iter()
            .map(|kind| Slot {
                objects: Mutex::new(BTreeMap::new()),
                published: watch::Sender::new(Arc::new(KindSnapshot {
                    kind: *kind,
                    revision,
                    objects: BTreeMap::new(),
                    published: tokio::time::Instant::now(),
                    scoped: false,
                    memo: Memo::default(),
                })),
                loaded: AtomicBool::new(false),
                condition: Mutex::new(None),
            })
            .collect();
        Index {
            slots,
            loaded: watch::Sender::new(false),
            stats: IndexStats::default(),
        }
    }

    fn slot(&self, kind: Kind) -> &Slot {
        &self.slots[kind.slot()]
    }

    /// Applies a batch of changes to `kind`. Publishes only if something changed, at a revision
    /// above the current one (`revision` where that is higher). Returns whether it published.
    pub fn apply(
        &self,
        kind: Kind,
        changes: impl IntoIterator<Item = Change>,
        revision: i64,
    ) -> bool {
        let slot = self.slot(kind);
        let mut objects = slot.objects.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = false;
        for change in changes {
            match change {
                Change::Upsert(key, value) => {
                    changed |= upsert(&mut objects, key, Object::new(value, None));
                }
                Change::Scoped(key, value, audience) => {
                    changed |= upsert(&mut objects, key, Object::new(value, Some(audience)));
                }
                Change::Dated(key, value, created) => {
                    let object = Object {
                        created: Some(created),
                        ..Object::new(value, None)
                    };
                    changed |= upsert(&mut objects, key, object);
                }
                Change::Delete(key) => changed |= objects.remove(&key).is_some(),
            }
        }
        if changed {
            self.publish(kind, &objects, revision);
        }
        changed
    }

    /// Replaces the whole state of `kind` with `upserts` (after a list); as [`Index::reset`].
    pub fn reset_changes(&self, kind: Kind, upserts: Vec<Change>, revision: i64) -> bool {
        let keep: std::collections::HashSet<&str> = upserts
            .iter()
            .filter_map(|change| match change {
                Change::Upsert(key, _) | Change::Scoped(key, _, _) | Change::Dated(key, _, _) => {
                    Some(key.as_str())
                }
                Change::Delete(_) => None,
            })
            .collect();
        let gone: Vec<Change> = {
            let current = self
                .slot(kind)
                .objects
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            current
                .keys()
                .filter(|key| !keep.contains(key.as_str()))
                .map(|key| Change::Delete(key.clone()))
                .collect()
        };
        drop(keep);
        self.apply(kind, gone.into_iter().chain(upserts), revision)
    }

    /// Replaces the whole state of `kind` (after a list). Publishes only if it differs; objects
    /// that did not change stay shared with the previous state.
    pub fn reset(&self, kind: Kind, objects: BTreeMap<String, Resource>, revision: i64) -> bool {
        let upserts = objects
            .into_iter()
            .map(|(key, value)| Change::Upsert(key, value))
            .collect();
        self.reset_changes(kind, upserts, revision)
    }

    /// Publishes the state. The channel's lock is held only to swap the pointer.
    fn publish(&self, kind: Kind, objects: &BTreeMap<String, Arc<Object>>, revision: i64) {
        let slot = self.slot(kind);
        let revision = revision.max(slot.published.borrow().revision + 1);
        self.stats.publishes.get_or_create(&kind.label()).inc();
        self.stats
            .objects
            .get_or_create(&kind.label())
            .set(i64::try_from(objects.len()).unwrap_or(i64::MAX));
        let snapshot = Arc::new(KindSnapshot {
            kind,
            revision,
            scoped: objects.values().any(|o| o.audience.is_some()),
            objects: objects.clone(),
            published: tokio::time::Instant::now(),
            memo: Memo::default(),
        });
        // The previous state is dropped here, after the lock is released.
        let _previous = slot.published.send_replace(snapshot);
    }

    pub fn current(&self, kind: Kind) -> Arc<KindSnapshot> {
        self.slot(kind).published.borrow().clone()
    }

    pub fn subscribe(&self, kind: Kind) -> watch::Receiver<Arc<KindSnapshot>> {
        self.slot(kind).published.subscribe()
    }

    /// Marks `kind`'s initial state as in: streams may be served that kind (their first answer
    /// waits for it); once every kind is, the control plane is ready.
    pub fn mark_loaded(&self, kind: Kind) {
        let slot = self.slot(kind);
        if !slot.loaded.swap(true, Ordering::SeqCst) {
            // Wake the streams that subscribed before: their first answer was held for this.
            slot.published.send_modify(|_| {});
        }
        if self
            .slots
            .iter()
            .all(|slot| slot.loaded.load(Ordering::SeqCst))
        {
            self.loaded.send_replace(true);
        }
    }

    /// Marks every kind loaded (a source that serves them all at once, or none).
    pub fn mark_all_loaded(&self) {
        for kind in Kind::ALL {
            self.mark_loaded(kind);
        }
    }

    /// Says why `kind`'s source is not healthy, or (None) that it is again; true when that
    /// changed what was said (so a retry loop logs once).
    pub fn set_condition(&self, kind: Kind, condition: Option<SourceCondition>) -> bool {
        let mut slot = self
            .slot(kind)
            .condition
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let changed = *slot != condition;
        *slot = condition;
        changed
    }

    /// Each kind: whether its initial state is in, and why its source is not healthy.
    pub fn sources(&self) -> Vec<(Kind, bool, Option<SourceCondition>)> {
        Kind::ALL
            .into_iter()
            .map(|kind| {
                let slot = self.slot(kind);
                let condition = slot
                    .condition
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                (kind, slot.loaded.load(Ordering::SeqCst), condition)
            })
            .collect()
    }

    /// Every kind's initial state is in.
    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// `kind`'s initial state is in.
    pub fn is_kind_loaded(&self, kind: Kind) -> bool {
        self.slot(kind).loaded.load(Ordering::SeqCst)
    }

    /// Some kind's initial state is in: streams are admitted (and served the kinds that are).
    pub fn any_loaded(&self) -> bool {
        self.slots
            .iter()
            .any(|slot| slot.loaded.load(Ordering::SeqCst))
    }

    /// Kinds whose initial state is not in yet, for logs and readiness messages.
    pub fn not_loaded(&self) -> Vec<Kind> {
        Kind::ALL
            .into_iter()
            .filter(|kind| !self.slot(*kind).loaded.load(Ordering::SeqCst))
            .collect()
    }

    pub fn stats(&self) -> &IndexStats {
        &self.stats
    }

    /// Registers the index's series.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "index_objects",
            "Objects in a kind's current state",
            self.stats.objects.clone(),
        );
        registry.register(
            "index_state_publishes",
            "States published (one per debounced batch that changed something), by kind",
            self.stats.publishes.clone(),
        );
    }
}

/// Puts one object in; false when it is already there as it is.
fn upsert(objects: &mut BTreeMap<String, Arc<Object>>, key: String, object: Object) -> bool {
    if objects.get(&key).is_some_and(|current| **current == object) {
        return false;
    }
    objects.insert(key, Arc::new(object));
    true
}

/// An audience of the clients in `namespace`, for tests of the index and of its readers.
#[doc(hidden)]
pub fn test_audience_in(namespace: &str) -> Arc<Audience> {
    Arc::new(Audience {
        namespace: None,
        selectors: vec![dubbo_cp_domain::rules::PolicySelector {
            namespaces: vec![namespace.to_owned()],
            ..Default::default()
        }],
    })
}

/// A mapping of interface `value`, for tests of the index and of the edges that read it.
#[doc(hidden)]
pub fn test_value(value: &[u8]) -> Resource {
    Resource::mapping(String::from_utf8_lossy(value), Vec::new())
}
#[cfg(test)]
mod tests {
    use super::*;

    fn any(value: &[u8]) -> Resource {
        test_value(value)
    }

    #[test]
    fn type_names_round_trip_and_unknowns_are_rejected() {
        for kind in Kind::ALL {
            // ServiceEntry and Service are served over xDS only: no discovery client can
            // subscribe to them.
            let on_the_stream = Kind::DISCOVERY.contains(&kind).then_some(kind);
            assert_eq!(
                on_the_stream.is_none(),
                matches!(kind, Kind::ServiceEntry | Kind::Service)
            );
            assert_eq!(Kind::from_type_name(kind.type_name()), on_the_stream);
            assert_eq!(
                kind.type_name(),
                format!("dubbo.apache.org/v1alpha1/{}", kind.name())
            );
        }
        assert_eq!(
            Kind::ServiceNameMapping.type_name(),
            "dubbo.apache.org/v1alpha1/ServiceNameMapping"
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

    fn upsert(key: &str, value: &[u8]) -> Change {
        Change::Upsert(key.to_owned(), any(value))
    }

    #[test]
    fn publishes_only_real_changes_with_rising_revisions() {
        let index = Index::new(5);
        let mut rx = index.subscribe(Kind::TagRoute);
        rx.mark_unchanged();
        assert!(index.apply(Kind::TagRoute, [upsert("a/ns", b"1")], 0));
        assert!(rx.has_changed().unwrap_or(false));
        assert_eq!(index.current(Kind::TagRoute).revision, 6);
        rx.mark_unchanged();

        assert!(
            !index.apply(Kind::TagRoute, [upsert("a/ns", b"1")], 0),
            "same object twice"
        );
        assert!(!index.apply(Kind::TagRoute, [Change::Delete("missing/ns".into())], 0));
        assert!(!rx.has_changed().unwrap_or(true));

        assert!(index.apply(Kind::TagRoute, [upsert("a/ns", b"2")], 100));
        assert_eq!(index.current(Kind::TagRoute).revision, 100);
        assert!(index.apply(Kind::TagRoute, [Change::Delete("a/ns".into())], 0));
        let current = index.current(Kind::TagRoute);
        assert_eq!(current.revision, 101);
        assert!(current.objects.is_empty());
        // Other kinds are untouched.
        assert_eq!(index.current(Kind::ServiceNameMapping).revision, 5);
    }

    #[test]
    fn reset_replaces_and_skips_identical_states() {
        let index = Index::new(1);
        let state: BTreeMap<String, Resource> =
            [("a".to_string(), any(b"1")), ("b".to_string(), any(b"2"))].into();
        assert!(index.reset(Kind::DynamicConfig, state.clone(), 1));
        assert!(!index.reset(Kind::DynamicConfig, state, 9));
        let current = index.current(Kind::DynamicConfig);
        assert_eq!(current.revision, 2);
        assert_eq!(current.objects.len(), 2);
        let smaller: BTreeMap<String, Resource> = [("b".to_string(), any(b"2"))].into();
        assert!(index.reset(Kind::DynamicConfig, smaller, 0));
        let current = index.current(Kind::DynamicConfig);
        let values: Vec<&Resource> = current.objects.values().map(|o| &o.value).collect();
        assert_eq!(values, vec![&any(b"2")]);
    }

    #[test]
    fn unchanged_objects_are_shared_between_revisions() {
        let index = Index::new(1);
        let kind = Kind::ServiceNameMapping;
        let batch: Vec<Change> = (0..100)
            .map(|i| upsert(&format!("k{i:03}"), format!("v{i}").as_bytes()))
            .collect();
        assert!(index.apply(kind, batch, 0));
        let before = index.current(kind);

        // A batch touching one object (twice) and repeating 99 unchanged ones.
        let mut batch: Vec<Change> = (0..100)
            .map(|i| upsert(&format!("k{i:03}"), format!("v{i}").as_bytes()))
            .collect();
        batch.push(upsert("k050", b"changed"));
        assert!(index.apply(kind, batch, 0));
        let after = index.current(kind);
        let shared = before
            .objects
            .iter()
            .filter(|(key, object)| Arc::ptr_eq(object, &after.objects[*key]))
            .count();
        assert_eq!(shared, 99, "only the changed object is new");
        assert_eq!(after.objects["k050"].value, any(b"changed"));
    }

    #[test]
    fn scoped_objects_reach_their_audience_only() {
        let index = Index::new(1);
        let kind = Kind::AuthenticationPolicy;
        let in_namespace = test_audience_in;
        index.apply(
            kind,
            [
                Change::Upsert("everyone/root".into(), any(b"all")),
                Change::Scoped("a/ns-a".into(), any(b"a"), in_namespace("ns-a")),
                Change::Scoped("b/ns-b".into(), any(b"b"), in_namespace("ns-b")),
            ],
            0,
        );
        let snapshot = index.current(kind);
        assert!(snapshot.is_scoped());
        let endpoint = |ns: &str, i: usize| Endpoint {
            namespace: ns.to_owned(),
            id: format!("{ns}/client-{i}"),
            ..Endpoint::default()
        };
        // Keys in order: a/ns-a, b/ns-b, everyone/root.
        assert_eq!(
            snapshot.included_for(&endpoint("ns-a", 0)),
            Some(vec![0, 2])
        );
        assert_eq!(
            snapshot.included_for(&endpoint("ns-b", 1)),
            Some(vec![1, 2])
        );
        // A client of neither namespace sees only the unscoped object.
        assert_eq!(snapshot.included_for(&endpoint("ns-c", 0)), Some(vec![2]));
        // A selector-only edit is a change, although the sent bytes are equal.
        assert!(index.apply(
            kind,
            [Change::Scoped(
                "a/ns-a".into(),
                any(b"a"),
                in_namespace("ns-c")
            )],
            0
        ));
    }

    #[test]
    fn loaded_once_every_kind_is() {
        let index = Index::new(1);
        index.mark_loaded(Kind::ServiceNameMapping);
        assert!(!index.is_loaded());
        assert_eq!(index.not_loaded().len(), Kind::ALL.len() - 1);
        index.mark_all_loaded();
        assert!(index.is_loaded());
    }
}
