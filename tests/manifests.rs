//! The shipped manifests (`kubectl apply -k deploy/`) keep the outbox, registrations acknowledged
//! but not yet written to the API server, where it outlives the pod: on a persistent volume claim
//! mounted exactly at `--data-dir`. An `emptyDir` there loses acknowledged registrations whenever
//! a pod is deleted during an API-server outage (rollout, eviction, node drain).
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PodSpec, Service};
use serde::Deserialize;
use serde_json::Value;

/// Every document of every file the kustomization lists, in order, with its file name.
fn load_kustomization(dir: &Path) -> Vec<(String, Value)> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("cannot read deploy/{name}: {e}"))
    };
    let kustomization: Value = serde_yaml::from_str(&read("kustomization.yaml"))
        .unwrap_or_else(|e| panic!("deploy/kustomization.yaml: {e}"));
    let resources = kustomization["resources"]
        .as_array()
        .expect("deploy/kustomization.yaml lists no resources");
    let mut docs = Vec::new();
    for resource in resources {
        let name = resource.as_str().unwrap_or_default();
        docs.extend(
            documents(&read(name))
                .into_iter()
                .map(|d| (name.to_owned(), d)),
        );
    }
    docs
}

/// The documents of a multi-document YAML text; empty ones are skipped.
fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("bad YAML: {e}")))
        .filter(|doc| !doc.is_null())
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// The first place where `typed` (the manifest read as the Kubernetes type and written back)
/// differs from `raw`: a field the type does not know (a typo, or a field at the wrong level)
/// that Kubernetes would drop or refuse.
fn first_unknown_field(raw: &Value, typed: &Value, path: &str) -> Option<String> {
    match (raw, typed) {
        (Value::Object(raw), Value::Object(typed)) => raw.iter().find_map(|(key, value)| {
            let path = format!("{path}.{key}");
            match typed.get(key) {
                // An explicit null is what the API server stores for an unset field.
                None if value.is_null() => None,
                None => Some(path),
                Some(typed) => first_unknown_field(value, typed, &path),
            }
        }),
        (Value::Array(raw), Value::Array(typed)) => raw
            .iter()
            .zip(typed)
            .enumerate()
            .find_map(|(i, (raw, typed))| first_unknown_field(raw, typed, &format!("{path}[{i}]"))),
        (raw, typed) if raw == typed => None,
        _ => Some(path.to_owned()),
    }
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    doc: &Value,
    problems: &mut Vec<String>,
) -> Option<T> {
    let parsed: T = match serde_json::from_value(doc.clone()) {
        Ok(parsed) => parsed,
        Err(err) => {
            problems.push(format!("the {} does not parse: {err}", kind(doc)));
            return None;
        }
    };
    let written = serde_json::to_value(&parsed).unwrap_or_default();
    if let Some(field) = first_unknown_field(doc, &written, "") {
        problems.push(format!(
            "the {} has a field Kubernetes does not know: {field}",
            kind(doc)
        ));
    }
    Some(parsed)
}

/// The value of `--data-dir` (`--data-dir=X` or `--data-dir X`) or `DUBBO_CP_DATA_DIR`.
fn data_dir(pod: &PodSpec) -> Option<String> {
    let container = dubbo_cp_container(pod)?;
    let args = container.args.clone().unwrap_or_default();
    let from_args = args.iter().enumerate().find_map(|(i, arg)| {
        arg.strip_prefix("--data-dir=")
            .map(str::to_owned)
            .or_else(|| (arg == "--data-dir").then(|| args.get(i + 1).cloned().unwrap_or_default()))
    });
    from_args.or_else(|| {
        container
            .env
            .iter()
            .flatten()
            .find(|var| var.name == "DUBBO_CP_DATA_DIR")
            .and_then(|var| var.value.clone())
    })
}

fn dubbo_cp_container(pod: &PodSpec) -> Option<&k8s_openapi::api::core::v1::Container> {
    pod.containers
        .iter()
        .find(|c| c.args.iter().flatten().any(|arg| arg == "serve"))
}

