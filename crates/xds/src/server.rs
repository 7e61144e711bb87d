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
use envoy_types::pb::google::protobuf::value;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::clients::Clients;
use crate::protocol::{Stream, Verdict};
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
        let Some(id) = self.clients.open() else {
            return Err(Status::resource_exhausted(format!(
                "{} xDS streams are open, the most this server holds; retry against another replica",
                self.clients.open_streams()
            )));
        };
        let registered = Registered {
            id,
            clients: self.clients.clone(),
        };
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
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented(
            "incremental xDS is not served yet; use StreamAggregatedResources (state of the world)",
        ))
    }
}

/// Sends every subscribed type of `types` that `snapshot` answers; `force` for requests (the
/// client waits for an answer), not for pushes of a new version.
async fn answer(
    stream: &mut Stream,
    snapshot: &Snapshot,
    types: &[&'static str],
    force: bool,
    tx: &mpsc::Sender<Result<DiscoveryResponse, Status>>,
) -> Result<(), ()> {
    let namespace = client_namespace(stream.node.as_ref());
    let version = snapshot.version.to_string();
    for type_url in types {
        let Some(state) = stream.state(type_url) else {
            continue;
        };
        let selected = resources(snapshot, type_url, state, &namespace);
        if let Some(response) = stream.respond(type_url, &version, selected, force) {
            tx.send(Ok(response)).await.map_err(|_| ())?;
        }
    }
    Ok(())
}

/// A stream's entry in [`Clients`], removed however the stream ends.
struct Registered {
    id: u64,
    clients: Arc<Clients>,
}

impl Registered {
    fn update(&self, stream: &Stream) {
        let namespace = client_namespace(stream.node.as_ref());
        self.clients.update(self.id, stream, &namespace);
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
    loop {
        tokio::select! {
            message = incoming.message() => {
                let request = match message {
                    Ok(Some(request)) => request,
                    Ok(None) | Err(_) => return,
                };
                let verdict = stream.on_request(&request);
                registered.update(&stream);
                let type_url = match verdict {
                    Ok(Verdict::Answer(type_url)) => type_url,
                    Ok(Verdict::Settled | Verdict::Stale) => continue,
                    Err(refused) => {
                        let _ = tx.send(Err(Status::invalid_argument(refused.to_string()))).await;
                        return;
                    }
                };
                let snapshot = snapshots.borrow_and_update().clone();
                if !snapshot.synced {
                    if !waiting.contains(&type_url) {
                        waiting.push(type_url);
                    }
                    continue;
                }
                if answer(&mut stream, &snapshot, &[type_url], true, &tx).await.is_err() {
                    return;
                }
                registered.update(&stream);
            }
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                if !snapshot.synced {
                    continue;
                }
                let forced: Vec<&'static str> = std::mem::take(&mut waiting);
                let pushed: Vec<&'static str> = stream.subscribed().collect();
                if answer(&mut stream, &snapshot, &forced, true, &tx).await.is_err()
                    || answer(&mut stream, &snapshot, &pushed, false, &tx).await.is_err()
                {
                    return;
                }
                registered.update(&stream);
            }
        }
    }
}
