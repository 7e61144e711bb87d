//! xDS injection: a pod (or namespace) labelled `dubbo-xds.inject: "true"` gets a gRPC xDS
//! bootstrap in `GRPC_XDS_BOOTSTRAP_CONFIG`, so its released gRPC clients resolve `xds:///`
//! names through this control plane with no code change.
//!
//! The bootstrap reaches the TLS port (verified with the CA bundle the CA publishes in every
//! namespace) with the pod's service-account token as call credentials: a projected token for
//! the API server's audience, which the xDS port authenticates with a TokenReview like every
//! gRPC port. The node is the pod (`$(DUBBO_POD_NAME).<namespace>`, expanded by the kubelet),
//! in the pod's namespace, of the application its labels name. With the agent
//! (`dubbo-agent.inject`) the bootstrap reaches the agent's xDS proxy instead (plaintext on
//! loopback; the agent forwards with the pod's certificate, so no token is needed and grpc-js
//! can use it too) and names the directory the agent keeps the workload certificate in, as
//! gRPC's `file_watcher` certificate provider (mTLS between workloads).

use dubbo_cp_xds::bootstrap::{Bootstrap, CALL_CREDS_ENV, Credentials};
use serde_json::{Value, json};

use crate::pod::{containers, named, push};

/// Pod or namespace label asking for the xDS bootstrap.
pub const XDS_LABEL: &str = "dubbo-xds.inject";
pub const BOOTSTRAP_ENV: &str = "GRPC_XDS_BOOTSTRAP_CONFIG";
const POD_NAME_ENV: &str = "DUBBO_POD_NAME";
const TOKEN_VOLUME: &str = "dubbo-xds-token";
const TOKEN_DIR: &str = "/var/run/secrets/dubbo-xds-token";
const CERT_VOLUME: &str = "dubbo-ca-cert";
const CERT_DIR: &str = "/var/run/secrets/dubbo-ca-cert";

/// Whether the pod already has a bootstrap or the token volume (then it is left whole).
pub fn has_xds(pod: &Value) -> bool {
    named(pod.pointer("/spec/volumes"), TOKEN_VOLUME)
        || containers(pod).any(|container| {
            let env = container.get("env");
            named(env, BOOTSTRAP_ENV) || named(env, "GRPC_XDS_BOOTSTRAP")
        })
}

/// The bootstrap a pod in `namespace` of `application` gets, reaching `server` (the TLS port);
/// with the `agent`, its xDS proxy is the server and its certificate directory the provider.
pub fn bootstrap(
    server: &str,
    namespace: &str,
    application: Option<&str>,
    agent: bool,
) -> Bootstrap {
    let (server, credentials, token_file) = match agent {
        true => (crate::agent::AGENT_XDS, Credentials::Insecure, None),
        false => (
            server,
            Credentials::Tls {
                ca_file: format!("{CERT_DIR}/ca.crt"),
                certificate: None,
            },
            Some(format!("{TOKEN_DIR}/token")),
        ),
    };
    Bootstrap {
        server: server.to_owned(),
        credentials,
        token_file,
        node_id: format!("$({POD_NAME_ENV}).{namespace}"),
        namespace: namespace.to_owned(),
        application: application.map(str::to_owned),
        // Not known at admission (the pod is not scheduled yet).
        locality: String::new(),
        certificates: agent.then(|| crate::agent::CERT_DIR.to_owned()),
    }
}

