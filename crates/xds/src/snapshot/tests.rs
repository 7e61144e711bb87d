use std::collections::BTreeMap;

use dubbo_cp_domain::service::{APPLICATION_LABEL, Service, ServiceEndpoint, ServicePort};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};
use prost::Message;

use super::*;
use crate::protocol::TypeState;
use dubbo_cp_domain::rules::DynamicConfigSpec;

fn service(name: &str, application: &str, endpoints: usize) -> Service {
    Service {
        namespace: "shop".into(),
        name: name.into(),
        labels: BTreeMap::from([(APPLICATION_LABEL.to_string(), application.to_string())]),
        ports: vec![ServicePort {
            number: 50051,
            name: "triple".into(),
            protocol: "TRIPLE".into(),
        }],
        endpoints: (0..endpoints)
            .map(|i| ServiceEndpoint {
                address: std::net::IpAddr::from([10, 0, 0, i as u8 + 1]),
                ports: BTreeMap::new(),
                labels: BTreeMap::new(),
                weight: 1,
                locality: String::new(),
            })
            .collect(),
    }
}

fn snapshot() -> Snapshot {
    Snapshot::new(
        1,
        vec![
            service("greeter-v1", "greeter", 1),
            service("greeter-v2", "greeter", 2),
            service("billing", "billing", 1),
        ],
        true,
    )
    .with_mappings(vec![
        (
            "shop".into(),
            "org.example.Greeter".into(),
            vec!["greeter".into()],
        ),
        (
            "shop".into(),
            "org.example.Shared".into(),
            vec!["billing".into(), "greeter".into()],
        ),
    ])
}

fn names(targets: &[Target<'_>]) -> Vec<String> {
    targets.iter().map(|t| t.service.name.clone()).collect()
}

#[test]
fn application_and_interface_names_resolve_in_the_clients_namespace() {
    let snapshot = snapshot();
    let resolve = |name: &str, ns: &str| names(&generate::resolve_all(&snapshot, name, ns));
    assert_eq!(
        resolve("billing", "shop"),
        ["billing"],
        "a Kubernetes name first"
    );
    assert_eq!(resolve("greeter", "shop"), ["greeter-v1", "greeter-v2"]);
    assert_eq!(
        resolve("greeter:50051", "shop"),
        ["greeter-v1", "greeter-v2"]
    );
    assert_eq!(
        resolve("org.example.Greeter", "shop"),
        ["greeter-v1", "greeter-v2"]
    );
    assert_eq!(
        resolve("org.example.Shared:50051", "shop"),
        ["billing", "greeter-v1", "greeter-v2"]
    );
    assert!(
        resolve("org.example.Greeter", "other").is_empty(),
        "another namespace"
    );
    assert!(
        resolve("org.example.Greeter:7070", "shop").is_empty(),
        "no such port"
    );
    assert!(resolve("org.example.Nobody", "shop").is_empty());
}

#[test]
fn an_interface_of_several_services_splits_by_their_endpoints() {
    let snapshot = snapshot();
    let state = TypeState {
        names: ["org.example.Greeter".to_string()].into(),
        ..Default::default()
    };
    let routes = resources(&snapshot, crate::ROUTE, &state, "shop");
    assert_eq!(routes.len(), 1);
    let config = RouteConfiguration::decode(routes[0].1.value.as_slice()).unwrap_or_default();
    let Some(route::Action::Route(action)) = config.virtual_hosts[0].routes[0].action.clone()
    else {
        panic!("a route action");
    };
    let Some(route_action::ClusterSpecifier::WeightedClusters(weighted)) = action.cluster_specifier
    else {
        panic!("weighted clusters");
    };
    let weights: Vec<(String, u32)> = weighted
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight.map(|w| w.value).unwrap_or(0)))
        .collect();
    assert_eq!(
        weights,
        [
            (
                "outbound|50051||greeter-v1.shop.svc.cluster.local".to_string(),
                1
            ),
            (
                "outbound|50051||greeter-v2.shop.svc.cluster.local".to_string(),
                2
            ),
        ]
    );
    let listeners = resources(
        &snapshot,
        crate::LISTENER,
        &TypeState {
            names: [
                "org.example.Greeter".to_string(),
                "org.example.Nobody".to_string(),
            ]
            .into(),
            ..Default::default()
        },
        "shop",
    );
    assert_eq!(listeners.len(), 1, "a name nothing answers to is left out");
}

