//! The ADS gRPC service: one task per stream runs [`crate::protocol::Stream`] against the
//! current [`Snapshot`], answering requests and pushing every version that changes what the
//! stream subscribed to, types in push order.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest,
};
use envoy_types::pb::google::protobuf::{Any, value};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status, Streaming};

use crate::clients::{Clients, ServerView, TypeStatus};
use crate::delta::DeltaStream;
use crate::protocol::{Refused, Selected, Stream, Verdict};
use crate::snapshot::{Changes, Snapshot, cluster_resource, select};
use crate::stats::{TypeLabel, XdsStats};
use crate::{CLUSTER, ENDPOINT};
use ending::{Ending, responses};

mod ending;

/// Responses one stream may have queued; a client that reads none of them holds only these.
const STREAM_QUEUE: usize = 8;

/// A queued response, boxed: a channel allocates its slots in blocks of 32 whatever its bound,
/// and a `Status` beside a response makes each slot hundreds of bytes, on every stream.
type Queued<T> = Box<Result<T, Status>>;

/// The namespace a client is in when its node does not say.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Who a stream's caller is, as the other gRPC ports decide it (the binary implements it over
/// its authentication policy; this crate knows no tokens or Kubernetes).
#[tonic::async_trait]
pub trait Authenticate: Send + Sync + 'static {
    /// The caller's namespace when it is authenticated, `None` when authentication is off;
    /// an error status (`UNAUTHENTICATED`, ...) refuses the stream.
    async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        peer_certificates: Option<Vec<Vec<u8>>>,
    ) -> Result<Option<String>, Status>;
}

/// Serves ADS from the snapshots published on a `watch` channel.
#[derive(Clone)]
pub struct Ads {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    clients: Arc<Clients>,
    stats: Arc<XdsStats>,
    authenticate: Option<Arc<dyn Authenticate>>,
    /// Ends every stream (`UNAVAILABLE`, so clients reconnect elsewhere) once true.
    shutdown: Option<watch::Receiver<bool>>,
}

/// Streams one server holds open at most, unless told otherwise.
pub const DEFAULT_MAX_STREAMS: usize = 100_000;

impl Ads {
    /// Serves `snapshots` to at most `max_streams` streams at once.
    pub fn new(snapshots: watch::Receiver<Arc<Snapshot>>, max_streams: usize) -> Self {
        let published = snapshots.clone();
        Ads {
            clients: Arc::new(
                Clients::new(max_streams).following(move || published.borrow().version),
            ),
            snapshots,
            stats: Arc::default(),
            authenticate: None,
            shutdown: None,
        }
    }

    /// Streams are refused unless `authenticate` accepts their caller.
    pub fn with_authentication(mut self, authenticate: Arc<dyn Authenticate>) -> Self {
        self.authenticate = Some(authenticate);
        self
    }

    /// Every stream ends with `UNAVAILABLE` once `shutdown` turns true (a graceful server
    /// shutdown waits for open streams, and xDS streams last for days).
    pub fn with_shutdown(mut self, shutdown: watch::Receiver<bool>) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// What the edge counts.
    pub fn stats(&self) -> Arc<XdsStats> {
        self.stats.clone()
    }

    /// The caller's namespace (authenticated), or the refusal.
    async fn admit<T>(&self, request: &Request<T>) -> Result<Option<String>, Status> {
        let Some(authenticate) = &self.authenticate else {
            return Ok(None);
        };
        let certificates: Option<Vec<Vec<u8>>> = request
            .peer_certs()
            .map(|certs| certs.iter().map(|cert| cert.as_ref().to_vec()).collect());
        authenticate
            .authenticate(request.metadata(), certificates)
            .await
            .inspect_err(|_| {
                self.stats
                    .refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })
    }

