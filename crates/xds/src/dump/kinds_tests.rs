//! Every kind of resource the generator emits renders as a config dump: client listeners,
//! routes, clusters (plain and with auto mTLS), load assignments, and server listeners in every
//! TLS mode with every form of policy. A `typed_config` whose type the dump's descriptors lack
//! fails the rendering, so a new one fails here until `DUMPED_FILES` names its file.

use std::collections::BTreeMap;
use std::sync::Arc;

use dubbo_cp_domain::rules::{
    AuthenticationPolicySpec, AuthorizationPolicySpec, AuthorizationRule, Condition, Match,
    PolicySelector,
};
use dubbo_cp_domain::service::{Service, ServiceEndpoint, ServicePort};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use super::*;
use crate::bootstrap::SERVER_LISTENER_PREFIX;
use crate::clients::{Held, TypeStatus};
use crate::generate::{self, Target};
use crate::inbound;
use crate::security::{Named, Policies, tls};
use crate::{CLUSTER, ENDPOINT, LISTENER, ROUTE};

fn service() -> Service {
    Service {
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
            labels: BTreeMap::new(),
            weight: 100,
            locality: String::new(),
        }],
    }
}

fn authn(action: &str) -> Named<AuthenticationPolicySpec> {
    Named {
        namespace: "shop".into(),
        name: format!("authn-{}", action.to_lowercase()),
        spec: AuthenticationPolicySpec {
            action: action.into(),
            selector: Vec::new(),
            port_level: Vec::new(),
        },
    }
}

fn authz(
    name: &str,
    action: &str,
    rules: Vec<AuthorizationRule>,
) -> Named<AuthorizationPolicySpec> {
    Named {
        namespace: "shop".into(),
        name: name.into(),
        spec: AuthorizationPolicySpec {
            action: action.into(),
            rules,
            samples: 0.0,
            order: 0.0,
            match_type: String::new(),
        },
    }
}

/// A rule of every part: callers by namespace and by address, the called path, a condition.
fn every_part() -> Vec<AuthorizationRule> {
    let exact = |value: &str| Match {
        r#type: "exact".into(),
        value: value.into(),
    };
    vec![
        AuthorizationRule {
            from: Some(PolicySelector {
                namespaces: vec!["a".into()],
                ..Default::default()
            }),
            ..Default::default()
        },
        AuthorizationRule {
            from: Some(PolicySelector {
                ip_blocks: vec!["10.0.0.0/8".into()],
                ..Default::default()
            }),
            when: Some(Condition {
                key: "request.http.path".into(),
                values: vec![exact("/org.example.Greeter/Delete")],
                not_values: vec![exact("/org.example.Greeter/Get")],
            }),
            ..Default::default()
        },
    ]
}

/// Server listeners under each set of policies.
fn server_listeners() -> Vec<(String, Any)> {
    let name = format!("{SERVER_LISTENER_PREFIX}127.0.0.1:50051");
    let listening = inbound::parse(&name).unwrap();
    let sets: Vec<(&str, Policies)> = vec![
        ("none", Policies::default()),
        (
            "strict-allow-deny",
            Policies {
                authentication: vec![authn("STRICT")],
                authorization: vec![
                    authz("allow", "ALLOW", every_part()),
                    authz("deny", "DENY", every_part()),
                ],
                ..Policies::default()
            },
        ),
        (
            "permissive-allow-nobody",
            Policies {
                authentication: vec![authn("PERMISSIVE")],
                authorization: vec![authz("nobody", "ALLOW", Vec::new())],
                ..Policies::default()
            },
        ),
        (
            "disabled-deny",
            Policies {
                authentication: vec![authn("DISABLED")],
                authorization: vec![authz("deny", "DENY", every_part())],
                ..Policies::default()
            },
        ),
    ];
    sets.into_iter()
        .map(|(label, policies)| {
            let server = inbound::server(&[service()], &policies, listening, "shop");
            (
                label.to_owned(),
                pack_any(inbound::listener(&name, &server)),
            )
        })
        .collect()
}

fn rendered(type_url: &'static str, resources: Vec<(String, Any)>) -> serde_json::Value {
    let status = TypeStatus {
        names: resources.len(),
        sent: Some("1".into()),
        held: resources
            .into_iter()
            .map(|(name, any)| (name, Held::sent(Arc::new(any), None, 1)))
            .collect(),
        ..Default::default()
    };
    let client = ClientStatus {
        node_id: "every-kind".into(),
        namespace: "shop".into(),
        types: [(type_url, status)].into(),
        ..Default::default()
    };
    to_json(&client_config(&client)).unwrap_or_else(|e| panic!("{type_url}: {e}"))
}

#[test]
fn every_kind_the_generator_emits_renders() {
    let service = service();
    let target = Target {
        service: &service,
        port: &service.ports[0],
    };
    let mut secured = generate::cluster(target);
    secured.transport_socket = Some(tls::upstream_mtls("cluster.local", "shop"));
    let listeners: Vec<(String, Any)> = std::iter::once((
        "client".to_owned(),
        pack_any(generate::listener("greeter.shop:7070")),
    ))
    .chain(server_listeners())
    .collect();
    let dumps = [
        rendered(LISTENER, listeners),
        rendered(
            ROUTE,
            vec![(
                "route".into(),
                pack_any(generate::route_configuration(
                    "greeter.shop:7070",
                    target,
                    None,
                )),
            )],
        ),
        rendered(
            CLUSTER,
            vec![
                ("plain".into(), pack_any(generate::cluster(target))),
                ("mtls".into(), pack_any(secured)),
            ],
        ),
        rendered(
            ENDPOINT,
            vec![(
                "assignment".into(),
                pack_any(ClusterLoadAssignment::default()),
            )],
        ),
    ];
    let text: String = dumps.iter().map(|d| d.to_string()).collect();
    for expected in [
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "envoy.extensions.filters.http.router.v3.Router",
        "envoy.extensions.filters.http.rbac.v3.RBAC",
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "\"action\":\"DENY\"",
    ] {
        assert!(text.contains(expected), "no {expected} in {text}");
    }
}

/// Anys packed by hand (not through `pack_any`) name their type in a literal: each must be in
/// the dump's descriptors too.
#[test]
fn every_type_named_in_the_sources_is_in_the_descriptors() {
    let pool = pool().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![root];
    let mut named = Vec::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let is_test = path.to_string_lossy().contains("test");
        if path.extension().is_none_or(|e| e != "rs") || is_test {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for part in text.split("\"type.googleapis.com/").skip(1) {
            let name: String = part.chars().take_while(|c| *c != '"').collect();
            named.push((path.display().to_string(), name));
        }
    }
    assert!(
        named.iter().any(|(_, n)| n.ends_with("rbac.v3.RBAC")),
        "{named:?}"
    );
    for (file, name) in named {
        if name.starts_with("envoy.service.") || name.starts_with("envoy.admin.") {
            continue;
        }
        assert!(
            pool.get_message_by_name(&name).is_some(),
            "{file} packs {name}, which the config dump cannot render: add its file to DUMPED_FILES"
        );
    }
}
