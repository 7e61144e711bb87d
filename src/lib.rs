//! dubbo-cp: a control plane for Apache Dubbo services.
//!
//! # Layout
//! Data flows one way (see `shared/design.md`); every stage talks only to its neighbours:
//!
//! ```text
//! SDK -> ingest (authenticate, validate, authorize)
//!          |
//!          v
//!   standalone: store::Store (SQLite, the truth)   Kubernetes: store::Outbox (SQLite, pending)
//!          |  change feed                                  |  change feed
//!          v                                               v
//!   debounce -> store::publish                      debounce -> k8s::writer (per-key queue)
//!          |                                               |  upserts
//!          |                                               v
//!          |                                      API server <- kubectl edits too
//!          |                                               |  k8s::watch (one per kind)
//!          |                                               v
//!          |                                      debounce -> index
//!          v
//!   index (per kind: objects encoded once, state assembled per revision)
//!          |
//!          v
//!   dds (RuleService/Observe streams: subscribe, nonce, ACK, coalesce)
//! ```
//! - [`kind`]: the six kinds of the discovery stream.
//! - [`mapping`]: domain types, validation, object names; no I/O.
//! - [`rules`]: the rule kinds (specs, validation, manifests, which clients an auth policy
//!   reaches); no I/O. [`crds`]: the same kinds as Kubernetes custom resources. Standalone rules live in [`store`] (rule table, `--rules-dir`),
//!   Kubernetes rules come from [`k8s`] watches; both feed the index.
//! - [`ingest`]: the registration gRPC service.
//! - [`store`]: the durable group-commit writer, as the standalone store or the outbox.
//! - [`debounce`]: the generic debouncer every source goes through.
//! - [`k8s`]: custom resources, the write queue, the watches and the cluster view.
//! - [`index`]: the state the discovery stream reads; [`resources`] turns mappings into objects.
//! - [`dds`]: the discovery stream, `RuleService/Observe`.
//! - [`xds`]: Envoy's Aggregated Discovery Service, built from the same index.
//! - [`auth`]: who is calling and what they may do.
//! - [`ca`]: the certificate authority (roots, issuing, rotation, the published ConfigMaps);
//!   [`tls`]: the TLS port, with a certificate from the CA renewed while it serves;
//!   [`webhook`]: the pod admission webhook (Kubernetes mode) and its configuration object.
//! - [`canary`]: progressive delivery, the `Canary` controller (Kubernetes mode).
//! - [`supervisor`]: every long-lived task; a fault stops the process.
//! - [`server`]: all wiring, as named steps; [`coalesce`]: the xDS port's connections, whose
//!   writes go out once per poll of their HTTP/2 task.
//! - [`config`], [`telemetry`], [`metrics`], [`admin`], [`cli`]: settings, logs, metrics,
//!   the HTTP admin port, the sub-commands.
#![forbid(unsafe_code)]

// The workspace's library crates, under the paths the rest of the code (and the tests) name.
pub use dubbo_cp_admin as admin;
pub use dubbo_cp_admin::ui;
pub use dubbo_cp_auth as auth;
pub use dubbo_cp_ca as ca;
pub use dubbo_cp_canary as canary;
pub use dubbo_cp_crds as crds;
pub use dubbo_cp_dds as dds;
pub use dubbo_cp_dds::{digest, objects as resources};
pub use dubbo_cp_debounce as debounce;
pub use dubbo_cp_domain::{kind, mapping, resource, rules};
pub use dubbo_cp_index as index;
pub use dubbo_cp_ingest as ingest;
pub use dubbo_cp_k8s as k8s;
pub use dubbo_cp_kit::{duration, metrics, ratelimit, shutdown};
pub use dubbo_cp_store as store;
pub use dubbo_cp_webhook as webhook;
pub use dubbo_cp_xds as xds;
pub use dubbo_cp_zookeeper as zookeeper;

pub mod cli;
pub mod coalesce;
pub mod config;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod pb;
pub mod server;
pub mod supervisor;
pub mod telemetry;
pub mod tls;
