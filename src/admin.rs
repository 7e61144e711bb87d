//! The HTTP admin port: liveness, readiness and a read-only view of the stored mappings.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde::Serialize;

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

#[derive(Clone)]
struct AdminState {
    readiness: Readiness,
    store: EmbeddedStore,
}

pub fn router(readiness: Readiness, store: EmbeddedStore) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/debug/mappings", get(mappings))
        .with_state(AdminState { readiness, store })
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
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

async fn mappings(State(state): State<AdminState>) -> Json<Vec<MappingView>> {
    let views = state
        .store
        .snapshot()
        .into_iter()
        .map(|(key, apps)| MappingView {
            namespace: key.namespace,
            interface_name: key.interface,
            application_names: apps.into_iter().collect(),
        })
        .collect();
    Json(views)
}
