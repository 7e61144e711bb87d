//! The canary controller's metrics (rollout.md): weight and phase per Canary, reconcile time,
//! and the API writes it made (the benchmark's requests-per-reconcile).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CanaryLabels {
    pub namespace: String,
    pub name: String,
}

/// An alert's provider type (empty when the provider could not be read) and whether it got
/// through (`sent`, `failed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlertLabels {
    pub r#type: String,
    pub outcome: String,
}

pub struct CanaryStats {
    pub weight: Family<CanaryLabels, Gauge>,
    /// 0 running, 1 succeeded (or idle after initialisation), 2 failed: Flagger's encoding.
    pub status: Family<CanaryLabels, Gauge>,
    pub duration: Histogram,
    pub reconciles: AtomicU64,
    pub writes: AtomicU64,
    pub alerts: Family<AlertLabels, Counter>,
    /// Alerts not queued: the queue was full.
    pub alerts_dropped: AtomicU64,
}

impl Default for CanaryStats {
    fn default() -> Self {
        CanaryStats {
            weight: Family::default(),
            status: Family::default(),
            // Fine at the low end (a reconcile with nothing to do is well under a millisecond),
            // up to hooks that time out.
            duration: Histogram::new([
                0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0, 30.0, 120.0,
            ]),
            reconciles: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            alerts: Family::default(),
            alerts_dropped: AtomicU64::new(0),
        }
    }
}

impl CanaryStats {
    pub fn register_metrics(self: &std::sync::Arc<Self>, registry: &mut Registry) {
        use crate::metrics::scraped_counter;
        registry.register(
            "canary_weight",
            "Percent of the application's calls the canary pods are given",
            self.weight.clone(),
        );
        registry.register(
            "canary_status",
            "Phase of each Canary: 0 running, 1 succeeded or idle, 2 failed",
            self.status.clone(),
        );
        registry.register(
            "canary_duration_seconds",
            "Time one reconcile of a Canary took (hooks and queries included)",
            self.duration.clone(),
        );
        scraped_counter(
            registry,
            "canary_reconciles",
            "Reconciles of Canary objects",
            self,
            |s| s.reconciles.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "canary_api_writes",
            "Writes the canary controller made to the API server (creates, updates, deletes, events)",
            self,
            |s| s.writes.load(Ordering::Relaxed),
        );
        registry.register(
            "canary_alerts",
            "Alerts posted to AlertProviders, by provider type and outcome (sent, failed)",
            self.alerts.clone(),
        );
        scraped_counter(
            registry,
            "canary_alerts_dropped",
            "Alerts dropped because the delivery queue was full",
            self,
            |s| s.alerts_dropped.load(Ordering::Relaxed),
        );
    }

    pub fn forget(&self, labels: &CanaryLabels) {
        self.weight.remove(labels);
        self.status.remove(labels);
    }
}
