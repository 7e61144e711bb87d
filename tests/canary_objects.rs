//! The Kubernetes objects a Canary keeps like Flagger's, against the API-server fixture: its
//! Services (`spec.service`) with the apex's EndpointSlice, and the primary's copy of the
//! target's HorizontalPodAutoscaler (`spec.autoscalerRef`). The tests play the Deployment
//! controller and the kubelet (ready pods with IPs for every Deployment whose spec moved) and,
//! where they say so, the HPA controller.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use common::apiserver::{ApiServer, deployment_of, pod_ready};
use common::{start, wait_ready};
use serde_json::{Value, json};

const NS: &str = "test";
const WAIT: Duration = Duration::from_secs(20);

/// Pod IPs: `10.0.0.x` the target's (the canary's), `10.1.0.x` the primary's.
fn ip_prefix(deployment: &str) -> String {
    match deployment {
        "podinfo" => "10.0.0.".to_owned(),
        _ => "10.1.0.".to_owned(),
    }
}

struct Setup {
    api: ApiServer,
    _server: dubbo_cp::server::RunningServer,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// Deployment podinfo (2 replicas, `app: podinfo`, container port `grpc` 50051), what
    /// `prepare` adds, Canary podinfo with `extra` merged into its spec, and a control plane.
    async fn start(prepare: impl FnOnce(&ApiServer), extra: Value) -> Setup {
        Setup::start_with(prepare, extra, None).await
    }

