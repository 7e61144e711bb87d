//! What the canary tests share: webhook gates the test opens one call at a time, and the load
//! assignment an xDS client holds, as the server's client list reports it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use prost::Message;

/// Permits for a Canary's `confirm-traffic-increase` (`/step`) and `confirm-promotion`
/// (`/promote`) hooks: each permit lets one call through, the others are refused (403).
#[derive(Clone, Default)]
pub struct Gates {
    pub step: Arc<AtomicUsize>,
    pub promote: Arc<AtomicUsize>,
}

impl Gates {
    /// Serves the gates on 127.0.0.1; their address.
    pub async fn serve(&self) -> SocketAddr {
        async fn gate(State(gates): State<Gates>, uri: axum::http::Uri) -> StatusCode {
            let permits = if uri.path() == "/promote" {
                &gates.promote
            } else {
                &gates.step
            };
            let taken =
                permits.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| p.checked_sub(1));
            if taken.is_ok() {
                StatusCode::OK
            } else {
                StatusCode::FORBIDDEN
            }
        }
        let app = axum::Router::new()
            .fallback(axum::routing::post(gate))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }
}

/// The response (its number) that carried the load assignment client `node` holds.
pub fn endpoint_nonce(clients: &[dubbo_cp::xds::clients::ClientStatus], node: &str) -> Option<u64> {
    let client = clients.iter().find(|c| c.node_id == node)?;
    let endpoints = client.types.get(dubbo_cp::xds::ENDPOINT)?;
    endpoints.held.values().map(|held| held.nonce).max()
}

/// The locality weights of the load assignment client `node` last acknowledged, once it has
/// acknowledged what it was sent, sorted.
pub fn acked_weights(
    clients: &[dubbo_cp::xds::clients::ClientStatus],
    node: &str,
) -> Option<Vec<u32>> {
    let client = clients.iter().find(|c| c.node_id == node)?;
    let endpoints = client.types.get(dubbo_cp::xds::ENDPOINT)?;
    if endpoints.sent.is_none() || endpoints.acked != endpoints.sent {
        return None;
    }
    let mut weights = Vec::new();
    for held in endpoints.held.values() {
        let any = held.resource.as_ref()?;
        let assignment = ClusterLoadAssignment::decode(any.value.as_slice()).ok()?;
        weights.extend(
            assignment
                .endpoints
                .iter()
                .filter_map(|l| l.load_balancing_weight.map(|w| w.value)),
        );
    }
    weights.sort();
    Some(weights)
}
