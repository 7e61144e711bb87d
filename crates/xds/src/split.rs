//! The traffic split a client gets: for a target it dials (`xds:///NAME`), its namespace and the
//! headers of a call, the share of calls each endpoint receives, read from the resources this
//! server serves that client (listener, route configuration, clusters, load assignments) and
//! walked as gRPC's xDS clients walk them:
//! - the first route whose path and headers match picks a cluster, or clusters by weight;
//! - a cluster's load assignment serves its lowest priority that has endpoints;
//! - round robin: localities share by their weights (gRFC A28's weighted target), and within
//!   one the endpoints share equally; ring hash: each endpoint weighs its locality's weight
//!   times its own (gRFC A42), which is the share over many hash keys.
//!
//! Operators see it on the dashboard and with `dubbo-cp xds split`; nothing is derived from the
//! rules a second time, so what is shown is what the client was told.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, address};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, RouteConfiguration, RouteMatch, header_matcher, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use crate::snapshot::{Snapshot, select};
use crate::{CLUSTER, ENDPOINT, LISTENER, ROUTE};

/// Headers a split may be asked for; a call carries a handful.
pub const MAX_HEADERS: usize = 16;

/// A call to split: where it goes and what it carries.
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// What the client dials, `xds:///` left out: a host (`greeter:7070`) or an interface.
    pub target: String,
    /// The client's namespace (its bootstrap's, or its identity's).
    pub namespace: String,
    /// The call's path, `/<service>/<method>`; without one, routes that match on the path
    /// (ConditionRoutes on methods) are passed over and said to be.
    pub path: Option<String>,
    /// The call's headers (metadata), names in lower case.
    pub headers: Vec<(String, String)>,
}

/// The split of one call.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Split {
    /// The version of the resources it was read from.
    pub version: String,
    /// The route that matched: its position and what it matches on.
    pub route: usize,
    pub matched: String,
    /// The clusters the route sends to, with their share (percent).
    pub clusters: Vec<ClusterShare>,
    /// Every endpoint the call may reach, with its share of calls (percent, summing to 100).
    pub endpoints: Vec<EndpointShare>,
    /// What the reader should know: routes passed over for want of a path, hashing.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClusterShare {
    pub name: String,
    pub share: f64,
    /// `ROUND_ROBIN` or `RING_HASH`.
    pub policy: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EndpointShare {
    /// `IP:port`.
    pub address: String,
    pub cluster: String,
    /// `region/zone/sub_zone`.
    pub locality: String,
    pub share: f64,
}

