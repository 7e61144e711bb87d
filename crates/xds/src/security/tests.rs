#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use dubbo_cp_domain::rules::{PolicyExtend, PolicySelector, PortLevel};
use dubbo_cp_domain::service::{ServiceEndpoint, ServicePort};

use super::*;
use dubbo_cp_domain::rules::AuthorizationPolicySpec;

fn authn(
    namespace: &str,
    name: &str,
    action: &str,
    selector: Vec<PolicySelector>,
) -> Named<AuthenticationPolicySpec> {
    Named {
        namespace: namespace.into(),
        name: name.into(),
        spec: AuthenticationPolicySpec {
            action: action.into(),
            selector,
            port_level: Vec::new(),
        },
    }
}

fn labelled(label: &str, value: &str) -> Vec<PolicySelector> {
    vec![PolicySelector {
        extends: vec![PolicyExtend {
            key: format!("kubernetesEnv.podLabels.{label}"),
            value: value.into(),
        }],
        ..Default::default()
    }]
}

fn workload(namespace: &str, app: &str) -> Endpoint {
    Endpoint {
        namespace: namespace.into(),
        ips: vec!["10.0.0.1".parse().unwrap()],
        pod_labels: BTreeMap::from([("app".to_owned(), app.to_owned())]),
        ..Endpoint::default()
    }
}

fn decided(policies: &Policies, endpoint: &Endpoint, port: u16) -> (Mode, Option<String>) {
    let workload = Workload {
        endpoint: endpoint.clone(),
        found: true,
    };
    let (decision, unknown) = policies.mode(&workload, port);
    assert!(unknown.is_empty(), "{unknown:?}");
    (decision.mode, decision.policy)
}

#[test]
fn the_most_specific_policy_decides_and_none_inherits() {
    let mut policies = Policies {
        authentication: vec![
            authn("dubbo-system", "mesh", "STRICT", Vec::new()),
            authn("shop", "namespace", "DISABLED", Vec::new()),
            authn("shop", "greeter", "NONE", labelled("app", "greeter")),
            authn("shop", "billing", "PERMISSIVE", labelled("app", "billing")),
        ],
        ..Policies::default()
    };
    // No policy of its own namespace: the root namespace's.
    assert_eq!(
        decided(&policies, &workload("bank", "x"), 50051),
        (Mode::Strict, Some("dubbo-system/mesh".into()))
    );
    // The namespace's over the root's.
    assert_eq!(
        decided(&policies, &workload("shop", "x"), 50051),
        (Mode::Disabled, Some("shop/namespace".into()))
    );
    // A selecting policy over both; NONE has no opinion, so the next decides.
    assert_eq!(
        decided(&policies, &workload("shop", "billing"), 50051),
        (Mode::Permissive, Some("shop/billing".into()))
    );
    assert_eq!(
        decided(&policies, &workload("shop", "greeter"), 50051),
        (Mode::Disabled, Some("shop/namespace".into()))
    );
    // A port-level entry overrides on its port only.
    policies.authentication[2].spec.port_level = vec![PortLevel {
        port: 50052,
        action: "STRICT".into(),
    }];
    assert_eq!(
        decided(&policies, &workload("shop", "greeter"), 50052),
        (Mode::Strict, Some("shop/greeter".into()))
    );
    assert_eq!(
        decided(&policies, &workload("shop", "greeter"), 50051).0,
        Mode::Disabled
    );
    // A port-level NONE inherits its own policy's action, not the next policy's.
    policies.authentication[3].spec.port_level = vec![PortLevel {
        port: 8080,
        action: "NONE".into(),
    }];
    policies.authentication[3].spec.action = "STRICT".into();
    assert_eq!(
        decided(&policies, &workload("shop", "billing"), 8080),
        (Mode::Strict, Some("shop/billing".into()))
    );
    // No policy at all: plaintext, as Istio's proxyless default.
    assert_eq!(
        decided(&Policies::default(), &workload("shop", "x"), 1),
        (Mode::Permissive, None)
    );
}

