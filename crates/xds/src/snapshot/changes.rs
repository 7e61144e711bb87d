//! What may differ between two consecutive versions when only services moved (rules, mappings
//! and policies are the same): which clusters and load assignments, by the service they name.
//! A stream whose clusters or load assignments name none of them skips the type at the new
//! version instead of looking each name up again: at 10,000 streams and one endpoint change,
//! most of the lookups of a push were of resources that could not have changed.
//!
//! Listeners and routes resolve names across services (hosts, applications, interfaces, tag
//! subsets), so they are always looked up again.

use std::collections::HashSet;

use dubbo_cp_domain::service::Service;

use super::{Snapshot, generate_one};
use crate::generate::{self, Services, Target};
use crate::{CLUSTER, ENDPOINT};

/// Services one version may differ from the previous in before streams stop telling changes
/// apart and look everything up (a large burst costs what it cost before, nothing more).
const MAX_CHANGED_SERVICES: usize = 1_000;

/// Changed services few enough to compare a name with each rather than parse and hash it.
const FEW: usize = 4;

/// What may differ from the version before (`previous`).
#[derive(Debug, Default)]
pub struct Changes {
    pub(crate) previous: u64,
    /// FQDNs of services added, removed or changed: their load assignments, and their subset
    /// clusters (which subsets exist follows the endpoints' tags), may differ.
    endpoints: HashSet<String, foldhash::fast::RandomState>,
    /// FQDNs of services whose every cluster may differ: added, removed, changed beyond their
    /// endpoints, or whose cluster encodes differently (TLS follows the endpoints' workloads).
    clusters: HashSet<String, foldhash::fast::RandomState>,
}

impl Changes {
    /// What differs from `previous` in `next`, both built from the same rules, mappings and
    /// policies; `None` when too much does to be worth telling apart.
    pub(crate) fn between(previous: &Snapshot, next: &Snapshot) -> Option<Changes> {
        let mut changes = Changes {
            previous: previous.version,
            ..Changes::default()
        };
        let keys: HashSet<&(String, String), foldhash::fast::RandomState> =
            previous.by_name.keys().chain(next.by_name.keys()).collect();
        let mut changed = 0usize;
        for (namespace, name) in keys {
            let (old, new) = (previous.find(namespace, name), next.find(namespace, name));
            match (old, new) {
                (Some(old), Some(new)) if old == new => continue,
                (Some(old), Some(new)) if same_shape(old, new) => {
                    changes.endpoints.insert(new.fqdn());
                    if !clusters_encode_alike(previous, next, new) {
                        changes.clusters.insert(new.fqdn());
                    }
                }
                (old, new) => {
                    for service in old.into_iter().chain(new) {
                        changes.endpoints.insert(service.fqdn());
                        changes.clusters.insert(service.fqdn());
                    }
                }
            }
            changed += 1;
            if changed > MAX_CHANGED_SERVICES {
                return None;
            }
        }
        // `touches` relies on it: a service whose clusters may differ has load assignments
        // that may.
        debug_assert!(changes.clusters.is_subset(&changes.endpoints));
        Some(changes)
    }

    /// Whether the resource `name` of `type_url` may differ from the previous version's.
    pub(crate) fn touches(&self, type_url: &str, name: &str) -> bool {
        // A cluster's name ends with its service's FQDN, and every FQDN whose clusters may
        // differ has load assignments that may: when those are few, a name ending with none
        // of them is untouched, told without parsing it or hashing (at an endpoint change
        // every stream asks this of every name it holds).
        if matches!(type_url, CLUSTER | ENDPOINT)
            && self.endpoints.len() <= FEW
            && !self
                .endpoints
                .iter()
                .any(|fqdn| name.ends_with(fqdn.as_str()))
        {
            return false;
        }
        // `outbound|<port>|<subset>|<fqdn>`; a name of another form names no cluster at any
        // version, so it cannot have changed.
        let Some((subset, fqdn)) = cluster_parts(name) else {
            return type_url != CLUSTER && type_url != ENDPOINT;
        };
        match type_url {
            ENDPOINT => self.endpoints.contains(fqdn),
            CLUSTER => {
                self.clusters.contains(fqdn)
                    || (!subset.is_empty() && self.endpoints.contains(fqdn))
            }
            _ => true,
        }
    }
}

