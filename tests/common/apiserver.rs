//! A stateful, in-process Kubernetes API server for ServiceNameMapping objects, served over
//! real HTTP on loopback so the real `kube::Client` talks to it: get, list, watch (from a
//! resourceVersion, with bookmarks, 410 Gone when expired), create, update (409 on a stale
//! resourceVersion), delete. Failures can be injected: 500s on writes, latency, an outage (503 on
//! every request, open watches cut), blocked watches.
#![allow(dead_code)]
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

const GROUP_PATH: &str = "/apis/dubbo.apache.org/v1alpha1";
const CORE_PATH: &str = "/api/v1";
const ADMISSION_PATH: &str = "/apis/admissionregistration.k8s.io/v1";
/// Deployments, ControllerRevisions, Leases and Events (the canary controller's).
const OTHER_GROUP_PATHS: [&str; 5] = [
    "/apis/apps/v1",
    "/apis/autoscaling/v2",
    "/apis/coordination.k8s.io/v1",
    "/apis/events.k8s.io/v1",
    "/apis/discovery.k8s.io/v1",
];
const SNP: &str = "servicenamemappings";
/// The issuer of the service-account tokens the fixture's keys sign.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

type Key = (String, String, String);

fn key(resource: &str, namespace: &str, name: &str) -> Key {
    (resource.to_owned(), namespace.to_owned(), name.to_owned())
}

#[derive(Default)]
struct Inner {
    rv: u64,
    /// Objects by (resource, namespace, name); resources are plurals (`servicenamemappings`,
    /// `pods`).
    objects: BTreeMap<Key, Value>,
    /// Every change, for watches to replay: (resourceVersion, type, resource, object).
    events: Vec<(u64, &'static str, String, Value)>,
    /// Watches from a resourceVersion below this get 410 Gone.
    oldest_watchable: u64,
    fail_writes: u32,
    /// Objects whose creates and updates are refused with this code, as a validating admission
    /// webhook or a missing RBAC rule would, until cleared.
    refused: BTreeMap<(String, String), u16>,
    /// Updates answered 409 whatever their resourceVersion, as if another writer won the race.
    conflict_updates: u32,
    /// Requests answered 429 with this Retry-After (seconds).
    throttle: (u32, u32),
    down: bool,
    watches_blocked: bool,
    latency: Duration,
    /// Successful creates and updates, with when they happened and to which object.
    write_times: Vec<Instant>,
    writes_per_object: BTreeMap<(String, String), usize>,
    requests: u64,
    /// Watches answered with 410 Gone.
    gone: u64,
    /// TokenReview: token -> (username, audiences it is valid for).
    tokens: BTreeMap<String, (String, Vec<String>)>,
    token_reviews: u64,
    /// The service-account signing keys served at /openid/v1/jwks.
    jwks: Value,
    /// Resources whose CRD is "not installed": every request for them gets 404.
    missing: std::collections::BTreeSet<String>,
    /// Resources every request to which fails with this code (an RBAC 403, a 500 storm).
    failing: BTreeMap<String, u16>,
    /// GETs of single pods.
    pod_gets: u64,
    /// Requests per resource (plural), counted on arrival.
    requests_per_resource: BTreeMap<String, u64>,
    /// Requests for one ServiceNameMapping object (reads and writes), counted on arrival.
    mapping_object_requests: u64,
    /// Creates and updates of core objects (the CA's Secret and ConfigMaps) by clients.
    core_writes: BTreeMap<Key, usize>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// The newest resourceVersion, so watches wake on changes.
    latest: watch::Sender<u64>,
    /// Bumped to cut every open watch.
    cut: watch::Sender<u64>,
    /// Watches streaming right now.
    active_watches: watch::Sender<usize>,
}

/// Counts a watch as active while it lives.
struct ActiveWatch(Arc<Shared>);

impl ActiveWatch {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.active_watches.send_modify(|n| *n += 1);
        ActiveWatch(shared.clone())
    }
}

impl Drop for ActiveWatch {
    fn drop(&mut self) {
        self.0.active_watches.send_modify(|n| *n -= 1);
    }
}

#[derive(Clone)]
pub struct ApiServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &body,
    )
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = code;
    response.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

