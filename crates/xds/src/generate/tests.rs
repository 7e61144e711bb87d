use std::collections::BTreeMap;

use dubbo_cp_domain::service::{Service, ServiceEndpoint, ServicePort};
use envoy_types::pb::envoy::config::core::v3::config_source;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager, http_filter,
};
use prost::{Message, Name};

use super::*;

fn endpoint(address: &str, weight: u32, locality: &str) -> ServiceEndpoint {
    ServiceEndpoint {
        address: address
            .parse()
            .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0])),
        ports: BTreeMap::new(),
        labels: BTreeMap::new(),
        weight,
        locality: locality.into(),
    }
}

fn services() -> Vec<Service> {
    let port = |number: u16| ServicePort {
        number,
        name: format!("grpc-{number}"),
        protocol: "GRPC".into(),
    };
    vec![
        Service {
            namespace: "shop".into(),
            name: "greeter".into(),
            labels: BTreeMap::new(),
            ports: vec![port(7070)],
            endpoints: vec![
                endpoint("10.0.0.1", 80, ""),
                endpoint("10.0.0.2", 20, ""),
                endpoint("10.0.0.3", 0, ""),
                endpoint("10.0.0.4", 20, ""),
            ],
        },
        Service {
            namespace: "other".into(),
            name: "greeter".into(),
            labels: BTreeMap::new(),
            ports: vec![port(7070), port(8080)],
            endpoints: vec![endpoint("10.1.0.1", 1, "r/z/s")],
        },
    ]
}

#[test]
fn names_resolve_in_the_clients_namespace_or_the_one_named() {
    let services = services();
    let found = |name: &str, ns: &str| {
        resolve(services.as_slice(), name, ns).map(|t| (t.service.namespace.clone(), t.port.number))
    };
    assert_eq!(found("greeter", "shop"), Some(("shop".into(), 7070)));
    assert_eq!(found("greeter:7070", "shop"), Some(("shop".into(), 7070)));
    assert_eq!(
        found("greeter.shop:7070", "other"),
        Some(("shop".into(), 7070))
    );
    assert_eq!(
        found("greeter.other.svc.cluster.local:8080", "shop"),
        Some(("other".into(), 8080))
    );
    assert_eq!(
        found("greeter.other", "shop"),
        None,
        "two ports, none given"
    );
    assert_eq!(found("greeter:9090", "shop"), None, "no such port");
    assert_eq!(found("nobody", "shop"), None);
}

#[test]
fn the_listener_routes_over_ads_with_the_router_last() {
    let listener = listener("greeter.shop:7070");
    assert_eq!(listener.name, "greeter.shop:7070");
    let any = listener
        .api_listener
        .and_then(|api| api.api_listener)
        .unwrap_or_default();
    assert_eq!(any.type_url, HttpConnectionManager::type_url());
    let manager = HttpConnectionManager::decode(any.value.as_slice()).unwrap_or_default();
    let Some(http_connection_manager::RouteSpecifier::Rds(rds)) = manager.route_specifier else {
        panic!("routes must come over RDS");
    };
    assert_eq!(rds.route_config_name, "greeter.shop:7070");
    assert!(matches!(
        rds.config_source.and_then(|s| s.config_source_specifier),
        Some(config_source::ConfigSourceSpecifier::Ads(_))
    ));
    let last = manager.http_filters.last().cloned().unwrap_or_default();
    let Some(http_filter::ConfigType::TypedConfig(router)) = last.config_type else {
        panic!("the router has a typed config");
    };
    assert_eq!(
        router.type_url,
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
    );
}

#[test]
fn routes_clusters_and_endpoints_name_each_other() {
    let services = services();
    let target = resolve(services.as_slice(), "greeter:7070", "shop").expect("resolves");
    let routes = route_configuration("greeter:7070", target, None);
    let host = &routes.virtual_hosts[0];
    assert!(host.domains.contains(&"greeter:7070".to_string()));
    let Some(route::Action::Route(action)) = host.routes[0].action.clone() else {
        panic!("a route action");
    };
    let cluster_named = "outbound|7070||greeter.shop.svc.cluster.local";
    assert_eq!(
        action.cluster_specifier,
        Some(route_action::ClusterSpecifier::Cluster(
            cluster_named.into()
        ))
    );
    let cluster = cluster(target);
    assert_eq!(cluster.name, cluster_named);
    assert_eq!(
        cluster.cluster_discovery_type,
        Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32
        )),
        "EDS must be explicit"
    );
    let eds = cluster.eds_cluster_config.unwrap_or_default();
    assert_eq!(eds.service_name, cluster_named);
    assert_eq!(load_assignment(target).cluster_name, cluster_named);
}

