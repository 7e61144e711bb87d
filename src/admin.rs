//! The HTTP admin port: liveness, readiness, metrics, read-only views of the state, and the
//! rule API (`/api/v1/...`) that `dubbo-cp apply | get | delete` talk to.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::{get, post};
use serde::Serialize;

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::registry::Registry;

use crate::auth::Policy;
use crate::index::catalog::{Catalog, RuleKey};
use crate::index::{Index, Kind, SourceProblem};
use crate::k8s::cluster::ClusterView;
use crate::k8s::writer::{KubeWriter, ParkedKey};
use crate::mapping::MappingKey;
use crate::store::rules::{Report, RuleWriteError, StandaloneRules};
use crate::store::{Outbox, Store};

/// Whether the control plane should receive traffic: set once its state is loaded and it
/// serves, cleared when shutdown begins.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Where the truth about mappings is: the embedded store (standalone) or the watched cluster.
#[derive(Clone)]
pub enum MappingSource {
    Store(Store),
    Cluster(Arc<ClusterView>),
}

impl MappingSource {
    fn snapshot(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        match self {
            MappingSource::Store(store) => store.mappings(),
            MappingSource::Cluster(cluster) => cluster.snapshot(),
        }
    }
}

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub readiness: Readiness,
    pub index: Arc<Index>,
    /// The discovery stream's encoding of the index, which digests are computed over.
    pub encoder: Arc<crate::dds::encode::Encoder>,
    pub mappings: MappingSource,
    /// Kubernetes mode: the writer's queue and the outbox behind it.
    pub outbox: Option<(Arc<KubeWriter>, Outbox)>,
    pub registry: Arc<Registry>,
    pub rules: RuleAdmin,
    /// The certificate authority, when it runs.
    pub ca: Option<crate::ca::Authority>,
    /// The open discovery streams and how far each client has got.
    pub clients: Arc<crate::dds::clients::Clients>,
    /// Kubernetes mode with the canary controller: the client `/debug/canaries` lists with.
    pub canaries: Option<kube::Client>,
}

