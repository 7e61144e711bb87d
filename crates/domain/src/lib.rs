//! dubbo-cp's domain: what the control plane knows, with no I/O, no protobuf, no tokio.
//!
//! # Layout
//! - [`kind`]: the six kinds of the discovery stream.
//! - [`mapping`]: service-name mappings: keys, validation of registrations, object names, the
//!   registrants annotation.
//! - [`rules`]: the rule kinds (specs, CRD schemas, validation, manifests, which clients an
//!   auth policy reaches).
//! - [`resource`]: one object of any kind, as the index holds it.
//! - [`service`]: services and their endpoints, for the edges that route traffic (xDS).
#![forbid(unsafe_code)]

pub mod kind;
pub mod mapping;
pub mod resource;
pub mod rules;
pub mod service;