fn dynamic_config(overrides: serde_json::Value) -> (String, DynamicConfigSpec) {
    let spec = serde_json::from_value(serde_json::json!({
        "key": "greeter", "scope": "application", "configVersion": "v3.0",
        "configs": overrides,
    }))
    .unwrap_or_else(|err| panic!("{err}"));
    ("shop".to_string(), spec)
}

fn weights(snapshot: &Snapshot, service: &str) -> Vec<u32> {
    snapshot
        .find("shop", service)
        .map(|s| s.endpoints.iter().map(|e| e.weight).collect())
        .unwrap_or_default()
}

#[test]
fn dynamic_configs_set_and_disable_endpoint_weights() {
    let configs = vec![dynamic_config(serde_json::json!([
        {"side": "provider", "addresses": ["10.0.0.1"], "parameters": {"weight": "25"}},
        {"addresses": ["10.0.0.2:50051"], "parameters": {"disabled": "true"}},
        {"side": "consumer", "addresses": ["10.0.0.1"], "parameters": {"weight": "7"}},
        {"addresses": ["10.0.0.1"], "parameters": {"weight": "9"}, "enabled": false},
    ]))];
    let snapshot = snapshot().with_dynamic_configs(configs);
    assert_eq!(weights(&snapshot, "greeter-v2"), [25, 0]);
    assert_eq!(weights(&snapshot, "greeter-v1"), [25]);
    assert_eq!(weights(&snapshot, "billing"), [1], "another application");
    // Later overrides win; `*` lists every endpoint; a disabled config changes nothing.
    let mut off = dynamic_config(serde_json::json!([
        {"addresses": ["*"], "parameters": {"weight": "3"}},
        {"addresses": ["10.0.0.2"], "parameters": {"weight": "4"}},
    ]));
    let snapshot = self::snapshot().with_dynamic_configs(vec![off.clone()]);
    assert_eq!(weights(&snapshot, "greeter-v2"), [3, 4]);
    off.1.enabled = false;
    let snapshot = self::snapshot().with_dynamic_configs(vec![off]);
    assert_eq!(weights(&snapshot, "greeter-v2"), [1, 1]);
}

#[test]
fn every_stream_shares_one_encoding_per_resource_and_version() {
    let snapshot = snapshot();
    let clusters = TypeState {
        wildcard: true,
        ..Default::default()
    };
    let routes = TypeState {
        names: [
            "org.example.Greeter".to_string(),
            "made.up.Name".to_string(),
        ]
        .into(),
        ..Default::default()
    };
    // A thousand streams asking for the same things.
    for _ in 0..1000 {
        assert_eq!(
            resources(&snapshot, crate::CLUSTER, &clusters, "shop").len(),
            3
        );
        assert_eq!(resources(&snapshot, crate::ROUTE, &routes, "shop").len(), 1);
    }
    assert_eq!(snapshot.encodes(), 4, "3 clusters and 1 route, once each");
    // A route resolves in the client's namespace, so another namespace is another encoding.
    resources(&snapshot, crate::ROUTE, &routes, "other");
    assert_eq!(snapshot.encodes(), 4, "nothing answers there: nothing kept");
}

#[test]
fn dubbo_override_rules_all_instances_and_disabled_stays_disabled() {
    let configs = vec![dynamic_config(serde_json::json!([
        {"parameters": {"weight": "5"}},
        {"addresses": ["10.0.0.2"], "parameters": {"disabled": "true"}},
        {"addresses": ["10.0.0.2"], "parameters": {"weight": "50"}},
    ]))];
    let snapshot = snapshot().with_dynamic_configs(configs);
    assert_eq!(weights(&snapshot, "greeter-v2"), [5, 0]);
}

