//! Generated protobuf and gRPC code, walled off here. The module tree mirrors the proto packages
//! so cross-package references in the generated code resolve; hand-written types live elsewhere.
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
    pub mod apache {
        pub mod org {
            /// Payloads of the discovery stream (wire.md §2).
            pub mod v1alpha1 {
                tonic::include_proto!("dubbo.apache.org.v1alpha1");
            }
        }
    }
}

pub mod org {
    pub mod apache {
        pub mod dubbo {
            pub mod auth {
                /// The discovery stream service (wire.md §2) and the CA (§6).
                pub mod v1alpha1 {
                    tonic::include_proto!("org.apache.dubbo.auth.v1alpha1");
                }
            }
        }
    }
}

/// Encoded descriptors of every proto above, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("dubbo_cp_descriptor");

pub use dubbo::apache::org::v1alpha1 as rules;
/// The CA's service, generated in its crate.
pub use dubbo_cp_ca::pb as ca;
pub use org::apache::dubbo::auth::v1alpha1 as dds;
pub use v1alpha1 as snp;
