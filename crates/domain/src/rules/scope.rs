//! Which clients an authentication or authorization policy reaches (behaviour.md "Rules"; the
//! reference's filtering): a stream receives an AuthenticationPolicy only when every one of its
//! selectors matches the connected endpoint, and an AuthorizationPolicy only when every rule's
//! `to` does. A policy outside the root namespace is scoped to its own namespace first.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{
    AuthenticationPolicySpec, AuthorizationPolicySpec, Cidr, PolicyExtend, PolicySelector,
};

/// What authentication established about a connected client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoint {
    /// The identity's name (`<namespace>/<service account>`, or a token's identity).
    pub id: String,
    pub namespace: String,
    /// With or without `spiffe://`; empty when unknown.
    pub spiffe_id: String,
    pub pod_name: String,
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
    /// The pod's IPs, or the peer address when no pod is known.
    pub ips: Vec<IpAddr>,
}

/// The selectors a policy's audience must all match (none: everyone), within `namespace` when
/// the policy is not in the root namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audience {
    /// A policy outside the root namespace reaches only its own namespace, whatever its
    /// selectors say (a selector's `namespaces` is one more condition, not a widening).
    pub namespace: Option<String>,
    pub selectors: Vec<PolicySelector>,
}

impl Audience {
    /// An AuthenticationPolicy's audience: its selectors, each narrowed to the policy's
    /// namespace unless that is the root namespace (a policy without selectors gets one).
    pub fn of_authentication(
        spec: &AuthenticationPolicySpec,
        namespace: &str,
        root_namespace: &str,
    ) -> Audience {
        Audience {
            namespace: scope(namespace, root_namespace),
            selectors: spec.selector.clone(),
        }
    }

    /// An AuthorizationPolicy's audience: every rule's `to` (absent: anyone), each narrowed to
    /// the policy's namespace unless that is the root namespace.
    pub fn of_authorization(
        spec: &AuthorizationPolicySpec,
        namespace: &str,
        root_namespace: &str,
    ) -> Audience {
        let targets: Vec<PolicySelector> = spec
            .rules
            .iter()
            .filter_map(|rule| rule.to.clone())
            .collect();
        Audience {
            namespace: scope(namespace, root_namespace),
            selectors: targets,
        }
    }

    /// Who receives the policy, in words for operators: "clients of namespace demo" (or "of
    /// every namespace"), then what else must match (`selectors` names them: "selector").
    pub fn describe(&self, selectors: &str) -> String {
        let scope = match &self.namespace {
            Some(namespace) => format!("clients of namespace {namespace}"),
            None => "clients of every namespace".to_owned(),
        };
        match self.selectors.len() {
            0 => scope,
            1 => format!("{scope} that its {selectors} matches"),
            n => format!("{scope} that all {n} of its {selectors}s match"),
        }
    }

    pub fn includes(&self, endpoint: &Endpoint) -> bool {
        self.namespace
            .as_ref()
            .is_none_or(|namespace| endpoint.namespace == *namespace)
            && self.selectors.iter().all(|s| selector_matches(s, endpoint))
    }
}

/// The namespace a policy is confined to: its own, unless it is the root namespace.
fn scope(namespace: &str, root_namespace: &str) -> Option<String> {
    (namespace != root_namespace).then(|| namespace.to_owned())
}

/// Every non-empty field matches (empty lists are ignored).
pub fn selector_matches(selector: &PolicySelector, endpoint: &Endpoint) -> bool {
    let in_namespaces = |list: &[String]| list.contains(&endpoint.namespace);
    let in_blocks = |list: &[String]| {
        list.iter().any(|block| {
            // A CIDR that does not parse never matches.
            Cidr::parse(block).is_ok_and(|cidr| endpoint.ips.iter().any(|ip| cidr.contains(*ip)))
        })
    };
    let is_principal = |list: &[String]| {
        let id = strip_spiffe(&endpoint.spiffe_id);
        !id.is_empty() && list.iter().any(|p| strip_spiffe(p) == id)
    };
    let extends = |list: &[PolicyExtend]| list.iter().any(|e| extend_matches(e, endpoint));
    (selector.namespaces.is_empty() || in_namespaces(&selector.namespaces))
        && (selector.not_namespaces.is_empty() || !in_namespaces(&selector.not_namespaces))
        && (selector.ip_blocks.is_empty() || in_blocks(&selector.ip_blocks))
        && (selector.not_ip_blocks.is_empty() || !in_blocks(&selector.not_ip_blocks))
        && (selector.principals.is_empty() || is_principal(&selector.principals))
        && (selector.not_principals.is_empty() || !is_principal(&selector.not_principals))
        && (selector.extends.is_empty() || extends(&selector.extends))
        && (selector.not_extends.is_empty() || !extends(&selector.not_extends))
}

fn strip_spiffe(id: &str) -> &str {
    id.strip_prefix("spiffe://").unwrap_or(id)
}