impl ApiServer {
    pub async fn start() -> ApiServer {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                rv: 1,
                ..Inner::default()
            }),
            latest: watch::Sender::new(1),
            cut: watch::Sender::new(0),
            active_watches: watch::Sender::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        ApiServer { addr, shared }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- failure injection ----

    pub fn fail_next_writes(&self, n: u32) {
        self.lock().fail_writes = n;
    }

    /// Answers the next `n` requests with 429 Too Many Requests and `retry_after_seconds`.
    /// Refuses every create and update of one object with `code` (e.g. 422, 403).
    pub fn refuse_writes_to(&self, namespace: &str, name: &str, code: u16) {
        self.lock()
            .refused
            .insert((namespace.to_owned(), name.to_owned()), code);
    }

    pub fn allow_writes_to(&self, namespace: &str, name: &str) {
        self.lock()
            .refused
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    pub fn throttle_next_requests(&self, n: u32, retry_after_seconds: u32) {
        self.lock().throttle = (n, retry_after_seconds);
    }

    pub fn conflict_next_updates(&self, n: u32) {
        self.lock().conflict_updates = n;
    }

    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// An outage: every request gets 503 and open watches are cut.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
        if down {
            self.shared.cut.send_modify(|g| *g += 1);
        }
    }

    /// Cuts open watches and refuses new ones (lists still work); returns once none is open.
    pub async fn block_watches(&self, blocked: bool) {
        self.lock().watches_blocked = blocked;
        if blocked {
            self.shared.cut.send_modify(|g| *g += 1);
            let mut active = self.shared.active_watches.subscribe();
            let closed =
                tokio::time::timeout(Duration::from_secs(5), active.wait_for(|n| *n == 0)).await;
            assert!(matches!(closed, Ok(Ok(_))), "open watches did not close");
        }
    }

    /// Makes every resourceVersion seen so far too old: resuming watches get 410 Gone.
    pub fn expire_resource_versions(&self) {
        let mut inner = self.lock();
        inner.oldest_watchable = inner.rv + 1;
        drop(inner);
        self.shared.cut.send_modify(|g| *g += 1);
    }

    // ---- what happened ----

    pub fn writes(&self) -> usize {
        self.lock().write_times.len()
    }

    /// Successful creates and updates per (namespace, name).
    pub fn writes_per_object(&self) -> BTreeMap<(String, String), usize> {
        self.lock().writes_per_object.clone()
    }

    pub fn write_times(&self) -> Vec<Instant> {
        self.lock().write_times.clone()
    }

    /// Every version object `name` of `resource` had, oldest first: (resourceVersion, event
    /// type, object).
    pub fn history(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Vec<(u64, String, Value)> {
        self.lock()
            .events
            .iter()
            .filter(|(_, _, r, o)| {
                r == resource
                    && o["metadata"]["namespace"] == namespace
                    && o["metadata"]["name"] == name
            })
            .map(|(rv, kind, _, object)| (*rv, (*kind).to_owned(), object.clone()))
            .collect()
    }

    /// Makes `token` authenticate as `username` for `audiences` (empty: the API server's).
    pub fn add_token(&self, token: &str, username: &str, audiences: &[&str]) {
        let audiences = audiences.iter().map(|a| a.to_string()).collect();
        self.lock()
            .tokens
            .insert(token.to_owned(), (username.to_owned(), audiences));
    }

    pub fn token_reviews(&self) -> u64 {
        self.lock().token_reviews
    }

    pub fn gone_served(&self) -> u64 {
        self.lock().gone
    }

    /// Requests so far per resource (plural).
    pub fn requests_per_resource(&self) -> BTreeMap<String, u64> {
        self.lock().requests_per_resource.clone()
    }

    pub fn requests(&self) -> u64 {
        self.lock().requests
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(&key(SNP, namespace, name)).cloned()
    }

    /// The applications of an object, as stored.
    pub fn applications(&self, namespace: &str, name: &str) -> Vec<String> {
        self.get(namespace, name)
            .and_then(|o| serde_json::from_value(o["spec"]["applicationNames"].clone()).ok())
            .unwrap_or_default()
    }

    /// ServiceNameMapping objects stored.
    pub fn object_count(&self) -> usize {
        self.lock().objects.keys().filter(|k| k.0 == SNP).count()
    }

    // ---- Deployments, as the Deployment controller and the kubelet keep them ----

    /// Creates Deployment `name` with `replicas` pods of `image`, selected by `app: <name>`.
    pub fn put_deployment(&self, namespace: &str, name: &str, replicas: i64, image: &str) {
        let object = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name},
                         "generation": 1},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "app", "image": image}]}}},
        });
        let mut inner = self.lock();
        self.store(
            &mut inner,
            key("deployments", namespace, name),
            object,
            "ADDED",
        );
    }

    /// Changes Deployment `name` in place (a MODIFIED event), as its owner would.
    fn edit_deployment(&self, namespace: &str, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut inner = self.lock();
        let key = key("deployments", namespace, name);
        let mut object = inner
            .objects
            .get(&key)
            .cloned()
            .expect("no such deployment");
        edit(&mut object);
        self.store(&mut inner, key, object, "MODIFIED");
    }

    /// Sets the image of Deployment `name` (a new pod template), as `kubectl set image` would.
    pub fn set_image(&self, namespace: &str, name: &str, image: &str) {
        self.edit_deployment(namespace, name, |object| {
            object["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
            let generation = object["metadata"]["generation"].as_i64().unwrap_or(1);
            object["metadata"]["generation"] = json!(generation + 1);
        });
    }

    /// Sets Deployment `name`'s replicas, as `kubectl scale` does.
    pub fn set_replicas(&self, namespace: &str, name: &str, replicas: i64) {
        self.edit_deployment(namespace, name, |object| {
            object["spec"]["replicas"] = json!(replicas);
            let generation = object["metadata"]["generation"].as_i64().unwrap_or(1);
            object["metadata"]["generation"] = json!(generation + 1);
        });
    }

    /// Plays the Deployment controller and the kubelet for `name`: its status says rolled out
    /// and healthy, and exactly `spec.replicas` ready pods run its template, with IPs
    /// `<ip_prefix><n>`. Returns the pods' IPs.
    pub fn roll_out(&self, namespace: &str, name: &str, ip_prefix: &str) -> Vec<String> {
        self.roll_out_as(namespace, name, ip_prefix, true)
    }

    /// The same, the pods `ready` or not yet: a kubelet reports a pod's IP before its
    /// readiness probe passes, and the Deployment counts it ready only then
    /// ([`ApiServer::make_ready`], [`ApiServer::count_ready`]).
    fn roll_out_as(
        &self,
        namespace: &str,
        name: &str,
        ip_prefix: &str,
        ready: bool,
    ) -> Vec<String> {
        let (replicas, labels, generation) = {
            let inner = self.lock();
            let object = inner
                .objects
                .get(&key("deployments", namespace, name))
                .cloned()
                .expect("no such deployment");
            (
                object["spec"]["replicas"].as_i64().unwrap_or(1),
                object["spec"]["template"]["metadata"]["labels"].clone(),
                object["metadata"]["generation"].as_i64().unwrap_or(1),
            )
        };
        let ready_replicas = if ready { replicas } else { 0 };
        self.set_deployment_status(
            namespace,
            name,
            json!({"observedGeneration": generation, "replicas": replicas,
                   "updatedReplicas": replicas, "readyReplicas": ready_replicas,
                   "availableReplicas": ready_replicas}),
        );
        let mut inner = self.lock();
        let stale: Vec<Key> = inner
            .objects
            .keys()
            .filter(|k| k.0 == "pods" && k.1 == namespace && k.2.starts_with(&format!("{name}-x")))
            .cloned()
            .collect();
        for pod in stale {
            self.remove(&mut inner, &pod);
        }
        let mut ips = Vec::new();
        for i in 0..replicas {
            let ip = format!("{ip_prefix}{}", i + 1);
            let pod = format!("{name}-x{generation}-p{i}");
            let object = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": namespace, "labels": labels.clone(),
                             "uid": format!("{pod}-uid")},
                "status": {"podIP": ip, "phase": "Running",
                           "conditions": [{"type": "Ready", "status": ready_status(ready)}]},
            });
            self.store(&mut inner, key("pods", namespace, &pod), object, "ADDED");
            ips.push(ip);
        }
        ips
    }

    /// The kubelet: pod `pod` passes its readiness probe. The Deployment counts it once
    /// [`ApiServer::count_ready`] runs, as its controller does on its own time.
    pub fn make_ready(&self, namespace: &str, pod: &str) {
        let mut inner = self.lock();
        let pod_key = key("pods", namespace, pod);
        let Some(mut object) = inner.objects.get(&pod_key).cloned() else {
            return;
        };
        object["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        self.store(&mut inner, pod_key, object, "MODIFIED");
    }

    /// The Deployment controller: Deployment `deployment` (if it still exists) counts its
    /// ready pods as ready and available.
    pub fn count_ready(&self, namespace: &str, deployment: &str) {
        if self.object("deployments", namespace, deployment).is_none() {
            return;
        }
        let prefix = format!("{deployment}-x");
        let ready = self
            .objects_of("pods", namespace)
            .iter()
            .filter(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .filter(|p| pod_ready(p))
            .count();
        self.edit_deployment(namespace, deployment, |object| {
            object["status"]["readyReplicas"] = json!(ready);
            object["status"]["availableReplicas"] = json!(ready);
        });
    }

    /// One pass of the Deployment controller and the kubelet: every Deployment of `namespace`
    /// whose spec moved is rolled out, its pods at `ip_prefix(name)` addresses.
    pub fn roll_out_changed(&self, namespace: &str, ip_prefix: impl Fn(&str) -> String) {
        self.roll_out_changed_as(namespace, ip_prefix, true);
    }

    /// The same, the new pods not ready until [`ApiServer::make_ready`] says so. Returns the
    /// Deployments rolled out.
    pub fn roll_out_changed_unready(
        &self,
        namespace: &str,
        ip_prefix: impl Fn(&str) -> String,
    ) -> Vec<String> {
        self.roll_out_changed_as(namespace, ip_prefix, false)
    }

    fn roll_out_changed_as(
        &self,
        namespace: &str,
        ip_prefix: impl Fn(&str) -> String,
        ready: bool,
    ) -> Vec<String> {
        let mut rolled = Vec::new();
        for deployment in self.objects_of("deployments", namespace) {
            let generation = deployment["metadata"]["generation"].as_i64();
            let status = &deployment["status"];
            if status["observedGeneration"].as_i64() != generation
                || status["replicas"] != deployment["spec"]["replicas"]
            {
                let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
                self.roll_out_as(namespace, name, &ip_prefix(name), ready);
                rolled.push(name.to_owned());
            }
        }
        rolled
    }

    /// Replaces Deployment `name`'s status (the Deployment controller's view).
    pub fn set_deployment_status(&self, namespace: &str, name: &str, status: Value) {
        self.edit_deployment(namespace, name, |object| object["status"] = status);
    }

    /// Objects of `resource` in `namespace`.
    pub fn objects_of(&self, resource: &str, namespace: &str) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|(k, _)| k.0 == resource && k.1 == namespace)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Waits until `check` holds for object `name` of `resource` (None: absent).
    pub async fn wait_for_object(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        limit: Duration,
        check: impl Fn(Option<&Value>) -> bool,
    ) -> Option<Value> {
        let mut latest = self.shared.latest.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            latest.borrow_and_update();
            let object = self.object(resource, namespace, name);
            if check(object.as_ref()) {
                return object;
            }
            if tokio::time::timeout_at(deadline, latest.changed())
                .await
                .is_err()
            {
                panic!(
                    "{resource} {namespace}/{name} did not reach the expected state within {limit:?}: {}",
                    serde_json::to_string_pretty(&object).unwrap_or_default()
                );
            }
        }
    }

    // ---- service-account tokens and pods ----

    /// Serves `jwks` as the cluster's service-account keys (OIDC discovery names [`ISSUER`]).
    pub fn set_jwks(&self, jwks: Value) {
        self.lock().jwks = jwks;
    }

    /// Creates or replaces a pod (the kubelet's view: name, UID, labels, IPs).
    pub fn put_pod(&self, namespace: &str, name: &str, uid: &str, labels: Value, ips: &[&str]) {
        let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        let object = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": labels},
            "status": {"podIP": ips.first(), "podIPs": pod_ips},
        });
        let mut inner = self.lock();
        let key = key("pods", namespace, name);
        let kind = if inner.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.store(&mut inner, key, object, kind);
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut inner = self.lock();
        self.remove(&mut inner, &key("pods", namespace, name));
    }

    /// Creates and updates clients made to one core object (Secret, ConfigMap).
    pub fn core_writes(&self, resource: &str, namespace: &str, name: &str) -> usize {
        self.lock()
            .core_writes
            .get(&key(resource, namespace, name))
            .copied()
            .unwrap_or(0)
    }

    /// Any stored object, as `kubectl get -o json` would show it.
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&key(resource, namespace, name))
            .cloned()
    }

    /// Creates or replaces an object as `kubectl apply` would (no resourceVersion check).
    pub fn put_object(&self, resource: &str, namespace: &str, name: &str, mut object: Value) {
        let mut inner = self.lock();
        let key = key(resource, namespace, name);
        let kind = if inner.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        object["metadata"]["name"] = json!(name);
        if let Some(existing) = inner.objects.get(&key) {
            object["metadata"]["uid"] = existing["metadata"]["uid"].clone();
        }
        self.store(&mut inner, key, object, kind);
    }

    /// Deletes an object as `kubectl delete` would.
    pub fn delete_object(&self, resource: &str, namespace: &str, name: &str) -> bool {
        let mut inner = self.lock();
        self.remove(&mut inner, &key(resource, namespace, name))
            .is_some()
    }

    /// A namespace, as `kubectl create namespace` makes it.
    pub fn create_namespace(&self, name: &str) {
        self.create_labelled_namespace(name, json!({}));
    }

    /// A namespace carrying `labels` (e.g. the webhook's opt-in `dubbo-ca.inject: "true"`).
    pub fn create_labelled_namespace(&self, name: &str, labels: Value) {
        self.put_object(
            "namespaces",
            "",
            name,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "labels": labels},
                   "status": {"phase": "Active"}}),
        );
    }

    /// Waits until `check` holds for the fixture's objects, or fails after `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&ApiServer) -> bool,
    ) {
        let mut changes = self.shared.latest.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if check(self) {
                return;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                panic!("timed out waiting for {what}");
            }
        }
    }

    /// Makes `resource` (a plural) unknown, as when its CRD is not installed, or known again.
    /// As on a real server, removing it ends the open watches (they come back to a 404), and
    /// a CRD installed again starts a new watch cache: resuming from an older resourceVersion
    /// gets 410 Gone, so watchers list again. (The objects stay: a real deletion would delete
    /// them first; this is the 404 without them.)
    pub fn set_missing(&self, resource: &str, missing: bool) {
        let mut inner = self.lock();
        if missing {
            inner.missing.insert(resource.to_owned());
        } else if inner.missing.remove(resource) {
            inner.oldest_watchable = inner.rv + 1;
        }
        drop(inner);
        self.shared.cut.send_modify(|g| *g += 1);
    }

    /// Makes every request to `resource` fail with `code` (Some), or succeed again (None);
    /// open watches are cut, so a failure begun mid-run reaches watchers too.
    pub fn set_failing(&self, resource: &str, code: Option<u16>) {
        let mut inner = self.lock();
        match code {
            Some(code) => inner.failing.insert(resource.to_owned(), code),
            None => inner.failing.remove(resource),
        };
        drop(inner);
        if code.is_some() {
            self.shared.cut.send_modify(|g| *g += 1);
        }
    }

    /// GETs of single pods (lookups of pods the watch had not seen).
    /// Requests for single ServiceNameMapping objects so far, counted when they arrive (before
    /// any injected latency): a write that has started.
    pub fn mapping_object_requests(&self) -> u64 {
        self.lock().mapping_object_requests
    }

    pub fn pod_gets(&self) -> u64 {
        self.lock().pod_gets
    }

    // ---- kubectl ----

    /// `kubectl apply` of an object with this spec (any JSON, valid or not).
    pub fn kubectl_apply(&self, namespace: &str, name: &str, spec: Value) {
        let mut inner = self.lock();
        let key = key(SNP, namespace, name);
        let object = match inner.objects.get(&key) {
            Some(existing) => {
                let mut object = existing.clone();
                object["spec"] = spec;
                object
            }
            None => json!({
                "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "ServiceNameMapping",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec,
            }),
        };
        let kind = if inner.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.store(&mut inner, key, object, kind);
    }

    /// `kubectl apply` of a rule object (`resource` is the plural, e.g. `tagroutes`).
    pub fn kubectl_apply_rule(
        &self,
        resource: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        spec: Value,
    ) {
        let mut inner = self.lock();
        let key = key(resource, namespace, name);
        let (object, event) = match inner.objects.get(&key) {
            Some(existing) => {
                let mut object = existing.clone();
                object["spec"] = spec;
                (object, "MODIFIED")
            }
            None => (
                json!({
                    "apiVersion": "dubbo.apache.org/v1alpha1", "kind": kind,
                    "metadata": {"name": name, "namespace": namespace}, "spec": spec,
                }),
                "ADDED",
            ),
        };
        self.store(&mut inner, key, object, event);
    }

    pub fn kubectl_delete_rule(&self, resource: &str, namespace: &str, name: &str) {
        let mut inner = self.lock();
        self.remove(&mut inner, &key(resource, namespace, name));
    }

    pub fn kubectl_delete(&self, namespace: &str, name: &str) {
        let mut inner = self.lock();
        self.remove(&mut inner, &key(SNP, namespace, name));
    }

    fn store(&self, inner: &mut Inner, key: Key, mut object: Value, kind: &'static str) {
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        // Cluster-scoped objects (namespaces) have no namespace.
        if !key.1.is_empty() {
            object["metadata"]["namespace"] = json!(key.1.clone());
        }
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{rv}"));
            object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        let resource = key.0.clone();
        inner.objects.insert(key, object.clone());
        inner.events.push((rv, kind, resource, object));
        self.shared.latest.send_replace(rv);
    }

    fn remove(&self, inner: &mut Inner, key: &Key) -> Option<Value> {
        let mut object = inner.objects.remove(key)?;
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        inner
            .events
            .push((rv, "DELETED", key.0.clone(), object.clone()));
        self.shared.latest.send_replace(rv);
        Some(object)
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let server = ApiServer {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        shared,
    };
    let latency = {
        let mut inner = server.lock();
        inner.requests += 1;
        if uri.path().contains("/servicenamemappings/") {
            inner.mapping_object_requests += 1;
        }
        if inner.down {
            return status(503, "ServiceUnavailable", "the API server is down");
        }
        if inner.throttle.0 > 0 {
            inner.throttle.0 -= 1;
            let body = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too many requests", "reason": "TooManyRequests", "code": 429,
                "details": {"retryAfterSeconds": inner.throttle.1},
            });
            let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
            response.headers_mut().insert(
                "retry-after",
                axum::http::HeaderValue::from(inner.throttle.1),
            );
            return response;
        }
        inner.latency
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if method == Method::POST && uri.path() == "/apis/authentication.k8s.io/v1/tokenreviews" {
        return token_review(&server, &body);
    }
    match (&method, uri.path()) {
        (&Method::GET, "/.well-known/openid-configuration") => {
            return json_response(
                StatusCode::OK,
                &json!({"issuer": ISSUER, "jwks_uri": format!("{ISSUER}/openid/v1/jwks")}),
            );
        }
        (&Method::GET, "/openid/v1/jwks") => {
            let jwks = server.lock().jwks.clone();
            let jwks = if jwks.is_null() {
                json!({"keys": []})
            } else {
                jwks
            };
            return json_response(StatusCode::OK, &jwks);
        }
        _ => {}
    }
    let rest = match uri
        .path()
        .strip_prefix(GROUP_PATH)
        .or_else(|| uri.path().strip_prefix(ADMISSION_PATH))
        .or_else(|| {
            OTHER_GROUP_PATHS
                .iter()
                .find_map(|prefix| uri.path().strip_prefix(prefix))
        }) {
        Some(rest) => rest,
        None => match uri.path().strip_prefix(CORE_PATH) {
            Some(rest)
                if ["/pods", "/secrets", "/configmaps", "/services"]
                    .iter()
                    .any(|r| rest.contains(r))
                    || rest.starts_with("/namespaces") =>
            {
                rest
            }
            _ => return status(404, "NotFound", "unknown path"),
        },
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let params = query(&uri);
    let resource = match segments.as_slice() {
        [resource, ..] if segments.len() == 1 => Some(*resource),
        ["namespaces", _, resource, ..] => Some(*resource),
        _ => None,
    };
    if let Some(resource) = resource {
        *server
            .lock()
            .requests_per_resource
            .entry(resource.to_owned())
            .or_default() += 1;
    }
    if resource.is_some_and(|r| server.lock().missing.contains(r)) {
        // What a real kube-apiserver answers for a resource it does not serve: not a Status,
        // a plain-text 404.
        let mut response = Response::new(Body::from("404 page not found\n"));
        *response.status_mut() = StatusCode::NOT_FOUND;
        response.headers_mut().insert(
            "content-type",
            axum::http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return response;
    }
    if let Some(code) = resource.and_then(|r| server.lock().failing.get(r).copied()) {
        let reason = match code {
            401 => "Unauthorized",
            403 => "Forbidden",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            _ => "InternalError",
        };
        return status(code, reason, "injected failure for this resource");
    }
    match (method, segments.as_slice()) {
        // Cluster-scoped objects (namespaces, webhook configurations), keyed with an empty
        // namespace.
        (Method::POST, [resource]) => create(&server, resource, "", &body),
        (Method::GET, [resource, name]) => match server.object(resource, "", name) {
            Some(object) => json_response(StatusCode::OK, &object),
            None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
        },
        (Method::PUT, [resource, name]) => replace(&server, resource, "", name, &body),
        (Method::DELETE, [resource, name]) => {
            let mut inner = server.lock();
            match server.remove(&mut inner, &key(resource, "", name)) {
                Some(object) => json_response(StatusCode::OK, &object),
                None => status(404, "NotFound", "not found"),
            }
        }
        (Method::GET, [resource]) => list_or_watch(&server, resource, None, &params),
        (Method::GET, ["namespaces", ns, resource]) => {
            list_or_watch(&server, resource, Some(ns), &params)
        }
        (Method::POST, ["namespaces", ns, resource]) => create(&server, resource, ns, &body),
        (Method::GET, ["namespaces", ns, resource, name]) => {
            let mut inner = server.lock();
            if *resource == "pods" {
                inner.pod_gets += 1;
            }
            match inner.objects.get(&key(resource, ns, name)) {
                Some(object) => json_response(StatusCode::OK, object),
                None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
            }
        }
        (Method::PUT, ["namespaces", ns, resource, name]) => {
            replace(&server, resource, ns, name, &body)
        }
        (Method::PUT, ["namespaces", ns, resource, name, "status"]) => {
            replace_status(&server, resource, ns, name, &body)
        }
        (Method::PATCH, ["namespaces", ns, resource, name]) => {
            let content_type = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            patch(&server, resource, ns, name, content_type, &body)
        }
        (Method::DELETE, ["namespaces", ns, resource, name]) => {
            let mut inner = server.lock();
            // An object with finalizers is only marked; the last finalizer's removal deletes it.
            if let Some(object) = inner.objects.get(&key(resource, ns, name)).cloned()
                && object["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty())
            {
                let mut marked = object;
                if marked["metadata"]["deletionTimestamp"].is_null() {
                    marked["metadata"]["deletionTimestamp"] = json!(
                        humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
                    );
                    server.store(
                        &mut inner,
                        key(resource, ns, name),
                        marked.clone(),
                        "MODIFIED",
                    );
                }
                return json_response(StatusCode::OK, &marked);
            }
            // DeleteOptions.preconditions, as the API server checks them.
            let options: Value = serde_json::from_slice(&body).unwrap_or_default();
            let wanted = &options["preconditions"]["resourceVersion"];
            if let (Some(wanted), Some(object)) =
                (wanted.as_str(), inner.objects.get(&key(resource, ns, name)))
                && object["metadata"]["resourceVersion"].as_str() != Some(wanted)
            {
                return status(409, "Conflict", "Precondition failed: resourceVersion");
            }
            match server.remove(&mut inner, &key(resource, ns, name)) {
                Some(object) => json_response(StatusCode::OK, &object),
                None => status(404, "NotFound", "not found"),
            }
        }
        _ => status(405, "MethodNotAllowed", "not supported by the fixture"),
    }
}

/// Answers a TokenReview like the API server: authenticated only for a known token and, when
/// audiences are asked for, only if the token is valid for one of them.
fn token_review(server: &ApiServer, body: &Bytes) -> Response {
    let Ok(review) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "invalid JSON");
    };
    let token = review["spec"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let wanted: Vec<String> =
        serde_json::from_value(review["spec"]["audiences"].clone()).unwrap_or_default();
    let mut inner = server.lock();
    inner.token_reviews += 1;
    let answer = match inner.tokens.get(&token) {
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
        Some((username, valid_for)) => {
            let granted: Vec<&String> = wanted.iter().filter(|a| valid_for.contains(a)).collect();
            if !wanted.is_empty() && granted.is_empty() {
                json!({"authenticated": false, "error": "token audiences do not match"})
            } else {
                json!({"authenticated": true, "audiences": granted, "user": {
                    "username": username,
                    "extra": {"authentication.kubernetes.io/pod-name": ["provider-7d9f"]},
                }})
            }
        }
    };
    json_response(
        StatusCode::CREATED,
        &json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "metadata": {}, "spec": review["spec"].clone(), "status": answer,
        }),
    )
}

