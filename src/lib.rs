//! dubbo-cp: a control plane for Apache Dubbo services.
//!
//! # Layout
//! Data flows one way (see `shared/design.md`):
//! `ingest` (gRPC registration, validation) -> `store` (durable, group commit, then ack) ->
//! `debounce` (merges bursts) -> `index` (revisioned state per kind) -> discovery streams.
//! - [`mapping`]: domain types and validation; no I/O.
//! - [`debounce`]: the generic debouncer.
//! - [`store`]: the embedded SQLite store.
//! - [`index`]: the state the discovery stream reads; [`resources`] turns mappings into its objects.
//! - [`dds`]: the discovery stream, `RuleService/Observe`.
//! - [`ingest`]: the registration gRPC service.
//! - [`server`]: all wiring, in one function.
//! - [`config`], [`telemetry`], [`admin`]: configuration, logs, the HTTP admin port.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod cli;
pub mod config;
pub mod dds;
pub mod debounce;
#[doc(hidden)]
pub mod fuzzing;
pub mod index;
pub mod ingest;
pub mod k8s;
pub mod mapping;
pub mod metrics;
pub mod pb;
pub mod ratelimit;
pub mod resources;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod supervisor;
pub mod telemetry;