/// The subset and the FQDN of a cluster's name, `outbound|<port>|<subset>|<fqdn>`. Read byte by
/// byte from the front: the separators are in its first bytes, and a string search for each
/// (back over the FQDN, or forward) was 3-5 % of the server's CPU at an endpoint change, where
/// every stream asks this of every name it holds.
fn cluster_parts(name: &str) -> Option<(&str, &str)> {
    let mut separators = [0usize; 3];
    let mut found = 0;
    for (at, byte) in name.bytes().enumerate() {
        if byte == b'|' {
            separators[found] = at;
            found += 1;
            if found == separators.len() {
                break;
            }
        }
    }
    let [_, before_subset, before_fqdn] = separators;
    // `|` is ASCII: each position is a character boundary.
    (found == separators.len()).then(|| {
        (
            name.get(before_subset + 1..before_fqdn).unwrap_or_default(),
            name.get(before_fqdn + 1..).unwrap_or_default(),
        )
    })
}

/// Everything but the endpoints alike.
fn same_shape(old: &Service, new: &Service) -> bool {
    old.namespace == new.namespace
        && old.name == new.name
        && old.labels == new.labels
        && old.ports == new.ports
}

/// Whether every port's cluster (without subset) of `service` encodes to the same bytes at
/// both versions.
fn clusters_encode_alike(previous: &Snapshot, next: &Snapshot, service: &Service) -> bool {
    service.ports.iter().all(|port| {
        let name = generate::cluster_name(Target { service, port });
        let old = generate_one(previous, CLUSTER, &name, "");
        let new = generate_one(next, CLUSTER, &name, "");
        old.is_some() && old == new
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use dubbo_cp_domain::rules::{AuthenticationPolicySpec, PolicyExtend, PolicySelector};
    use dubbo_cp_domain::service::{ServiceEndpoint, ServicePort};

    use super::*;
    use crate::security::{Named, Policies};

    fn endpoint(last: u8, labels: &[(&str, &str)]) -> ServiceEndpoint {
        ServiceEndpoint {
            address: std::net::IpAddr::from([10, 0, 0, last]),
            ports: BTreeMap::new(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            weight: 100,
            locality: String::new(),
        }
    }

    fn service(name: &str, endpoints: Vec<ServiceEndpoint>) -> Service {
        Service {
            namespace: "shop".into(),
            name: name.into(),
            labels: BTreeMap::new(),
            ports: vec![ServicePort {
                number: 7070,
                name: "grpc".into(),
                protocol: "GRPC".into(),
            }],
            endpoints,
        }
    }

    /// Version 2 of `services` following version 1 of `before`, under `policies`.
    fn changes(before: Vec<Service>, after: Vec<Service>, policies: &Policies) -> Changes {
        let previous = Snapshot::new(1, before, true).with_policies(policies.clone());
        let next = Snapshot::new(2, after, true).with_policies(policies.clone());
        let next = next.following(&previous);
        let changes = next.changes().expect("a few services changed");
        Changes {
            previous: changes.previous,
            endpoints: changes.endpoints.clone(),
            clusters: changes.clusters.clone(),
        }
    }

    fn cluster(name: &str, subset: &str) -> String {
        format!("outbound|7070|{subset}|{name}.shop.svc.cluster.local")
    }

    #[test]
    fn an_endpoint_change_touches_its_services_load_assignment_and_subsets_only() {
        let a = service("a", vec![endpoint(1, &[])]);
        let b = service("b", vec![endpoint(2, &[])]);
        let a2 = service("a", vec![endpoint(1, &[]), endpoint(3, &[])]);
        let changes = changes(vec![a, b.clone()], vec![a2, b], &Policies::default());
        assert_eq!(changes.previous, 1);
        assert!(changes.touches(ENDPOINT, &cluster("a", "")));
        assert!(!changes.touches(ENDPOINT, &cluster("b", "")));
        // The cluster itself encodes alike; which subsets exist follows the endpoints.
        assert!(!changes.touches(CLUSTER, &cluster("a", "")));
        assert!(changes.touches(CLUSTER, &cluster("a", "tag-gray")));
        assert!(!changes.touches(CLUSTER, &cluster("b", "tag-gray")));
        // Listeners and routes are always looked up again; other names never resolve.
        assert!(changes.touches(crate::LISTENER, "b"));
        assert!(changes.touches(crate::ROUTE, "b"));
        assert!(!changes.touches(ENDPOINT, "b"));
        assert!(!changes.touches(ENDPOINT, "x|a.shop.svc.cluster.local"));
        assert_eq!(
            cluster_parts("outbound|80|tag-67|a.b"),
            Some(("tag-67", "a.b"))
        );
        assert_eq!(cluster_parts("outbound|80||a|b"), Some(("", "a|b")));
        assert_eq!(cluster_parts("outbound|80||"), Some(("", "")));
        assert_eq!(cluster_parts("outbound|80|"), None);
        assert_eq!(cluster_parts("outbound|80"), None);
        assert!(!changes.touches(ENDPOINT, &format!("{}|x", cluster("a", ""))));
    }

    #[test]
    fn a_few_changed_services_are_told_by_their_names_ends_as_by_parsing() {
        let fqdn = |name: &str| format!("{name}.shop.svc.cluster.local");
        let few = Changes {
            previous: 1,
            endpoints: [fqdn("a"), fqdn("b")].into_iter().collect(),
            clusters: [fqdn("b")].into_iter().collect(),
        };
        // The same changes with more services than FEW, which are parsed: the unrelated
        // services added change no answer about these names.
        let mut many = Changes {
            previous: 1,
            endpoints: few.endpoints.clone(),
            clusters: few.clusters.clone(),
        };
        many.endpoints
            .extend((0..FEW).map(|i| fqdn(&format!("unrelated-{i}"))));
        assert!(many.endpoints.len() > FEW);
        let names = [
            cluster("a", ""),
            cluster("a", "tag-gray"),
            cluster("b", ""),
            cluster("b", "tag-gray"),
            cluster("ba", ""),
            cluster("c", ""),
            fqdn("a"),
            format!("x|{}", fqdn("a")),
            format!("outbound|7070|tag|x.{}", fqdn("a")),
            "outbound|7070||".to_owned(),
        ];
        for type_url in [CLUSTER, ENDPOINT, crate::LISTENER, crate::ROUTE] {
            for name in &names {
                assert_eq!(
                    few.touches(type_url, name),
                    many.touches(type_url, name),
                    "{type_url} {name}"
                );
            }
        }
        assert!(few.touches(ENDPOINT, &cluster("a", "")));
        assert!(few.touches(CLUSTER, &cluster("b", "")));
        assert!(!few.touches(ENDPOINT, &cluster("ba", "")));
    }

    #[test]
    fn a_new_port_or_a_service_added_or_removed_touches_every_cluster_of_it() {
        let a = service("a", vec![endpoint(1, &[])]);
        let mut a2 = a.clone();
        a2.ports.push(ServicePort {
            number: 8080,
            name: "http".into(),
            protocol: "GRPC".into(),
        });
        let b = service("b", vec![endpoint(2, &[])]);
        let changes = changes(
            vec![a, b],
            vec![a2, service("c", Vec::new())],
            &Policies::default(),
        );
        for name in ["a", "b", "c"] {
            assert!(changes.touches(CLUSTER, &cluster(name, "")), "{name}");
            assert!(changes.touches(ENDPOINT, &cluster(name, "")), "{name}");
        }
    }

    #[test]
    fn an_endpoint_that_makes_its_callers_use_mtls_touches_the_cluster() {
        // STRICT for workloads labelled `app: secure`: a cluster with such an endpoint is TLS.
        let policies = Policies {
            authentication: vec![Named {
                namespace: "shop".into(),
                name: "secure".into(),
                spec: AuthenticationPolicySpec {
                    action: "STRICT".into(),
                    selector: vec![PolicySelector {
                        extends: vec![PolicyExtend {
                            key: "kubernetesEnv.podLabels.app".into(),
                            value: "secure".into(),
                        }],
                        ..Default::default()
                    }],
                    port_level: Vec::new(),
                },
            }],
            ..Policies::default()
        };
        let before = service("a", vec![endpoint(1, &[])]);
        let after = service(
            "a",
            vec![endpoint(1, &[]), endpoint(2, &[("app", "secure")])],
        );
        let changes = changes(vec![before], vec![after], &policies);
        assert!(changes.touches(CLUSTER, &cluster("a", "")));
    }

    #[test]
    fn a_version_built_from_other_rules_or_too_many_changes_says_nothing() {
        let previous = Snapshot::new(1, vec![service("a", Vec::new())], true);
        // `with_*` after `following` drops what it said: the rules moved.
        let next = Snapshot::new(2, vec![service("a", Vec::new())], true)
            .following(&previous)
            .with_tag_routes(Vec::new());
        assert!(next.changes().is_none());
        let many: Vec<Service> = (0..=MAX_CHANGED_SERVICES)
            .map(|i| service(&format!("s{i}"), Vec::new()))
            .collect();
        let next = Snapshot::new(2, many, true).following(&previous);
        assert!(next.changes().is_none());
        // Not synced: nothing is answered from it anyway.
        let next = Snapshot::new(2, Vec::new(), false).following(&previous);
        assert!(next.changes().is_none());
    }
}
