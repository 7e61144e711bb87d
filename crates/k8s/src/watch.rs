//! Watches of custom resources, one per kind, feeding the index through the same debouncer as
//! every other source: list, then watch from the list's resourceVersion, resume after
//! disconnects and re-list after 410 Gone (kube-runtime's watcher does these).
//!
//! Events become a [`WatchBatch`] per event; batches merge (the newest version of each object
//! wins, a list replaces everything before it), so a burst of N events for M objects costs one
//! conversion per object and one index update per debounce window, not N. After each list the
//! whole state is reconciled, so objects deleted while the watch was down disappear.
//!
//! A kind is a type implementing [`WatchedKind`]: its resource, how an object is parsed and
//! validated, and how it becomes an index value. Objects are read as dynamic objects
//! and parsed one by one: one that does not deserialize or validate is logged, counted and
//! skipped (it leaves the state), and the rest of its kind keeps flowing.

use crate::index::Labelled as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt;

use super::cluster::{ClusterView, WatchedMapping};
use super::crd::{ServiceNameMapping, ServiceNameMappingSpec};
use crate::debounce::{self, Batch, DebounceConfig, Merge};
use crate::index::catalog::{Catalog, change_for};
use crate::index::{Change, Index, Kind, KindLabel, Resource, SourceCondition, SourceProblem};
use crate::mapping::{MappingKey, client_key};
use crate::metrics::Metrics;
use crate::rules::{Rule, RuleSpec};
use crate::shutdown::signalled;

/// Watch batches that may wait for the debouncer before the watch waits.
const BATCH_QUEUE: usize = 1024;

/// kube's default watcher backoff waits at most 30 s (plus as much jitter) between retries and
/// forgives errors after 120 s without one: a watch that failed after its list and has had no
/// error for this long is running again.
const WATCH_QUIET: Duration = Duration::from_secs(120);

/// The API server does not serve the kind's resource: its CRD is not installed, or was deleted.
/// A real kube-apiserver answers a plain-text `404 page not found`, which kube reads as a
/// Status with that code and the reason "Failed to parse error data", not NotFound; a JSON
/// NotFound Status counts too.
fn crd_missing(err: &watcher::Error) -> bool {
    error_code(err) == Some(404)
}

/// What failed, briefly: kube's text of an API error repeats the whole Status.
pub(crate) fn describe(err: &watcher::Error) -> String {
    let what = match err {
        watcher::Error::InitialListFailed(_) => "list",
        _ => "watch",
    };
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => {
            format!("{what} answered {}: {}", status.code, status.message)
        }
        watcher::Error::WatchError(status) => {
            format!("{what} answered {}: {}", status.code, status.message)
        }
        other => other.to_string(),
    }
}

/// Too old a resourceVersion (410 Gone in a watch): the watcher lists again, nothing is wrong.
pub(crate) fn expired(err: &watcher::Error) -> bool {
    matches!(err, watcher::Error::WatchError(status) if status.code == 410)
}

/// The HTTP status the API server answered, when the error is one.
pub(crate) fn error_code(err: &watcher::Error) -> Option<u16> {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        _ => None,
    }
}

/// A custom-resource kind served on the discovery stream.
pub trait WatchedKind: Send + Sync + 'static {
    /// The parsed, validated object.
    type Object: Clone + Send + Sync + 'static;

    fn kind(&self) -> Kind;
    fn api_resource(&self) -> ApiResource;
    /// Parses and validates one object; the error says why it is skipped.
    fn parse(&self, object: &DynamicObject) -> Result<Self::Object, String>;
    /// The index's value of an object.
    fn to_value(&self, object: &Self::Object) -> Resource;
    /// The index's change for an object; kinds whose objects reach only some clients (auth
    /// policies) give it an audience.
    fn change(&self, client_key: String, object: &Self::Object) -> Change {
        Change::Upsert(client_key, self.to_value(object))
    }
    /// Called for every event before it is debounced, for kinds that keep a view of their own.
    fn observe(&self, _event: &Observed<'_, Self::Object>) {}
    /// Called for an object that is skipped because it does not parse or validate.
    fn skipped(&self, _namespace: &str, _name: &str, _reason: &str) {}
}