/// What the rule API reads and writes.
#[derive(Clone)]
pub struct RuleAdmin {
    pub catalog: Arc<Catalog>,
    /// Standalone: the store rules are written to. Kubernetes mode: `None` (kubectl writes).
    pub standalone: Option<Arc<StandaloneRules>>,
    /// Who may use the API: an admin identity whenever authentication is configured.
    pub policy: Policy,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/debug/sources", get(debug_sources))
        .route("/metrics", get(metrics))
        .route("/debug/mappings", get(list_mappings))
        .route("/debug/applications", get(list_applications))
        .route("/debug/outbox", get(list_outbox))
        .route("/debug/rules", get(debug_rules))
        .route("/debug/clients", get(list_clients))
        .route("/debug/digest", get(digest))
        .route("/debug/canaries", get(list_canaries))
        .route("/api/v1/unregister", post(unregister))
        .route("/api/v1/apply", post(apply_rules))
        .route("/api/v1/delete", post(delete_rules))
        .route("/api/v1/rules/{kind}", get(get_rules))
        .route(
            "/api/v1/rules/{kind}/{namespace}/{name}",
            axum::routing::delete(delete_rule),
        )
        .route("/api/v1/ca", get(show_ca))
        .route("/api/v1/ca/rotate", post(rotate_ca))
        .route("/api/v1/ca/issue", post(issue_certificate))
        .merge(crate::ui::router())
        .with_state(state)
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    match crate::metrics::render(&state.registry) {
        Ok(text) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

/// Ready once serving and the initial state is loaded (in Kubernetes mode: the first list, a
/// missing CRD counting as an empty one). The body names every source that is not in or not
/// healthy, and why.
async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let ready = state.readiness.is_ready() && state.index.is_loaded();
    let mut body = String::from(if ready { "ready\n" } else { "not ready\n" });
    for (kind, loaded, condition) in state.index.sources() {
        match (loaded, condition) {
            (_, Some(condition)) => {
                body.push_str(&format!("{}: {}\n", kind.name(), condition.message))
            }
            (false, None) => {
                body.push_str(&format!("{}: initial state not loaded yet\n", kind.name()))
            }
            (true, None) => {}
        }
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

/// One source of the index as `/debug/sources` lists it.
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct SourceView {
    pub kind: String,
    pub loaded: bool,
    /// `synced`, `loading` (no first answer yet), `crd-missing` (served empty, or its last
    /// state, until the CRD is installed) or `failing` (see `condition` for the last error).
    #[serde(default)]
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

/// Each kind's source: loaded or not, and why it is not healthy (`dubbo-cp status` prints it).
async fn debug_sources(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<Vec<SourceView>>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let views = state
        .index
        .sources()
        .into_iter()
        .map(|(kind, loaded, condition)| SourceView {
            kind: kind.name().to_owned(),
            loaded,
            state: match (&condition, loaded) {
                (Some(c), _) if c.problem == SourceProblem::CrdMissing => "crd-missing",
                (Some(_), _) => "failing",
                (None, true) => "synced",
                (None, false) => "loading",
            }
            .to_owned(),
            condition: condition.map(|c| c.message),
        })
        .collect();
    Ok(Json(views))
}

/// One stored mapping as the debug endpoint lists it.
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MappingView {
    pub namespace: String,
    pub interface_name: String,
    pub application_names: Vec<String>,
}

fn views(mappings: BTreeMap<MappingKey, BTreeSet<String>>) -> Json<Vec<MappingView>> {
    let views = mappings
        .into_iter()
        .map(|(key, apps)| MappingView {
            namespace: key.namespace,
            interface_name: key.interface,
            application_names: apps.into_iter().collect(),
        })
        .collect();
    Json(views)
}

/// The stored mappings: the embedded store, or what the watch sees in the cluster.
async fn list_mappings(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<Vec<MappingView>>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    Ok(views(state.mappings.snapshot()))
}

/// The applications of a namespace and the interfaces each serves: the mappings read the
/// other way round.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationView {
    pub namespace: String,
    pub application: String,
    pub interfaces: Vec<String>,
    /// Kubernetes mode: the distinct pods recorded as registering it (see
    /// [`crate::mapping::registrants`]); `None` where no pod is tracked (standalone, pinned, or
    /// never registered by a pod).
    #[serde(default)]
    pub registering_pods: Option<usize>,
}

#[derive(serde::Deserialize)]
struct ApplicationQuery {
    namespace: Option<String>,
    application: Option<String>,
}

/// `/debug/applications[?namespace=NS][&application=APP]`.
async fn list_applications(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ApplicationQuery>,
) -> Result<Json<Vec<ApplicationView>>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let mut views = applications(
        state.mappings.snapshot(),
        query.namespace.as_deref(),
        query.application.as_deref(),
    );
    if let MappingSource::Cluster(cluster) = &state.mappings {
        count_pods(&mut views, &cluster.registrants());
    }
    Ok(Json(views))
}

/// Fills in the registering pods of each application from the objects' records.
fn count_pods(
    views: &mut [ApplicationView],
    records: &crate::mapping::registrants::SharedRegistrants,
) {
    use crate::mapping::registrants::Pods;
    for view in views {
        let mut pods = BTreeSet::new();
        let mut tracked = false;
        for interface in &view.interfaces {
            let key = MappingKey::new(view.namespace.clone(), interface.clone());
            if let Some(record) = records.get(&key)
                && let Some(Pods::Tracked(recorded)) = record.get(&view.application)
            {
                tracked = true;
                pods.extend(recorded.iter().cloned());
            }
        }
        view.registering_pods = tracked.then_some(pods.len());
    }
}

/// Inverts the mappings: per (namespace, application) the interfaces it serves, sorted.
pub fn applications(
    mappings: BTreeMap<MappingKey, BTreeSet<String>>,
    namespace: Option<&str>,
    application: Option<&str>,
) -> Vec<ApplicationView> {
    let mut by_app: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (key, apps) in mappings {
        if namespace.is_some_and(|ns| ns != key.namespace) {
            continue;
        }
        for app in apps {
            if application.is_some_and(|wanted| wanted != app) {
                continue;
            }
            by_app
                .entry((key.namespace.clone(), app))
                .or_default()
                .push(key.interface.clone());
        }
    }
    by_app
        .into_iter()
        .map(|((namespace, application), interfaces)| ApplicationView {
            namespace,
            application,
            interfaces,
            registering_pods: None,
        })
        .collect()
}

/// `/debug/clients`: every open discovery stream and how far its client has got.
#[derive(serde::Deserialize, Default)]
struct ClientQuery {
    namespace: Option<String>,
    kind: Option<String>,
    /// Only subscriptions behind the current revision.
    #[serde(default)]
    stale: bool,
    /// At most this many streams in the answer (the counts cover all).
    limit: Option<usize>,
}

/// `/debug/clients[?namespace=][&kind=][&stale=true][&limit=N]`: open streams and how far each
/// client has got; `total` and `stale` count every open stream, `truncated` says the limit cut.
async fn list_clients(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ClientQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let all = state.clients.views(&state.index);
    let total = all.len();
    let stale = all
        .iter()
        .filter(|c| c.kinds.iter().any(|k| !k.synced))
        .count();
    let mut matching: Vec<_> = all
        .into_iter()
        .filter(|c| {
            query
                .namespace
                .as_ref()
                .is_none_or(|ns| c.namespace.as_ref() == Some(ns))
        })
        .filter_map(|mut c| {
            c.kinds.retain(|k| {
                query
                    .kind
                    .as_ref()
                    .is_none_or(|kind| k.kind.eq_ignore_ascii_case(kind))
                    && (!query.stale || !k.synced)
            });
            (!c.kinds.is_empty() || (query.kind.is_none() && !query.stale)).then_some(c)
        })
        .collect();
    let truncated = query.limit.is_some_and(|limit| matching.len() > limit);
    if let Some(limit) = query.limit {
        matching.truncate(limit);
    }
    Ok(Json(serde_json::json!({
        "clients": matching, "total": total, "stale": stale, "truncated": truncated,
    })))
}

#[derive(serde::Deserialize)]
struct DigestQuery {
    #[serde(default)]
    objects: bool,
}

/// `/debug/digest[?objects=true]`: per kind the digest of the served state and its revision.
async fn digest(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<DigestQuery>,
) -> Result<Json<crate::digest::DigestView>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let index = state.index.clone();
    // Hashing a large state is CPU work: off the async threads.
    let encoder = state.encoder.clone();
    tokio::task::spawn_blocking(move || crate::digest::view(&index, &encoder, query.objects))
        .await
        .map(Json)
        .map_err(|_| api_error(StatusCode::INTERNAL_SERVER_ERROR, "digest failed"))
}

/// What `/debug/outbox` shows.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxView {
    /// Acknowledged pairs not yet written to the API server.
    pub pending: Vec<MappingView>,
    /// Keys whose write failed for a reason retrying soon cannot fix, with the reason.
    pub parked: Vec<ParkedKey>,
}

