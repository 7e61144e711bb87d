//! What the webhook injects into a pod, exactly as the reference control plane (wire.md §7),
//! on the pod as JSON so fields this version of the Kubernetes types does not know survive.
//! Injection is idempotent: a pod that already has what would be injected is left as it is.
//! The agent (`dubbo-agent.inject`, [`crate::agent`]) brings the CA and xDS injections with it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::agent::AGENT_LABEL;
use crate::pod::{containers, named, push};

/// Pod or namespace label asking for the CA settings.
pub const CA_LABEL: &str = "dubbo-ca.inject";
/// Registry labels, in priority order, and the scheme each gives.
pub const REGISTRY_LABELS: [(&str, Registry); 3] = [
    ("registry-zookeeper-inject", Registry::Zookeeper),
    ("registry-nacos-inject", Registry::Nacos),
    ("registry-k8s-inject", Registry::Kubernetes),
];
pub const REGISTRY_ENV: &str = "DUBBO_REGISTRY_ADDRESS";
const TOKEN_VOLUME: &str = "dubbo-ca-token";
const CERT_VOLUME: &str = "dubbo-ca-cert";
const CA_ENV: [&str; 4] = [
    "DUBBO_CA_ADDRESS",
    "DUBBO_CA_CERT_PATH",
    "DUBBO_OIDC_TOKEN",
    "DUBBO_OIDC_TOKEN_TYPE",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    Zookeeper,
    Nacos,
    Kubernetes,
}

impl Registry {
    pub fn name(self) -> &'static str {
        match self {
            Registry::Zookeeper => "zookeeper",
            Registry::Nacos => "nacos",
            Registry::Kubernetes => "kubernetes",
        }
    }
}

/// What the pod's namespace and cluster say, as the watches saw them.
pub struct Context<'a> {
    /// The pod's namespace (the review's, since a new pod may not name it).
    pub namespace: &'a str,
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// `<service>.<namespace>.svc:<TLS port>` of this control plane.
    pub ca_address: &'a str,
    /// The first Service (by name) in the pod's namespace with `label: "true"`.
    pub service_with_label: &'a dyn Fn(&str) -> Option<String>,
    /// The image of the agent sidecar (`webhook.agentImage`).
    pub agent_image: &'a str,
}

/// What was injected, for the log line and the metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Injected {
    pub ca: bool,
    /// The xDS bootstrap (`dubbo-xds.inject`, or with the agent).
    pub xds: bool,
    /// The agent sidecar (`dubbo-agent.inject`).
    pub agent: bool,
    /// The registry asked for and the address injected (`None`: no Service found for it).
    pub registry: Option<(Registry, Option<String>)>,
}

fn label_is_true(labels: Option<&Value>, key: &str) -> bool {
    labels.and_then(|l| l.get(key)).and_then(Value::as_str) == Some("true")
}

/// Injects into `pod` what its labels and its namespace's ask for.
pub fn inject(pod: &mut Value, context: &Context<'_>) -> Injected {
    let mut injected = Injected::default();
    if !pod.is_object() {
        return injected;
    }
    let pod_labels = pod.pointer("/metadata/labels").cloned();
    let namespace_labels = serde_json::to_value(context.namespace_labels).ok();
    let wants = |key: &str| {
        label_is_true(pod_labels.as_ref(), key) || label_is_true(namespace_labels.as_ref(), key)
    };
    // The agent brings the CA injection (its token and CA bundle) and the xDS bootstrap (naming
    // the agent's certificates), each as its own label would.
    // Not on the node's network: its ports (the xDS proxy on loopback) would be the node's, shared
    // with every such pod there and reachable by any process on it.
    let host_network = pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true);
    let agent = wants(AGENT_LABEL) && !host_network;
    if (wants(CA_LABEL) || agent) && !has_ca(pod) {
        add_ca(pod, context.ca_address);
        injected.ca = true;
    }
    // After the CA injection, whose CA bundle it then shares.
    if (wants(crate::xds::XDS_LABEL) || agent) && !crate::xds::has_xds(pod) {
        crate::xds::add_xds(pod, context.ca_address, context.namespace, agent);
        injected.xds = true;
    }
    if agent && !crate::agent::has_agent(pod) {
        // The agent asks the CA for certificates as the CA injection lets any container do; the
        // volumes are there unless the pod's own CA settings kept that injection out.
        let mut sidecar = crate::agent::sidecar(context.agent_image, pod, context.ca_address);
        add_ca_env(&mut sidecar, context.ca_address);
        add_ca_volumes(pod);
        crate::agent::add_agent(pod, sidecar);
        injected.agent = true;
    }
    // The pod's own registry label wins over its namespace's; within each, the priority order.
    let chosen = REGISTRY_LABELS
        .iter()
        .find(|(label, _)| label_is_true(pod_labels.as_ref(), label))
        .or_else(|| {
            REGISTRY_LABELS
                .iter()
                .find(|(label, _)| label_is_true(namespace_labels.as_ref(), label))
        });
    if let Some((label, registry)) = chosen {
        let address = match registry {
            Registry::Kubernetes => Some("kubernetes://DEFAULT_MASTER_HOST".to_owned()),
            Registry::Zookeeper | Registry::Nacos => {
                (context.service_with_label)(label).map(|service| {
                    format!("{}://{service}.{}.svc", registry.name(), context.namespace)
                })
            }
        };
        if let Some(address) = &address {
            set_registry(pod, address);
        }
        injected.registry = Some((*registry, address));
    }
    injected
}

