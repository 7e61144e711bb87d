//! Canaries judged on real traffic by a real Prometheus: one provider process per pod (released
//! grpcio, exporting Dubbo's provider metrics; the canary's build fails a share of its calls or
//! is slow, as the test says), Debian's Prometheus scraping them every second, and a released
//! grpcio client over `xds:///` calling the whole run and counting who answered. The canary
//! controller's built-in queries run on that Prometheus: nothing about the verdict is the
//! test's to set.
//!
//! On the API-server fixture, as `tests/canary_xds.rs`: a real API server refuses loopback
//! addresses in EndpointSlices, and xDS in Kubernetes mode takes a Service's endpoints from its
//! EndpointSlices. The test plays the Deployment controller and kubelet (pods with loopback IPs,
//! each served by a provider process), the EndpointSlice controller, and Prometheus's
//! Kubernetes discovery (each pod's metrics port a target labelled with its `pod` and
//! `namespace`, as the usual relabelling does).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;
mod traffic;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::apiserver::{ApiServer, deployment_of, pod_ready};
use common::gates::{Gates, acked_weights, endpoint_nonce};
use common::{start, wait_ready};
use dubbo_cp::canary::prometheus::{Endpoint, QueryError};
use serde_json::{Value, json};
use traffic::{Build, Client, Prometheus, Provider, WebConfig, answers};

const NS: &str = "test";
const WAIT: Duration = Duration::from_secs(60);
const NODE_ID: &str = "canary-traffic";
/// The canary's pods by the built-in queries' pattern (`podinfo-<replicaset>-<pod>`).
const CANARY_PODS: &str = r#"namespace="test",pod=~"podinfo-[0-9a-zA-Z]+(-[0-9a-zA-Z]+)""#;

/// Pod IPs: the target's (the canary's, once a run starts) and the primary's.
fn ip_prefix(deployment: &str) -> &'static str {
    match deployment {
        "podinfo" => "127.0.1.",
        _ => "127.0.2.",
    }
}

/// How long a pod runs with its IP before its readiness probe passes: none, as a pod without a
/// readiness probe. The kubelet still reports the IP first (the pod is created with it, unready)
/// and readiness in its next update, in the same pass here, so endpoints list the pod ready the
/// moment it is seen. The canary controller holds the target's pods at weight 0 by their labels
/// from before they exist, so production calls still never reach a canary pod it has not
/// weighed.
const READY_AFTER: Duration = Duration::ZERO;