fn write_allowed(inner: &mut Inner, namespace: &str, name: &str) -> Option<Response> {
    if let Some(code) = inner.refused.get(&(namespace.to_owned(), name.to_owned())) {
        return Some(status(
            *code,
            "Invalid",
            "refused by the test (admission webhook)",
        ));
    }
    if inner.fail_writes > 0 {
        inner.fail_writes -= 1;
        return Some(status(500, "InternalError", "injected failure"));
    }
    None
}

/// Counts a control plane's write: mapping and rule writes in the counters the write tests
/// read, the CA's Secret and ConfigMaps (core resources) apart.
fn count_write(inner: &mut Inner, key: &Key) {
    if CORE_RESOURCES.contains(&key.0.as_str()) {
        *inner.core_writes.entry(key.clone()).or_default() += 1;
        return;
    }
    inner.write_times.push(Instant::now());
    *inner
        .writes_per_object
        .entry((key.1.clone(), key.2.clone()))
        .or_default() += 1;
}

const CORE_RESOURCES: [&str; 13] = [
    "horizontalpodautoscalers",
    "secrets",
    "configmaps",
    "namespaces",
    "pods",
    "services",
    "endpointslices",
    "mutatingwebhookconfigurations",
    "deployments",
    "controllerrevisions",
    "leases",
    "events",
    "canaries",
];