/// Whether anything the CA injection would add is already there (then the pod is left whole).
fn has_ca(pod: &Value) -> bool {
    let volumes = pod.pointer("/spec/volumes");
    if named(volumes, TOKEN_VOLUME) || named(volumes, CERT_VOLUME) {
        return true;
    }
    containers(pod).any(|container| {
        CA_ENV.iter().any(|env| named(container.get("env"), env))
            || named(container.get("volumeMounts"), TOKEN_VOLUME)
            || named(container.get("volumeMounts"), CERT_VOLUME)
    })
}

fn add_ca(pod: &mut Value, ca_address: &str) {
    add_ca_volumes(pod);
    // `get_mut`, not indexing: indexing would add `containers: null` to a pod without them.
    let Some(containers) = pod
        .pointer_mut("/spec/containers")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for container in containers.iter_mut().filter(|c| c.is_object()) {
        add_ca_env(container, ca_address);
    }
}

/// The CA injection's volumes (the token for the CA's audience and the CA bundle), each unless
/// the pod has it.
fn add_ca_volumes(pod: &mut Value) {
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    let spec = &mut pod["spec"];
    if !named(spec.get("volumes"), TOKEN_VOLUME) {
        push(
            spec,
            "volumes",
            json!({"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {
                "audience": "dubbo-ca", "expirationSeconds": 1800, "path": "token"}}]}}),
        );
    }
    if !named(spec.get("volumes"), CERT_VOLUME) {
        push(
            spec,
            "volumes",
            json!({"name": CERT_VOLUME, "projected": {"sources": [{"configMap": {
                "name": "dubbo-ca-cert", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}),
        );
    }
}

/// The CA injection's variables and read-only mounts of its volumes, in one container.
fn add_ca_env(container: &mut Value, ca_address: &str) {
    for (name, value) in [
        (CA_ENV[0], ca_address),
        (CA_ENV[1], "/var/run/secrets/dubbo-ca-cert/ca.crt"),
        (CA_ENV[2], "/var/run/secrets/dubbo-ca-token/token"),
        (CA_ENV[3], "dubbo-ca-token"),
    ] {
        push(container, "env", json!({"name": name, "value": value}));
    }
    push(
        container,
        "volumeMounts",
        json!({"name": TOKEN_VOLUME, "mountPath": "/var/run/secrets/dubbo-ca-token", "readOnly": true}),
    );
    push(
        container,
        "volumeMounts",
        json!({"name": CERT_VOLUME, "mountPath": "/var/run/secrets/dubbo-ca-cert", "readOnly": true}),
    );
}

/// Sets the registry address in every container, except where the user set a non-empty one.
fn set_registry(pod: &mut Value, address: &str) {
    let Some(containers) = pod
        .pointer_mut("/spec/containers")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for container in containers.iter_mut().filter(|c| c.is_object()) {
        let existing = container["env"]
            .as_array_mut()
            .and_then(|env| env.iter_mut().find(|var| var["name"] == REGISTRY_ENV));
        match existing {
            Some(var) if var["value"].as_str().is_some_and(|v| !v.is_empty()) => {}
            // Also a value taken from elsewhere (valueFrom) is the user's.
            Some(var) if var.get("valueFrom").is_some() => {}
            Some(var) => var["value"] = json!(address),
            None => push(
                container,
                "env",
                json!({"name": REGISTRY_ENV, "value": address}),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const CA_ADDRESS: &str = "dubbo-cp.dubbo-system.svc:30062";

    fn pod(labels: Value, containers: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "labels": labels},
               "spec": {"containers": containers}})
    }

    fn container(name: &str) -> Value {
        json!({"name": name, "image": "app"})
    }

    fn run(
        pod: &mut Value,
        namespace_labels: &[(&str, &str)],
        services: &[(&str, &str)],
    ) -> Injected {
        let labels: BTreeMap<String, String> = namespace_labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let services: Vec<(String, String)> = services
            .iter()
            .map(|(l, s)| (l.to_string(), s.to_string()))
            .collect();
        let lookup = move |label: &str| {
            services
                .iter()
                .filter(|(l, _)| l == label)
                .map(|(_, s)| s.clone())
                .min()
        };
        inject(
            pod,
            &Context {
                namespace: "demo",
                namespace_labels: &labels,
                ca_address: CA_ADDRESS,
                service_with_label: &lookup,
                agent_image: "dubbo-cp:test",
            },
        )
    }

    fn expected_ca_env() -> Value {
        json!([
            {"name": "DUBBO_CA_ADDRESS", "value": CA_ADDRESS},
            {"name": "DUBBO_CA_CERT_PATH", "value": "/var/run/secrets/dubbo-ca-cert/ca.crt"},
            {"name": "DUBBO_OIDC_TOKEN", "value": "/var/run/secrets/dubbo-ca-token/token"},
            {"name": "DUBBO_OIDC_TOKEN_TYPE", "value": "dubbo-ca-token"},
        ])
    }

    fn expected_mounts() -> Value {
        json!([
            {"name": "dubbo-ca-token", "mountPath": "/var/run/secrets/dubbo-ca-token", "readOnly": true},
            {"name": "dubbo-ca-cert", "mountPath": "/var/run/secrets/dubbo-ca-cert", "readOnly": true},
        ])
    }

    fn expected_volumes() -> Value {
        json!([
            {"name": "dubbo-ca-token", "projected": {"sources": [{"serviceAccountToken":
                {"audience": "dubbo-ca", "expirationSeconds": 1800, "path": "token"}}]}},
            {"name": "dubbo-ca-cert", "projected": {"sources": [{"configMap":
                {"name": "dubbo-ca-cert", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
        ])
    }

    #[test]
    fn ca_by_pod_label_and_by_namespace_label_one_and_two_containers() {
        for (pod_labels, ns_labels) in [
            (json!({"dubbo-ca.inject": "true"}), vec![]),
            (json!({}), vec![("dubbo-ca.inject", "true")]),
        ] {
            for count in [1, 2] {
                let containers: Vec<Value> =
                    (0..count).map(|i| container(&format!("c{i}"))).collect();
                let mut p = pod(pod_labels.clone(), json!(containers));
                let injected = run(&mut p, &ns_labels, &[]);
                assert!(injected.ca);
                assert_eq!(p["spec"]["volumes"], expected_volumes());
                for i in 0..count {
                    let c = &p["spec"]["containers"][i];
                    assert_eq!(c["env"], expected_ca_env(), "env in order");
                    assert_eq!(c["volumeMounts"], expected_mounts());
                }
            }
        }
    }

    #[test]
    fn ca_is_appended_after_what_is_there_and_not_to_init_containers() {
        let mut p = json!({"metadata": {"labels": {"dubbo-ca.inject": "true"}}, "spec": {
            "volumes": [{"name": "data", "emptyDir": {}}],
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "c", "env": [{"name": "A", "value": "1"}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}});
        run(&mut p, &[], &[]);
        assert_eq!(p["spec"]["volumes"][0]["name"], "data");
        assert_eq!(p["spec"]["volumes"][1]["name"], "dubbo-ca-token");
        assert_eq!(p["spec"]["containers"][0]["env"][0]["name"], "A");
        assert_eq!(
            p["spec"]["containers"][0]["env"][1]["name"],
            "DUBBO_CA_ADDRESS"
        );
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][1]["name"],
            "dubbo-ca-token"
        );
        assert!(p["spec"]["initContainers"][0].get("env").is_none());
    }

    #[test]
    fn ca_skip_conditions_leave_the_pod_whole() {
        let labels = json!({"dubbo-ca.inject": "true"});
        let mut cases = vec![
            json!({"metadata": {"labels": labels}, "spec": {"volumes": [{"name": "dubbo-ca-token"}], "containers": [container("a")]}}),
            json!({"metadata": {"labels": labels}, "spec": {"volumes": [{"name": "dubbo-ca-cert"}], "containers": [container("a")]}}),
        ];
        for env in CA_ENV {
            // Only the second container has it.
            cases.push(pod(
                labels.clone(),
                json!([container("a"), {"name": "b", "env": [{"name": env, "value": "x"}]}]),
            ));
        }
        for mount in ["dubbo-ca-token", "dubbo-ca-cert"] {
            cases.push(pod(
                labels.clone(),
                json!([container("a"), {"name": "b", "volumeMounts": [{"name": mount, "mountPath": "/x"}]}]),
            ));
        }
        for case in cases {
            let mut p = case.clone();
            let injected = run(&mut p, &[], &[]);
            assert!(!injected.ca, "{case}");
            assert_eq!(p, case, "left whole");
        }
    }

    #[test]
    fn labels_other_than_true_and_no_labels_change_nothing() {
        for labels in [
            json!({}),
            json!({"dubbo-ca.inject": "false"}),
            json!({"registry-k8s-inject": "yes"}),
        ] {
            let original = pod(labels, json!([container("a")]));
            let mut p = original.clone();
            assert_eq!(run(&mut p, &[], &[]), Injected::default());
            assert_eq!(p, original);
        }
    }

    #[test]
    fn registries_by_pod_label_and_by_namespace_label() {
        let services = [
            ("registry-zookeeper-inject", "zk-b"),
            ("registry-zookeeper-inject", "zk-a"),
            ("registry-nacos-inject", "nacos"),
        ];
        for (label, address) in [
            ("registry-zookeeper-inject", "zookeeper://zk-a.demo.svc"),
            ("registry-nacos-inject", "nacos://nacos.demo.svc"),
            ("registry-k8s-inject", "kubernetes://DEFAULT_MASTER_HOST"),
        ] {
            let mut by_pod = pod(
                json!({label: "true"}),
                json!([container("a"), container("b")]),
            );
            run(&mut by_pod, &[], &services);
            let mut by_namespace = pod(json!({}), json!([container("a"), container("b")]));
            run(&mut by_namespace, &[(label, "true")], &services);
            for p in [by_pod, by_namespace] {
                for i in 0..2 {
                    assert_eq!(
                        p["spec"]["containers"][i]["env"],
                        json!([{"name": "DUBBO_REGISTRY_ADDRESS", "value": address}]),
                        "{label}"
                    );
                }
            }
        }
    }

    #[test]
    fn registry_priority_and_the_pods_label_wins() {
        let services = [
            ("registry-zookeeper-inject", "zk"),
            ("registry-nacos-inject", "nacos"),
        ];
        let address = |p: &Value| p["spec"]["containers"][0]["env"][0]["value"].clone();
        let mut all = pod(
            json!({"registry-k8s-inject": "true", "registry-nacos-inject": "true", "registry-zookeeper-inject": "true"}),
            json!([container("a")]),
        );
        run(&mut all, &[], &services);
        assert_eq!(address(&all), "zookeeper://zk.demo.svc");
        let mut pod_wins = pod(
            json!({"registry-k8s-inject": "true"}),
            json!([container("a")]),
        );
        run(
            &mut pod_wins,
            &[("registry-zookeeper-inject", "true")],
            &services,
        );
        assert_eq!(address(&pod_wins), "kubernetes://DEFAULT_MASTER_HOST");
    }

    #[test]
    fn a_users_registry_address_wins_and_a_missing_service_injects_nothing() {
        let mut p = pod(
            json!({"registry-k8s-inject": "true"}),
            json!([
                {"name": "mine", "env": [{"name": "DUBBO_REGISTRY_ADDRESS", "value": "zookeeper://mine:2181"}]},
                {"name": "empty", "env": [{"name": "DUBBO_REGISTRY_ADDRESS", "value": ""}]},
                container("none"),
            ]),
        );
        run(&mut p, &[], &[]);
        let value = |i: usize| p["spec"]["containers"][i]["env"][0]["value"].clone();
        assert_eq!(value(0), "zookeeper://mine:2181");
        assert_eq!(value(1), "kubernetes://DEFAULT_MASTER_HOST");
        assert_eq!(value(2), "kubernetes://DEFAULT_MASTER_HOST");
        let original = pod(
            json!({"registry-nacos-inject": "true"}),
            json!([container("a")]),
        );
        let mut p = original.clone();
        let injected = run(&mut p, &[], &[]);
        assert_eq!(injected.registry, Some((Registry::Nacos, None)));
        assert_eq!(
            p, original,
            "no nacos Service in the namespace: nothing to inject"
        );
    }

    #[test]
    fn injection_is_idempotent() {
        let mut p = pod(
            json!({"dubbo-ca.inject": "true", "registry-k8s-inject": "true"}),
            json!([container("a")]),
        );
        run(&mut p, &[], &[]);
        let once = p.clone();
        let again = run(&mut p, &[], &[]);
        assert!(!again.ca);
        assert_eq!(p, once);
    }

    fn names(list: &Value) -> Vec<&str> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|item| item["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn the_agent_brings_the_ca_and_a_bootstrap_naming_its_certificates() {
        for (pod_labels, ns_labels) in [
            (
                json!({"app": "greeter", "dubbo-agent.inject": "true"}),
                vec![],
            ),
            (
                json!({"app": "greeter"}),
                vec![("dubbo-agent.inject", "true")],
            ),
        ] {
            let mut p = pod(pod_labels, json!([container("a"), container("b")]));
            let injected = run(&mut p, &ns_labels, &[]);
            assert_eq!(
                injected,
                Injected {
                    ca: true,
                    xds: true,
                    agent: true,
                    registry: None
                }
            );
            let spec = &p["spec"];
            assert_eq!(
                names(&spec["volumes"]),
                ["dubbo-ca-token", "dubbo-ca-cert", "dubbo-cp-certs"]
            );
            assert_eq!(
                spec["volumes"][2],
                json!({"name": "dubbo-cp-certs", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
            );
            // The sidecar: the agent with the CA injection's variables and mounts.
            let mut expected = crate::agent::sidecar("dubbo-cp:test", &json!({}), CA_ADDRESS);
            add_ca_env(&mut expected, CA_ADDRESS);
            assert_eq!(spec["initContainers"], json!([expected]));
            assert_eq!(spec["initContainers"][0]["env"], expected_ca_env());
            assert_eq!(
                names(&spec["initContainers"][0]["volumeMounts"]),
                ["dubbo-cp-certs", "dubbo-ca-token", "dubbo-ca-cert"]
            );
            for i in 0..2 {
                let c = &spec["containers"][i];
                assert_eq!(
                    names(&c["env"]),
                    [
                        "DUBBO_CA_ADDRESS",
                        "DUBBO_CA_CERT_PATH",
                        "DUBBO_OIDC_TOKEN",
                        "DUBBO_OIDC_TOKEN_TYPE",
                        "DUBBO_POD_NAME",
                        "GRPC_XDS_BOOTSTRAP_CONFIG",
                    ]
                );
                assert_eq!(
                    c["volumeMounts"][2],
                    json!({"name": "dubbo-cp-certs", "mountPath": "/var/run/dubbo-cp/certs", "readOnly": true})
                );
                let bootstrap: Value =
                    serde_json::from_str(c["env"][5]["value"].as_str().unwrap()).unwrap();
                assert_eq!(
                    bootstrap["certificate_providers"]["default"]["config"]["certificate_file"],
                    "/var/run/dubbo-cp/certs/cert-chain.pem"
                );
                assert_eq!(bootstrap["node"]["cluster"], "greeter");
                // The agent's proxy is the xDS server: plaintext on loopback, no token.
                assert_eq!(
                    bootstrap["xds_servers"][0],
                    json!({"server_uri": "127.0.0.1:15010",
                           "channel_creds": [{"type": "insecure"}],
                           "server_features": ["xds_v3"]})
                );
            }
            // Again: nothing more.
            let once = p.clone();
            assert_eq!(run(&mut p, &ns_labels, &[]), Injected::default());
            assert_eq!(p, once);
        }
    }

    #[test]
    fn a_pod_on_the_nodes_network_gets_no_agent() {
        let mut p = pod(
            json!({"dubbo-agent.inject": "true", "dubbo-xds.inject": "true"}),
            json!([container("a")]),
        );
        p["spec"]["hostNetwork"] = json!(true);
        let injected = run(&mut p, &[], &[]);
        assert!(!injected.agent && injected.xds, "{injected:?}");
        assert!(p["spec"].get("initContainers").is_none());
    }

    #[test]
    fn without_the_agent_label_no_agent_and_the_xds_bootstrap_names_no_certificates() {
        let mut p = pod(
            json!({"dubbo-ca.inject": "true", "dubbo-xds.inject": "true"}),
            json!([container("a")]),
        );
        let injected = run(&mut p, &[("dubbo-agent.inject", "false")], &[]);
        assert!(injected.ca && injected.xds && !injected.agent);
        assert!(p["spec"].get("initContainers").is_none());
        assert!(!names(&p["spec"]["volumes"]).contains(&"dubbo-cp-certs"));
        let bootstrap = p["spec"]["containers"][0]["env"][5]["value"]
            .as_str()
            .unwrap();
        assert!(!bootstrap.contains("certificate_providers"), "{bootstrap}");
    }

    #[test]
    fn a_pod_with_its_own_agent_keeps_it_and_its_own_ca_settings_still_get_the_volumes() {
        // Its own agent: that part is left whole (CA and bootstrap still come).
        let own = pod(
            json!({"dubbo-agent.inject": "true"}),
            json!([container("a"), {"name": "dubbo-cp-agent", "image": "mine"}]),
        );
        let mut p = own.clone();
        let injected = run(&mut p, &[], &[]);
        assert!(!injected.agent);
        assert!(p["spec"].get("initContainers").is_none());
        assert_eq!(p["spec"]["containers"][1]["image"], "mine");
        // Its own CA variable keeps the CA injection out; the agent still gets both volumes.
        let mut p = pod(
            json!({"dubbo-agent.inject": "true"}),
            json!([{"name": "a", "env": [{"name": "DUBBO_CA_ADDRESS", "value": "mine:1"}]}]),
        );
        let injected = run(&mut p, &[], &[]);
        assert!(!injected.ca && injected.agent);
        let volumes = names(&p["spec"]["volumes"]);
        assert!(
            volumes.contains(&"dubbo-ca-token") && volumes.contains(&"dubbo-ca-cert"),
            "{volumes:?}"
        );
        assert_eq!(
            names(&p["spec"]["containers"][0]["env"])[0],
            "DUBBO_CA_ADDRESS"
        );
        assert_eq!(p["spec"]["containers"][0]["env"][0]["value"], "mine:1");
        assert_eq!(
            p["spec"]["initContainers"][0]["env"][0]["value"],
            CA_ADDRESS
        );
    }

    #[test]
    fn odd_pods_never_panic() {
        for mut odd in [
            json!(null),
            json!([]),
            json!({"spec": null, "metadata": {"labels": {"dubbo-ca.inject": "true"}}}),
            json!({"spec": {"containers": "x"}, "metadata": {"labels": {"dubbo-ca.inject": "true", "registry-k8s-inject": "true"}}}),
            json!({"spec": {"containers": [1, null, {"env": 3}]}, "metadata": {"labels": {"dubbo-ca.inject": "true", "registry-k8s-inject": "true"}}}),
            json!({"spec": null, "metadata": {"labels": {"dubbo-agent.inject": "true"}}}),
            json!({"spec": {"containers": [1, {"volumeMounts": 2}], "initContainers": "x", "volumes": {}}, "metadata": {"labels": {"dubbo-agent.inject": "true"}}}),
        ] {
            run(&mut odd, &[], &[]);
        }
    }
}
