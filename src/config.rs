//! Configuration: flags beat environment variables beat the YAML file beat defaults.
//! Durations are accepted as human strings (`100ms`, `10s`) or as integer nanoseconds, the way
//! the reference control plane writes them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dds::DdsConfig;
use crate::debounce::DebounceConfig;
use crate::telemetry::LogFormat;

pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:30060";
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:30070";
pub const DEFAULT_DATA_DIR: &str = "./data";

/// The effective configuration of `serve`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    pub debounce: DebounceConfig,
    pub ingest: IngestConfig,
    pub dds: DdsConfig,
    pub grpc: GrpcConfig,
    /// How long shutdown waits for in-flight work before it gives up on it.
    pub shutdown_grace: Duration,
    /// Serve without authentication on a non-loopback address.
    pub insecure_allow_unauthenticated: bool,
    /// Where mappings live: the embedded store, or ServiceNameMapping objects in Kubernetes.
    pub mode: Mode,
    pub auth: AuthConfig,
    pub tls: TlsConfig,
    pub kubernetes: KubernetesConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Standalone,
    Kubernetes,
}

/// The TLS gRPC port; on when a certificate and key are given.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    pub addr: SocketAddr,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// CA that signs client certificates; with it, clients may present one (SPIFFE identity).
    pub client_ca_file: Option<PathBuf>,
    /// Trust domain client certificates' SPIFFE IDs must have (default `cluster.local`, as
    /// Istio's); an empty string accepts any.
    pub trust_domain: Option<String>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 30062)),
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            trust_domain: Some("cluster.local".to_owned()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// Static token file (standalone authentication); `None`: no authentication.
    pub token_file: Option<PathBuf>,
    /// How often the token file is checked for changes.
    pub reload_interval: Duration,
    /// Identities that may register in any namespace.
    pub admins: Vec<String>,
    /// Answer refusals with gRPC OK and `success: false` (old SDKs read only `success`).
    pub legacy_answers: bool,
    /// Kubernetes mode: check bearer tokens with TokenReview (default: on in Kubernetes mode).
    pub token_review: Option<bool>,
    /// How long a positive answer on a token is reused (never past the token's `exp`).
    pub cache_ttl: Duration,
    /// How long a negative answer on a token is reused.
    pub negative_cache_ttl: Duration,
    /// Bytes of tokens the authentication cache may hold.
    pub cache_bytes: u64,
    /// TokenReviews (and pod GETs) per second, for tokens that cannot be verified locally.
    pub token_reviews_per_second: f64,
    /// TokenReviews at once after a quiet period.
    pub token_reviews_burst: u32,
    /// How often the cluster's service-account keys are fetched again.
    pub keys_refresh_interval: Duration,
    /// Audiences of the API server, besides its issuer, that `kubernetes` tokens verified
    /// locally may carry (others go to a TokenReview).
    pub api_audiences: Vec<String>,
}

impl Config {
    /// Whether callers are authenticated: a token file, or TokenReview in Kubernetes mode.
    pub fn authenticates(&self) -> bool {
        self.auth.token_file.is_some() || self.uses_token_review()
    }

