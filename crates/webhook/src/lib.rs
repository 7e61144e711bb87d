//! The mutating admission webhook (wire.md §7): HTTPS on `webhook.addr`, `POST
//! /mutating-services` answers an `AdmissionReview` of a Pod CREATE with a JSON Patch that
//! injects what [`inject`] decides, `GET /health` answers 200. Kubernetes mode only: the
//! namespaces' labels and the registry Services come from watches ([`cluster`]), and the
//! `MutatingWebhookConfiguration` is kept right by [`configuration`].
//!
//! Unlike the reference, injection is opt-in: a pod without the labels (in a namespace without
//! them) is never changed, and the configuration's selectors keep the API server from calling
//! us for it at all.

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_ca as ca;
use dubbo_cp_kit::shutdown;

pub mod agent;
pub mod cluster;
pub mod config;
pub mod configuration;
pub mod inject;
mod pod;
pub mod xds;

pub use config::{DEFAULT_AGENT_IMAGE, WebhookConfig};

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use inject::{Context, Injected};

/// Largest review accepted: a pod is at most what etcd stores (1.5 MiB), its review twice that.
pub const MAX_REVIEW_BYTES: usize = 4 * 1024 * 1024;

/// What the webhook needs to decide.
pub trait Lookup: Send + Sync {
    /// The labels of `namespace` (empty when unknown).
    fn namespace_labels(&self, namespace: &str) -> std::collections::BTreeMap<String, String>;
    /// The first Service (by name) in `namespace` labelled `label: "true"`.
    fn service_with_label(&self, namespace: &str, label: &str) -> Option<String>;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InjectionLabels {
    kind: &'static str,
}

/// The webhook's metrics.
pub struct WebhookStats {
    reviews: Family<ResultLabels, Counter>,
    injections: Family<InjectionLabels, Counter>,
    latency: Histogram,
}

impl Default for WebhookStats {
    fn default() -> Self {
        Self {
            reviews: Family::default(),
            injections: Family::default(),
            latency: Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
        }
    }
}

impl WebhookStats {
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "webhook_reviews",
            "Admission reviews by result (mutated, unchanged, skipped, invalid, unsupported_media_type, timeout, busy, error)",
            self.reviews.clone(),
        );
        registry.register(
            "webhook_injections",
            "Pods injected, by kind (ca, xds, agent, zookeeper, nacos, kubernetes)",
            self.injections.clone(),
        );
        registry.register(
            "webhook_review_duration_seconds",
            "Time to answer one admission review",
            self.latency.clone(),
        );
    }

    fn count(&self, result: &'static str) {
        self.reviews.get_or_create(&ResultLabels { result }).inc();
    }
}

/// What the handler shares.
#[derive(Clone)]
pub struct Webhook {
    pub lookup: Arc<dyn Lookup>,
    /// `DUBBO_CA_ADDRESS`: our Service and TLS port.
    pub ca_address: Arc<str>,
    /// The agent sidecar's image (`webhook.agentImage`).
    pub agent_image: Arc<str>,
    pub timeout: Duration,
    pub stats: Arc<WebhookStats>,
    /// Reviews being decided at once; beyond it a pod is admitted unchanged at once, so a flood
    /// cannot take every blocking thread.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// The watches behind `lookup`, waited for and completed before a review (none in tests).
    pub cluster: Option<Arc<cluster::ClusterLookup>>,
}

/// Reviews decided at once.
pub const MAX_CONCURRENT_REVIEWS: usize = 256;

#[derive(serde::Deserialize)]
struct RequestHead {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    namespace: String,
}

#[derive(serde::Deserialize)]
struct ReviewHead {
    request: RequestHead,
}

/// The uid and namespace of a review body, read without building the pod.
fn head_of(body: &[u8]) -> (String, String) {
    serde_json::from_slice::<ReviewHead>(body)
        .map(|review| (review.request.uid, review.request.namespace))
        .unwrap_or_default()
}

fn uid_of(body: &[u8]) -> String {
    head_of(body).0
}

