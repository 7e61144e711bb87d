//! The HTTP admin port: liveness, readiness, metrics, read-only views of the state, and the
//! rule API (`/api/v1/...`) that `dubbo-cp apply | get | delete` talk to.
//!
//! - [`views`]: the read-only JSON views (`/debug/...`), which the dashboard ([`ui`]) polls;
//! - [`rule_api`]: the rule API and unregistering an application;
//! - [`ca_api`]: the CA API (show, rotate, issue).
#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_auth as auth;
use dubbo_cp_ca as ca;
use dubbo_cp_canary as canary;
use dubbo_cp_dds as dds;
use dubbo_cp_dds::digest;
use dubbo_cp_domain::{mapping, rules};
use dubbo_cp_index as index;
use dubbo_cp_k8s as k8s;
use dubbo_cp_kit::metrics;
use dubbo_cp_store as store;
use dubbo_cp_zookeeper as zookeeper;

mod ca_api;
mod pending;
mod rule_api;
mod services_view;
pub mod ui;
mod views;
mod xds_split;

use ca_api::*;
use pending::*;
use rule_api::*;
use services_view::*;
use views::*;
pub use views::{ApplicationView, MappingView, OutboxView, SourceView, applications};
use xds_split::*;

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
use crate::k8s::writer::{KubeDrain, ParkedKey};
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
    /// ZooKeeper mode: the served mappings (the mapping nodes, and the interfaces that
    /// interface-level providers name).
    ZooKeeper(Arc<Index>),
}

impl MappingSource {
    fn snapshot(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        match self {
            MappingSource::Store(store) => store.mappings(),
            MappingSource::Cluster(cluster) => cluster.snapshot(),
            MappingSource::ZooKeeper(index) => served_mappings(index),
        }
    }
}

/// The mappings the index serves, by key.
fn served_mappings(index: &Index) -> BTreeMap<MappingKey, BTreeSet<String>> {
    let state = index.current(Kind::ServiceNameMapping);
    state
        .objects
        .iter()
        .filter_map(|(client_key, object)| {
            let (_, namespace) = client_key.rsplit_once('/')?;
            match &object.value {
                crate::index::Resource::Mapping {
                    interface,
                    applications,
                } => Some((
                    MappingKey::new(namespace, interface.clone()),
                    applications.iter().cloned().collect(),
                )),
                crate::index::Resource::Rule(_) | crate::index::Resource::Service(_) => None,
            }
        })
        .collect()
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
    pub outbox: Option<(Arc<KubeDrain>, Outbox)>,
    /// ZooKeeper mode: the writer, the outbox behind it and what is known of the ensemble.
    pub zookeeper: Option<ZkAdmin>,
    pub registry: Arc<Registry>,
    pub rules: RuleAdmin,
    /// The certificate authority, when it runs.
    pub ca: Option<crate::ca::Authority>,
    /// The open discovery streams and how far each client has got.
    pub clients: Arc<crate::dds::clients::Clients>,
    /// The open xDS streams, when xDS is served.
    pub xds_clients: Option<Arc<dubbo_cp_xds::clients::Clients>>,
    /// What the xDS edge serves, when xDS is served (`/debug/xds/split` reads it).
    pub xds_snapshots: Option<tokio::sync::watch::Receiver<Arc<dubbo_cp_xds::snapshot::Snapshot>>>,
    /// Kubernetes mode with the canary controller: the client `/debug/canaries` lists with.
    pub canaries: Option<kube::Client>,
}

/// ZooKeeper mode's parts the admin port shows.
#[derive(Clone)]
pub struct ZkAdmin {
    pub writer: Arc<crate::zookeeper::writer::ZkDrain>,
    pub outbox: Outbox,
    pub stats: Arc<crate::zookeeper::ZkStats>,
}

/// What the rule API reads and writes.
#[derive(Clone)]
pub struct RuleAdmin {
    pub catalog: Arc<Catalog>,
    /// Standalone: the store rules are written to. Kubernetes mode: `None` (kubectl writes).
    pub standalone: Option<Arc<StandaloneRules>>,
    /// ZooKeeper mode: rules are written to the config center (and our own path).
    pub zookeeper: Option<Arc<crate::zookeeper::ZkRules>>,
    /// Who may use the API: an admin identity whenever authentication is configured.
    pub policy: Policy,
    /// Policies here reach every namespace (`rules.rootNamespace`).
    pub root_namespace: String,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/debug/sources", get(debug_sources))
        .route("/metrics", get(metrics))
        .route("/debug/mappings", get(list_mappings))
        .route("/debug/mappings/pending", get(pending_mappings))
        .route("/debug/applications", get(list_applications))
        .route("/debug/outbox", get(list_outbox))
        .route("/debug/rules", get(debug_rules))
        .route("/debug/clients", get(list_clients))
        .route("/debug/xds", get(list_xds_clients))
        .route("/debug/xds/config_dump", get(xds_config_dump))
        .route("/debug/xds/split", get(xds_split))
        .route("/debug/services", get(list_services))
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
        .route("/api/v1/ca/roots", get(ca_roots))
        .route("/api/v1/ca/rotate", post(rotate_ca))
        .route("/api/v1/ca/issue", post(issue_certificate))
        .merge(ui::router())
        .with_state(state)
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    metrics_response(&state.registry)
}

/// `registry` as a `/metrics` answer (OpenMetrics text), for every HTTP port that serves one.
pub fn metrics_response(
    registry: &prometheus_client::registry::Registry,
) -> axum::response::Response {
    match crate::metrics::render(registry) {
        Ok(text) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::CONTENT_TYPE,
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
    if let Some(zk) = state.zookeeper.as_ref().filter(|zk| !zk.stats.connected()) {
        // Served from the last state read; registrations wait in the outbox.
        let source = zk.stats.state();
        body.push_str(&format!(
            "ZooKeeper {}: session {}; serving the last state read, registrations held in the outbox\n",
            source.ensemble, source.session
        ));
    }
    if let Some(problem) = state.ca.as_ref().and_then(|ca| ca.fleet_problem()) {
        body.push_str(&format!("CA: {problem}\n"));
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
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
