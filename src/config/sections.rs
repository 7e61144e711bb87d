//! The binary's own sections of the configuration (`rules`, `log`, `grpc`, `tls`) and the mode;
//! every other section is its crate's, and `config.rs` only composes them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dubbo_cp_kit::duration;
use dubbo_cp_kit::duration::DurationArg;
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

use crate::telemetry::LogFormat;

/// The rule kinds (TagRoute, ConditionRoute, DynamicConfig, the auth policies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct RulesConfig {
    /// Auth policies in this namespace reach every client; elsewhere only their namespace's.
    #[arg(
        id = "rules.rootNamespace",
        long = "rules-root-namespace",
        env = "DUBBO_CP_RULES_ROOT_NAMESPACE"
    )]
    #[default("dubbo-system".to_owned())]
    pub root_namespace: String,
    /// Standalone and ZooKeeper modes: a directory of rule manifests applied at start and on
    /// every change (files that fail to parse keep their last good objects).
    #[arg(id = "rules.dir", long = "rules-dir", env = "DUBBO_CP_RULES_DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Standalone,
    Kubernetes,
    Zookeeper,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::Args)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`; the level comes from `RUST_LOG` (default `info`).
    #[arg(
        id = "log.format",
        long = "log-format",
        env = "DUBBO_CP_LOG_FORMAT",
        value_enum
    )]
    pub format: LogFormat,
}

/// Connection-level settings of the gRPC ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct GrpcConfig {
    /// HTTP/2 PING interval that detects dead peers.
    #[arg(id = "grpc.keepaliveInterval", long = "grpc-keepalive-interval",
          env = "DUBBO_CP_GRPC_KEEPALIVE_INTERVAL", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(30))]
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed.
    #[arg(id = "grpc.keepaliveTimeout", long = "grpc-keepalive-timeout",
          env = "DUBBO_CP_GRPC_KEEPALIVE_TIMEOUT", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(10))]
    pub keepalive_timeout: Duration,
    /// Connections older than this are closed so clients rebalance across replicas.
    #[arg(id = "grpc.maxConnectionAge", long = "max-connection-age",
          env = "DUBBO_CP_MAX_CONNECTION_AGE", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(30 * 60))]
    pub max_connection_age: Duration,
    /// How long the streams of an aged connection may go on before it is cut.
    #[arg(id = "grpc.maxConnectionAgeGrace", long = "grpc-max-connection-age-grace",
          env = "DUBBO_CP_GRPC_MAX_CONNECTION_AGE_GRACE", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(60))]
    pub max_connection_age_grace: Duration,
    /// Concurrent streams per connection (HTTP/2 makes the next one wait for a free slot).
    #[arg(
        id = "grpc.maxConcurrentStreams",
        long = "grpc-max-concurrent-streams",
        env = "DUBBO_CP_GRPC_MAX_CONCURRENT_STREAMS"
    )]
    #[default(1024)]
    pub max_concurrent_streams: u32,
}

/// The TLS gRPC port; served when a certificate and a key are given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    /// Address of the TLS gRPC port.
    #[arg(id = "tls.addr", long = "tls-addr", env = "DUBBO_CP_TLS_ADDR")]
    #[default(SocketAddr::from(([127, 0, 0, 1], 30062)))]
    pub addr: SocketAddr,
    /// PEM certificate (chain) of the TLS port.
    #[arg(id = "tls.certFile", long = "tls-cert", env = "DUBBO_CP_TLS_CERT")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the TLS port.
    #[arg(id = "tls.keyFile", long = "tls-key", env = "DUBBO_CP_TLS_KEY")]
    pub key_file: Option<PathBuf>,
    /// PEM CA of client certificates; with it clients may present one, whose SPIFFE URI SAN is
    /// the caller's identity.
    #[arg(
        id = "tls.clientCaFile",
        long = "tls-client-ca",
        env = "DUBBO_CP_TLS_CLIENT_CA"
    )]
    pub client_ca_file: Option<PathBuf>,
    /// SPIFFE trust domain client certificates must belong to (`cluster.local` as Istio's; an
    /// empty string accepts any).
    #[arg(
        id = "tls.trustDomain",
        long = "tls-trust-domain",
        env = "DUBBO_CP_TLS_TRUST_DOMAIN"
    )]
    #[default("cluster.local".to_owned())]
    pub trust_domain: String,
}
