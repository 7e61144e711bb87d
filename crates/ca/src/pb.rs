//! The CA's generated protobuf and gRPC code (`proto/ca.proto`, package
//! `org.apache.dubbo.auth.v1alpha1`, wire.md §6).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("org.apache.dubbo.auth.v1alpha1");

/// Encoded descriptors of `ca.proto`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ca_descriptor");