    /// The same; with `primary`, new pods start unready and the others turn ready on the next
    /// pass, while the primary's go through `primary`'s stages (the control plane starts once
    /// the target's pods are ready).
    async fn start_with(
        prepare: impl FnOnce(&ApiServer),
        extra: Value,
        primary: Option<Arc<AtomicU8>>,
    ) -> Setup {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let api = ApiServer::start().await;
        api.create_namespace(NS);
        api.put_deployment(NS, "podinfo", 2, "podinfo:1");
        let mut deployment = api.object("deployments", NS, "podinfo").unwrap();
        deployment["spec"]["template"]["spec"]["containers"][0]["ports"] =
            json!([{"name": "grpc", "containerPort": 50051}]);
        api.put_object("deployments", NS, "podinfo", deployment);
        let kubelet = api.clone();
        let staged = primary.is_some();
        tokio::spawn(async move {
            loop {
                match &primary {
                    None => kubelet.roll_out_changed(NS, ip_prefix),
                    Some(stage) => {
                        kubelet.roll_out_changed_unready(NS, ip_prefix);
                        staged_readiness(&kubelet, stage.load(Ordering::SeqCst));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        if staged {
            api.wait_for_object("deployments", NS, "podinfo", WAIT, |d| {
                d.is_some_and(|d| d["status"]["readyReplicas"] == 2)
            })
            .await;
        }
        prepare(&api);
        let mut spec = json!({
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
            "progressDeadlineSeconds": 60,
            "analysis": {"interval": "200ms", "threshold": 2, "maxWeight": 50, "stepWeight": 50},
        });
        for (key, value) in extra.as_object().unwrap() {
            spec[key] = value.clone();
        }
        api.put_object(
            "canaries",
            NS,
            "podinfo",
            json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
                   "metadata": {"name": "podinfo", "namespace": NS}, "spec": spec}),
        );
        let dir = tempfile::tempdir().unwrap();
        let mut config = common::kubernetes_config(dir.path(), api.url());
        config.auth.token_review = Some(false);
        config.canary.enabled = true;
        config.canary.lease_duration = Duration::from_secs(2);
        let server = start(config).await;
        wait_ready(server.admin_addr).await;
        Setup {
            api,
            _server: server,
            _dir: dir,
        }
    }

    async fn wait_phase(&self, phase: &str) -> Value {
        self.wait_canary(|c| c["status"]["phase"] == phase).await
    }

    async fn wait_canary(&self, check: impl Fn(&Value) -> bool) -> Value {
        self.api
            .wait_for_object("canaries", NS, "podinfo", WAIT, |c| c.is_some_and(&check))
            .await
            .unwrap()
    }

    async fn wait(&self, resource: &str, name: &str, check: impl Fn(&Value) -> bool) -> Value {
        self.api
            .wait_for_object(resource, NS, name, WAIT, |o| o.is_some_and(&check))
            .await
            .unwrap()
    }
}

/// The primary's pods are not ready.
const PRIMARY_UNREADY: u8 = 0;
/// Its Deployment counts them available, the pods do not say ready yet: what a control plane
/// sees when its pod cache lags the Deployment's status.
const PRIMARY_COUNTED: u8 = 1;
/// Its pods are ready.
const PRIMARY_READY: u8 = 2;

/// One pass of the kubelet and the Deployment controller: every unready pod turns ready, but
/// the primary's, which follow `stage`.
fn staged_readiness(api: &ApiServer, stage: u8) {
    for pod in api.objects_of("pods", NS) {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let deployment = deployment_of(name);
        if pod_ready(&pod) {
            continue;
        }
        if deployment != "podinfo-primary" || stage == PRIMARY_READY {
            api.make_ready(NS, name);
            api.count_ready(NS, deployment);
        } else if stage == PRIMARY_COUNTED {
            let object = api.object("deployments", NS, deployment).unwrap();
            let replicas = &object["spec"]["replicas"];
            let mut status = object["status"].clone();
            if status["availableReplicas"] != *replicas {
                status["readyReplicas"] = replicas.clone();
                status["availableReplicas"] = replicas.clone();
                api.set_deployment_status(NS, deployment, status);
            }
        }
    }
}

/// The Canary's condition of `kind`: (status, message).
fn condition(canary: &Value, kind: &str) -> Option<(String, String)> {
    canary["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// The addresses of an EndpointSlice, sorted.
fn addresses(slice: &Value) -> Vec<String> {
    let mut ips: Vec<String> = slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    ips.sort();
    ips
}

fn owned_by_the_canary(object: &Value) {
    let owner = &object["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Canary", "{object}");
    assert_eq!(owner["name"], "podinfo");
    assert_eq!(owner["controller"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_serve_each_role_the_apex_both_and_a_foreign_one_is_left_alone() {
    let foreign = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "podinfo-canary", "namespace": NS, "labels": {"team": "a"}},
        "spec": {"selector": {"app": "other"}, "ports": [{"name": "http", "port": 80}]}});
    let setup = Setup::start(
        |api| api.put_object("services", NS, "podinfo-canary", foreign.clone()),
        json!({"service": {"port": 9898, "portName": "grpc", "targetPort": "grpc"}}),
    )
    .await;
    let api = &setup.api;
    let canary = setup
        .wait_canary(|c| condition(c, "ServicesReady").is_some_and(|(s, _)| s == "False"))
        .await;
    let (_, message) = condition(&canary, "ServicesReady").unwrap();
    assert!(
        message.contains("Service podinfo-canary exists and is not this canary's"),
        "{message}"
    );
    let before = api.object("services", NS, "podinfo-canary").unwrap();
    assert_eq!(before["spec"]["selector"], json!({"app": "other"}));
    assert_eq!(before["metadata"]["labels"], json!({"team": "a"}));

    // The apex reaches both roles through its slice; -primary selects the primary's pods.
    setup.wait_phase("Initialized").await;
    let apex = setup.wait("services", "podinfo", |_| true).await;
    owned_by_the_canary(&apex);
    assert!(apex["spec"]["selector"].is_null(), "{apex}");
    assert_eq!(apex["spec"]["type"], "ClusterIP");
    assert_eq!(
        apex["spec"]["ports"],
        json!([{"name": "grpc", "port": 9898, "protocol": "TCP", "targetPort": "grpc"}])
    );
    assert_eq!(
        apex["metadata"]["labels"]["dubbo.apache.org/application"],
        "podinfo"
    );
    let primary = setup.wait("services", "podinfo-primary", |_| true).await;
    owned_by_the_canary(&primary);
    assert_eq!(
        primary["spec"]["selector"],
        json!({"app": "podinfo-primary"})
    );
    // Not of the apex's application: no extra cluster of it, no canary weights on it.
    assert!(primary["metadata"]["labels"]["dubbo.apache.org/application"].is_null());
    let slice = setup
        .wait("endpointslices", "podinfo-dubbo-cp", |s| {
            addresses(s) == ["10.1.0.1", "10.1.0.2"]
        })
        .await;
    owned_by_the_canary(&slice);
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        "podinfo"
    );
    assert_eq!(
        slice["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
        "canary.dubbo.apache.org"
    );
    assert_eq!(slice["ports"][0]["port"], 50051);
    assert_eq!(slice["ports"][0]["name"], "grpc");
    // Still someone else's, untouched.
    let after = api.object("services", NS, "podinfo-canary").unwrap();
    assert_eq!(
        after["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );

    // Once it is gone, the canary's Service takes the name.
    api.delete_object("services", NS, "podinfo-canary");
    let canary_service = setup
        .wait("services", "podinfo-canary", |s| {
            s["metadata"]["ownerReferences"][0]["kind"] == "Canary"
        })
        .await;
    assert_eq!(
        canary_service["spec"]["selector"],
        json!({"app": "podinfo"})
    );
    setup
        .wait_canary(|c| condition(c, "ServicesReady").is_some_and(|(s, _)| s == "True"))
        .await;

    // During a run the apex holds the canary's pods as well; after it, the primary's only.
    api.set_image(NS, "podinfo", "podinfo:2");
    setup
        .wait("endpointslices", "podinfo-dubbo-cp", |s| {
            addresses(s) == ["10.0.0.1", "10.0.0.2", "10.1.0.1", "10.1.0.2"]
        })
        .await;
    setup.wait_phase("Succeeded").await;
    setup
        .wait("endpointslices", "podinfo-dubbo-cp", |s| {
            addresses(s) == ["10.1.0.1", "10.1.0.2"]
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_primary_is_not_ready_the_apex_lists_the_targets_pods_then_the_primarys_alone() {
    let stage = Arc::new(AtomicU8::new(PRIMARY_UNREADY));
    let setup = Setup::start_with(
        |_| {},
        json!({"service": {"port": 9898, "portName": "grpc", "targetPort": "grpc"}}),
        Some(stage.clone()),
    )
    .await;
    let api = &setup.api;
    // Initialising, the primary's pods not ready: the target's serve the apex meanwhile.
    setup
        .wait("endpointslices", "podinfo-dubbo-cp", |s| {
            addresses(s) == ["10.0.0.1", "10.0.0.2"]
        })
        .await;
    let canary = setup.wait_canary(|_| true).await;
    assert_eq!(canary["status"]["phase"], "Initializing", "{canary}");

    // The Deployment counts the primary's pods before the pods say ready: initialisation waits
    // for them, the target still serving.
    stage.store(PRIMARY_COUNTED, Ordering::SeqCst);
    api.wait_for("a Halted event for the pod cache", WAIT, |api| {
        api.objects_of("events", NS).iter().any(|e| {
            e["reason"] == "Halted"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("waiting for the pod cache"))
        })
    })
    .await;
    let canary = setup.wait_canary(|_| true).await;
    assert_eq!(canary["status"]["phase"], "Initializing", "{canary}");
    assert_eq!(
        api.object("deployments", NS, "podinfo").unwrap()["spec"]["replicas"],
        2
    );

    // Ready: the apex moves to the primary's pods, and then the target goes to zero.
    stage.store(PRIMARY_READY, Ordering::SeqCst);
    setup.wait_phase("Initialized").await;
    setup
        .wait("deployments", "podinfo", |d| d["spec"]["replicas"] == 0)
        .await;
    let slices = api.history("endpointslices", NS, "podinfo-dubbo-cp");
    let listed: Vec<Vec<String>> = slices.iter().map(|(_, _, s)| addresses(s)).collect();
    assert!(listed.iter().all(|ips| !ips.is_empty()), "{listed:?}");
    assert_eq!(
        listed.last().unwrap(),
        &["10.1.0.1", "10.1.0.2"],
        "{listed:?}"
    );
    let switched = slices
        .iter()
        .find(|(_, _, s)| addresses(s) == ["10.1.0.1", "10.1.0.2"])
        .map(|(rv, _, _)| *rv)
        .unwrap();
    let scaled_down = api
        .history("deployments", NS, "podinfo")
        .iter()
        .find(|(_, _, d)| d["spec"]["replicas"] == 0)
        .map(|(rv, _, _)| *rv)
        .unwrap();
    assert!(
        switched < scaled_down,
        "apex at {switched}, target at zero at {scaled_down}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_gets_a_copy_of_the_hpa_which_alone_scales_it_and_the_canary_is_scaled_within_its_bounds_then_to_zero()
 {
    let hpa = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "podinfo", "namespace": NS, "labels": {"team": "a"}},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                 "minReplicas": 3, "maxReplicas": 6,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                              "target": {"type": "Utilization", "averageUtilization": 80}}}]}});
    let setup = Setup::start(
        |api| api.put_object("horizontalpodautoscalers", NS, "podinfo", hpa.clone()),
        json!({"autoscalerRef": {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "name": "podinfo"}}),
    )
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    let copy = setup
        .wait("horizontalpodautoscalers", "podinfo-primary", |_| true)
        .await;
    owned_by_the_canary(&copy);
    assert_eq!(copy["metadata"]["labels"]["team"], "a");
    assert_eq!(
        copy["spec"]["scaleTargetRef"],
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo-primary"})
    );
    assert_eq!(copy["spec"]["minReplicas"], 3);
    assert_eq!(copy["spec"]["maxReplicas"], 6);
    assert_eq!(copy["spec"]["metrics"], hpa["spec"]["metrics"]);
    let canary = setup
        .wait_canary(|c| condition(c, "AutoscalerReady").is_some_and(|(s, _)| s == "True"))
        .await;
    assert_eq!(canary["status"]["phase"], "Initialized");

    // A change of the target's HPA reaches the copy.
    let mut changed = api
        .object("horizontalpodautoscalers", NS, "podinfo")
        .unwrap();
    changed["spec"]["maxReplicas"] = json!(8);
    api.put_object("horizontalpodautoscalers", NS, "podinfo", changed);
    setup
        .wait("horizontalpodautoscalers", "podinfo-primary", |c| {
            c["spec"]["maxReplicas"] == 8
        })
        .await;

    // The HPA controller scales the primary to 5; the run that follows leaves that alone.
    let mut primary = api.object("deployments", NS, "podinfo-primary").unwrap();
    primary["spec"]["replicas"] = json!(5);
    api.put_object("deployments", NS, "podinfo-primary", primary);
    api.set_image(NS, "podinfo", "podinfo:2");
    // The canary starts at the HPA's minimum (Flagger's scale from zero), not the primary's 5.
    setup
        .wait("deployments", "podinfo", |d| d["spec"]["replicas"] == 3)
        .await;
    setup.wait_phase("Succeeded").await;
    let target = setup
        .wait("deployments", "podinfo", |d| d["spec"]["replicas"] == 0)
        .await;
    assert_eq!(target["spec"]["replicas"], 0);
    let primary = api.object("deployments", NS, "podinfo-primary").unwrap();
    assert_eq!(
        primary["spec"]["template"]["spec"]["containers"][0]["image"],
        "podinfo:2"
    );
    assert_eq!(primary["spec"]["replicas"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_hpa_of_the_copys_name_is_left_alone_and_named() {
    let hpa = |name: &str, target: &str| {
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
                     "minReplicas": 1, "maxReplicas": 2}})
    };
    let setup = Setup::start(
        |api| {
            api.put_object(
                "horizontalpodautoscalers",
                NS,
                "podinfo",
                hpa("podinfo", "podinfo"),
            );
            api.put_object(
                "horizontalpodautoscalers",
                NS,
                "podinfo-primary",
                hpa("podinfo-primary", "elsewhere"),
            );
        },
        json!({"autoscalerRef": {"name": "podinfo"}}),
    )
    .await;
    let canary = setup
        .wait_canary(|c| condition(c, "AutoscalerReady").is_some_and(|(s, _)| s == "False"))
        .await;
    let (_, message) = condition(&canary, "AutoscalerReady").unwrap();
    assert!(
        message.contains("HorizontalPodAutoscaler podinfo-primary exists and is not this canary's"),
        "{message}"
    );
    setup.wait_phase("Initialized").await;
    let stored = setup
        .api
        .object("horizontalpodautoscalers", NS, "podinfo-primary")
        .unwrap();
    assert_eq!(stored["spec"]["scaleTargetRef"]["name"], "elsewhere");
    assert!(stored["metadata"]["ownerReferences"].is_null());
}
