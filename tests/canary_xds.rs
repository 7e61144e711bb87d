//! A Canary moves real traffic on a released xDS client (grpcio), step by step, and a rollback
//! returns all of it to the primary in one push. Kubernetes mode on the API-server fixture (a
//! real API server refuses loopback addresses in EndpointSlices): the test plays the Deployment
//! controller, the kubelet (pods with loopback IPs, each served by a backend process answering
//! its role) and the EndpointSlice controller (one slice per ready pod of Service `podinfo`).
//! The canary controller writes its weights as usual; the xDS edge serves them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../crates/xds/tests/support/released.rs"]
mod released;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use common::apiserver::ApiServer;
use common::gates::{Gates, acked_weights, endpoint_nonce};
use common::{start, wait_ready};
use released::{Proc, Released, answers, backend_on, count};
use serde_json::{Value, json};

const NS: &str = "test";
const WAIT: Duration = Duration::from_secs(30);
const NODE_ID: &str = "canary-xds";

/// Pod IPs: the target's (the canary's, once a run starts) and the primary's.
fn ip_prefix(deployment: &str) -> &'static str {
    match deployment {
        "podinfo" => "127.0.1.",
        _ => "127.0.2.",
    }
}

/// Plays the Deployment controller and kubelet (ready pods with IPs for every Deployment whose
/// spec moved) and the EndpointSlice controller (a slice per ready pod whose IP has a backend in
/// `ports`), every 20 ms.
fn cluster_controllers(api: &ApiServer, ports: BTreeMap<String, u16>) {
    let api = api.clone();
    tokio::spawn(async move {
        let mut served: BTreeMap<String, Value> = BTreeMap::new();
        loop {
            api.roll_out_changed(NS, |name| ip_prefix(name).to_owned());
            let mut wanted: BTreeMap<String, Value> = BTreeMap::new();
            for pod in api.objects_of("pods", NS) {
                let Some(ip) = pod["status"]["podIP"].as_str() else {
                    continue;
                };
                let Some(port) = ports.get(ip) else { continue };
                let name = format!("podinfo-{}", ip.replace('.', "-"));
                let slice = json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": NS,
                                 "labels": {"kubernetes.io/service-name": "podinfo"}},
                    "addressType": "IPv4",
                    "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
                });
                wanted.insert(name, slice);
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
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Prometheus answering every instant query with one value the test sets (the success rate).
async fn prometheus(value: Arc<Mutex<f64>>) -> SocketAddr {
    async fn query(State(value): State<Arc<Mutex<f64>>>) -> axum::Json<Value> {
        let v = *value.lock().unwrap();
        axum::Json(json!({"status": "success", "data": {"resultType": "vector",
            "result": [{"metric": {}, "value": [1_700_000_000.0, v.to_string()]}]}}))
    }
    let app = axum::Router::new()
        .route("/api/v1/query", axum::routing::get(query).post(query))
        .with_state(value);
    serve(app).await
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// `analysis` with the gates as its `confirm-traffic-increase` (`/step`) and
/// `confirm-promotion` (`/promote`) hooks.
fn with_gates(mut analysis: Value, gate: SocketAddr) -> Value {
    analysis["webhooks"] = json!([
        {"name": "step", "type": "confirm-traffic-increase", "url": format!("http://{gate}/step")},
        {"name": "promote", "type": "confirm-promotion", "url": format!("http://{gate}/promote")},
    ]);
    analysis["metrics"] = json!([{"name": "request-success-rate",
                                  "thresholdRange": {"min": 99}, "interval": "1m"}]);
    analysis
}

struct Setup {
    api: ApiServer,
    server: dubbo_cp::server::RunningServer,
    gates: Gates,
    success: Arc<Mutex<f64>>,
    client: Proc,
    _backends: Vec<Proc>,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// The cluster, the backends, the control plane and a Canary with `analysis` (its webhooks
    /// are the gates; `{gate}` in them is replaced by the gates' address).
    async fn start(analysis: Value) -> Setup {
        let mut backends = Vec::new();
        let mut ports = BTreeMap::new();
        for (role, prefix) in [("canary", "127.0.1."), ("primary", "127.0.2.")] {
            for i in 1..=2 {
                let ip = format!("{prefix}{i}");
                let (proc, port) = backend_on(Released::Grpcio, role, &ip).await;
                ports.insert(ip, port);
                backends.push(proc);
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
        cluster_controllers(&api, ports);
        let success = Arc::new(Mutex::new(100.0));
        let prometheus = prometheus(success.clone()).await;
        let gates_ = Gates::default();
        let gate = gates_.serve().await;
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
                    "analysis": with_gates(analysis, gate),
                },
            }),
        );
        let dir = tempfile::tempdir().unwrap();
        let config = common::canary_config(dir.path(), api.url(), format!("http://{prometheus}"));
        let server = start(config).await;
        wait_ready(server.admin_addr).await;
        let xds = server.xds_addr.expect("xDS is on").to_string();
        let bootstrap = common::bootstrap(&xds, NS, NODE_ID);
        let client = released::client_with(Released::Grpcio, "xds:///podinfo", bootstrap);
        Setup {
            api,
            server,
            gates: gates_,
            success,
            client,
            _backends: backends,
            _dir: dir,
        }
    }

    async fn wait_phase(&self, phase: &str) {
        self.api
            .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
                c.is_some_and(|c| c["status"]["phase"] == phase)
            })
            .await;
    }

    /// Waits until the client acknowledged a load assignment with these locality weights.
    async fn served(&self, weights: &[u32]) {
        let clients = self.server.xds_clients.clone().unwrap();
        let wait =
            clients.wait_for(|list| acked_weights(list, NODE_ID).as_deref() == Some(weights));
        tokio::time::timeout(WAIT, wait).await.unwrap_or_else(|_| {
            panic!(
                "weights {weights:?} never acknowledged; last {:?} of {:?}",
                acked_weights(&clients.list(), NODE_ID),
                clients.list()
            )
        });
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

    /// Lets the next step through and waits until the client holds its weights.
    async fn step(&self, percent: u32, weights: &[u32]) {
        self.permit_step(percent).await;
        self.served(weights).await;
    }

    /// 2,000 calls: the canary answers `percent` of them within 5 points, none fails.
    async fn assert_canary_share(&mut self, percent: u64) {
        let counts = count(&mut self.client, 2000).await;
        let canary = answers(&counts, "canary");
        assert_eq!(canary + answers(&counts, "primary"), 2000, "{counts}");
        assert!(
            canary.abs_diff(percent * 20) <= 100,
            "canary answered {canary} of 2000, wanted {percent}% +/- 5: {counts}"
        );
    }
}

