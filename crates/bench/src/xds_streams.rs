//! The xDS bench's clients: raw ADS streams on Envoy's protos, state of the world or
//! incremental (delta), each holding the clusters and load assignments of a few services and
//! ACKing every response. A stream that fails reconnects as gRPC clients do (backoff from 1 s,
//! x1.6, jitter 20 %, reset by a response), and its error is counted by code.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dubbo_cp::xds::{CLUSTER, ENDPOINT};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// What every stream reports.
#[derive(Default)]
pub struct Acks {
    /// Load-assignment responses ACKed.
    pub endpoint: AtomicUsize,
    /// Streams that ACKed their first load assignment (each stream once).
    pub subscribed: AtomicUsize,
    /// Streams that ACKed a load assignment on a stream opened after a failure.
    pub reconnected: AtomicUsize,
    pub changed: Notify,
    /// The run is over: streams ending now end because the server goes.
    pub finished: AtomicBool,
    /// Stream failures by gRPC code, with the first message of each.
    pub errors: Mutex<BTreeMap<String, (usize, String)>>,
}

impl Acks {
    fn failed(&self, status: &tonic::Status) {
        let mut errors = self
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = errors
            .entry(format!("{:?}", status.code()))
            .or_insert_with(|| (0, status.message().chars().take(160).collect()));
        entry.0 += 1;
    }

    fn acked_endpoints(&self, state: &mut StreamState) {
        self.endpoint.fetch_add(1, Ordering::SeqCst);
        if !std::mem::replace(&mut state.subscribed, true) {
            self.subscribed.fetch_add(1, Ordering::SeqCst);
        }
        if std::mem::take(&mut state.after_failure) {
            self.reconnected.fetch_add(1, Ordering::SeqCst);
        }
        self.changed.notify_waiters();
    }

    /// Failures by code, `CODE=n` joined.
    pub fn errors(&self) -> String {
        let errors = self
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let text: Vec<String> = errors
            .iter()
            .map(|(code, (n, first))| format!("{code}={n} ({first:?})"))
            .collect();
        if text.is_empty() {
            "none".to_owned()
        } else {
            text.join(" ")
        }
    }
}

/// Where one client stands.
struct StreamState {
    /// A load assignment was ACKed once.
    subscribed: bool,
    /// The current stream was opened after a failure and has ACKed no load assignment yet.
    after_failure: bool,
    backoff: Duration,
}

/// One client: streams `names` (cluster names, which are also the load assignments') until the
/// run is over, reconnecting after failures.
pub async fn client(
    id: usize,
    channel: Channel,
    names: Vec<String>,
    delta: bool,
    acks: std::sync::Arc<Acks>,
) {
    let mut state = StreamState {
        subscribed: false,
        after_failure: false,
        backoff: Duration::from_secs(1),
    };
    // Each client its own jitter sequence, so reconnects spread out.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(id as u64 + 1);
    loop {
        let result = if delta {
            delta_stream(&channel, &names, &acks, &mut state).await
        } else {
            sotw_stream(&channel, &names, &acks, &mut state).await
        };
        if acks.finished.load(Ordering::SeqCst) {
            return;
        }
        let status = match result {
            Ok(()) => tonic::Status::unavailable("stream ended"),
            Err(status) => status,
        };
        acks.failed(&status);
        state.after_failure = true;
        // Jitter of +/- 20 % (xorshift: no extra crate for a bench's randomness).
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let jitter = 0.8 + 0.4 * (seed % 1000) as f64 / 1000.0;
        tokio::time::sleep(state.backoff.mul_f64(jitter)).await;
        state.backoff = state.backoff.mul_f64(1.6).min(Duration::from_secs(120));
    }
}

fn node() -> Node {
    Node {
        id: "bench".into(),
        ..Default::default()
    }
}

async fn sotw_stream(
    channel: &Channel,
    names: &[String],
    acks: &Acks,
    state: &mut StreamState,
) -> Result<(), tonic::Status> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel.clone());
    let (tx, rx) = mpsc::channel(8);
    // The node in the first request only, as gRPC's xDS clients send it.
    let request = |type_url: &str, version: &str, nonce: &str| DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.to_vec(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        node: nonce.is_empty().then(node),
        ..Default::default()
    };
    let closed = |_| tonic::Status::unavailable("request stream closed");
    tx.send(request(CLUSTER, "", "")).await.map_err(closed)?;
    tx.send(request(ENDPOINT, "", "")).await.map_err(closed)?;
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        state.backoff = Duration::from_secs(1);
        tx.send(request(
            &response.type_url,
            &response.version_info,
            &response.nonce,
        ))
        .await
        .map_err(closed)?;
        if response.type_url == ENDPOINT {
            acks.acked_endpoints(state);
        }
    }
    Ok(())
}

async fn delta_stream(
    channel: &Channel,
    names: &[String],
    acks: &Acks,
    state: &mut StreamState,
) -> Result<(), tonic::Status> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel.clone());
    let (tx, rx) = mpsc::channel(8);
    let subscribe = |type_url: &str| DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: names.to_vec(),
        node: Some(node()),
        ..Default::default()
    };
    let closed = |_| tonic::Status::unavailable("request stream closed");
    tx.send(subscribe(CLUSTER)).await.map_err(closed)?;
    tx.send(subscribe(ENDPOINT)).await.map_err(closed)?;
    let mut responses = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        state.backoff = Duration::from_secs(1);
        tx.send(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })
        .await
        .map_err(closed)?;
        if response.type_url == ENDPOINT {
            acks.acked_endpoints(state);
        }
    }
    Ok(())
}