/// The pod a review is about, for the log line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    /// `metadata.name`, or `generateName` followed by `*` for a pod named by the API server.
    pub name: String,
}

/// How one review ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Mutated(Injected, PodRef),
    Unchanged,
    /// Not a Pod CREATE: allowed, untouched.
    Skipped(String),
    /// Malformed: allowed (fail open, as the reference and `failurePolicy: Ignore`).
    Invalid(String),
}

/// An `AdmissionReview` answer.
fn answer(uid: &str, patch: Option<Vec<u8>>, message: Option<&str>) -> Value {
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(patch) = patch {
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    if let Some(message) = message {
        response["status"] = json!({"message": message});
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// [`review_with`] the default agent image.
pub fn review(body: &[u8], lookup: &dyn Lookup, ca_address: &str) -> (Value, Outcome) {
    review_with(body, lookup, ca_address, DEFAULT_AGENT_IMAGE)
}

/// Decides one review: the answer to send and what happened. Never panics, whatever the body.
pub fn review_with(
    body: &[u8],
    lookup: &dyn Lookup,
    ca_address: &str,
    agent_image: &str,
) -> (Value, Outcome) {
    let review: Value = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(err) => {
            let message = format!("the body is not an AdmissionReview: {err}");
            return (answer("", None, Some(&message)), Outcome::Invalid(message));
        }
    };
    let Some(request) = review.get("request").filter(|r| r.is_object()) else {
        let message = "the AdmissionReview has no request".to_owned();
        return (answer("", None, Some(&message)), Outcome::Invalid(message));
    };
    let uid = request["uid"].as_str().unwrap_or_default();
    let kind = &request["kind"];
    let is_pod = kind["group"].as_str().unwrap_or_default().is_empty() && kind["kind"] == "Pod";
    if !is_pod || request["operation"] != "CREATE" {
        let message = format!(
            "only Pod CREATE is mutated, not {} {}",
            kind["kind"].as_str().unwrap_or("?"),
            request["operation"].as_str().unwrap_or("?")
        );
        return (answer(uid, None, Some(&message)), Outcome::Skipped(message));
    }
    let Some(pod) = request.get("object").filter(|o| o.is_object()) else {
        let message = "the review has no pod".to_owned();
        return (answer(uid, None, Some(&message)), Outcome::Invalid(message));
    };
    let namespace = request["namespace"]
        .as_str()
        .or_else(|| pod.pointer("/metadata/namespace").and_then(Value::as_str))
        .unwrap_or("default");
    let namespace_labels = lookup.namespace_labels(namespace);
    let services = |label: &str| lookup.service_with_label(namespace, label);
    let mut mutated = pod.clone();
    let injected = inject::inject(
        &mut mutated,
        &Context {
            namespace,
            namespace_labels: &namespace_labels,
            ca_address,
            service_with_label: &services,
            agent_image,
        },
    );
    let patch = json_patch::diff(pod, &mutated);
    if patch.0.is_empty() {
        return (answer(uid, None, None), Outcome::Unchanged);
    }
    let name = match pod.pointer("/metadata/name").and_then(Value::as_str) {
        Some(name) => name.to_owned(),
        None => format!(
            "{}*",
            pod.pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or_default()
        ),
    };
    let pod_ref = PodRef {
        namespace: namespace.to_owned(),
        name,
    };
    match serde_json::to_vec(&patch) {
        Ok(bytes) => (
            answer(uid, Some(bytes), None),
            Outcome::Mutated(injected, pod_ref),
        ),
        Err(err) => {
            let message = format!("cannot encode the patch: {err}");
            (answer(uid, None, Some(&message)), Outcome::Invalid(message))
        }
    }
}

pub fn router(webhook: Webhook) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/mutating-services", post(mutate))
        // The handler reads the body itself, with the limit and the deadline.
        .layer(DefaultBodyLimit::disable())
        .with_state(webhook)
}

async fn mutate(
    State(webhook): State<Webhook>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let started = Instant::now();
    let json = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json {
        webhook.stats.count("unsupported_media_type");
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid Content-Type, expect `application/json`\n",
        )
            .into_response();
    }
    let deadline = tokio::time::Instant::now() + webhook.timeout;
    // Reading the body counts against the deadline too: a slow sender cannot hold us.
    let body = match tokio::time::timeout_at(deadline, axum::body::to_bytes(body, MAX_REVIEW_BYTES))
        .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(err)) => {
            webhook.stats.count("invalid");
            let message =
                format!("cannot read the review (at most {MAX_REVIEW_BYTES} bytes): {err}");
            return (StatusCode::PAYLOAD_TOO_LARGE, message).into_response();
        }
        Err(_) => {
            webhook.stats.count("timeout");
            return axum::Json(answer(
                "",
                None,
                Some("the review was not sent in time; admitted unchanged"),
            ))
            .into_response();
        }
    };
    let Ok(_slot) = webhook.slots.clone().try_acquire_owned() else {
        webhook.stats.count("busy");
        let message = "too many reviews at once; admitted unchanged";
        return axum::Json(answer(&uid_of(&body), None, Some(message))).into_response();
    };
    if let Some(cluster) = &webhook.cluster {
        let (_, namespace) = head_of(&body);
        // Bounded by the deadline: a review waits for the first lists, not forever.
        let _ = tokio::time::timeout_at(deadline, cluster.prepare(&namespace)).await;
    }
    let lookup = webhook.lookup.clone();
    let ca_address = webhook.ca_address.clone();
    let agent_image = webhook.agent_image.clone();
    // Decoding and diffing a large pod is CPU work: off the async threads, and bounded in time.
    let work = {
        let body = body.clone();
        tokio::task::spawn_blocking(move || {
            review_with(&body, lookup.as_ref(), &ca_address, &agent_image)
        })
    };
    let (answer_body, outcome) = match tokio::time::timeout_at(deadline, work).await {
        Ok(Ok(done)) => done,
        Ok(Err(err)) => {
            webhook.stats.count("error");
            tracing::error!(error = %err, "admission review task failed");
            let message = "the review failed; admitted unchanged";
            return axum::Json(answer(&uid_of(&body), None, Some(message))).into_response();
        }
        Err(_) => {
            webhook.stats.count("timeout");
            let message = "the review did not finish in time; admitted unchanged";
            return axum::Json(answer(&uid_of(&body), None, Some(message))).into_response();
        }
    };
    let result = match &outcome {
        Outcome::Mutated(injected, pod) => {
            log_mutation(pod, injected);
            for kind in injection_kinds(injected) {
                webhook
                    .stats
                    .injections
                    .get_or_create(&InjectionLabels { kind })
                    .inc();
            }
            "mutated"
        }
        Outcome::Unchanged => "unchanged",
        Outcome::Skipped(_) => "skipped",
        Outcome::Invalid(message) => {
            tracing::warn!(%message, "malformed admission review; admitted unchanged");
            "invalid"
        }
    };
    webhook.stats.count(result);
    webhook
        .stats
        .latency
        .observe(started.elapsed().as_secs_f64());
    axum::Json(answer_body).into_response()
}