    pub fn uses_token_review(&self) -> bool {
        self.auth.token_file.is_none()
            && self.mode == Mode::Kubernetes
            && self.auth.token_review != Some(false)
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            token_file: None,
            reload_interval: Duration::from_secs(2),
            admins: Vec::new(),
            legacy_answers: false,
            token_review: None,
            cache_ttl: Duration::from_secs(30),
            negative_cache_ttl: Duration::from_secs(10),
            cache_bytes: 32 * 1024 * 1024,
            token_reviews_per_second: 20.0,
            token_reviews_burst: 40,
            keys_refresh_interval: Duration::from_secs(300),
            api_audiences: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesConfig {
    /// API server URL; `None` uses KUBECONFIG, ~/.kube/config or the in-cluster account.
    pub api_server: Option<String>,
    pub writer: crate::k8s::writer::WriterConfig,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IngestConfig {
    /// Registrations that may wait for a commit; beyond this, callers get `RESOURCE_EXHAUSTED`.
    pub queue_capacity: usize,
    /// Most registrations committed in one transaction.
    pub max_batch: usize,
    /// How long a caller waits for its commit before it gets `UNAVAILABLE`.
    pub commit_timeout: Duration,
    /// Registrations per second one authenticated identity may send, on average; beyond it,
    /// `RESOURCE_EXHAUSTED`. (Without authentication the bounded queue is the limit.)
    pub rate_per_caller: f64,
    /// Registrations one caller may send at once after a quiet period.
    pub burst_per_caller: u32,
    /// Bytes the registrations waiting for a commit may occupy.
    pub queue_bytes: usize,
    /// Most applications one (namespace, interface) may hold.
    pub max_applications_per_key: usize,
}

/// Connection-level settings of the gRPC port.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrpcConfig {
    /// HTTP/2 PING interval that detects dead peers.
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// Connections older than this are closed so clients rebalance across replicas.
    pub max_connection_age: Duration,
    /// How long streams of an aged connection may go on before it is cut.
    pub max_connection_age_grace: Duration,
    /// Concurrent streams per connection.
    pub max_concurrent_streams: u32,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(30 * 60),
            max_connection_age_grace: Duration::from_secs(60),
            max_concurrent_streams: 1024,
        }
    }
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 8192,
            max_batch: 4096,
            commit_timeout: Duration::from_secs(10),
            rate_per_caller: 200.0,
            burst_per_caller: 2000,
            queue_bytes: 64 * 1024 * 1024,
            max_applications_per_key: 1000,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 30060)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 30070)),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            log_format: LogFormat::Text,
            debounce: DebounceConfig::default(),
            ingest: IngestConfig::default(),
            dds: DdsConfig::default(),
            grpc: GrpcConfig::default(),
            shutdown_grace: Duration::from_secs(15),
            insecure_allow_unauthenticated: false,
            mode: Mode::Standalone,
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            kubernetes: KubernetesConfig {
                api_server: None,
                writer: crate::k8s::writer::WriterConfig::default(),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The YAML file. Every field is optional; unknown fields are an error so typos do not pass
/// silently.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<LogSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<DebounceSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingest: Option<IngestSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dds: Option<DdsSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcSection>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub shutdown_grace: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_allow_unauthenticated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSection>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_server: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel_writes: Option<usize>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub parked_retry_interval: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<LogFormat>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DebounceSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub after: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngestSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_capacity: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<usize>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub commit_timeout: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_caller: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst_per_caller: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_applications_per_key: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub reload_interval: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admins: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legacy_answers: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_review: Option<bool>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_ttl: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DdsSection {
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub send_timeout: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_streams_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_streams_burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrpcSection {
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub keepalive_interval: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub keepalive_timeout: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_connection_age: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_connection_age_grace: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<u32>,
}

/// What flags and environment variables set (clap fills both); `None` falls through to the file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// YAML config file.
    #[arg(long, env = "DUBBO_CP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the plain gRPC port [default: 127.0.0.1:30060].
    #[arg(long, env = "DUBBO_CP_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// Address of the HTTP admin port (/healthz, /readyz) [default: 127.0.0.1:30070].
    #[arg(long, env = "DUBBO_CP_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// Directory of the embedded database [default: ./data].
    #[arg(long, env = "DUBBO_CP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Log format [default: text].
    #[arg(long, env = "DUBBO_CP_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Debounce on or off [default: true].
    #[arg(long, env = "DUBBO_CP_DEBOUNCE_ENABLE", action = clap::ArgAction::Set)]
    pub debounce_enable: Option<bool>,
    /// Quiet time before a flush, e.g. 100ms or 100000000 (ns) [default: 100ms].
    #[arg(long, env = "DUBBO_CP_DEBOUNCE_AFTER", value_parser = parse_duration)]
    pub debounce_after: Option<Duration>,
    /// Longest delay of a flush [default: 10s].
    #[arg(long, env = "DUBBO_CP_DEBOUNCE_MAX", value_parser = parse_duration)]
    pub debounce_max: Option<Duration>,
    /// Registrations that may wait for a commit [default: 8192].
    #[arg(long, env = "DUBBO_CP_INGEST_QUEUE_CAPACITY")]
    pub ingest_queue_capacity: Option<usize>,
    /// How long a registration waits for its commit [default: 10s].
    #[arg(long, env = "DUBBO_CP_COMMIT_TIMEOUT", value_parser = parse_duration)]
    pub commit_timeout: Option<Duration>,
    /// How long a discovery response may wait for the transport [default: 5s].
    #[arg(long, env = "DUBBO_CP_DDS_SEND_TIMEOUT", value_parser = parse_duration)]
    pub dds_send_timeout: Option<Duration>,
    /// New discovery streams admitted per second [default: 1000].
    #[arg(long, env = "DUBBO_CP_NEW_STREAMS_PER_SECOND")]
    pub new_streams_per_second: Option<f64>,
    /// New discovery streams admitted at once [default: 2000].
    #[arg(long, env = "DUBBO_CP_NEW_STREAMS_BURST")]
    pub new_streams_burst: Option<u32>,
    /// Connections older than this are closed so clients rebalance [default: 30m].
    #[arg(long, env = "DUBBO_CP_MAX_CONNECTION_AGE", value_parser = parse_duration)]
    pub max_connection_age: Option<Duration>,
    /// Serve on a non-loopback address without authentication (logged loudly).
    #[arg(long, env = "DUBBO_CP_INSECURE_ALLOW_UNAUTHENTICATED", action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub insecure_allow_unauthenticated: Option<bool>,
    /// Address of the TLS gRPC port [default: 127.0.0.1:30062]; served when a certificate is set.
    #[arg(long, env = "DUBBO_CP_TLS_ADDR")]
    pub tls_addr: Option<SocketAddr>,
    /// PEM certificate (chain) of the TLS port.
    #[arg(long, env = "DUBBO_CP_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the TLS port.
    #[arg(long, env = "DUBBO_CP_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA of client certificates (their SPIFFE URI SAN is the caller's identity).
    #[arg(long, env = "DUBBO_CP_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Static token file: authenticates callers (standalone) and allows non-loopback addresses.
    #[arg(long, env = "DUBBO_CP_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Answer refusals with OK and `success: false`, for SDKs that only read `success`.
    #[arg(long, env = "DUBBO_CP_LEGACY_ANSWERS", action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub legacy_answers: Option<bool>,
    /// standalone (embedded store) or kubernetes (ServiceNameMapping objects) [default: standalone].
    #[arg(long, env = "DUBBO_CP_MODE", value_enum)]
    pub mode: Option<Mode>,
    /// Kubernetes API server URL [default: from KUBECONFIG, ~/.kube/config or in-cluster].
    #[arg(long, env = "DUBBO_CP_KUBE_API_SERVER")]
    pub kube_api_server: Option<String>,
    /// API requests per second to the Kubernetes API server [default: 50].
    #[arg(long, env = "DUBBO_CP_KUBE_QPS")]
    pub kube_qps: Option<f64>,
    /// API requests at once after a quiet period [default: 100].
    #[arg(long, env = "DUBBO_CP_KUBE_BURST")]
    pub kube_burst: Option<u32>,
}