/// Why there is no split to show.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SplitError {
    #[error(
        "no listener {0:?} is served to namespace {1:?}: the name resolves to no service there"
    )]
    NoListener(String, String),
    #[error("{0} {1:?} is not served")]
    Missing(&'static str, String),
    #[error("{0} {1:?} does not decode: {2}")]
    Undecodable(&'static str, String, String),
    #[error("listener {0:?} names no route configuration")]
    NoRoutes(String),
    #[error("no route of {0:?} matches the call{1}")]
    NoMatch(String, String),
    #[error("no virtual host of {0:?} serves {1:?}")]
    NoVirtualHost(String, String),
}

fn resource<M: Message + Default>(
    snapshot: &Snapshot,
    type_url: &'static str,
    name: &str,
    namespace: &str,
) -> Result<M, SplitError> {
    let names = BTreeSet::from([name.to_owned()]);
    let any: std::sync::Arc<Any> = select(snapshot, type_url, &names, false, namespace)
        .into_iter()
        .next()
        .map(|(_, any)| any)
        .ok_or_else(|| match type_url {
            LISTENER => SplitError::NoListener(name.to_owned(), namespace.to_owned()),
            _ => SplitError::Missing(crate::short_type(type_url), name.to_owned()),
        })?;
    M::decode(any.value.as_slice()).map_err(|e| {
        SplitError::Undecodable(crate::short_type(type_url), name.to_owned(), e.to_string())
    })
}

/// The split of `call` as the resources of `snapshot` give it.
pub fn split(snapshot: &Snapshot, call: &Call) -> Result<Split, SplitError> {
    let ns = call.namespace.as_str();
    let listener: Listener = resource(snapshot, LISTENER, &call.target, ns)?;
    let manager = listener
        .api_listener
        .and_then(|api| api.api_listener)
        .and_then(|any| HttpConnectionManager::decode(any.value.as_slice()).ok())
        .ok_or_else(|| SplitError::NoRoutes(call.target.clone()))?;
    let routes: RouteConfiguration = match manager.route_specifier {
        Some(http_connection_manager::RouteSpecifier::Rds(rds)) => {
            resource(snapshot, ROUTE, &rds.route_config_name, ns)?
        }
        Some(http_connection_manager::RouteSpecifier::RouteConfig(inline)) => inline,
        _ => return Err(SplitError::NoRoutes(call.target.clone())),
    };
    let host = routes
        .virtual_hosts
        .iter()
        .find(|vh| vh.domains.iter().any(|d| d == &call.target))
        .or_else(|| {
            routes
                .virtual_hosts
                .iter()
                .find(|vh| vh.domains.iter().any(|d| domain_matches(d, &call.target)))
        })
        .ok_or_else(|| SplitError::NoVirtualHost(routes.name.clone(), call.target.clone()))?;
    let mut notes = Vec::new();
    let mut passed_for_path = 0;
    let (index, route) = host
        .routes
        .iter()
        .enumerate()
        .find(|(_, route)| {
            let Some(matcher) = &route.r#match else {
                return false;
            };
            match path_matches(matcher, call.path.as_deref()) {
                Some(true) => matcher
                    .headers
                    .iter()
                    .all(|h| header_matches(h, &call.headers)),
                Some(false) => false,
                None => {
                    passed_for_path += 1;
                    false
                }
            }
        })
        .ok_or_else(|| {
            let why = if passed_for_path > 0 {
                format!(" ({passed_for_path} routes match on the path: give one)")
            } else {
                String::new()
            };
            SplitError::NoMatch(routes.name.clone(), why)
        })?;
    if passed_for_path > 0 {
        notes.push(format!(
            "{passed_for_path} route(s) before it match on the call's path (a ConditionRoute on methods): give --path to see them"
        ));
    }
    let Some(route::Action::Route(action)) = &route.action else {
        return Err(SplitError::NoMatch(
            routes.name.clone(),
            " (the matching route forwards nowhere)".into(),
        ));
    };
    let weighted: Vec<(String, f64)> = match &action.cluster_specifier {
        Some(route_action::ClusterSpecifier::Cluster(name)) => vec![(name.clone(), 1.0)],
        Some(route_action::ClusterSpecifier::WeightedClusters(w)) => {
            let total: f64 = w
                .clusters
                .iter()
                .map(|c| f64::from(c.weight.map_or(0, |w| w.value)))
                .sum();
            w.clusters
                .iter()
                .filter(|c| total > 0.0 && c.weight.is_some_and(|w| w.value > 0))
                .map(|c| {
                    (
                        c.name.clone(),
                        f64::from(c.weight.map_or(0, |w| w.value)) / total,
                    )
                })
                .collect()
        }
        _ => Vec::new(),
    };
    if !action.hash_policy.is_empty() {
        notes.push(
            "the route hashes on a header: one key always reaches one endpoint; the shares are over many keys".into(),
        );
    }
    let mut clusters = Vec::new();
    let mut endpoints = Vec::new();
    for (name, cluster_share) in weighted {
        let cluster: Cluster = resource(snapshot, CLUSTER, &name, ns)?;
        let ring = cluster.lb_policy == cluster::LbPolicy::RingHash as i32;
        let assignment_name = cluster
            .eds_cluster_config
            .as_ref()
            .map(|eds| eds.service_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| name.clone());
        let assignment: ClusterLoadAssignment = resource(snapshot, ENDPOINT, &assignment_name, ns)?;
        clusters.push(ClusterShare {
            name: name.clone(),
            share: 100.0 * cluster_share,
            policy: if ring { "RING_HASH" } else { "ROUND_ROBIN" }.to_owned(),
        });
        for (address, locality, share) in endpoint_shares(&assignment, ring) {
            endpoints.push(EndpointShare {
                address,
                cluster: name.clone(),
                locality,
                share: 100.0 * cluster_share * share,
            });
        }
    }
    Ok(Split {
        version: snapshot.version.to_string(),
        route: index,
        matched: describe(route.r#match.as_ref()),
        clusters,
        endpoints,
        notes,
    })
}

/// `(address, locality, share of the cluster's calls)` of each endpoint a client would use.
fn endpoint_shares(assignment: &ClusterLoadAssignment, ring: bool) -> Vec<(String, String, f64)> {
    let usable = |health: i32| {
        health == HealthStatus::Unknown as i32 || health == HealthStatus::Healthy as i32
    };
    let Some(priority) = assignment
        .endpoints
        .iter()
        .filter(|l| l.lb_endpoints.iter().any(|e| usable(e.health_status)))
        .map(|l| l.priority)
        .min()
    else {
        return Vec::new();
    };
    let localities: Vec<_> = assignment
        .endpoints
        .iter()
        .filter(|l| l.priority == priority && l.load_balancing_weight.is_some_and(|w| w.value > 0))
        .map(|l| {
            let members: Vec<_> = l
                .lb_endpoints
                .iter()
                .filter(|e| usable(e.health_status))
                .collect();
            (l, members)
        })
        .filter(|(_, members)| !members.is_empty())
        .collect();
    let weight = |w: Option<u32>| f64::from(w.unwrap_or(1));
    let locality_weight =
        |l: &envoy_types::pb::envoy::config::endpoint::v3::LocalityLbEndpoints| {
            f64::from(l.load_balancing_weight.map_or(0, |w| w.value))
        };
    let total: f64 = if ring {
        localities
            .iter()
            .flat_map(|(l, members)| {
                members.iter().map(move |e| {
                    locality_weight(l) * weight(e.load_balancing_weight.map(|w| w.value))
                })
            })
            .sum()
    } else {
        localities.iter().map(|(l, _)| locality_weight(l)).sum()
    };
    if total <= 0.0 {
        return Vec::new();
    }
    let mut shares = Vec::new();
    for (locality, members) in &localities {
        let name = locality
            .locality
            .as_ref()
            .map(|l| format!("{}/{}/{}", l.region, l.zone, l.sub_zone))
            .unwrap_or_default();
        for endpoint in members {
            let share = if ring {
                locality_weight(locality) * weight(endpoint.load_balancing_weight.map(|w| w.value))
                    / total
            } else {
                locality_weight(locality) / total / members.len() as f64
            };
            shares.push((address_of(endpoint), name.clone(), share));
        }
    }
    shares
}

fn address_of(endpoint: &envoy_types::pb::envoy::config::endpoint::v3::LbEndpoint) -> String {
    let Some(lb_endpoint::HostIdentifier::Endpoint(endpoint)) = &endpoint.host_identifier else {
        return String::new();
    };
    match endpoint.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(socket)) => {
            let port = match socket.port_specifier {
                Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => p,
                _ => 0,
            };
            match socket.address.parse::<std::net::IpAddr>() {
                Ok(ip) => {
                    std::net::SocketAddr::new(ip, u16::try_from(port).unwrap_or(0)).to_string()
                }
                Err(_) => format!("{}:{port}", socket.address),
            }
        }
        _ => String::new(),
    }
}