/// `key` is a dotted path into `{id, ips, spiffeID, kubernetesEnv: {namespace, podName,
/// podLabels, podAnnotations}}`; a list (`ips`) matches when any element equals `value`.
fn extend_matches(extend: &PolicyExtend, endpoint: &Endpoint) -> bool {
    let value = extend.value.as_str();
    let mut parts = extend.key.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("id"), None, None) => endpoint.id == value,
        (Some("ips"), None, None) => endpoint.ips.iter().any(|ip| ip.to_string() == value),
        (Some("spiffeID"), None, None) => {
            !endpoint.spiffe_id.is_empty()
                && strip_spiffe(&endpoint.spiffe_id) == strip_spiffe(value)
        }
        (Some("kubernetesEnv"), Some("namespace"), None) => endpoint.namespace == value,
        (Some("kubernetesEnv"), Some("podName"), None) => endpoint.pod_name == value,
        (Some("kubernetesEnv"), Some("podLabels"), Some(label)) => {
            endpoint.pod_labels.get(label).is_some_and(|v| v == value)
        }
        (Some("kubernetesEnv"), Some("podAnnotations"), Some(annotation)) => endpoint
            .pod_annotations
            .get(annotation)
            .is_some_and(|v| v == value),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            id: "demo/provider".into(),
            namespace: "demo".into(),
            spiffe_id: "spiffe://cluster.local/ns/demo/sa/provider".into(),
            pod_name: "provider-1".into(),
            pod_labels: [("app".to_string(), "provider".to_string())].into(),
            pod_annotations: [("team".to_string(), "blue".to_string())].into(),
            ips: vec!["10.1.2.3".parse().unwrap()],
        }
    }

    fn extend(key: &str, value: &str) -> PolicyExtend {
        PolicyExtend {
            key: key.into(),
            value: value.into(),
        }
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_selector_field_and_its_not_twin() {
        let e = endpoint();
        let cases: Vec<(PolicySelector, bool)> = vec![
            (PolicySelector::default(), true),
            (
                PolicySelector {
                    namespaces: strings(&["demo"]),
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    namespaces: strings(&["other"]),
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    not_namespaces: strings(&["demo"]),
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    not_namespaces: strings(&["other"]),
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    ip_blocks: strings(&["10.1.0.0/16"]),
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    ip_blocks: strings(&["10.2.0.0/16"]),
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    ip_blocks: strings(&["not-a-cidr"]),
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    not_ip_blocks: strings(&["10.1.2.3/32"]),
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    not_ip_blocks: strings(&["not-a-cidr"]),
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    principals: strings(&["cluster.local/ns/demo/sa/provider"]),
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    principals: strings(&["spiffe://cluster.local/ns/demo/sa/provider"]),
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    principals: strings(&["cluster.local/ns/demo/sa/other"]),
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    not_principals: strings(&["cluster.local/ns/demo/sa/provider"]),
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    extends: vec![extend("kubernetesEnv.podLabels.app", "provider")],
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    extends: vec![
                        extend("kubernetesEnv.podLabels.app", "x"),
                        extend("kubernetesEnv.podName", "provider-1"),
                    ],
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    extends: vec![extend("kubernetesEnv.podAnnotations.team", "red")],
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    not_extends: vec![extend("ips", "10.1.2.3")],
                    ..Default::default()
                },
                false,
            ),
            (
                PolicySelector {
                    not_extends: vec![extend("kubernetesEnv.namespace", "other")],
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    extends: vec![extend("id", "demo/provider")],
                    ..Default::default()
                },
                true,
            ),
            (
                PolicySelector {
                    extends: vec![extend("spiffeID", "cluster.local/ns/demo/sa/provider")],
                    ..Default::default()
                },
                true,
            ),
        ];
        for (i, (selector, expected)) in cases.iter().enumerate() {
            assert_eq!(
                selector_matches(selector, &e),
                *expected,
                "case {i}: {selector:?}"
            );
        }
    }

    #[test]
    fn policies_outside_the_root_namespace_stay_in_their_namespace() {
        let spec = AuthenticationPolicySpec {
            action: "STRICT".into(),
            selector: Vec::new(),
            port_level: Vec::new(),
        };
        let e = endpoint();
        assert!(Audience::of_authentication(&spec, "dubbo-system", "dubbo-system").includes(&e));
        assert!(Audience::of_authentication(&spec, "demo", "dubbo-system").includes(&e));
        assert!(!Audience::of_authentication(&spec, "other", "dubbo-system").includes(&e));

        let rule = |to: Option<PolicySelector>| crate::rules::AuthorizationRule {
            from: None,
            to,
            when: None,
        };
        let authz = AuthorizationPolicySpec {
            action: "ALLOW".into(),
            rules: vec![
                rule(None),
                rule(Some(PolicySelector {
                    extends: vec![extend("kubernetesEnv.podLabels.app", "provider")],
                    ..Default::default()
                })),
            ],
            samples: 0.0,
            order: 0.0,
            match_type: String::new(),
        };
        assert!(Audience::of_authorization(&authz, "demo", "dubbo-system").includes(&e));
        assert!(!Audience::of_authorization(&authz, "other", "dubbo-system").includes(&e));
        let mut other_app = e.clone();
        other_app.pod_labels.insert("app".into(), "consumer".into());
        assert!(!Audience::of_authorization(&authz, "demo", "dubbo-system").includes(&other_app));
        let no_rules = AuthorizationPolicySpec {
            rules: Vec::new(),
            ..authz
        };
        assert_eq!(
            Audience::of_authorization(&no_rules, "other", "dubbo-system").namespace,
            Some("other".to_owned())
        );
        // A selector naming another namespace does not widen a policy beyond its own.
        let reaching_out = AuthenticationPolicySpec {
            action: "DISABLED".into(),
            selector: vec![PolicySelector {
                namespaces: vec!["demo".into()],
                ..Default::default()
            }],
            port_level: Vec::new(),
        };
        assert!(!Audience::of_authentication(&reaching_out, "other", "dubbo-system").includes(&e));
        assert!(Audience::of_authentication(&reaching_out, "demo", "dubbo-system").includes(&e));
        assert!(
            Audience::of_authentication(&reaching_out, "dubbo-system", "dubbo-system").includes(&e)
        );
        assert!(!Audience::of_authorization(&no_rules, "other", "dubbo-system").includes(&e));
        assert!(Audience::of_authorization(&no_rules, "dubbo-system", "dubbo-system").includes(&e));
    }
}