#[test]
fn made_up_subsets_and_namespaces_are_not_served_or_kept() {
    let tagged = Snapshot::new(
        1,
        vec![{
            let mut s = service("greeter-v1", "greeter", 1);
            s.endpoints[0]
                .labels
                .insert(crate::tags::TAG_LABEL.into(), "gray".into());
            s
        }],
        true,
    );
    let cluster = |subset: &str| TypeState {
        names: [format!(
            "outbound|50051|{subset}|greeter-v1.shop.svc.cluster.local"
        )]
        .into(),
        ..Default::default()
    };
    let gray = crate::tags::Subset::Tagged("gray".into()).name();
    let junk = crate::tags::Subset::Tagged("junk".into()).name();
    assert_eq!(
        resources(&tagged, crate::CLUSTER, &cluster(&gray), "shop").len(),
        1
    );
    assert!(resources(&tagged, crate::CLUSTER, &cluster(&junk), "shop").is_empty());
    assert_eq!(tagged.encodes(), 1, "nothing kept for the made-up subset");
    // A name that says its namespace is one encoding whatever namespace clients claim.
    let routes = TypeState {
        names: ["greeter-v1.shop.svc.cluster.local:50051".to_string()].into(),
        ..Default::default()
    };
    for namespace in ["a", "b", "c"] {
        assert_eq!(
            resources(&tagged, crate::ROUTE, &routes, namespace).len(),
            1
        );
    }
    assert_eq!(tagged.encodes(), 2);
}

#[test]
fn a_cluster_has_one_spelling_and_no_other_is_cached() {
    let snapshot = snapshot();
    let canonical = "outbound|50051||billing.shop.svc.cluster.local";
    let state = TypeState {
        names: [
            canonical,
            "outbound|050051||billing.shop.svc.cluster.local",
            "outbound|+50051||billing.shop.svc.cluster.local",
            "outbound|50051||billing.shop",
            "outbound|50051||billing.shop.svc",
        ]
        .map(str::to_owned)
        .into(),
        ..Default::default()
    };
    let found: Vec<String> = resources(&snapshot, CLUSTER, &state, "shop")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(found, [canonical]);
    assert_eq!(snapshot.encodes(), 1, "only the canonical name was encoded");
}