/// gRPC's domain match: exact, `*`, `*suffix` or `prefix*` (case-insensitive).
fn domain_matches(domain: &str, host: &str) -> bool {
    let (domain, host) = (domain.to_ascii_lowercase(), host.to_ascii_lowercase());
    if domain == "*" || domain == host {
        return true;
    }
    if let Some(suffix) = domain.strip_prefix('*') {
        return host.ends_with(suffix);
    }
    if let Some(prefix) = domain.strip_suffix('*') {
        return host.starts_with(prefix);
    }
    false
}

/// Whether the route's path matcher takes `path`; `None` when it depends on a path not given.
fn path_matches(matcher: &RouteMatch, path: Option<&str>) -> Option<bool> {
    let case = matcher.case_sensitive.is_none_or(|c| c.value);
    let eq = |a: &str, b: &str| {
        if case {
            a == b
        } else {
            a.eq_ignore_ascii_case(b)
        }
    };
    match &matcher.path_specifier {
        Some(route_match::PathSpecifier::Prefix(prefix)) if prefix.is_empty() || prefix == "/" => {
            Some(true)
        }
        Some(route_match::PathSpecifier::Prefix(prefix)) => {
            path.map(|p| p.get(..prefix.len()).is_some_and(|head| eq(head, prefix)))
        }
        Some(route_match::PathSpecifier::Path(exact)) => path.map(|p| eq(p, exact)),
        Some(route_match::PathSpecifier::SafeRegex(regex)) => {
            path.map(|p| full_match(&regex.regex, p))
        }
        // gRPC clients refuse other path matchers (and a route without one).
        _ => Some(false),
    }
}

