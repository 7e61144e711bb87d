//! The discovery stream's generated protobuf and gRPC code (`proto/dds.proto`, `proto/rules.proto`,
//! wire.md §2). The module tree mirrors the proto packages so cross-package references resolve.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod dubbo {
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
                /// The discovery stream service (wire.md §2).
                pub mod v1alpha1 {
                    tonic::include_proto!("org.apache.dubbo.auth.v1alpha1");
                }
            }
        }
    }
}

/// Encoded descriptors of `dds.proto` and `rules.proto`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("dds_descriptor");

pub use dubbo::apache::org::v1alpha1 as rules;
pub use org::apache::dubbo::auth::v1alpha1 as dds;
