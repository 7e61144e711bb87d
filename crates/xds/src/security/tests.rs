#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use dubbo_cp_domain::rules::{PolicyExtend, PolicySelector, PortLevel};
use dubbo_cp_domain::service::{ServiceEndpoint, ServicePort};

use super::*;

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

fn decided(policies: &Policies, workload: &Endpoint, port: u16) -> (Mode, Option<String>) {
    let decision = policies.mode(workload, port);
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
    // A port-level entry overrides on its port only, NONE included.
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
    assert!(!policies.upstream_mtls(&service, "grpc", 7070));
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
    assert!(policies.upstream_mtls(&service, "grpc", 7070));
    policies.authentication[0].spec.port_level[0].port = 7070;
    assert!(!policies.upstream_mtls(&service, "grpc", 7070));
}