/// Kubernetes mode: what is acknowledged but not in the cluster yet, and what is stuck and
/// why. Standalone has no outbox: the answer is empty.
async fn list_outbox(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<OutboxView>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let Some((writer, outbox)) = &state.outbox else {
        return Ok(Json(OutboxView::default()));
    };
    Ok(Json(OutboxView {
        pending: views(outbox.pending()).0,
        parked: writer.parked(),
    }))
}

/// At most this many Canaries per `/debug/canaries` answer.
const CANARY_LIMIT: u32 = 200;

/// `/debug/canaries[?namespace=]`: each Canary's run, weight history and metric results, read
/// from the API server (the dashboard's chart).
async fn list_canaries(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ClientQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let Some(client) = state.canaries.clone() else {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "canaries run in Kubernetes mode with canary.enabled",
        ));
    };
    let api: kube::Api<crate::canary::Canary> = match &query.namespace {
        Some(namespace) => kube::Api::namespaced(client, namespace),
        None => kube::Api::all(client),
    };
    let list = api
        .list(&kube::api::ListParams::default().limit(CANARY_LIMIT))
        .await
        .map_err(|e| api_error(StatusCode::BAD_GATEWAY, format!("listing canaries: {e}")))?;
    let truncated = list
        .metadata
        .continue_
        .as_ref()
        .is_some_and(|c| !c.is_empty());
    let canaries: Vec<serde_json::Value> = list
        .items
        .iter()
        .map(|canary| {
            let status = canary.status.clone().unwrap_or_default();
            serde_json::json!({
                "namespace": canary.metadata.namespace,
                "name": canary.metadata.name,
                "target": canary.spec.target_ref.name,
                "phase": status.phase,
                "weight": status.canary_weight,
                "maxWeight": canary.spec.analysis.max_weight,
                "failedChecks": status.failed_checks,
                "threshold": canary.spec.analysis.threshold,
                "revision": status.current_revision,
                "lastTransitionTime": status.last_transition_time,
                "history": status.history,
                "hooks": status.hooks,
            })
        })
        .collect();
    Ok(Json(
        serde_json::json!({"canaries": canaries, "truncated": truncated}),
    ))
}

