//! Listeners, routes, clusters and load assignments from the domain's services.
//!
//! Names follow Istio's, so tools that read them keep working: the listener and its route
//! configuration are named as the client asked (`greeter.shop:7070`), clusters
//! `outbound|<port>||<fqdn>` with the same EDS service name.

use std::collections::BTreeMap;

use dubbo_cp_domain::service::{HostName, Service, ServiceEndpoint, ServicePort, split_port};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, HealthStatus, Locality, SocketAddress,
    address, config_source, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::weighted_cluster::ClusterWeight;
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    WeightedCluster, header_matcher, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{UInt32Value, UInt64Value};
use envoy_types::util::pack_any;

use crate::conditions::glob_regex;
use crate::tags::{FORCE_HEADERS, Subset, TAG_HEADERS, Tagging};

/// What a requested name resolves to: a service and the port meant.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub service: &'a Service,
    pub port: &'a ServicePort,
}

/// Where services are looked up: by namespace and name, by application, and the applications
/// serving an interface (the ServiceNameMappings).
pub trait Services {
    fn find(&self, namespace: &str, name: &str) -> Option<&Service>;

    /// The service named by the DNS name `host` of its own (a ServiceEntry host), whichever
    /// namespace declared it.
    fn find_host(&self, host: &str) -> Option<&Service>;

    /// The services of `application` in `namespace`.
    fn of_application(&self, namespace: &str, application: &str) -> Vec<&Service>;

    /// The applications serving `interface` in `namespace`.
    fn serving(&self, _namespace: &str, _interface: &str) -> Vec<String> {
        Vec::new()
    }
}

/// A plain list, searched in order (small sets and tests; a snapshot keeps an index).
impl Services for [Service] {
    fn find(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.iter()
            .find(|s| s.namespace == namespace && s.name == name)
    }

    fn find_host(&self, host: &str) -> Option<&Service> {
        self.iter().find(|s| s.is_dns_host() && s.name == host)
    }

    fn of_application(&self, namespace: &str, application: &str) -> Vec<&Service> {
        self.iter()
            .filter(|s| s.namespace == namespace && s.application() == application)
            .collect()
    }
}

/// Resolves a listener name to every service port it means: a Kubernetes name (see
/// [`resolve`]) is one; else, in the client's namespace, an application name means that
/// application's services, and an interface name the services of every application its
/// ServiceNameMapping lists; else a ServiceEntry's DNS name ([`resolve_host`]). Each with the
/// port given, or its only one. Empty when nothing answers. Names a namespace declares come
/// before DNS names, which any namespace's entry may declare: an entry cannot take over a
/// service, application or interface name of another namespace.
pub fn resolve_all<'a, S: Services + ?Sized>(
    services: &'a S,
    requested: &str,
    client_namespace: &str,
) -> Vec<Target<'a>> {
    if let Some(target) = resolve(services, requested, client_namespace) {
        return vec![target];
    }
    let targets = resolve_names(services, requested, client_namespace);
    if !targets.is_empty() {
        return targets;
    }
    resolve_host(services, requested).into_iter().collect()
}

/// Application and interface names in the client's namespace.
fn resolve_names<'a, S: Services + ?Sized>(
    services: &'a S,
    requested: &str,
    client_namespace: &str,
) -> Vec<Target<'a>> {
    let (host, port) = match requested.rsplit_once(':') {
        Some((host, port)) => match port.parse::<u16>() {
            Ok(port) => (host, Some(port)),
            Err(_) => return Vec::new(),
        },
        None => (requested, None),
    };
    if host.is_empty() {
        return Vec::new();
    }
    let mut applications = vec![host.to_owned()];
    if services.of_application(client_namespace, host).is_empty() {
        applications = services.serving(client_namespace, host);
    }
    let mut targets: Vec<Target<'a>> = applications
        .iter()
        .flat_map(|application| services.of_application(client_namespace, application))
        .filter_map(|service| {
            Some(Target {
                service,
                port: service.port(port)?,
            })
        })
        .collect();
    targets.sort_by(|a, b| (&a.service.name, a.port.number).cmp(&(&b.service.name, b.port.number)));
    targets.dedup_by(|a, b| a.service.name == b.service.name && a.port.number == b.port.number);
    targets
}

