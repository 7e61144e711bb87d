//! The discovery stream's encoding of the index: each object's `<Kind>ToClient` message packed as
//! an `ObserveResponse.data` record, encoded once per change of the object (memoised on it), and
//! each state's records assembled once per revision (memoised on the state), with the filtered
//! views of auth policies and the state's digest beside them. Every stream shares those bytes.

use crate::index::Labelled as _;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use prost::Message;
use prost_types::Any;

use super::wire::EncodedData;
use crate::index::{Kind, KindLabel, KindSnapshot, Object, Resource};
use crate::pb::rules::{ServiceNameMapping, ServiceNameMappingToClient};
use dubbo_cp_domain::rules::scope::Endpoint;

/// gRPC clients (grpc-java, grpc-go) refuse messages over 4 MiB unless configured otherwise; a
/// full-state response above it would never arrive.
pub const CLIENT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Room left for a response's nonce, type and revision.
const RESPONSE_HEAD_BYTES: usize = 1024;
/// Bytes of filtered views one state keeps; beyond it views are assembled uncached.
const MAX_VIEW_BYTES_PER_STATE: usize = 64 * 1024 * 1024;

/// Hex SHA-256 over `(key, encoded object)` pairs in key order, each length-prefixed so no two
/// different states hash the same input.
pub fn state_digest<'a>(objects: impl Iterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for (key, encoded) in objects {
        context.update(&(key.len() as u64).to_be_bytes());
        context.update(key.as_bytes());
        context.update(&(encoded.len() as u64).to_be_bytes());
        context.update(encoded);
    }
    hex(context.finish().as_ref())
}

