//! One ADS stream's state of the world, per resource type: what the client subscribed to, what
//! was last sent (version, nonce, each resource), what it acknowledged or rejected.
//! No I/O; the server feeds it requests and asks it what to send.

use std::collections::BTreeSet;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::Any;

pub use crate::clients::Nack;
use crate::clients::{ClientStatus, Held, HeldResources, TypeStatus};
use crate::{CLUSTER, ENDPOINT, LISTENER, PUSH_ORDER, ROUTE};
pub use response::Response;

/// Most names one type's subscription may hold; a client asking for more is refused.
pub const MAX_NAMES: usize = 10_000;

/// What the server does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Answer the type in full (a first request, a reconnect, a changed subscription).
    Answer(&'static str),
    /// Nothing to send: an ACK or NACK of what was sent, with the same names.
    Settled,
    /// A request answering an older response (its nonce is not the last one sent): ignored.
    Stale,
}

/// A request the stream refuses; the server ends the stream with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("type_url {0:?} is not served; one of {PUSH_ORDER:?}")]
    UnknownType(String),
    #[error("resource_names holds {0} names for {1}; at most {MAX_NAMES} per type")]
    TooManyNames(usize, &'static str),
}

/// The resources of a type a subscription selects, by name, each encoded once per version and
/// shared by every stream that holds it.
pub type Selected = Vec<(String, Arc<Any>)>;

/// What was last sent for a type.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub version: String,
    pub nonce: String,
    /// The stream's count of responses at this one (its nonce, as a number).
    number: u64,
    /// Name -> the resource, to tell whether a new version changes anything and to show
    /// operators what the client holds (`/debug/xds/config_dump`). The encodings are the
    /// snapshot's, and the map is shared with the client's status.
    held: HeldResources,
    /// Names subscribed to that the response left out (they do not exist).
    absent: imbl::OrdSet<String>,
    /// When it was sent: how long a client has left it unacknowledged.
    at: std::time::Instant,
}

/// One type's state on one stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeState {
    pub names: BTreeSet<String>,
    /// Every resource of the type (listeners and clusters only).
    pub wildcard: bool,
    /// Boxed: `None` until the first response, and every byte inline is paid per stream.
    pub sent: Option<Box<Sent>>,
    /// The last version the client acknowledged.
    pub acked: Option<String>,
    /// The last rejection, kept until a later version is acknowledged.
    pub nack: Option<Nack>,
    /// The newest response acknowledged, and what it held (what a NACK leaves the client on).
    pub(crate) acked_nonce: u64,
    pub(crate) accepted: HeldResources,
    /// The names changed since the last response was selected from them (a request that
    /// changes them is answered in full; until then, what was sent says nothing of them).
    pub(crate) renamed: bool,
}

/// A stream's state per type: a few entries at most (the types served), kept in a vector. A
/// `BTreeMap` allocates a node of eleven entries, and every stream has one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TypeMap<T>(Vec<(&'static str, T)>);

impl<T> Default for TypeMap<T> {
    fn default() -> Self {
        TypeMap(Vec::new())
    }
}

