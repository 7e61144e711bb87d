//! The canary controller (rollout.md) against the API-server fixture. The tests play the
//! Deployment controller and the kubelet (a task that rolls out every Deployment whose spec
//! moved, with ready pods and IPs), run a Prometheus stub answering `/api/v1/query` from a table
//! they control, and local HTTP hook receivers.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use common::apiserver::ApiServer;
use common::{Observer, start, type_of, wait_ready};
use dubbo_cp::config::Config;
use prost::Message;
use serde_json::{Value, json};

const NS: &str = "test";
const WAIT: Duration = Duration::from_secs(20);

// ---- the Prometheus stub ----

/// Answers instant queries: the first table entry whose key the query contains gives the
/// value; `None` (or no entry) answers an empty vector, "no data".
/// (a substring of the query, the value it answers).
type Table = Vec<(String, Option<f64>)>;

#[derive(Clone, Default)]
struct PrometheusStub {
    table: Arc<Mutex<Table>>,
    queries: Arc<Mutex<Vec<String>>>,
}

impl PrometheusStub {
    async fn start(&self) -> SocketAddr {
        async fn query(
            State(stub): State<PrometheusStub>,
            Query(params): Query<BTreeMap<String, String>>,
        ) -> axum::Json<Value> {
            let query = params.get("query").cloned().unwrap_or_default();
            stub.queries.lock().unwrap().push(query.clone());
            let value = stub
                .table
                .lock()
                .unwrap()
                .iter()
                .find(|(key, _)| query.contains(key.as_str()))
                .and_then(|(_, value)| *value);
            let result = match value {
                Some(v) => json!([{"metric": {}, "value": [1_700_000_000.0, v.to_string()]}]),
                None => json!([]),
            };
            axum::Json(
                json!({"status": "success", "data": {"resultType": "vector", "result": result}}),
            )
        }
        let app = axum::Router::new()
            .route("/api/v1/query", axum::routing::get(query))
            .with_state(self.clone());
        serve(app).await
    }

    fn set(&self, key: &str, value: Option<f64>) {
        let mut table = self.table.lock().unwrap();
        table.retain(|(k, _)| k != key);
        table.push((key.to_owned(), value));
    }
}

// ---- hook receivers ----

/// Records every POST by path and answers each path with the status the test set (200 by
/// default); a path set to hang never answers.
#[derive(Clone, Default)]
struct Hooks {
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    answers: Arc<Mutex<BTreeMap<String, u16>>>,
    hanging: Arc<Mutex<Vec<String>>>,
    /// Paths whose next calls fail with 500, and how many.
    failing: Arc<Mutex<BTreeMap<String, u32>>>,
    released: Arc<tokio::sync::Notify>,
    changed: Arc<tokio::sync::Notify>,
}

