//! The discovery stream, `RuleService/Observe` (wire.md §2, behaviour.md "Discovery stream").
//!
//! One task per stream runs the protocol ([`stream`]). This module admits streams (readiness,
//! admission rate) and serves the method as a plain HTTP/2 gRPC handler: requests are decoded by
//! tonic, responses are written by [`body::ObserveBody`] without copying the shared state, which
//! tonic's generated server would copy into a per-stream buffer and keep.

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name (the domain's `rules` is named in full:
// this crate's own `rules` module is the rule kinds' wire form).
use dubbo_cp_auth as auth;
use dubbo_cp_index as index;
use dubbo_cp_kit::{metrics, ratelimit, shutdown};

pub mod body;
pub mod clients;
pub mod config;
pub mod digest;
pub mod encode;
pub mod objects;
pub mod pb;
pub mod rules;
pub mod stream;
pub mod wire;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Streaming};
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::auth::Policy;
use crate::index::Index;
use crate::metrics::Metrics;
use crate::pb::dds::ObserveRequest;
use crate::ratelimit::RateLimiter;
use body::ObserveBody;
pub use wire::ObserveResponse;

/// The gRPC path of the method, as clients call it.
pub const OBSERVE_PATH: &str = "/org.apache.dubbo.auth.v1alpha1.RuleService/Observe";
/// Largest `ObserveRequest` accepted; real ones are a nonce and a type name.
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Initial decode buffer of a stream: requests are tiny, and every open stream keeps one.
const REQUEST_BUFFER_BYTES: usize = 256;

/// Declared with the other settings (the `dds` section).
pub use config::DdsConfig;

/// Counters for logs, tests, benchmarks and `/metrics`.
#[derive(Debug)]
pub struct DdsStats {
    pub streams_open: AtomicI64,
    pub streams_refused: AtomicU64,
    pub pushes: AtomicU64,
    /// Responses sent, by kind.
    pub pushes_by_kind: prometheus_client::metrics::family::Family<
        crate::index::KindLabel,
        prometheus_client::metrics::counter::Counter,
    >,
    pub stale_nonces: AtomicU64,
    /// Seconds from a state's publication to its hand-over to a stream's transport; with the
    /// debounce delay before it, the time from registration to the last client's receipt.
    pub push_delay: prometheus_client::metrics::histogram::Histogram,
}

impl DdsStats {
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        use crate::metrics::{scraped_counter, scraped_gauge};
        registry.register(
            "dds_kind_pushes",
            "Responses sent on discovery streams, by kind",
            self.pushes_by_kind.clone(),
        );
        registry.register(
            "dds_push_delay_seconds",
            "Seconds from a state's publication to its hand-over to a stream's transport",
            self.push_delay.clone(),
        );
        scraped_gauge(
            registry,
            "dds_streams_open",
            "Open discovery streams",
            self,
            |s| s.streams_open.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "dds_pushes",
            "Responses sent on discovery streams",
            self,
            |s| s.pushes.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "dds_stale_nonces",
            "Requests with a wrong or stale nonce",
            self,
            |s| s.stale_nonces.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "dds_streams_refused",
            "New streams refused by the admission rate",
            self,
            |s| s.streams_refused.load(Ordering::Relaxed),
        );
    }
}

impl Default for DdsStats {
    fn default() -> Self {
        Self {
            streams_open: AtomicI64::new(0),
            streams_refused: AtomicU64::new(0),
            pushes: AtomicU64::new(0),
            pushes_by_kind: Default::default(),
            stale_nonces: AtomicU64::new(0),
            push_delay: crate::metrics::latency_histogram(),
        }
    }
}

/// The `org.apache.dubbo.auth.v1alpha1.RuleService` gRPC service.
#[derive(Clone)]
pub struct RuleService {
    index: Arc<Index>,
    encoder: Arc<encode::Encoder>,
    config: DdsConfig,
    policy: Policy,
    metrics: Arc<Metrics>,
    admission: Arc<RateLimiter>,
    shutdown: watch::Receiver<bool>,
    stats: Arc<DdsStats>,
    clients: Arc<clients::Clients>,
}

impl NamedService for RuleService {
    const NAME: &'static str = "org.apache.dubbo.auth.v1alpha1.RuleService";
}

impl RuleService {
    pub fn new(
        index: Arc<Index>,
        encoder: Arc<encode::Encoder>,
        config: DdsConfig,
        policy: Policy,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let admission = Arc::new(RateLimiter::new(
            config.new_streams_per_second,
            config.new_streams_burst,
        ));
        Self {
            index,
            encoder,
            config,
            policy,
            metrics,
            admission,
            shutdown,
            stats: Arc::new(DdsStats::default()),
            clients: Arc::new(clients::Clients::default()),
        }
    }

