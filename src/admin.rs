//! The HTTP admin port: liveness, readiness and a read-only view of the stored mappings.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde::Serialize;

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::registry::Registry;

use crate::index::Index;
use crate::k8s::cluster::ClusterView;
use crate::k8s::writer::{KubeWriter, ParkedKey};
use crate::mapping::MappingKey;
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
    pub mappings: MappingSource,
    /// Kubernetes mode: the writer's queue and the outbox behind it.
    pub outbox: Option<(Arc<KubeWriter>, Outbox)>,
    pub registry: Arc<Registry>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/mappings", get(list_mappings))
        .route("/debug/outbox", get(list_outbox))
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

/// Ready once serving and the initial state is loaded (in Kubernetes mode: the first list).
async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.readiness.is_ready() && state.index.is_loaded() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
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
async fn list_mappings(State(state): State<AdminState>) -> Json<Vec<MappingView>> {
    views(state.mappings.snapshot())
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
async fn list_outbox(State(state): State<AdminState>) -> Json<OutboxView> {
    let Some((writer, outbox)) = &state.outbox else {
        return Json(OutboxView::default());
    };
    Json(OutboxView {
        pending: views(outbox.pending()).0,
        parked: writer.parked(),
    })
}
