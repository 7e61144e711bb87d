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
use crate::mapping::{MappingKey, SharedMappings};
use crate::store::EmbeddedStore;

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
    Store(EmbeddedStore),
    Cluster(Arc<SharedMappings>),
}

impl MappingSource {
    fn snapshot(&self) -> BTreeMap<MappingKey, BTreeSet<String>> {
        match self {
            MappingSource::Store(store) => store.snapshot(),
            MappingSource::Cluster(cluster) => cluster
                .iter()
                .map(|entry| (entry.key().clone(), entry.value().clone()))
                .collect(),
        }
    }
}

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub readiness: Readiness,
    pub index: Arc<Index>,
    pub mappings: MappingSource,
    pub outbox: EmbeddedStore,
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

/// Kubernetes mode: acknowledged pairs not yet written to the API server (standalone: the store).
async fn list_outbox(State(state): State<AdminState>) -> Json<Vec<MappingView>> {
    views(state.outbox.snapshot())
}