type ApiError = (StatusCode, Json<serde_json::Value>);

fn api_error(code: StatusCode, message: impl Into<String>) -> ApiError {
    (code, Json(serde_json::json!({"error": message.into()})))
}

/// Refuses callers that are not admins when authentication is configured; without
/// authentication only local callers (loopback) may use the rule API and the read-only views
/// (`/debug/...`, the dashboard's data: they show clients' identities and addresses), whatever
/// address the admin port listens on (probes often need it on every address).
async fn require_admin(
    policy: &Policy,
    headers: &axum::http::HeaderMap,
    peer: std::net::SocketAddr,
) -> Result<(), ApiError> {
    if !policy.is_enabled() {
        if peer.ip().is_loopback() {
            return Ok(());
        }
        return Err(api_error(
            StatusCode::FORBIDDEN,
            format!(
                "without authentication the rule API answers only local callers, not {}",
                peer.ip()
            ),
        ));
    }
    let metadata = tonic::metadata::MetadataMap::from_headers(headers.clone());
    match policy.authenticate(&metadata, None).await {
        Err(refusal) => Err(api_error(
            StatusCode::UNAUTHORIZED,
            refusal.into_status().message().to_owned(),
        )),
        Ok(Some(identity)) if policy.is_admin(&identity) => Ok(()),
        Ok(Some(identity)) => Err(api_error(
            StatusCode::FORBIDDEN,
            format!("{} is not an admin identity (auth.admins)", identity.name),
        )),
        Ok(None) => Err(api_error(
            StatusCode::UNAUTHORIZED,
            "send `Authorization: Bearer <token>` of an admin identity",
        )),
    }
}

/// The kind named in a path: `TagRoute`, `tagroute` or `tagroutes`.
fn rule_kind(name: &str) -> Result<Kind, ApiError> {
    crate::rules::RULE_KINDS
        .into_iter()
        .find(|kind| {
            kind.name().eq_ignore_ascii_case(name) || kind.plural().eq_ignore_ascii_case(name)
        })
        .ok_or_else(|| {
            api_error(
                StatusCode::NOT_FOUND,
                format!(
                    "unknown rule kind {name:?}; one of TagRoute, ConditionRoute, DynamicConfig, \
                     AuthenticationPolicy, AuthorizationPolicy"
                ),
            )
        })
}

/// The rule store an admin caller may write to (standalone only).
async fn writable(
    admin: &RuleAdmin,
    headers: &axum::http::HeaderMap,
    peer: std::net::SocketAddr,
) -> Result<Arc<StandaloneRules>, ApiError> {
    require_admin(&admin.policy, headers, peer).await?;
    admin.standalone.clone().ok_or_else(|| {
        api_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "in Kubernetes mode rules are custom resources: use kubectl apply / kubectl delete",
        )
    })
}

