//! One incremental (delta) ADS stream's state per type: subscriptions that grow and shrink, the
//! version of every resource the client holds, and what to send: only resources that changed,
//! and the names of those that are gone. Envoy speaks it; gRPC clients speak state of the world.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::clients::{ClientStatus, Held, HeldResources, TypeStatus};
use crate::protocol::{
    MAX_NAMES, Nack, Refused, Selected, TypeMap, Verdict, digest, known_type, record_answer,
};
use crate::{CLUSTER, LISTENER, PUSH_ORDER};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;

/// One type's state on one delta stream.
#[derive(Debug, Clone, Default)]
struct DeltaType {
    subscribed: BTreeSet<String>,
    wildcard: bool,
    /// Name -> version (and encoding, once sent) of every resource the client holds, as far as
    /// this server knows.
    known: HeldResources,
    /// Names subscribed to that do not exist, already told so in `removed_resources` (the
    /// protocol's way of saying "does not exist"; Envoy waits for it), so it is said once.
    absent: imbl::OrdSet<String>,
    /// The last response sent for the type (the stream's count of responses then).
    nonce: Option<u64>,
    sent: Option<String>,
    /// When the last response was sent: how long a client has left it unacknowledged.
    sent_at: Option<std::time::Instant>,
    acked: Option<String>,
    acked_nonce: u64,
    nack: Option<Nack>,
}

/// One delta ADS stream.
#[derive(Debug, Default)]
pub struct DeltaStream {
    pub node: Option<Node>,
    types: TypeMap<DeltaType>,
    nonces: u64,
}

impl DeltaStream {
    /// Takes one request: subscriptions, an ACK or a NACK, and whether to answer. Subscription
    /// changes count even when the nonce is stale (the protocol says so).
    pub fn on_request(&mut self, request: &DeltaDiscoveryRequest) -> Result<Verdict, Refused> {
        let Some(type_url) = known_type(&request.type_url) else {
            return Err(Refused::UnknownType(request.type_url.clone()));
        };
        if self.node.is_none() {
            self.node = request.node.as_ref().map(crate::protocol::kept_node);
        }
        let state = self.types.entry_or_default(type_url);
        let wanted = state.subscribed.len()
            + request.resource_names_subscribe.len()
            + request.initial_resource_versions.len();
        if wanted > MAX_NAMES {
            return Err(Refused::TooManyNames(wanted, type_url));
        }
        let first = state.nonce.is_none() && state.subscribed.is_empty() && !state.wildcard;
        if first {
            // A reconnecting client says what it holds; only what differs is sent.
            state.known = request
                .initial_resource_versions
                .iter()
                .map(|(name, version)| {
                    let held = Held {
                        version: Some(version.as_str().into()),
                        resource: None,
                        nonce: 0,
                    };
                    (Arc::from(name.as_str()), held)
                })
                .collect();
        }
        let mut added = false;
        for name in &request.resource_names_subscribe {
            if name == "*" {
                added |= !state.wildcard;
                state.wildcard = true;
            } else {
                added |= state.subscribed.insert(name.clone());
            }
        }
        for name in &request.resource_names_unsubscribe {
            if name == "*" {
                state.wildcard = false;
            } else {
                state.subscribed.remove(name);
                state.absent.remove(name);
                state.known.remove(name.as_str());
            }
        }
        if first
            && request.resource_names_subscribe.is_empty()
            && (type_url == LISTENER || type_url == CLUSTER)
        {
            state.wildcard = true;
        }
        let nonce = request.response_nonce.as_str();
        let answers_last = state.nonce.is_some_and(|n| n.to_string() == nonce);
        if !nonce.is_empty() && answers_last {
            record_answer(
                &mut state.acked,
                &mut state.nack,
                &mut state.acked_nonce,
                (state.sent.clone(), state.nonce.unwrap_or_default()),
                request.error_detail.as_ref(),
            );
        } else if !nonce.is_empty() && !added {
            return Ok(Verdict::Stale);
        }
        Ok(if first || added {
            Verdict::Answer(type_url)
        } else {
            Verdict::Settled
        })
    }

