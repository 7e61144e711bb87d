//! A Canary on the real API server judged on real traffic: one provider process per pod
//! (released grpcio on the pod's loopback IP, exporting Dubbo's provider metrics; the canary's
//! build fails half its calls), Debian's Prometheus scraping them, a released grpcio client over
//! `xds:///podinfo` calling the whole run, and the real binary's canary controller moving the
//! weights and querying that Prometheus (the Canary's `prometheus.address`).
//!
//! The real API server refuses loopback addresses in EndpointSlices, so the pods' endpoints
//! reach xDS through a ServiceEntry `podinfo` the test keeps in step with the ready pods (as
//! an EndpointSlice controller would); the canary's DynamicConfig weighs them by pod IP as it
//! does a Service's. The test also plays the Deployment controller and the kubelet
//! (`super::canary::reconcile`) and Prometheus's pod discovery. A second control plane, with no
//! canary controller and no token review, serves the client xDS: the shared one wants a
//! service-account token over TLS, which grpcio sends only with an experimental flag.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::common::kube_local::{Cluster, control_plane};
use crate::traffic::{Build, Client, Prometheus, Provider, answers};

const NS: &str = "e2e-traffic";
const WAIT: Duration = Duration::from_secs(90);

/// The IP of a Deployment's pod: the canary's (the target's) on 127.0.7.x, the primary's on
/// 127.0.8.x, by replica, so each IP keeps its provider process.
fn pod_ip(deployment: &str, replica: i32) -> String {
    let subnet = if deployment == "podinfo" { 7 } else { 8 };
    format!("127.0.{subnet}.{}", replica + 1)
}