/// Resolves a listener name a client asked for Kubernetes style (`svc`, `svc.ns`,
/// `svc.ns.svc.cluster.local`, each with or without `:port`), where a name without a namespace
/// is looked up in the client's. `None` when no service (or no single port) answers to it.
pub fn resolve<'a, S: Services + ?Sized>(
    services: &'a S,
    requested: &str,
    client_namespace: &str,
) -> Option<Target<'a>> {
    let host = HostName::parse(requested)?;
    let namespace = host.namespace.as_deref().unwrap_or(client_namespace);
    let service = services.find(namespace, &host.name)?;
    let port = service.port(host.port)?;
    Some(Target { service, port })
}

/// The service whose own DNS name `requested` is (with its port, or its only one), a
/// ServiceEntry host served verbatim (`api.payments.internal:50051`).
pub fn resolve_host<'a, S: Services + ?Sized>(
    services: &'a S,
    requested: &str,
) -> Option<Target<'a>> {
    let (host, port) = split_port(requested)?;
    let service = services.find_host(host)?;
    let port = service.port(port)?;
    Some(Target { service, port })
}

/// Whether `requested` resolves the same for every client: a Kubernetes name that says its
/// namespace and names a service there. Anything else may resolve in the client's namespace
/// (an application or interface name there comes before a DNS name).
pub fn resolves_alike<S: Services + ?Sized>(services: &S, requested: &str) -> bool {
    HostName::parse(requested).is_some_and(|host| {
        host.namespace
            .and_then(|namespace| services.find(&namespace, &host.name))
            .is_some_and(|service| service.port(host.port).is_some())
    })
}

/// `outbound|<port>||<fqdn>`, the cluster (and EDS service) name of a service port.
pub fn cluster_name(target: Target<'_>) -> String {
    subset_cluster_name(target, None)
}

/// `outbound|<port>|<subset>|<fqdn>`: the cluster of a subset of a service port's endpoints.
pub fn subset_cluster_name(target: Target<'_>, subset: Option<&Subset>) -> String {
    let subset = subset.map(Subset::name).unwrap_or_default();
    format!(
        "outbound|{}|{subset}|{}",
        target.port.number,
        target.service.fqdn()
    )
}

fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

/// The API listener of `requested`: an HTTP connection manager whose routes come over ADS under
/// the same name.
pub fn listener(requested: &str) -> Listener {
    // Clients refuse an empty filter chain and need the router last (xds.md).
    let router = HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            Router::default(),
        ))),
        ..Default::default()
    };
    let manager = HttpConnectionManager {
        stat_prefix: requested.to_owned(),
        http_filters: vec![router],
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: requested.to_owned(),
        })),
        ..Default::default()
    };
    Listener {
        name: requested.to_owned(),
        api_listener: Some(ApiListener {
            api_listener: Some(pack_any(manager)),
        }),
        ..Default::default()
    }
}

fn route_to(cluster: String, headers: Vec<HeaderMatcher>) -> Route {
    Route {
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix(String::new())),
            headers,
            ..Default::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster)),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A header equal to `value`; `ignore_case` for the force flag only (Dubbo reads it with
/// Boolean.parseBoolean, and compares tags exactly).
fn header_is(name: &str, value: &str, ignore_case: bool) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(value.to_owned())),
                ignore_case,
            },
        )),
        ..Default::default()
    }
}

fn header_present(name: &str) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)),
        ..Default::default()
    }
}