    pub fn stats(&self) -> Arc<DdsStats> {
        self.stats.clone()
    }

    /// The open streams and how far each client has got.
    pub fn clients(&self) -> Arc<clients::Clients> {
        self.clients.clone()
    }

    /// Admits a new stream and starts its task, or says why not. Cheap refusals (not loaded,
    /// stream cap, admission rate) come before any authentication work.
    async fn observe(&self, request: http::Request<Body>) -> Result<ObserveBody, Status> {
        // Admitted once any kind is in: a kind whose source is failing (a missing CRD, RBAC)
        // holds only its own subscriptions (their first answer waits), not every client's.
        if !self.index.any_loaded() {
            return Err(Status::unavailable(
                "initial state not loaded yet; retry shortly",
            ));
        }
        if *self.shutdown.borrow() {
            return Err(Status::unavailable(
                "control plane shutting down; reconnect",
            ));
        }
        let open = usize::try_from(self.stats.streams_open.load(Ordering::Relaxed)).unwrap_or(0);
        if open >= self.config.max_streams {
            self.metrics.rejected("max_streams");
            return Err(Status::resource_exhausted(format!(
                "{open} discovery streams open, the limit is {}; retry against another replica or later",
                self.config.max_streams
            )));
        }
        if let Some(encoding) = request.headers().get("grpc-encoding")
            && encoding != "identity"
        {
            return Err(Status::unimplemented(
                "compressed requests are not supported; send uncompressed messages",
            ));
        }
        if !self.admission.try_acquire() {
            self.stats.streams_refused.fetch_add(1, Ordering::Relaxed);
            self.metrics.rejected("new_stream_rate");
            return Err(Status::unavailable(
                "too many new discovery streams per second; retry with backoff",
            ));
        }
        // Authentication last: the checks above are free, and they bound how much
        // authentication work (token checks, TokenReviews) streams can cause.
        let metadata = tonic::metadata::MetadataMap::from_headers(request.headers().clone());
        let certificates: Option<Vec<Vec<u8>>> = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs())
            .map(|certs| certs.iter().map(|cert| cert.as_ref().to_vec()).collect());
        let identity = match self
            .policy
            .authenticate(&metadata, certificates.as_deref())
            .await
        {
            Ok(identity) => identity,
            Err(refusal) => {
                self.metrics.rejected("unauthenticated_stream");
                return Err(refusal.into_status());
            }
        };
        let peer = request
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
            .or_else(|| {
                let tls = request.extensions().get::<TlsConnectInfo<TcpConnectInfo>>();
                tls.and_then(|info| info.get_ref().remote_addr())
            });
        let decoder = tonic_prost::ProstCodec::<ObserveResponse, ObserveRequest>::raw_decoder(
            BufferSettings::new(REQUEST_BUFFER_BYTES, MAX_REQUEST_BYTES),
        );
        let requests =
            Streaming::new_request(decoder, request.into_body(), None, Some(MAX_REQUEST_BYTES));
        // One response in the channel at a time: a stream that does not drain holds at most
        // that one (plus what the transport buffers), and its next send times out.
        let (responses, rx) = mpsc::channel(1);
        let (end_tx, end_rx) = oneshot::channel();
        let index = self.index.clone();
        let encoder = self.encoder.clone();
        let config = self.config;
        let shutdown = self.shutdown.clone();
        let stats = self.stats.clone();
        let metrics = self.metrics.clone();
        let entry = self.clients.open(identity.as_ref(), peer);
        // What the auth-policy kinds are filtered by.
        let endpoint = entry.client.endpoint.clone();
        tokio::spawn(async move {
            stats.streams_open.fetch_add(1, Ordering::Relaxed);
            let result = stream::run(
                requests,
                stream::Served {
                    index,
                    encoder: &encoder,
                },
                stream::Caller {
                    endpoint,
                    status: &entry.client,
                },
                responses,
                config.send_timeout,
                shutdown,
                &stats,
            )
            .await;
            drop(entry);
            stats.streams_open.fetch_sub(1, Ordering::Relaxed);
            if let Err(status) = result {
                if status.code() == tonic::Code::OutOfRange {
                    metrics.rejected("message_size");
                }
                tracing::debug!(?peer, code = ?status.code(), message = status.message(), "discovery stream ended");
                let _ = end_tx.send(status);
            }
        });
        Ok(ObserveBody::new(rx, end_rx))
    }
}

impl tower::Service<http::Request<Body>> for RuleService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send + 'static>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move {
            if request.uri().path() != OBSERVE_PATH {
                return Ok(Status::unimplemented("").into_http());
            }
            let response = match service.observe(request).await {
                Ok(body) => {
                    let mut response = http::Response::new(Body::new(body));
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/grpc"),
                    );
                    response
                }
                Err(status) => status.into_http(),
            };
            Ok(response)
        })
    }
}