    /// A place for a new stream, or `RESOURCE_EXHAUSTED` when every place is taken.
    fn register(&self, identity_namespace: Option<String>) -> Result<Registered, Status> {
        let Some(id) = self.clients.open() else {
            self.stats
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "{} xDS streams are open, the most this server holds; retry against another replica",
                self.clients.open_streams()
            )));
        };
        Ok(Registered {
            id,
            clients: self.clients.clone(),
            stats: self.stats.clone(),
            identity_namespace,
        })
    }

    /// Starts a stream's loop in a task of its own; what it sends, then the status it ends
    /// with, are what the client reads.
    fn spawn<S: AdsStream>(
        &self,
        incoming: Streaming<S::Request>,
        registered: Registered,
    ) -> Ending<S::Response> {
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let (end, ending) = oneshot::channel();
        tokio::spawn(ended(
            Box::pin(run::<S>(
                incoming,
                self.snapshots.clone(),
                self.shutdown.clone(),
                tx,
                registered,
            )),
            end,
        ));
        responses(rx, ending)
    }

    /// The snapshots it serves: what operators' views of a client's resources read.
    pub fn snapshots(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshots.clone()
    }

    /// The connected clients' status.
    pub fn clients(&self) -> Arc<Clients> {
        self.clients.clone()
    }
}

/// The client's namespace: its node metadata `NAMESPACE` (as Istio's bootstrap has it), else
/// its authenticated identity's, else [`DEFAULT_NAMESPACE`].
pub fn client_namespace<'a>(
    node: Option<&'a Node>,
    identity_namespace: Option<&'a str>,
) -> &'a str {
    node.and_then(|node| node.metadata.as_ref())
        .and_then(|metadata| metadata.fields.get("NAMESPACE"))
        .and_then(|value| match &value.kind {
            Some(value::Kind::StringValue(namespace)) if !namespace.is_empty() => {
                Some(namespace.as_str())
            }
            _ => None,
        })
        .or(identity_namespace)
        .unwrap_or(DEFAULT_NAMESPACE)
}

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<crate::protocol::Response, Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

/// The two ADS calls, as [`crate::service::AdsService`] routes them (not tonic's generated
/// trait: a state-of-the-world stream answers with [`crate::protocol::Response`], which shares
/// its resources with the snapshot instead of owning copies).
impl Ads {
    /// A state-of-the-world stream.
    pub async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let identity = self.admit(&request).await?;
        let registered = self.register(identity)?;
        Ok(Response::new(Box::pin(
            self.spawn::<Stream>(request.into_inner(), registered),
        )))
    }

    /// An incremental stream.
    pub async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        let identity = self.admit(&request).await?;
        let registered = self.register(identity)?;
        Ok(Response::new(Box::pin(
            self.spawn::<DeltaStream>(request.into_inner(), registered),
        )))
    }
}

/// What the stream loop needs of a stream, state of the world or incremental.
trait AdsStream: Default + Send + 'static {
    /// `sotw` or `delta`, as operators read it.
    const PROTOCOL: &'static str;
    type Request: Send + 'static;
    type Response: Send + 'static;
    fn on_request(&mut self, request: &Self::Request) -> Result<Verdict, Refused>;
    /// The type a request rejects (a NACK: an error detail on a response's nonce).
    fn rejects(request: &Self::Request) -> Option<&str>;
    fn node(&self) -> Option<&Node>;
    /// The types the client subscribed to, in push order.
    fn types(&self) -> Vec<&'static str>;
    /// The resources of `type_url` the subscription selects from `snapshot`.
    fn selected(&self, snapshot: &Snapshot, type_url: &str, namespace: &str) -> Selected {
        self.names(type_url)
            .map(|(names, wildcard)| select(snapshot, type_url, names, wildcard, namespace))
            .unwrap_or_default()
    }
    /// What the client was sent of resource `name` of `type_url`.
    fn held(&self, type_url: &str, name: &str) -> Option<Arc<Any>>;
    fn would_remove(&self, type_url: &str, resources: &Selected) -> bool;
    fn respond(
        &mut self,
        type_url: &'static str,
        version: &str,
        resources: Selected,
        force: bool,
    ) -> Option<Self::Response>;
    /// What `respond` would answer for load assignments at a version following the one last
    /// sent, from the names `touches` says may differ alone, each `lookup`ed; `None` when the
    /// stream cannot tell without the whole selection.
    fn respond_following(
        &mut self,
        type_url: &'static str,
        version: &str,
        touches: &dyn Fn(&str) -> bool,
        lookup: &dyn Fn(&str) -> Option<Arc<Any>>,
    ) -> Option<Option<Self::Response>>;
    /// Each subscribed type's status, for the stream's entry in [`Clients`].
    fn statuses(&self) -> Vec<(&'static str, TypeStatus)>;
    /// The names subscribed to of `type_url`, and whether it is a wildcard subscription.
    fn names(&self, type_url: &str) -> Option<(&BTreeSet<String>, bool)>;
    /// Whether `request` may take names away without being answered (delta unsubscriptions):
    /// the next version is then looked up in full, so what went is removed.
    fn narrows(request: &Self::Request) -> bool;
}