/// A ConditionRoute's conditions as routes, in order, before tag routing: the method against the
/// path's last part, attachments as metadata, each to its condition's subset.
fn condition_routes(target: Target<'_>, tagging: &Tagging<'_>) -> Vec<Route> {
    let alternatives = |patterns: &[String]| {
        let regexes: Vec<String> = patterns.iter().map(|p| glob_regex(p)).collect();
        format!("(?:{})", regexes.join("|"))
    };
    let regex = |regex: String| RegexMatcher {
        regex,
        ..Default::default()
    };
    let header = |name: &str, patterns: &[String], invert_match: bool| HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::SafeRegex(regex(
                    alternatives(patterns),
                ))),
                ignore_case: false,
            },
        )),
        invert_match,
        ..Default::default()
    };
    // "Absent" as every client reads it: present, inverted (grpc-js-xds reads `present_match:
    // false` as present).
    let absent = |name: &str| HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)),
        invert_match: true,
        ..Default::default()
    };
    tagging
        .conditions()
        .iter()
        .enumerate()
        .flat_map(|(i, condition)| {
            // gRPC paths are `/<package.Service>/<method>`.
            let service = condition
                .service
                .as_deref()
                .map_or_else(|| "[^/]*".to_owned(), crate::conditions::regex_escape);
            let path = match (condition.methods.is_empty(), &condition.service) {
                (true, None) => route_match::PathSpecifier::Prefix(String::new()),
                (true, Some(_)) => {
                    route_match::PathSpecifier::SafeRegex(regex(format!("/{service}/[^/]*")))
                }
                (false, _) => route_match::PathSpecifier::SafeRegex(regex(format!(
                    "/{service}/{}",
                    alternatives(&condition.methods)
                ))),
            };
            // Each set of header matchers is one route. A metadata key with only `!=` values also
            // passes when the call does not send it (Dubbo compares nothing then), which a
            // matcher on a missing header never does: that is a route of its own.
            let mut variants: Vec<Vec<HeaderMatcher>> = vec![Vec::new()];
            for (name, matches, mismatches) in &condition.headers {
                let mut present = Vec::new();
                if !matches.is_empty() {
                    present.push(header(name, matches, false));
                }
                if !mismatches.is_empty() {
                    present.push(header(name, mismatches, true));
                }
                let choices = if matches.is_empty() {
                    vec![present, vec![absent(name)]]
                } else {
                    vec![present]
                };
                variants = variants
                    .into_iter()
                    .flat_map(|so_far| {
                        choices.iter().map(move |choice| {
                            let mut headers = so_far.clone();
                            headers.extend(choice.iter().cloned());
                            headers
                        })
                    })
                    .collect();
            }
            let cluster = subset_cluster_name(target, Some(&Subset::Condition(i)));
            variants.into_iter().map(move |headers| {
                let mut route = route_to(cluster.clone(), headers);
                if let Some(RouteMatch { path_specifier, .. }) = route.r#match.as_mut() {
                    *path_specifier = Some(path.clone());
                }
                route
            })
        })
        .collect()
}

/// The routes of tag routing (see [`crate::tags`]), most specific first: a tag forced, a tag,
/// any other tag forced, any other tag, no tag. "Any other tag" is the subset of the empty tag.
fn tag_routes(target: Target<'_>, tagging: &Tagging<'_>) -> Vec<Route> {
    let cluster = |subset: Subset| subset_cluster_name(target, Some(&subset));
    let mut routes = Vec::new();
    let tags: Vec<&str> = tagging.tags().into_iter().collect();
    for tag in tags.iter().copied().chain([""]) {
        for header in TAG_HEADERS {
            let tagged = || match tag {
                "" => header_present(header),
                tag => header_is(header, tag, false),
            };
            for force in FORCE_HEADERS {
                routes.push(route_to(
                    cluster(Subset::Forced(tag.to_owned())),
                    vec![tagged(), header_is(force, "true", true)],
                ));
            }
            routes.push(route_to(
                cluster(Subset::Tagged(tag.to_owned())),
                vec![tagged()],
            ));
        }
    }
    routes.push(route_to(cluster(Subset::Untagged), Vec::new()));
    routes
}

