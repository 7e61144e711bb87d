//! Canaries on the real API server judged on real traffic, one per strategy: one provider
//! process per pod (released grpcio on the pod's loopback IP, exporting Dubbo's provider
//! metrics; the canary's build may fail half its calls), Debian's Prometheus scraping them, a
//! released grpcio client over `xds:///podinfo` and a Dubbo SDK's consumer on the discovery
//! stream (`crate::traffic::sdk`) calling the whole run and counting who answered, and the real
//! binary's canary controller moving the traffic and querying that
//! Prometheus (the Canary's `prometheus.address`). Each scenario has its namespace and its
//! loopback subnets.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::common::gates::Gates;
use crate::common::kube_local::{Cluster, ControlPlane, control_plane};
use crate::traffic::sdk::SdkClient;
use crate::traffic::{Build, Client, Prometheus, Provider, WebConfig, answers};

const WAIT: Duration = Duration::from_secs(90);

/// The xDS server the clients read: a second control plane with no canary controller (the
/// shared one drives the Canaries) and no token review (the shared one wants a service-account
/// token over TLS, which grpcio sends only with an experimental flag).
/// Its (xDS, gRPC) addresses: xDS clients read the first, SDKs' discovery streams the second.
fn xds_plane(cluster: &Cluster) -> (SocketAddr, SocketAddr) {
    static PLANE: OnceLock<Mutex<ControlPlane>> = OnceLock::new();
    let plane = PLANE.get_or_init(|| {
        let plane = control_plane(
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
        crate::common::kube_local::reap_with_this_process(plane.child.id());
        Mutex::new(plane)
    });
    let plane = plane.lock().unwrap();
    (plane.xds().expect("xDS is on"), plane.grpc())
}

/// One run of Canaries at a time (these scenarios, and `e2e::canary`'s): each runs a
/// Prometheus, five grpcio processes and 2 s intervals on the shared control plane, and the
/// other tests of this binary share the two cores.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Setup {
    cluster: &'static Cluster,
    namespace: &'static str,
    /// The canary's pods are on 127.0.<subnet>.x, the primary's on 127.0.<subnet + 1>.x.
    subnet: u8,
    prometheus: Arc<Prometheus>,
    gates: Gates,
    /// A released grpcio client over `xds:///podinfo`.
    client: Client,
    /// A Dubbo SDK's consumer on the discovery stream, calling the same providers.
    sdk: SdkClient,
    /// Each pod IP's provider ports: (gRPC, metrics).
    ports: BTreeMap<String, (u16, u16)>,
    running: Arc<AtomicBool>,
    _providers: Vec<Provider>,
    /// Last: released once the processes above are stopped.
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
    }
}

impl Setup {
    /// Two primary pods running a healthy build and two canary pods running `canary`, scraped by
    /// a Prometheus of their own; Deployment `podinfo` and a Canary with `analysis` (plus the
    /// gates and that Prometheus) applied; a client on `xds:///podinfo` and an SDK client,
    /// idle until asked.
    async fn start(
        cluster: &'static Cluster,
        admin: kube::Client,
        namespace: &'static str,
        subnet: u8,
        canary: Build,
        analysis: Value,
    ) -> Setup {
        Setup::start_with(cluster, admin, namespace, subnet, canary, analysis, None).await
    }

