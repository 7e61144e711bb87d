//! The ADS gRPC service: one task per stream runs [`crate::protocol::Stream`] against the
//! current [`Snapshot`], answering requests and pushing every version that changes what the
//! stream subscribed to, types in push order.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{Any, value};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::CLUSTER;
use crate::clients::Clients;
use crate::delta::DeltaStream;
use crate::protocol::{Refused, Stream, Verdict};
use crate::snapshot::{Snapshot, resources};

/// Responses one stream may have queued; a client that reads none of them holds only these.
const STREAM_QUEUE: usize = 8;

/// The namespace a client is in when its node does not say.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Serves ADS from the snapshots published on a `watch` channel.
#[derive(Clone)]
pub struct Ads {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    clients: Arc<Clients>,
}

/// Streams one server holds open at most, unless told otherwise.
pub const DEFAULT_MAX_STREAMS: usize = 100_000;

impl Ads {
    /// Serves `snapshots` to at most `max_streams` streams at once.
    pub fn new(snapshots: watch::Receiver<Arc<Snapshot>>, max_streams: usize) -> Self {
        Ads {
            snapshots,
            clients: Arc::new(Clients::new(max_streams)),
        }
    }

    /// A place for a new stream, or `RESOURCE_EXHAUSTED` when every place is taken.
    fn register(&self) -> Result<Registered, Status> {
        let Some(id) = self.clients.open() else {
            return Err(Status::resource_exhausted(format!(
                "{} xDS streams are open, the most this server holds; retry against another replica",
                self.clients.open_streams()
            )));
        };
        Ok(Registered {
            id,
            clients: self.clients.clone(),
        })
    }

    /// The connected clients' status.
    pub fn clients(&self) -> Arc<Clients> {
        self.clients.clone()
    }

    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Ads> {
        AggregatedDiscoveryServiceServer::new(self)
    }
}

