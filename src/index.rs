//! The state the discovery stream reads: per kind, the current objects, a revision, and the
//! objects encoded once for every stream to share.
//!
//! Each kind is published through a `watch` channel, so a reader always sees a whole state,
//! never a partial one, and a reader that falls behind skips straight to the newest. A new state
//! is published only when something really changed, and then always with a higher revision.
//!
//! Every source feeds it the same way, one debounced batch at a time ([`Index::apply`] for
//! changes, [`Index::reset`] after a list). Each object is encoded once, when it changes; a new
//! state is assembled from the objects' encodings (one copy, no encoding), outside the channel's
//! lock, so stream tasks reading the current state never wait for an encode.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use prost_types::Any;
use tokio::sync::watch;

use crate::dds::wire::EncodedData;
use crate::rules::scope::{Audience, Endpoint};

pub use crate::kind::{Kind, KindLabel};

/// gRPC clients (grpc-java, grpc-go) refuse messages over 4 MiB unless configured otherwise; a
/// full-state response above it would never arrive.
pub const CLIENT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Room left for a response's nonce, type and revision.
const RESPONSE_HEAD_BYTES: usize = 1024;

/// Bytes of filtered views one state keeps; beyond it views are assembled uncached.
const MAX_VIEW_BYTES_PER_STATE: usize = 64 * 1024 * 1024;

/// One object of a kind: its `Any` and that `Any` encoded as an `ObserveResponse.data` record.
#[derive(Debug, PartialEq)]
pub struct Object {
    pub any: Any,
    record: Bytes,
    /// The clients it reaches (auth policies); `None`: every client.
    pub audience: Option<Arc<Audience>>,
}

/// One kind at one revision.
#[derive(Debug)]
pub struct KindSnapshot {
    pub revision: i64,
    /// Objects by client key (`<name>/<namespace>`); shared with the next revisions.
    pub objects: BTreeMap<String, Arc<Object>>,
    /// `objects` encoded as `ObserveResponse.data`, assembled once for all streams.
    pub data: EncodedData,
    /// When this state was published, for the push-delay metric.
    pub published: tokio::time::Instant,
    /// Whether any object has an audience (then clients get filtered views).
    scoped: bool,
    /// Filtered views by the positions of the objects they include: clients that see the same
    /// set share one assembly (10,000 clients in 50 namespaces: about 50 per change).
    views: Mutex<Views>,
    /// Counts the assemblies of filtered views (`index_view_assemblies{kind}`).
    view_assemblies: Counter,
    /// The state's digest, computed on first read (`/debug/digest`, a scrape).
    digest: std::sync::OnceLock<String>,
}

impl KindSnapshot {
    /// SHA-256 over the sorted (key, encoded object) pairs: equal digests, byte-identical state.
    pub fn digest(&self) -> &str {
        self.digest.get_or_init(|| {
            crate::digest::state_digest(
                self.objects
                    .iter()
                    .map(|(key, object)| (key.as_str(), object.record.as_ref())),
            )
        })
    }

    /// Each object's digest by key, to say which objects differ where states do.
    pub fn object_digests(&self) -> BTreeMap<String, String> {
        self.objects
            .iter()
            .map(|(key, object)| (key.clone(), crate::digest::object_digest(&object.record)))
            .collect()
    }

    /// What `endpoint` receives: the whole state, or only the objects whose audience
    /// includes it.
    pub fn view_for(&self, endpoint: &Endpoint) -> EncodedData {
        if !self.scoped {
            return self.data.clone();
        }
        let included: Vec<u32> = self
            .objects
            .values()
            .enumerate()
            .filter(|(_, object)| {
                object
                    .audience
                    .as_ref()
                    .is_none_or(|a| a.includes(endpoint))
            })
            .map(|(i, _)| u32::try_from(i).unwrap_or(u32::MAX))
            .collect();
        if let Some(view) = self.lock_views().by_objects.get(&included) {
            return view.clone();
        }
        // Assembled outside the lock: other streams of this state keep reading the cache.
        let records: Vec<&Bytes> = self
            .objects
            .values()
            .enumerate()
            .filter(|(i, _)| {
                included
                    .binary_search(&u32::try_from(*i).unwrap_or(u32::MAX))
                    .is_ok()
            })
            .map(|(_, object)| &object.record)
            .collect();
        let view = EncodedData::assemble(records.iter().copied());
        self.view_assemblies.inc();
        let mut views = self.lock_views();
        if views.bytes + view.len() <= MAX_VIEW_BYTES_PER_STATE
            && !views.by_objects.contains_key(&included)
        {
            views.bytes += view.len();
            views.by_objects.insert(included, view.clone());
        }
        view
    }

    fn lock_views(&self) -> std::sync::MutexGuard<'_, Views> {
        self.views.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether clients get filtered views of this state.
    pub fn is_scoped(&self) -> bool {
        self.scoped
    }