    /// The same, Prometheus behind https and basic auth when `web` says so.
    async fn start_with(
        cluster: &'static Cluster,
        admin: kube::Client,
        namespace: &'static str,
        subnet: u8,
        canary: Build,
        mut analysis: Value,
        web: Option<&WebConfig>,
    ) -> Setup {
        let turn = ONE_AT_A_TIME.lock().await;
        cluster.namespace(namespace, &[]);
        let prometheus = Arc::new(Prometheus::start(web));
        let mut providers = Vec::new();
        let mut ports = BTreeMap::new();
        for (deployment, role, build) in [
            ("podinfo", "canary", canary),
            ("podinfo-primary", "primary", Build::default()),
        ] {
            for replica in 0..2 {
                let ip = pod_ip(subnet, deployment, replica);
                let provider = Provider::start(role, &ip, "podinfo", build).await;
                ports.insert(ip, (provider.grpc_port, provider.metrics_port));
                providers.push(provider);
            }
        }
        let running = Arc::new(AtomicBool::new(true));
        // The SDK's registry: the instances the endpoint controller below lists.
        let (registry, instances) = tokio::sync::watch::channel(Vec::new());
        play_controllers(
            cluster,
            admin,
            namespace,
            subnet,
            prometheus.clone(),
            Listing {
                ports: ports.clone(),
                registry,
            },
            running.clone(),
        );
        let (xds, dds) = xds_plane(cluster);
        let xds = xds.to_string();
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "podinfo", "namespace": namespace, "labels": {"app": "podinfo"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "podinfo"}},
                     "template": {"metadata": {"labels": {"app": "podinfo"}},
                                  "spec": {"containers": [{"name": "app", "image": "podinfo:1"}]}}},
        });
        cluster.kubectl_in(&["apply", "-f", "-"], Some(&deployment.to_string()));
        let gates = Gates::default();
        let gate = gates.serve().await;
        analysis["webhooks"] = json!([
            {"name": "step", "type": "confirm-traffic-increase", "url": format!("http://{gate}/step")},
            {"name": "promote", "type": "confirm-promotion", "url": format!("http://{gate}/promote")},
        ]);
        let canary = json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
            "metadata": {"name": "podinfo", "namespace": namespace},
            "spec": {
                "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                "progressDeadlineSeconds": 120,
                "prometheus": {"address": prometheus.endpoint.address},
                "analysis": analysis,
            },
        });
        cluster.kubectl_in(&["apply", "-f", "-"], Some(&canary.to_string()));
        let bootstrap = crate::common::bootstrap(&xds, namespace, namespace);
        let mut setup = Setup {
            cluster,
            namespace,
            subnet,
            prometheus,
            gates,
            client: Client::start("xds:///podinfo", bootstrap),
            sdk: SdkClient::start(dds, namespace, "podinfo", instances).await,
            ports,
            running,
            _providers: providers,
            _turn: turn,
        };
        setup.wait_phase("Initialized").await;
        // Every scenario starts with both clients on the primary. "None failed over the run"
        // counts from then: a client started while the Canary initialised may see a version
        // without endpoints.
        setup.settle_both("primary", 100, "").await;
        setup.client.reset_totals().await;
        setup.sdk.reset_totals().await;
        setup
    }

    fn status(&self) -> Value {
        self.cluster
            .get_json(&["canary", "podinfo", "-n", self.namespace])
            .map(|c| c["status"].clone())
            .unwrap_or(Value::Null)
    }

    /// Waits until the Canary's status passes `check`; a timeout shows the status.
    async fn wait_status(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let status = self.status();
            if check(&status) {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: timed out waiting for {what}; status {status}",
                self.namespace
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_phase(&self, phase: &str) -> Value {
        self.wait_status(&format!("phase {phase}"), |s| s["phase"] == phase)
            .await
    }

    /// Waits until Prometheus has `pods` targets matching `pods_regex` up.
    async fn scraped(&self, pods_regex: &str, pods: u32) {
        let query = format!(
            "count(up{{namespace=\"{}\",pod=~\"{pods_regex}\"}} == 1)",
            self.namespace
        );
        self.prometheus
            .wait_for_value(&query, |n| n == f64::from(pods))
            .await;
    }

    /// A new release: the canary's pods come up (no call yet) and are scraped.
    async fn release(&self) {
        self.cluster.kubectl_ok(&[
            "set",
            "image",
            "deployment/podinfo",
            "app=podinfo:2",
            "-n",
            self.namespace,
        ]);
        self.wait_phase("Progressing").await;
        self.scraped("podinfo-[0-9a-z]+-[0-9]+", 2).await;
    }

    /// Lets the next step through and waits until the Canary is at `percent`.
    async fn permit_step(&self, percent: u32) {
        self.gates.step.fetch_add(1, Ordering::SeqCst);
        self.wait_status(&format!("weight {percent}%"), |s| {
            s["canaryWeight"] == percent
        })
        .await;
    }

    /// Who answered the next `n` calls of the client `via`, each with `metadata`.
    async fn count(&mut self, via: Via, n: usize, metadata: &str) -> Value {
        match via {
            Via::Xds => self.client.count_with(n, metadata).await,
            Via::Sdk => self.sdk.count_with(n, metadata).await,
        }
    }

    /// Waits until `who` answered `run` calls of the client `via` in a row.
    async fn settle(&mut self, via: Via, who: &str, run: usize, metadata: &str) {
        match via {
            Via::Xds => self.client.settle_with(who, run, metadata).await,
            Via::Sdk => self.sdk.settle_with(who, run, metadata).await,
        };
    }

    /// [`Setup::count`] on both clients at the same time, so neither's share of a strategy's
    /// calls pauses while the other is counted.
    async fn count_both(&mut self, n: usize, metadata: &str) -> [Value; 2] {
        let (xds, dds) = tokio::join!(
            self.client.count_with(n, metadata),
            self.sdk.count_with(n, metadata)
        );
        [xds, dds]
    }

    /// [`Setup::settle`] on both clients.
    async fn settle_both(&mut self, who: &str, run: usize, metadata: &str) {
        for via in BOTH {
            self.settle(via, who, run, metadata).await;
        }
    }

    /// Calls until the canary answers at least `least` of 1,000 on each client (at most 20
    /// rounds): a client applies what it acknowledged a moment later, and the clients' control
    /// plane is another process, so the calls say when. The clients call at the same time: a
    /// failing canary's run is short.
    async fn converge(&mut self, least: u64) {
        let reached =
            |counts: &Value| answers(counts, "canary") + answers(counts, "injected") >= least;
        let (client, sdk) = (&mut self.client, &mut self.sdk);
        let xds = async {
            for _ in 0..20 {
                if reached(&client.count(1000).await) {
                    return true;
                }
            }
            false
        };
        let dds = async {
            for _ in 0..20 {
                if reached(&sdk.count(1000).await) {
                    return true;
                }
            }
            false
        };
        let (xds, dds) = tokio::join!(xds, dds);
        assert!(
            xds && dds,
            "the canary never answered {least} of 1000 calls (xDS {xds}, SDK {dds})"
        );
    }

    /// 2,000 calls on each client at the same time; the canary's share (its answers and its
    /// build's failures) within 5 points of `percent` on each.
    async fn assert_canary_share(&mut self, percent: u64) -> [Value; 2] {
        let [xds, dds] = self.count_both(2000, "").await;
        for (via, counts) in BOTH.into_iter().zip([&xds, &dds]) {
            let on_canary = answers(counts, "canary") + answers(counts, "injected");
            assert_eq!(
                on_canary + answers(counts, "primary"),
                2000,
                "{via:?}: {counts}"
            );
            assert!(
                on_canary.abs_diff(percent * 20) <= 100,
                "{} {via:?}: the canary took {on_canary} of 2000, wanted {percent}% +/- 5: {counts}",
                self.namespace
            );
            eprintln!(
                "{} {via:?} at {percent}%: the canary took {on_canary} of 2000 calls",
                self.namespace
            );
        }
        [xds, dds]
    }

    /// On each client: every call on the primary once it answered 100 in a row, and none
    /// failed over the run but the canary build's own.
    async fn ends_on_the_primary(&mut self) {
        for via in BOTH {
            self.settle(via, "primary", 100, "").await;
            let after = self.count(via, 2000, "").await;
            assert_eq!(answers(&after, "primary"), 2000, "{via:?}: {after}");
            let totals = match via {
                Via::Xds => self.client.totals().await,
                Via::Sdk => self.sdk.totals().await,
            };
            assert_eq!(answers(&totals, "error"), 0, "{via:?}: {totals}");
            eprintln!("{} {via:?}: calls over the run: {totals}", self.namespace);
        }
    }

    /// `host:port` of the canary's pods, for a load tester.
    fn canary_pods(&self) -> Vec<String> {
        let prefix = format!("127.0.{}.", self.subnet);
        self.ports
            .iter()
            .filter(|(ip, _)| ip.starts_with(&prefix))
            .map(|(ip, (grpc, _))| format!("{ip}:{grpc}"))
            .collect()
    }
}

/// Which client: the released grpcio one over xDS, or the SDK's on the discovery stream.
#[derive(Clone, Copy, Debug)]
enum Via {
    Xds,
    Sdk,
}

const BOTH: [Via; 2] = [Via::Xds, Via::Sdk];

/// The IP of a Deployment's pod by replica: the canary's (the target's) on 127.0.<subnet>.x,
/// the primary's on the next subnet, so each IP keeps its provider process.
fn pod_ip(subnet: u8, deployment: &str, replica: i32) -> String {
    let subnet = if deployment == "podinfo" {
        subnet
    } else {
        subnet + 1
    };
    format!("127.0.{subnet}.{}", replica + 1)
}

/// Who the endpoint controller may list: each pod IP's provider ports (gRPC, metrics), and
/// where it publishes the listed `ip:port`s for the SDK client (its registry).
struct Listing {
    ports: BTreeMap<String, (u16, u16)>,
    registry: tokio::sync::watch::Sender<Vec<SocketAddr>>,
}

/// Plays, until `running` turns false, the Deployment controller and kubelet, an endpoint
/// controller writing the ready pods that have a provider into ServiceEntry `podinfo`, and
/// Prometheus's discovery (each such pod's metrics port a target named after the pod).
fn play_controllers(
    cluster: &'static Cluster,
    client: kube::Client,
    namespace: &'static str,
    subnet: u8,
    prometheus: Arc<Prometheus>,
    listing: Listing,
    running: Arc<AtomicBool>,
) {
    let Listing { ports, registry } = listing;
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let ip = |deployment: &str, replica: i32| pod_ip(subnet, deployment, replica);
        let mut served = None;
        let mut scraped = None;
        while running.load(Ordering::Relaxed) {
            if let Err(e) = super::canary::reconcile(&client, namespace, &ip, true).await {
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
                let name = pod.metadata.name.unwrap_or_default();
                targets.push((addr, name, namespace.to_owned()));
            }
            // During a rolling update the old and the new pod of a replica share its IP.
            endpoints.sort_by_key(|e| e["address"].as_str().unwrap_or_default().to_owned());
            endpoints.dedup_by_key(|e| e["address"].clone());
            let listed: Vec<SocketAddr> = endpoints
                .iter()
                .filter_map(|e| {
                    let ip = e["address"].as_str()?.parse().ok()?;
                    Some(SocketAddr::new(ip, e["ports"]["grpc"].as_u64()? as u16))
                })
                .collect();
            registry.send_if_modified(|current| {
                let changed = *current != listed;
                *current = listed;
                changed
            });
            if served.as_ref() != Some(&endpoints) {
                let entry = json!({
                    "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "ServiceEntry",
                    "metadata": {"name": "podinfo", "namespace": namespace},
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
            targets.dedup_by_key(|t| t.0);
            if scraped.as_ref() != Some(&targets) {
                prometheus.set_targets(&targets);
                scraped = Some(targets);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// The built-in success-rate check every 2 s over 30 s (several scrapes at any step). A new
/// pod is scraped only once Prometheus's discovery passes it on (batched, up to 5 s): healthy
/// releases get a threshold of 10 so those first checks without data cannot fail them.
fn analysis(threshold: u32) -> Value {
    json!({
        "interval": "2s", "threshold": threshold, "maxWeight": 40, "stepWeight": 20,
        "metrics": [{"name": "request-success-rate", "thresholdRange": {"min": 99},
                     "interval": "30s"}],
    })
}

/// The last analysed step's success-rate result.
fn last_success_rate(status: &Value) -> Value {
    last_metric(status, "request-success-rate")
}

/// The last analysed step's first metric result, which must be `name`'s.
fn last_metric(status: &Value, name: &str) -> Value {
    let step = status["history"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s["metrics"].as_array().is_some_and(|m| !m.is_empty()))
        .cloned()
        .unwrap_or_else(|| panic!("no analysed step: {status}"));
    let rate = step["metrics"][0].clone();
    assert_eq!(rate["name"], name, "{step}");
    rate
}

/// Canary strategy, failing release: at 20 % the calls split as the weights say, the built-in
/// success rate read from the real Prometheus fails the checks, and the rollback returns every
/// call to the primary with none failed by the switch.
pub async fn a_failing_canary_is_rolled_back_by_real_metrics(
    cluster: &'static Cluster,
    admin: kube::Client,
) {
    let failing = Build {
        fail_percent: 50,
        delay_ms: 0,
    };
    // Five failed checks (10 s at least): both clients are counted at 20 % before the rollback.
    let mut setup = Setup::start(cluster, admin, "e2e-rollback", 7, failing, analysis(5)).await;
    setup.scraped("podinfo-primary-.*", 2).await;
    setup.release().await;
    setup.permit_step(20).await;
    setup.converge(100).await;
    // The canary's build fails half of what it gets, whoever sent it.
    for counts in setup.assert_canary_share(20).await {
        let canary = answers(&counts, "canary");
        assert!(
            answers(&counts, "injected").abs_diff(canary) <= canary / 4 + 20,
            "{counts}"
        );
    }

    let failed = setup.wait_phase("Failed").await;
    let rate = last_success_rate(&failed);
    assert_eq!(rate["ok"], false, "{failed}");
    let value = rate["value"].as_f64().unwrap_or_else(|| panic!("{failed}"));
    assert!((40.0..=60.0).contains(&value), "{failed}");
    eprintln!("e2e-rollback: rolled back at success rate {value:.1}% (weight 20)");
    setup.ends_on_the_primary().await;
    // On the SDK path the switch back was one push: the DynamicConfig after the last one that
    // weighed every canary pod above 0 gives each of them 0 (a switch in two pushes, one pod
    // at a time, would leave a push between with one pod still weighed).
    let pushes = setup.sdk.weight_pushes();
    let canary = |push: &BTreeMap<String, String>| -> Vec<(String, String)> {
        push.iter()
            .filter(|(ip, _)| ip.starts_with("127.0.7."))
            .map(|(ip, w)| (ip.clone(), w.clone()))
            .collect()
    };
    let weighed = pushes
        .iter()
        .rposition(|p| {
            let weights = canary(p);
            !weights.is_empty() && weights.iter().all(|(_, w)| w != "0")
        })
        .unwrap_or_else(|| panic!("no push weighed the canary: {pushes:?}"));
    let next = pushes
        .get(weighed + 1)
        .unwrap_or_else(|| panic!("no push after the weighted one: {pushes:?}"));
    for (ip, _) in canary(&pushes[weighed]) {
        assert_eq!(
            next.get(&ip).map(String::as_str),
            Some("0"),
            "{ip}: {pushes:?}"
        );
    }
    eprintln!(
        "e2e-rollback Sdk: weights at 20% {:?}, the next push {:?}",
        canary(&pushes[weighed]),
        canary(next)
    );
}

/// Canary strategy, healthy release: the calls follow each step, the checks pass on the real
/// counters, and the promotion puts every call back on the primary (now the new build).
pub async fn a_healthy_canary_is_promoted_step_by_step(
    cluster: &'static Cluster,
    admin: kube::Client,
) {
    let mut setup = Setup::start(
        cluster,
        admin,
        "e2e-promotion",
        9,
        Build::default(),
        analysis(10),
    )
    .await;
    setup.scraped("podinfo-primary-.*", 2).await;
    setup.release().await;
    // At 0 % the canary answers nothing; under 20 %, 300 of 1,000 is over six standard
    // deviations out.
    for (percent, least) in [(20, 100), (40, 300)] {
        setup.permit_step(percent).await;
        setup.converge(least).await;
        setup.assert_canary_share(u64::from(percent)).await;
    }
    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    let done = setup.wait_phase("Succeeded").await;
    let rate = last_success_rate(&done);
    assert_eq!(rate["ok"], true, "{done}");
    assert_eq!(rate["value"], 100.0, "{done}");
    setup.ends_on_the_primary().await;
}

/// A/B testing: only calls whose header the regex matches reach the canary, on both kinds of
/// client, judged on their counters.
pub async fn an_ab_canary_takes_only_the_matching_calls(
    cluster: &'static Cluster,
    admin: kube::Client,
) {
    let mut analysis = analysis(10);
    analysis["iterations"] = json!(2);
    // A regex, which reaches both kinds of client as the globs `insider,beta-*`.
    analysis["match"] = json!([{"headers": {"x-canary": {"regex": "insider|beta-.*"}}}]);
    analysis.as_object_mut().unwrap().remove("stepWeight");
    analysis.as_object_mut().unwrap().remove("maxWeight");
    let mut setup =
        Setup::start(cluster, admin, "e2e-abtest", 11, Build::default(), analysis).await;
    setup.settle_both("primary", 100, "x-canary=insider").await;
    setup.scraped("podinfo-primary-.*", 2).await;
    setup.release().await;
    setup.settle_both("canary", 100, "x-canary=insider").await;
    let insiders = setup.count_both(2000, "x-canary=insider").await;
    let betas = setup.count_both(500, "x-canary=beta-7").await;
    let others = setup.count_both(2000, "x-canary=outsider").await;
    let plain = setup.count_both(2000, "").await;
    for (at, via) in BOTH.into_iter().enumerate() {
        let (insiders, betas, others, plain) = (&insiders[at], &betas[at], &others[at], &plain[at]);
        assert_eq!(answers(insiders, "canary"), 2000, "{via:?}: {insiders}");
        assert_eq!(answers(betas, "canary"), 500, "{via:?}: {betas}");
        assert_eq!(answers(others, "primary"), 2000, "{via:?}: {others}");
        assert_eq!(answers(plain, "primary"), 2000, "{via:?}: {plain}");
        eprintln!("e2e-abtest {via:?}: insiders {insiders}, outsiders {others}, no header {plain}");
    }
    // The cohort keeps calling while the iterations pass on its counters.
    setup.settle_both("canary", 10, "x-canary=insider").await;
    let waiting = setup.wait_phase("WaitingPromotion").await;
    assert_eq!(waiting["strategy"], "A/B", "{waiting}");
    // kubectl's columns name the strategy and the match.
    let listed = setup
        .cluster
        .kubectl_ok(&["get", "canaries", "-n", setup.namespace]);
    let row = listed
        .lines()
        .find(|line| line.starts_with("podinfo "))
        .unwrap_or_default();
    assert!(
        listed.contains("MATCH")
            && row.contains("A/B")
            && row.contains("x-canary regex insider|beta-.*"),
        "{listed}"
    );
    let rate = last_success_rate(&waiting);
    assert_eq!(rate["value"], 100.0, "{waiting}");
    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    setup.wait_phase("Succeeded").await;
    setup.settle_both("primary", 100, "x-canary=insider").await;
    let after = setup.count_both(2000, "x-canary=insider").await;
    for (via, after) in BOTH.into_iter().zip(&after) {
        assert_eq!(answers(after, "primary"), 2000, "{via:?}: {after}");
    }
    setup.ends_on_the_primary().await;
}

/// Blue/Green: no production call on the canary while a load tester's calls are judged, then
/// every call at once.
pub async fn a_blue_green_canary_switches_every_call_at_once(
    cluster: &'static Cluster,
    admin: kube::Client,
) {
    let mut analysis = analysis(10);
    analysis["iterations"] = json!(2);
    analysis.as_object_mut().unwrap().remove("stepWeight");
    analysis.as_object_mut().unwrap().remove("maxWeight");
    let mut setup = Setup::start(
        cluster,
        admin,
        "e2e-bluegreen",
        13,
        Build::default(),
        analysis,
    )
    .await;
    setup.scraped("podinfo-primary-.*", 2).await;
    // A load tester calls the canary's pods directly, as `rollout` hooks would have one do.
    let mut tester = Client::direct(&setup.canary_pods());
    tester.settle("canary", 10).await;
    setup.release().await;
    let during = setup.count_both(2000, "").await;
    for (via, during) in BOTH.into_iter().zip(&during) {
        assert_eq!(answers(during, "primary"), 2000, "{via:?}: {during}");
    }
    let analysed = setup
        .wait_status("two iterations", |s| s["iterations"].as_u64() >= Some(2))
        .await;
    assert_eq!(analysed["strategy"], "Blue/Green", "{analysed}");
    assert_eq!(analysed["canaryWeight"], 0, "{analysed}");
    // The switch: every call on the canary.
    setup.permit_step(100).await;
    setup.settle_both("canary", 100, "").await;
    let switched = setup.count_both(2000, "").await;
    for (via, switched) in BOTH.into_iter().zip(&switched) {
        assert_eq!(answers(switched, "canary"), 2000, "{via:?}: {switched}");
        eprintln!("e2e-bluegreen {via:?}: after the switch {switched}");
    }
    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    setup.wait_phase("Succeeded").await;
    setup.ends_on_the_primary().await;
    drop(tester);
}

/// A MetricTemplate on an https Prometheus with basic auth, its credentials in a Secret the
/// real binary reads through deploy/'s RBAC, rolls a failing canary back; an AlertProvider whose
/// address is in a Secret gets the rollback's alert (type `webhook`: the Canary as JSON).
pub async fn a_metric_template_on_an_https_prometheus_rolls_back_and_alerts(
    cluster: &'static Cluster,
    admin: kube::Client,
) {
    use base64::Engine;
    let web = WebConfig::generate("canary", "s3cret-for-prometheus");
    let mut analysis = json!({
        "interval": "2s", "threshold": 3, "maxWeight": 40, "stepWeight": 20,
        "metrics": [{"name": "success", "templateRef": {"name": "success"},
                     "thresholdRange": {"min": 99}, "interval": "30s"}],
        "alerts": [{"name": "on-call", "severity": "error", "providerRef": {"name": "on-call"}}],
    });
    analysis["metrics"][0]["templateVariables"] = json!({"application": "podinfo"});
    let failing = Build {
        fail_percent: 50,
        delay_ms: 0,
    };
    let namespace = "e2e-template";
    let mut setup =
        Setup::start_with(cluster, admin, namespace, 15, failing, analysis, Some(&web)).await;
    let (received, mut alerts) = tokio::sync::watch::channel(Vec::<Value>::new());
    let receiver = {
        let app = axum::Router::new().fallback(axum::routing::post(
            move |axum::Json(body): axum::Json<Value>| async move {
                received.send_modify(|all| all.push(body));
                axum::http::StatusCode::OK
            },
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    };
    let encode = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    let pods = r#"namespace="{{ namespace }}",pod=~"{{ target }}-[0-9a-zA-Z]+(-[0-9a-zA-Z]+)",application_name="{{ variables.application }}""#;
    let query = format!(
        "sum(rate(dubbo_provider_requests_succeed_total{{{pods}}}[{{{{ interval }}}}])) \
         / sum(rate(dubbo_provider_requests_total{{{pods}}}[{{{{ interval }}}}])) * 100"
    );
    for object in [
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "prom-auth", "namespace": namespace},
               "data": {"username": encode(&web.username), "password": encode(&web.password)}}),
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "MetricTemplate",
               "metadata": {"name": "success", "namespace": namespace},
               "spec": {"provider": {"type": "prometheus",
                                     "address": setup.prometheus.endpoint.address,
                                     "secretRef": {"name": "prom-auth"},
                                     // The control plane does not know this test's CA.
                                     "insecureSkipVerify": true},
                        "query": query}}),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "on-call-url", "namespace": namespace},
               "data": {"address": encode(&format!("http://{receiver}/alerts"))}}),
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "AlertProvider",
               "metadata": {"name": "on-call", "namespace": namespace},
               "spec": {"type": "webhook", "secretRef": {"name": "on-call-url"}}}),
    ] {
        cluster.kubectl_in(&["apply", "-f", "-"], Some(&object.to_string()));
    }
    setup.scraped("podinfo-primary-.*", 2).await;
    setup.release().await;
    setup.permit_step(20).await;
    setup.converge(100).await;
    let failed = setup.wait_phase("Failed").await;
    let rate = last_metric(&failed, "success");
    assert_eq!(rate["ok"], false, "{failed}");
    let value = rate["value"].as_f64().unwrap_or_else(|| panic!("{failed}"));
    assert!((40.0..=60.0).contains(&value), "{failed}");
    eprintln!("e2e-template: rolled back at success rate {value:.1}% (https, basic auth)");
    // The alert reaches the Secret's address (the sender posts a moment after the status).
    let rollback = |a: &Value| a["canary"]["status"]["phase"] == "Failed";
    let waited = tokio::time::timeout(WAIT, alerts.wait_for(|all| all.iter().any(rollback)))
        .await
        .map(|seen| seen.is_ok());
    assert_eq!(waited, Ok(true), "no rollback alert: {:?}", alerts.borrow());
    let alert = alerts
        .borrow()
        .iter()
        .find(|a| rollback(a))
        .cloned()
        .unwrap();
    assert_eq!(alert["metadata"]["severity"], "error", "{alert}");
    assert_eq!(
        alert["canary"]["metadata"]["namespace"], namespace,
        "{alert}"
    );
    eprintln!("e2e-template: alert {}", alert["metadata"]);
    setup.ends_on_the_primary().await;
}