/// Stores a client's write, counts it, and answers with the stored object (201 for a create).
fn commit(
    server: &ApiServer,
    inner: &mut Inner,
    key: Key,
    object: Value,
    kind: &'static str,
) -> Response {
    server.store(inner, key.clone(), object, kind);
    count_write(inner, &key);
    let stored = inner.objects.get(&key).cloned().unwrap_or_default();
    let code = if kind == "ADDED" {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json_response(code, &stored)
}

fn create(server: &ApiServer, resource: &str, namespace: &str, body: &Bytes) -> Response {
    let Ok(object) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "invalid JSON");
    };
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(422, "Invalid", "metadata.name is required");
    };
    let mut inner = server.lock();
    if let Some(failure) = write_allowed(&mut inner, namespace, &name) {
        return failure;
    }
    let key = key(resource, namespace, &name);
    if inner.objects.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("{resource} \"{name}\" already exists"),
        );
    }
    let mut object = object;
    if matches!(resource, "deployments" | "canaries") {
        object["metadata"]["generation"] = json!(1);
    }
    commit(server, &mut inner, key, object, "ADDED")
}

fn replace(
    server: &ApiServer,
    resource: &str,
    namespace: &str,
    name: &str,
    body: &Bytes,
) -> Response {
    let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "invalid JSON");
    };
    let mut inner = server.lock();
    if let Some(failure) = write_allowed(&mut inner, namespace, name) {
        return failure;
    }
    let key = key(resource, namespace, name);
    if !inner.objects.contains_key(&key) {
        return status(404, "NotFound", "not found");
    }
    let injected_conflict = inner.conflict_updates > 0;
    if injected_conflict {
        inner.conflict_updates -= 1;
    }
    let Some(existing) = inner.objects.get(&key) else {
        return status(404, "NotFound", "not found");
    };
    if injected_conflict
        || object["metadata"]["resourceVersion"] != existing["metadata"]["resourceVersion"]
    {
        return status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    object["metadata"]["uid"] = existing["metadata"]["uid"].clone();
    object["metadata"]["creationTimestamp"] = existing["metadata"]["creationTimestamp"].clone();
    with_subresources(resource, existing, &mut object);
    commit(server, &mut inner, key, object, "MODIFIED")
}

