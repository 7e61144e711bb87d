//! A Canary through a promotion and another through a rollback, an A/B run and a Blue/Green run,
//! on the real API server (its CRD schemas and CEL judge the Canaries and the rules the
//! controller writes). There is no controller-manager or kubelet: a task here plays the
//! Deployment controller (status with the observed generation and ready replicas) and the
//! kubelet (one Running, Ready pod per replica of the current template, with a loopback IP).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::common::kube_local::{Cluster, free_port};

const NS: &str = "e2e-canary";
const WAIT: Duration = Duration::from_secs(90);
/// Marks the pods this task made, by Deployment.
const OWNER: &str = "e2e.dubbo.apache.org/deployment";

pub async fn admin_client(cluster: &Cluster) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// One pass of the Deployment controller and the kubelet over the Deployments of `namespace`;
/// a new pod's IP is `ip(deployment, replica)`. `graceful`: as a rolling update with a kubelet
/// does, new pods come up before old ones go, and a pod deleted stays 5 s terminating
/// (bound to a node, so the API server keeps it until then) before it is removed.
pub async fn reconcile(
    client: &Client,
    namespace: &str,
    ip: &(dyn Fn(&str, i32) -> String + Sync),
    graceful: bool,
) -> kube::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for deployment in deployments.list(&ListParams::default()).await? {
        let name = deployment.metadata.name.clone().unwrap_or_default();
        let generation = deployment.metadata.generation.unwrap_or(1);
        let spec = deployment.spec.clone();
        let replicas = spec.replicas.unwrap_or(1);
        let template = serde_json::to_value(&spec.template).unwrap();
        let hash = format!("{:x}", fnv(&template.to_string()));
        let labels = template["metadata"]["labels"].clone();
        // The kubelet: exactly `replicas` ready pods of the current template.
        let owned = pods
            .list(&ListParams::default().labels(&format!("{OWNER}={name}")))
            .await?;
        let wanted: BTreeSet<String> = (0..replicas)
            .map(|i| format!("{name}-{hash}-{i}"))
            .collect();
        if !graceful {
            for pod in &owned {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                if !wanted.contains(&pod_name) && pod.metadata.deletion_timestamp.is_none() {
                    pods.delete(&pod_name, &DeleteParams::default().grace_period(0))
                        .await?;
                }
            }
        }
        let existing: BTreeSet<String> = owned
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        // A pod made by an earlier pass whose status write failed (a pass under load) still
        // lacks its IP: written again, as a kubelet keeps reporting.
        let without_ip: BTreeSet<String> = owned
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for (replica, pod_name) in wanted.iter().enumerate() {
            if existing.contains(pod_name) && !without_ip.contains(pod_name) {
                continue;
            }
            let mut pod_labels = labels.clone();
            pod_labels[OWNER] = json!(name);
            let mut spec = template["spec"].clone();
            if graceful {
                spec["nodeName"] = json!("e2e-node");
            }
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": pod_name, "labels": pod_labels},
                "spec": spec,
            }))
            .unwrap();
            if !existing.contains(pod_name) {
                pods.create(&PostParams::default(), &pod).await?;
            }
            let ip = ip(&name, i32::try_from(replica).unwrap_or(i32::MAX));
            let status = json!({"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }});
            pods.patch_status(pod_name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
        if graceful {
            let now = k8s_openapi::jiff::Timestamp::now();
            for pod in &owned {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                match &pod.metadata.deletion_timestamp {
                    None if !wanted.contains(&pod_name) => {
                        pods.delete(&pod_name, &DeleteParams::default().grace_period(5))
                            .await?;
                    }
                    // Its grace is over: the kubelet confirms it stopped.
                    Some(at) if at.0 <= now => {
                        pods.delete(&pod_name, &DeleteParams::default().grace_period(0))
                            .await?;
                    }
                    _ => {}
                }
            }
        }
        // The Deployment controller: rolled out, every replica updated and available.
        let wanted_status = json!({
            "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
            "readyReplicas": replicas, "availableReplicas": replicas,
        });
        let current = serde_json::to_value(&deployment.status).unwrap_or(Value::Null);
        let differs = wanted_status
            .as_object()
            .unwrap()
            .iter()
            .any(|(key, value)| current[key] != *value);
        if differs {
            let patch = json!({"status": wanted_status});
            deployments
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    Ok(())
}

fn fnv(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Plays the controllers until `running` turns false.
fn play_controllers(client: Client, running: Arc<AtomicBool>) {
    tokio::spawn(async move {
        let next_ip = AtomicU32::new(1);
        let ip = |_: &str, _: i32| {
            let n = next_ip.fetch_add(1, Ordering::Relaxed);
            format!("127.0.{}.{}", n / 250, n % 250 + 1)
        };
        while running.load(Ordering::Relaxed) {
            if let Err(e) = reconcile(&client, NS, &ip, false).await {
                // A conflict with the canary controller's own write: the next pass retries.
                eprintln!("deployment controller pass: {e}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

fn deployment(name: &str, image: &str) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "app", "image": image}]}}},
    })
    .to_string()
}

fn canary(name: &str, analysis: Value) -> String {
    json!({
        "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "progressDeadlineSeconds": 60, "analysis": analysis},
    })
    .to_string()
}

fn phase(cluster: &Cluster, name: &str) -> String {
    cluster
        .get_json(&["canary", name, "-n", NS])
        .and_then(|c| c["status"]["phase"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn image(cluster: &Cluster, deployment: &str) -> String {
    cluster
        .get_json(&["deployment", deployment, "-n", NS])
        .and_then(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

async fn wait_phase(cluster: &Cluster, name: &str, wanted: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while phase(cluster, name) != wanted {
        if tokio::time::Instant::now() >= deadline {
            let canary = cluster.get_json(&["canary", name, "-n", NS]);
            let status = canary.map(|c| c["status"].clone()).unwrap_or_default();
            panic!("timed out waiting for Canary {name} in phase {wanted}; status {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The IPs of the ready pods of Deployment `name`, sorted.
fn pod_ips(cluster: &Cluster, name: &str) -> Vec<String> {
    let pods = cluster
        .get_json(&["pods", "-n", NS, "-l", &format!("{OWNER}={name}")])
        .unwrap_or_default();
    let mut ips: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_owned))
        .collect();
    ips.sort();
    ips
}

/// A/B and Blue/Green through the real API server: its schema takes `iterations` and `match`
/// and refuses `match` alone; the ConditionRoute an A/B run writes passes its CRD's checks.
pub async fn strategies(cluster: &Cluster) {
    // `match` without `iterations`: refused by the API server's CEL.
    let refused = cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&canary(
            "nomatch",
            json!({"stepWeight": 10, "match": [{"headers": {"x-canary": {"exact": "a"}}}]}),
        )),
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("match (A/B testing) needs iterations"),
        "{stderr}"
    );
    // Mirroring: accepted by the schema (Flagger's field), refused by the controller by name.
    cluster.kubectl_in(
        &["apply", "-f", "-"],
        Some(&canary("mirror", json!({"iterations": 2, "mirror": true}))),
    );
    cluster
        .wait_until("the mirror Canary refused", WAIT, || {
            cluster
                .get_json(&["canary", "mirror", "-n", NS])
                .is_some_and(|c| {
                    c["status"]["conditions"][0]["reason"] == "InvalidSpec"
                        && c["status"]["conditions"][0]["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("mirror"))
                })
        })
        .await;

    // Promotion is held by a gate nobody answers, so the run can be looked at.
    let closed = format!("http://127.0.0.1:{}/gate", free_port());
    let held = json!([{"name": "gate", "type": "confirm-promotion", "url": closed,
                       "timeout": "1s", "retries": 0}]);
    for name in ["abtest", "bluegreen"] {
        cluster.kubectl_in(
            &["apply", "-f", "-"],
            Some(&deployment(name, &format!("{name}:1"))),
        );
    }
    let ab = json!({"interval": "500ms", "threshold": 2, "iterations": 2, "webhooks": held,
                    "match": [{"headers": {"x-canary": {"exact": "insider"}}}]});
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&canary("abtest", ab)));
    let blue_green =
        json!({"interval": "500ms", "threshold": 2, "iterations": 2, "webhooks": held});
    cluster.kubectl_in(
        &["apply", "-f", "-"],
        Some(&canary("bluegreen", blue_green)),
    );
    for name in ["abtest", "bluegreen"] {
        wait_phase(cluster, name, "Initialized").await;
        cluster.kubectl_ok(&[
            "set",
            "image",
            &format!("deployment/{name}"),
            &format!("app={name}:2"),
            "-n",
            NS,
        ]);
    }
    for name in ["abtest", "bluegreen"] {
        wait_phase(cluster, name, "WaitingPromotion").await;
    }
    let strategy = |name: &str| {
        cluster.get_json(&["canary", name, "-n", NS]).unwrap()["status"]["strategy"].clone()
    };
    assert_eq!(strategy("abtest"), "A/B");
    assert_eq!(strategy("bluegreen"), "Blue/Green");
    let columns = cluster.kubectl_ok(&["get", "canaries", "-n", NS]);
    assert!(
        columns.contains("STRATEGY") && columns.contains("Blue/Green"),
        "{columns}"
    );

    // A/B: the route the API server took, to the canary's pods for insiders only.
    let canary_hosts = pod_ips(cluster, "abtest").join(",");
    let primary_hosts = pod_ips(cluster, "abtest-primary").join(",");
    let route = cluster
        .get_json(&["conditionroute", "abtest-canary", "-n", NS])
        .expect("the A/B route");
    assert_eq!(
        route["spec"]["conditions"],
        json!([
            format!("attachments[x-canary]=insider => host={canary_hosts}"),
            format!("=> host={primary_hosts}"),
        ])
    );
    assert_eq!(route["metadata"]["ownerReferences"][0]["kind"], "Canary");
    // Blue/Green: every call on the canary, the primary's pods at weight 0.
    let config = cluster
        .get_json(&["dynamicconfig", "bluegreen-canary", "-n", NS])
        .expect("the Blue/Green weights");
    let configs = config["spec"]["configs"].as_array().unwrap();
    // First the hold on every pod of the target by its labels (weight 0, there from before its
    // first pod), then each pod by IP.
    assert_eq!(
        configs[0]["match"],
        json!({"param": [{"key": "app", "value": {"exact": "bluegreen"}}]}),
        "{config}"
    );
    assert_eq!(configs[0]["parameters"]["weight"], "0", "{config}");
    let weights: Vec<(String, String)> = configs[1..]
        .iter()
        .map(|c| {
            (
                c["addresses"][0].as_str().unwrap().to_owned(),
                c["parameters"]["weight"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut wanted: Vec<(String, String)> = pod_ips(cluster, "bluegreen")
        .into_iter()
        .map(|ip| (ip, "100".to_owned()))
        .chain(
            pod_ips(cluster, "bluegreen-primary")
                .into_iter()
                .map(|ip| (ip, "0".to_owned())),
        )
        .collect();
    let mut got = weights.clone();
    got.sort();
    wanted.sort();
    assert_eq!(got, wanted);

    // The gate goes: both are promoted, and their rules are removed.
    for name in ["abtest", "bluegreen"] {
        cluster.kubectl_ok(&[
            "patch",
            "canary",
            name,
            "-n",
            NS,
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/spec/analysis/webhooks"}]"#,
        ]);
    }
    for name in ["abtest", "bluegreen"] {
        wait_phase(cluster, name, "Succeeded").await;
        assert_eq!(
            image(cluster, &format!("{name}-primary")),
            format!("{name}:2")
        );
    }
    for (kind, name) in [
        ("conditionroute", "abtest-canary"),
        ("dynamicconfig", "bluegreen-canary"),
    ] {
        cluster
            .wait_until(&format!("{kind} {name} removed"), WAIT, || {
                cluster.get_json(&[kind, name, "-n", NS]).is_none()
            })
            .await;
    }
}

pub async fn promotion_and_rollback(cluster: &Cluster) {
    cluster.namespace(NS, &[]);
    let running = Arc::new(AtomicBool::new(true));
    play_controllers(admin_client(cluster).await, running.clone());

    // A good release: promoted through 25 % and 50 %.
    cluster.kubectl_in(
        &["apply", "-f", "-"],
        Some(&deployment("podinfo", "podinfo:1")),
    );
    let good = json!({"interval": "500ms", "threshold": 2, "maxWeight": 50, "stepWeight": 25});
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&canary("podinfo", good)));
    // A bad one: its pre-rollout gate cannot be reached, which counts as a failed check.
    cluster.kubectl_in(
        &["apply", "-f", "-"],
        Some(&deployment("backend", "backend:1")),
    );
    let closed = format!("http://127.0.0.1:{}/gate", free_port());
    let bad = json!({"interval": "500ms", "threshold": 2, "maxWeight": 50, "stepWeight": 25,
                     "webhooks": [{"name": "gate", "type": "pre-rollout", "url": closed,
                                   "timeout": "1s", "retries": 0}]});
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&canary("backend", bad)));
    for name in ["podinfo", "backend"] {
        wait_phase(cluster, name, "Initialized").await;
        assert_eq!(
            image(cluster, &format!("{name}-primary")),
            format!("{name}:1")
        );
    }

    cluster.kubectl_ok(&[
        "set",
        "image",
        "deployment/podinfo",
        "app=podinfo:2",
        "-n",
        NS,
    ]);
    cluster.kubectl_ok(&[
        "set",
        "image",
        "deployment/backend",
        "app=backend:2",
        "-n",
        NS,
    ]);

    wait_phase(cluster, "podinfo", "Succeeded").await;
    assert_eq!(image(cluster, "podinfo-primary"), "podinfo:2");
    let status = cluster.get_json(&["canary", "podinfo", "-n", NS]).unwrap()["status"].clone();
    let weights: Vec<i64> = status["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|step| step["weight"].as_i64())
        .collect();
    assert!(
        weights.contains(&25) && weights.contains(&50),
        "weights went {weights:?}: {status}"
    );

    wait_phase(cluster, "backend", "Failed").await;
    assert_eq!(
        image(cluster, "backend-primary"),
        "backend:1",
        "the primary keeps the old release"
    );
    cluster
        .wait_until("the failed canary scaled to zero", WAIT, || {
            cluster
                .get_json(&["deployment", "backend", "-n", NS])
                .is_some_and(|d| d["spec"]["replicas"] == 0)
        })
        .await;
    // The other strategies, with the same players of the cluster's controllers.
    strategies(cluster).await;
    services_and_autoscaler(cluster).await;
    running.store(false, Ordering::Relaxed);
}

/// `spec.service` and `spec.autoscalerRef`: the API server takes the three Services, the apex's
/// EndpointSlice and the primary's HPA copy as the controller writes them.
pub async fn services_and_autoscaler(cluster: &Cluster) {
    let mut target: Value = serde_json::from_str(&deployment("frontend", "frontend:1")).unwrap();
    target["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"name": "grpc", "containerPort": 50051}]);
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&target.to_string()));
    let hpa = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "frontend", "namespace": NS},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "frontend"},
                 "minReplicas": 2, "maxReplicas": 4,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                              "target": {"type": "Utilization", "averageUtilization": 80}}}]}});
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&hpa.to_string()));
    // The example of docs/canary.md's "Services and autoscaling", as it is written there.
    let docs = include_str!("../../docs/canary.md");
    let section = docs.split("## Services and autoscaling").nth(1).unwrap();
    let example = section
        .split("```yaml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    assert!(
        example.contains("name: frontend, namespace: e2e-canary"),
        "{example}"
    );
    cluster.kubectl_in(&["apply", "-f", "-"], Some(example));
    wait_phase(cluster, "frontend", "Initialized").await;
    let condition = |kind: &str| {
        cluster
            .get_json(&["canary", "frontend", "-n", NS])
            .and_then(|c| {
                c["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == kind)
                    .map(|c| (c["status"].clone(), c["message"].clone()))
            })
    };
    for kind in ["ServicesReady", "AutoscalerReady"] {
        cluster
            .wait_until(&format!("condition {kind}"), WAIT, || {
                condition(kind).is_some_and(|(status, _)| status == "True")
            })
            .await;
    }
    let owner = |object: &Value| object["metadata"]["ownerReferences"][0]["kind"].clone();
    let apex = cluster
        .get_json(&["service", "frontend", "-n", NS])
        .unwrap();
    assert_eq!(owner(&apex), "Canary");
    assert!(apex["spec"]["selector"].is_null(), "{apex}");
    assert_eq!(apex["spec"]["type"], "ClusterIP");
    assert_eq!(apex["spec"]["ports"][0]["targetPort"], "grpc");
    for (name, selected) in [
        ("frontend-primary", "frontend-primary"),
        ("frontend-canary", "frontend"),
    ] {
        let service = cluster.get_json(&["service", name, "-n", NS]).unwrap();
        assert_eq!(owner(&service), "Canary");
        assert_eq!(service["spec"]["selector"], json!({"app": selected}));
    }
    // The pods here have loopback addresses, which no EndpointSlice takes: the slice is valid
    // and empty.
    let slice = cluster
        .get_json(&["endpointslice", "frontend-dubbo-cp", "-n", NS])
        .unwrap();
    assert_eq!(owner(&slice), "Canary");
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "frontend"
    );
    assert_eq!(slice["ports"][0]["port"], 50051);
    let copy = cluster
        .get_json(&["hpa", "frontend-primary", "-n", NS])
        .unwrap();
    assert_eq!(owner(&copy), "Canary");
    assert_eq!(copy["spec"]["scaleTargetRef"]["name"], "frontend-primary");
    assert_eq!(
        (
            copy["spec"]["minReplicas"].clone(),
            copy["spec"]["maxReplicas"].clone()
        ),
        (json!(2), json!(4))
    );
    assert_eq!(copy["spec"]["metrics"], hpa["spec"]["metrics"]);
}