/// Whether `changes` may touch what `stream` subscribed to of `type_url`.
fn touched<S: AdsStream>(stream: &S, type_url: &str, changes: &Changes) -> bool {
    match stream.names(type_url) {
        Some((names, false)) => names.iter().any(|name| changes.touches(type_url, name)),
        Some((_, true)) | None => true,
    }
}

/// The resources of `type_url` the subscription selects from `snapshot`, whose version follows
/// the one the stream was last answered from (`changes`): clusters and load assignments
/// `changes` does not touch are what the stream holds, and only the rest are looked up. An
/// untouched name the stream does not hold did not exist, and still does not.
fn reselected<S: AdsStream>(
    stream: &S,
    snapshot: &Snapshot,
    type_url: &str,
    namespace: &str,
    changes: &Changes,
) -> Selected {
    match stream.names(type_url) {
        Some((names, false)) if type_url == CLUSTER || type_url == ENDPOINT => names
            .iter()
            .filter_map(|name| {
                let any = match changes.touches(type_url, name) {
                    true => cluster_resource(snapshot, type_url, name),
                    false => stream.held(type_url, name),
                }?;
                Some((name.clone(), any))
            })
            .collect(),
        _ => stream.selected(snapshot, type_url, namespace),
    }
}

impl AdsStream for Stream {
    const PROTOCOL: &'static str = "sotw";
    type Request = DiscoveryRequest;
    type Response = crate::protocol::Response;
    fn on_request(&mut self, request: &DiscoveryRequest) -> Result<Verdict, Refused> {
        Stream::on_request(self, request)
    }
    fn rejects(request: &DiscoveryRequest) -> Option<&str> {
        (request.error_detail.is_some() && !request.response_nonce.is_empty())
            .then_some(request.type_url.as_str())
    }
    fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }
    fn types(&self) -> Vec<&'static str> {
        self.subscribed().collect()
    }
    fn held(&self, type_url: &str, name: &str) -> Option<Arc<Any>> {
        self.held_resource(type_url, name)
    }
    fn narrows(_: &DiscoveryRequest) -> bool {
        // A state-of-the-world request that changes its names is answered.
        false
    }
    fn would_remove(&self, type_url: &str, resources: &Selected) -> bool {
        Stream::would_remove(self, type_url, resources)
    }
    fn respond(
        &mut self,
        type_url: &'static str,
        version: &str,
        resources: Selected,
        force: bool,
    ) -> Option<crate::protocol::Response> {
        Stream::respond(self, type_url, version, resources, force)
    }
    fn respond_following(
        &mut self,
        type_url: &'static str,
        version: &str,
        touches: &dyn Fn(&str) -> bool,
        lookup: &dyn Fn(&str) -> Option<Arc<Any>>,
    ) -> Option<Option<crate::protocol::Response>> {
        Stream::respond_following(self, type_url, version, touches, lookup)
    }
    fn statuses(&self) -> Vec<(&'static str, TypeStatus)> {
        self.type_statuses().collect()
    }
    fn names(&self, type_url: &str) -> Option<(&BTreeSet<String>, bool)> {
        self.state(type_url)
            .map(|state| (&state.names, state.wildcard))
    }
}

impl AdsStream for DeltaStream {
    const PROTOCOL: &'static str = "delta";
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    fn on_request(&mut self, request: &DeltaDiscoveryRequest) -> Result<Verdict, Refused> {
        DeltaStream::on_request(self, request)
    }
    fn rejects(request: &DeltaDiscoveryRequest) -> Option<&str> {
        (request.error_detail.is_some() && !request.response_nonce.is_empty())
            .then_some(request.type_url.as_str())
    }
    fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }
    fn types(&self) -> Vec<&'static str> {
        self.subscribed().collect()
    }
    fn held(&self, type_url: &str, name: &str) -> Option<Arc<Any>> {
        self.held_resource(type_url, name)
    }
    fn narrows(request: &DeltaDiscoveryRequest) -> bool {
        !request.resource_names_unsubscribe.is_empty()
    }
    fn would_remove(&self, type_url: &str, resources: &Selected) -> bool {
        DeltaStream::would_remove(self, type_url, resources)
    }
    fn respond(
        &mut self,
        type_url: &'static str,
        version: &str,
        resources: Selected,
        force: bool,
    ) -> Option<DeltaDiscoveryResponse> {
        DeltaStream::respond(self, type_url, version, resources, force)
    }
    fn respond_following(
        &mut self,
        type_url: &'static str,
        version: &str,
        touches: &dyn Fn(&str) -> bool,
        lookup: &dyn Fn(&str) -> Option<Arc<Any>>,
    ) -> Option<Option<DeltaDiscoveryResponse>> {
        DeltaStream::respond_following(self, type_url, version, touches, lookup)
    }
    fn statuses(&self) -> Vec<(&'static str, TypeStatus)> {
        self.type_statuses().collect()
    }
    fn names(&self, type_url: &str) -> Option<(&BTreeSet<String>, bool)> {
        self.subscribed_names(type_url)
    }
}