/// Plays, every 20 ms, the Deployment controller and kubelet (pods with IPs for every
/// Deployment whose spec moved, ready [`READY_AFTER`] later), the EndpointSlice controller (a
/// slice per pod whose IP has a provider, ready as the pod is, naming its pod as `targetRef`)
/// and Prometheus's pod discovery
/// (a target per such pod, named after it).
fn cluster_controllers(
    api: &ApiServer,
    prometheus: Arc<Prometheus>,
    ports: BTreeMap<String, (u16, u16)>,
) {
    let api = api.clone();
    tokio::spawn(async move {
        let mut served: BTreeMap<String, Value> = BTreeMap::new();
        let mut scraped = None;
        // Pods not ready yet, by name: when each was seen first.
        let mut starting: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
        loop {
            // Deployments whose pods turned ready in this pass: counted once the slices say so.
            let mut turned_ready = BTreeSet::new();
            api.roll_out_changed_unready(NS, |name| ip_prefix(name).to_owned());
            let mut wanted: BTreeMap<String, Value> = BTreeMap::new();
            let mut targets = Vec::new();
            let pods = api.objects_of("pods", NS);
            starting.retain(|name, _| pods.iter().any(|p| p["metadata"]["name"] == *name));
            for pod in pods {
                let pod_name = pod["metadata"]["name"].as_str().unwrap().to_owned();
                let mut ready = pod_ready(&pod);
                if !ready {
                    let since = starting
                        .entry(pod_name.clone())
                        .or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() >= READY_AFTER {
                        starting.remove(&pod_name);
                        api.make_ready(NS, &pod_name);
                        turned_ready.insert(deployment_of(&pod_name).to_owned());
                        ready = true;
                    }
                }
                let Some(ip) = pod["status"]["podIP"].as_str() else {
                    continue;
                };
                let Some((grpc, metrics)) = ports.get(ip) else {
                    continue;
                };
                let name = format!("podinfo-{}", ip.replace('.', "-"));
                let slice = json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": NS,
                                 "labels": {"kubernetes.io/service-name": "podinfo",
                                            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                    "addressType": "IPv4",
                    "ports": [{"name": "grpc", "port": grpc, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [ip], "conditions": {"ready": ready},
                                   "targetRef": {"kind": "Pod", "name": pod_name, "namespace": NS}}],
                });
                wanted.insert(name, slice);
                let addr = SocketAddr::new(ip.parse().unwrap(), *metrics);
                targets.push((addr, pod_name, NS.to_owned()));
            }
            for (name, slice) in &wanted {
                if served.get(name) != Some(slice) {
                    api.put_object("endpointslices", NS, name, slice.clone());
                }
            }
            for name in served.keys().filter(|n| !wanted.contains_key(*n)) {
                api.delete_object("endpointslices", NS, name);
            }
            served = wanted;
            for deployment in &turned_ready {
                api.count_ready(NS, deployment);
            }
            targets.sort();
            if scraped.as_ref() != Some(&targets) {
                prometheus.set_targets(&targets);
                scraped = Some(targets);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

struct Setup {
    api: ApiServer,
    server: dubbo_cp::server::RunningServer,
    gates: Gates,
    prometheus: Arc<Prometheus>,
    client: Client,
    _providers: Vec<Provider>,
    /// Each pod IP's provider ports: (gRPC, metrics).
    ports: BTreeMap<String, (u16, u16)>,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// Two primary pods running a healthy build, two canary pods running `canary`, Prometheus
    /// scraping them, the control plane judging a Canary with `analysis` (plus the gates) on
    /// that Prometheus, and a client (idle until its first command).
    async fn start(canary: Build, analysis: Value) -> Setup {
        Setup::start_with(canary, analysis, None).await
    }

    /// The same, Prometheus behind https and basic auth when `web` says so (the server trusts
    /// its CA by `canary.caFile`).
    async fn start_with(canary: Build, analysis: Value, web: Option<&WebConfig>) -> Setup {
        let prometheus = Arc::new(Prometheus::start(web));
        let mut providers = Vec::new();
        let mut ports = BTreeMap::new();
        for (role, prefix, build) in [
            ("canary", "127.0.1.", canary),
            ("primary", "127.0.2.", Build::default()),
        ] {
            for i in 1..=2 {
                let ip = format!("{prefix}{i}");
                let provider = Provider::start(role, &ip, "podinfo", build).await;
                ports.insert(ip, (provider.grpc_port, provider.metrics_port));
                providers.push(provider);
            }
        }
        let api = ApiServer::start().await;
        api.create_namespace(NS);
        api.put_deployment(NS, "podinfo", 2, "podinfo:1");
        api.put_object(
            "services",
            NS,
            "podinfo",
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "podinfo", "namespace": NS},
                   "spec": {"ports": [{"name": "grpc", "port": 7070, "protocol": "TCP"}]}}),
        );
        cluster_controllers(&api, prometheus.clone(), ports.clone());
        let gates_ = Gates::default();
        let gate = gates_.serve().await;
        let mut analysis = analysis;
        analysis["webhooks"] = json!([
            {"name": "step", "type": "confirm-traffic-increase", "url": format!("http://{gate}/step")},
            {"name": "promote", "type": "confirm-promotion", "url": format!("http://{gate}/promote")},
        ]);
        api.put_object(
            "canaries",
            NS,
            "podinfo",
            json!({
                "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
                "metadata": {"name": "podinfo", "namespace": NS},
                "spec": {
                    "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                    "progressDeadlineSeconds": 60,
                    "analysis": analysis,
                },
            }),
        );
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            common::canary_config(dir.path(), api.url(), prometheus.endpoint.address.clone());
        if let Some(web) = web {
            let ca_file = dir.path().join("prometheus-ca.pem");
            std::fs::write(&ca_file, &web.ca_pem).unwrap();
            config.canary.ca_file = Some(ca_file);
        }
        config.canary.query_timeout = Duration::from_secs(5);
        let server = start(config).await;
        wait_ready(server.admin_addr).await;
        let xds = server.xds_addr.expect("xDS is on").to_string();
        let bootstrap = common::bootstrap(&xds, NS, NODE_ID);
        Setup {
            api,
            server,
            gates: gates_,
            client: Client::start("xds:///podinfo", bootstrap),
            prometheus,
            _providers: providers,
            ports,
            _dir: dir,
        }
    }

    async fn wait_phase(&self, phase: &str) -> Value {
        self.api
            .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
                c.is_some_and(|c| c["status"]["phase"] == phase)
            })
            .await
            .unwrap()
    }

    /// Waits until the Canary is initialised and the client's calls (each with `metadata`)
    /// reach the primary alone, then starts the totals afresh: the run counts from there. The
    /// client first connects as the pods become ready, and the xDS snapshot follows readiness
    /// a debounce window later: until then it may be told the service has no endpoint (a call
    /// then fails at once, as it would for any client started then) or reach the target's
    /// pods on their way out (they run the canary's build).
    async fn initialized(&mut self, metadata: &str) {
        self.wait_phase("Initialized").await;
        self.client.settle_with("primary", 100, metadata).await;
        self.client.reset_totals().await;
    }

    /// Waits until the client acknowledged a load assignment with these locality weights.
    async fn served(&self, weights: &[u32]) {
        let clients = self.server.xds_clients.clone().unwrap();
        let wait =
            clients.wait_for(|list| acked_weights(list, NODE_ID).as_deref() == Some(weights));
        tokio::time::timeout(WAIT, wait).await.unwrap_or_else(|_| {
            panic!(
                "weights {weights:?} never acknowledged; last {:?}",
                acked_weights(&clients.list(), NODE_ID),
            )
        });
    }

    /// Waits until Prometheus scrapes `pods` pods matching `selector`, all up.
    async fn scraped(&self, selector: &str, pods: u32) {
        let query = format!("count(up{{{selector}}} == 1)");
        self.prometheus
            .wait_for_value(&query, |n| n == f64::from(pods))
            .await;
    }

    /// Lets the next step through and waits until the Canary is at `percent`.
    async fn permit_step(&self, percent: u32) {
        self.gates.step.fetch_add(1, Ordering::SeqCst);
        self.api
            .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
                c.is_some_and(|c| c["status"]["canaryWeight"] == percent)
            })
            .await;
    }

    /// A new release of the target: waits until its canary pods run, Prometheus scrapes them
    /// (so the first check after traffic reaches them has samples from before) and they are
    /// ready.
    async fn release(&self, image: &str) {
        self.api.set_image(NS, "podinfo", image);
        self.wait_phase("Progressing").await;
        self.scraped(CANARY_PODS, 2).await;
        // What a test counts next then includes the moment endpoints list them as ready.
        self.api
            .wait_for_object("deployments", NS, "podinfo", WAIT, |d| {
                d.is_some_and(|d| d["status"]["readyReplicas"] == 2)
            })
            .await;
    }

    /// The last analysed step at `weight` whose metrics all ran on data, once there is one.
    async fn analysed_at(&self, weight: u32) -> Value {
        let canary = self
            .api
            .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
                c.is_some_and(|c| measured_step(c, weight).is_some())
            })
            .await
            .unwrap();
        measured_step(&canary, weight).unwrap()
    }
}