fn virtual_host_config(requested: &str, routes: Vec<Route>) -> RouteConfiguration {
    RouteConfiguration {
        name: requested.to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: requested.to_owned(),
            // The client matches its authority, port included: with no matching domain every RPC
            // fails. The configuration is this listener's alone, so `*` is safe beside the name.
            domains: vec![requested.to_owned(), "*".to_owned()],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The route configuration of `requested`: every request to the target's cluster, or with tag
/// routing (a TagRoute of the service's application, or static tags), to the subset its tag
/// selects.
pub fn route_configuration(
    requested: &str,
    target: Target<'_>,
    tagging: Option<&Tagging<'_>>,
) -> RouteConfiguration {
    let mut routes = tagging
        .map(|t| condition_routes(target, t))
        .unwrap_or_default();
    routes.extend(match tagging.filter(|t| t.applies()) {
        Some(tagging) => tag_routes(target, tagging),
        None => vec![route_to(cluster_name(target), Vec::new())],
    });
    virtual_host_config(requested, routes)
}

/// The EDS cluster of a target.
pub fn cluster(target: Target<'_>) -> Cluster {
    subset_cluster(target, None, Balancing::RoundRobin)
}

/// Every route of `config` hashes calls on each of `headers` (one per application behind it
/// that asks for affinity), so a caller sending the same value keeps its endpoint.
pub fn hash_on_headers(config: &mut RouteConfiguration, headers: &[&str]) {
    if headers.is_empty() {
        return;
    }
    let policies: Vec<route_action::HashPolicy> = headers
        .iter()
        .map(|name| route_action::HashPolicy {
            policy_specifier: Some(route_action::hash_policy::PolicySpecifier::Header(
                route_action::hash_policy::Header {
                    header_name: (*name).to_owned(),
                    regex_rewrite: None,
                },
            )),
            terminal: false,
        })
        .collect();
    for host in &mut config.virtual_hosts {
        for route in &mut host.routes {
            if let Some(route::Action::Route(action)) = &mut route.action {
                action.hash_policy.clone_from(&policies);
            }
        }
    }
}

/// Entries on a ring-hash cluster's ring: the most gRPC clients build.
pub const RING_SIZE: u64 = 4096;

/// How a cluster's endpoints are picked, which also decides how their weights are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balancing<'a> {
    /// Per call, by weight: gRPC's round robin under weighted localities.
    RoundRobin,
    /// Session affinity: a ring hash over the endpoints, each call placed by the hash of this
    /// request header (a call without it lands at random, by weight).
    HashHeader(&'a str),
}

/// The EDS cluster of a subset of a target's endpoints.
pub fn subset_cluster(
    target: Target<'_>,
    subset: Option<&Subset>,
    balancing: Balancing,
) -> Cluster {
    let name = subset_cluster_name(target, subset);
    let (lb_policy, lb_config) = match balancing {
        Balancing::RoundRobin => (cluster::LbPolicy::RoundRobin, None),
        // xxHash (the default; gRPC refuses any other). gRPC caps a ring at 4,096 entries
        // whatever the maximum says; the default minimum, 1,024, leaves a pod's share of the
        // ring about 1.4 points off its weight, 4,096 about 0.7.
        Balancing::HashHeader(_) => (
            cluster::LbPolicy::RingHash,
            Some(cluster::LbConfig::RingHashLbConfig(
                cluster::RingHashLbConfig {
                    minimum_ring_size: Some(UInt64Value { value: RING_SIZE }),
                    ..Default::default()
                },
            )),
        ),
    };
    Cluster {
        lb_policy: lb_policy as i32,
        lb_config,
        // The type must be given: the default (STATIC) is refused by gRPC clients.
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: name.clone(),
        }),
        name,
        ..Default::default()
    }
}

