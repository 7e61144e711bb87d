//! The ADS service over [`Ads`] as tonic's generated server routes it, with small codec buffers.
//!
//! tonic gives every stream an 8 KiB read buffer and an 8 KiB write buffer, allocated when the
//! stream opens and kept while it lives: half of what an idle stream cost at 100,000 streams
//! (BENCHMARKS.md). An xDS stream reads ACKs of a few hundred bytes and writes a response per
//! change, so it starts at [`BUFFER`] bytes each way; tonic grows a buffer for a larger message
//! (a first request with a big node, a large cluster list) as it would anyway.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tonic::codec::{BufferSettings, Codec};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::{ProstDecoder, ProstEncoder};

use crate::server::Ads;

/// Each stream's read and write buffer to begin with.
pub const BUFFER: usize = 1024;
/// Encoded responses are handed to HTTP/2 once this much is waiting (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Prost's encoding with [`BUFFER`]-byte buffers.
struct SmallBuffers<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for SmallBuffers<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER, YIELD_THRESHOLD)
}

impl<T, U> Codec for SmallBuffers<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}

/// The ADS service the gRPC router serves.
#[derive(Clone)]
pub struct AdsService {
    ads: Arc<Ads>,
    max_message: usize,
}

impl AdsService {
    /// Decoded requests are limited to `max_message` bytes (tonic's default is 4 MiB).
    pub fn new(ads: Ads, max_message: usize) -> Self {
        Self {
            ads: Arc::new(ads),
            max_message,
        }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

struct Sotw(Arc<Ads>);

impl StreamingService<DiscoveryRequest> for Sotw {
    type Response = DiscoveryResponse;
    type ResponseStream = <Ads as AggregatedDiscoveryService>::StreamAggregatedResourcesStream;
    type Future = BoxFuture<Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let ads = self.0.clone();
        Box::pin(async move { ads.stream_aggregated_resources(request).await })
    }
}

struct Delta(Arc<Ads>);

impl StreamingService<DeltaDiscoveryRequest> for Delta {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream = <Ads as AggregatedDiscoveryService>::DeltaAggregatedResourcesStream;
    type Future = BoxFuture<Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let ads = self.0.clone();
        Box::pin(async move { ads.delta_aggregated_resources(request).await })
    }
}

impl<B> tower_service::Service<http::Request<B>> for AdsService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (ads, max) = (self.ads.clone(), Some(self.max_message));
        match request.uri().path() {
            SOTW_PATH => Box::pin(async move {
                let mut grpc =
                    Grpc::new(SmallBuffers::<DiscoveryResponse, DiscoveryRequest>::default())
                        .apply_max_message_size_config(max, None);
                Ok(grpc.streaming(Sotw(ads), request).await)
            }),
            DELTA_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(SmallBuffers::<
                    DeltaDiscoveryResponse,
                    DeltaDiscoveryRequest,
                >::default())
                .apply_max_message_size_config(max, None);
                Ok(grpc.streaming(Delta(ads), request).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}