/// Status is a subresource of Deployments and Canaries: a write of the object keeps the stored
/// status, and a Deployment's `generation` moves when its spec does, as the API server does.
fn with_subresources(resource: &str, existing: &Value, object: &mut Value) {
    if !matches!(resource, "deployments" | "canaries") {
        return;
    }
    object["status"] = existing["status"].clone();
    let generation = existing["metadata"]["generation"].as_i64().unwrap_or(1);
    object["metadata"]["generation"] = if object["spec"] == existing["spec"] {
        json!(generation)
    } else {
        json!(generation + 1)
    };
    // Finalizers and deletion are the object's own: a status write cannot change them.
    if object["metadata"]["deletionTimestamp"].is_null()
        && !existing["metadata"]["deletionTimestamp"].is_null()
    {
        object["metadata"]["deletionTimestamp"] = existing["metadata"]["deletionTimestamp"].clone();
    }
}

/// PUT .../status: only the status changes (with the resourceVersion check).
fn replace_status(
    server: &ApiServer,
    resource: &str,
    namespace: &str,
    name: &str,
    body: &Bytes,
) -> Response {
    let Ok(object) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "invalid JSON");
    };
    let mut inner = server.lock();
    let key = key(resource, namespace, name);
    let Some(existing) = inner.objects.get(&key).cloned() else {
        return status(404, "NotFound", "not found");
    };
    if object["metadata"]["resourceVersion"] != existing["metadata"]["resourceVersion"] {
        return status(409, "Conflict", "the object has been modified");
    }
    let mut updated = existing;
    updated["status"] = object["status"].clone();
    commit(server, &mut inner, key, updated, "MODIFIED")
}