/// What [`WatchedKind::observe`] is told.
pub enum Observed<'a, T> {
    /// A new list begins (what was skipped before is reported again as it comes).
    Relisting,
    Listed(&'a BTreeMap<String, (String, T)>),
    Applied {
        client_key: &'a str,
        name: &'a str,
        object: &'a T,
    },
    Deleted {
        client_key: &'a str,
    },
}

/// Changes of one kind waiting for the debouncer: the newest version of each object.
pub struct WatchBatch<T> {
    /// A list replaces everything before it.
    listed: Option<BTreeMap<String, T>>,
    /// Upserts (`Some`) and deletions (`None`) since the list, if any.
    changes: BTreeMap<String, Option<T>>,
}

impl<T> Merge for WatchBatch<T> {
    fn merge(&mut self, other: Self) {
        if other.listed.is_some() {
            *self = other;
            return;
        }
        match &mut self.listed {
            Some(listed) => {
                for (key, change) in other.changes {
                    match change {
                        Some(object) => listed.insert(key, object),
                        None => listed.remove(&key),
                    };
                }
            }
            None => self.changes.extend(other.changes),
        }
    }
}

/// Counts of a watch, by kind.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Objects skipped because they do not deserialize or validate.
    pub skipped: Family<KindLabel, Counter>,
}

impl WatchStats {
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "watch_skipped_objects",
            "Watched objects skipped because they do not deserialize or validate, by kind",
            self.skipped.clone(),
        );
    }
}

fn client_key_of(object: &DynamicObject) -> Option<String> {
    let name = object.metadata.name.as_deref()?;
    Some(client_key(
        name,
        object.metadata.namespace.as_deref().unwrap_or_default(),
    ))
}

/// Runs the watch of `kind` and the debounce stage behind it until shutdown. The kind is marked
/// loaded in the index once its first list is in the index.
pub async fn run<K: WatchedKind>(
    kind: Arc<K>,
    client: Client,
    index: Arc<Index>,
    debounce: DebounceConfig,
    metrics: Arc<Metrics>,
    stats: Arc<WatchStats>,
    shutdown: watch::Receiver<bool>,
) {
    let (batches, rx) = mpsc::channel(BATCH_QUEUE);
    let publish = tokio::spawn(publish(kind.clone(), rx, index.clone(), debounce, metrics));
    watch_events(kind, client, batches, stats, &index, shutdown).await;
    // The watch dropped its sender: the debouncer publishes what is pending, then ends.
    if let Err(err) = publish.await {
        tracing::error!(error = %err, "watch publisher failed");
    }
}

/// The debounce stage of a watched kind: each flush is one index update.
async fn publish<K: WatchedKind>(
    kind: Arc<K>,
    batches: mpsc::Receiver<WatchBatch<K::Object>>,
    index: Arc<Index>,
    config: DebounceConfig,
    metrics: Arc<Metrics>,
) {
    debounce::run(config, batches, |batch: Batch<WatchBatch<K::Object>>| {
        metrics.flushed(batch.events, batch.first_event);
        let k = kind.kind();
        let WatchBatch { listed, changes } = batch.value;
        match listed {
            Some(listed) => {
                let objects: Vec<Change> = listed
                    .iter()
                    .map(|(key, object)| kind.change(key.clone(), object))
                    .collect();
                index.reset_changes(k, objects, 0);
                if !index.is_loaded() {
                    tracing::info!(
                        kind = k.name(),
                        objects = listed.len(),
                        "first list applied"
                    );
                }
                index.mark_loaded(k);
            }
            None => {
                let changes = changes.into_iter().map(|(key, object)| match object {
                    Some(object) => kind.change(key, &object),
                    None => Change::Delete(key),
                });
                index.apply(k, changes, 0);
            }
        }
        std::future::ready(())
    })
    .await;
}

