//! What one version of the served state holds, and the resources of a type a stream's
//! subscription selects from it.

use std::collections::HashMap;
use std::sync::Arc;

use dubbo_cp_domain::service::{HostName, Service};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use crate::generate::{self, Services, Target};
use crate::protocol::TypeState;
use crate::tags::{Subset, Tagging};
use crate::{CLUSTER, ENDPOINT, LISTENER, ROUTE};
use dubbo_cp_domain::rules::TagRouteSpec;

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
    /// Enabled TagRoutes by (namespace, application).
    tag_routes: Arc<HashMap<(String, String), TagRouteSpec>>,
    /// (namespace, application) -> positions in `services`.
    by_application: Arc<HashMap<(String, String), Vec<usize>>>,
    /// (namespace, interface) -> the applications serving it (ServiceNameMappings).
    mappings: Arc<HashMap<(String, String), Vec<String>>>,
}

impl Snapshot {
    pub fn new(version: u64, services: Vec<Service>, synced: bool) -> Snapshot {
        let by_name = services
            .iter()
            .enumerate()
            .map(|(i, s)| ((s.namespace.clone(), s.name.clone()), i))
            .collect();
        let mut by_application: HashMap<(String, String), Vec<usize>> = HashMap::new();
        for (i, service) in services.iter().enumerate() {
            by_application
                .entry((service.namespace.clone(), service.application().to_owned()))
                .or_default()
                .push(i);
        }
        Snapshot {
            version,
            synced,
            services: Arc::new(services),
            by_name: Arc::new(by_name),
            tag_routes: Arc::default(),
            by_application: Arc::new(by_application),
            mappings: Arc::default(),
        }
    }

    /// The same services with the ServiceNameMappings `(namespace, interface, applications)`
    /// that resolve interface names.
    pub fn with_mappings(mut self, mappings: Vec<(String, String, Vec<String>)>) -> Snapshot {
        self.mappings = Arc::new(
            mappings
                .into_iter()
                .map(|(namespace, interface, applications)| ((namespace, interface), applications))
                .collect(),
        );
        self
    }

    /// The same services with `rules` (namespace, spec) routing by tag; disabled ones are left
    /// out, as Dubbo ignores them.
    pub fn with_tag_routes(mut self, rules: Vec<(String, TagRouteSpec)>) -> Snapshot {
        self.tag_routes = Arc::new(
            rules
                .into_iter()
                .filter(|(_, rule)| rule.enabled)
                .map(|(namespace, rule)| ((namespace, rule.key.clone()), rule))
                .collect(),
        );
        self
    }

    /// Tag routing for a target's service.
    fn tagging<'a>(&'a self, target: Target<'a>) -> Tagging<'a> {
        let key = (
            target.service.namespace.clone(),
            target.service.application().to_owned(),
        );
        Tagging {
            endpoints: &target.service.endpoints,
            port: target.port,
            rule: self.tag_routes.get(&key),
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

    fn of_application(&self, namespace: &str, application: &str) -> Vec<&Service> {
        self.by_application
            .get(&(namespace.to_owned(), application.to_owned()))
            .map(|positions| {
                positions
                    .iter()
                    .filter_map(|i| self.services.get(*i))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn serving(&self, namespace: &str, interface: &str) -> Vec<String> {
        self.mappings
            .get(&(namespace.to_owned(), interface.to_owned()))
            .cloned()
            .unwrap_or_default()
    }
}

/// The target (and subset) of a cluster name `outbound|<port>|<subset>|<fqdn>`.
fn cluster_target<'a>(services: &'a Snapshot, name: &str) -> Option<(Target<'a>, Option<Subset>)> {
    let mut parts = name.split('|');
    let (Some("outbound"), Some(port), Some(subset), Some(fqdn), None) = (
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
    let subset = match subset {
        "" => None,
        subset => Some(Subset::parse(subset)?),
    };
    Some((Target { service, port }, subset))
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
                if !generate::resolve_all(snapshot, name, client_namespace).is_empty() {
                    out.push((name.clone(), pack_any(generate::listener(name))));
                }
            }
        }
        ROUTE => {
            for name in &state.names {
                // Wildcard listeners' routes are named fqdn:port, which resolves like any name.
                let targets = generate::resolve_all(snapshot, name, client_namespace);
                let routes = match targets.as_slice() {
                    [] => continue,
                    [target] => {
                        let tagging = snapshot.tagging(*target);
                        generate::route_configuration(name, *target, Some(&tagging))
                    }
                    several => generate::weighted_route_configuration(name, several),
                };
                out.push((name.clone(), pack_any(routes)));
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
                if let Some((target, subset)) = cluster_target(snapshot, name) {
                    let cluster = generate::subset_cluster(target, subset.as_ref());
                    out.push((name.clone(), pack_any(cluster)));
                }
            }
        }
        ENDPOINT => {
            for name in &state.names {
                if let Some((target, subset)) = cluster_target(snapshot, name) {
                    let endpoints = match &subset {
                        Some(subset) => snapshot.tagging(target).endpoints_of(subset),
                        None => target.service.endpoints.iter().collect(),
                    };
                    let assignment =
                        generate::subset_load_assignment(target, subset.as_ref(), &endpoints);
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

#[cfg(test)]
mod tests;
