//! Kubernetes mode: the ServiceNameMapping custom resource, the upserts that write it, and the
//! watch that feeds what is in the cluster to the index.

pub mod crd;

pub use crd::{ServiceNameMapping, ServiceNameMappingSpec};