    /// What the client holds of resource `name` of `type_url`, as this server sent it.
    pub fn held_resource(&self, type_url: &str, name: &str) -> Option<Arc<Any>> {
        self.types.get(type_url)?.known.get(name)?.resource.clone()
    }

    /// The names subscribed to of `type_url`, and whether it is a wildcard subscription.
    pub fn subscribed_names(&self, type_url: &str) -> Option<(&BTreeSet<String>, bool)> {
        self.types
            .get(type_url)
            .map(|state| (&state.subscribed, state.wildcard))
    }

    /// The types the client subscribed to, in push order.
    pub fn subscribed(&self) -> impl Iterator<Item = &'static str> + '_ {
        PUSH_ORDER
            .into_iter()
            .filter(|type_url| self.types.contains_key(type_url))
    }

    /// Whether answering `type_url` with `resources` would remove a resource the client holds.
    pub fn would_remove(&self, type_url: &str, resources: &Selected) -> bool {
        self.types.get(type_url).is_some_and(|state| {
            state
                .known
                .keys()
                .any(|name| !resources.iter().any(|(n, _)| **n == **name))
        })
    }

    /// The resources of `resources` the client does not hold at their version, the names it
    /// holds that are gone, and the names it subscribed to that do not exist (once each); `None`
    /// when that is nothing and the client is not waiting (`force`).
    pub fn respond(
        &mut self,
        type_url: &'static str,
        version: &str,
        resources: Selected,
        force: bool,
    ) -> Option<DeltaDiscoveryResponse> {
        let state = self.types.entry_or_default(type_url);
        let present: BTreeSet<&str> = resources.iter().map(|(name, _)| name.as_str()).collect();
        // Held and gone, then subscribed, never held and not there ("does not exist"): each said
        // once, until it appears.
        state.absent = state
            .absent
            .iter()
            .filter(|name| !present.contains(name.as_str()))
            .cloned()
            .collect();
        let mut removed: Vec<String> = state
            .known
            .keys()
            .filter(|name| !present.contains(&***name))
            .map(|name| name.to_string())
            .collect();
        removed.extend(
            state
                .subscribed
                .iter()
                .filter(|name| {
                    !present.contains(name.as_str())
                        && !state.known.contains_key(name.as_str())
                        && !state.absent.contains(name.as_str())
                })
                .cloned(),
        );
        let mut changed = Vec::new();
        for (name, any) in resources {
            let resource_version = format!("{:016x}", digest(&any));
            match state.known.get_mut(name.as_str()) {
                Some(held) if held.version.as_deref() == Some(resource_version.as_str()) => {
                    // Held at this version (perhaps only claimed on reconnect): this version's
                    // encoding, for the dump, without sending it.
                    if held.resource.as_ref().is_none_or(|r| !Arc::ptr_eq(r, &any)) {
                        held.resource = Some(any);
                    }
                }
                _ => changed.push((name, resource_version, any)),
            }
        }
        if changed.is_empty() && removed.is_empty() && !force {
            return None;
        }
        self.nonces += 1;
        let number = self.nonces;
        let mut newly_absent = Vec::new();
        for name in &removed {
            state.known.remove(name.as_str());
            if state.subscribed.contains(name) && state.absent.insert(name.clone()).is_none() {
                newly_absent.push(name);
            }
        }
        crate::clients::log_not_found(self.node.as_ref(), type_url, newly_absent.into_iter());
        let known = &mut state.known;
        let changed: Vec<Resource> = changed
            .into_iter()
            .map(|(name, version, any)| {
                known.insert(
                    name.as_str().into(),
                    Held::sent(any.clone(), Some(version.as_str().into()), number),
                );
                Resource {
                    name,
                    version,
                    resource: Some(Arc::unwrap_or_clone(any)),
                    ..Default::default()
                }
            })
            .collect();
        let nonce = number.to_string();
        state.nonce = Some(number);
        state.sent = Some(version.to_owned());
        state.sent_at = Some(std::time::Instant::now());
        Some(DeltaDiscoveryResponse {
            system_version_info: version.to_owned(),
            resources: changed,
            type_url: type_url.to_owned(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        })
    }

    /// What [`DeltaStream::respond`] would answer for load assignments at a version that
    /// follows the one last sent, where only the names `touches` says may differ, each
    /// `lookup`ed; `None` when that cannot be told without the whole selection. As on
    /// state-of-the-world streams, a push then reads only what was touched, and each touched
    /// resource's digest is taken once, not every held one's. It answers only where that is the
    /// same as the whole selection's answer: every subscribed name is held or known absent, every
    /// touched name held still exists, and no touched name known absent has appeared (else what
    /// is removed or absent changes).
    pub(crate) fn respond_following(
        &mut self,
        type_url: &'static str,
        version: &str,
        touches: impl Fn(&str) -> bool,
        lookup: impl Fn(&str) -> Option<Arc<Any>>,
    ) -> Option<Option<DeltaDiscoveryResponse>> {
        if type_url != crate::ENDPOINT {
            return None;
        }
        let state = self.types.get_mut(type_url)?;
        // Each subscribed name held (with its encoding) or known absent, as every answer
        // leaves them; a name claimed on reconnect and not yet seen is neither (checked below,
        // in the one pass over what is held).
        if state.wildcard
            || state.nonce.is_none()
            || state.known.len() + state.absent.len() != state.subscribed.len()
        {
            return None;
        }
        // What it holds is read in place, in the names' order; a touched name known absent
        // that exists now would be new. Nothing changes before that is known.
        let mut changed: Vec<(Arc<str>, String, Arc<Any>)> = Vec::new();
        let mut repointed: Vec<(Arc<str>, Arc<Any>)> = Vec::new();
        for (name, held) in state.known.iter() {
            let resource = held.resource.as_ref()?;
            if !touches(name) {
                continue;
            }
            let any = lookup(name)?;
            let resource_version = format!("{:016x}", digest(&any));
            if held.version.as_deref() != Some(resource_version.as_str()) {
                changed.push((name.clone(), resource_version, any));
            } else if !Arc::ptr_eq(resource, &any) {
                repointed.push((name.clone(), any));
            }
        }
        if state
            .absent
            .iter()
            .any(|name| touches(name) && lookup(name).is_some())
        {
            return None;
        }
        // Held at this version: this version's encoding, for the dump, without sending it.
        for (name, any) in repointed {
            if let Some(held) = state.known.get_mut(&*name) {
                held.resource = Some(any);
            }
        }
        if changed.is_empty() {
            return Some(None);
        }
        self.nonces += 1;
        let number = self.nonces;
        let resources: Vec<Resource> = changed
            .into_iter()
            .map(|(name, resource_version, any)| {
                state.known.insert(
                    name.clone(),
                    Held::sent(any.clone(), Some(resource_version.as_str().into()), number),
                );
                Resource {
                    name: name.to_string(),
                    version: resource_version,
                    resource: Some(Arc::unwrap_or_clone(any)),
                    ..Default::default()
                }
            })
            .collect();
        state.nonce = Some(number);
        state.sent = Some(version.to_owned());
        state.sent_at = Some(std::time::Instant::now());
        Some(Some(DeltaDiscoveryResponse {
            system_version_info: version.to_owned(),
            resources,
            type_url: type_url.to_owned(),
            nonce: number.to_string(),
            ..Default::default()
        }))
    }

    /// The stream as operators see it.
    pub fn status(&self, namespace: &str, seen: Option<u64>) -> ClientStatus {
        ClientStatus::of(self.node.as_ref(), namespace, seen, self.type_statuses())
    }

    /// Each subscribed type's status, for [`DeltaStream::status`] and its in-place refresh.
    pub(crate) fn type_statuses(&self) -> impl Iterator<Item = (&'static str, TypeStatus)> + '_ {
        self.types.iter().map(|(type_url, state)| {
            let status = TypeStatus {
                names: state.subscribed.len(),
                wildcard: state.wildcard,
                sent: state.sent.clone(),
                acked: state.acked.clone(),
                nack: state.nack.clone(),
                held: state.known.clone(),
                acked_nonce: state.acked_nonce,
                // A delta client keeps what each accepted response carried: `held`.
                accepted: HeldResources::default(),
                absent: state.absent.clone(),
                sent_at: state.sent_at,
                sent_nonce: state.nonce.unwrap_or(0),
            };
            (*type_url, status)
        })
    }
}

#[cfg(test)]
mod tests;