impl<T: Default> TypeMap<T> {
    pub(crate) fn entry_or_default(&mut self, type_url: &'static str) -> &mut T {
        let at = match self.0.iter().position(|(t, _)| *t == type_url) {
            Some(at) => at,
            None => {
                self.0.push((type_url, T::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[at].1
    }

    pub(crate) fn get(&self, type_url: &str) -> Option<&T> {
        self.0.iter().find(|(t, _)| *t == type_url).map(|(_, v)| v)
    }

    pub(crate) fn get_mut(&mut self, type_url: &str) -> Option<&mut T> {
        self.0
            .iter_mut()
            .find(|(t, _)| *t == type_url)
            .map(|(_, v)| v)
    }

    pub(crate) fn contains_key(&self, type_url: &str) -> bool {
        self.get(type_url).is_some()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&&'static str, &T)> {
        self.0.iter().map(|(t, v)| (t, v))
    }
}

/// One ADS stream.
#[derive(Debug, Default)]
pub struct Stream {
    /// The client's node, from its first request.
    pub node: Option<Node>,
    types: TypeMap<TypeState>,
    nonces: u64,
}

pub(crate) fn known_type(type_url: &str) -> Option<&'static str> {
    PUSH_ORDER.into_iter().find(|known| *known == type_url)
}

/// A digest of an encoding: the version of a resource on delta streams, which a reconnecting
/// client sends back (`initial_resource_versions`).
pub(crate) fn digest(any: &Any) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    any.type_url.hash(&mut hasher);
    any.value.hash(&mut hasher);
    hasher.finish()
}

/// `name`'s entry in `held` pointed at `any` (the same bytes), if it points elsewhere. Looked at
/// before it is changed: changing a shared map copies it apart from the other holder (what the
/// client accepted, which [`Stream::respond_following`] needs it to be).
fn refresh(held: &mut HeldResources, name: &str, any: &Arc<Any>) {
    let elsewhere = held
        .get(name)
        .and_then(|held| held.resource.as_ref())
        .is_some_and(|resource| !Arc::ptr_eq(resource, any));
    if elsewhere && let Some(held) = held.get_mut(name) {
        held.resource = Some(any.clone());
    }
}

/// Whether two encodings say the same (the same bytes; the same `Arc` is the quick case).
pub(crate) fn same(a: &Arc<Any>, b: &Arc<Any>) -> bool {
    Arc::ptr_eq(a, b) || (a.value == b.value && a.type_url == b.type_url)
}

/// Records the client's answer to the last response (sent at `sent_version`): an ACK moves the
/// acknowledged version and clears the last NACK; a NACK (`error`) is kept until then.
/// The most of a client's text (node ID, NACK message) a stream keeps: every stream holds its
/// own, and a request may be a megabyte.
pub const MAX_KEPT_TEXT: usize = 1024;

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn truncated(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// What a stream keeps of the client's node: its ID (truncated) and its `NAMESPACE`, not the
/// rest of its metadata, which may be large.
pub(crate) fn kept_node(node: &Node) -> Node {
    use envoy_types::pb::google::protobuf::{Struct, Value, value};
    let namespace = node
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("NAMESPACE"))
        .and_then(|v| match &v.kind {
            Some(value::Kind::StringValue(ns)) => Some(truncated(ns, 253)),
            _ => None,
        });
    Node {
        id: truncated(&node.id, MAX_KEPT_TEXT),
        metadata: namespace.map(|ns| Struct {
            fields: [(
                "NAMESPACE".to_owned(),
                Value {
                    kind: Some(value::Kind::StringValue(ns)),
                },
            )]
            .into(),
        }),
        ..Default::default()
    }
}

/// Whether the answer is an ACK.
pub(crate) fn record_answer(
    acked: &mut Option<String>,
    nack: &mut Option<Nack>,
    acked_nonce: &mut u64,
    sent: (Option<String>, u64),
    error: Option<&envoy_types::pb::google::rpc::Status>,
) -> bool {
    let (sent_version, sent_nonce) = sent;
    match error {
        Some(status) => {
            *nack = Some(Nack {
                version: sent_version.unwrap_or_default(),
                message: truncated(&status.message, MAX_KEPT_TEXT),
                nonce: sent_nonce,
            });
            false
        }
        None => {
            *acked = sent_version;
            *acked_nonce = (*acked_nonce).max(sent_nonce);
            *nack = None;
            true
        }
    }
}

impl Stream {
    /// Takes one request: records the node, the subscription, an ACK or a NACK, and says
    /// whether to answer.
    pub fn on_request(&mut self, request: &DiscoveryRequest) -> Result<Verdict, Refused> {
        let Some(type_url) = known_type(&request.type_url) else {
            return Err(Refused::UnknownType(request.type_url.clone()));
        };
        if request.resource_names.len() > MAX_NAMES {
            return Err(Refused::TooManyNames(
                request.resource_names.len(),
                type_url,
            ));
        }
        if self.node.is_none() {
            self.node = request.node.as_ref().map(kept_node);
        }
        let state = self.types.entry_or_default(type_url);
        let first = state.sent.is_none() && state.names.is_empty() && !state.wildcard;
        if !request.response_nonce.is_empty()
            && state.sent.as_ref().map(|s| s.nonce.as_str()) != Some(&request.response_nonce)
        {
            return Ok(Verdict::Stale);
        }
        // Compared before anything is copied: an ACK names what the stream holds already, and
        // building a set of copies of its names at every ACK was a tenth of the stream's time.
        let wildcard_types = type_url == LISTENER || type_url == CLUSTER;
        let mut asked: Vec<&str> = request
            .resource_names
            .iter()
            .map(String::as_str)
            .filter(|name| !(wildcard_types && *name == "*"))
            .collect();
        let star = asked.len() < request.resource_names.len();
        asked.sort_unstable();
        asked.dedup();
        // Wildcard exists for listeners and clusters only: `*`, or no names in the first request
        // (and after it, for as long as the client keeps sending none).
        let wildcard = wildcard_types && (star || (asked.is_empty() && (first || state.wildcard)));
        let same_names = asked.len() == state.names.len()
            && asked
                .iter()
                .zip(&state.names)
                .all(|(a, b)| *a == b.as_str());
        let changed = !same_names || wildcard != state.wildcard;
        if !same_names {
            state.names = asked.into_iter().map(str::to_owned).collect();
        }
        state.renamed |= changed;
        state.wildcard = wildcard;
        if request.response_nonce.is_empty() {
            // A first request, or a reconnect (which carries the last version it had): answered
            // in full whatever it says it has.
            return Ok(Verdict::Answer(type_url));
        }
        let sent = state
            .sent
            .as_ref()
            .map_or((None, 0), |s| (Some(s.version.clone()), s.number));
        let acked = record_answer(
            &mut state.acked,
            &mut state.nack,
            &mut state.acked_nonce,
            sent,
            request.error_detail.as_ref(),
        );
        if acked && let Some(sent) = &state.sent {
            state.accepted = sent.held.clone();
        }
        Ok(if changed {
            Verdict::Answer(type_url)
        } else {
            Verdict::Settled
        })
    }

    /// The stream as operators see it.
    pub fn status(&self, namespace: &str, seen: Option<u64>) -> ClientStatus {
        ClientStatus::of(self.node.as_ref(), namespace, seen, self.type_statuses())
    }

    /// Each subscribed type's status, for [`Stream::status`] and its in-place refresh.
    pub(crate) fn type_statuses(&self) -> impl Iterator<Item = (&'static str, TypeStatus)> + '_ {
        self.types.iter().map(|(type_url, state)| {
            let sent = state.sent.as_deref();
            let status = TypeStatus {
                names: state.names.len(),
                wildcard: state.wildcard,
                sent: sent.map(|s| s.version.clone()),
                acked: state.acked.clone(),
                nack: state.nack.clone(),
                held: sent.map(|s| s.held.clone()).unwrap_or_default(),
                acked_nonce: state.acked_nonce,
                accepted: state.accepted.clone(),
                absent: sent.map(|s| s.absent.clone()).unwrap_or_default(),
                sent_at: sent.map(|s| s.at),
                sent_nonce: sent.map_or(0, |s| s.number),
            };
            (*type_url, status)
        })
    }

    /// What the client was last sent of resource `name` of `type_url`.
    pub fn held_resource(&self, type_url: &str, name: &str) -> Option<Arc<Any>> {
        let sent = self.types.get(type_url)?.sent.as_ref()?;
        sent.held.get(name)?.resource.clone()
    }

    /// The state of `type_url` (what the client subscribed to, sent, acknowledged).
    pub fn state(&self, type_url: &str) -> Option<&TypeState> {
        self.types.get(type_url)
    }

    /// The types the client subscribed to, in push order.
    pub fn subscribed(&self) -> impl Iterator<Item = &'static str> + '_ {
        PUSH_ORDER
            .into_iter()
            .filter(|type_url| self.types.contains_key(type_url))
    }

    /// Whether answering `type_url` with `resources` would take away a resource the client
    /// was sent (state of the world: one left out is deleted).
    pub fn would_remove(&self, type_url: &str, resources: &Selected) -> bool {
        self.types
            .get(type_url)
            .and_then(|state| state.sent.as_ref())
            .is_some_and(|sent| {
                sent.held
                    .keys()
                    .any(|name| !resources.iter().any(|(n, _)| **n == **name))
            })
    }

    /// What [`Stream::respond`] would answer for a type sent only when changed (load
    /// assignments), at a version that follows the one last sent, where only the names
    /// `touches` says may differ, each `lookup`ed; `None` when that cannot be told without the
    /// whole selection, which [`Stream::respond`] then takes.
    ///
    /// At an endpoint change every stream holding the service answers it; this reads what it
    /// holds once, looks up only what was touched, and copies nothing it holds unless that
    /// changed (the whole selection, looked up and rebuilt name by name, was a fifth of the
    /// server's CPU per push at 10,000 streams). It answers only where that is the same as the
    /// whole selection's answer: the client acknowledged what it was last sent (else what it
    /// did not take goes again), its names are those that response was selected from, every
    /// touched name held still exists and no touched name known absent has appeared (else what
    /// is held or absent changes).
    pub(crate) fn respond_following(
        &mut self,
        type_url: &'static str,
        version: &str,
        touches: impl Fn(&str) -> bool,
        lookup: impl Fn(&str) -> Option<Arc<Any>>,
    ) -> Option<Option<Response>> {
        // Load assignments only: `lookup` answers for names of clusters, not of routes.
        if type_url != ENDPOINT {
            return None;
        }
        let state = self.types.get_mut(type_url)?;
        let sent = state.sent.as_mut()?;
        // What was sent is what was selected from these names: held or absent, each once.
        if state.renamed
            || !sent.held.ptr_eq(&state.accepted)
            || sent.held.len() + sent.absent.len() != state.names.len()
        {
            return None;
        }
        // The held entries are read in place, in the names' order (no lookup per name, and the
        // subscription's own copy of the names is not read at all); a touched name known absent
        // that exists now would be new.
        let mut updates: Vec<(&str, bool, bool, Arc<Any>)> = Vec::new();
        for (name, held) in sent.held.iter() {
            if !touches(name) {
                continue;
            }
            let any = lookup(name)?;
            let resource = held.resource.as_ref()?;
            let elsewhere = !Arc::ptr_eq(resource, &any);
            updates.push((name, same(resource, &any), elsewhere, any));
        }
        if sent
            .absent
            .iter()
            .any(|name| touches(name) && lookup(name).is_some())
        {
            return None;
        }
        if updates.iter().all(|(_, same, _, _)| *same) {
            // Nothing new: this version's pointers, as `respond` keeps them (rarely any).
            let repointed: Vec<(String, Arc<Any>)> = updates
                .into_iter()
                .filter(|(_, _, elsewhere, _)| *elsewhere)
                .map(|(name, _, _, any)| (name.to_owned(), any))
                .collect();
            for (name, any) in repointed {
                refresh(&mut sent.held, &name, &any);
            }
            return Some(None);
        }
        self.nonces += 1;
        let number = self.nonces;
        let nonce = number.to_string();
        let mut held = sent.held.clone();
        let mut carried = Vec::new();
        let shared_version: Arc<str> = version.into();
        for (name, same, _, any) in updates {
            let Some(entry) = held.get_mut(name) else {
                continue;
            };
            if same {
                // Held and acknowledged as it is: it keeps the version that carried it.
                entry.resource = Some(any);
            } else {
                carried.push(any.clone());
                *entry = Held::sent(any, Some(shared_version.clone()), number);
            }
        }
        // The names held are the same, so what is absent is too (and was logged when it was
        // first absent).
        **sent = Sent {
            version: version.to_owned(),
            nonce: nonce.clone(),
            number,
            held,
            absent: sent.absent.clone(),
            at: std::time::Instant::now(),
        };
        Some(Some(Response {
            version_info: version.to_owned(),
            resources: carried,
            type_url: type_url.to_owned(),
            nonce,
        }))
    }

    /// The response for `type_url` at `version` holding `resources`, recorded as sent. Unless
    /// `force`, `None` when it would say nothing new (the same resources as last sent).
    pub fn respond(
        &mut self,
        type_url: &'static str,
        version: &str,
        resources: Selected,
        force: bool,
    ) -> Option<Response> {
        let state = self.types.entry_or_default(type_url);
        let unchanged = state.sent.as_ref().is_some_and(|sent| {
            sent.held.len() == resources.len()
                && resources.iter().all(|(name, any)| {
                    sent.held
                        .get(name.as_str())
                        .and_then(|held| held.resource.as_ref())
                        .is_some_and(|held| same(held, any))
                })
        });
        if !force && unchanged {
            // The same bytes under this version's pointers, so a stream does not keep an older
            // version's copy alive (snapshots share unchanged encodings, so this is rare).
            if let Some(sent) = &mut state.sent {
                for (name, any) in &resources {
                    refresh(&mut sent.held, name, any);
                }
            }
            return None;
        }
        self.nonces += 1;
        let number = self.nonces;
        let nonce = number.to_string();
        // Routes and load assignments are sent only when they change: unlike listeners and
        // clusters, a state-of-the-world response of these types need not hold every resource
        // subscribed to, and clients keep those it leaves out (the xDS protocol's "grouped as
        // in the incremental variants"). At one endpoint change the response is one resource,
        // not every one the stream holds. Changed from what the client acknowledged, not from
        // what it was sent: a rejected or unanswered response's resources go again. A forced
        // answer (a request waits on it) holds all. Each keeps the version of the response
        // that carried it, as the client's own config dump shows it.
        let partial = !force && matches!(type_url, ENDPOINT | ROUTE);
        let before = partial.then_some(&state.accepted);
        let mut carried = Vec::with_capacity(resources.len());
        let shared_version: Option<Arc<str>> = partial.then(|| version.into());
        let held: HeldResources = resources
            .iter()
            .map(|(name, any)| {
                let kept = before
                    .and_then(|held| held.get(name.as_str()))
                    .filter(|held| held.resource.as_ref().is_some_and(|r| same(r, any)));
                let held = match kept {
                    Some(kept) => Held {
                        resource: Some(any.clone()),
                        ..kept.clone()
                    },
                    None => {
                        carried.push(any.clone());
                        Held::sent(any.clone(), shared_version.clone(), number)
                    }
                };
                (Arc::from(name.as_str()), held)
            })
            .collect();
        let absent: imbl::OrdSet<String> = state
            .names
            .iter()
            .filter(|name| !held.contains_key(name.as_str()))
            .cloned()
            .collect();
        let before = state.sent.as_ref().map(|sent| &sent.absent);
        crate::clients::log_not_found(
            self.node.as_ref(),
            type_url,
            crate::clients::newly_absent(before, &absent),
        );
        state.renamed = false;
        state.sent = Some(Box::new(Sent {
            version: version.to_owned(),
            nonce: nonce.clone(),
            number,
            held,
            absent,
            at: std::time::Instant::now(),
        }));
        Some(Response {
            version_info: version.to_owned(),
            resources: carried,
            type_url: type_url.to_owned(),
            nonce,
        })
    }
}

mod response;

#[cfg(test)]
mod tests;