/// The dashboard's block for the Canary once `ready` (JavaScript over `c`, the block) holds:
/// its strategy, its text and the phases its chart bands.
async fn dashboard(admin: SocketAddr, ready: &'static str) -> (String, String, Vec<String>) {
    tokio::task::spawn_blocking(move || {
        let mut browser = common::browser::Browser::open(&format!("http://{admin}/ui"));
        let block =
            r#"document.querySelector('div.canary[data-namespace="test"][data-name="podinfo"]')"#;
        browser.wait_for(&format!("((c) => c !== null && ({ready}))({block})"));
        let read = |browser: &mut common::browser::Browser, what: &str| {
            browser.evaluate(&format!("((c) => {what})({block})"))
        };
        let strategy = read(&mut browser, "c.dataset.strategy");
        let text = read(&mut browser, "c.textContent");
        let bands = read(
            &mut browser,
            "Array.from(c.querySelectorAll('rect.phase-band'), r => r.dataset.phase)",
        );
        (
            strategy.as_str().unwrap().to_owned(),
            text.as_str().unwrap().to_owned(),
            serde_json::from_value(bands).unwrap(),
        )
    })
    .await
    .unwrap()
}

/// Bands name a run's phases in the order a run goes through them, each once.
fn assert_phase_order(bands: &[String]) {
    const ORDER: [&str; 5] = [
        "Progressing",
        "WaitingPromotion",
        "Promoting",
        "Finalising",
        "Succeeded",
    ];
    let at: Vec<Option<usize>> = bands
        .iter()
        .map(|b| ORDER.iter().position(|o| o == b))
        .collect();
    assert!(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        "phases out of order: {bands:?}"
    );
}

fn canary_analysis() -> Value {
    json!({"interval": "300ms", "threshold": 2, "maxWeight": 60, "stepWeight": 20})
}