    /// Filtered views cached for this state.
    pub fn views_assembled(&self) -> usize {
        self.lock_views().by_objects.len()
    }
}

/// The filtered views of one state, bounded in bytes.
#[derive(Debug, Default)]
struct Views {
    by_objects: HashMap<Vec<u32>, EncodedData>,
    bytes: usize,
}

/// One change to a kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Upsert(String, Any),
    /// An object that reaches only the clients of its audience.
    Scoped(String, Any, Arc<Audience>),
    Delete(String),
}

/// What the index counts, per kind.
#[derive(Debug, Default)]
pub struct IndexStats {
    /// Objects encoded (each at most once per change of that object).
    pub encodes: Family<KindLabel, Counter>,
    /// States assembled (one per published revision).
    pub assemblies: Family<KindLabel, Counter>,
    /// Encoded size of the current state: what every full-state response carries.
    pub state_bytes: Family<KindLabel, Gauge>,
    /// Objects in the current state.
    pub objects: Family<KindLabel, Gauge>,
    /// Filtered views assembled (auth policies: one per distinct set of objects per state).
    pub view_assemblies: Family<KindLabel, Counter>,
}

impl IndexStats {
    pub fn encodes_of(&self, kind: Kind) -> u64 {
        self.encodes.get_or_create(&kind.label()).get()
    }

