//! Prometheus metrics, served as OpenMetrics text on the admin port's `/metrics`.
//!
//! This module is a leaf: shared label types, buckets and helpers, and the counters of the gRPC
//! edge. Each component registers its own series (`register_metrics`); counters it already keeps
//! as atomics are read at scrape time ([`scraped_counter`]), so there is one count per fact.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "registrations",
            "Registrations by result",
            self.registrations.clone(),
        );
        registry.register(
            "rejections",
            "Requests and streams refused by a bound, by bound",
            self.rejections.clone(),
        );
        registry.register(
            "debounce_flush_size",
            "Events merged into one debounce flush",
            self.flush_size.clone(),
        );
        registry.register(
            "debounce_flush_delay_seconds",
            "Seconds from the first event of a batch to its flush",
            self.flush_delay.clone(),
        );
    }

    /// Records one debounce flush.
    pub fn flushed(&self, events: usize, first_event: tokio::time::Instant) {
        self.flush_size.observe(events as f64);
        self.flush_delay
            .observe(first_event.elapsed().as_secs_f64());
    }

    pub fn registration(&self, result: &'static str) {
        self.registrations
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    pub fn rejected(&self, reason: &'static str) {
        self.rejections.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// A counter read from a component at scrape time, so the component keeps one count per fact
/// (an atomic it needs anyway) and registers it under its own name.
pub fn scraped_counter<T: Send + Sync + 'static>(
    registry: &mut Registry,
    name: &'static str,
    help: &'static str,
    source: &Arc<T>,
    read: fn(&T) -> u64,
) {
    registry.register_collector(Box::new(Scraped {
        name,
        help,
        source: source.clone(),
        read: Read::Counter(read),
    }));
}

/// A gauge read from a component at scrape time.
pub fn scraped_gauge<T: Send + Sync + 'static>(
    registry: &mut Registry,
    name: &'static str,
    help: &'static str,
    source: &Arc<T>,
    read: fn(&T) -> i64,
) {
    registry.register_collector(Box::new(Scraped {
        name,
        help,
        source: source.clone(),
        read: Read::Gauge(read),
    }));
}

enum Read<T> {
    Counter(fn(&T) -> u64),
    Gauge(fn(&T) -> i64),
}

struct Scraped<T> {
    name: &'static str,
    help: &'static str,
    source: Arc<T>,
    read: Read<T>,
}

impl<T> std::fmt::Debug for Scraped<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scraped").field("name", &self.name).finish()
    }
}

impl<T: Send + Sync + 'static> Collector for Scraped<T> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        match self.read {
            Read::Counter(read) => {
                let metric = ConstCounter::new(read(&self.source));
                metric.encode(encoder.encode_descriptor(
                    self.name,
                    self.help,
                    None,
                    metric.metric_type(),
                )?)
            }
            Read::Gauge(read) => {
                let metric = ConstGauge::new(read(&self.source));
                metric.encode(encoder.encode_descriptor(
                    self.name,
                    self.help,
                    None,
                    metric.metric_type(),
                )?)
            }
        }
    }
}

/// The `Content-Type` of what [`render`] makes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