#[tokio::test(flavor = "multi_thread")]
async fn canary_steps_move_xds_traffic_and_a_rollback_returns_it_in_one_push() {
    let mut setup = Setup::start(canary_analysis()).await;
    setup.wait_phase("Initialized").await;
    // The primary's two pods at Dubbo's default weight, one locality of 2 x 100 (the client
    // connects with its first call).
    released::settle(&mut setup.client, "primary", 100, "").await;
    setup.served(&[200]).await;
    setup.assert_canary_share(0).await;

    // A new release: the canary's pods come up at weight 0 (no calls), then each permitted
    // step moves the calls the canary gets: two canary pods against two primaries weigh
    // round(100 p / (100 - p)) each (25, 67, 150), sent as one locality of 2 x w.
    setup.api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_phase("Progressing").await;
    for (percent, weight) in [(20, 25), (40, 67), (60, 150)] {
        let mut weights = vec![2 * weight, 200];
        weights.sort();
        setup.step(percent, &weights).await;
        setup.assert_canary_share(u64::from(percent)).await;
    }
    // Promoted once the gate says so: the primary runs the new release and takes every call
    // again.
    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    setup.wait_phase("Succeeded").await;
    setup.served(&[200]).await;
    setup.assert_canary_share(0).await;

    // A release that fails its analysis at 20%: rolled back, every call on the primary at once.
    setup.api.set_image(NS, "podinfo", "podinfo:3");
    setup.wait_phase("Progressing").await;
    setup.step(20, &[50, 200]).await;
    setup.assert_canary_share(20).await;
    let clients = setup.server.xds_clients.clone().unwrap();
    let at_twenty = endpoint_nonce(&clients.list(), NODE_ID).unwrap();
    *setup.success.lock().unwrap() = 50.0;
    setup.wait_phase("Failed").await;
    setup.served(&[200]).await;
    released::settle(&mut setup.client, "primary", 100, "").await;
    setup.assert_canary_share(0).await;
    // One push between the two: the client's next response after the 20% one (of any type;
    // nothing else changed) carried the primary alone. The canary's pods leave the endpoints
    // afterwards, which changes no load assignment: weight 0 already took them out.
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
    drop(setup.client.child.start_kill());
    setup.server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ab_run_sends_only_matching_calls_to_the_canary_until_promoted() {
    let mut setup = Setup::start(json!({
        "interval": "300ms", "threshold": 2, "iterations": 3,
        "match": [{"headers": {"x-canary": {"exact": "insider"}}}],
    }))
    .await;
    setup.wait_phase("Initialized").await;
    released::settle(&mut setup.client, "primary", 100, "").await;
    setup.api.set_image(NS, "podinfo", "podinfo:2");
    // The route exists once the canary's pods are ready; the gate holds the promotion.
    released::settle(&mut setup.client, "canary", 100, "x-canary=insider").await;
    let insiders = released::count_with(&mut setup.client, 2000, "x-canary=insider").await;
    assert_eq!(answers(&insiders, "canary"), 2000, "{insiders}");
    let others = released::count_with(&mut setup.client, 2000, "x-canary=outsider").await;
    assert_eq!(answers(&others, "primary"), 2000, "{others}");
    setup.assert_canary_share(0).await;
    // The rule both kinds of client read: a ConditionRoute owned by the Canary.
    let route = setup
        .api
        .object("conditionroutes", NS, "podinfo-canary")
        .expect("the A/B route");
    assert_eq!(
        route["spec"]["conditions"][0],
        "attachments[x-canary]=insider => host=127.0.1.1,127.0.1.2"
    );
    let status = setup
        .api
        .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
            c.is_some_and(|c| c["status"]["phase"] == "WaitingPromotion")
        })
        .await
        .unwrap();
    assert_eq!(status["status"]["strategy"], "A/B");
    // What `kubectl get canaries` shows in its Match column.
    assert_eq!(status["status"]["match"], "x-canary=insider");
    assert!(
        status["status"]["iterations"].as_u64() >= Some(3),
        "{status}"
    );
    assert_eq!(status["status"]["canaryWeight"], 0);
    // The dashboard says what the run does and bands its iterations.
    let (strategy, text, bands) = dashboard(
        setup.server.admin_addr,
        "c.textContent.includes('WaitingPromotion') \
         && c.querySelector('rect.phase-band[data-phase=\"Progressing\"]') !== null",
    )
    .await;
    assert_eq!(strategy, "A/B");
    assert!(
        text.contains("A/B · iteration ")
            && text.contains("canary gets calls with x-canary=insider"),
        "{text}"
    );
    // Every band is a phase of this run, in the order a run goes through them.
    assert_phase_order(&bands);

    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    setup.wait_phase("Succeeded").await;
    released::settle(&mut setup.client, "primary", 100, "x-canary=insider").await;
    let insiders = released::count_with(&mut setup.client, 500, "x-canary=insider").await;
    assert_eq!(answers(&insiders, "primary"), 500, "{insiders}");
    setup
        .api
        .wait_for_object("conditionroutes", NS, "podinfo-canary", WAIT, |r| {
            r.is_none()
        })
        .await;

    // A release failing its analysis: rolled back, the route goes and insiders are back on the
    // primary.
    setup.api.set_image(NS, "podinfo", "podinfo:3");
    released::settle(&mut setup.client, "canary", 100, "x-canary=insider").await;
    *setup.success.lock().unwrap() = 50.0;
    setup.wait_phase("Failed").await;
    setup
        .api
        .wait_for_object("conditionroutes", NS, "podinfo-canary", WAIT, |r| {
            r.is_none()
        })
        .await;
    released::settle(&mut setup.client, "primary", 100, "x-canary=insider").await;
    let insiders = released::count_with(&mut setup.client, 500, "x-canary=insider").await;
    assert_eq!(answers(&insiders, "primary"), 500, "{insiders}");
    drop(setup.client.child.start_kill());
    setup.server.stop().await.unwrap();
}

