#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use dubbo_cp_domain::rules::{AuthenticationPolicySpec, AuthorizationPolicySpec};
use dubbo_cp_domain::service::{ServiceEndpoint, ServicePort};
use envoy_types::pb::envoy::config::core::v3::transport_socket;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, common_tls_context,
};
use prost::Message;

use super::*;
use crate::security::Named;

fn name(address: &str) -> String {
    format!("{SERVER_LISTENER_PREFIX}{address}")
}

fn services() -> Vec<Service> {
    vec![Service {
        namespace: "shop".into(),
        name: "greeter".into(),
        labels: BTreeMap::from([("app".to_owned(), "greeter".to_owned())]),
        ports: vec![ServicePort {
            number: 7070,
            name: "grpc".into(),
            protocol: "GRPC".into(),
        }],
        endpoints: vec![ServiceEndpoint {
            address: "127.0.0.1".parse().unwrap(),
            ports: BTreeMap::from([("grpc".to_owned(), 50051)]),
            labels: BTreeMap::from([("version".to_owned(), "v2".to_owned())]),
            weight: 100,
            locality: String::new(),
        }],
    }]
}

fn strict_shop() -> Policies {
    Policies {
        authentication: vec![Named {
            namespace: "shop".into(),
            name: "strict".into(),
            spec: AuthenticationPolicySpec {
                action: "STRICT".into(),
                selector: Vec::new(),
                port_level: Vec::new(),
            },
        }],
        authorization: vec![Named {
            namespace: "shop".into(),
            name: "all".into(),
            spec: AuthorizationPolicySpec {
                action: "ALLOW".into(),
                rules: Vec::new(),
                samples: 0.0,
                order: 0.0,
                match_type: String::new(),
            },
        }],
        ..Policies::default()
    }
}

#[test]
fn names_parse_to_the_listening_address() {
    let ok = |address: &str, ip: &str, port| {
        assert_eq!(
            parse(&name(address)),
            Some(Listening {
                ip: ip.parse().unwrap(),
                port
            }),
            "{address}"
        );
    };
    ok("127.0.0.1:50051", "127.0.0.1", 50051);
    ok("0.0.0.0:1", "0.0.0.0", 1);
    ok("[::]:50051", "::", 50051);
    ok("[fd00::1]:8080", "fd00::1", 8080);
    for bad in [
        "127.0.0.1:0",
        "127.0.0.1",
        "host:50051",
        "",
        "127.0.0.1:65536",
    ] {
        assert_eq!(parse(&name(bad)), None, "{bad}");
    }
    assert_eq!(parse("greeter:50051"), None);
}

#[test]
fn the_workload_is_the_endpoint_at_the_address_else_the_server_namespace() {
    let services = services();
    let at = |address: &str| parse(&name(address)).unwrap();
    let (found, service) = workload(&services, at("127.0.0.1:50051"), "shop");
    assert_eq!(service.map(|s| s.name.as_str()), Some("greeter"));
    assert!(found.found);
    assert_eq!(found.endpoint.namespace, "shop");
    assert_eq!(found.endpoint.pod_labels["app"], "greeter");
    assert_eq!(found.endpoint.pod_labels["version"], "v2");
    // Another namespace's server does not find it (nor learn its policies).
    let (found, service) = workload(&services, at("127.0.0.1:50051"), "other");
    assert!(service.is_none() && !found.found);
    assert_eq!(found.endpoint.namespace, "other");
    // The service port is not where the endpoint listens.
    let (found, service) = workload(&services, at("127.0.0.1:7070"), "shop");
    assert!(service.is_none() && !found.found);
    let (found, _) = workload(&services, at("0.0.0.0:50051"), "shop");
    assert!(
        found.endpoint.ips.is_empty(),
        "an unspecified address selects no IP"
    );
}

#[test]
fn a_plaintext_listener_has_the_shape_servers_accept() {
    let listening = parse(&name("127.0.0.1:50051")).unwrap();
    let server = server(&services(), &Policies::default(), listening, "shop");
    assert_eq!(server.tls.mode, crate::security::Mode::Permissive);
    let listener = listener(&name("127.0.0.1:50051"), &server);
    let Some(address::Address::SocketAddress(socket)) =
        listener.address.as_ref().and_then(|a| a.address.clone())
    else {
        panic!("no socket address");
    };
    assert_eq!(socket.address, "127.0.0.1");
    assert_eq!(
        socket.port_specifier,
        Some(socket_address::PortSpecifier::PortValue(50051))
    );
    assert!(listener.listener_filters.is_empty());
    assert!(listener.use_original_dst.is_none());
    assert_eq!(listener.filter_chains.len(), 1);
    let chain = &listener.filter_chains[0];
    assert!(chain.filter_chain_match.is_none());
    assert!(chain.transport_socket.is_none());
    assert_eq!(chain.filters.len(), 1);
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!()
    };
    let manager = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    let Some(http_connection_manager::RouteSpecifier::RouteConfig(routes)) =
        manager.route_specifier
    else {
        panic!("routes must be inline")
    };
    assert_eq!(routes.virtual_hosts[0].domains, ["*"]);
    assert!(matches!(
        routes.virtual_hosts[0].routes[0].action,
        Some(route::Action::NonForwardingAction(_))
    ));
    let names: Vec<&str> = manager
        .http_filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["envoy.filters.http.router"]);
    assert_eq!(manager.xff_num_trusted_hops, 0);
}

#[test]
fn a_strict_listener_requires_client_certificates_and_checks_no_sans() {
    let listening = parse(&name("[::1]:50051")).unwrap();
    let server = server(&services(), &strict_shop(), listening, "shop");
    assert_eq!(server.tls.policy.as_deref(), Some("shop/strict"));
    assert_eq!(server.rbac.allow, ["shop/all"]);
    let listener = listener(&name("[::1]:50051"), &server);
    let Some(address::Address::SocketAddress(socket)) =
        listener.address.as_ref().and_then(|a| a.address.clone())
    else {
        panic!("no socket address");
    };
    assert_eq!(
        socket.address, "::1",
        "echoed without brackets, as grpc-core joins it"
    );
    let chain = &listener.filter_chains[0];
    assert_eq!(chain.name, "inbound-mtls");
    let socket = chain.transport_socket.as_ref().unwrap();
    assert_eq!(socket.name, "envoy.transport_sockets.tls");
    let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
        panic!()
    };
    let context = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        context.require_client_certificate.map(|b| b.value),
        Some(true)
    );
    let common = context.common_tls_context.unwrap();
    assert_eq!(
        common
            .tls_certificate_provider_instance
            .unwrap()
            .instance_name,
        "default"
    );
    let Some(common_tls_context::ValidationContextType::ValidationContext(validation)) =
        common.validation_context_type
    else {
        panic!()
    };
    assert_eq!(
        validation
            .ca_certificate_provider_instance
            .unwrap()
            .instance_name,
        "default"
    );
    #[allow(deprecated)]
    let sans = validation.match_subject_alt_names;
    assert!(sans.is_empty(), "grpc-core NACKs SAN matchers on servers");
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!()
    };
    let manager = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    let names: Vec<&str> = manager
        .http_filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["envoy.filters.http.rbac", "envoy.filters.http.router"]
    );
}