#[test]
fn endpoint_weights_become_locality_weights() {
    let services = services();
    let target = resolve(services.as_slice(), "greeter", "shop").expect("resolves");
    let assignment = load_assignment(target);
    let mut localities: Vec<(u32, Vec<String>)> = assignment
        .endpoints
        .iter()
        .map(|locality| {
            let weight = locality
                .load_balancing_weight
                .map(|w| w.value)
                .unwrap_or_default();
            let addresses = locality
                .lb_endpoints
                .iter()
                .map(|lb| match &lb.host_identifier {
                    Some(lb_endpoint::HostIdentifier::Endpoint(endpoint)) => {
                        match endpoint.address.as_ref().and_then(|a| a.address.as_ref()) {
                            Some(address::Address::SocketAddress(s)) => {
                                format!("{}:{:?}", s.address, s.port_specifier)
                            }
                            _ => String::new(),
                        }
                    }
                    _ => String::new(),
                })
                .collect();
            (weight, addresses)
        })
        .collect();
    localities.sort();
    // 80 for .1 alone; .2 and .4 share a locality of weight 2 x 20; .3 (weight 0) takes none.
    assert_eq!(
        localities,
        vec![
            (
                40,
                vec![
                    "10.0.0.2:Some(PortValue(7070))".to_string(),
                    "10.0.0.4:Some(PortValue(7070))".to_string()
                ]
            ),
            (80, vec!["10.0.0.1:Some(PortValue(7070))".to_string()]),
        ]
    );
    let distinct: std::collections::BTreeSet<_> = assignment
        .endpoints
        .iter()
        .map(|l| l.locality.clone().unwrap_or_default().sub_zone)
        .collect();
    assert_eq!(distinct.len(), 2, "each group is a locality of its own");
    let other = resolve(services.as_slice(), "greeter.other:8080", "shop").expect("resolves");
    let locality = load_assignment(other).endpoints[0]
        .locality
        .clone()
        .unwrap_or_default();
    assert_eq!(
        (
            locality.region.as_str(),
            locality.zone.as_str(),
            locality.sub_zone.as_str()
        ),
        ("r", "z", "s#weight=1")
    );
}

#[test]
fn duplicate_addresses_one_locality_per_spelling_and_weights_that_fit_a_u32() {
    let mut services = services();
    services[0].endpoints = vec![
        endpoint("10.0.0.1", 5, "us/east"),
        endpoint("10.0.0.1", 7, "us/east/"),
        endpoint("10.0.0.2", 5, "us/east/"),
        endpoint("10.0.0.3", u32::MAX, ""),
        endpoint("10.0.0.4", u32::MAX, ""),
    ];
    let target = resolve(services.as_slice(), "greeter", "shop").expect("resolves");
    let assignment = load_assignment(target);
    let listed: usize = assignment
        .endpoints
        .iter()
        .map(|l| l.lb_endpoints.len())
        .sum();
    assert_eq!(listed, 4, "10.0.0.1 once");
    let localities: Vec<_> = assignment
        .endpoints
        .iter()
        .map(|l| l.locality.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        localities.len(),
        2,
        "us/east and us/east/ are one: {localities:?}"
    );
    let total: u64 = assignment
        .endpoints
        .iter()
        .map(|l| u64::from(l.load_balancing_weight.map(|w| w.value).unwrap_or(0)))
        .sum();
    assert!(total <= u64::from(u32::MAX), "{total}");
    assert!(
        assignment
            .endpoints
            .iter()
            .all(|l| l.load_balancing_weight.is_some_and(|w| w.value > 0)),
        "no locality scaled to nothing"
    );
}
