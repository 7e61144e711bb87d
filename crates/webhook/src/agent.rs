//! The agent injection: a pod (or namespace) labelled `dubbo-agent.inject: "true"` gets
//! `dubbo-cp agent` as a native sidecar (an init container with `restartPolicy: Always`,
//! Kubernetes 1.29+, or 1.28 with the `SidecarContainers` feature gate), which asks the CA for
//! the pod's workload certificate and keeps it renewed in an in-memory volume every app container
//! mounts read-only. The CA and xDS injections come with it (`inject`): the agent authenticates
//! with the CA injection's token and CA bundle, and the bootstrap names the certificate directory
//! as gRPC's `file_watcher` provider, so one label gives a pod mTLS-capable gRPC.
//!
//! The kubelet starts app containers only once a native sidecar's startup probe has passed, and
//! the agent's `/healthz` answers 200 only once valid files are on disk: an app never starts
//! without its certificate.

use serde_json::{Value, json};

use crate::pod::{containers, named, push};

/// Pod or namespace label asking for the agent.
pub const AGENT_LABEL: &str = "dubbo-agent.inject";
/// The sidecar's name (in `initContainers`).
pub const AGENT_CONTAINER: &str = "dubbo-cp-agent";
/// The in-memory volume the agent writes the certificate to.
pub const CERTS_VOLUME: &str = "dubbo-cp-certs";
/// Where it is mounted, in the agent and (read-only) in every app container.
pub const CERT_DIR: &str = "/var/run/dubbo-cp/certs";
/// The agent's `/metrics` and `/healthz` port (istio-agent's).
pub const AGENT_PORT: u16 = 15020;
/// The agent's xDS proxy, the pod's xDS server: plaintext on loopback, forwarded to the control
/// plane's TLS port with the pod's certificate, so every gRPC library can use it (grpc-js-xds
/// reads only `insecure` credentials for its xDS server) and none needs call credentials.
pub const AGENT_XDS: &str = "127.0.0.1:15010";
/// How long the startup probe gives the agent to get the first certificate: once a second for
/// five minutes (the agent keeps retrying the CA itself; a restart would not make it faster).
const STARTUP_CHECKS: u32 = 300;

/// Whether the pod already has the agent or its volume (then that part is left whole).
pub fn has_agent(pod: &Value) -> bool {
    let spec = pod.get("spec");
    let in_spec = |key: &str| spec.and_then(|s| s.get(key));
    named(in_spec("initContainers"), AGENT_CONTAINER)
        || named(in_spec("containers"), AGENT_CONTAINER)
        || named(in_spec("volumes"), CERTS_VOLUME)
}

/// The control plane's own user and group (deploy/), for the agent of a pod that names none.
const DEFAULT_USER: i64 = 65532;

/// The user and group the agent runs as: the app's, so the app can read the key the agent writes
/// (owner-only): the first app container's `runAsUser`, else the pod's; the control plane's when
/// the pod names none or root.
fn user_of(pod: &Value) -> (i64, Option<i64>) {
    let first = containers(pod).find(|c| c.is_object());
    let setting = |key: &str| {
        first
            .and_then(|c| c.pointer(&format!("/securityContext/{key}")))
            .and_then(Value::as_i64)
            .or_else(|| {
                pod.pointer(&format!("/spec/securityContext/{key}"))
                    .and_then(Value::as_i64)
            })
    };
    match setting("runAsUser") {
        Some(user) if user > 0 => (user, setting("runAsGroup")),
        _ => (DEFAULT_USER, Some(DEFAULT_USER)),
    }
}