/// The endpoints of a target, weighted in a form gRPC clients apply.
///
/// gRPC's round robin ignores endpoint weights and honours locality weights, so endpoints are
/// grouped by (locality, weight): each group is a locality of its own (the weight is appended to
/// its sub-zone) weighing `weight` x its endpoints. Endpoints of weight 0 take no traffic and
/// are left out; a locality must not be empty or unweighted, or clients drop it silently.
///
/// Ring hash weighs each endpoint by its locality's weight times its own (gRFC A42), so there a
/// group's locality weighs `weight` alone and each of its endpoints 1.
pub fn load_assignment(target: Target<'_>) -> ClusterLoadAssignment {
    let all: Vec<&ServiceEndpoint> = target.service.endpoints.iter().collect();
    subset_load_assignment(target, None, &all, Balancing::RoundRobin)
}

/// The load assignment of a subset's cluster: `endpoints`, weighted as [`load_assignment`].
pub fn subset_load_assignment(
    target: Target<'_>,
    subset: Option<&Subset>,
    endpoints: &[&ServiceEndpoint],
    balancing: Balancing,
) -> ClusterLoadAssignment {
    let per_endpoint = matches!(balancing, Balancing::HashHeader(_));
    // Clients refuse a response naming one address twice: the first listing of an address wins.
    let mut addresses = std::collections::BTreeSet::new();
    let mut groups: BTreeMap<([String; 3], u32), Vec<&ServiceEndpoint>> = BTreeMap::new();
    for endpoint in endpoints.iter().copied() {
        let address = (endpoint.address, endpoint.port_for(target.port));
        if endpoint.weight > 0 && addresses.insert(address) {
            groups
                .entry((locality_of(&endpoint.locality), endpoint.weight))
                .or_default()
                .push(endpoint);
        }
    }
    // The weights of a priority must sum to at most u32::MAX: scaled down together if not.
    let group_weight = |weight: u32, members: usize| {
        if per_endpoint {
            u64::from(weight)
        } else {
            u64::from(weight) * members as u64
        }
    };
    // Summed over endpoints either way: ring hash adds up every endpoint's weight.
    let total: u64 = groups
        .iter()
        .map(|((_, weight), members)| u64::from(*weight) * members.len() as u64)
        .sum();
    let divisor = total.div_ceil(u64::from(u32::MAX)).max(1);
    let endpoints = groups
        .into_iter()
        .map(|((locality, weight), members)| {
            let share = group_weight(weight, members.len()) / divisor;
            let [region, zone, sub_zone] = locality;
            LocalityLbEndpoints {
                locality: Some(Locality {
                    region,
                    zone,
                    sub_zone: format!("{sub_zone}#weight={weight}"),
                }),
                load_balancing_weight: Some(UInt32Value {
                    value: u32::try_from(share.max(1)).unwrap_or(u32::MAX),
                }),
                lb_endpoints: members
                    .into_iter()
                    .map(|endpoint| lb_endpoint_of(endpoint, target.port))
                    .collect(),
                ..Default::default()
            }
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: subset_cluster_name(target, subset),
        endpoints,
        ..Default::default()
    }
}

/// `region/zone/subzone` as its three parts; missing parts are empty, so `us/east` and
/// `us/east/` are one locality.
fn locality_of(text: &str) -> [String; 3] {
    let mut parts = text.splitn(3, '/');
    let mut next = || parts.next().unwrap_or_default().to_owned();
    [next(), next(), next()]
}

fn lb_endpoint_of(endpoint: &ServiceEndpoint, port: &ServicePort) -> LbEndpoint {
    let address = SocketAddress {
        address: endpoint.address.to_string(),
        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
            endpoint.port_for(port),
        ))),
        ..Default::default()
    };
    LbEndpoint {
        health_status: HealthStatus::Healthy as i32,
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(envoy_types::pb::envoy::config::core::v3::Address {
                address: Some(address::Address::SocketAddress(address)),
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

mod several;
pub use several::weighted_route_configuration;

#[cfg(test)]
mod tests;