/// Plays, until `running` turns false, the Deployment controller and kubelet, an endpoint
/// controller writing the ready pods that have a provider into ServiceEntry `podinfo`, and
/// Prometheus's discovery (each such pod's metrics port a target named after the pod).
fn play_controllers(
    cluster: &'static Cluster,
    client: kube::Client,
    prometheus: Arc<Prometheus>,
    ports: BTreeMap<String, (u16, u16)>,
    running: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let mut served = None;
        let mut scraped = None;
        while running.load(Ordering::Relaxed) {
            if let Err(e) = super::canary::reconcile(&client, NS, &pod_ip).await {
                eprintln!("deployment controller pass: {e}");
            }
            let mut endpoints = Vec::new();
            let mut targets = Vec::new();
            for pod in pods
                .list(&ListParams::default())
                .await
                .into_iter()
                .flatten()
            {
                let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
                let Some((grpc, metrics)) = ip.as_ref().and_then(|ip| ports.get(ip)) else {
                    continue;
                };
                if pod.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let ip = ip.unwrap_or_default();
                endpoints.push(json!({"address": ip, "ports": {"grpc": grpc}}));
                let addr = SocketAddr::new(ip.parse().unwrap(), *metrics);
                targets.push((addr, pod.metadata.name.unwrap_or_default(), NS.to_owned()));
            }
            endpoints.sort_by_key(|e| e["address"].as_str().unwrap_or_default().to_owned());
            if served.as_ref() != Some(&endpoints) {
                let entry = json!({
                    "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "ServiceEntry",
                    "metadata": {"name": "podinfo", "namespace": NS},
                    "spec": {"hosts": ["podinfo"],
                             "ports": [{"number": 7070, "name": "grpc", "protocol": "GRPC"}],
                             "endpoints": endpoints},
                });
                let applied = cluster.kubectl(&["apply", "-f", "-"], Some(&entry.to_string()));
                if applied.status.success() {
                    served = Some(endpoints);
                } else {
                    eprintln!("{}", String::from_utf8_lossy(&applied.stderr));
                }
            }
            targets.sort();
            if scraped.as_ref() != Some(&targets) {
                prometheus.set_targets(&targets);
                scraped = Some(targets);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// A `confirm-traffic-increase` gate letting one call through per permit.
async fn gate(permits: Arc<AtomicUsize>) -> SocketAddr {
    async fn answer(State(permits): State<Arc<AtomicUsize>>) -> StatusCode {
        let taken = permits.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| p.checked_sub(1));
        if taken.is_ok() {
            StatusCode::OK
        } else {
            StatusCode::FORBIDDEN
        }
    }
    let app = axum::Router::new()
        .fallback(axum::routing::post(answer))
        .with_state(permits);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn status(cluster: &Cluster) -> Value {
    cluster
        .get_json(&["canary", "podinfo", "-n", NS])
        .map(|c| c["status"].clone())
        .unwrap_or(Value::Null)
}

/// Waits until Prometheus has `pods` targets matching `pods_regex` up.
async fn scraped(prometheus: &Prometheus, pods_regex: &str, pods: u32) {
    let query = format!("count(up{{namespace=\"{NS}\",pod=~\"{pods_regex}\"}} == 1)");
    prometheus
        .wait_for_value(&query, |n| n == f64::from(pods))
        .await;
}

/// A release whose canary fails half its calls: at 20 % the client's calls split as the weights
/// say, the built-in success rate read from the real Prometheus fails the checks, and the
/// rollback returns every call to the primary with no call failed by the switch.
pub async fn a_failing_canary_is_rolled_back_by_real_metrics(
    cluster: &'static Cluster,
    admin: kube::Client,
) {
    cluster.namespace(NS, &[]);
    let prometheus = Arc::new(Prometheus::start(None));
    let mut providers = Vec::new();
    let mut ports = BTreeMap::new();
    for (deployment, role, build) in [
        (
            "podinfo",
            "canary",
            Build {
                fail_percent: 50,
                delay_ms: 0,
            },
        ),
        ("podinfo-primary", "primary", Build::default()),
    ] {
        for replica in 0..2 {
            let ip = pod_ip(deployment, replica);
            let provider = Provider::start(role, &ip, "podinfo", build).await;
            ports.insert(ip, (provider.grpc_port, provider.metrics_port));
            providers.push(provider);
        }
    }
    let running = Arc::new(AtomicBool::new(true));
    play_controllers(cluster, admin, prometheus.clone(), ports, running.clone());
    // The xDS server the client reads (the shared control plane drives the Canary).
    let xds_plane = control_plane(
        cluster,
        &[
            "--canary-enabled",
            "false",
            "--webhook-enabled",
            "false",
            "--auth-token-review",
            "false",
        ],
    );
    crate::common::kube_local::reap_with_this_process(xds_plane.child.id());
    let xds = xds_plane.xds().expect("xDS is on").to_string();

    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "podinfo", "namespace": NS, "labels": {"app": "podinfo"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "podinfo"}},
                 "template": {"metadata": {"labels": {"app": "podinfo"}},
                              "spec": {"containers": [{"name": "app", "image": "podinfo:1"}]}}},
    });
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&deployment.to_string()));
    let permits = Arc::new(AtomicUsize::new(0));
    let gate = gate(permits.clone()).await;
    let canary = json!({
        "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
        "metadata": {"name": "podinfo", "namespace": NS},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
            "progressDeadlineSeconds": 120,
            "prometheus": {"address": prometheus.endpoint.address},
            "analysis": {
                "interval": "2s", "threshold": 3, "maxWeight": 40, "stepWeight": 20,
                "metrics": [{"name": "request-success-rate", "thresholdRange": {"min": 99},
                             "interval": "30s"}],
                "webhooks": [{"name": "step", "type": "confirm-traffic-increase",
                              "url": format!("http://{gate}/step")}],
            },
        },
    });
    cluster.kubectl_in(&["apply", "-f", "-"], Some(&canary.to_string()));
    cluster
        .wait_until("the Canary initialized", WAIT, || {
            status(cluster)["phase"] == "Initialized"
        })
        .await;

    let bootstrap = std::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args([
            "bootstrap",
            "--server",
            &xds,
            "-n",
            NS,
            "--node-id",
            "e2e-traffic",
        ])
        .output()
        .unwrap();
    assert!(bootstrap.status.success(), "{bootstrap:?}");
    let mut client = Client::start(
        "xds:///podinfo",
        String::from_utf8(bootstrap.stdout).unwrap(),
    );
    client.settle("primary", 100).await;
    scraped(&prometheus, "podinfo-primary-.*", 2).await;

    // A release: the canary's pods come up (at weight 0, no call) and are scraped; then one
    // step to 20 %.
    cluster.kubectl_ok(&[
        "set",
        "image",
        "deployment/podinfo",
        "app=podinfo:2",
        "-n",
        NS,
    ]);
    cluster
        .wait_until("the run started", WAIT, || {
            status(cluster)["phase"] == "Progressing"
        })
        .await;
    scraped(&prometheus, "podinfo-[0-9a-z]+-[0-9]+", 2).await;
    permits.fetch_add(1, Ordering::SeqCst);
    cluster
        .wait_until("the canary at 20%", WAIT, || {
            status(cluster)["canaryWeight"] == 20
        })
        .await;
    // Counted from the client's first canary answer (it applies what it acknowledged a moment
    // later). A fifth of the calls reach the canary, which fails half of those.
    client.settle("canary", 1).await;
    let counts = client.count(2000).await;
    let on_canary = answers(&counts, "canary") + answers(&counts, "injected");
    assert_eq!(on_canary + answers(&counts, "primary"), 2000, "{counts}");
    assert!(on_canary.abs_diff(400) <= 100, "{counts}");
    eprintln!("e2e step 20%: the canary took {on_canary} of 2000 calls: {counts}");

    // The built-in success rate on Prometheus's samples of the canary pods fails three checks:
    // rolled back.
    cluster
        .wait_until("the rollback", WAIT, || {
            status(cluster)["phase"] == "Failed"
        })
        .await;
    let failed = status(cluster);
    let checked = failed["history"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s["metrics"].is_array())
        .cloned()
        .unwrap_or_else(|| panic!("no analysed step: {failed}"));
    let rate = &checked["metrics"][0];
    assert_eq!(rate["name"], "request-success-rate", "{checked}");
    assert_eq!(rate["ok"], false, "{checked}");
    let value = rate["value"]
        .as_f64()
        .unwrap_or_else(|| panic!("{checked}"));
    assert!((40.0..=60.0).contains(&value), "{checked}");
    eprintln!("e2e rolled back at success rate {value:.1}% (weight 20)");

    // Every call back on the primary; none failed but the canary build's own.
    client.settle("primary", 100).await;
    let after = client.count(2000).await;
    assert_eq!(answers(&after, "primary"), 2000, "{after}");
    let totals = client.totals().await;
    assert_eq!(answers(&totals, "error"), 0, "{totals}");
    eprintln!("e2e calls over the run: {totals}");
    running.store(false, Ordering::Relaxed);
    drop(providers);
}
