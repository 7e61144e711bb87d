//! What the xDS edge counts, for `/metrics`: responses and rejections per type, the delay from a
//! version's publication to its hand-over to each stream, streams open and refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dubbo_cp_kit::metrics::{latency_histogram, scraped_counter, scraped_gauge};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::clients::Clients;
use crate::short_type;

/// `type="cluster"`, ... (the last word of the type URL, as Istio's `pilot_xds_pushes` has it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    pub r#type: &'static str,
}

impl TypeLabel {
    pub fn of(type_url: &str) -> TypeLabel {
        TypeLabel {
            r#type: short_type(type_url),
        }
    }
}

#[derive(Debug)]
pub struct XdsStats {
    /// Responses sent, by type.
    pub pushes: Family<TypeLabel, Counter>,
    /// Responses clients rejected, by type.
    pub nacks: Family<TypeLabel, Counter>,
    /// Seconds from a version's publication to its hand-over to a stream's transport.
    pub push_delay: Histogram,
    /// Streams refused: unauthenticated, or every place taken.
    pub refused: AtomicU64,
    /// Resources generated and encoded, over every version (each once per version, whatever
    /// the number of streams holding it).
    pub encodes: Arc<AtomicU64>,
}

impl Default for XdsStats {
    fn default() -> Self {
        XdsStats {
            pushes: Family::default(),
            nacks: Family::default(),
            push_delay: latency_histogram(),
            refused: AtomicU64::new(0),
            encodes: Arc::default(),
        }
    }
}

impl XdsStats {
    pub fn register_metrics(self: &Arc<Self>, clients: &Arc<Clients>, registry: &mut Registry) {
        registry.register(
            "xds_pushes",
            "xDS responses sent, by type",
            self.pushes.clone(),
        );
        registry.register(
            "xds_nacks",
            "xDS responses clients rejected (NACK), by type",
            self.nacks.clone(),
        );
        registry.register(
            "xds_push_delay_seconds",
            "Seconds from an xDS version's publication to its hand-over to a stream's transport",
            self.push_delay.clone(),
        );
        scraped_gauge(
            registry,
            "xds_clients",
            "Open xDS streams (state of the world and incremental)",
            clients,
            |c| i64::try_from(c.open_streams()).unwrap_or(i64::MAX),
        );
        scraped_gauge(
            registry,
            "xds_servers_mtls",
            "Listeners of xDS-enabled gRPC servers held now that require mTLS (STRICT)",
            clients,
            |c| c.count_servers(|s| s.tls == "STRICT"),
        );
        scraped_gauge(
            registry,
            "xds_servers_plaintext",
            "Listeners of xDS-enabled gRPC servers held now that are plaintext (PERMISSIVE, DISABLED or no policy)",
            clients,
            |c| c.count_servers(|s| s.tls != "STRICT"),
        );
        scraped_gauge(
            registry,
            "xds_servers_rbac",
            "Listeners of xDS-enabled gRPC servers held now that enforce AuthorizationPolicies (RBAC)",
            clients,
            |c| c.count_servers(|s| !s.allow.is_empty() || !s.deny.is_empty()),
        );
        scraped_gauge(
            registry,
            "xds_servers_not_enforced",
            "Listeners of xDS-enabled gRPC servers held now that do not enforce a policy as written (see /debug/xds)",
            clients,
            |c| c.count_servers(|s| !s.not_enforced.is_empty()),
        );
        scraped_counter(
            registry,
            "xds_resource_encodes",
            "xDS resources generated and encoded (once per version each, shared by every stream)",
            self,
            |s| s.encodes.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "xds_streams_refused",
            "xDS streams refused: unauthenticated, or the most streams already open",
            self,
            |s| s.refused.load(Ordering::Relaxed),
        );
    }
}
