//! The generated protobuf and gRPC code of every edge, under the paths the CLI and the tests name.
//! Each edge generates its own (registration: `dubbo-cp-ingest`, the discovery stream:
//! `dubbo-cp-dds`, the CA: `dubbo-cp-ca`).

pub use dubbo_cp_ca::pb as ca;
pub use dubbo_cp_dds::pb::{dds, rules};
pub use dubbo_cp_ingest::pb::{dubbo, snp, v1alpha1};
