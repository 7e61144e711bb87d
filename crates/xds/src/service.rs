//! The ADS service over [`Ads`], routed by hand rather than by tonic's generated server, for
//! what each open stream costs in memory.
//!
//! Requests: tonic gives every stream an 8 KiB read buffer, allocated when the stream opens and
//! kept while it lives; an xDS stream reads ACKs of a few hundred bytes, so it starts at
//! [`BUFFER`] bytes (tonic grows it for a larger message, a first request with a big node).
//!
//! Responses: tonic encodes a stream's responses into one buffer per stream, which keeps the
//! size of the largest response it ever sent (about 3.7 KiB per stream at 10,000 streams, by
//! heaptrack, of 16.7). Each response is encoded here into a buffer of its own size instead,
//! freed once written, and the body ends with the stream's status in its trailers, as tonic's.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_stream::Stream;
use tonic::codec::{BufferSettings, Streaming};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_prost::ProstDecoder;

use crate::server::Ads;

/// Each stream's read buffer to begin with.
pub const BUFFER: usize = 1024;
/// tonic's default: decoded messages are handed on once this much is buffered.
const YIELD_THRESHOLD: usize = 32 * 1024;

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

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

/// Serves one ADS call: the request body decoded as a stream of `Req`, `call` for the
/// responses, each encoded on its own.
async fn serve<B, Req, Res, St, F, Fut>(
    request: http::Request<B>,
    max_message: usize,
    call: F,
) -> http::Response<tonic::body::Body>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    Req: prost::Message + Default + Send + 'static,
    Res: prost::Message + Send + 'static,
    St: Stream<Item = Result<Res, Status>> + Send + Unpin + 'static,
    F: FnOnce(Request<Streaming<Req>>) -> Fut,
    Fut: Future<Output = Result<Response<St>, Status>>,
{
    // Compressed requests are refused as tonic refuses an encoding it was not given: before
    // the call, with what is accepted.
    if let Some(encoding) = request.headers().get("grpc-encoding")
        && encoding != "identity"
    {
        let mut response = Status::unimplemented(format!(
            "requests compressed with {encoding:?} are not accepted; send them uncompressed"
        ))
        .into_http();
        response.headers_mut().insert(
            "grpc-accept-encoding",
            http::HeaderValue::from_static("identity"),
        );
        return response;
    }
    let decoder = ProstDecoder::<Req>::new(BufferSettings::new(BUFFER, YIELD_THRESHOLD));
    let request =
        request.map(|body| Streaming::new_request(decoder, body, None, Some(max_message)));
    match call(Request::from_http(request)).await {
        Ok(response) => {
            let (metadata, responses, extensions) = response.into_parts();
            let mut http = http::Response::new(tonic::body::Body::new(Encoded {
                responses,
                done: false,
            }));
            *http.headers_mut() = metadata.into_headers();
            *http.extensions_mut() = extensions;
            http.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            http
        }
        Err(status) => status.into_http(),
    }
}

/// A stream of responses as a gRPC response body: each message framed in a buffer of its own
/// size, then the stream's status in the trailers (OK when it ends without one).
struct Encoded<St> {
    responses: St,
    done: bool,
}

impl<St, Res> http_body::Body for Encoded<St>
where
    St: Stream<Item = Result<Res, Status>> + Unpin,
    Res: prost::Message,
{
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let status = match std::task::ready!(Pin::new(&mut self.responses).poll_next(cx)) {
            Some(Ok(message)) => match frame(&message) {
                Ok(frame) => return Poll::Ready(Some(Ok(frame))),
                // The stream ends with the reason, as it would with any other status.
                Err(status) => status,
            },
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        self.done = true;
        let mut trailers = http::HeaderMap::new();
        Poll::Ready(Some(match status.add_header(&mut trailers) {
            Ok(()) => Ok(http_body::Frame::trailers(trailers)),
            Err(status) => Err(status),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// `message` in gRPC's length-prefixed framing: not compressed, its length, its bytes.
fn frame(message: &impl prost::Message) -> Result<http_body::Frame<bytes::Bytes>, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| {
        Status::internal(format!("a response of {len} bytes is too large to frame"))
    })?;
    let mut buf = Vec::with_capacity(5 + len);
    buf.push(0);
    buf.extend_from_slice(&prefix.to_be_bytes());
    message
        .encode(&mut buf)
        .map_err(|err| Status::internal(format!("encoding a response: {err}")))?;
    Ok(http_body::Frame::data(bytes::Bytes::from(buf)))
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
        let (ads, max) = (self.ads.clone(), self.max_message);
        match request.uri().path() {
            SOTW_PATH => Box::pin(async move {
                Ok(serve(request, max, |r| async move {
                    ads.stream_aggregated_resources(r).await
                })
                .await)
            }),
            DELTA_PATH => Box::pin(async move {
                Ok(serve(request, max, |r| async move {
                    ads.delta_aggregated_resources(r).await
                })
                .await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tower_service::Service as _;

    use super::*;

    #[tokio::test]
    async fn a_compressed_request_is_refused_before_the_call_with_what_is_accepted() {
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(crate::snapshot::Snapshot::default()));
        let mut service = AdsService::new(Ads::new(rx, 10), 1024);
        let request = |encoding: &str| {
            http::Request::builder()
                .uri(format!("http://localhost{SOTW_PATH}"))
                .header("content-type", "application/grpc")
                .header("grpc-encoding", encoding)
                .body(tonic::body::Body::empty())
                .unwrap()
        };
        let response = service.call(request("gzip")).await.unwrap();
        let headers = response.headers();
        assert_eq!(headers["grpc-status"], "12", "{headers:?}");
        assert_eq!(headers["grpc-accept-encoding"], "identity");
        // Uncompressed (identity) is served: the call runs and the stream opens.
        let response = service.call(request("identity")).await.unwrap();
        assert!(response.headers().get("grpc-status").is_none());
        assert_eq!(response.headers()["content-type"], "application/grpc");
    }

    #[tokio::test]
    async fn a_request_that_does_not_decode_ends_the_stream_with_internal() {
        use http_body_util::BodyExt as _;
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(crate::snapshot::Snapshot::default()));
        let mut service = AdsService::new(Ads::new(rx, 10), 1024);
        // One framed message whose bytes are no DiscoveryRequest (field 0 is invalid).
        let garbage = bytes::Bytes::from_static(&[0, 0, 0, 0, 2, 0x00, 0x00]);
        let request = http::Request::builder()
            .uri(format!("http://localhost{SOTW_PATH}"))
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::new(http_body_util::Full::new(garbage)))
            .unwrap();
        let response = service.call(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap();
        let trailers = body.trailers().cloned().unwrap_or_default();
        // Not OK: before, a failed request ended the stream as if the client had closed it.
        assert_eq!(trailers["grpc-status"], "13", "{trailers:?}");
    }
}
