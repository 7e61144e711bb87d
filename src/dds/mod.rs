//! The discovery stream, `RuleService/Observe` (wire.md §2, behaviour.md "Discovery stream").
//!
//! One task per stream runs the protocol ([`stream`]); this module admits streams (readiness,
//! admission rate) and hands each task's responses to tonic through a bounded channel.

pub mod admission;
pub mod stream;
pub mod wire;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::index::Index;
use crate::pb::dds::ObserveRequest;
use crate::pb::dds::rule_service_server;
use admission::RateLimiter;
pub use wire::ObserveResponse;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DdsConfig {
    /// A response not taken by the transport within this time ends the stream.
    pub send_timeout: Duration,
    /// New streams admitted per second, on average.
    pub new_streams_per_second: f64,
    /// New streams admitted at once after a quiet period.
    pub new_streams_burst: u32,
}

impl Default for DdsConfig {
    fn default() -> Self {
        Self {
            send_timeout: Duration::from_secs(5),
            new_streams_per_second: 1000.0,
            new_streams_burst: 2000,
        }
    }
}

/// Counters for logs, tests and benchmarks.
#[derive(Debug, Default)]
pub struct DdsStats {
    pub streams_open: AtomicI64,
    pub streams_refused: AtomicU64,
    pub pushes: AtomicU64,
    pub stale_nonces: AtomicU64,
}

#[derive(Clone)]
pub struct RuleService {
    index: Arc<Index>,
    config: DdsConfig,
    admission: Arc<RateLimiter>,
    shutdown: watch::Receiver<bool>,
    stats: Arc<DdsStats>,
}

impl RuleService {
    pub fn new(index: Arc<Index>, config: DdsConfig, shutdown: watch::Receiver<bool>) -> Self {
        let admission = Arc::new(RateLimiter::new(
            config.new_streams_per_second,
            config.new_streams_burst,
        ));
        Self {
            index,
            config,
            admission,
            shutdown,
            stats: Arc::new(DdsStats::default()),
        }
    }

    pub fn stats(&self) -> Arc<DdsStats> {
        self.stats.clone()
    }
}

#[tonic::async_trait]
impl rule_service_server::RuleService for RuleService {
    type ObserveStream = ResponseStream;

    async fn observe(
        &self,
        request: Request<Streaming<ObserveRequest>>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        if !self.index.is_loaded() {
            return Err(Status::unavailable(
                "initial state not loaded yet; retry shortly",
            ));
        }
        if *self.shutdown.borrow() {
            return Err(Status::unavailable(
                "control plane shutting down; reconnect",
            ));
        }
        if !self.admission.try_acquire() {
            self.stats.streams_refused.fetch_add(1, Ordering::Relaxed);
            return Err(Status::unavailable(
                "too many new discovery streams per second; retry with backoff",
            ));
        }
        let peer = request.remote_addr();
        let requests = request.into_inner();
        // One response in the channel at a time: a stream that does not drain holds at most
        // that one (plus what the transport buffers), and its next send times out.
        let (responses, rx) = mpsc::channel(1);
        let (end_tx, end_rx) = oneshot::channel();
        let index = self.index.clone();
        let config = self.config;
        let shutdown = self.shutdown.clone();
        let stats = self.stats.clone();
        tokio::spawn(async move {
            stats.streams_open.fetch_add(1, Ordering::Relaxed);
            let result = stream::run(
                requests,
                index,
                responses,
                config.send_timeout,
                shutdown,
                &stats,
            )
            .await;
            stats.streams_open.fetch_sub(1, Ordering::Relaxed);
            if let Err(status) = result {
                tracing::debug!(?peer, code = ?status.code(), message = status.message(), "discovery stream ended");
                let _ = end_tx.send(status);
            }
        });
        Ok(Response::new(ResponseStream {
            responses: rx,
            end: Some(end_rx),
        }))
    }
}

/// What tonic sends: the task's responses, or its final error status, which overtakes anything
/// still queued.
pub struct ResponseStream {
    responses: mpsc::Receiver<ObserveResponse>,
    end: Option<oneshot::Receiver<Status>>,
}

impl Stream for ResponseStream {
    type Item = Result<ObserveResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(end) = self.end.as_mut() {
            match Pin::new(end).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    self.end = None;
                    self.responses.close();
                    return Poll::Ready(Some(Err(status)));
                }
                // The task ended without an error: drain what it sent, then finish.
                Poll::Ready(Err(_)) => self.end = None,
                Poll::Pending => {}
            }
        }
        match self.responses.poll_recv(cx) {
            Poll::Ready(Some(response)) => Poll::Ready(Some(Ok(response))),
            Poll::Ready(None) if self.end.is_some() => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