/// Adds the bootstrap, the pod-name variable it names, the token volume and the CA bundle
/// (unless the CA injection added it) to every container; `agent` as in [`bootstrap`] (then no
/// token: the agent authenticates).
pub fn add_xds(pod: &mut Value, server: &str, namespace: &str, agent: bool) {
    let labels = pod.pointer("/metadata/labels");
    let application = labels
        .and_then(|l| {
            l.get(dubbo_cp_domain::service::APPLICATION_LABEL)
                .or(l.get("app"))
        })
        .and_then(Value::as_str)
        .map(str::to_owned);
    let bootstrap = bootstrap(server, namespace, application.as_deref(), agent)
        .to_json()
        .to_string();
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    let spec = &mut pod["spec"];
    let token = !agent;
    if token {
        push(
            spec,
            "volumes",
            json!({"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {
                "expirationSeconds": 3600, "path": "token"}}]}}),
        );
    }
    let has_bundle = named(spec.get("volumes"), CERT_VOLUME);
    if !has_bundle {
        push(
            spec,
            "volumes",
            json!({"name": CERT_VOLUME, "projected": {"sources": [{"configMap": {
                "name": "dubbo-ca-cert", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}),
        );
    }
    let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) else {
        return;
    };
    for container in containers.iter_mut().filter(|c| c.is_object()) {
        // Defined before the bootstrap: the kubelet expands `$(DUBBO_POD_NAME)` in it.
        push(
            container,
            "env",
            json!({"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
        );
        push(
            container,
            "env",
            json!({"name": BOOTSTRAP_ENV, "value": bootstrap}),
        );
        if token {
            push(
                container,
                "env",
                json!({"name": CALL_CREDS_ENV, "value": "true"}),
            );
            push(
                container,
                "volumeMounts",
                json!({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": true}),
            );
        }
        if !named(container.get("volumeMounts"), CERT_VOLUME) {
            push(
                container,
                "volumeMounts",
                json!({"name": CERT_VOLUME, "mountPath": CERT_DIR, "readOnly": true}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_gets_a_bootstrap_its_token_and_the_ca_bundle_once() {
        let mut pod = json!({
            "metadata": {"name": "greeter-0", "labels": {"app": "greeter"}},
            "spec": {"containers": [{"name": "c"}]},
        });
        add_xds(&mut pod, "dubbo-cp.dubbo-system.svc:30062", "shop", false);
        let container = &pod["spec"]["containers"][0];
        let env = container["env"].as_array().unwrap();
        let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, [POD_NAME_ENV, BOOTSTRAP_ENV, CALL_CREDS_ENV]);
        let bootstrap: Value = serde_json::from_str(env[1]["value"].as_str().unwrap()).unwrap();
        assert_eq!(bootstrap["node"]["id"], "$(DUBBO_POD_NAME).shop");
        assert_eq!(bootstrap["node"]["metadata"]["NAMESPACE"], "shop");
        assert_eq!(bootstrap["node"]["cluster"], "greeter");
        assert!(bootstrap.get("certificate_providers").is_none(), "no agent");
        let server = &bootstrap["xds_servers"][0];
        assert_eq!(server["server_uri"], "dubbo-cp.dubbo-system.svc:30062");
        assert_eq!(
            server["channel_creds"][0]["config"]["ca_certificate_file"],
            "/var/run/secrets/dubbo-ca-cert/ca.crt"
        );
        assert_eq!(
            server["call_creds"][0]["config"]["jwt_token_file"],
            "/var/run/secrets/dubbo-xds-token/token"
        );
        let volumes: Vec<&str> = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(volumes, [TOKEN_VOLUME, CERT_VOLUME]);
        // The token is for the API server's audience: no audience named.
        assert!(
            pod["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]
                .get("audience")
                .is_none()
        );
        assert!(has_xds(&pod));
        // With the CA injection's bundle already there, it is not added twice.
        let mut with_ca = json!({"spec": {
            "volumes": [{"name": CERT_VOLUME}],
            "containers": [{"name": "c", "volumeMounts": [{"name": CERT_VOLUME, "mountPath": CERT_DIR}]}],
        }});
        add_xds(&mut with_ca, "s:1", "shop", false);
        assert_eq!(with_ca["spec"]["volumes"].as_array().unwrap().len(), 2);
        assert_eq!(
            with_ca["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
}