impl Config {
    /// Reads the file named by the arguments (if any) and layers flags and environment over it.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => FileConfig::read(path)?,
            None => FileConfig::default(),
        };
        Config::resolve(args, file)
    }

    /// Flags and environment (already merged by clap) over the file over defaults.
    pub fn resolve(args: &ServeArgs, file: FileConfig) -> Result<Config, ConfigError> {
        let defaults = Config::default();
        let log = file.log.unwrap_or_default();
        let debounce = file.debounce.unwrap_or_default();
        let ingest = file.ingest.unwrap_or_default();
        let dds = file.dds.unwrap_or_default();
        let grpc = file.grpc.unwrap_or_default();
        let kubernetes = file.kubernetes.unwrap_or_default();
        let auth = file.auth.unwrap_or_default();
        let tls = file.tls.unwrap_or_default();
        let config = Config {
            grpc_addr: args
                .grpc_addr
                .or(file.grpc_addr)
                .unwrap_or(defaults.grpc_addr),
            admin_addr: args
                .admin_addr
                .or(file.admin_addr)
                .unwrap_or(defaults.admin_addr),
            data_dir: args
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or(defaults.data_dir),
            log_format: args
                .log_format
                .or(log.format)
                .unwrap_or(defaults.log_format),
            debounce: DebounceConfig {
                enable: args
                    .debounce_enable
                    .or(debounce.enable)
                    .unwrap_or(defaults.debounce.enable),
                after: args
                    .debounce_after
                    .or(debounce.after)
                    .unwrap_or(defaults.debounce.after),
                max: args
                    .debounce_max
                    .or(debounce.max)
                    .unwrap_or(defaults.debounce.max),
            },
            ingest: IngestConfig {
                queue_capacity: args
                    .ingest_queue_capacity
                    .or(ingest.queue_capacity)
                    .unwrap_or(defaults.ingest.queue_capacity),
                max_batch: ingest.max_batch.unwrap_or(defaults.ingest.max_batch),
                commit_timeout: args
                    .commit_timeout
                    .or(ingest.commit_timeout)
                    .unwrap_or(defaults.ingest.commit_timeout),
                rate_per_caller: ingest
                    .rate_per_caller
                    .unwrap_or(defaults.ingest.rate_per_caller),
                burst_per_caller: ingest
                    .burst_per_caller
                    .unwrap_or(defaults.ingest.burst_per_caller),
                queue_bytes: ingest.queue_bytes.unwrap_or(defaults.ingest.queue_bytes),
                max_applications_per_key: ingest
                    .max_applications_per_key
                    .unwrap_or(defaults.ingest.max_applications_per_key),
            },
            dds: DdsConfig {
                send_timeout: args
                    .dds_send_timeout
                    .or(dds.send_timeout)
                    .unwrap_or(defaults.dds.send_timeout),
                new_streams_per_second: args
                    .new_streams_per_second
                    .or(dds.new_streams_per_second)
                    .unwrap_or(defaults.dds.new_streams_per_second),
                new_streams_burst: args
                    .new_streams_burst
                    .or(dds.new_streams_burst)
                    .unwrap_or(defaults.dds.new_streams_burst),
                max_streams: dds.max_streams.unwrap_or(defaults.dds.max_streams),
            },
            grpc: GrpcConfig {
                keepalive_interval: grpc
                    .keepalive_interval
                    .unwrap_or(defaults.grpc.keepalive_interval),
                keepalive_timeout: grpc
                    .keepalive_timeout
                    .unwrap_or(defaults.grpc.keepalive_timeout),
                max_connection_age: args
                    .max_connection_age
                    .or(grpc.max_connection_age)
                    .unwrap_or(defaults.grpc.max_connection_age),
                max_connection_age_grace: grpc
                    .max_connection_age_grace
                    .unwrap_or(defaults.grpc.max_connection_age_grace),
                max_concurrent_streams: grpc
                    .max_concurrent_streams
                    .unwrap_or(defaults.grpc.max_concurrent_streams),
            },
            shutdown_grace: file.shutdown_grace.unwrap_or(defaults.shutdown_grace),
            insecure_allow_unauthenticated: args
                .insecure_allow_unauthenticated
                .or(file.insecure_allow_unauthenticated)
                .unwrap_or(defaults.insecure_allow_unauthenticated),
            mode: args.mode.or(file.mode).unwrap_or(defaults.mode),
            tls: TlsConfig {
                addr: args.tls_addr.or(tls.addr).unwrap_or(defaults.tls.addr),
                cert_file: args.tls_cert.clone().or(tls.cert_file),
                key_file: args.tls_key.clone().or(tls.key_file),
                client_ca_file: args.tls_client_ca.clone().or(tls.client_ca_file),
                trust_domain: tls.trust_domain.or(defaults.tls.trust_domain),
            },
            auth: AuthConfig {
                token_file: args.token_file.clone().or(auth.token_file),
                reload_interval: auth
                    .reload_interval
                    .unwrap_or(defaults.auth.reload_interval),
                admins: auth.admins.unwrap_or_default(),
                legacy_answers: args
                    .legacy_answers
                    .or(auth.legacy_answers)
                    .unwrap_or(defaults.auth.legacy_answers),
                token_review: auth.token_review,
                cache_ttl: auth.cache_ttl.unwrap_or(defaults.auth.cache_ttl),
                ..defaults.auth.clone()
            },
            kubernetes: KubernetesConfig {
                api_server: args.kube_api_server.clone().or(kubernetes.api_server),
                writer: crate::k8s::writer::WriterConfig {
                    qps: args
                        .kube_qps
                        .or(kubernetes.qps)
                        .unwrap_or(defaults.kubernetes.writer.qps),
                    burst: args
                        .kube_burst
                        .or(kubernetes.burst)
                        .unwrap_or(defaults.kubernetes.writer.burst),
                    max_parallel: kubernetes
                        .max_parallel_writes
                        .unwrap_or(defaults.kubernetes.writer.max_parallel),
                    parked_retry: kubernetes
                        .parked_retry_interval
                        .unwrap_or(defaults.kubernetes.writer.parked_retry),
                },
            },
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.ingest.queue_capacity == 0 {
            return Err(ConfigError::Invalid(
                "ingest.queueCapacity must be at least 1".into(),
            ));
        }
        if self.ingest.max_batch == 0 {
            return Err(ConfigError::Invalid(
                "ingest.maxBatch must be at least 1".into(),
            ));
        }
        if self.ingest.commit_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "ingest.commitTimeout must be above zero".into(),
            ));
        }
        Ok(())
    }

    /// The effective configuration in the file's format, for `serve --print-config`.
    pub fn to_file_config(&self) -> FileConfig {
        FileConfig {
            grpc_addr: Some(self.grpc_addr),
            admin_addr: Some(self.admin_addr),
            data_dir: Some(self.data_dir.clone()),
            log: Some(LogSection {
                format: Some(self.log_format),
            }),
            debounce: Some(DebounceSection {
                enable: Some(self.debounce.enable),
                after: Some(self.debounce.after),
                max: Some(self.debounce.max),
            }),
            ingest: Some(IngestSection {
                queue_capacity: Some(self.ingest.queue_capacity),
                max_batch: Some(self.ingest.max_batch),
                commit_timeout: Some(self.ingest.commit_timeout),
                rate_per_caller: Some(self.ingest.rate_per_caller),
                burst_per_caller: Some(self.ingest.burst_per_caller),
                queue_bytes: Some(self.ingest.queue_bytes),
                max_applications_per_key: Some(self.ingest.max_applications_per_key),
            }),
            dds: Some(DdsSection {
                send_timeout: Some(self.dds.send_timeout),
                new_streams_per_second: Some(self.dds.new_streams_per_second),
                new_streams_burst: Some(self.dds.new_streams_burst),
                max_streams: Some(self.dds.max_streams),
            }),
            grpc: Some(GrpcSection {
                keepalive_interval: Some(self.grpc.keepalive_interval),
                keepalive_timeout: Some(self.grpc.keepalive_timeout),
                max_connection_age: Some(self.grpc.max_connection_age),
                max_connection_age_grace: Some(self.grpc.max_connection_age_grace),
                max_concurrent_streams: Some(self.grpc.max_concurrent_streams),
            }),
            shutdown_grace: Some(self.shutdown_grace),
            insecure_allow_unauthenticated: Some(self.insecure_allow_unauthenticated),
            mode: Some(self.mode),
            tls: Some(TlsSection {
                addr: Some(self.tls.addr),
                cert_file: self.tls.cert_file.clone(),
                key_file: self.tls.key_file.clone(),
                client_ca_file: self.tls.client_ca_file.clone(),
                trust_domain: self.tls.trust_domain.clone(),
            }),
            auth: Some(AuthSection {
                token_file: self.auth.token_file.clone(),
                reload_interval: Some(self.auth.reload_interval),
                admins: Some(self.auth.admins.clone()),
                legacy_answers: Some(self.auth.legacy_answers),
                token_review: self.auth.token_review,
                cache_ttl: Some(self.auth.cache_ttl),
            }),
            kubernetes: Some(KubernetesSection {
                api_server: self.kubernetes.api_server.clone(),
                qps: Some(self.kubernetes.writer.qps),
                burst: Some(self.kubernetes.writer.burst),
                max_parallel_writes: Some(self.kubernetes.writer.max_parallel),
                parked_retry_interval: Some(self.kubernetes.writer.parked_retry),
            }),
        }
    }
}