fn normalized(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

/// What the check found, for the log.
#[derive(Debug, Default)]
struct Found {
    workload: String,
    data_dir: String,
    volume: String,
}

/// Checks that the workload running `dubbo-cp serve` keeps its data directory on a persistent
/// volume claim mounted exactly at `--data-dir`. Returns every problem found.
fn check(docs: &[Value]) -> Result<Found, Vec<String>> {
    let mut problems = Vec::new();
    let runs_dubbo_cp = |doc: &&Value| {
        let template = match kind(doc) {
            "Pod" => &doc["spec"],
            _ => &doc["spec"]["template"]["spec"],
        };
        template["containers"].as_array().is_some_and(|containers| {
            containers.iter().any(|c| {
                c["args"]
                    .as_array()
                    .is_some_and(|args| args.iter().any(|a| a == "serve"))
            })
        })
    };
    let workloads: Vec<&Value> = docs.iter().filter(runs_dubbo_cp).collect();
    let [workload] = workloads.as_slice() else {
        return Err(vec![format!(
            "expected one workload running `dubbo-cp serve`, found {}",
            workloads.len()
        )]);
    };
    let name = workload["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let namespace = workload["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    // Volumes that belong to one pod and outlive it: the StatefulSet's claim templates.
    let (pod, claim_templates, replicas) = match kind(workload) {
        "StatefulSet" => {
            let Some(set) = typed::<StatefulSet>(workload, &mut problems) else {
                return Err(problems);
            };
            let spec = set.spec;
            let headless = spec.service_name.as_deref().is_some_and(|service| {
                docs.iter()
                    .filter(|doc| kind(doc) == "Service")
                    .filter_map(|doc| serde_json::from_value::<Service>(doc.clone()).ok())
                    .any(|s| {
                        s.metadata.name.as_deref() == Some(service)
                            && s.metadata.namespace.as_deref().unwrap_or_default() == namespace
                            && s.spec.and_then(|spec| spec.cluster_ip).as_deref() == Some("None")
                    })
            });
            if !headless {
                problems.push(format!(
                    "serviceName {:?} does not name a headless Service (clusterIP: None) in {namespace}",
                    spec.service_name
                ));
            }
            if spec.pod_management_policy.as_deref() != Some("Parallel") {
                problems.push(format!(
                    "podManagementPolicy is {:?}: replicas are independent, start them in parallel \
                     so one waiting for the API server does not hold back the others",
                    spec.pod_management_policy
                ));
            }
            let claims: Vec<String> = spec
                .volume_claim_templates
                .iter()
                .flatten()
                .filter_map(|claim| claim.metadata.name.clone())
                .collect();
            (
                spec.template.spec.unwrap_or_default(),
                claims,
                spec.replicas.unwrap_or(1),
            )
        }
        "Deployment" => {
            let Some(deployment) = typed::<Deployment>(workload, &mut problems) else {
                return Err(problems);
            };
            let spec = deployment.spec;
            (
                spec.template.spec.unwrap_or_default(),
                Vec::new(),
                spec.replicas.unwrap_or(1),
            )
        }
        other => {
            return Err(vec![format!(
                "dubbo-cp runs as a {other}; expected a StatefulSet (or a one-replica Deployment \
                 with a persistent volume claim)"
            )]);
        }
    };

    let Some(data_dir) = data_dir(&pod) else {
        problems.push(
            "no --data-dir: the outbox would be ./data in the container's working directory".into(),
        );
        return Err(problems);
    };
    let mounts = dubbo_cp_container(&pod)
        .and_then(|c| c.volume_mounts.clone())
        .unwrap_or_default();
    let Some(mount) = mounts
        .iter()
        .find(|m| normalized(&m.mount_path) == normalized(&data_dir))
    else {
        let paths: Vec<&str> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
        problems.push(format!(
            "no volume is mounted at --data-dir {data_dir} (mounts: {paths:?}): the outbox would \
             be written into the container's file system"
        ));
        return Err(problems);
    };
    let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name);
    let mut on_claim = false;
    match volume {
        // A pod volume of that name shadows a claim template of the same name.
        Some(volume) if volume.empty_dir.is_some() => problems.push(format!(
            "the data dir {data_dir} is on the emptyDir {:?}, deleted with its pod: acknowledged \
             registrations not yet written are lost on a rollout or eviction during an API outage",
            volume.name
        )),
        Some(volume) if volume.persistent_volume_claim.is_some() => {
            on_claim = true;
            if replicas > 1 {
                problems.push(format!(
                    "one claim ({:?}) for {replicas} replicas: each replica needs its own data \
                     dir (a process locks it); use a StatefulSet's volumeClaimTemplates",
                    volume.name
                ));
            }
        }
        Some(volume) => problems.push(format!(
            "the data dir {data_dir} is on volume {:?}, which is not a persistent volume claim",
            volume.name
        )),
        None if claim_templates.contains(&mount.name) => on_claim = true,
        None => problems.push(format!(
            "the data dir {data_dir} is mounted from {:?}, which no volume or claim template defines",
            mount.name
        )),
    }

    // A claim's volume is usually root-owned: a non-root container needs fsGroup to write it.
    let container_context = dubbo_cp_container(&pod).and_then(|c| c.security_context.clone());
    let pod_context = pod.security_context.clone().unwrap_or_default();
    let non_root = container_context
        .as_ref()
        .and_then(|c| c.run_as_user)
        .or(pod_context.run_as_user)
        .is_some_and(|uid| uid != 0)
        || container_context
            .as_ref()
            .and_then(|c| c.run_as_non_root)
            .or(pod_context.run_as_non_root)
            == Some(true);
    if on_claim && non_root && pod_context.fs_group.is_none() {
        problems.push(
            "the container runs as non-root but the pod sets no fsGroup: it cannot write the \
             claim's (root-owned) volume"
                .into(),
        );
    }

    if problems.is_empty() {
        Ok(Found {
            workload: format!("{}/{name}", kind(workload)),
            data_dir,
            volume: mount.name.clone(),
        })
    } else {
        Err(problems)
    }
}

fn shipped() -> Vec<(String, Value)> {
    load_kustomization(&Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy"))
}

#[test]
fn the_shipped_workload_keeps_the_outbox_on_a_claim_mounted_at_the_data_dir() {
    let docs: Vec<Value> = shipped().into_iter().map(|(_, doc)| doc).collect();
    match check(&docs) {
        Ok(found) => println!(
            "{} keeps --data-dir {} on the claim template {:?}",
            found.workload, found.data_dir, found.volume
        ),
        Err(problems) => panic!("deploy/: {problems:#?}"),
    }
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let listed: std::collections::BTreeSet<String> =
        shipped().into_iter().map(|(file, _)| file).collect();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        // The kustomization itself, and the example configuration file (not a manifest).
        .filter(|name| name != "kustomization.yaml" && name != "dubbo-cp.yaml")
        .collect();
    files.sort();
    let unlisted: Vec<&String> = files.iter().filter(|f| !listed.contains(*f)).collect();
    assert!(
        unlisted.is_empty(),
        "deploy/ files kustomization.yaml does not apply: {unlisted:?}"
    );
}

/// The shipped workload with `edit` applied to it (and the rest unchanged).
fn shipped_with(edit: impl FnOnce(&mut Value)) -> Vec<Value> {
    let mut docs: Vec<Value> = shipped().into_iter().map(|(_, doc)| doc).collect();
    let workload = docs
        .iter_mut()
        .find(|doc| kind(doc) == "StatefulSet")
        .expect("no StatefulSet in deploy/");
    edit(workload);
    docs
}

fn problems_of(docs: &[Value]) -> String {
    match check(docs) {
        Ok(found) => panic!("the check passed a broken manifest: {found:?}"),
        Err(problems) => problems.join("\n"),
    }
}

/// The manifest this replaced: a Deployment with the outbox on an emptyDir.
const EMPTY_DIR_DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: dubbo-cp, namespace: dubbo-system}
spec:
  replicas: 2
  selector: {matchLabels: {app: dubbo-cp}}
  template:
    metadata: {labels: {app: dubbo-cp}}
    spec:
      containers:
        - name: dubbo-cp
          image: dubbo-cp:latest
          args: [serve, --mode=kubernetes, --data-dir=/var/lib/dubbo-cp]
          volumeMounts: [{name: outbox, mountPath: /var/lib/dubbo-cp}]
      volumes:
        - name: outbox
          emptyDir: {}
"#;

#[test]
fn the_check_refuses_an_outbox_on_an_empty_dir() {
    let problems = problems_of(&documents(EMPTY_DIR_DEPLOYMENT));
    assert!(problems.contains("emptyDir"), "{problems}");

    // The same in the StatefulSet: a pod volume named like the claim template shadows it.
    let docs = shipped_with(|set| {
        set["spec"]["template"]["spec"]["volumes"] =
            serde_json::json!([{"name": "outbox", "emptyDir": {}}]);
    });
    assert!(problems_of(&docs).contains("emptyDir"));
}

#[test]
fn the_check_refuses_a_mount_elsewhere_than_the_data_dir() {
    let docs = shipped_with(|set| {
        set["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] =
            "/var/lib/outbox".into();
    });
    let problems = problems_of(&docs);
    assert!(
        problems.contains("no volume is mounted at --data-dir /var/lib/dubbo-cp"),
        "{problems}"
    );

    let docs = shipped_with(|set| {
        let args = &mut set["spec"]["template"]["spec"]["containers"][0]["args"];
        let Some(args) = args.as_array_mut() else {
            panic!("no args")
        };
        for arg in args.iter_mut() {
            if arg.as_str().is_some_and(|a| a.starts_with("--data-dir")) {
                *arg = "--data-dir=/data".into();
            }
        }
    });
    assert!(problems_of(&docs).contains("--data-dir /data"));
}

#[test]
fn the_check_refuses_unknown_fields_a_missing_headless_service_and_a_missing_fs_group() {
    let docs = shipped_with(|set| {
        // A typo Kubernetes would drop: the claim templates would silently disappear.
        let claims = set["spec"]["volumeClaimTemplates"].take();
        set["spec"]["volumeClaimTemplate"] = claims;
    });
    let problems = problems_of(&docs);
    assert!(
        problems.contains(".spec.volumeClaimTemplate") && problems.contains("no volume or claim"),
        "{problems}"
    );

    let docs: Vec<Value> = shipped_with(|_| {})
        .into_iter()
        .filter(|doc| kind(doc) != "Service")
        .collect();
    assert!(problems_of(&docs).contains("headless Service"));

    let docs = shipped_with(|set| {
        set["spec"]["template"]["spec"]["securityContext"]
            .as_object_mut()
            .map(|context| context.remove("fsGroup"));
    });
    assert!(problems_of(&docs).contains("fsGroup"));
}

/// Every permission the shipped RBAC grants, as `scope group/resource[names] verb`.
fn granted(docs: &[Value]) -> std::collections::BTreeSet<String> {
    let mut granted = std::collections::BTreeSet::new();
    for doc in docs {
        let scope = match kind(doc) {
            "ClusterRole" => "cluster".to_owned(),
            "Role" => doc["metadata"]["namespace"].as_str().unwrap().to_owned(),
            _ => continue,
        };
        for rule in doc["rules"].as_array().unwrap() {
            let list = |field: &str| -> Vec<String> {
                rule[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect()
            };
            let names = list("resourceNames").join(",");
            let targets: Vec<String> = if rule["nonResourceURLs"].is_array() {
                list("nonResourceURLs")
            } else {
                list("apiGroups")
                    .iter()
                    .flat_map(|group| {
                        let names = names.clone();
                        list("resources")
                            .into_iter()
                            .map(move |r| format!("{group}/{r}[{names}]"))
                    })
                    .collect()
            };
            for target in targets {
                for verb in list("verbs") {
                    granted.insert(format!("{scope} {target} {verb}"));
                }
            }
        }
    }
    granted
}

#[test]
fn the_rbac_grants_exactly_what_the_control_plane_uses() {
    let docs: Vec<Value> = shipped().into_iter().map(|(_, doc)| doc).collect();
    let mut expected = std::collections::BTreeSet::new();
    let mut grant = |scope: &str, target: &str, verbs: &[&str]| {
        for verb in verbs {
            expected.insert(format!("{scope} {target} {verb}"));
        }
    };
    let read = ["get", "list", "watch"];
    let write = ["get", "list", "watch", "create", "update"];
    grant("cluster", "dubbo.apache.org/servicenamemappings[]", &write);
    // The expiry deletes a mapping whose last application expired.
    grant(
        "cluster",
        "dubbo.apache.org/servicenamemappings[]",
        &["delete"],
    );
    for rule in [
        "tagroutes",
        "conditionroutes",
        "authenticationpolicies",
        "authorizationpolicies",
        // Services and endpoints for xDS, read like the rules.
        "serviceentries",
    ] {
        grant("cluster", &format!("dubbo.apache.org/{rule}[]"), &read);
    }
    // The canary controller: its weights as DynamicConfigs and A/B routes as ConditionRoutes,
    // the Canaries, the Deployments, revisions, Events and its Lease.
    for kind in ["dynamicconfigs", "conditionroutes"] {
        grant("cluster", &format!("dubbo.apache.org/{kind}[]"), &write);
        grant(
            "cluster",
            &format!("dubbo.apache.org/{kind}[]"),
            &["delete"],
        );
    }
    grant(
        "cluster",
        "dubbo.apache.org/canaries[]",
        &["get", "list", "watch", "update", "patch"],
    );
    grant("cluster", "dubbo.apache.org/metrictemplates[]", &read);
    grant("cluster", "dubbo.apache.org/alertproviders[]", &read);
    grant(
        "cluster",
        "dubbo.apache.org/canaries/status[]",
        &["get", "update", "patch"],
    );
    grant("cluster", "apps/deployments[]", &write);
    grant("cluster", "apps/deployments[]", &["patch"]);
    grant("cluster", "apps/controllerrevisions[]", &read);
    grant(
        "cluster",
        "apps/controllerrevisions[]",
        &["create", "delete"],
    );
    grant("cluster", "events.k8s.io/events[]", &["create", "patch"]);
    // A Canary's Services, the apex's EndpointSlice and the primary's HPA.
    grant("cluster", "/services[]", &["create", "update"]);
    grant(
        "cluster",
        "discovery.k8s.io/endpointslices[]",
        &["create", "update", "delete"],
    );
    grant(
        "cluster",
        "autoscaling/horizontalpodautoscalers[]",
        &["get", "create", "update"],
    );
    grant("cluster", "/configmaps[]", &write);
    grant("cluster", "/secrets[]", &write);
    grant("dubbo-system", "coordination.k8s.io/leases[]", &["create"]);
    grant(
        "dubbo-system",
        "coordination.k8s.io/leases[dubbo-cp-canary]",
        &["get", "update"],
    );
    grant(
        "cluster",
        "authentication.k8s.io/tokenreviews[]",
        &["create"],
    );
    grant("cluster", "/pods[]", &read);
    grant("cluster", "/.well-known/openid-configuration", &["get"]);
    grant("cluster", "/openid/v1/jwks", &["get"]);
    // The CA: namespaces watched, ConfigMap dubbo-ca-cert written everywhere, one Secret.
    grant("cluster", "/namespaces[]", &read);
    grant("cluster", "/configmaps[]", &["create"]);
    grant(
        "cluster",
        "/configmaps[dubbo-ca-cert]",
        &["get", "list", "watch", "update"],
    );
    // The webhook: registry Services read, its configuration object kept.
    grant("cluster", "/services[]", &read);
    // xDS: the endpoints of Services.
    grant("cluster", "discovery.k8s.io/endpointslices[]", &read);
    grant(
        "cluster",
        "admissionregistration.k8s.io/mutatingwebhookconfigurations[]",
        &["create"],
    );
    grant(
        "cluster",
        "admissionregistration.k8s.io/mutatingwebhookconfigurations[dubbo-cp]",
        &["get", "list", "watch", "update"],
    );
    grant("dubbo-system", "/secrets[]", &["create"]);
    grant(
        "dubbo-system",
        "/secrets[dubbo-ca-secret]",
        &["get", "list", "watch", "update"],
    );
    assert_eq!(granted(&docs), expected);
    let bound: Vec<(&str, &str)> = docs
        .iter()
        .filter(|doc| matches!(kind(doc), "ClusterRoleBinding" | "RoleBinding"))
        .map(|doc| {
            (
                doc["roleRef"]["name"].as_str().unwrap(),
                doc["subjects"][0]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        bound,
        [("dubbo-cp", "dubbo-cp"), ("dubbo-cp-ca", "dubbo-cp")]
    );
}