/// Hex SHA-256 of one encoded object, shortened: enough to tell two versions apart.
pub fn object_digest(encoded: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, encoded);
    hex(&digest.as_ref()[..8])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The packed `ServiceNameMappingToClient` of an object whose client key is known (in
/// Kubernetes mode it comes from the object's actual name, which kubectl users choose).
pub fn mapping_any(
    client_key: &str,
    interface: &str,
    applications: impl IntoIterator<Item = String>,
) -> Any {
    let message = ServiceNameMappingToClient {
        key: client_key.to_owned(),
        spec: Some(ServiceNameMapping {
            interface_name: interface.to_owned(),
            application_names: applications.into_iter().collect(),
        }),
    };
    Any {
        type_url: crate::pb::type_url(Kind::ServiceNameMapping).to_owned(),
        value: message.encode_to_vec(),
    }
}

/// The packed `<Kind>ToClient` message of `value` under `client_key` (wire.md §2).
pub fn to_any(client_key: &str, value: &Resource) -> Any {
    match value {
        Resource::Mapping {
            interface,
            applications,
        } => mapping_any(client_key, interface, applications.iter().cloned()),
        Resource::Rule(spec) => super::rules::to_any(spec, client_key),
        // The discovery stream has no message for it and never subscribes to it
        // (`Kind::DISCOVERY`); xDS serves it.
        Resource::Service(_) => Any {
            type_url: crate::pb::type_url(Kind::Service).to_owned(),
            value: Vec::new(),
        },
    }
}

/// What the encoding counts, per kind. The series keep the names they had when the index
/// encoded (`index_object_encodes`, ...), so dashboards keep working.
#[derive(Debug, Default)]
pub struct EncodeStats {
    /// Objects encoded (each at most once per change of that object).
    pub encodes: Family<KindLabel, Counter>,
    /// States assembled (one per published revision that a reader asked for).
    pub assemblies: Family<KindLabel, Counter>,
    /// Encoded size of the current state: what every full-state response carries.
    pub state_bytes: Family<KindLabel, Gauge>,
    /// Filtered views assembled (auth policies: one per distinct set of objects per state).
    pub view_assemblies: Family<KindLabel, Counter>,
}

impl EncodeStats {
    pub fn encodes_of(&self, kind: Kind) -> u64 {
        self.encodes.get_or_create(&kind.label()).get()
    }

    pub fn assemblies_of(&self, kind: Kind) -> u64 {
        self.assemblies.get_or_create(&kind.label()).get()
    }

    pub fn view_assemblies_of(&self, kind: Kind) -> u64 {
        self.view_assemblies.get_or_create(&kind.label()).get()
    }
}

/// One object's `data` record.
struct Record(Bytes);

/// One state, encoded.
pub struct EncodedState {
    /// Every object's record, in key order.
    records: Vec<Bytes>,
    /// The records assembled: what a client that sees the whole state receives.
    pub data: EncodedData,
    /// Filtered views by the positions of the objects they include: clients that see the same
    /// set share one assembly (10,000 clients in 50 namespaces: about 50 per change).
    views: Mutex<Views>,
    digest: OnceLock<String>,
}

/// The filtered views of one state, bounded in bytes.
#[derive(Default)]
struct Views {
    by_objects: HashMap<Vec<u32>, EncodedData>,
    bytes: usize,
}

/// Encodes index states for the discovery stream; one per process, shared by every stream,
/// the digest and `/metrics`.
#[derive(Debug, Default)]
pub struct Encoder {
    stats: EncodeStats,
}

impl Encoder {
    pub fn stats(&self) -> &EncodeStats {
        &self.stats
    }

    fn record(&self, kind: Kind, key: &str, object: &Object) -> Bytes {
        object
            .memo(|| {
                self.stats.encodes.get_or_create(&kind.label()).inc();
                Record(EncodedData::record(&to_any(key, &object.value)))
            })
            .0
            .clone()
    }

    /// `snapshot` encoded; assembled by the first reader of its revision, shared after.
    pub fn state(&self, snapshot: &KindSnapshot) -> Arc<EncodedState> {
        snapshot.memo(|| {
            let kind = snapshot.kind;
            let records: Vec<Bytes> = snapshot
                .objects
                .iter()
                .map(|(key, object)| self.record(kind, key, object))
                .collect();
            let data = EncodedData::assemble(records.iter());
            if data.len() + RESPONSE_HEAD_BYTES > CLIENT_MAX_MESSAGE_BYTES {
                tracing::warn!(
                    kind = kind.name(),
                    bytes = data.len(),
                    objects = records.len(),
                    "the full state is over the 4 MiB clients accept by default; raise the \
                     clients' max inbound message size or keep fewer or smaller objects"
                );
            }
            let label = kind.label();
            self.stats.assemblies.get_or_create(&label).inc();
            self.stats
                .state_bytes
                .get_or_create(&label)
                .set(i64::try_from(data.len()).unwrap_or(i64::MAX));
            EncodedState {
                records,
                data,
                views: Mutex::new(Views::default()),
                digest: OnceLock::new(),
            }
        })
    }

    /// What `endpoint` receives of `snapshot`: the whole state, or only the objects whose
    /// audience includes it.
    pub fn view_for(&self, snapshot: &KindSnapshot, endpoint: &Endpoint) -> EncodedData {
        let state = self.state(snapshot);
        let Some(included) = snapshot.included_for(endpoint) else {
            return state.data.clone();
        };
        if let Some(view) = state.lock_views().by_objects.get(&included) {
            return view.clone();
        }
        // Assembled outside the lock: other streams of this state keep reading the cache.
        let records = included
            .iter()
            .filter_map(|i| state.records.get(usize::try_from(*i).ok()?));
        let view = EncodedData::assemble(records);
        self.stats
            .view_assemblies
            .get_or_create(&snapshot.kind.label())
            .inc();
        let mut views = state.lock_views();
        if views.bytes + view.len() <= MAX_VIEW_BYTES_PER_STATE
            && !views.by_objects.contains_key(&included)
        {
            views.bytes += view.len();
            views.by_objects.insert(included, view.clone());
        }
        view
    }

    /// SHA-256 over the sorted (key, encoded object) pairs: equal digests, byte-identical state.
    pub fn digest(&self, snapshot: &KindSnapshot) -> String {
        let state = self.state(snapshot);
        state
            .digest
            .get_or_init(|| {
                state_digest(
                    snapshot
                        .objects
                        .keys()
                        .zip(&state.records)
                        .map(|(key, record)| (key.as_str(), record.as_ref())),
                )
            })
            .clone()
    }

    /// Each object's digest by key, to say which objects differ where states do.
    pub fn object_digests(&self, snapshot: &KindSnapshot) -> BTreeMap<String, String> {
        let state = self.state(snapshot);
        snapshot
            .objects
            .keys()
            .zip(&state.records)
            .map(|(key, record)| (key.clone(), object_digest(record)))
            .collect()
    }

    /// Registers the encoding's series.
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
            "index_view_assemblies",
            "Filtered views assembled for clients (auth policies), by kind",
            self.stats.view_assemblies.clone(),
        );
    }
}

impl EncodedState {
    fn lock_views(&self) -> std::sync::MutexGuard<'_, Views> {
        self.views.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Filtered views cached for this state.
    pub fn views_assembled(&self) -> usize {
        self.lock_views().by_objects.len()
    }
}

#[cfg(test)]
mod tests;