/// PATCH: JSON merge patch (and strategic merge, taken as merge) or JSON patch (RFC 6902).
fn patch(
    server: &ApiServer,
    resource: &str,
    namespace: &str,
    name: &str,
    content_type: &str,
    body: &Bytes,
) -> Response {
    let mut inner = server.lock();
    let key = key(resource, namespace, name);
    let Some(existing) = inner.objects.get(&key).cloned() else {
        return status(404, "NotFound", "not found");
    };
    let mut updated = existing.clone();
    if content_type.starts_with("application/json-patch+json") {
        let Ok(operations) = serde_json::from_slice::<json_patch::Patch>(body) else {
            return status(400, "BadRequest", "invalid JSON patch");
        };
        // The API server's `test` takes a missing member as null (kube's finalizer helper
        // relies on it); json_patch does not, so an absent list is made an explicit null.
        if updated["metadata"].get("finalizers").is_none() {
            updated["metadata"]["finalizers"] = Value::Null;
        }
        if let Err(error) = json_patch::patch(&mut updated, &operations) {
            return status(422, "Invalid", &format!("patch failed: {error}"));
        }
    } else {
        let Ok(merge) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "invalid JSON");
        };
        json_patch::merge(&mut updated, &merge);
    }
    updated["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
    with_subresources(resource, &existing, &mut updated);
    // Removing the last finalizer of an object being deleted deletes it.
    let finalizers_left = updated["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    if !updated["metadata"]["deletionTimestamp"].is_null() && !finalizers_left {
        server.remove(&mut inner, &key);
        return json_response(StatusCode::OK, &updated);
    }
    commit(server, &mut inner, key, updated, "MODIFIED")
}