async fn watch_events<K: WatchedKind>(
    kind: Arc<K>,
    client: Client,
    batches: mpsc::Sender<WatchBatch<K::Object>>,
    stats: Arc<WatchStats>,
    index: &Index,
    mut shutdown: watch::Receiver<bool>,
) {
    let k = kind.kind();
    let resource = kind.api_resource();
    let crd = format!("{}.{}", resource.plural, resource.group);
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let events = watcher(api, watcher::Config::default()).default_backoff();
    tokio::pin!(events);
    let mut listing: Option<BTreeMap<String, (String, K::Object)>> = None;
    // Whether a (possibly empty) first state has been handed on.
    let mut listed_once = false;
    // Whether the server ever listed this kind (a missing CRD is served empty without a list).
    let mut listed_by_server = false;
    let parse = |object: &DynamicObject| -> Option<(String, String, Result<K::Object, String>)> {
        let client_key = client_key_of(object)?;
        let name = object.metadata.name.clone().unwrap_or_default();
        Some((client_key, name, kind.parse(object)))
    };
    let skipped = |object: &DynamicObject, client_key: &str, reason: &str| {
        stats.skipped.get_or_create(&k.label()).inc();
        tracing::warn!(kind = k.name(), object = %client_key, %reason, "skipping an object that does not deserialize or validate");
        kind.skipped(
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default(),
            reason,
        );
    };
    // While set, the watch failed after a list: if no other error comes by then, the watcher's
    // retry got it running again (a resumed watch yields no event that would say so).
    let mut quiet_until: Option<Instant> = None;
    loop {
        let event = tokio::select! {
            () = signalled(&mut shutdown) => return,
            () = tokio::time::sleep_until(quiet_until.unwrap_or_else(Instant::now)), if quiet_until.is_some() => {
                quiet_until = None;
                if index.set_condition(k, None) {
                    tracing::info!(kind = k.name(), %crd, "the watch runs again");
                }
                continue;
            }
            event = events.next() => event,
        };
        // `Init` comes before the list request, so it says nothing of the server's answer.
        if matches!(event, Some(Ok(ref e)) if !matches!(e, Event::Init)) {
            // The source answers again: whatever was said of it is over.
            quiet_until = None;
            if index.set_condition(k, None) {
                tracing::info!(kind = k.name(), %crd, "the source answers again");
            }
        }
        if let Some(Err(err)) = &event {
            // Errors of the list are followed by a new list when the source is back; errors of
            // the watch only by silence.
            quiet_until = match err {
                watcher::Error::InitialListFailed(_) => None,
                _ => Some(Instant::now() + WATCH_QUIET),
            };
        }
        let batch = match event {
            None => return,
            Some(Err(err)) if crd_missing(&err) => {
                let condition = SourceCondition {
                    problem: SourceProblem::CrdMissing,
                    message: format!(
                        "CustomResourceDefinition {crd} is not installed: install it with \
                         `kubectl apply -k deploy/` (or `dubbo-cp crd | kubectl apply -f -`); {}",
                        if listed_by_server {
                            "serving the last state of this kind until it is back"
                        } else {
                            "serving none of this kind until it is"
                        }
                    ),
                };
                let message = condition.message.clone();
                if index.set_condition(k, Some(condition)) {
                    tracing::warn!(kind = k.name(), %crd, "{message}");
                }
                if listed_once {
                    // Deleted while running (or a transient 404): the last state stays. Deleting
                    // a CRD deletes its objects first, and the watch delivers those deletions,
                    // so a real removal is already empty; a 404 without them must not wipe
                    // every client's rules.
                    continue;
                }
                // Served as empty rather than never ready; the watcher keeps retrying and
                // picks the CRD up once it exists.
                listed_once = true;
                WatchBatch {
                    listed: Some(BTreeMap::new()),
                    changes: BTreeMap::new(),
                }
            }
            Some(Err(err)) if expired(&err) => {
                // Too old a resourceVersion: the watcher lists again, nothing is wrong.
                tracing::debug!(kind = k.name(), %crd, "watch expired; listing again");
                quiet_until = None;
                continue;
            }
            Some(Err(err)) => {
                tracing::warn!(kind = k.name(), %crd, error = %err, "watch failed; retrying");
                let hint = if error_code(&err) == Some(403) {
                    format!(
                        " (the control plane's service account needs get, list and watch on \
                         {crd}: deploy/rbac.yaml)"
                    )
                } else {
                    String::new()
                };
                let served = if listed_once {
                    "serving the state listed before"
                } else {
                    "this kind is not served until it lists"
                };
                index.set_condition(
                    k,
                    Some(SourceCondition {
                        problem: SourceProblem::Failing,
                        message: format!(
                            "the watch of {crd} is failing ({served}; retrying): {}{hint}",
                            describe(&err)
                        ),
                    }),
                );
                continue;
            }
            Some(Ok(Event::Init)) => {
                listing = Some(BTreeMap::new());
                kind.observe(&Observed::Relisting);
                continue;
            }
            Some(Ok(Event::InitApply(object))) => {
                if let (Some(listing), Some((client_key, name, parsed))) =
                    (listing.as_mut(), parse(&object))
                {
                    match parsed {
                        Ok(parsed) => {
                            listing.insert(client_key, (name, parsed));
                        }
                        Err(reason) => skipped(&object, &client_key, &reason),
                    }
                }
                continue;
            }
            Some(Ok(Event::InitDone)) => {
                listed_once = true;
                listed_by_server = true;
                let listed = listing.take().unwrap_or_default();
                kind.observe(&Observed::Listed(&listed));
                WatchBatch {
                    listed: Some(
                        listed
                            .into_iter()
                            .map(|(key, (_, object))| (key, object))
                            .collect(),
                    ),
                    changes: BTreeMap::new(),
                }
            }
            Some(Ok(Event::Apply(object))) => {
                let Some((client_key, name, parsed)) = parse(&object) else {
                    continue;
                };
                let change = match parsed {
                    Ok(parsed) => {
                        kind.observe(&Observed::Applied {
                            client_key: &client_key,
                            name: &name,
                            object: &parsed,
                        });
                        Some(parsed)
                    }
                    Err(reason) => {
                        // An edit that broke the object takes it out of the state; reported
                        // after the removal, so the report stays.
                        kind.observe(&Observed::Deleted {
                            client_key: &client_key,
                        });
                        skipped(&object, &client_key, &reason);
                        None
                    }
                };
                WatchBatch {
                    listed: None,
                    changes: BTreeMap::from([(client_key, change)]),
                }
            }
            Some(Ok(Event::Delete(object))) => {
                let Some(client_key) = client_key_of(&object) else {
                    continue;
                };
                kind.observe(&Observed::Deleted {
                    client_key: &client_key,
                });
                WatchBatch {
                    listed: None,
                    changes: BTreeMap::from([(client_key, None)]),
                }
            }
        };
        if batches.send(batch).await.is_err() {
            return;
        }
    }
}

