//! The xDS edge (Envoy's Aggregated Discovery Service), as released gRPC clients (grpcio,
//! grpc-java/go, grpc-js-xds), Envoy and Dubbo Java's xDS module speak it.
//!
//! # Layout
//! - [`generate`]: a listener, route configuration, cluster and load assignment per name a
//!   client asks for, from the domain's services (`dubbo_cp_domain::service`). Each rule released
//!   clients impose (what they accept, and what they silently drop) is kept here and named in
//!   a comment; docs/xds.md says what reaches them.
//! - [`split`]: the share of calls each endpoint gets, read from what a client is served.
//! - [`protocol`]: one stream's state of the world per type: subscriptions, versions, nonces,
//!   ACKs and NACKs, and what to answer. No I/O.
//! - [`delta`]: the same for incremental streams (Envoy's): only changes and removals are sent.
//! - [`snapshot`]: the services at one version, and the resources a subscription selects.
//! - [`conditions`]: Dubbo's ConditionRoute, what clients can apply of it, as routes to subsets.
//! - [`inbound`]: listeners of xDS-enabled gRPC servers (gRFC A36), with their TLS and RBAC.
//! - [`security`]: AuthenticationPolicy as TLS (servers, and auto mTLS for their callers) and
//!   AuthorizationPolicy as RBAC filters (gRFCs A29, A41).
//! - [`tags`]: Dubbo's tag routing (TagRoute, static tags) as header-matched routes to subsets.
//! - [`server`]: the ADS gRPC service, one task per stream over the published snapshots.
//! - [`bootstrap`]: the bootstrap gRPC clients start from (`dubbo-cp bootstrap`, the webhook).
//! - [`clients`]: the connected clients' status (node, subscriptions, ACKed versions, NACKs).
//! - [`dump`]: what each client was served, as a CSDS `ClientConfig` in JSON (`/debug/xds`).
//! - [`source`]: the snapshots, built from the index after each burst of changes.
//! - [`stats`]: pushes, NACKs, push delay and streams, for `/metrics`.
#![forbid(unsafe_code)]

pub mod bootstrap;
#[cfg(test)]
mod changing;
pub mod clients;
pub mod conditions;
mod config;
pub mod delta;
pub mod dump;
pub mod generate;
pub mod inbound;
pub mod overrides;
pub mod protocol;
pub mod security;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod source;
pub mod split;
pub mod stats;
pub mod tags;

/// Declared with the other settings (the `xds` section).
pub use config::XdsConfig;
pub use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;

/// The type URLs of the four resource types, in the order a push sends them (clusters, then
/// endpoints, then listeners, then routes: a client never sees a name before what it names).
pub const PUSH_ORDER: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// `cluster`, `endpoint`, `listener`, `route` (what operators type and metrics label), or
/// `other`.
pub fn short_type(type_url: &str) -> &'static str {
    match type_url {
        CLUSTER => "cluster",
        ENDPOINT => "endpoint",
        LISTENER => "listener",
        ROUTE => "route",
        _ => "other",
    }
}

/// The type URL of a [`short_type`] name.
pub fn type_url_of(short: &str) -> Option<&'static str> {
    [CLUSTER, ENDPOINT, LISTENER, ROUTE]
        .into_iter()
        .find(|type_url| short_type(type_url) == short)
}