/// The responses, in push order, for every subscribed type whose resources in `snapshot` differ
/// from what the client holds, and every type in `forced` (requests the client waits on) whatever
/// it holds; recorded as sent.
fn answer<S: AdsStream>(
    shared: &mut Shared<S>,
    snapshot: &Snapshot,
    forced: &[&'static str],
    identity_namespace: Option<&str>,
) -> Vec<(&'static str, S::Response)> {
    let stream = &mut shared.stream;
    let namespace = client_namespace(stream.node(), identity_namespace).to_owned();
    let version = snapshot.version.to_string();
    // When the stream holds the version before this one, types nothing of which moved are
    // skipped: what it holds of them is what it would be sent.
    let changes = snapshot
        .changes()
        .filter(|changes| shared.resolved == Some(changes.previous));
    let mut plan: Vec<(&'static str, Planned)> = stream
        .types()
        .into_iter()
        .filter_map(|type_url| {
            let forced = forced.contains(&type_url);
            let planned = match changes {
                // Load assignments are answered from the touched names alone when they can be
                // (which also tells them apart, so they are not read twice here).
                Some(changes) if !forced && type_url == ENDPOINT => Planned::Following(changes),
                Some(changes) if !forced => {
                    if !touched(stream, type_url, changes) {
                        return None;
                    }
                    Planned::Selected(reselected(stream, snapshot, type_url, &namespace, changes))
                }
                _ => Planned::Selected(stream.selected(snapshot, type_url, &namespace)),
            };
            Some((type_url, planned))
        })
        .collect();
    shared.resolved = Some(snapshot.version);
    shared.servers = servers_in(&plan, snapshot, &namespace);
    make_before_break(&mut plan, |type_url, planned| match planned {
        Planned::Selected(selected) => stream.would_remove(type_url, selected),
        Planned::Following(_) => false,
    });
    plan.into_iter()
        .filter_map(|(type_url, planned)| {
            let force = forced.contains(&type_url);
            let selected = match planned {
                Planned::Selected(selected) => selected,
                Planned::Following(changes) => {
                    let touches = |name: &str| changes.touches(type_url, name);
                    let lookup = |name: &str| cluster_resource(snapshot, type_url, name);
                    if let Some(answer) =
                        stream.respond_following(type_url, &version, &touches, &lookup)
                    {
                        return answer.map(|response| (type_url, response));
                    }
                    reselected(stream, snapshot, type_url, &namespace, changes)
                }
            };
            let response = stream.respond(type_url, &version, selected, force)?;
            Some((type_url, response))
        })
        .collect()
}

/// A type's part of an answer: what the subscription selects, or left to the stream to answer
/// from what changed since the version it holds.
enum Planned<'a> {
    Selected(Selected),
    /// The version follows the one the stream holds, by these changes.
    Following(&'a Changes),
}

/// What the server listeners in `plan` enforce, for operators.
fn servers_in(
    plan: &[(&'static str, Planned)],
    snapshot: &Snapshot,
    namespace: &str,
) -> Vec<ServerView> {
    plan.iter()
        .filter(|(type_url, _)| *type_url == crate::LISTENER)
        .filter_map(|(_, planned)| match planned {
            Planned::Selected(selected) => Some(selected),
            Planned::Following(_) => None,
        })
        .flat_map(|selected| selected.iter())
        .filter_map(|(name, _)| snapshot.server(name, namespace))
        .map(|server| ServerView::of(&server))
        .collect()
}

/// Queues `responses` in order; `Err` once the client is gone.
async fn send<S: AdsStream>(
    responses: Vec<(&'static str, S::Response)>,
    tx: &mpsc::Sender<Queued<S::Response>>,
    registered: &Registered,
    snapshot: &Snapshot,
) -> Result<(), ()> {
    for (type_url, response) in responses {
        tx.send(Box::new(Ok(response))).await.map_err(|_| ())?;
        registered.pushed(type_url, snapshot);
    }
    Ok(())
}

/// Moves a cluster answer that removes clusters after the listeners and routes of the same push:
/// routes stop naming a cluster before it goes (make before break). Added clusters then come
/// after the routes that name them too; gRPC clients wait for a cluster they have not seen yet.
fn make_before_break<P>(plan: &mut Vec<(&'static str, P)>, removes: impl Fn(&str, &P) -> bool) {
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
    stats: Arc<XdsStats>,
    /// The authenticated caller's namespace, if authentication is on.
    identity_namespace: Option<String>,
}

impl Registered {
    fn pushed(&self, type_url: &str, snapshot: &Snapshot) {
        self.stats
            .pushes
            .get_or_create(&TypeLabel::of(type_url))
            .inc();
        self.stats
            .push_delay
            .observe(snapshot.published.elapsed().as_secs_f64());
    }
}

/// A stream's state, shared by its task (which holds the lock only between awaits) and the
/// operators' views of it ([`Clients`]).
struct Shared<S> {
    stream: S,
    /// The last version whose changes were pushed (for operators and tests).
    seen: Option<u64>,
    /// What the stream's server listeners enforce, as of the last answer.
    servers: Vec<ServerView>,
    identity_namespace: Option<String>,
    /// The version every subscribed type was last answered from.
    resolved: Option<u64>,
    connected: std::time::SystemTime,
}

type Locked<S> = std::sync::Mutex<Shared<S>>;

fn lock<S>(shared: &Locked<S>) -> std::sync::MutexGuard<'_, Shared<S>> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<S: AdsStream> crate::clients::Report for Locked<S> {
    fn status(&self) -> crate::clients::ClientStatus {
        let shared = lock(self);
        let stream = &shared.stream;
        let namespace = client_namespace(stream.node(), shared.identity_namespace.as_deref());
        let mut status = crate::clients::ClientStatus::of(
            stream.node(),
            namespace,
            shared.seen,
            stream.statuses().into_iter(),
        );
        status.servers = shared.servers.clone();
        status.protocol = S::PROTOCOL;
        status.identity = shared.identity_namespace.clone();
        status.connected = Some(shared.connected);
        status
    }

    fn subscribed(&self) -> BTreeMap<&'static str, Vec<String>> {
        let shared = lock(self);
        let stream = &shared.stream;
        stream
            .types()
            .into_iter()
            .map(|type_url| {
                let names = stream.names(type_url).map(|(names, _)| {
                    names
                        .iter()
                        .take(crate::clients::NAMES_SHOWN)
                        .cloned()
                        .collect()
                });
                (type_url, names.unwrap_or_default())
            })
            .collect()
    }

    fn each_server(&self, visit: &mut dyn FnMut(&ServerView)) {
        lock(self).servers.iter().for_each(visit);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.clients.close(self.id);
    }
}

/// One stream, state of the world or incremental, until the client or the snapshots go.
///
/// What it awaits while sending is boxed: the task is as large as its largest await, and it
/// spends its life waiting for a request or a version (3.7 KiB per stream before, by heaptrack
/// at 10,000 streams).
async fn run<S: AdsStream>(
    mut incoming: Streaming<S::Request>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    shutdown: Option<watch::Receiver<bool>>,
    tx: mpsc::Sender<Queued<S::Response>>,
    registered: Registered,
) -> Option<Status> {
    // Without a shutdown signal, a sender kept here keeps the branch pending forever.
    let (_never, never) = watch::channel(false);
    // Both waits are made once for the stream's life, not at every request: each made anew
    // registers with, and each dropped leaves, a waiter list all streams share (about 5 % of
    // the server's CPU at 10,000 streams, by perf).
    let mut shutdown = Box::pin(shut_down(shutdown.unwrap_or(never)));
    let mut versions = WatchStream::from_changes(snapshots.clone());
    let shared: Arc<Locked<S>> = Arc::new(std::sync::Mutex::new(Shared {
        stream: S::default(),
        seen: None,
        servers: Vec::new(),
        identity_namespace: registered.identity_namespace.clone(),
        resolved: None,
        connected: std::time::SystemTime::now(),
    }));
    let identity = registered.identity_namespace.as_deref();
    // Shown to operators from its first request on (before it, it has no node to show).
    let mut reported = false;
    // Types asked for before the sources were synced, answered once they are.
    let mut waiting: Vec<&'static str> = Vec::new();
    loop {
        tokio::select! {
            () = &mut shutdown => {
                return Some(going_away());
            }
            message = incoming.message() => {
                let request = match message {
                    Ok(Some(request)) => request,
                    // The client closed its side: the stream ends OK.
                    Ok(None) => return None,
                    // A request that does not decode, or a transport failure: the stream
                    // ends with it, as a tonic handler returning it would.
                    Err(status) => return Some(status),
                };
                if let Some(type_url) = S::rejects(&request) {
                    registered.stats.nacks.get_or_create(&TypeLabel::of(type_url)).inc();
                }
                let verdict = {
                    let mut shared = lock(&shared);
                    if S::narrows(&request) {
                        shared.resolved = None;
                    }
                    shared.stream.on_request(&request)
                };
                if !std::mem::replace(&mut reported, true) {
                    registered.clients.report(registered.id, shared.clone());
                }
                registered.clients.changed();
                let type_url = match verdict {
                    Ok(Verdict::Answer(type_url)) => type_url,
                    Ok(Verdict::Settled | Verdict::Stale) => continue,
                    // Envoy may ask for more over ADS (secrets, runtime): not ours to answer, and
                    // ending its stream would only make it reconnect and ask again.
                    Err(Refused::UnknownType(type_url)) => {
                        tracing::debug!(%type_url, "xDS request for a type not served; ignored");
                        continue;
                    }
                    Err(refused) => return Some(Status::invalid_argument(refused.to_string())),
                };
                if !waiting.contains(&type_url) {
                    waiting.push(type_url);
                }
                // `borrow`, not `borrow_and_update`: a version published meanwhile must still
                // wake the push branch for the other types.
                let snapshot = snapshots.borrow().clone();
                if !snapshot.synced {
                    continue;
                }
                // Answered now, with the types asked for before the sources synced.
                let responses = answer(&mut lock(&shared), &snapshot, &waiting, identity);
                if Box::pin(answered(send::<S>(responses, &tx, &registered, &snapshot), shutdown.as_mut())).await.is_err() {
                    return Some(going_away());
                }
                waiting.clear();
                registered.clients.changed();
            }
            changed = versions.next() => {
                let Some(snapshot) = changed else {
                    // The publisher is gone: the process is ending.
                    return Some(going_away());
                };
                if !snapshot.synced {
                    continue;
                }
                let responses = answer(&mut lock(&shared), &snapshot, &waiting, identity);
                if Box::pin(answered(send::<S>(responses, &tx, &registered, &snapshot), shutdown.as_mut())).await.is_err() {
                    return Some(going_away());
                }
                waiting.clear();
                lock(&shared).seen = Some(snapshot.version);
                registered.clients.changed();
            }
        }
    }
}

/// The status a stream ends with at shutdown, so its client reconnects (also the way out after
/// a failed send, where nobody reads it).
fn going_away() -> Status {
    Status::unavailable("control plane shutting down; reconnect")
}

/// Runs a stream's loop and hands the status it ends with to [`responses`]; none: OK. The loop
/// comes boxed: an async fn keeps a future it was given and the one it awaits in two places,
/// which doubled each stream's task (13 to 16 KiB per stream at 10,000 streams).
async fn ended(
    run: Pin<Box<impl std::future::Future<Output = Option<Status>>>>,
    end: oneshot::Sender<Status>,
) {
    if let Some(status) = run.await {
        let _ = end.send(status);
    }
}

/// Resolves once `shutdown` is true (never, if its sender is gone while false).
async fn shut_down(mut shutdown: watch::Receiver<bool>) {
    if shutdown.wait_for(|down| *down).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `answer`, or `Err` when shutdown comes first: a stream whose client stopped reading waits
/// on its full queue, and must not hold the shutdown up.
async fn answered(
    answer: impl std::future::Future<Output = Result<(), ()>>,
    shutdown: Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<(), ()> {
    tokio::select! {
        answered = answer => answered,
        () = shutdown => Err(()),
    }
}
