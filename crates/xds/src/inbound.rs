//! Listeners of xDS-enabled gRPC servers (gRFC A36): a server asks for the listener named by the
//! bootstrap's template with its `IP:port`, and serves only once it has it.
//!
//! The shape is the one released servers accept (grpc-core's `xds_server_config_fetcher`,
//! grpc-js's `XdsServer`): the address echoed exactly (a mismatch leaves the server not
//! serving, without a NACK), no listener filters, one filter chain without a match (grpc-js
//! 1.14 never matches a chain whose match has an empty transport protocol), holding one HTTP
//! connection manager with an inline route whose action is `non_forwarding_action` (any other
//! fails every call with UNAVAILABLE), RBAC filters and the router last. TLS, when the port is
//! STRICT, is the chain's transport socket.

use std::net::IpAddr;

use dubbo_cp_domain::rules::scope::Endpoint;
use dubbo_cp_domain::service::{Service, ServiceEndpoint};
use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    NonForwardingAction, Route, RouteConfiguration, RouteMatch, VirtualHost, route, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
};
use envoy_types::util::pack_any;

use crate::bootstrap::SERVER_LISTENER_PREFIX;
use crate::security::{Decision, Policies, Unknown, Workload, rbac, tls, workload_of};

/// The address a server listens on, from its listener's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub ip: IpAddr,
    pub port: u16,
}

/// `IP:port` or `[IPv6]:port` after the template's prefix; `None` for any other name (port 0
/// included: grpc-js refuses to ask for it, and nothing serves it).
pub fn parse(name: &str) -> Option<Listening> {
    let address = name.strip_prefix(SERVER_LISTENER_PREFIX)?;
    let socket: std::net::SocketAddr = address.parse().ok()?;
    (socket.port() != 0).then(|| Listening {
        ip: socket.ip(),
        port: socket.port(),
    })
}

/// Who serves on an address: the first service of the server's namespace with an endpoint at
/// that IP serving one of its ports on that port number (its labels are that endpoint's). An
/// unspecified address (`0.0.0.0`, `::`) or an unknown one is the server's namespace, which
/// namespace-wide and root policies still select. Other namespaces are not searched: a client
/// naming another namespace's address learns nothing of its policies.
pub fn workload<'a>(
    services: &'a [Service],
    listening: Listening,
    server_namespace: &str,
) -> (Workload, Option<&'a Service>) {
    let at = |service: &Service, endpoint: &ServiceEndpoint| {
        endpoint.address == listening.ip
            && service
                .ports
                .iter()
                .any(|port| endpoint.port_for(port) == listening.port)
    };
    let found = (!listening.ip.is_unspecified())
        .then(|| {
            services
                .iter()
                .filter(|s| s.namespace == server_namespace)
                .find_map(|service| {
                    let endpoint = service.endpoints.iter().find(|e| at(service, e))?;
                    Some((service, endpoint))
                })
        })
        .flatten();
    match found {
        Some((service, endpoint)) => (
            Workload {
                endpoint: workload_of(service, listening.ip, &endpoint.labels),
                found: true,
            },
            Some(service),
        ),
        None => (
            Workload {
                endpoint: Endpoint {
                    namespace: server_namespace.to_owned(),
                    ips: (!listening.ip.is_unspecified())
                        .then_some(listening.ip)
                        .into_iter()
                        .collect(),
                    ..Endpoint::default()
                },
                found: false,
            },
            None,
        ),
    }
}

/// What a server listener enforces, for the listener and for operators.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub listening: Listening,
    /// `namespace/name` of the service found behind the address, if any.
    pub service: Option<String>,
    pub namespace: String,
    pub tls: Decision,
    pub rbac: rbac::Translated,
    /// Policies applied on selectors that could not be checked of this server.
    pub unknown: Unknown,
}

/// The server behind `listening`, as the policies see it.
pub fn server(
    services: &[Service],
    policies: &Policies,
    listening: Listening,
    server_namespace: &str,
) -> Server {
    let (workload, service) = workload(services, listening, server_namespace);
    let (tls, mut unknown) = policies.mode(&workload, listening.port);
    let (authorizing, guessed) = policies.authorizing(&workload);
    unknown.extend(guessed);
    let mut rbac = rbac::translate(authorizing.into_iter(), tls.mode.is_mtls());
    // gRPC servers on `::` may see IPv4 callers as `::ffff:a.b.c.d`, which grpc-js does not
    // match against IPv4 blocks.
    if listening.ip.is_unspecified() && listening.ip.is_ipv6() {
        for policy in rbac.peer_rules.clone() {
            rbac.problems.push((
                policy,
                "from.ipBlocks on a server listening on `::`: grpc-js sees IPv4 callers as \
                 ::ffff:a.b.c.d and does not match them (bind the pod IP)"
                    .to_owned(),
            ));
        }
    }
    Server {
        listening,
        service: service.map(|s| format!("{}/{}", s.namespace, s.name)),
        namespace: workload.endpoint.namespace,
        tls,
        rbac,
        unknown,
    }
}

/// The listener `name` for `server`.
pub fn listener(name: &str, server: &Server) -> Listener {
    let route = Route {
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix(String::new())),
            ..Default::default()
        }),
        action: Some(route::Action::NonForwardingAction(NonForwardingAction {})),
        ..Default::default()
    };
    let routes = RouteConfiguration {
        name: "inbound".to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: "inbound".to_owned(),
            // Servers pick the virtual host by :authority, which callers spell as they like.
            domains: vec!["*".to_owned()],
            routes: vec![route],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut http_filters: Vec<HttpFilter> = server.rbac.filters.clone();
    http_filters.push(HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            Router::default(),
        ))),
        ..Default::default()
    });
    let manager = HttpConnectionManager {
        stat_prefix: "inbound".to_owned(),
        http_filters,
        route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(routes)),
        ..Default::default()
    };
    let mtls = server.tls.mode.is_mtls();
    let chain = FilterChain {
        name: if mtls {
            "inbound-mtls"
        } else {
            "inbound-plaintext"
        }
        .to_owned(),
        filters: vec![Filter {
            name: "envoy.filters.network.http_connection_manager".to_owned(),
            config_type: Some(filter::ConfigType::TypedConfig(pack_any(manager))),
        }],
        transport_socket: mtls.then(tls::downstream_strict),
        ..Default::default()
    };
    Listener {
        name: name.to_owned(),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                // grpc-core compares `host:port` as it prints the bound address: no brackets,
                // no zone, the same spelling as the name.
                address: server.listening.ip.to_string(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                    server.listening.port,
                ))),
                ..Default::default()
            })),
        }),
        filter_chains: vec![chain],
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "inbound_tests.rs"]
mod tests;