impl Hooks {
    async fn start(&self) -> SocketAddr {
        async fn hook(State(hooks): State<Hooks>, uri: Uri, body: Bytes) -> StatusCode {
            let path = uri.path().to_owned();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            hooks.calls.lock().unwrap().push((path.clone(), body));
            hooks.changed.notify_waiters();
            if hooks.hanging.lock().unwrap().contains(&path) {
                // Held until the test releases the hung paths.
                let released = hooks.released.notified();
                if hooks.hanging.lock().unwrap().contains(&path) {
                    released.await;
                }
            }
            if let Some(left) = hooks.failing.lock().unwrap().get_mut(&path)
                && *left > 0
            {
                *left -= 1;
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
            let code = hooks
                .answers
                .lock()
                .unwrap()
                .get(&path)
                .copied()
                .unwrap_or(200);
            StatusCode::from_u16(code).unwrap()
        }
        let app = axum::Router::new()
            .fallback(axum::routing::post(hook))
            .with_state(self.clone());
        serve(app).await
    }

    /// Hung calls answer now, and new ones are not held.
    fn release(&self) {
        self.hanging.lock().unwrap().clear();
        self.released.notify_waiters();
    }

    fn answer(&self, path: &str, code: u16) {
        self.answers.lock().unwrap().insert(path.to_owned(), code);
    }

    fn calls_to(&self, path: &str) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, body)| body.clone())
            .collect()
    }

    async fn wait_for_call(&self, path: &str) -> Value {
        tokio::time::timeout(WAIT, async {
            loop {
                let notified = self.changed.notified();
                if let Some(body) = self.calls_to(path).last() {
                    return body.clone();
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no call to {path}"))
    }
}

async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

// ---- the Deployment controller and kubelet ----

/// Rolls out every Deployment of [`NS`] whose spec moved, while `running`: status caught up,
/// ready pods with IPs (`10.0.0.x` for the target, `10.1.0.x` for the primary).
fn kubelet(api: &ApiServer, running: Arc<AtomicBool>) {
    let api = api.clone();
    tokio::spawn(async move {
        loop {
            if running.load(Ordering::SeqCst) {
                api.roll_out_changed(NS, |name| ip_prefix(name).to_owned());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Pod IPs per Deployment: `10.0.0.x` podinfo, `10.1.0.x` its primary, `10.2.0.x` / `10.3.0.x`
/// for a second canary's.
fn ip_prefix(deployment: &str) -> &'static str {
    match deployment {
        "podinfo" => "10.0.0.",
        "podinfo-primary" => "10.1.0.",
        "other" => "10.2.0.",
        _ => "10.3.0.",
    }
}

// ---- the control plane ----

fn config(dir: &std::path::Path, api: &ApiServer, prometheus: SocketAddr) -> Config {
    common::canary_config(dir, api.url(), format!("http://{prometheus}"))
}

fn canary_object(analysis: Value) -> Value {
    json!({
        "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
        "metadata": {"name": "podinfo", "namespace": NS},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                 "progressDeadlineSeconds": 60, "analysis": analysis},
    })
}

struct Setup {
    api: ApiServer,
    prometheus: PrometheusStub,
    hooks: Hooks,
    kubelet: Arc<AtomicBool>,
    server: dubbo_cp::server::RunningServer,
    prometheus_addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// A cluster with Deployment podinfo (2 replicas of podinfo:1, rolled out), the stubs, and
    /// a control plane; the Canary is made by `canary(hooks address)`.
    async fn start(canary: impl FnOnce(SocketAddr) -> Value) -> Setup {
        Setup::start_with(|_| {}, canary).await
    }

    /// As [`Setup::start`], with `prepare` run on the cluster before the Canary exists.
    async fn start_with(
        prepare: impl FnOnce(&ApiServer),
        canary: impl FnOnce(SocketAddr) -> Value,
    ) -> Setup {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let api = ApiServer::start().await;
        api.create_namespace(NS);
        api.put_deployment(NS, "podinfo", 2, "podinfo:1");
        let running = Arc::new(AtomicBool::new(true));
        kubelet(&api, running.clone());
        let prometheus = PrometheusStub::default();
        prometheus.set("dubbo_provider_requests_succeed_total", Some(100.0));
        prometheus.set("dubbo_provider_rt_milliseconds_p99", Some(20.0));
        let prometheus_addr = prometheus.start().await;
        let hooks = Hooks::default();
        let hooks_addr = hooks.start().await;
        prepare(&api);
        api.put_object("canaries", NS, "podinfo", canary(hooks_addr));
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path(), &api, prometheus_addr);
        config.canary.identity = Some("plane-a".to_owned());
        let server = start(config).await;
        wait_ready(server.admin_addr).await;
        Setup {
            api,
            prometheus,
            hooks,
            kubelet: running,
            server,
            prometheus_addr,
            _dir: dir,
        }
    }

    async fn wait_phase(&self, phase: &str) -> Value {
        self.wait_phase_of("podinfo", phase).await
    }

    async fn wait_phase_of(&self, canary: &str, phase: &str) -> Value {
        self.api
            .wait_for_object("canaries", NS, canary, WAIT, |c| {
                c.is_some_and(|c| c["status"]["phase"] == phase)
            })
            .await
            .unwrap()
    }

    async fn wait_status(&self, check: impl Fn(&Value) -> bool) -> Value {
        self.api
            .wait_for_object("canaries", NS, "podinfo", WAIT, |c| {
                c.is_some_and(|c| check(&c["status"]))
            })
            .await
            .unwrap()["status"]
            .clone()
    }

    async fn wait_target_scaled_to_zero(&self) {
        self.api
            .wait_for_object("deployments", NS, "podinfo", WAIT, |d| {
                d.is_some_and(|d| d["spec"]["replicas"] == 0)
            })
            .await;
    }

    /// Deletes the Canary as kubectl does (its finalizer keeps it until the controller is done).
    async fn delete_canary(&self) {
        let client =
            kube::Client::try_from(kube::Config::new(self.api.url().parse().unwrap())).unwrap();
        let canaries: kube::Api<dubbo_cp::canary::Canary> = kube::Api::namespaced(client, NS);
        canaries
            .delete("podinfo", &Default::default())
            .await
            .unwrap();
    }

    /// Waits for an Event with `reason` whose note contains `text`.
    async fn wait_event(&self, reason: &str, text: &str) {
        let setup = self;
        self.api
            .wait_for(&format!("event {reason} ({text})"), WAIT, |_| {
                setup
                    .events()
                    .iter()
                    .any(|(r, note)| r == reason && note.contains(text))
            })
            .await;
    }

    fn deployment(&self, name: &str) -> Value {
        self.api.object("deployments", NS, name).unwrap()
    }

    fn events(&self) -> Vec<(String, String)> {
        self.api
            .objects_of("events", NS)
            .iter()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

/// The metric results of the run's first analysed step.
fn first_checked(status: &Value) -> &Value {
    &status["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|step| step["metrics"].is_array())
        .unwrap_or_else(|| panic!("no analysed step: {status}"))["metrics"]
}

fn image(deployment: &Value) -> &str {
    deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap()
}

/// The canary weight a discovery client sees: `Some(weights of the canary pods)` while
/// `podinfo-canary` exists, `None` once it is gone.
fn seen_weights(response: &dubbo_cp::dds::ObserveResponse) -> Option<Vec<String>> {
    let objects = response.data.decode().unwrap();
    let config = objects.iter().find_map(|any| {
        let config =
            dubbo_cp::pb::rules::DynamicConfigToClient::decode(any.value.as_slice()).unwrap();
        config.key.starts_with("podinfo-canary").then_some(config)
    })?;
    let spec = config.spec.unwrap();
    assert_eq!(
        (spec.key.as_str(), spec.scope.as_str()),
        ("podinfo", "application")
    );
    Some(
        spec.configs
            .iter()
            .map(|c| {
                assert_eq!(c.side, "provider");
                // The hold on the target's pods by label: `app:podinfo=0`.
                let selected = match &c.r#match {
                    Some(m) => m
                        .param
                        .iter()
                        .map(|p| {
                            let exact = p.value.as_ref().map(|v| v.exact.as_str());
                            format!("{}:{}", p.key, exact.unwrap_or_default())
                        })
                        .collect::<Vec<_>>()
                        .join(","),
                    None => c.addresses.join(","),
                };
                format!("{selected}={}", c.parameters["weight"])
            })
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_release_steps_up_to_max_weight_and_is_promoted() {
    let setup = Setup::start(|hooks| {
        canary_object(json!({
            "interval": "300ms", "threshold": 2, "maxWeight": 50, "stepWeight": 10,
            "metrics": [
                {"name": "request-success-rate", "thresholdRange": {"min": 99}, "interval": "1m"},
                {"name": "request-duration", "thresholdRange": {"max": 500}},
            ],
            "webhooks": [
                {"name": "gate", "type": "confirm-rollout", "url": format!("http://{hooks}/gate"), "timeout": "2s"},
                {"name": "smoke", "type": "pre-rollout", "url": format!("http://{hooks}/pre"),
                 "metadata": {"cmd": "curl -s http://podinfo-canary.test/"}},
                {"name": "load", "url": format!("http://{hooks}/load")},
                {"name": "promote", "type": "confirm-promotion", "url": format!("http://{hooks}/promote")},
                {"name": "after", "type": "post-rollout", "url": format!("http://{hooks}/post")},
                {"name": "events", "type": "event", "url": format!("http://{hooks}/events")},
            ],
        }))
    })
    .await;
    let api = &setup.api;

    // Initialisation: the primary serves, the target idles at zero.
    let status = setup.wait_phase("Initialized").await;
    let primary = setup.deployment("podinfo-primary");
    assert_eq!(image(&primary), "podinfo:1");
    assert_eq!(primary["spec"]["replicas"], 2);
    assert_eq!(
        primary["spec"]["selector"]["matchLabels"]["app"],
        "podinfo-primary"
    );
    assert_eq!(primary["metadata"]["ownerReferences"][0]["kind"], "Canary");
    assert_eq!(setup.deployment("podinfo")["spec"]["replicas"], 0);
    assert_eq!(
        status["status"]["currentRevision"],
        format!(
            "podinfo-{}",
            status["status"]["lastAppliedSpec"].as_str().unwrap()
        )
    );

    let mut observer = Observer::open(setup.server.grpc_addr).await;
    observer.subscribe(&type_of("DynamicConfig")).await;
    let first = observer.next().await;
    assert_eq!(seen_weights(&first), None);
    observer.ack(&first).await;

    // The gate holds the new release in Waiting until it says yes.
    setup.hooks.answer("/gate", 403);
    api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_phase("Waiting").await;
    let gate = setup.hooks.wait_for_call("/gate").await;
    assert_eq!(gate["name"], "podinfo");
    assert_eq!(gate["namespace"], NS);
    assert_eq!(gate["phase"], "Waiting");
    let waiting = setup.wait_status(|s| s["phase"] == "Waiting").await;
    assert_eq!(gate["checksum"], waiting["lastAppliedSpec"]);
    assert_ne!(gate["checksum"], status["status"]["lastAppliedSpec"]);
    setup
        .wait_event("HookFailed", "confirm-rollout hook gate failed: HTTP 403")
        .await;
    setup
        .wait_event("Waiting", "waiting for confirm-rollout hooks")
        .await;
    assert_eq!(setup.deployment("podinfo")["spec"]["replicas"], 0);
    setup.hooks.answer("/gate", 200);

    // Then the weights move step by step, as a discovery client sees them.
    let mut seen: Vec<Option<Vec<String>>> = Vec::new();
    tokio::time::timeout(WAIT, async {
        loop {
            let response = observer.next().await;
            let weights = seen_weights(&response);
            observer.ack(&response).await;
            if seen.last() != Some(&weights) {
                seen.push(weights.clone());
            }
            if weights.is_none() && seen.len() > 1 {
                break;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the run did not finish; seen {seen:?}"));
    // Two canary pods against two primaries: w = round(100 p / (100 - p)), after the hold on
    // every pod of the target by its label, there from before its first pod.
    let hold = "app:podinfo=0".to_owned();
    let expected: Vec<Option<Vec<String>>> = [0, 11, 25, 43, 67, 100, 0]
        .iter()
        .map(|w| {
            Some(vec![
                hold.clone(),
                format!("10.0.0.1={w}"),
                format!("10.0.0.2={w}"),
            ])
        })
        .chain([None])
        .collect();
    assert_eq!(seen, expected);

    let status = setup.wait_phase("Succeeded").await["status"].clone();
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");
    assert_eq!(setup.deployment("podinfo")["spec"]["replicas"], 0);
    assert_eq!(status["canaryWeight"], 0);
    assert_eq!(status["failedChecks"], 0);
    assert_eq!(status["lastPromotedSpec"], status["lastAppliedSpec"]);
    let promoted = &status["conditions"][0];
    assert_eq!(
        (promoted["type"].as_str(), promoted["status"].as_str()),
        (Some("Promoted"), Some("True"))
    );
    // Each step's metric results are in the history.
    let steps = status["history"].as_array().unwrap();
    let analysed: Vec<&Value> = steps.iter().filter(|s| s["metrics"].is_array()).collect();
    assert!(analysed.len() >= 5, "{steps:?}");
    assert_eq!(analysed[0]["metrics"][0]["name"], "request-success-rate");
    assert_eq!(analysed[0]["metrics"][0]["value"], 100.0);
    assert_eq!(analysed[0]["metrics"][0]["ok"], true);
    // The built-in queries read the canary's pods with the metric's own interval.
    let queries = setup.prometheus.queries.lock().unwrap().clone();
    assert!(
        queries.iter().any(|q| q.contains("namespace=\"test\"")
            && q.contains("[1m]")
            && q.contains("pod=~\"podinfo-[0-9a-zA-Z]+(-[0-9a-zA-Z]+)\"")),
        "{queries:?}"
    );
    assert!(queries.iter().any(|q| q.contains("[300ms]")), "{queries:?}");

    // Hooks: pre-rollout once with its metadata, rollout hooks at every iteration, promotion
    // confirmed, post-rollout after the outcome, and every Event sent to the event hook.
    let pre = setup.hooks.calls_to("/pre");
    assert_eq!(pre.len(), 1);
    assert_eq!(
        pre[0]["metadata"]["cmd"],
        "curl -s http://podinfo-canary.test/"
    );
    assert!(setup.hooks.calls_to("/load").len() >= 5);
    assert!(!setup.hooks.calls_to("/promote").is_empty());
    let post = setup.hooks.wait_for_call("/post").await;
    assert_eq!(post["phase"], "Succeeded");
    setup.wait_event("Succeeded", "promotion completed").await;
    let events = setup.events();
    let reasons: Vec<&str> = events.iter().map(|(r, _)| r.as_str()).collect();
    for reason in [
        "Initialized",
        "NewRevision",
        "Waiting",
        "Progressing",
        "WeightIncreased",
        "Promoting",
        "Succeeded",
    ] {
        assert!(
            reasons.contains(&reason),
            "{reason} missing from {events:?}"
        );
    }
    let event_hook = setup.hooks.calls_to("/events");
    for reason_note in events.iter().map(|(_, note)| note) {
        assert!(
            event_hook
                .iter()
                .any(|call| call["metadata"]["eventMessage"] == reason_note.as_str()),
            "event hook missed {reason_note:?}"
        );
    }
    assert!(
        event_hook
            .iter()
            .all(|c| c["metadata"]["eventType"].is_string()
                && c["metadata"]["timestamp"].is_string())
    );

    // The dashboard charts the run: a dot per step, up to 50 %, each with its metric results.
    let (code, body) = common::http_get(setup.server.admin_addr, "/debug/canaries").await;
    assert_eq!(code, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["canaries"][0]["phase"], "Succeeded");
    let admin = setup.server.admin_addr;
    tokio::task::spawn_blocking(move || {
        let mut browser = common::browser::Browser::open(&format!("http://{admin}/ui"));
        let canary =
            r#"document.querySelector('div.canary[data-namespace="test"][data-name="podinfo"]')"#;
        browser.wait_for(&format!(
            "{canary} !== null && {canary}.querySelectorAll('circle.step').length >= 6"
        ));
        let weights = browser.evaluate(&format!(
            "Array.from({canary}.querySelectorAll('circle.step'), c => Number(c.dataset.weight))"
        ));
        let weights: Vec<u64> = serde_json::from_value(weights).unwrap();
        assert_eq!(weights.iter().max(), Some(&50), "{weights:?}");
        assert!(
            weights.windows(2).any(|w| w[0] == 10 && w[1] == 20),
            "{weights:?}"
        );
        let analysed = browser.evaluate(&format!(
            "{canary}.querySelectorAll('circle.step[data-ok=\"true\"]').length"
        ));
        assert!(analysed.as_u64() >= Some(5), "{analysed}");
        let text = browser.evaluate(&format!("{canary}.textContent"));
        assert!(text.as_str().unwrap().contains("Succeeded"), "{text}");
        let shot =
            std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("canary-dashboard.png");
        browser.screenshot(&shot);
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "canary dashboard screenshot: {}",
            shot.display()
        );
    })
    .await
    .unwrap();

    // Metrics of rollout.md.
    let (_, metrics) = common::http_get(setup.server.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("dubbo_cp_canary_weight{namespace=\"test\",name=\"podinfo\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_canary_status{namespace=\"test\",name=\"podinfo\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dubbo_cp_canary_duration_seconds_count"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_metric_rolls_back_after_threshold_checks_and_no_data_counts_as_failed() {
    let setup = Setup::start(|hooks| {
        canary_object(json!({
            "interval": "200ms", "threshold": 3, "maxWeight": 50, "stepWeight": 10,
            "metrics": [
                {"name": "request-success-rate", "thresholdRange": {"min": 99}},
                {"name": "error-budget", "thresholdRange": {"max": 1},
                 "query": "sum(my_errors_total{namespace=\"{{ namespace }}\",app=\"{{ application }}\"})"},
            ],
            "webhooks": [
                {"name": "after", "type": "post-rollout", "url": format!("http://{hooks}/post")},
            ],
        }))
    })
    .await;
    setup.wait_phase("Initialized").await;
    // A success rate below the range, and a custom query with no samples at all.
    setup
        .prometheus
        .set("dubbo_provider_requests_succeed_total", Some(90.0));
    setup.prometheus.set("my_errors_total", None);
    setup.api.set_image(NS, "podinfo", "podinfo:bad");
    let status = setup.wait_phase("Failed").await["status"].clone();
    assert_eq!(status["failedChecks"], 3);
    assert_eq!(status["canaryWeight"], 0);
    let condition = &status["conditions"][0];
    assert_eq!(condition["status"], "False");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("failed 3 checks"),
        "{condition}"
    );
    // Each failed check held the weight (the first step, 10: at 0 no call reached the canary to
    // judge) and said why.
    let metrics = first_checked(&status);
    assert_eq!(metrics[0]["value"], 90.0);
    assert_eq!(metrics[0]["ok"], false);
    assert!(
        metrics[0]["message"]
            .as_str()
            .unwrap()
            .contains("outside [99, +inf]"),
        "{metrics}"
    );
    assert_eq!(metrics[1]["ok"], false);
    assert!(
        metrics[1]["message"].as_str().unwrap().contains("no data"),
        "{metrics}"
    );
    setup
        .wait_event("RolledBack", "canary failed 3 checks")
        .await;
    let failures: Vec<String> = setup
        .events()
        .into_iter()
        .filter(|(reason, _)| reason == "CheckFailed")
        .map(|(_, note)| note)
        .collect();
    assert!(!failures.is_empty());
    assert!(failures[0].contains("no data"), "{failures:?}");
    let queries = setup.prometheus.queries.lock().unwrap().clone();
    assert!(
        queries.contains(&"sum(my_errors_total{namespace=\"test\",app=\"podinfo\"})".to_owned()),
        "{queries:?}"
    );
    // Rolled back: the primary never got the bad template, the canary is scaled to zero, the
    // weights are gone, post-rollout ran after the failure.
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:1");
    setup.wait_target_scaled_to_zero().await;
    setup
        .api
        .wait_for_object("dynamicconfigs", NS, "podinfo-canary", WAIT, |c| {
            c.is_none()
        })
        .await;
    assert_eq!(setup.hooks.wait_for_call("/post").await["phase"], "Failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_gate_each_stage_and_a_gate_that_never_answers_holds_only_its_canary() {
    let setup = Setup::start(|hooks| {
        canary_object(json!({
            "interval": "200ms", "threshold": 5, "maxWeight": 50, "stepWeight": 10,
            "webhooks": [
                // The default timeout (60 s): the call really hangs while the other canary runs.
                {"name": "gate", "type": "confirm-rollout", "url": format!("http://{hooks}/gate")},
                {"name": "smoke", "type": "pre-rollout", "url": format!("http://{hooks}/pre")},
                {"name": "more", "type": "confirm-traffic-increase", "url": format!("http://{hooks}/more")},
                {"name": "stop", "type": "rollback", "url": format!("http://{hooks}/rollback")},
                {"name": "after", "type": "post-rollout", "url": format!("http://{hooks}/post")},
            ],
        }))
    })
    .await;
    let api = &setup.api;
    // A second canary with no hooks, in the same control plane.
    api.put_deployment(NS, "other", 1, "other:1");
    let mut other = canary_object(json!({"interval": "200ms", "maxWeight": 50, "stepWeight": 50}));
    other["metadata"]["name"] = json!("other");
    other["spec"]["targetRef"]["name"] = json!("other");
    api.put_object("canaries", NS, "other", other);
    setup.wait_phase("Initialized").await;
    setup.wait_phase_of("other", "Initialized").await;

    // The gate never answers: podinfo waits, other goes all the way.
    setup.hooks.hanging.lock().unwrap().push("/gate".to_owned());
    setup.hooks.answer("/rollback", 404);
    setup.hooks.answer("/pre", 500);
    setup.hooks.answer("/more", 403);
    api.set_image(NS, "podinfo", "podinfo:2");
    api.set_image(NS, "other", "other:2");
    setup.hooks.wait_for_call("/gate").await;
    setup.wait_phase_of("other", "Succeeded").await;
    assert_eq!(image(&setup.deployment("other-primary")), "other:2");
    // podinfo's reconcile is still held by its gate: Waiting, the canary not started.
    assert_eq!(setup.hooks.calls_to("/gate").len(), 1);
    let status = setup.wait_phase("Waiting").await["status"].clone();
    assert_eq!(setup.deployment("podinfo")["spec"]["replicas"], 0);
    assert_eq!(
        setup.hooks.calls_to("/gate")[0]["checksum"],
        status["lastAppliedSpec"]
    );

    // The gate answers; a failing pre-rollout hook counts a failed check and is asked again.
    setup.hooks.release();
    let status = setup.wait_status(|s| s["failedChecks"] == 1).await;
    assert_eq!(status["phase"], "Progressing");
    assert_eq!(status["canaryWeight"], 0);
    setup
        .wait_event("HookFailed", "pre-rollout hook smoke failed: HTTP 500")
        .await;
    setup
        .wait_event(
            "CheckFailed",
            "failed check 1 of 5 at weight 0: hook smoke failed",
        )
        .await;
    setup.hooks.answer("/pre", 200);
    // confirm-traffic-increase says no: the weight holds, checks do not fail.
    let waiting = setup
        .wait_status(|s| s["iterations"].as_u64() >= Some(4))
        .await;
    assert_eq!(waiting["canaryWeight"], 0);
    assert_eq!(waiting["failedChecks"], 1);
    setup
        .wait_event(
            "Waiting",
            "waiting for confirm-traffic-increase hooks before weight 10",
        )
        .await;
    setup.hooks.answer("/more", 200);
    setup.wait_status(|s| s["canaryWeight"] == 20).await;
    // The rollback hook aborts the run.
    setup.hooks.answer("/rollback", 200);
    let status = setup.wait_phase("Failed").await["status"].clone();
    assert!(
        status["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("rollback hook stop"),
        "{status}"
    );
    assert_eq!(setup.hooks.wait_for_call("/post").await["phase"], "Failed");
    assert_eq!(
        setup
            .hooks
            .calls_to("/pre")
            .iter()
            .filter(|c| c["phase"] == "Progressing")
            .count(),
        setup.hooks.calls_to("/pre").len()
    );
    setup.wait_target_scaled_to_zero().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_mid_rollout_halts_advancement_and_the_progress_deadline_rolls_back() {
    let setup = Setup::start(|_| {
        let mut canary =
            canary_object(json!({"interval": "200ms", "maxWeight": 50, "stepWeight": 10}));
        canary["spec"]["progressDeadlineSeconds"] = json!(2);
        canary
    })
    .await;
    setup.wait_phase("Initialized").await;
    setup.api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_status(|s| s["canaryWeight"] == 10).await;
    // The canary Deployment goes mid-rollout (one of two replicas updated) and stays there.
    setup.kubelet.store(false, Ordering::SeqCst);
    let generation = setup.deployment("podinfo")["metadata"]["generation"].clone();
    setup.api.set_deployment_status(
        NS,
        "podinfo",
        json!({"observedGeneration": generation, "replicas": 2, "updatedReplicas": 1,
               "availableReplicas": 1}),
    );
    let status = setup.wait_phase("Failed").await["status"].clone();
    // While halted it did not step; then the deadline rolled it back.
    assert_eq!(
        status["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["weight"].as_u64() > Some(10))
            .count(),
        0,
        "{status}"
    );
    setup.wait_event("Halted", "1 of 2 updated replicas").await;
    let message = status["conditions"][0]["message"].as_str().unwrap();
    assert!(message.contains("progress deadline exceeded"), "{message}");
    assert!(message.contains("1 of 2 updated replicas"), "{message}");
}

/// Runs the CLI against the fixture.
fn cli(api: &ApiServer, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(["canary"])
        .args(args)
        .args(["-n", NS, "--kube-api-server", &api.url()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_are_recorded_a_rollback_restores_one_and_deleting_the_canary_restores_the_target()
 {
    let setup = Setup::start(|_| {
        let mut canary =
            canary_object(json!({"interval": "100ms", "maxWeight": 50, "stepWeight": 50}));
        canary["spec"]["revisionHistoryLimit"] = json!(2);
        canary
    })
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_status(|s| s["phase"] == "Succeeded").await;
    let (ok, history) = cli(api, &["history", "podinfo"]);
    assert!(ok, "{history}");
    let rows: Vec<&str> = history.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{history}");
    assert!(
        rows[0].starts_with("1 ") && rows[0].contains("podinfo:1") && !rows[0].ends_with('*'),
        "{history}"
    );
    assert!(
        rows[1].starts_with("2 ") && rows[1].contains("podinfo:2") && rows[1].ends_with('*'),
        "{history}"
    );
    let revisions = api.objects_of("controllerrevisions", NS);
    assert!(
        revisions.iter().all(
            |r| r["metadata"]["labels"]["dubbo.apache.org/canary"] == "podinfo"
                && r["metadata"]["ownerReferences"][0]["kind"] == "Canary"
        )
    );

    // Back to revision 1: the target takes its template and a new run promotes it.
    let (ok, out) = cli(api, &["rollback", "podinfo", "--to-revision", "1"]);
    assert!(ok, "{out}");

    assert_eq!(image(&setup.deployment("podinfo")), "podinfo:1");
    let first = revisions.iter().find(|r| r["revision"] == 1).unwrap()["metadata"]["name"].clone();
    setup
        .wait_status(|s| s["phase"] == "Succeeded" && s["currentRevision"] == first)
        .await;
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:1");
    let (ok, out) = cli(api, &["rollback", "podinfo", "--to-revision", "9"]);
    assert!(!ok && out.contains("has no revision 9"), "{out}");

    // A third template: revision 3, and one goes past revisionHistoryLimit 2.
    api.set_image(NS, "podinfo", "podinfo:3");
    setup
        .api
        .wait_for_object("deployments", NS, "podinfo-primary", WAIT, |d| {
            d.is_some_and(|d| image(d) == "podinfo:3")
        })
        .await;
    let status = setup.wait_status(|s| s["phase"] == "Succeeded").await;
    let mut numbers: Vec<i64> = api
        .objects_of("controllerrevisions", NS)
        .iter()
        .map(|r| r["revision"].as_i64().unwrap())
        .collect();
    numbers.sort();
    // Revision 2 went: 1 is what the primary ran while 3 was analysed (a rollback during
    // promotion restores it), so it is kept over the newer 2.
    assert_eq!(numbers, [1, 3], "{status}");
    let (ok, out) = cli(api, &["status", "podinfo"]);
    assert!(ok, "{out}");
    assert!(out.contains("phase Succeeded"), "{out}");
    assert!(out.contains("weight history:"), "{out}");

    // Deleting the Canary restores the target with the primary's template and replicas.
    setup.delete_canary().await;
    api.wait_for_object("canaries", NS, "podinfo", WAIT, |c| c.is_none())
        .await;
    let target = setup.deployment("podinfo");
    assert_eq!(image(&target), "podinfo:3");
    assert_eq!(target["spec"]["replicas"], 2);
    assert_eq!(
        target["spec"]["template"]["metadata"]["labels"]["app"],
        "podinfo"
    );
    assert!(api.object("dynamicconfigs", NS, "podinfo-canary").is_none());
    setup
        .wait_event("Terminating", "restored with the primary's template")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_drives_canaries_and_another_takes_over_when_it_stops() {
    let setup = Setup::start(|_| {
        canary_object(json!({"interval": "100ms", "maxWeight": 50, "stepWeight": 50}))
    })
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    let lease = api
        .object("leases", "dubbo-system", "dubbo-cp-canary")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "plane-a");

    // A second control plane on the same cluster stays passive while the first holds the lease.
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), api, setup.prometheus_addr);
    config.canary.identity = Some("plane-b".to_owned());
    let second = start(config).await;
    wait_ready(second.admin_addr).await;
    api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_phase("Succeeded").await;
    assert_eq!(
        common::metric(second.admin_addr, "dubbo_cp_canary_reconciles_total").await,
        0.0
    );
    assert!(
        common::metric(setup.server.admin_addr, "dubbo_cp_canary_reconciles_total").await > 0.0
    );

    // The holder stops (releasing the lease): the second takes over and runs the next release.
    setup.server.stop().await.unwrap();
    let lease = api
        .wait_for_object("leases", "dubbo-system", "dubbo-cp-canary", WAIT, |l| {
            l.is_some_and(|l| l["spec"]["holderIdentity"] == "plane-b")
        })
        .await
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    api.set_image(NS, "podinfo", "podinfo:3");
    api.wait_for_object("deployments", NS, "podinfo-primary", WAIT, |d| {
        d.is_some_and(|d| image(d) == "podinfo:3")
    })
    .await;
    assert!(common::metric(second.admin_addr, "dubbo_cp_canary_reconciles_total").await > 0.0);
    second.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over() {
    let api = ApiServer::start().await;
    // A holder that stopped renewing without releasing (a crashed replica).
    let renewed = k8s_openapi::jiff::Timestamp::now();
    api.put_object(
        "leases",
        "dubbo-system",
        "dubbo-cp-canary",
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "dubbo-cp-canary", "namespace": "dubbo-system"},
               "spec": {"holderIdentity": "crashed", "leaseDurationSeconds": 1,
                        "renewTime": renewed.to_string(), "leaseTransitions": 3}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), &api, "127.0.0.1:9".parse().unwrap());
    config.canary.identity = Some("plane-b".to_owned());
    let server = start(config).await;
    let lease = api
        .wait_for_object("leases", "dubbo-system", "dubbo-cp-canary", WAIT, |l| {
            l.is_some_and(|l| l["spec"]["holderIdentity"] == "plane-b")
        })
        .await
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 4);
    let acquired: k8s_openapi::jiff::Timestamp = lease["spec"]["acquireTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // Not before the crashed holder's lease ran out (renewTime + leaseDurationSeconds).
    assert!(
        acquired.as_millisecond() >= renewed.as_millisecond() + 1000,
        "taken over at {acquired}, renewed at {renewed}"
    );
    server.stop().await.unwrap();
}

// ---- a real Prometheus ----

/// Dubbo's provider metrics for one canary pod, as its exporter shows them: every scrape adds
/// ten calls, all successful while `healthy`, half of them otherwise.
async fn exporter(healthy: Arc<AtomicBool>) -> SocketAddr {
    #[derive(Clone)]
    struct Counters {
        healthy: Arc<AtomicBool>,
        calls: Arc<Mutex<(u64, u64)>>,
    }
    async fn metrics(State(counters): State<Counters>) -> String {
        let (total, succeeded) = {
            let mut calls = counters.calls.lock().unwrap();
            calls.0 += 10;
            calls.1 += if counters.healthy.load(Ordering::SeqCst) {
                10
            } else {
                5
            };
            *calls
        };
        let labels = r#"namespace="test",pod="podinfo-x2-p0",application_name="podinfo""#;
        format!(
            "# TYPE dubbo_provider_requests_total counter\n\
             dubbo_provider_requests_total{{{labels}}} {total}\n\
             # TYPE dubbo_provider_requests_succeed_total counter\n\
             dubbo_provider_requests_succeed_total{{{labels}}} {succeeded}\n\
             # TYPE dubbo_provider_rt_milliseconds_p99 gauge\n\
             dubbo_provider_rt_milliseconds_p99{{{labels}}} 20\n"
        )
    }
    let counters = Counters {
        healthy,
        calls: Arc::default(),
    };
    serve(
        axum::Router::new()
            .route("/metrics", axum::routing::get(metrics))
            .with_state(counters),
    )
    .await
}

/// Debian's Prometheus, scraping `target` every second; killed when dropped.
struct RealPrometheus {
    process: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for RealPrometheus {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl RealPrometheus {
    async fn start(target: SocketAddr) -> RealPrometheus {
        let binary = common::distribution_binary(&["prometheus"], "prometheus");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 scrape_configs:\n\
                 - job_name: dubbo\n  honor_labels: true\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap()
        };
        let process = std::process::Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        RealPrometheus {
            process,
            addr,
            _dir: dir,
        }
    }

    /// Waits until the exporter's calls have a rate: two scrapes in the window.
    async fn wait_for_samples(&self) {
        let client = dubbo_cp::canary::prometheus::Prometheus::default();
        let address = format!("http://{}", self.addr);
        let query = "sum(rate(dubbo_provider_requests_total[5s]))";
        tokio::time::timeout(Duration::from_secs(60), async {
            // Polling an outside process: it says nothing when it has scraped.
            while client
                .query(
                    &dubbo_cp::canary::prometheus::Endpoint::plain(&address),
                    query,
                    Duration::from_secs(2),
                )
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
        .expect("Prometheus never had two scrapes of the exporter");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_real_prometheus_a_good_release_is_promoted_and_a_bad_one_rolled_back() {
    let healthy = Arc::new(AtomicBool::new(true));
    let prometheus = RealPrometheus::start(exporter(healthy.clone()).await).await;
    let address = format!("http://{}", prometheus.addr);
    let setup = Setup::start(move |_| {
        let mut canary = canary_object(json!({
            "interval": "1s", "threshold": 2, "maxWeight": 50, "stepWeight": 25,
            "metrics": [
                {"name": "request-success-rate", "thresholdRange": {"min": 99}, "interval": "5s"},
                {"name": "request-duration", "thresholdRange": {"max": 500}, "interval": "5s"},
            ],
        }));
        canary["spec"]["prometheus"] = json!({"address": address});
        canary
    })
    .await;
    setup.wait_phase("Initialized").await;
    prometheus.wait_for_samples().await;

    setup.api.set_image(NS, "podinfo", "podinfo:2");
    let status = setup
        .api
        .wait_for_object("canaries", NS, "podinfo", Duration::from_secs(40), |c| {
            c.is_some_and(|c| c["status"]["phase"] == "Succeeded")
        })
        .await
        .unwrap()["status"]
        .clone();
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");
    assert_eq!(status["failedChecks"], 0, "{status}");
    let checked = first_checked(&status);
    assert_eq!(checked[0]["value"], 100.0, "{status}");
    assert_eq!(checked[1]["value"], 20.0, "{status}");

    // Half the calls fail from now on: the next release is rolled back.
    healthy.store(false, Ordering::SeqCst);
    setup.api.set_image(NS, "podinfo", "podinfo:3");
    let status = setup
        .api
        .wait_for_object("canaries", NS, "podinfo", Duration::from_secs(40), |c| {
            c.is_some_and(|c| c["status"]["phase"] == "Failed")
        })
        .await
        .unwrap()["status"]
        .clone();
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");
    let rate = first_checked(&status)[0]["value"].as_f64().unwrap();
    assert!(rate < 99.0, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_config_map_or_secret_starts_a_run_and_reaches_the_primary_only_when_promoted() {
    let config = |mode: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "podinfo-config", "namespace": NS}, "data": {"mode": mode}})
    };
    let setup = Setup::start_with(
        |api| {
            api.put_object("configmaps", NS, "podinfo-config", config("a"));
            api.put_object(
                "secrets",
                NS,
                "podinfo-token",
                json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                       "metadata": {"name": "podinfo-token", "namespace": NS},
                       "data": {"token": "czNjcjN0"}}),
            );
            let mut deployment = api.object("deployments", NS, "podinfo").unwrap();
            let spec = &mut deployment["spec"]["template"]["spec"];
            spec["containers"][0]["envFrom"] =
                json!([{"configMapRef": {"name": "podinfo-config"}}]);
            spec["volumes"] = json!([{"name": "token", "secret": {"secretName": "podinfo-token"}}]);
            api.put_object("deployments", NS, "podinfo", deployment);
        },
        |_| canary_object(json!({"interval": "300ms", "maxWeight": 50, "stepWeight": 50})),
    )
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    // The primary runs on copies, owned by the Canary.
    let primary = setup.deployment("podinfo-primary");
    let spec = &primary["spec"]["template"]["spec"];
    assert_eq!(
        spec["containers"][0]["envFrom"][0]["configMapRef"]["name"],
        "podinfo-config-primary"
    );
    assert_eq!(
        spec["volumes"][0]["secret"]["secretName"],
        "podinfo-token-primary"
    );
    let copy = api
        .object("configmaps", NS, "podinfo-config-primary")
        .unwrap();
    assert_eq!(copy["data"]["mode"], "a");
    assert_eq!(copy["metadata"]["ownerReferences"][0]["kind"], "Canary");
    let secret = api.object("secrets", NS, "podinfo-token-primary").unwrap();
    assert_eq!(
        (secret["data"]["token"].as_str(), secret["type"].as_str()),
        (Some("czNjcjN0"), Some("Opaque"))
    );
    let applied = setup.wait_status(|_| true).await["lastAppliedSpec"].clone();

    // kubectl edits the ConfigMap only: a new run, and the primary's copy changes at promotion.
    api.put_object("configmaps", NS, "podinfo-config", config("b"));
    let running = setup.wait_status(|s| s["phase"] == "Progressing").await;
    assert_ne!(running["lastAppliedSpec"], applied);
    assert_eq!(
        api.object("configmaps", NS, "podinfo-config-primary")
            .unwrap()["data"]["mode"],
        "a"
    );
    setup.wait_phase("Succeeded").await;
    assert_eq!(
        api.object("configmaps", NS, "podinfo-config-primary")
            .unwrap()["data"]["mode"],
        "b"
    );
    // The primary's pods roll to read it: its template moved (the configs' annotation).
    let annotation = |d: &Value| {
        d["spec"]["template"]["metadata"]["annotations"]["dubbo.apache.org/configs"].clone()
    };
    let promoted = setup.deployment("podinfo-primary");
    assert!(annotation(&promoted).is_string());
    assert_ne!(annotation(&promoted), annotation(&primary));
    assert_eq!(image(&promoted), "podinfo:1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_and_abort_act_on_the_run_in_flight_only() {
    let setup = Setup::start(|hooks| {
        canary_object(json!({
            "interval": "200ms", "maxWeight": 50, "stepWeight": 10,
            "webhooks": [
                {"name": "gate", "type": "confirm-traffic-increase", "url": format!("http://{hooks}/more")},
            ],
        }))
    })
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    // Nothing to promote while idle: refused, and nothing is left behind for the next run.
    let (ok, out) = cli(api, &["promote", "podinfo"]);
    assert!(
        !ok && out.contains("no run in flight (phase Initialized)"),
        "{out}"
    );

    // A run held at weight 0 by its traffic gate: promote skips the remaining steps.
    setup.hooks.answer("/more", 403);
    api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_status(|s| s["phase"] == "Progressing").await;
    setup
        .wait_event("Waiting", "confirm-traffic-increase")
        .await;
    let (ok, out) = cli(api, &["promote", "podinfo"]);
    assert!(ok, "{out}");
    let status = setup.wait_phase("Succeeded").await["status"].clone();
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");
    assert!(
        status["history"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["weight"].as_u64() < Some(10)),
        "promoted without stepping: {status}"
    );
    setup
        .wait_event(
            "Promoting",
            "promotion requested by dubbo-cp canary promote",
        )
        .await;

    // The next run: abort rolls it back.
    api.set_image(NS, "podinfo", "podinfo:3");
    setup.wait_status(|s| s["phase"] == "Progressing").await;
    let (ok, out) = cli(api, &["abort", "podinfo"]);
    assert!(ok, "{out}");
    let status = setup.wait_phase("Failed").await["status"].clone();
    assert!(
        status["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("aborted by dubbo-cp canary abort"),
        "{status}"
    );
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");

    // A request naming another revision (left over from an earlier run) is ignored.
    let mut canary = api.object("canaries", NS, "podinfo").unwrap();
    canary["metadata"]["annotations"] =
        json!({"dubbo.apache.org/canary-action": "promote:podinfo-0000000000:1"});
    api.put_object("canaries", NS, "podinfo", canary);
    setup
        .wait_event("ActionIgnored", "podinfo-0000000000")
        .await;
    api.set_image(NS, "podinfo", "podinfo:4");
    setup.wait_status(|s| s["phase"] == "Progressing").await;
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");
}

/// Flagger's `suspend`: a suspended Canary starts no run whatever its target does, and a run in
/// flight holds its weight; but the weights keep following the pods (a new pod of the target is
/// held at 0, as no Kubernetes controller would do it here). Resumed, each goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_canary_starts_no_run_and_holds_one_in_flight_until_resumed() {
    let setup = Setup::start(|hooks| {
        canary_object(json!({
            "interval": "200ms", "maxWeight": 20, "stepWeight": 10,
            "webhooks": [
                {"name": "gate", "type": "confirm-promotion", "url": format!("http://{hooks}/promote")},
            ],
        }))
    })
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    let set_suspend = |suspend: bool| {
        let mut canary = api.object("canaries", NS, "podinfo").unwrap();
        canary["spec"]["suspend"] = json!(suspend);
        api.put_object("canaries", NS, "podinfo", canary);
    };
    let admin = setup.server.admin_addr;
    let reconciles = || common::metric(admin, "dubbo_cp_canary_reconciles_total");
    // Waits until the controller has reconciled the Canary `more` times from now. A suspended
    // Canary is looked at every interval (200 ms), so five are a second of looks.
    let reconciled = |more: f64| async move {
        let from = reconciles().await;
        let deadline = tokio::time::Instant::now() + WAIT;
        while reconciles().await < from + more {
            assert!(tokio::time::Instant::now() < deadline, "no reconcile");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };

    // Held at weight 0 in the Canary's DynamicConfig: each of `ips`.
    let zeroed =
        |ips: &'static [&'static str]| {
            move |c: Option<&Value>| {
                c.is_some_and(|c| {
                    ips.iter().all(|ip| {
                        c["spec"]["configs"].as_array().unwrap().iter().any(|o| {
                            o["addresses"] == json!([ip]) && o["parameters"]["weight"] == "0"
                        })
                    })
                })
            }
        };
    set_suspend(true);
    reconciled(1.0).await;
    // A new template, scaled up by hand (as a GitOps apply would): no run, its pods no call.
    api.set_image(NS, "podinfo", "podinfo:2");
    api.set_replicas(NS, "podinfo", 2);
    api.wait_for_object(
        "dynamicconfigs",
        NS,
        "podinfo-canary",
        WAIT,
        zeroed(&["10.0.0.1", "10.0.0.2"]),
    )
    .await;
    reconciled(5.0).await;
    let canary = api.object("canaries", NS, "podinfo").unwrap();
    assert_eq!(canary["status"]["phase"], "Initialized", "{canary}");
    assert_eq!(
        canary["status"]["conditions"][1]["type"], "Suspended",
        "{canary}"
    );
    set_suspend(false);
    // Held at its gate at the last step, the run is suspended.
    setup.hooks.answer("/promote", 403);
    setup
        .wait_status(|s| s["phase"] == "WaitingPromotion" && s["canaryWeight"] == 20)
        .await;
    set_suspend(true);
    reconciled(1.0).await;
    setup.hooks.answer("/promote", 200);
    // A pod of the target that has an IP but is not ready yet: held at weight 0.
    api.put_pod(
        NS,
        "podinfo-late",
        "late-uid",
        json!({"app": "podinfo"}),
        &["10.0.0.9"],
    );
    api.wait_for_object(
        "dynamicconfigs",
        NS,
        "podinfo-canary",
        WAIT,
        zeroed(&["10.0.0.9"]),
    )
    .await;
    reconciled(5.0).await;
    let canary = api.object("canaries", NS, "podinfo").unwrap();
    assert_eq!(canary["status"]["phase"], "WaitingPromotion", "{canary}");
    let (ok, out) = cli(api, &["promote", "podinfo"]);
    assert!(!ok && out.contains("is suspended"), "{out}");
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:1");
    set_suspend(false);
    let done = setup.wait_phase("Succeeded").await;
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");
    let conditions = done["status"]["conditions"].as_array().unwrap();
    assert!(
        conditions.iter().all(|c| c["type"] != "Suspended"),
        "{done}"
    );
}

/// Flagger's `stepWeightPromotion`: once the primary runs the promoted template, the calls go
/// back to it a step per interval (30 -> 20 -> 10 -> 0), not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_weight_promotion_moves_the_calls_back_a_step_per_interval() {
    let setup = Setup::start(|_| {
        canary_object(json!({
            "interval": "200ms", "maxWeight": 30, "stepWeight": 10, "stepWeightPromotion": 10,
        }))
    })
    .await;
    setup.wait_phase("Initialized").await;
    setup.api.set_image(NS, "podinfo", "podinfo:2");
    let done = setup.wait_phase("Succeeded").await;
    let steps: Vec<(String, u64)> = done["status"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["phase"].as_str().unwrap().to_owned(),
                s["weight"].as_u64().unwrap(),
            )
        })
        .skip_while(|(phase, _)| phase != "Progressing")
        .collect();
    let promoting: Vec<u64> = steps
        .iter()
        .filter(|(phase, _)| phase == "Promoting")
        .map(|(_, w)| *w)
        .collect();
    assert_eq!(promoting, [20, 10], "{steps:?}");
    // A step per interval (200 ms), not all in one reconcile.
    let times: Vec<k8s_openapi::jiff::Timestamp> = done["status"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["phase"] == "Promoting")
        .map(|s| s["time"].as_str().unwrap().parse().unwrap())
        .collect();
    let apart = times[1].duration_since(times[0]);
    assert!(apart.as_millis() >= 190, "{apart:?} {steps:?}");
    let finalising = steps.iter().position(|(phase, _)| phase == "Finalising");
    assert_eq!(finalising.map(|at| steps[at].1), Some(0), "{steps:?}");
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_revision_mid_run_takes_the_old_canary_out_of_traffic_until_approved() {
    let setup = Setup::start(|hooks| {
        canary_object(json!({
            "interval": "200ms", "maxWeight": 50, "stepWeight": 10,
            "webhooks": [
                {"name": "gate", "type": "confirm-rollout", "url": format!("http://{hooks}/gate")},
            ],
        }))
    })
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_status(|s| s["canaryWeight"] == 30).await;
    // v3 arrives mid-run while the gate says no.
    setup.hooks.answer("/gate", 403);
    api.set_image(NS, "podinfo", "podinfo:3");
    setup
        .wait_event("Waiting", "waiting for confirm-rollout hooks")
        .await;
    let status = setup.wait_status(|s| s["phase"] == "Waiting").await;
    assert_eq!(status["canaryWeight"], 0);
    // The canary is scaled to zero, and whatever of it still runs has weight 0.
    setup.wait_target_scaled_to_zero().await;
    api.wait_for_object("dynamicconfigs", NS, "podinfo-canary", WAIT, |c| {
        c.is_none_or(|c| {
            c["spec"]["configs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|o| o["parameters"]["weight"] == "0")
        })
    })
    .await;
    setup.hooks.answer("/gate", 200);
    setup.wait_phase("Succeeded").await;
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_made_invalid_mid_run_stops_the_run_at_weight_zero() {
    let setup = Setup::start(|_| {
        canary_object(json!({"interval": "200ms", "maxWeight": 50, "stepWeight": 10}))
    })
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    api.set_image(NS, "podinfo", "podinfo:2");
    setup.wait_status(|s| s["canaryWeight"] == 20).await;
    // A metric the CRD accepts but no built-in answers.
    let mut canary = api.object("canaries", NS, "podinfo").unwrap();
    canary["spec"]["analysis"]["metrics"] = json!([{"name": "latency"}]);
    api.put_object("canaries", NS, "podinfo", canary);
    let status = setup.wait_phase("Failed").await["status"].clone();
    assert_eq!(status["canaryWeight"], 0);
    assert_eq!(status["conditions"][0]["reason"], "InvalidSpec");
    setup.wait_target_scaled_to_zero().await;
    let weights = api.object("dynamicconfigs", NS, "podinfo-canary");
    assert!(
        weights.as_ref().is_none_or(|c| c["spec"]["configs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["parameters"]["weight"] == "0")),
        "{weights:?}"
    );
    setup
        .wait_event("InvalidSpec", "metric \"latency\" is not built in")
        .await;
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_hooks_pass_and_confirm_promotion_holds_at_max_weight_while_analysis_goes_on() {
    let setup = Setup::start(|hooks| {
        canary_object(json!({
            "interval": "200ms", "threshold": 3, "maxWeight": 20, "stepWeight": 10,
            "metrics": [{"name": "request-success-rate", "thresholdRange": {"min": 99}}],
            "webhooks": [
                {"name": "smoke", "type": "pre-rollout", "url": format!("http://{hooks}/pre"), "retries": 2},
                {"name": "promote", "type": "confirm-promotion", "url": format!("http://{hooks}/promote")},
                {"name": "events", "type": "event", "url": format!("http://{hooks}/events")},
            ],
        }))
    })
    .await;
    let api = &setup.api;
    setup.wait_phase("Initialized").await;
    // Two failures then a success: within the hook's two retries, so no failed check.
    setup
        .hooks
        .failing
        .lock()
        .unwrap()
        .insert("/pre".to_owned(), 2);
    setup.hooks.answer("/promote", 403);
    api.set_image(NS, "podinfo", "podinfo:2");
    let held = setup
        .wait_status(|s| s["phase"] == "WaitingPromotion" && s["iterations"].as_u64() >= Some(5))
        .await;
    assert_eq!(setup.hooks.calls_to("/pre").len(), 3);
    assert_eq!(held["failedChecks"], 0, "{held}");
    assert_eq!(held["canaryWeight"], 20);
    // Metrics keep being checked while promotion waits.
    let checked = held["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["phase"] == "WaitingPromotion" && s["metrics"].is_array())
        .count();
    assert!(checked >= 2, "{held}");
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:1");
    setup.hooks.answer("/promote", 200);
    setup.wait_phase("Succeeded").await;
    assert_eq!(image(&setup.deployment("podinfo-primary")), "podinfo:2");

    // Deleting the Canary: its Terminating Event reaches the event hook too.
    setup.delete_canary().await;
    api.wait_for_object("canaries", NS, "podinfo", WAIT, |c| c.is_none())
        .await;
    let last = setup.hooks.wait_for_call("/events").await;
    assert!(
        setup
            .hooks
            .calls_to("/events")
            .iter()
            .any(|c| c["phase"] == "Terminating"
                && c["metadata"]["eventMessage"]
                    .as_str()
                    .unwrap()
                    .contains("restored with the primary's template")),
        "{last}"
    );
}