/// A `regex` match becomes the Dubbo globs matching the same values (`insider|beta-.*` is
/// `insider,beta-*`), which the xDS client routes by.
#[tokio::test(flavor = "multi_thread")]
async fn an_ab_regex_match_routes_the_values_it_matches_to_the_canary() {
    let mut setup = Setup::start(json!({
        "interval": "300ms", "threshold": 2, "iterations": 3,
        "match": [{"headers": {"x-canary": {"regex": "insider|beta-.*"}}}],
    }))
    .await;
    setup.wait_phase("Initialized").await;
    released::settle(&mut setup.client, "primary", 100, "").await;
    setup.api.set_image(NS, "podinfo", "podinfo:2");
    released::settle(&mut setup.client, "canary", 100, "x-canary=beta-7").await;
    for (metadata, who) in [
        ("x-canary=insider", "canary"),
        ("x-canary=beta-7", "canary"),
        ("x-canary=beta-", "canary"),
        ("x-canary=outsider", "primary"),
        ("x-canary=beta", "primary"),
        ("x-canary=insider-7", "primary"),
        ("", "primary"),
    ] {
        let counts = released::count_with(&mut setup.client, 200, metadata).await;
        assert_eq!(answers(&counts, who), 200, "{metadata}: {counts}");
    }
    let route = setup
        .api
        .object("conditionroutes", NS, "podinfo-canary")
        .expect("the A/B route");
    assert_eq!(
        route["spec"]["conditions"][0],
        "attachments[x-canary]=insider,beta-* => host=127.0.1.1,127.0.1.2"
    );
    drop(setup.client.child.start_kill());
    setup.server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blue_green_run_analyses_on_test_traffic_then_switches_every_call_in_one_push() {
    let mut setup =
        Setup::start(json!({"interval": "300ms", "threshold": 2, "iterations": 2})).await;
    setup.wait_phase("Initialized").await;
    released::settle(&mut setup.client, "primary", 100, "").await;
    setup.served(&[200]).await;
    setup.api.set_image(NS, "podinfo", "podinfo:2");
    // The iterations pass on test traffic only: no production call reaches the canary.
    let analysed = setup
        .api
        .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
            c.is_some_and(|c| c["status"]["iterations"].as_u64() >= Some(2))
        })
        .await
        .unwrap();
    assert_eq!(analysed["status"]["strategy"], "Blue/Green");
    assert_eq!(analysed["status"]["canaryWeight"], 0);
    setup.assert_canary_share(0).await;
    let clients = setup.server.xds_clients.clone().unwrap();
    let before = endpoint_nonce(&clients.list(), NODE_ID).unwrap();

    // The switch: every call on the canary, the primaries at weight 0, in one push. (Its
    // locality weights, 2 x 100, read like the primary's before: the calls tell them apart.)
    setup.permit_step(100).await;
    released::settle(&mut setup.client, "canary", 100, "").await;
    let all = count(&mut setup.client, 2000).await;
    assert_eq!(answers(&all, "canary"), 2000, "{all}");
    assert_eq!(endpoint_nonce(&clients.list(), NODE_ID), Some(before + 1));

    // Promoted: the primary runs the new release and takes every call back.
    setup.gates.promote.fetch_add(1, Ordering::SeqCst);
    setup.wait_phase("Succeeded").await;
    released::settle(&mut setup.client, "primary", 100, "").await;
    setup.assert_canary_share(0).await;
    // The dashboard: the analysis at 0, the switch to 100, then the promotion's phases.
    let (strategy, text, bands) = dashboard(
        setup.server.admin_addr,
        "c.textContent.includes('Succeeded') \
         && c.querySelector('circle.step[data-weight=\"100\"]') !== null",
    )
    .await;
    assert_eq!(strategy, "Blue/Green");
    assert!(
        text.contains("Blue/Green · iteration ") && text.contains("test traffic only"),
        "{text}"
    );
    assert_eq!(
        bands.first().map(String::as_str),
        Some("Progressing"),
        "{bands:?}"
    );
    assert!(bands.len() >= 2, "the promotion's phases follow: {bands:?}");
    drop(setup.client.child.start_kill());
    setup.server.stop().await.unwrap();
}