    pub fn assemblies_of(&self, kind: Kind) -> u64 {
        self.assemblies.get_or_create(&kind.label()).get()
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
            .map(|_| Slot {
                objects: Mutex::new(BTreeMap::new()),
                published: watch::Sender::new(Arc::new(KindSnapshot {
                    revision,
                    objects: BTreeMap::new(),
                    data: EncodedData::default(),
                    published: tokio::time::Instant::now(),
                    scoped: false,
                    views: Mutex::new(Views::default()),
                    view_assemblies: Counter::default(),
                    digest: std::sync::OnceLock::new(),
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
                Change::Upsert(key, any) => {
                    changed |= self.upsert(kind, &mut objects, key, any, None);
                }
                Change::Scoped(key, any, audience) => {
                    changed |= self.upsert(kind, &mut objects, key, any, Some(audience));
                }
                Change::Delete(key) => changed |= objects.remove(&key).is_some(),
            }
        }
        if changed {
            self.publish(kind, &objects, revision);
        }
        changed
    }

    /// Puts one object in; false when it is already there as it is.
    fn upsert(
        &self,
        kind: Kind,
        objects: &mut BTreeMap<String, Arc<Object>>,
        key: String,
        any: Any,
        audience: Option<Arc<Audience>>,
    ) -> bool {
        if objects
            .get(&key)
            .is_some_and(|current| current.any == any && current.audience == audience)
        {
            return false;
        }
        let record = EncodedData::record(&any);
        self.stats.encodes.get_or_create(&kind.label()).inc();
        objects.insert(
            key,
            Arc::new(Object {
                any,
                record,
                audience,
            }),
        );
        true
    }

    /// Replaces the whole state of `kind` with `upserts` (after a list); as [`Index::reset`].
    pub fn reset_changes(&self, kind: Kind, upserts: Vec<Change>, revision: i64) -> bool {
        let keep: std::collections::HashSet<&str> = upserts
            .iter()
            .filter_map(|change| match change {
                Change::Upsert(key, _) | Change::Scoped(key, _, _) => Some(key.as_str()),
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

    /// Replaces the whole state of `kind` (after a list). Publishes only if it differs; only
    /// objects that differ are encoded.
    pub fn reset(&self, kind: Kind, objects: BTreeMap<String, Any>, revision: i64) -> bool {
        let upserts = objects
            .into_iter()
            .map(|(key, any)| Change::Upsert(key, any))
            .collect();
        self.reset_changes(kind, upserts, revision)
    }

    /// Assembles and publishes the state. The channel's lock is held only to swap the pointer.
    fn publish(&self, kind: Kind, objects: &BTreeMap<String, Arc<Object>>, revision: i64) {
        let slot = self.slot(kind);
        let revision = revision.max(slot.published.borrow().revision + 1);
        let data = EncodedData::assemble(objects.values().map(|object| &object.record));
        let label = kind.label();
        if data.len() + RESPONSE_HEAD_BYTES > CLIENT_MAX_MESSAGE_BYTES {
            tracing::warn!(
                kind = kind.name(),
                bytes = data.len(),
                objects = objects.len(),
                "the full state is over the 4 MiB clients accept by default; raise the clients' \
                 max inbound message size or keep fewer or smaller objects"
            );
        }
        self.stats.assemblies.get_or_create(&label).inc();
        self.stats
            .state_bytes
            .get_or_create(&label)
            .set(i64::try_from(data.len()).unwrap_or(i64::MAX));
        self.stats
            .objects
            .get_or_create(&label)
            .set(i64::try_from(objects.len()).unwrap_or(i64::MAX));
        let snapshot = Arc::new(KindSnapshot {
            revision,
            scoped: objects.values().any(|o| o.audience.is_some()),
            objects: objects.clone(),
            data,
            published: tokio::time::Instant::now(),
            views: Mutex::new(Views::default()),
            view_assemblies: self.stats.view_assemblies.get_or_create(&label).clone(),
            digest: std::sync::OnceLock::new(),
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
            "index_object_encodes",
            "Objects encoded for the discovery stream, by kind",
            self.stats.encodes.clone(),
        );
        registry.register(
            "index_state_assemblies",
            "States assembled from encoded objects (one per published revision), by kind",
            self.stats.assemblies.clone(),
        );
        registry.register(
            "dds_state_bytes",
            "Encoded size of a kind's full state, as every response of it carries (clients refuse messages over 4 MiB by default)",
            self.stats.state_bytes.clone(),
        );
        registry.register(
            "index_objects",
            "Objects in a kind's current state",
            self.stats.objects.clone(),
        );
        registry.register(
            "index_view_assemblies",
            "Filtered views assembled for clients (auth policies), by kind",
            self.stats.view_assemblies.clone(),
        );
    }
}

/// A TagRoute-typed object holding `value`, for tests of the index and what reads it.
#[cfg(test)]
pub(crate) fn test_any(value: &[u8]) -> Any {
    Any {
        type_url: Kind::TagRoute.type_url().to_owned(),
        value: value.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(value: &[u8]) -> Any {
        test_any(value)
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
        let state: BTreeMap<String, Any> =
            [("a".to_string(), any(b"1")), ("b".to_string(), any(b"2"))].into();
        assert!(index.reset(Kind::DynamicConfig, state.clone(), 1));
        assert!(!index.reset(Kind::DynamicConfig, state, 9));
        let current = index.current(Kind::DynamicConfig);
        assert_eq!(current.revision, 2);
        assert_eq!(current.data.decode().map(|v| v.len()).ok(), Some(2));
        let smaller: BTreeMap<String, Any> = [("b".to_string(), any(b"2"))].into();
        assert!(index.reset(Kind::DynamicConfig, smaller, 0));
        let current = index.current(Kind::DynamicConfig);
        assert_eq!(current.data.decode().ok(), Some(vec![any(b"2")]));
    }

    #[test]
    fn one_changed_object_costs_one_encode_and_the_state_is_exact() {
        let index = Index::new(1);
        let kind = Kind::ServiceNameMapping;
        let batch: Vec<Change> = (0..100)
            .map(|i| upsert(&format!("k{i:03}"), format!("v{i}").as_bytes()))
            .collect();
        assert!(index.apply(kind, batch, 0));
        assert_eq!(index.stats().encodes_of(kind), 100);
        assert_eq!(index.stats().assemblies_of(kind), 1);

        // A batch touching one object (twice) and repeating 99 unchanged ones.
        let mut batch: Vec<Change> = (0..100)
            .map(|i| upsert(&format!("k{i:03}"), format!("v{i}").as_bytes()))
            .collect();
        batch.push(upsert("k050", b"changed"));
        assert!(index.apply(kind, batch, 0));
        assert_eq!(
            index.stats().encodes_of(kind),
            101,
            "only the changed object is encoded"
        );
        assert_eq!(index.stats().assemblies_of(kind), 2);

        // The assembled bytes equal a from-scratch encoding of the same objects.
        let current = index.current(kind);
        let expected: Vec<Any> = current.objects.values().map(|o| o.any.clone()).collect();
        assert_eq!(current.data, EncodedData::encode(&expected));
        assert_eq!(
            current.objects.get("k050").map(|o| o.any.clone()),
            Some(any(b"changed"))
        );
    }

    #[test]
    fn clients_that_see_the_same_objects_share_one_view() {
        use crate::rules::PolicySelector;
        let index = Index::new(1);
        let kind = Kind::AuthenticationPolicy;
        let in_namespace = |ns: &str| {
            Arc::new(Audience {
                selectors: vec![PolicySelector {
                    namespaces: vec![ns.to_owned()],
                    ..PolicySelector::default()
                }],
            })
        };
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
        for i in 0..100 {
            let ns = if i % 2 == 0 { "ns-a" } else { "ns-b" };
            let view = snapshot.view_for(&endpoint(ns, i));
            let expected: Vec<Any> =
                vec![any(ns.trim_start_matches("ns-").as_bytes()), any(b"all")];
            assert_eq!(view.decode().unwrap(), expected, "{ns}");
        }
        assert_eq!(
            snapshot.views_assembled(),
            2,
            "one assembly per distinct view"
        );
        // A client of neither namespace sees only the unscoped object.
        let other = snapshot.view_for(&endpoint("ns-c", 0));
        assert_eq!(other.decode().unwrap(), vec![any(b"all")]);
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
