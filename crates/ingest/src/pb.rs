//! The registration service's generated protobuf and gRPC code (wire.md §1). The module tree
//! mirrors the proto packages so cross-package references resolve.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Registration, package `v1alpha1` (wire.md §1).
pub mod v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

pub mod dubbo {
    pub mod networking {
        /// The same registration service under the other lineage's package (wire.md §1).
        pub mod v1alpha1 {
            tonic::include_proto!("dubbo.networking.v1alpha1");
        }
    }
}

/// Encoded descriptors of `snp.proto` and `snp_networking.proto`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ingest_descriptor");

pub use v1alpha1 as snp;