/// The last step of `canary`'s history at `weight` whose metrics all have values.
fn measured_step(canary: &Value, weight: u32) -> Option<Value> {
    canary["status"]["history"]
        .as_array()?
        .iter()
        .rev()
        .find(|step| {
            step["weight"] == weight
                && step["metrics"]
                    .as_array()
                    .is_some_and(|m| !m.is_empty() && m.iter().all(|m| m["value"].is_number()))
        })
        .cloned()
}

fn metric<'a>(step: &'a Value, name: &str) -> &'a Value {
    step["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {step}"))
}

/// The built-in checks over a 30 s window (several scrapes at any step), every 2 s.
fn analysis(threshold: u32) -> Value {
    json!({
        "interval": "2s", "threshold": threshold, "maxWeight": 60, "stepWeight": 20,
        "metrics": [
            {"name": "request-success-rate", "thresholdRange": {"min": 99}, "interval": "30s"},
            {"name": "request-duration", "thresholdRange": {"max": 500}, "interval": "30s"},
        ],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_canary_failing_half_its_calls_is_rolled_back_by_the_real_success_rate() {
    let failing = Build {
        fail_percent: 50,
        delay_ms: 0,
    };
    // Four failed checks (8 s at least): the 2,000 calls at 20 % are counted before the
    // rollback (with two, a loaded CI machine once rolled back in the middle of the count).
    let mut setup = Setup::start(failing, analysis(4)).await;
    setup.initialized("").await;
    setup.served(&[200]).await;
    setup
        .scraped(r#"namespace="test",pod=~"podinfo-primary-.*""#, 2)
        .await;

    setup.release("podinfo:2").await;
    setup.permit_step(20).await;
    setup.served(&[50, 200]).await;
    // The load assignment of the 20 % step, read before the checks can roll it back.
    let clients = setup.server.xds_clients.clone().unwrap();
    let at_twenty = endpoint_nonce(&clients.list(), NODE_ID).unwrap();
    // The client uses what it acknowledged a moment later: counted from its first canary call.
    setup.client.settle("canary", 1).await;
    // A fifth of the calls reach the canary, which fails half of those.
    let counts = setup.client.count(2000).await;
    let canary = answers(&counts, "canary") + answers(&counts, "injected");
    assert_eq!(canary + answers(&counts, "primary"), 2000, "{counts}");
    assert!(canary.abs_diff(400) <= 100, "{counts}");
    assert!(
        answers(&counts, "injected").abs_diff(canary / 2) <= 1,
        "{counts}"
    );
    eprintln!("step 20%: the canary took {canary} of 2000 calls: {counts}");

    // The built-in success rate, on Prometheus's samples of the canary pods' counters, fails
    // four times (the threshold): rolled back.
    let failed = setup.wait_phase("Failed").await;
    let last = failed["status"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s["metrics"].is_array())
        .unwrap()
        .clone();
    let rate = metric(&last, "request-success-rate");
    assert_eq!(rate["ok"], false, "{last}");
    let value = rate["value"].as_f64().unwrap_or_else(|| panic!("{last}"));
    assert!((40.0..=60.0).contains(&value), "{last}");
    eprintln!("rolled back at success rate {value:.1}% (weight 20)");

    // Every call back on the primary, in one push: the client's next response after the 20%
    // one carried the primary alone.
    setup.served(&[200]).await;
    setup.client.settle("primary", 100).await;
    let after = setup.client.count(2000).await;
    assert_eq!(answers(&after, "primary"), 2000, "{after}");
    setup
        .api
        .wait_for_object("deployments", NS, "podinfo", WAIT, |d| {
            d.is_some_and(|d| d["spec"]["replicas"] == 0)
        })
        .await;
    assert_eq!(
        endpoint_nonce(&clients.list(), NODE_ID),
        Some(at_twenty + 1)
    );
    // No call failed but the canary build's own failures: the switch itself lost none.
    let totals = setup.client.totals().await;
    assert_eq!(answers(&totals, "error"), 0, "{totals}");
    eprintln!("calls over the run: {totals}");
    setup.server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_canary_is_promoted_with_the_traffic_following_each_step() {
    let slow = Build {
        fail_percent: 0,
        delay_ms: 5,
    };
    let mut setup = Setup::start(slow, analysis(3)).await;
    setup.initialized("").await;
    setup.served(&[200]).await;
    setup
        .scraped(r#"namespace="test",pod=~"podinfo-primary-.*""#, 2)
        .await;

    setup.release("podinfo:2").await;
    // The client called without pause while the canary's pods came up, ready at once: none of
    // its calls reached them before the first step.
    let before_first_step = setup.client.totals().await;
    assert_eq!(
        answers(&before_first_step, "canary"),
        0,
        "production calls on the canary before the release: {before_first_step}"
    );
    // Two canary pods against two primaries weigh round(100 p / (100 - p)) each.
    for (percent, weight) in [(20, 25), (40, 67), (60, 150)] {
        setup.permit_step(percent).await;
        let mut weights = vec![2 * weight, 200];
        weights.sort();
        setup.served(&weights).await;
        if percent == 20 {
            // The client uses what it acknowledged a moment later.
            setup.client.settle("canary", 1).await;
        }
        let counts = setup.client.count(2000).await;
        let canary = answers(&counts, "canary");
        assert_eq!(canary + answers(&counts, "primary"), 2000, "{counts}");
        assert!(
            canary.abs_diff(u64::from(percent) * 20) <= 100,
            "canary answered {canary} of 2000, wanted {percent}% +/- 5: {counts}"
        );
        // The checks passed at this weight on what Prometheus scraped: every call succeeded,
        // and the p99 shows the build's 5 ms.
        let step = setup.analysed_at(percent).await;
        let rate = metric(&step, "request-success-rate");
        let p99 = metric(&step, "request-duration");
        assert_eq!(rate["value"], 100.0, "{step}");
        assert_eq!(rate["ok"], true, "{step}");
        let p99_ms = p99["value"].as_f64().unwrap();
        assert!((5.0..500.0).contains(&p99_ms), "{step}");
        assert_eq!(p99["ok"], true, "{step}");
        eprintln!(
            "step {percent}%: canary answered {canary} of 2000 ({:.1}%); success rate {}, p99 {p99_ms:.1} ms",
            canary as f64 / 20.0,
            rate["value"]
        );
    }
    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    let done = setup.wait_phase("Succeeded").await;
    setup.served(&[200]).await;
    setup.client.settle("primary", 100).await;
    let after = setup.client.count(2000).await;
    assert_eq!(answers(&after, "primary"), 2000, "{after}");
    let totals = setup.client.totals().await;
    assert_eq!(answers(&totals, "error"), 0, "{totals}");
    assert_eq!(answers(&totals, "injected"), 0, "{totals}");
    eprintln!(
        "promoted; failed checks {}; calls over the run: {totals}",
        done["status"]["failedChecks"]
    );
    setup.server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ab_canary_takes_only_matching_calls_and_is_promoted_on_their_metrics() {
    // The route is written as soon as the canary's pods are ready, and Prometheus's discovery
    // batches new targets for up to 5 s before their first scrape: the first checks after the
    // route may find no data. Every 3 s with a threshold of 3 outlasts that (an operator's
    // intervals of a minute do by far).
    let mut analysis = analysis(3);
    analysis["interval"] = json!("3s");
    analysis["iterations"] = json!(3);
    analysis["match"] = json!([{"headers": {"x-canary": {"exact": "insider"}}}]);
    analysis.as_object_mut().unwrap().remove("stepWeight");
    analysis.as_object_mut().unwrap().remove("maxWeight");
    let mut setup = Setup::start(Build::default(), analysis).await;
    // The cohort calls the whole run: on the primary until the route is in place.
    setup.initialized("x-canary=insider").await;
    setup
        .scraped(r#"namespace="test",pod=~"podinfo-primary-.*""#, 2)
        .await;

    setup.release("podinfo:2").await;
    setup
        .api
        .wait_for_object("conditionroutes", NS, "podinfo-canary", WAIT, |r| {
            r.is_some()
        })
        .await;
    // Insiders reach the canary, and no one else does.
    setup
        .client
        .settle_with("canary", 100, "x-canary=insider")
        .await;
    let insiders = setup.client.count_with(2000, "x-canary=insider").await;
    assert_eq!(answers(&insiders, "canary"), 2000, "{insiders}");
    let others = setup.client.count_with(2000, "x-canary=outsider").await;
    assert_eq!(answers(&others, "primary"), 2000, "{others}");
    let plain = setup.client.count(2000).await;
    assert_eq!(answers(&plain, "primary"), 2000, "{plain}");
    // The iterations pass on the insiders' calls, as Prometheus scraped them.
    setup
        .client
        .settle_with("canary", 10, "x-canary=insider")
        .await;
    let waiting = setup.wait_phase("WaitingPromotion").await;
    assert!(
        waiting["status"]["iterations"].as_u64() >= Some(3),
        "{waiting}"
    );
    let step = setup.analysed_at(0).await;
    assert_eq!(
        metric(&step, "request-success-rate")["value"],
        100.0,
        "{step}"
    );
    assert_eq!(metric(&step, "request-duration")["ok"], true, "{step}");
    eprintln!(
        "A/B: insiders {insiders}, outsiders {others}, no header {plain}; failed checks {}",
        waiting["status"]["failedChecks"]
    );

    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    setup.wait_phase("Succeeded").await;
    setup
        .client
        .settle_with("primary", 100, "x-canary=insider")
        .await;
    let after = setup.client.count_with(2000, "x-canary=insider").await;
    assert_eq!(answers(&after, "primary"), 2000, "{after}");
    let totals = setup.client.totals().await;
    assert_eq!(answers(&totals, "error"), 0, "{totals}");
    setup.server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_metric_template_reads_an_https_prometheus_with_basic_auth_and_rolls_back() {
    use base64::Engine;
    let web = WebConfig::generate("canary", "s3cret-for-prometheus");
    let analysis = json!({
        "interval": "2s", "threshold": 2, "maxWeight": 60, "stepWeight": 20,
        "metrics": [{"name": "success", "templateRef": {"name": "success"},
                     "templateVariables": {"application": "podinfo"},
                     "thresholdRange": {"min": 99}, "interval": "30s"}],
    });
    let failing = Build {
        fail_percent: 50,
        delay_ms: 0,
    };
    let mut setup = Setup::start_with(failing, analysis, Some(&web)).await;
    // The template: Flagger's fields, the built-in success rate written out with its variables,
    // the address https, the credentials from a Secret.
    let pods = r#"namespace="{{ namespace }}",pod=~"{{ target }}-[0-9a-zA-Z]+(-[0-9a-zA-Z]+)",application_name="{{ variables.application }}""#;
    let query = format!(
        "sum(rate(dubbo_provider_requests_succeed_total{{{pods}}}[{{{{ interval }}}}])) \
         / sum(rate(dubbo_provider_requests_total{{{pods}}}[{{{{ interval }}}}])) * 100"
    );
    setup.api.put_object(
        "metrictemplates",
        NS,
        "success",
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "MetricTemplate",
               "metadata": {"name": "success", "namespace": NS},
               "spec": {"provider": {"type": "prometheus",
                                     "address": setup.prometheus.endpoint.address,
                                     "secretRef": {"name": "prom-auth"}},
                        "query": query}}),
    );
    let encode = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    setup.api.put_object(
        "secrets",
        NS,
        "prom-auth",
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "prom-auth", "namespace": NS},
               "data": {"username": encode(&web.username), "password": encode(&web.password)}}),
    );
    setup.initialized("").await;
    setup
        .scraped(r#"namespace="test",pod=~"podinfo-primary-.*""#, 2)
        .await;
    // Prometheus really asks: without credentials it refuses.
    let anonymous = Endpoint {
        credentials: None,
        ..setup.prometheus.endpoint.clone()
    };
    let refused = setup.prometheus.query_at(&anonymous, "up").await;
    assert!(
        matches!(refused, Err(QueryError::Status { status: 401, .. })),
        "{refused:?}"
    );

    setup.release("podinfo:2").await;
    setup.permit_step(20).await;
    setup.served(&[50, 200]).await;
    let failed = setup.wait_phase("Failed").await;
    let last = failed["status"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s["metrics"].is_array())
        .unwrap()
        .clone();
    let rate = metric(&last, "success");
    assert_eq!(rate["ok"], false, "{last}");
    let value = rate["value"].as_f64().unwrap_or_else(|| panic!("{last}"));
    assert!((40.0..=60.0).contains(&value), "{last}");
    eprintln!("https + basic auth: rolled back at success rate {value:.1}%");
    setup.served(&[200]).await;
    setup.client.settle("primary", 100).await;
    let totals = setup.client.totals().await;
    assert_eq!(answers(&totals, "error"), 0, "{totals}");
    setup.server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blue_green_canary_is_judged_on_test_traffic_then_takes_every_call_in_one_push() {
    // Judged every iteration, on the load tester's calls only: the first checks after the
    // canary's pods come up have no data until Prometheus discovers and scrapes them.
    let mut analysis = analysis(4);
    analysis["interval"] = json!("3s");
    analysis["iterations"] = json!(3);
    analysis.as_object_mut().unwrap().remove("stepWeight");
    analysis.as_object_mut().unwrap().remove("maxWeight");
    let mut setup = Setup::start(Build::default(), analysis).await;
    setup.initialized("").await;
    setup.served(&[200]).await;
    setup
        .scraped(r#"namespace="test",pod=~"podinfo-primary-.*""#, 2)
        .await;
    // A load tester calls the canary's pods directly, as `rollout` hooks would have one do.
    let canary_pods: Vec<String> = setup
        .ports
        .iter()
        .filter(|(ip, _)| ip.starts_with("127.0.1."))
        .map(|(ip, (grpc, _))| format!("{ip}:{grpc}"))
        .collect();
    let mut tester = Client::direct(&canary_pods);
    tester.settle("canary", 10).await;

    // No production call reaches the canary while the iterations pass on test traffic: not
    // while its pods come up (weight 0 before endpoints list them), nor after.
    let before_release = setup.client.totals().await;
    setup.release("podinfo:2").await;
    let during = setup.client.count(2000).await;
    assert_eq!(answers(&during, "primary"), 2000, "{during}");
    let since_release = setup.client.totals().await;
    assert_eq!(
        answers(&since_release, "canary"),
        answers(&before_release, "canary"),
        "production calls reached the canary's pods as they came up: before {before_release}, \
         after {since_release}"
    );
    let analysed = setup
        .api
        .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
            c.is_some_and(|c| c["status"]["iterations"].as_u64() >= Some(3))
        })
        .await
        .unwrap();
    assert_eq!(analysed["status"]["strategy"], "Blue/Green");
    assert_eq!(analysed["status"]["canaryWeight"], 0);
    let step = setup.analysed_at(0).await;
    assert_eq!(
        metric(&step, "request-success-rate")["value"],
        100.0,
        "{step}"
    );
    let clients = setup.server.xds_clients.clone().unwrap();
    let before = endpoint_nonce(&clients.list(), NODE_ID).unwrap();

    // The switch: every call on the canary, in one push.
    setup.permit_step(100).await;
    setup.client.settle("canary", 100).await;
    let switched = setup.client.count(2000).await;
    assert_eq!(answers(&switched, "canary"), 2000, "{switched}");
    assert_eq!(endpoint_nonce(&clients.list(), NODE_ID), Some(before + 1));
    eprintln!(
        "Blue/Green: before the switch {during}, after {switched}; failed checks {}",
        analysed["status"]["failedChecks"]
    );

    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    setup.wait_phase("Succeeded").await;
    setup.client.settle("primary", 100).await;
    let after = setup.client.count(2000).await;
    assert_eq!(answers(&after, "primary"), 2000, "{after}");
    let totals = setup.client.totals().await;
    assert_eq!(answers(&totals, "error"), 0, "{totals}");
    drop(tester);
    setup.server.stop().await.unwrap();
}