/// RE2's full match, as gRPC applies a safe regex; a regex that does not compile matches
/// nothing (clients refuse the resource).
fn full_match(pattern: &str, text: &str) -> bool {
    regex::Regex::new(&format!("^(?:{pattern})$")).is_ok_and(|r| r.is_match(text))
}

fn header_matches(matcher: &HeaderMatcher, headers: &[(String, String)]) -> bool {
    let name = matcher.name.to_ascii_lowercase();
    // Several values of one header are joined with commas, as gRPC does.
    let values: Vec<&str> = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(&name))
        .map(|(_, v)| v.as_str())
        .collect();
    let value = (!values.is_empty()).then(|| values.join(","));
    let matched = match (&matcher.header_match_specifier, &value) {
        (Some(header_matcher::HeaderMatchSpecifier::PresentMatch(present)), v) => {
            v.is_some() == *present
        }
        // An absent header matches no value matcher, inverted or not, as gRPC clients read it.
        (_, None) => return false,
        // The deprecated forms (exact_match, safe_regex_match, ...) are never generated here.
        (Some(header_matcher::HeaderMatchSpecifier::StringMatch(s)), Some(v)) => {
            string_matches(s, v)
        }
        (_, Some(_)) => false,
    };
    matched != matcher.invert_match
}

fn string_matches(matcher: &StringMatcher, value: &str) -> bool {
    let fold = |s: &str| {
        if matcher.ignore_case {
            s.to_ascii_lowercase()
        } else {
            s.to_owned()
        }
    };
    let v = fold(value);
    match &matcher.match_pattern {
        Some(string_matcher::MatchPattern::Exact(e)) => v == fold(e),
        Some(string_matcher::MatchPattern::Prefix(p)) => v.starts_with(&fold(p)),
        Some(string_matcher::MatchPattern::Suffix(s)) => v.ends_with(&fold(s)),
        Some(string_matcher::MatchPattern::Contains(c)) => v.contains(&fold(c)),
        Some(string_matcher::MatchPattern::SafeRegex(r)) => full_match(&r.regex, value),
        _ => false,
    }
}

/// A route's match as one line: `path ^/svc/m$ & x-tag=gray & !dubbo.force.tag`.
fn describe(matcher: Option<&RouteMatch>) -> String {
    let Some(matcher) = matcher else {
        return String::new();
    };
    let mut parts = Vec::new();
    match &matcher.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) if p.is_empty() || p == "/" => {}
        Some(route_match::PathSpecifier::Prefix(p)) => parts.push(format!("path {p}*")),
        Some(route_match::PathSpecifier::Path(p)) => parts.push(format!("path {p}")),
        Some(route_match::PathSpecifier::SafeRegex(r)) => parts.push(format!("path ~ {}", r.regex)),
        _ => {}
    }
    for header in &matcher.headers {
        let not = if header.invert_match { "!" } else { "" };
        let what = match &header.header_match_specifier {
            Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)) => String::new(),
            Some(header_matcher::HeaderMatchSpecifier::StringMatch(s)) => match &s.match_pattern {
                Some(string_matcher::MatchPattern::Exact(e)) => format!("={e}"),
                Some(string_matcher::MatchPattern::SafeRegex(r)) => format!(" ~ {}", r.regex),
                Some(string_matcher::MatchPattern::Prefix(p)) => format!("={p}*"),
                Some(string_matcher::MatchPattern::Suffix(p)) => format!("=*{p}"),
                Some(string_matcher::MatchPattern::Contains(p)) => format!("=*{p}*"),
                _ => " (?)".into(),
            },
            _ => " (?)".into(),
        };
        parts.push(format!("{not}{}{what}", header.name));
    }
    if parts.is_empty() {
        "every call".into()
    } else {
        parts.join(" & ")
    }
}

#[cfg(test)]
mod tests;
