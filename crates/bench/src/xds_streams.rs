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

/// A count the bench waits on. Waking the waiter at every ACK would cost the load generator a
/// thread wake per stream per round (the waiter runs outside the runtime's workers), so only
/// the increment that reaches the goal wakes it.
pub struct Counter {
    n: AtomicUsize,
    goal: AtomicUsize,
    reached: Notify,
}

impl Default for Counter {
    fn default() -> Self {
        Self {
            n: AtomicUsize::new(0),
            goal: AtomicUsize::new(usize::MAX),
            reached: Notify::new(),
        }
    }
}

impl Counter {
    pub fn get(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }

    fn add(&self) {
        if self.n.fetch_add(1, Ordering::SeqCst) + 1 >= self.goal.load(Ordering::SeqCst) {
            self.reached.notify_waiters();
        }
    }

    fn sub(&self) {
        self.n.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits until the count is at least `wanted`, or `deadline`; `false` on the deadline.
    pub async fn reach(&self, wanted: usize, deadline: tokio::time::Instant) -> bool {
        self.goal.store(wanted, Ordering::SeqCst);
        let reached = loop {
            let notified = self.reached.notified();
            if self.get() >= wanted {
                break true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break self.get() >= wanted;
            }
        };
        self.goal.store(usize::MAX, Ordering::SeqCst);
        reached
    }
}

/// What every stream reports.
#[derive(Default)]
pub struct Acks {
    /// Load-assignment responses ACKed.
    pub endpoint: Counter,
    /// Streams that ACKed their first load assignment (each stream once).
    pub subscribed: Counter,
    /// Streams whose stream opened after a failure ACKed a load assignment and has not failed:
    /// one back on the old server before it went is not back.
    pub reconnected: Counter,
    /// The run is over: streams ending now end because the server goes.
    pub finished: AtomicBool,
    /// Stream failures by gRPC code, with the first message of each.
    pub errors: Mutex<BTreeMap<String, (usize, String)>>,
}

impl Acks {
    /// Counts a failure by code and by when it came: as the old server went, or on a stream
    /// opened while reconnecting. A status the server sent is told apart from one tonic made of
    /// a transport failure (a connection refused, closed or going away under the stream): gRPC's
    /// own clients report every such failure as UNAVAILABLE and retry it, whatever code tonic
    /// gives it. The first message of each carries its cause's chain.
    fn failed(&self, status: &tonic::Status, reconnecting: bool) {
        let from = if std::error::Error::source(status).is_some() {
            " transport"
        } else {
            ""
        };
        let when = if reconnecting { " reconnecting" } else { "" };
        self.failed_with(&format!("{:?}{from}{when}", status.code()), &cause(status));
    }

    /// Counts a failure under `code` (as tonic names codes), keeping its first message.
    pub fn failed_with(&self, code: &str, message: &str) {
        let mut errors = self
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = errors
            .entry(code.to_owned())
            .or_insert_with(|| (0, message.chars().take(240).collect()));
        entry.0 += 1;
    }

    /// Counts a load assignment ACKed by a stream that never reconnects (`subscribed`: it
    /// ACKed one before).
    pub fn acked(&self, subscribed: &mut bool) {
        self.endpoint.add();
        if !std::mem::replace(subscribed, true) {
            self.subscribed.add();
        }
    }

    fn acked_endpoints(&self, state: &mut StreamState) {
        self.acked(&mut state.subscribed);
        if std::mem::take(&mut state.after_failure) {
            state.back = true;
            self.reconnected.add();
        }
    }

    /// Failures by code, with the first message of each.
    pub fn codes(&self) -> BTreeMap<String, (u64, String)> {
        let errors = self
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        errors
            .iter()
            .map(|(code, (n, first))| (code.clone(), (*n as u64, first.clone())))
            .collect()
    }
}

/// A status's message and the chain of errors under it, cut to a readable length.
fn cause(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        text.push_str(": ");
        text.push_str(&error.to_string());
        source = error.source();
    }
    text.chars().take(240).collect()
}

/// Where one client stands.
struct StreamState {
    /// A load assignment was ACKed once.
    subscribed: bool,
    /// The current stream was opened after a failure and has ACKed no load assignment yet.
    after_failure: bool,
    /// The current stream was opened after a failure and has ACKed a load assignment.
    back: bool,
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
        back: false,
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
            // Counted as what it is: a gRPC client would see OK, not UNAVAILABLE.
            Ok(()) => tonic::Status::ok("the server ended the stream"),
            Err(status) => status,
        };
        acks.failed(&status, state.after_failure);
        if std::mem::take(&mut state.back) {
            acks.reconnected.sub();
        }
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
    // The version of the last load assignment counted: each counts once.
    let mut counted = String::new();
    while let Some(response) = responses.message().await? {
        state.backoff = Duration::from_secs(1);
        tx.send(request(
            &response.type_url,
            &response.version_info,
            &response.nonce,
        ))
        .await
        .map_err(closed)?;
        if response.type_url == ENDPOINT && response.version_info != counted {
            counted = response.version_info;
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
    let mut counted = String::new();
    while let Some(response) = responses.message().await? {
        state.backoff = Duration::from_secs(1);
        tx.send(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })
        .await
        .map_err(closed)?;
        if response.type_url == ENDPOINT && response.system_version_info != counted {
            counted = response.system_version_info;
            acks.acked_endpoints(state);
        }
    }
    Ok(())
}