/// Runs a rule write off the async threads (SQLite blocks) and turns its result into an answer.
async fn write_rules(
    rules: Arc<StandaloneRules>,
    write: impl FnOnce(&StandaloneRules) -> Result<Report, RuleWriteError> + Send + 'static,
) -> Result<Json<Report>, ApiError> {
    match tokio::task::spawn_blocking(move || write(&rules)).await {
        Ok(Ok(report)) => Ok(Json(report)),
        Ok(Err(RuleWriteError::Invalid(err))) => {
            Err(api_error(StatusCode::BAD_REQUEST, err.to_string()))
        }
        Ok(Err(err)) => Err(api_error(StatusCode::SERVICE_UNAVAILABLE, err.to_string())),
        Err(_) => Err(api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the rule write did not finish",
        )),
    }
}

async fn apply_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<Report>, ApiError> {
    let rules = writable(&state.rules, &headers, peer).await?;
    write_rules(rules, move |rules| rules.apply(&body)).await
}

async fn delete_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<Report>, ApiError> {
    let rules = writable(&state.rules, &headers, peer).await?;
    write_rules(rules, move |rules| rules.delete_manifests(&body)).await
}

async fn delete_rule(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Path((kind, namespace, name)): axum::extract::Path<(String, String, String)>,
) -> Result<Json<Report>, ApiError> {
    let rules = writable(&state.rules, &headers, peer).await?;
    let kind = rule_kind(&kind)?;
    let key: RuleKey = (kind, namespace, name);
    write_rules(rules, move |rules| rules.delete(&[key])).await
}

#[derive(serde::Deserialize)]
struct NamespaceQuery {
    namespace: Option<String>,
}

/// The rules of a kind as clients are served them (in Kubernetes mode: as the watch sees them).
async fn get_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Path(kind): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<NamespaceQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let kind = rule_kind(&kind)?;
    let items: Vec<serde_json::Value> = state
        .rules
        .catalog
        .list(kind, query.namespace.as_deref())
        .iter()
        .map(crate::rules::Rule::to_manifest)
        .collect();
    Ok(Json(serde_json::json!({
        "apiVersion": "v1", "kind": "List",
        "revision": state.index.current(kind).revision,
        "items": items,
    })))
}

/// Objects skipped by a watch (do not deserialize or validate), with why.
async fn debug_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    Ok(Json(serde_json::json!({
        "invalid": state.rules.catalog.invalid(),
        "files": state.rules.catalog.file_errors(),
    })))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UnregisterRequest {
    namespace: String,
    application: String,
    /// Empty: every interface the application serves in the namespace.
    #[serde(default)]
    interfaces: Vec<String>,
}

