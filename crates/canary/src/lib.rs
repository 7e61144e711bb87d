//! Progressive delivery (rollout.md): the `Canary` resource and the controller that runs
//! Flagger's analysis loop itself, moving traffic with provider weights pushed as a
//! `DynamicConfig` over the discovery stream. Kubernetes mode only.
//!
//! - [`crd`]: the resource and its strategies; [`weight`]: the formula and the DynamicConfig it
//!   makes; [`abtest`]: the ConditionRoute of an A/B run;
//!   [`deployments`]: the primary, readiness, the spec hash, ready pods; [`services`] and
//!   [`autoscaler`]: the Services and the primary's HPA (no I/O).
//! - [`prometheus`], [`hooks`] over [`http`]: the outside calls of an analysis; [`template`]:
//!   Flagger's MetricTemplate and the credentials it names; [`alerts`]: Flagger's
//!   AlertProvider and `analysis.alerts`, [`messages`] what each provider type is sent,
//!   [`notifier`] their delivery off the reconcile path.
//! - [`reconcile`]: one step of the loop; [`controller`]: the watches and the Lease around it.

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_domain::rules;
use dubbo_cp_kit::metrics;

pub mod abtest;
pub mod alerts;
pub mod autoscaler;
pub mod config;
pub mod configs;
pub mod controller;
pub mod crd;
pub mod deployments;
pub mod events;
pub mod hooks;
pub mod http;
pub mod lease;
pub mod messages;
pub mod notifier;
pub mod ops;
pub mod prometheus;
pub mod reconcile;
pub mod revisions;
pub mod services;
pub mod stats;
pub mod template;
pub mod weight;

pub use config::CanaryConfig;
pub use crd::{Canary, CanarySpec, CanaryStatus, Strategy};