/// The client's namespace: its node metadata `NAMESPACE` (as Istio's bootstrap has it), else
/// [`DEFAULT_NAMESPACE`].
pub fn client_namespace(node: Option<&Node>) -> String {
    node.and_then(|node| node.metadata.as_ref())
        .and_then(|metadata| metadata.fields.get("NAMESPACE"))
        .and_then(|value| match &value.kind {
            Some(value::Kind::StringValue(namespace)) if !namespace.is_empty() => {
                Some(namespace.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())
}

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let registered = self.register()?;
        tokio::spawn(run(
            request.into_inner(),
            self.snapshots.clone(),
            tx,
            registered,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        let registered = self.register()?;
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        tokio::spawn(run_delta(
            request.into_inner(),
            self.snapshots.clone(),
            tx,
            registered,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Sends, in push order, every subscribed type whose resources in `snapshot` differ from what
/// the client holds, and every type in `forced` (requests the client waits on) whatever it holds.
async fn answer(
    stream: &mut Stream,
    snapshot: &Snapshot,
    forced: &[&'static str],
    tx: &mpsc::Sender<Result<DiscoveryResponse, Status>>,
) -> Result<(), ()> {
    let namespace = client_namespace(stream.node.as_ref());
    let version = snapshot.version.to_string();
    let mut plan: Vec<(&'static str, Vec<(String, Any)>)> = stream
        .subscribed()
        .filter_map(|type_url| {
            let state = stream.state(type_url)?;
            Some((type_url, resources(snapshot, type_url, state, &namespace)))
        })
        .collect();
    make_before_break(&mut plan, |type_url, selected| {
        stream.would_remove(type_url, selected)
    });
    for (type_url, selected) in plan {
        let force = forced.contains(&type_url);
        if let Some(response) = stream.respond(type_url, &version, selected, force) {
            tx.send(Ok(response)).await.map_err(|_| ())?;
        }
    }
    Ok(())
}

/// Moves a cluster answer that removes clusters after the listeners and routes of the same push:
/// routes stop naming a cluster before it goes (make before break). Added clusters then come
/// after the routes that name them too; gRPC clients wait for a cluster they have not seen yet.
fn make_before_break(
    plan: &mut Vec<(&'static str, Vec<(String, Any)>)>,
    removes: impl Fn(&str, &[(String, Any)]) -> bool,
) {
    if let Some(at) = plan
        .iter()
        .position(|(type_url, selected)| *type_url == CLUSTER && removes(type_url, selected))
    {
        let clusters = plan.remove(at);
        plan.push(clusters);
    }
}

/// A stream's entry in [`Clients`], removed however the stream ends.
struct Registered {
    id: u64,
    clients: Arc<Clients>,
}

impl Registered {
    fn update(&self, stream: &Stream, seen: Option<u64>) {
        let namespace = client_namespace(stream.node.as_ref());
        self.clients.update(self.id, stream, &namespace, seen);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.clients.close(self.id);
    }
}

async fn run(
    mut incoming: Streaming<DiscoveryRequest>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    registered: Registered,
) {
    let mut stream = Stream::default();
    // Types asked for before the sources were synced, answered once they are.
    let mut waiting: Vec<&'static str> = Vec::new();
    // The last version whose changes were pushed (for operators and tests).
    let mut seen: Option<u64> = None;
    loop {
        tokio::select! {
            message = incoming.message() => {
                let request = match message {
                    Ok(Some(request)) => request,
                    Ok(None) | Err(_) => return,
                };
                let verdict = stream.on_request(&request);
                registered.update(&stream, seen);
                let type_url = match verdict {
                    Ok(Verdict::Answer(type_url)) => type_url,
                    Ok(Verdict::Settled | Verdict::Stale) => continue,
                    // Envoy may ask for more over ADS (secrets, runtime): not ours to answer, and
                    // ending its stream would only make it reconnect and ask again.
                    Err(Refused::UnknownType(type_url)) => {
                        tracing::debug!(%type_url, "xDS request for a type not served; ignored");
                        continue;
                    }
                    Err(refused) => {
                        let _ = tx.send(Err(Status::invalid_argument(refused.to_string()))).await;
                        return;
                    }
                };
                // `borrow`, not `borrow_and_update`: a version published meanwhile must still
                // wake the push branch for the other types.
                let snapshot = snapshots.borrow().clone();
                if !snapshot.synced {
                    if !waiting.contains(&type_url) {
                        waiting.push(type_url);
                    }
                    continue;
                }
                // Answered now, with the types answered before still waiting (in push order).
                waiting.push(type_url);
                if answer(&mut stream, &snapshot, &waiting, &tx).await.is_err() {
                    return;
                }
                waiting.clear();
                registered.update(&stream, seen);
            }
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                if !snapshot.synced {
                    continue;
                }
                if answer(&mut stream, &snapshot, &waiting, &tx).await.is_err() {
                    return;
                }
                waiting.clear();
                seen = Some(snapshot.version);
                registered.update(&stream, seen);
            }
        }
    }
}

/// Sends, in push order, what changed of every subscribed type of a delta stream, and an answer
/// for every type in `forced` whatever changed.
async fn answer_delta(
    stream: &mut DeltaStream,
    snapshot: &Snapshot,
    forced: &[&'static str],
    tx: &mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) -> Result<(), ()> {
    let namespace = client_namespace(stream.node.as_ref());
    let version = snapshot.version.to_string();
    let mut plan: Vec<(&'static str, Vec<(String, Any)>)> = stream
        .subscribed()
        .filter_map(|type_url| {
            let subscription = stream.subscription(type_url)?;
            Some((
                type_url,
                resources(snapshot, type_url, &subscription, &namespace),
            ))
        })
        .collect();
    make_before_break(&mut plan, |type_url, selected| {
        stream.would_remove(type_url, selected)
    });
    for (type_url, selected) in plan {
        let force = forced.contains(&type_url);
        if let Some(response) = stream.respond(type_url, &version, selected, force) {
            tx.send(Ok(response)).await.map_err(|_| ())?;
        }
    }
    Ok(())
}

/// [`run`] for incremental streams: the same rules, with only changes and removals sent.
async fn run_delta(
    mut incoming: Streaming<DeltaDiscoveryRequest>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    registered: Registered,
) {
    let mut stream = DeltaStream::default();
    let mut waiting: Vec<&'static str> = Vec::new();
    let mut seen: Option<u64> = None;
    let report = |stream: &DeltaStream, seen: Option<u64>| {
        let namespace = client_namespace(stream.node.as_ref());
        registered
            .clients
            .update_status(registered.id, stream.status(&namespace, seen));
    };
    loop {
        tokio::select! {
            message = incoming.message() => {
                let request = match message {
                    Ok(Some(request)) => request,
                    Ok(None) | Err(_) => return,
                };
                let verdict = stream.on_request(&request);
                report(&stream, seen);
                let type_url = match verdict {
                    Ok(Verdict::Answer(type_url)) => type_url,
                    Ok(Verdict::Settled | Verdict::Stale) => continue,
                    Err(Refused::UnknownType(type_url)) => {
                        tracing::debug!(%type_url, "delta xDS request for a type not served; ignored");
                        continue;
                    }
                    Err(refused) => {
                        let _ = tx.send(Err(Status::invalid_argument(refused.to_string()))).await;
                        return;
                    }
                };
                let snapshot = snapshots.borrow().clone();
                if !waiting.contains(&type_url) {
                    waiting.push(type_url);
                }
                if !snapshot.synced {
                    continue;
                }
                if answer_delta(&mut stream, &snapshot, &waiting, &tx).await.is_err() {
                    return;
                }
                waiting.clear();
                report(&stream, seen);
            }
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                if !snapshot.synced {
                    continue;
                }
                if answer_delta(&mut stream, &snapshot, &waiting, &tx).await.is_err() {
                    return;
                }
                waiting.clear();
                seen = Some(snapshot.version);
                report(&stream, seen);
            }
        }
    }
}