/// 1,000 callers of 3 calls each, told apart by `x-user`: every caller answered by one role;
/// the callers on the canary.
async fn canary_callers(client: &mut Proc) -> (Value, Vec<String>) {
    use tokio::io::AsyncWriteExt;
    client
        .stdin
        .write_all(b"callers 1000 3 x-user\n")
        .await
        .unwrap();
    let callers: Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(
        answers(&callers, "canary") + answers(&callers, "primary"),
        1000,
        "every caller kept one role: {callers}"
    );
    let on_canary = callers["by"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, who)| *who == "canary")
        .map(|(caller, _)| caller.clone())
        .collect();
    (callers, on_canary)
}

/// Calls until the canary answers at least `least` of 1,000 (at most 20 rounds): the client
/// applies what it acknowledged a moment later, and a caller counted across the change would
/// meet both versions.
async fn converge(client: &mut Proc, least: u64) {
    for _ in 0..20 {
        if answers(&count(client, 1000).await, "canary") >= least {
            return;
        }
    }
    panic!("the canary never answered {least} of 1000 calls");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_affinity_keeps_each_caller_on_its_version_while_the_canary_grows() {
    let mut analysis = canary_analysis();
    analysis["sessionAffinity"] = json!({"headerName": "x-user"});
    let mut setup = Setup::start(analysis).await;
    setup.wait_phase("Initialized").await;
    released::settle(&mut setup.client, "primary", 100, "").await;
    setup.api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_phase("Progressing").await;
    // On a ring each pod weighs its own weight: two canary pods of 25 (then 67) against two
    // primaries of 100, one locality per weight. Converged once the canary answers over 10 %
    // (at 0 % it answers nothing) then over 30 % (at 20 %, 30 % of 1,000 is six standard
    // deviations out).
    let mut before: Vec<String> = Vec::new();
    for (percent, weight, least) in [(20, 25, 100), (40, 67, 300)] {
        setup.step(percent, &[weight, 100]).await;
        converge(&mut setup.client, least).await;
        let (callers, on_canary) = canary_callers(&mut setup.client).await;
        // 1,000 callers: 10 points is over five standard deviations (binomial and ring).
        assert!(
            (on_canary.len() as u64).abs_diff(10 * u64::from(percent)) <= 100,
            "{} of 1000 callers on the canary at {percent}%: {callers}",
            on_canary.len()
        );
        let left: Vec<&String> = before.iter().filter(|c| !on_canary.contains(c)).collect();
        assert!(left.is_empty(), "callers that left the canary: {left:?}");
        before = on_canary;
        // Calls without the header still split by weight: 4,000 calls, 5 points.
        let counts = count(&mut setup.client, 4000).await;
        let canary = answers(&counts, "canary");
        assert_eq!(canary + answers(&counts, "primary"), 4000, "{counts}");
        assert!(
            canary.abs_diff(40 * u64::from(percent)) <= 200,
            "canary answered {canary} of 4000 at {percent}%: {counts}"
        );
    }
    // The operator's view says so.
    let (_, text, _) = dashboard(
        setup.server.admin_addr,
        "c.textContent.includes('each caller kept by header x-user')",
    )
    .await;
    assert!(text.contains("Canary · weight steps to 60%"), "{text}");
    // Rolled back: the rule goes, every caller is on the primary.
    *setup.success.lock().unwrap() = 50.0;
    setup.wait_phase("Failed").await;
    setup.served(&[200]).await;
    released::settle(&mut setup.client, "primary", 100, "").await;
    let (callers, on_canary) = canary_callers(&mut setup.client).await;
    assert!(on_canary.is_empty(), "{callers}");
    drop(setup.client.child.start_kill());
    setup.server.stop().await.unwrap();
}
