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

/// Type URL of the `<Kind>ToClient` messages in `ObserveResponse.data` (the discovery stream's
/// wire, so here with the messages and not in the domain).
pub fn type_url(kind: crate::index::Kind) -> &'static str {
    use crate::index::Kind;
    match kind {
        Kind::ServiceNameMapping => {
            "type.googleapis.com/dubbo.apache.org.v1alpha1.ServiceNameMappingToClient"
        }
        Kind::TagRoute => "type.googleapis.com/dubbo.apache.org.v1alpha1.TagRouteToClient",
        Kind::ConditionRoute => {
            "type.googleapis.com/dubbo.apache.org.v1alpha1.ConditionRouteToClient"
        }
        Kind::DynamicConfig => {
            "type.googleapis.com/dubbo.apache.org.v1alpha1.DynamicConfigToClient"
        }
        Kind::AuthenticationPolicy => {
            "type.googleapis.com/dubbo.apache.org.v1alpha1.AuthenticationPolicyToClient"
        }
        Kind::AuthorizationPolicy => {
            "type.googleapis.com/dubbo.apache.org.v1alpha1.AuthorizationPolicyToClient"
        }
        // Not discovery-stream kinds (`Kind::DISCOVERY`): no client subscribes to them.
        Kind::ServiceEntry => "type.googleapis.com/dubbo.apache.org.v1alpha1.ServiceEntry",
        Kind::Service => "type.googleapis.com/dubbo.apache.org.v1alpha1.Service",
    }
}