impl FileConfig {
    pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        FileConfig::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn parse(text: &str) -> Result<FileConfig, serde_yaml::Error> {
        if text.trim().is_empty() {
            return Ok(FileConfig::default());
        }
        serde_yaml::from_str(text)
    }
}

/// `100ms`, `1m30s`, or a bare integer of nanoseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_nanos)
            .map_err(|err| format!("invalid duration {text:?}: {err}"));
    }
    humantime::parse_duration(text).map_err(|err| {
        format!("invalid duration {text:?}: {err} (use e.g. 100ms, 10s, or integer nanoseconds)")
    })
}

mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Nanos(u64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Duration>, D::Error> {
        match Option::<Raw>::deserialize(de)? {
            None => Ok(None),
            Some(Raw::Nanos(nanos)) => Ok(Some(Duration::from_nanos(nanos))),
            Some(Raw::Text(text)) => super::parse_duration(&text)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }

    pub fn serialize<S: Serializer>(value: &Option<Duration>, ser: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => ser.serialize_str(&humantime::format_duration(*duration).to_string()),
            None => ser.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(argv: &[&str]) -> ServeArgs {
        let argv = std::iter::once("dubbo-cp").chain(argv.iter().copied());
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli.serve,
            Err(err) => panic!("{err}"),
        }
    }

    fn file(yaml: &str) -> FileConfig {
        FileConfig::parse(yaml).unwrap_or_else(|err| panic!("{err}"))
    }

    fn resolve(args: &ServeArgs, file: FileConfig) -> Config {
        Config::resolve(args, file).unwrap_or_else(|err| panic!("{err}"))
    }

    #[test]
    fn durations_as_strings_or_nanoseconds() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("100000000"), Ok(Duration::from_millis(100)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-5s").is_err());

        let parsed = file("debounce:\n  after: 100000000\n  max: 10s\n  enable: false\n");
        let debounce = parsed.debounce.unwrap_or_default();
        assert_eq!(debounce.after, Some(Duration::from_millis(100)));
        assert_eq!(debounce.max, Some(Duration::from_secs(10)));
        assert_eq!(debounce.enable, Some(false));
    }

    #[test]
    fn defaults_match_the_reference() {
        let config = resolve(&ServeArgs::default(), FileConfig::default());
        assert_eq!(config.grpc_addr.to_string(), DEFAULT_GRPC_ADDR);
        assert_eq!(config.admin_addr.to_string(), DEFAULT_ADMIN_ADDR);
        assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(
            config.debounce,
            DebounceConfig {
                after: Duration::from_millis(100),
                max: Duration::from_secs(10),
                enable: true,
            }
        );
    }

    #[test]
    fn flags_beat_file_beats_defaults() {
        let from_file = file(
            "grpcAddr: 127.0.0.1:1000\nadminAddr: 127.0.0.1:2000\ndebounce:\n  after: 1s\n  max: 20s\n",
        );
        let config = resolve(
            &args(&["--grpc-addr", "127.0.0.1:3000", "--debounce-after", "5ms"]),
            from_file,
        );
        assert_eq!(config.grpc_addr.port(), 3000, "flag beats file");
        assert_eq!(config.admin_addr.port(), 2000, "file beats default");
        assert_eq!(
            config.debounce.after,
            Duration::from_millis(5),
            "flag beats file"
        );
        assert_eq!(
            config.debounce.max,
            Duration::from_secs(20),
            "file beats default"
        );
        assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }

    #[test]
    fn unknown_or_malformed_fields_are_errors() {
        assert!(FileConfig::parse("grpcAdr: 127.0.0.1:1\n").is_err());
        assert!(FileConfig::parse("debounce:\n  after: soon\n").is_err());
        assert!(FileConfig::parse("grpcAddr: not-an-address\n").is_err());
        assert!(FileConfig::parse("").is_ok());
        let zero = file("ingest:\n  queueCapacity: 0\n");
        assert!(Config::resolve(&ServeArgs::default(), zero).is_err());
    }

    #[test]
    fn effective_config_round_trips_through_yaml() {
        let config = resolve(
            &args(&["--debounce-max", "3s", "--log-format", "json"]),
            FileConfig::default(),
        );
        let yaml = serde_yaml::to_string(&config.to_file_config()).unwrap_or_default();
        assert!(yaml.contains("max: 3s"), "{yaml}");
        let again = resolve(&ServeArgs::default(), file(&yaml));
        assert_eq!(again, config);
    }
}

#[cfg(test)]
mod example_file_tests {
    use super::*;

    #[test]
    fn the_example_in_deploy_parses_to_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dubbo-cp.yaml");
        let file = FileConfig::read(&path).unwrap_or_else(|err| panic!("{err}"));
        let config =
            Config::resolve(&ServeArgs::default(), file).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(config, Config::default());
    }
}