/// ServiceNameMapping as a watched kind; it also keeps the [`ClusterView`] the outbox and the
/// writer read.
pub struct MappingKind {
    pub cluster: Arc<ClusterView>,
}

impl WatchedKind for MappingKind {
    type Object = WatchedMapping;

    fn kind(&self) -> Kind {
        Kind::ServiceNameMapping
    }

    fn api_resource(&self) -> ApiResource {
        ApiResource::erase::<ServiceNameMapping>(&())
    }

    fn parse(&self, object: &DynamicObject) -> Result<WatchedMapping, String> {
        let spec = object.data.get("spec").cloned().unwrap_or_default();
        let spec: ServiceNameMappingSpec =
            serde_json::from_value(spec).map_err(|err| format!("spec: {err}"))?;
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let registrants = object
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::mapping::registrants::ANNOTATION))
            .and_then(|text| {
                let parsed = crate::mapping::registrants::parse(text);
                if parsed.is_none() {
                    tracing::warn!(namespace, interface = %spec.interface_name,
                        "unreadable registrant annotation; its applications never expire");
                }
                parsed
            })
            .unwrap_or_default();
        Ok(WatchedMapping {
            key: MappingKey::new(namespace, spec.interface_name),
            applications: spec.application_names.into_iter().collect(),
            registrants,
        })
    }

    fn to_value(&self, object: &WatchedMapping) -> Resource {
        Resource::mapping(
            object.key.interface.clone(),
            object.applications.iter().cloned(),
        )
    }

    fn observe(&self, event: &Observed<'_, WatchedMapping>) {
        match event {
            Observed::Listed(listed) => self.cluster.reset((*listed).clone()),
            Observed::Applied {
                client_key,
                name,
                object,
            } => self.cluster.apply(client_key, name, (*object).clone()),
            Observed::Deleted { client_key } => self.cluster.delete(client_key),
            Observed::Relisting => {}
        }
    }
}