/// The sidecar running `image` for `pod`, proxying xDS to the control plane's TLS port at
/// `control_plane`, before the CA injection's variables and mounts are added.
pub fn sidecar(image: &str, pod: &Value, control_plane: &str) -> Value {
    let (user, group) = user_of(pod);
    let mut security = json!({
        "runAsNonRoot": true,
        "runAsUser": user,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    if let Some(group) = group {
        security["runAsGroup"] = json!(group);
    }
    let health = json!({"path": "/healthz", "port": AGENT_PORT});
    json!({
        "name": AGENT_CONTAINER,
        "image": image,
        "args": [
            "agent", "--out", CERT_DIR, "--metrics-address", format!("0.0.0.0:{AGENT_PORT}"),
            "--xds-proxy", AGENT_XDS, "--xds-address", control_plane,
        ],
        // A native sidecar: started before the app containers, running beside them, stopped
        // after them (so Jobs still complete).
        "restartPolicy": "Always",
        "ports": [{"name": "agent-metrics", "containerPort": AGENT_PORT}],
        // App containers start only once this passed: once the certificate is on disk.
        "startupProbe": {"httpGet": health, "periodSeconds": 1, "failureThreshold": STARTUP_CHECKS},
        // Not ready once the certificate has expired unrenewed.
        "readinessProbe": {"httpGet": health, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        // What the `restricted` Pod Security Standard asks.
        "securityContext": security,
        "volumeMounts": [{"name": CERTS_VOLUME, "mountPath": CERT_DIR}],
    })
}

/// Adds `sidecar` after the pod's init containers, the certificate volume, and its read-only
/// mount in every app container.
pub fn add_agent(pod: &mut Value, sidecar: Value) {
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    let spec = &mut pod["spec"];
    push(
        spec,
        "volumes",
        json!({"name": CERTS_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}),
    );
    push(spec, "initContainers", sidecar);
    let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) else {
        return;
    };
    for container in containers.iter_mut().filter(|c| c.is_object()) {
        push(
            container,
            "volumeMounts",
            json!({"name": CERTS_VOLUME, "mountPath": CERT_DIR, "readOnly": true}),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_sidecar_is_native_probed_small_and_unprivileged() {
        let agent = sidecar(
            "registry.example/dubbo-cp:1.2",
            &json!({}),
            "dubbo-cp.dubbo-system.svc:30062",
        );
        assert_eq!(agent["name"], AGENT_CONTAINER);
        assert_eq!(agent["image"], "registry.example/dubbo-cp:1.2");
        assert_eq!(agent["restartPolicy"], "Always");
        assert_eq!(
            agent["args"],
            json!([
                "agent",
                "--out",
                "/var/run/dubbo-cp/certs",
                "--metrics-address",
                "0.0.0.0:15020",
                "--xds-proxy",
                "127.0.0.1:15010",
                "--xds-address",
                "dubbo-cp.dubbo-system.svc:30062"
            ])
        );
        for probe in ["startupProbe", "readinessProbe"] {
            assert_eq!(
                agent[probe]["httpGet"],
                json!({"path": "/healthz", "port": 15020}),
                "{probe}"
            );
        }
        assert_eq!(agent["startupProbe"]["periodSeconds"], 1);
        assert_eq!(agent["startupProbe"]["failureThreshold"], 300);
        assert_eq!(agent["resources"]["requests"]["cpu"], "10m");
        let security = &agent["securityContext"];
        assert_eq!(security["runAsNonRoot"], true);
        assert_eq!(
            (&security["runAsUser"], &security["runAsGroup"]),
            (&json!(65532), &json!(65532))
        );
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
        // Read-write: it writes the files there.
        assert_eq!(
            agent["volumeMounts"],
            json!([{"name": "dubbo-cp-certs", "mountPath": "/var/run/dubbo-cp/certs"}])
        );
        // Takes the typed container whole (no field misspelt).
        let typed: k8s_openapi::api::core::v1::Container =
            serde_json::from_value(agent.clone()).unwrap();
        assert_eq!(typed.restart_policy.as_deref(), Some("Always"));
        assert!(typed.startup_probe.is_some() && typed.readiness_probe.is_some());
        assert_eq!(serde_json::to_value(&typed).unwrap(), agent);
    }

    #[test]
    fn the_agent_runs_as_the_app_so_the_app_can_read_the_key() {
        let user = |pod: Value| {
            let security = sidecar("img", &pod, "cp:30062")["securityContext"].clone();
            (
                security["runAsUser"].clone(),
                security.get("runAsGroup").cloned(),
            )
        };
        let app = |security: Value| json!({"name": "a", "securityContext": security});
        for (pod, expected) in [
            // The pod's user, then the first app container's own.
            (
                json!({"spec": {"securityContext": {"runAsUser": 1000}, "containers": [app(json!({}))]}}),
                (json!(1000), None),
            ),
            (
                json!({"spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 3000},
                              "containers": [app(json!({"runAsUser": 2000}))]}}),
                (json!(2000), Some(json!(3000))),
            ),
            // Root or unsaid: the control plane's user.
            (
                json!({"spec": {"containers": [app(json!({"runAsUser": 0}))]}}),
                (json!(65532), Some(json!(65532))),
            ),
            (
                json!({"spec": {"containers": [app(json!({"runAsUser": "x"}))]}}),
                (json!(65532), Some(json!(65532))),
            ),
        ] {
            assert_eq!(user(pod.clone()), expected, "{pod}");
        }
    }

    #[test]
    fn the_sidecar_goes_after_the_init_containers_and_apps_mount_the_volume_read_only() {
        let mut pod = json!({"spec": {
            "volumes": [{"name": "data", "emptyDir": {}}],
            "initContainers": [{"name": "migrate"}],
            "containers": [{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        }});
        assert!(!has_agent(&pod));
        let agent = sidecar("img", &pod, "cp:30062");
        add_agent(&mut pod, agent);
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "data", "emptyDir": {}},
                   {"name": "dubbo-cp-certs", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}])
        );
        let init: Vec<&str> = pod["spec"]["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(init, ["migrate", AGENT_CONTAINER]);
        let read_only = json!({"name": "dubbo-cp-certs", "mountPath": "/var/run/dubbo-cp/certs", "readOnly": true});
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"],
            json!([read_only])
        );
        assert_eq!(pod["spec"]["containers"][1]["volumeMounts"][1], read_only);
        assert!(
            pod["spec"]["initContainers"][0]
                .get("volumeMounts")
                .is_none()
        );
        assert!(has_agent(&pod));
        assert_eq!(pod["spec"]["initContainers"][1]["image"], "img");
        // The pod's own agent (a container of that name, or the volume) counts too.
        for own in [
            json!({"spec": {"containers": [{"name": AGENT_CONTAINER}]}}),
            json!({"spec": {"volumes": [{"name": CERTS_VOLUME}], "containers": []}}),
        ] {
            assert!(has_agent(&own), "{own}");
        }
    }
}