fn in_namespace(object: &Value, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| object["metadata"]["namespace"] == ns)
}

fn list_or_watch(
    server: &ApiServer,
    resource: &str,
    namespace: Option<&str>,
    params: &BTreeMap<String, String>,
) -> Response {
    let (api_version, kind) = match resource {
        "pods" => ("v1", "Pod"),
        "secrets" => ("v1", "Secret"),
        "configmaps" => ("v1", "ConfigMap"),
        "namespaces" => ("v1", "Namespace"),
        "services" => ("v1", "Service"),
        "mutatingwebhookconfigurations" => (
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
        ),
        "deployments" => ("apps/v1", "Deployment"),
        "controllerrevisions" => ("apps/v1", "ControllerRevision"),
        "leases" => ("coordination.k8s.io/v1", "Lease"),
        "events" => ("events.k8s.io/v1", "Event"),
        "endpointslices" => ("discovery.k8s.io/v1", "EndpointSlice"),
        "horizontalpodautoscalers" => ("autoscaling/v2", "HorizontalPodAutoscaler"),
        "canaries" => ("dubbo.apache.org/v1alpha1", "Canary"),
        "serviceentries" => ("dubbo.apache.org/v1alpha1", "ServiceEntry"),
        "metrictemplates" => ("dubbo.apache.org/v1alpha1", "MetricTemplate"),
        "alertproviders" => ("dubbo.apache.org/v1alpha1", "AlertProvider"),
        "tagroutes" => ("dubbo.apache.org/v1alpha1", "TagRoute"),
        "conditionroutes" => ("dubbo.apache.org/v1alpha1", "ConditionRoute"),
        "dynamicconfigs" => ("dubbo.apache.org/v1alpha1", "DynamicConfig"),
        "authenticationpolicies" => ("dubbo.apache.org/v1alpha1", "AuthenticationPolicy"),
        "authorizationpolicies" => ("dubbo.apache.org/v1alpha1", "AuthorizationPolicy"),
        _ => ("dubbo.apache.org/v1alpha1", "ServiceNameMapping"),
    };
    let watching = params.get("watch").is_some_and(|v| v == "true" || v == "1");
    // `fieldSelector=metadata.name=<name>` (URL-encoded), the one field selector used here.
    let only_name: Option<String> = params.get("fieldSelector").and_then(|v| {
        v.replace("%3D", "=")
            .replace("%3d", "=")
            .strip_prefix("metadata.name=")
            .map(str::to_owned)
    });
    let name_matches = move |object: &Value| {
        only_name
            .as_deref()
            .is_none_or(|n| object["metadata"]["name"] == n)
    };
    if !watching {
        let inner = server.lock();
        let items: Vec<Value> = inner
            .objects
            .iter()
            .filter(|(k, o)| k.0 == resource && in_namespace(o, namespace) && name_matches(o))
            .map(|(_, o)| o.clone())
            .collect();
        let body = json!({
            "apiVersion": api_version, "kind": format!("{kind}List"),
            "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items,
        });
        return json_response(StatusCode::OK, &body);
    }
    if server.lock().watches_blocked {
        return status(503, "ServiceUnavailable", "watches are blocked");
    }
    let from: u64 = params
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(290));
    let bookmarks = params
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let namespace = namespace.map(str::to_owned);
    let resource = resource.to_owned();
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(64);
    let server = server.clone();
    let active = ActiveWatch::new(&server.shared);
    tokio::spawn(async move {
        let _active = active;
        let line = |value: Value| Ok(Bytes::from(format!("{value}\n")));
        let expired = {
            let mut inner = server.lock();
            let expired = from < inner.oldest_watchable;
            inner.gone += u64::from(expired);
            expired
        };
        if expired {
            let gone = json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version", "reason": "Expired", "code": 410}});
            let _ = tx.send(line(gone)).await;
            return;
        }
        let mut latest = server.shared.latest.subscribe();
        let mut cut = server.shared.cut.subscribe();
        cut.mark_unchanged();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut sent = from;
        loop {
            latest.borrow_and_update();
            // Events and the resourceVersion they lead up to, read together.
            let (pending, rv) = {
                let inner = server.lock();
                // Events are in resourceVersion order: start past the ones already sent
                // (a scan of the whole history per change made big runs quadratic).
                let first = inner.events.partition_point(|(rv, ..)| *rv <= sent);
                let pending: Vec<(u64, &'static str, Value)> = inner.events[first..]
                    .iter()
                    .filter(|(rv, _, of, object)| {
                        *rv > sent
                            && *of == resource
                            && in_namespace(object, namespace.as_deref())
                            && name_matches(object)
                    })
                    .map(|(rv, kind, _, object)| (*rv, *kind, object.clone()))
                    .collect();
                (pending, inner.rv)
            };
            for (_, kind, object) in pending {
                if tx
                    .send(line(json!({"type": kind, "object": object})))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if bookmarks && rv > sent {
                let bookmark = json!({"type": "BOOKMARK", "object": {
                    "apiVersion": api_version, "kind": kind,
                    "metadata": {"resourceVersion": rv.to_string()}}});
                if tx.send(line(bookmark)).await.is_err() {
                    return;
                }
            }
            sent = sent.max(rv);
            tokio::select! {
                _ = latest.changed() => {}
                _ = cut.changed() => return,
                () = tokio::time::sleep_until(deadline) => return,
            }
        }
    });
    let mut response = Response::new(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    response.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

// ---- waiting on the stored objects ----

impl ApiServer {
    /// Every stored object's (namespace, spec.interfaceName, application), as a control plane's
    /// upserts leave them.
    pub fn stored_pairs(&self) -> std::collections::BTreeSet<(String, String, String)> {
        pairs_of(&self.lock().objects)
    }

    /// Waits until `check` holds for the stored (namespace, interface, application) triples,
    /// checking again at every change of the objects; false if it does not within `limit`.
    pub async fn wait_for_pairs(
        &self,
        limit: Duration,
        check: impl Fn(&std::collections::BTreeSet<(String, String, String)>) -> bool,
    ) -> bool {
        let mut latest = self.shared.latest.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            latest.borrow_and_update();
            if check(&self.stored_pairs()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, latest.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }
}

fn pairs_of(
    objects: &BTreeMap<Key, Value>,
) -> std::collections::BTreeSet<(String, String, String)> {
    objects
        .iter()
        .filter(|((resource, _, _), _)| resource == SNP)
        .flat_map(|((_, namespace, _), object)| {
            let interface = object["spec"]["interfaceName"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let apps: Vec<String> =
                serde_json::from_value(object["spec"]["applicationNames"].clone())
                    .unwrap_or_default();
            let namespace = namespace.clone();
            apps.into_iter()
                .map(move |app| (namespace.clone(), interface.clone(), app))
        })
        .collect()
}

/// The Deployment of a pod the fixture made: its pods are `<deployment>-x<generation>-p<n>`.
pub fn deployment_of(pod: &str) -> &str {
    pod.rsplitn(3, '-').nth(2).unwrap_or(pod)
}

fn ready_status(ready: bool) -> &'static str {
    if ready { "True" } else { "False" }
}

/// Whether `pod`'s Ready condition is true.
pub fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}