/// A rule kind as a watched kind: objects are validated like `dubbo-cp apply` does; invalid
/// ones are skipped and reported on `/debug/rules`; auth policies reach only their audience.
pub struct RuleKind {
    pub kind: Kind,
    pub catalog: Arc<Catalog>,
    pub root_namespace: String,
}

impl WatchedKind for RuleKind {
    type Object = Rule;

    fn kind(&self) -> Kind {
        self.kind
    }

    fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: "dubbo.apache.org".into(),
            version: "v1alpha1".into(),
            api_version: "dubbo.apache.org/v1alpha1".into(),
            kind: self.kind.name().into(),
            plural: self.kind.plural().into(),
        }
    }

    fn parse(&self, object: &DynamicObject) -> Result<Rule, String> {
        let spec = object
            .data
            .get("spec")
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        let spec = RuleSpec::parse(self.kind, &spec).map_err(|err| err.to_string())?;
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        spec.check_namespace(&namespace)
            .map_err(|err| err.to_string())?;
        Ok(Rule {
            namespace,
            name: object.metadata.name.clone().unwrap_or_default(),
            spec,
            created: object
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|time| time.0.as_millisecond()),
        })
    }

    fn to_value(&self, rule: &Rule) -> Resource {
        Resource::Rule(rule.spec.clone())
    }

    fn change(&self, _client_key: String, rule: &Rule) -> Change {
        change_for(rule, &self.root_namespace)
    }

    fn observe(&self, event: &Observed<'_, Rule>) {
        match event {
            Observed::Relisting => self.catalog.clear_invalid(self.kind),
            Observed::Listed(listed) => self
                .catalog
                .reset(self.kind, listed.values().map(|(_, rule)| rule.clone())),
            Observed::Applied { object, .. } => self.catalog.upsert((*object).clone()),
            Observed::Deleted { client_key } => {
                // Client keys are `<name>/<namespace>`.
                if let Some((name, namespace)) = client_key.split_once('/') {
                    self.catalog
                        .remove(&(self.kind, namespace.to_owned(), name.to_owned()));
                }
            }
        }
    }

    fn skipped(&self, namespace: &str, name: &str, reason: &str) {
        self.catalog.skip(
            (self.kind, namespace.to_owned(), name.to_owned()),
            reason.to_owned(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes(items: &[(&str, Option<u32>)]) -> WatchBatch<u32> {
        WatchBatch {
            listed: None,
            changes: items
                .iter()
                .map(|(key, value)| (key.to_string(), *value))
                .collect(),
        }
    }

    #[test]
    fn a_service_entrys_creation_time_reaches_the_index() {
        let kind = RuleKind {
            kind: Kind::ServiceEntry,
            catalog: Arc::new(Catalog::default()),
            root_namespace: "dubbo-system".into(),
        };
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "ServiceEntry",
            "metadata": {"name": "payments", "namespace": "shop",
                         "creationTimestamp": "2026-11-28T01:02:03Z"},
            "spec": {"hosts": ["api.payments.internal"],
                     "ports": [{"number": 50051, "name": "grpc"}]},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let rule = kind.parse(&object).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rule.created, Some(1_795_827_723_000));
        assert!(matches!(
            kind.change("payments/shop".into(), &rule),
            Change::Dated(_, _, 1_795_827_723_000)
        ));
    }

    #[test]
    fn batches_keep_the_newest_version_and_a_list_replaces_what_came_before() {
        let mut batch = changes(&[("a", Some(1)), ("b", Some(1))]);
        batch.merge(changes(&[("a", Some(2)), ("b", None)]));
        assert_eq!(batch.changes.get("a"), Some(&Some(2)));
        assert_eq!(batch.changes.get("b"), Some(&None));

        batch.merge(WatchBatch {
            listed: Some(BTreeMap::from([("c".to_string(), 1)])),
            changes: BTreeMap::new(),
        });
        assert!(batch.changes.is_empty());
        batch.merge(changes(&[("c", None), ("d", Some(4))]));
        let listed = batch.listed.unwrap_or_default();
        assert_eq!(listed, BTreeMap::from([("d".to_string(), 4)]));
    }
}