#[test]
fn a_resource_encoded_to_the_same_bytes_as_the_version_before_is_that_encoding() {
    let names = |names: &[&str]| TypeState {
        names: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let clusters = names(&[
        "outbound|50051||billing.shop.svc.cluster.local",
        "outbound|50051||greeter-v2.shop.svc.cluster.local",
    ]);
    let first = snapshot();
    let before = resources(&first, CLUSTER, &clusters, "shop");
    // The next version: billing is the same, greeter-v2 lost an endpoint (its cluster is the
    // same bytes too), and its load assignment changed.
    let next = Snapshot::new(
        2,
        vec![
            service("greeter-v1", "greeter", 1),
            service("greeter-v2", "greeter", 1),
            service("billing", "billing", 1),
        ],
        true,
    )
    .sharing_encodings_of(&first);
    let after = resources(&next, CLUSTER, &clusters, "shop");
    for ((_, old), (_, new)) in before.iter().zip(&after) {
        assert!(Arc::ptr_eq(old, new), "one copy of unchanged bytes");
    }
    let endpoints = names(&["outbound|50051||greeter-v2.shop.svc.cluster.local"]);
    let old = resources(&first, ENDPOINT, &endpoints, "shop");
    let new = resources(&next, ENDPOINT, &endpoints, "shop");
    assert!(!Arc::ptr_eq(&old[0].1, &new[0].1), "changed bytes are new");
    assert_ne!(old[0].1.value, new[0].1.value);
}

fn decoded<M: Message + Default>(snapshot: &Snapshot, type_url: &str, name: &str) -> M {
    let any = generate_one(snapshot, type_url, name, "shop")
        .unwrap_or_else(|| panic!("{type_url} {name} generated"));
    M::decode(any.value.as_slice()).unwrap_or_else(|err| panic!("{err}"))
}

#[test]
fn a_hash_header_gives_the_application_ring_hash_with_weights_per_endpoint() {
    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster::LbPolicy};
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    let configs = vec![dynamic_config(serde_json::json!([
        {"side": "provider", "addresses": ["10.0.0.1"], "parameters": {"weight": "300"}},
        {"side": "provider", "parameters": {"hash.header": "Not-Lower"}},
        {"side": "provider", "parameters": {"hash.header": "x-user"}},
        {"side": "provider", "parameters": {"hash.header": "grpc-timeout"}},
    ]))];
    let snapshot = snapshot().with_dynamic_configs(configs);
    let greeter = "outbound|50051||greeter-v2.shop.svc.cluster.local";
    let billing = "outbound|50051||billing.shop.svc.cluster.local";
    let cluster: Cluster = decoded(&snapshot, crate::CLUSTER, greeter);
    assert_eq!(cluster.lb_policy, LbPolicy::RingHash as i32);
    let other: Cluster = decoded(&snapshot, crate::CLUSTER, billing);
    assert_eq!(
        other.lb_policy,
        LbPolicy::RoundRobin as i32,
        "another application"
    );
    // Weights 300 and 1: on a ring an endpoint weighs its locality's weight times its own.
    let assignment: ClusterLoadAssignment = decoded(&snapshot, crate::ENDPOINT, greeter);
    let mut weights: Vec<(u32, usize)> = assignment
        .endpoints
        .iter()
        .map(|l| {
            let own = l
                .lb_endpoints
                .iter()
                .map(|e| e.load_balancing_weight.map_or(1, |w| w.value))
                .max()
                .unwrap_or(0);
            (
                l.load_balancing_weight.map_or(0, |w| w.value) * own,
                l.lb_endpoints.len(),
            )
        })
        .collect();
    weights.sort_unstable();
    assert_eq!(weights, [(1, 1), (300, 1)]);
    // Both routes hash on the last hashable header named; one that spans several applications
    // hashes on it too (only greeter's cluster uses it).
    for name in ["org.example.Greeter", "org.example.Shared"] {
        let routes: RouteConfiguration = decoded(&snapshot, crate::ROUTE, name);
        for route in &routes.virtual_hosts[0].routes {
            let Some(route::Action::Route(action)) = &route.action else {
                panic!("a route action")
            };
            let headers: Vec<_> = action
                .hash_policy
                .iter()
                .map(|p| match &p.policy_specifier {
                    Some(route_action::hash_policy::PolicySpecifier::Header(h)) => {
                        h.header_name.as_str()
                    }
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(headers, ["x-user"], "{name}");
        }
    }
    // Without it: round robin, locality weight = weight x endpoints, no hash policy.
    let plain = self::snapshot();
    let cluster: Cluster = decoded(&plain, crate::CLUSTER, greeter);
    assert_eq!(cluster.lb_policy, LbPolicy::RoundRobin as i32);
    let routes: RouteConfiguration = decoded(&plain, crate::ROUTE, "org.example.Greeter");
    let Some(route::Action::Route(action)) = &routes.virtual_hosts[0].routes[0].action else {
        panic!("a route action")
    };
    assert!(action.hash_policy.is_empty());
    let assignment: ClusterLoadAssignment = decoded(&plain, crate::ENDPOINT, greeter);
    assert_eq!(assignment.endpoints.len(), 1);
    assert_eq!(
        assignment.endpoints[0]
            .load_balancing_weight
            .map(|w| w.value),
        Some(2),
        "one locality of two endpoints of weight 1"
    );
}

#[test]
fn a_dns_name_of_its_own_is_one_service_for_every_client_and_names_its_cluster() {
    let mut payments = service("api.payments.internal", "payments", 2);
    payments.namespace = "billing".into();
    let snapshot = Snapshot::new(1, vec![payments, service("greeter", "greeter", 1)], true);
    // Verbatim, from any namespace, with its port or its only one.
    for (asked, namespace) in [
        ("api.payments.internal:50051", "shop"),
        ("api.payments.internal", "other"),
    ] {
        assert_eq!(
            names(&generate::resolve_all(&snapshot, asked, namespace)),
            ["api.payments.internal"],
            "{asked} from {namespace}"
        );
    }
    for other in [
        "api.payments.internal:7070",
        "payments.internal:50051",
        "api.payments.internal.:50051",
        "api.payments:50051",
    ] {
        assert!(
            generate::resolve_all(&snapshot, other, "billing").is_empty(),
            "{other}"
        );
    }
    let target = generate::resolve_host(&snapshot, "api.payments.internal:50051")
        .unwrap_or_else(|| panic!("resolved"));
    let cluster = generate::cluster_name(target);
    assert_eq!(cluster, "outbound|50051||api.payments.internal");
    let assignment: envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment =
        decoded(&snapshot, crate::ENDPOINT, &cluster);
    assert_eq!(assignment.endpoints[0].lb_endpoints.len(), 2);
    // An application or interface name of the client's own namespace would come first, so its
    // listener and route are kept per namespace.
    let listeners = TypeState {
        names: ["api.payments.internal:50051".to_string()].into(),
        ..Default::default()
    };
    for namespace in ["a", "b", "c"] {
        assert_eq!(
            resources(&snapshot, crate::LISTENER, &listeners, namespace).len(),
            1
        );
        assert_eq!(resources(&snapshot, ROUTE, &listeners, namespace).len(), 1);
    }
    assert_eq!(
        snapshot.encodes(),
        6,
        "a listener and a route per namespace"
    );
    // Envoy's wildcard subscription lists it under its own name.
    let wildcard = TypeState {
        wildcard: true,
        ..Default::default()
    };
    let listed: Vec<String> = resources(&snapshot, crate::LISTENER, &wildcard, "shop")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        listed,
        [
            "api.payments.internal:50051",
            "greeter.shop.svc.cluster.local:50051"
        ]
    );
}

#[test]
fn an_entrys_dns_name_takes_no_name_a_namespace_declares() {
    // An entry of namespace evil declares `greeter.shop` and an interface's name as DNS hosts.
    let mut greeter_shop = service("greeter.shop", "evil-1", 1);
    greeter_shop.namespace = "evil".into();
    let mut interface = service("org.example.shared", "evil-2", 1);
    interface.namespace = "evil".into();
    let mut greeter = service("greeter", "greeter", 1);
    greeter.endpoints[0].address = std::net::IpAddr::from([10, 9, 9, 9]);
    let snapshot =
        Snapshot::new(1, vec![greeter_shop, interface, greeter], true).with_mappings(vec![(
            "shop".into(),
            "org.example.shared".into(),
            vec!["greeter".into()],
        )]);
    let resolve = |name: &str, ns: &str| names(&generate::resolve_all(&snapshot, name, ns));
    // Service greeter of namespace shop, and shop's interface, for every client that asks.
    assert_eq!(resolve("greeter.shop:50051", "other"), ["greeter"]);
    assert_eq!(resolve("org.example.shared", "shop"), ["greeter"]);
    // Where the namespace declares no such name, the DNS name answers.
    assert_eq!(
        resolve("org.example.shared", "other"),
        ["org.example.shared"]
    );
    let routes = TypeState {
        names: ["org.example.shared".to_string()].into(),
        ..Default::default()
    };
    let cluster_of = |namespace: &str| {
        let (_, any) = resources(&snapshot, ROUTE, &routes, namespace)
            .pop()
            .unwrap_or_else(|| panic!("a route"));
        let config =
            RouteConfiguration::decode(any.value.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        format!(
            "{:?}",
            config.virtual_hosts[0].routes.last().map(|r| &r.action)
        )
    };
    // Cached per namespace: shop's route is not other's.
    assert!(cluster_of("shop").contains("greeter.shop.svc.cluster.local"));
    assert!(cluster_of("other").contains("outbound|50051||org.example.shared"));
}
