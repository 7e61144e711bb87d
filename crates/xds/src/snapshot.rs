//! What one version of the served state holds, and the resources of a type a stream's
//! subscription selects from it.

use std::collections::HashMap;
use std::sync::Arc;

use dubbo_cp_domain::service::{HostName, Service};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use crate::generate::{self, Services, Target};
use crate::protocol::TypeState;
use crate::{CLUSTER, ENDPOINT, LISTENER, ROUTE};

/// The services at one version. Nothing is answered from a snapshot that is not `synced`: an
/// empty listener or cluster answer would tell clients that everything was deleted.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub version: u64,
    pub synced: bool,
    services: Arc<Vec<Service>>,
    /// (namespace, name) -> position in `services`: every stream resolves every name it holds
    /// on every push, so lookups must not scan.
    by_name: Arc<HashMap<(String, String), usize>>,
}

impl Snapshot {
    pub fn new(version: u64, services: Vec<Service>, synced: bool) -> Snapshot {
        let by_name = services
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.namespace.clone(), s.name.clone()), i))
            .collect();
        Snapshot {
            version,
            synced,
            services: Arc::new(services),
            by_name: Arc::new(by_name),
        }
    }

    pub fn services(&self) -> &[Service] {
        &self.services
    }
}

impl Services for Snapshot {
    fn find(&self, namespace: &str, name: &str) -> Option<&Service> {
        let position = self.by_name.get(&(namespace.to_owned(), name.to_owned()))?;
        self.services.get(*position)
    }
}

/// The target of a cluster name `outbound|<port>||<fqdn>`.
fn cluster_target<'a>(services: &'a Snapshot, name: &str) -> Option<Target<'a>> {
    let mut parts = name.split('|');
    let (Some("outbound"), Some(port), Some(""), Some(fqdn), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let port: u16 = port.parse().ok()?;
    let host = HostName::parse(fqdn)?;
    let namespace = host.namespace?;
    let service = services.find(&namespace, &host.name)?;
    let port = service.port(Some(port))?;
    Some(Target { service, port })
}

/// Every service port, for wildcard subscriptions (Envoy's): `(fqdn:port, target)`.
fn every_target(services: &[Service]) -> impl Iterator<Item = (String, Target<'_>)> {
    services.iter().flat_map(|service| {
        service.ports.iter().map(move |port| {
            (
                format!("{}:{}", service.fqdn(), port.number),
                Target { service, port },
            )
        })
    })
}

/// The resources of `type_url` that `state` subscribes to, by name. A name that resolves to
/// nothing is left out, which tells the client it does not exist.
pub fn resources(
    snapshot: &Snapshot,
    type_url: &str,
    state: &TypeState,
    client_namespace: &str,
) -> Vec<(String, Any)> {
    let mut out: Vec<(String, Any)> = Vec::new();
    match type_url {
        LISTENER => {
            if state.wildcard {
                for (name, _) in every_target(snapshot.services()) {
                    out.push((name.clone(), pack_any(generate::listener(&name))));
                }
            }
            for name in &state.names {
                if generate::resolve(snapshot, name, client_namespace).is_some() {
                    out.push((name.clone(), pack_any(generate::listener(name))));
                }
            }
        }
        ROUTE => {
            for name in &state.names {
                // Wildcard listeners' routes are named fqdn:port, which resolves like any name.
                if let Some(target) = generate::resolve(snapshot, name, client_namespace) {
                    let routes = generate::route_configuration(name, target);
                    out.push((name.clone(), pack_any(routes)));
                }
            }
        }
        CLUSTER => {
            if state.wildcard {
                for (_, target) in every_target(snapshot.services()) {
                    out.push((
                        generate::cluster_name(target),
                        pack_any(generate::cluster(target)),
                    ));
                }
            }
            for name in &state.names {
                if let Some(target) = cluster_target(snapshot, name) {
                    out.push((name.clone(), pack_any(generate::cluster(target))));
                }
            }
        }
        ENDPOINT => {
            for name in &state.names {
                if let Some(target) = cluster_target(snapshot, name) {
                    let assignment = generate::load_assignment(target);
                    out.push((name.clone(), pack_any(assignment)));
                }
            }
        }
        _ => {}
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    out
}