/// `dubbo-cp unregister` (standalone): an operator removes an application from mappings,
/// durably and pushed to clients like any change. In Kubernetes mode the objects are the truth:
/// `kubectl edit` them, or let expiry remove applications whose pods are gone.
async fn unregister(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let MappingSource::Store(store) = &state.mappings else {
        return Err(api_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "in Kubernetes mode ServiceNameMapping objects are the truth: edit them with kubectl",
        ));
    };
    let request: UnregisterRequest = serde_json::from_str(&body).map_err(|err| {
        api_error(
            StatusCode::BAD_REQUEST,
            format!(
                "body must be {{\"namespace\": NS, \"application\": APP, \"interfaces\": [...]}}: {err}"
            ),
        )
    })?;
    for (field, value) in [
        ("namespace", &request.namespace),
        ("application", &request.application),
    ] {
        if value.is_empty() {
            return Err(api_error(
                StatusCode::BAD_REQUEST,
                format!("{field}: must not be empty"),
            ));
        }
    }
    let interfaces =
        (!request.interfaces.is_empty()).then(|| request.interfaces.iter().cloned().collect());
    let removed = store
        .unregister(&request.namespace, &request.application, interfaces)
        .await
        .map_err(|err| api_error(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    if removed.is_empty() {
        let which = if request.interfaces.is_empty() {
            "no interface".to_owned()
        } else {
            format!("none of {:?}", request.interfaces)
        };
        return Err(api_error(
            StatusCode::NOT_FOUND,
            format!(
                "application {:?} serves {which} in namespace {:?}",
                request.application, request.namespace
            ),
        ));
    }
    tracing::info!(namespace = %request.namespace, application = %request.application,
        interfaces = removed.len(), "application unregistered by an admin");
    Ok(Json(serde_json::json!({ "removed": removed })))
}

/// The CA an admin caller may use.
async fn authority(
    state: &AdminState,
    headers: &axum::http::HeaderMap,
    peer: std::net::SocketAddr,
) -> Result<crate::ca::Authority, ApiError> {
    require_admin(&state.rules.policy, headers, peer).await?;
    state.ca.clone().ok_or_else(|| {
        api_error(
            StatusCode::NOT_FOUND,
            "the certificate authority is disabled (ca.enabled: false)",
        )
    })
}

/// `dubbo-cp ca show`: the trusted roots.
async fn show_ca(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<crate::ca::CaView>, ApiError> {
    authority(&state, &headers, peer)
        .await?
        .view()
        .map(Json)
        .ok_or_else(|| api_error(StatusCode::SERVICE_UNAVAILABLE, crate::ca::NOT_READY))
}

/// `dubbo-cp ca rotate`: a new active root, the old one trusted until its certificates expire.
async fn rotate_ca(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<crate::ca::CaView>, ApiError> {
    let ca = authority(&state, &headers, peer).await?;
    ca.rotate()
        .await
        .map_err(|message| api_error(StatusCode::CONFLICT, message))?;
    ca.view()
        .map(Json)
        .ok_or_else(|| api_error(StatusCode::SERVICE_UNAVAILABLE, crate::ca::NOT_READY))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IssueRequest {
    csr: String,
    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    spiffe_id: String,
    /// Sign an identity of another trust domain than the CA's own (refused otherwise).
    #[serde(default)]
    allow_other_trust_domain: bool,
}

/// `dubbo-cp ca issue`: a certificate for any identity, by an admin's hand.
async fn issue_certificate(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<serde_json::Value>, ApiError> {
    let ca = authority(&state, &headers, peer).await?;
    let request: IssueRequest = serde_json::from_str(&body).map_err(|err| {
        api_error(
            StatusCode::BAD_REQUEST,
            format!("body must be {{\"csr\": PEM, \"spiffeId\": ID}}: {err}"),
        )
    })?;
    let identity = crate::auth::spiffe::identity_from_spiffe_id(&request.spiffe_id, None)
        .map_err(|err| api_error(StatusCode::BAD_REQUEST, format!("spiffeId: {err}")))?;
    // A certificate of another trust domain is trusted wherever our roots are: only on purpose.
    let domain = request
        .spiffe_id
        .trim_start_matches("spiffe://")
        .split('/')
        .next()
        .unwrap_or_default();
    if domain != &*ca.trust_domain && !request.allow_other_trust_domain {
        return Err(api_error(
            StatusCode::BAD_REQUEST,
            format!(
                "spiffeId: trust domain {domain:?} is not this CA's ({:?}); pass \
                 --allow-other-trust-domain to sign it anyway",
                ca.trust_domain
            ),
        ));
    }
    let subject = crate::ca::Subject {
        spiffe_id: request.spiffe_id,
        common_name: identity.service_account.unwrap_or(identity.name),
    };
    let bundle = ca
        .current()
        .ok_or_else(|| api_error(StatusCode::SERVICE_UNAVAILABLE, crate::ca::NOT_READY))?;
    let issued = bundle
        .issue(
            &request.csr,
            &subject,
            ca.settings.cert_validity,
            std::time::SystemTime::now(),
        )
        .map_err(|err| {
            ca.stats.count("admin", err.result());
            api_error(StatusCode::BAD_REQUEST, err.to_string())
        })?;
    ca.stats.count("admin", "issued");
    tracing::info!(spiffe_id = %subject.spiffe_id, "certificate issued by an admin");
    Ok(Json(serde_json::json!({
        "certPem": issued.cert_pem,
        "trustCerts": bundle.trust_pems(),
        "token": issued.token,
        "expireTime": humantime::format_rfc3339_seconds(issued.not_after).to_string(),
    })))
}
