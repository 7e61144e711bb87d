//! Prometheus metrics, served as OpenMetrics text on the admin port's `/metrics`.
//!
//! Counters the components already keep for themselves (atomics in their `*Stats`) are read at
//! scrape time by a collector, so there is one count per fact; latencies and sizes are
//! histograms the components observe as they work.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::dds::DdsStats;
use crate::k8s::writer::WriterStats;
use crate::store::EmbeddedStore;

/// Istio's convergence buckets (seconds), for the debounce delay.
pub const DEBOUNCE_BUCKETS: [f64; 8] = [0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];

/// 100 µs to about 3 s, doubling: commits, API requests, push delays.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

/// What the gRPC edge and the debounce loop observe.
#[derive(Debug)]
pub struct Metrics {
    /// Registrations by result.
    pub registrations: Family<ResultLabel, Counter>,
    /// Requests or streams refused by a bound, by which bound.
    pub rejections: Family<ReasonLabel, Counter>,
    /// Events merged into one flush.
    pub flush_size: Histogram,
    /// Seconds from a batch's first event to its flush.
    pub flush_delay: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            registrations: Family::default(),
            rejections: Family::default(),
            flush_size: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            flush_delay: Histogram::new(DEBOUNCE_BUCKETS),
        }
    }
}

impl Metrics {
    pub fn registration(&self, result: &'static str) {
        self.registrations
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn rejected(&self, reason: &'static str) {
        self.rejections.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// Everything `/metrics` shows.
pub struct Sources {
    pub metrics: Arc<Metrics>,
    pub store: EmbeddedStore,
    pub dds: Arc<DdsStats>,
    pub kube: Option<Arc<WriterStats>>,
}

/// The registry, built once at start.
pub fn registry(sources: Sources) -> Registry {
    let mut registry = Registry::with_prefix("dubbo_cp");
    let metrics = &sources.metrics;
    registry.register(
        "registrations",
        "Registrations by result",
        metrics.registrations.clone(),
    );
    registry.register(
        "rejections",
        "Requests and streams refused by a bound, by bound",
        metrics.rejections.clone(),
    );
    registry.register(
        "debounce_flush_size",
        "Events merged into one debounce flush",
        metrics.flush_size.clone(),
    );
    registry.register(
        "debounce_flush_delay_seconds",
        "Seconds from the first event of a batch to its flush",
        metrics.flush_delay.clone(),
    );
    let store = sources.store.stats();
    registry.register(
        "store_commit_duration_seconds",
        "Seconds per store transaction (including fsync)",
        store.commit_seconds.clone(),
    );
    registry.register(
        "dds_push_delay_seconds",
        "Seconds from a state's publication to its hand-over to a stream's transport",
        sources.dds.push_delay.clone(),
    );
    if let Some(kube) = &sources.kube {
        registry.register(
            "kube_request_duration_seconds",
            "Seconds per request to the Kubernetes API server",
            kube.request_seconds.0.clone(),
        );
        registry.register(
            "kube_errors",
            "Failed Kubernetes API requests by HTTP code (0: no answer)",
            kube.errors_by_code.clone(),
        );
    }
    registry.register_collector(Box::new(Scraped {
        store: sources.store,
        dds: sources.dds,
        kube: sources.kube,
    }));
    registry
}

/// Counters and gauges read from the components at scrape time.
struct Scraped {
    store: EmbeddedStore,
    dds: Arc<DdsStats>,
    kube: Option<Arc<WriterStats>>,
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> std::fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl std::fmt::Debug for Scraped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scraped").finish_non_exhaustive()
    }
}

impl Collector for Scraped {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        use std::sync::atomic::Ordering::Relaxed;
        let store = self.store.stats();
        let depth = i64::try_from(self.store.queue_depth()).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "ingest_queue_depth",
            "Registrations waiting for a commit",
            depth,
        )?;
        counter(
            &mut encoder,
            "store_commits",
            "Store transactions committed",
            store.commits.load(Relaxed),
        )?;
        counter(
            &mut encoder,
            "store_pairs_written",
            "(interface, application) pairs written to the store",
            store.pairs_written.load(Relaxed),
        )?;
        counter(
            &mut encoder,
            "store_errors",
            "Store transactions that failed",
            store.errors.load(Relaxed),
        )?;
        gauge(
            &mut encoder,
            "dds_streams_open",
            "Open discovery streams",
            self.dds.streams_open.load(Relaxed),
        )?;
        counter(
            &mut encoder,
            "dds_pushes",
            "Responses sent on discovery streams",
            self.dds.pushes.load(Relaxed),
        )?;
        counter(
            &mut encoder,
            "dds_stale_nonces",
            "Requests with a wrong or stale nonce",
            self.dds.stale_nonces.load(Relaxed),
        )?;
        counter(
            &mut encoder,
            "dds_streams_refused",
            "New streams refused by the admission rate",
            self.dds.streams_refused.load(Relaxed),
        )?;
        if let Some(kube) = &self.kube {
            let pending = i64::try_from(self.store.pair_count()).unwrap_or(i64::MAX);
            gauge(
                &mut encoder,
                "outbox_pending_pairs",
                "Acknowledged pairs not yet written to the API server",
                pending,
            )?;
            counter(
                &mut encoder,
                "kube_requests",
                "Requests sent to the Kubernetes API server",
                kube.requests.load(Relaxed),
            )?;
            counter(
                &mut encoder,
                "kube_writes",
                "Creates and updates that succeeded",
                kube.writes.load(Relaxed),
            )?;
            counter(
                &mut encoder,
                "kube_conflicts",
                "409 answers to creates and updates",
                kube.conflicts.load(Relaxed),
            )?;
        }
        Ok(())
    }
}

/// The registry as OpenMetrics text.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    Ok(text)
}

/// `grpc-status` of `OUT_OF_RANGE` (code 11), as it appears in a header.
const OUT_OF_RANGE: &[u8] = b"11";

/// Counts requests the transport refused for their size: tonic answers them itself with
/// `OUT_OF_RANGE` before any handler runs, so this layer reads the status on the way out.
#[derive(Clone)]
pub struct CountOversize<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> CountOversize<S> {
    pub fn layer(
        metrics: Arc<Metrics>,
    ) -> impl tower::Layer<S, Service = CountOversize<S>> + Clone {
        tower::layer::layer_fn(move |inner| CountOversize {
            inner,
            metrics: metrics.clone(),
        })
    }
}

impl<S, B, R> tower::Service<http::Request<B>> for CountOversize<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let response = call.await?;
            if response
                .headers()
                .get("grpc-status")
                .is_some_and(|status| status.as_bytes() == OUT_OF_RANGE)
            {
                metrics.rejected("message_size");
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn out_of_range_is_code_eleven() {
        assert_eq!(
            i32::from(tonic::Code::OutOfRange).to_string().as_bytes(),
            super::OUT_OF_RANGE
        );
    }
}