#[test]
fn callers_of_a_strict_endpoint_use_mtls() {
    let service = Service {
        namespace: "shop".into(),
        name: "greeter".into(),
        labels: BTreeMap::new(),
        ports: vec![ServicePort {
            number: 7070,
            name: "grpc".into(),
            protocol: "GRPC".into(),
        }],
        endpoints: ["10.0.0.1", "10.0.0.2"]
            .iter()
            .map(|ip| ServiceEndpoint {
                address: ip.parse().unwrap(),
                ports: BTreeMap::from([("grpc".to_owned(), 50051)]),
                labels: BTreeMap::from([("app".to_owned(), format!("greeter-{ip}"))]),
                weight: 100,
                locality: String::new(),
            })
            .collect(),
    };
    let mut policies = Policies::default();
    assert!(!policies.upstream_mtls(&service, &service.endpoints, &service.ports[0]));
    let port = service.ports[0].clone();
    // One endpoint STRICT on its own port (50051, not the service port): TLS for the cluster.
    policies.authentication = vec![Named {
        spec: AuthenticationPolicySpec {
            action: "DISABLED".into(),
            selector: labelled("app", "greeter-10.0.0.2"),
            port_level: vec![PortLevel {
                port: 50051,
                action: "STRICT".into(),
            }],
        },
        ..authn("shop", "one", "", Vec::new())
    }];
    assert!(policies.upstream_mtls(&service, &service.endpoints, &port));
    // A subset without that endpoint stays plaintext.
    assert!(!policies.upstream_mtls(&service, &service.endpoints[..1], &port));
    policies.authentication[0].spec.port_level[0].port = 7070;
    assert!(!policies.upstream_mtls(&service, &service.endpoints, &port));
}

#[test]
fn selectors_on_the_root_and_a_namespace_rank_by_place_not_by_name() {
    let policies = Policies {
        authentication: vec![
            // "apps" sorts before "dubbo-system", "zoo" after: neither must matter.
            authn("dubbo-system", "mesh-app", "DISABLED", labelled("app", "x")),
            authn("zoo", "own", "STRICT", labelled("app", "x")),
        ],
        ..Policies::default()
    };
    assert_eq!(
        decided(&policies, &workload("zoo", "x"), 1),
        (Mode::Strict, Some("zoo/own".into()))
    );
}

#[test]
fn a_policy_selecting_by_what_a_server_cannot_show_applies_and_says_so() {
    use dubbo_cp_domain::rules::{AuthorizationRule, PolicySelector};
    let by_principal = AuthorizationPolicySpec {
        action: "ALLOW".into(),
        rules: vec![AuthorizationRule {
            to: Some(PolicySelector {
                principals: vec!["cluster.local/ns/shop/sa/greeter".into()],
                ..Default::default()
            }),
            ..Default::default()
        }],
        samples: 0.0,
        order: 0.0,
        match_type: String::new(),
    };
    let by_label = AuthorizationPolicySpec {
        rules: vec![AuthorizationRule {
            to: Some(labelled("app", "greeter").remove(0)),
            ..Default::default()
        }],
        ..by_principal.clone()
    };
    let policies = Policies {
        authorization: vec![
            Named {
                namespace: "shop".into(),
                name: "by-principal".into(),
                spec: by_principal,
            },
            Named {
                namespace: "shop".into(),
                name: "by-label".into(),
                spec: by_label,
            },
        ],
        ..Policies::default()
    };
    // Found behind its address: labels are known, the identity is not.
    let found = Workload {
        endpoint: workload("shop", "billing"),
        found: true,
    };
    let (applying, unknown) = policies.authorizing(&found);
    let names: Vec<&str> = applying.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["by-principal"],
        "billing's labels are known not to match"
    );
    assert_eq!(unknown.len(), 1);
    assert!(unknown[0].1.contains("to.principals"), "{unknown:?}");
    // Not found (e.g. 0.0.0.0): its labels are not known either, and both apply.
    let unknown_workload = Workload {
        endpoint: Endpoint {
            namespace: "shop".into(),
            ..Endpoint::default()
        },
        found: false,
    };
    let (applying, unknown) = policies.authorizing(&unknown_workload);
    assert_eq!(applying.len(), 2);
    assert_eq!(unknown.len(), 2, "{unknown:?}");
    // Another namespace's server: neither.
    let elsewhere = Workload {
        endpoint: workload("bank", "greeter"),
        found: true,
    };
    assert!(policies.authorizing(&elsewhere).0.is_empty());
}
