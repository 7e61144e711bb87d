//! `--metrics-address`: Prometheus text at `/metrics`, and `/healthz`, which answers 503 with
//! the reason when the files on disk are missing, unusable or expired, 200 otherwise (also
//! while renewals fail, saying so, since the files still serve).

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use super::{Shared, files, pki};

pub fn router(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(shared)
}

async fn metrics(State(shared): State<Arc<Shared>>) -> axum::response::Response {
    use dubbo_cp_kit::metrics;
    match metrics::render(&shared.registry) {
        Ok(text) => (
            [(axum::http::header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

async fn healthz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let (code, body) = health(&shared);
    (code, body)
}

/// The status and body of `/healthz`.
pub fn health(shared: &Shared) -> (StatusCode, String) {
    let status = shared.status();
    let failed = status
        .last_failure
        .as_ref()
        .map(|f| format!("\nlast renewal failed: {f}\n"))
        .unwrap_or_else(|| "\n".to_owned());
    match files::inspect(&shared.dir) {
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no usable certificate: {reason}{failed}"),
        ),
        Ok(on_disk) if on_disk.leaf.not_after <= SystemTime::now() => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the certificate in {} expired at {}{failed}",
                shared.dir.display(),
                pki::rfc3339(on_disk.leaf.not_after)
            ),
        ),
        Ok(on_disk) => (
            StatusCode::OK,
            format!(
                "ok: certificate for {} valid until {}, renewal due {}{failed}",
                on_disk
                    .leaf
                    .spiffe_id
                    .as_deref()
                    .unwrap_or("(no SPIFFE ID)"),
                pki::rfc3339(on_disk.leaf.not_after),
                status
                    .renew_at
                    .map_or_else(|| "now".to_owned(), pki::rfc3339)
            ),
        ),
    }
}
