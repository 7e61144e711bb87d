//! The CA's generated client (`proto/ca.proto`, package `org.apache.dubbo.auth.v1alpha1`).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("org.apache.dubbo.auth.v1alpha1");