fn injection_kinds(injected: &Injected) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    if injected.ca {
        kinds.push("ca");
    }
    if injected.xds {
        kinds.push("xds");
    }
    if injected.agent {
        kinds.push("agent");
    }
    if let Some((registry, Some(_))) = &injected.registry {
        kinds.push(registry.name());
    }
    kinds
}

fn log_mutation(pod: &PodRef, injected: &Injected) {
    tracing::info!(
        namespace = %pod.namespace,
        pod = %pod.name,
        ca = injected.ca,
        xds = injected.xds,
        agent = injected.agent,
        registry = injected
            .registry
            .as_ref()
            .and_then(|(_, address)| address.as_deref())
            .unwrap_or("-"),
        "pod mutated"
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::collections::BTreeMap;

    struct Fixed;
    impl Lookup for Fixed {
        fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
            match namespace {
                "labelled" => BTreeMap::from([("dubbo-ca.inject".into(), "true".into())]),
                _ => BTreeMap::new(),
            }
        }
        fn service_with_label(&self, _: &str, _: &str) -> Option<String> {
            Some("zk".into())
        }
    }

    fn review_of(pod: Value, namespace: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "operation": "CREATE", "namespace": namespace, "object": pod}}))
        .unwrap()
    }

    #[test]
    fn the_patch_applied_to_the_pod_gives_the_injected_pod() {
        let pod = json!({"metadata": {"name": "p", "labels": {"registry-zookeeper-inject": "true"}},
                         "spec": {"containers": [{"name": "a", "image": "x",
                                                  "env": [{"name": "A", "value": "1"}]}],
                                  "futureField": {"kept": 1}}});
        let (answer, outcome) = review(&review_of(pod.clone(), "labelled"), &Fixed, "cp:30062");
        let Outcome::Mutated(injected, pod_ref) = outcome else {
            panic!("not mutated: {outcome:?}");
        };
        assert!(injected.ca);
        assert_eq!(
            (pod_ref.namespace.as_str(), pod_ref.name.as_str()),
            ("labelled", "p")
        );
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(answer["response"]["patch"].as_str().unwrap())
            .unwrap();
        // Only additions: nothing the user wrote is replaced or removed.
        let operations: Value = serde_json::from_slice(&bytes).unwrap();
        for operation in operations.as_array().unwrap() {
            assert_eq!(operation["op"], "add", "{operation}");
        }
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut patched = pod;
        json_patch::patch(&mut patched, &patch).unwrap();
        let expected = json!({
            "metadata": {"name": "p", "labels": {"registry-zookeeper-inject": "true"}},
            "spec": {
                "futureField": {"kept": 1},
                "volumes": [
                    {"name": "dubbo-ca-token", "projected": {"sources": [{"serviceAccountToken":
                        {"audience": "dubbo-ca", "expirationSeconds": 1800, "path": "token"}}]}},
                    {"name": "dubbo-ca-cert", "projected": {"sources": [{"configMap":
                        {"name": "dubbo-ca-cert", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
                ],
                "containers": [{
                    "name": "a", "image": "x",
                    "env": [
                        {"name": "A", "value": "1"},
                        {"name": "DUBBO_CA_ADDRESS", "value": "cp:30062"},
                        {"name": "DUBBO_CA_CERT_PATH", "value": "/var/run/secrets/dubbo-ca-cert/ca.crt"},
                        {"name": "DUBBO_OIDC_TOKEN", "value": "/var/run/secrets/dubbo-ca-token/token"},
                        {"name": "DUBBO_OIDC_TOKEN_TYPE", "value": "dubbo-ca-token"},
                        {"name": "DUBBO_REGISTRY_ADDRESS", "value": "zookeeper://zk.labelled.svc"},
                    ],
                    "volumeMounts": [
                        {"name": "dubbo-ca-token", "mountPath": "/var/run/secrets/dubbo-ca-token", "readOnly": true},
                        {"name": "dubbo-ca-cert", "mountPath": "/var/run/secrets/dubbo-ca-cert", "readOnly": true},
                    ],
                }],
            },
        });
        assert_eq!(patched, expected);
    }

    #[test]
    fn an_agent_pods_patch_only_adds_and_gives_a_valid_pod_with_the_native_sidecar() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "p", "labels": {"dubbo-agent.inject": "true"}},
                         "spec": {"initContainers": [{"name": "init", "image": "i"}],
                                  "containers": [{"name": "a", "image": "x"}]}});
        let (answer, outcome) = review_with(
            &review_of(pod.clone(), "plain"),
            &Fixed,
            "cp:30062",
            "registry.example/dubbo-cp:9",
        );
        let Outcome::Mutated(injected, _) = outcome else {
            panic!("not mutated: {outcome:?}");
        };
        assert!(injected.ca && injected.xds && injected.agent);
        assert_eq!(injection_kinds(&injected), ["ca", "xds", "agent"]);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(answer["response"]["patch"].as_str().unwrap())
            .unwrap();
        let operations: Value = serde_json::from_slice(&bytes).unwrap();
        for operation in operations.as_array().unwrap() {
            assert_eq!(operation["op"], "add", "{operation}");
        }
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut patched = pod;
        json_patch::patch(&mut patched, &patch).unwrap();
        // The typed pod takes it: what the API server decodes.
        let typed: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(patched.clone()).unwrap();
        let spec = typed.spec.unwrap();
        let init = spec.init_containers.unwrap();
        assert_eq!(init.len(), 2);
        assert_eq!(init[0].name, "init");
        assert_eq!(init[1].name, "dubbo-cp-agent");
        assert_eq!(
            init[1].image.as_deref(),
            Some("registry.example/dubbo-cp:9")
        );
        assert_eq!(init[1].restart_policy.as_deref(), Some("Always"));
        let volumes: Vec<String> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(
            volumes,
            ["dubbo-ca-token", "dubbo-ca-cert", "dubbo-cp-certs"]
        );
        let mounts = spec.containers[0].volume_mounts.clone().unwrap();
        let certs = mounts.iter().find(|m| m.name == "dubbo-cp-certs").unwrap();
        assert_eq!(certs.mount_path, "/var/run/dubbo-cp/certs");
        assert_eq!(certs.read_only, Some(true));
        // The default image when none is given.
        let (answer, _) = review(&review_of(patched.clone(), "plain"), &Fixed, "cp:30062");
        assert!(answer["response"].get("patch").is_none(), "idempotent");
        let fresh = json!({"metadata": {"name": "q", "labels": {"dubbo-agent.inject": "true"}},
                           "spec": {"containers": [{"name": "a"}]}});
        let (answer, _) = review(&review_of(fresh.clone(), "plain"), &Fixed, "cp:30062");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(answer["response"]["patch"].as_str().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut patched = fresh;
        json_patch::patch(&mut patched, &patch).unwrap();
        assert_eq!(
            patched["spec"]["initContainers"][0]["image"],
            DEFAULT_AGENT_IMAGE
        );
    }

    #[test]
    fn a_pod_without_containers_gets_no_containers_field() {
        let pod =
            json!({"metadata": {"name": "p", "labels": {"dubbo-ca.inject": "true"}}, "spec": {}});
        let (answer, _) = review(&review_of(pod, "plain"), &Fixed, "cp");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(answer["response"]["patch"].as_str().unwrap())
            .unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("containers"));
    }

    #[test]
    fn malformed_empty_and_foreign_reviews_are_allowed_unchanged() {
        for (body, uid, what) in [
            (b"{not json".to_vec(), "", "invalid"),
            (b"{}".to_vec(), "", "invalid"),
            (serde_json::to_vec(&json!({"request": {"uid": "u", "kind": {"group": "apps", "kind": "Deployment"}, "operation": "CREATE", "object": {}}})).unwrap(), "u", "skipped"),
            (serde_json::to_vec(&json!({"request": {"uid": "u", "kind": {"group": "", "kind": "Pod"}, "operation": "UPDATE", "object": {}}})).unwrap(), "u", "skipped"),
            (serde_json::to_vec(&json!({"request": {"uid": "u", "kind": {"group": "", "kind": "Pod"}, "operation": "CREATE"}})).unwrap(), "u", "invalid"),
        ] {
            let (answer, outcome) = review(&body, &Fixed, "cp");
            assert_eq!(answer["response"]["allowed"], true, "{what}");
            assert_eq!(answer["response"]["uid"], uid);
            assert!(answer["response"].get("patch").is_none());
            assert!(answer["response"]["status"]["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert_eq!(
                matches!(outcome, Outcome::Invalid(_)),
                what == "invalid",
                "{what}: {outcome:?}"
            );
        }
    }

    #[test]
    fn a_pod_without_labels_gets_no_patch() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        let (answer, outcome) = review(&review_of(pod, "plain"), &Fixed, "cp");
        assert_eq!(outcome, Outcome::Unchanged);
        assert!(answer["response"].get("patch").is_none());
    }
}
