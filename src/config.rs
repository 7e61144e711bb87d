//! Configuration, declared once: every setting is one field of a section struct. Each component
//! crate declares its own section (`dubbo_cp_dds::DdsConfig`, `dubbo_cp_ca::CaConfig`, ...) and
//! takes only that; [`Config`] composes them with the binary's own (`grpc`, `tls`, `log`,
//! `rules`).
//!
//! - The YAML file is deserialised straight into [`Config`]; a missing key takes the section's
//!   `Default`, an unknown key is an error.
//! - Every field is also a clap argument whose `id` is its YAML key (`debounce.after`), with a
//!   flag and a `DUBBO_CP_*` variable. [`Config::load`] lays what clap matched (flags, then
//!   variables; clap keeps that order) over the file: flags > environment > file > defaults.
//!   No default value is given to clap, so an absent flag leaves the file's value alone.
//! - The field's doc comment is its `--help` and its row in docs/configuration.md's settings table; a test
//!   keeps that table equal to what it generates from these declarations.
//!
//! A new setting is one field with its doc comment, its default (`#[default(...)]`, smart-default;
//! none for the type's own default), and
//! `#[arg(id = "<section>.<key>", long = "<section>-<key>", env = "DUBBO_CP_<SECTION>_<KEY>")]`
//! (durations add `value_parser = DurationArg` and `#[serde(with = "duration")]`). A field
//! without `#[arg]` would be a positional argument: the tests refuse that, and a settings table
//! that does not list the new key.
//! Durations carry their unit (`100ms`, `10s`) everywhere; a YAML integer is nanoseconds, the way
//! the reference control plane writes them (`dubbo_cp_kit::duration`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dubbo_cp_kit::duration;
use dubbo_cp_kit::duration::DurationArg;
pub use dubbo_cp_kit::duration::parse_duration;

use clap::{ArgAction, FromArgMatches};
use serde::{Deserialize, Serialize};

use crate::telemetry::LogFormat;
pub use dubbo_cp_auth::AuthConfig;
pub use dubbo_cp_ca::CaConfig;
pub use dubbo_cp_canary::CanaryConfig;
pub use dubbo_cp_dds::DdsConfig;
pub use dubbo_cp_debounce::DebounceConfig;
pub use dubbo_cp_ingest::IngestConfig;
pub use dubbo_cp_k8s::{KubernetesConfig, MappingConfig, WriterConfig};
pub use dubbo_cp_webhook::WebhookConfig;
pub use dubbo_cp_xds::XdsConfig;
pub use dubbo_cp_zookeeper::ZooKeeperConfig;
use smart_default::SmartDefault;

pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:30060";
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:30070";
pub const DEFAULT_DATA_DIR: &str = "./data";

/// The effective configuration of `serve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// Address of the plain gRPC port.
    #[arg(id = "grpcAddr", long = "grpc-addr", env = "DUBBO_CP_GRPC_ADDR")]
    #[default(SocketAddr::from(([127, 0, 0, 1], 30060)))]
    pub grpc_addr: SocketAddr,
    /// Address of the HTTP admin port (`/healthz`, `/readyz`, `/metrics`, `/debug/...`).
    #[arg(id = "adminAddr", long = "admin-addr", env = "DUBBO_CP_ADMIN_ADDR")]
    #[default(SocketAddr::from(([127, 0, 0, 1], 30070)))]
    pub admin_addr: SocketAddr,
    /// Directory of the embedded database (`dubbo-cp.db`: the store, or the Kubernetes outbox);
    /// one process at a time.
    #[arg(id = "dataDir", long = "data-dir", env = "DUBBO_CP_DATA_DIR")]
    #[default(PathBuf::from(DEFAULT_DATA_DIR))]
    pub data_dir: PathBuf,
    /// `standalone` (the embedded store is the truth), `kubernetes` (ServiceNameMapping
    /// objects, the store is an outbox of pending writes) or `zookeeper` (Dubbo's ZooKeeper
    /// layout, the store is an outbox; `zookeeper.address` alone selects it).
    #[arg(id = "mode", long = "mode", env = "DUBBO_CP_MODE", value_enum)]
    #[default(Mode::Standalone)]
    pub mode: Mode,
    /// How long shutdown waits for in-flight work before it gives up on it.
    #[arg(id = "shutdownGrace", long = "shutdown-grace", env = "DUBBO_CP_SHUTDOWN_GRACE",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(15))]
    pub shutdown_grace: Duration,
    /// Serve on a non-loopback address without authentication (logged loudly).
    #[arg(id = "insecureAllowUnauthenticated", long = "insecure-allow-unauthenticated",
          env = "DUBBO_CP_INSECURE_ALLOW_UNAUTHENTICATED", action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub insecure_allow_unauthenticated: bool,
    #[command(flatten)]
    pub log: LogConfig,
    #[command(flatten)]
    pub debounce: DebounceConfig,
    #[command(flatten)]
    pub ingest: IngestConfig,
    #[command(flatten)]
    pub dds: DdsConfig,
    #[command(flatten)]
    pub xds: XdsConfig,
    #[command(flatten)]
    pub grpc: GrpcConfig,
    #[command(flatten)]
    pub tls: TlsConfig,
    #[command(flatten)]
    pub auth: AuthConfig,
    #[command(flatten)]
    pub kubernetes: KubernetesConfig,
    #[command(flatten)]
    pub zookeeper: ZooKeeperConfig,
    #[command(flatten)]
    pub rules: RulesConfig,
    #[command(flatten)]
    pub ca: CaConfig,
    #[command(flatten)]
    pub webhook: WebhookConfig,
    #[command(flatten)]
    pub mapping: MappingConfig,
    #[command(flatten)]
    pub canary: CanaryConfig,
}

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

impl Config {
    /// The mode that runs: `zookeeper.address` alone selects ZooKeeper mode.
    pub fn effective_mode(&self) -> Mode {
        match (self.mode, &self.zookeeper.address) {
            (Mode::Standalone, Some(_)) => Mode::Zookeeper,
            (mode, _) => mode,
        }
    }

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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("invalid flag or environment variable")]
    Args(#[source] clap::Error),
    /// Settings that parse but make no sense, each naming its key and value.
    #[error("invalid configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// `serve`'s command line: `--config` and the flag (with its `DUBBO_CP_*` variable) of every
/// setting, kept as clap matched them so [`Config::load`] can lay them over the file.
#[derive(Debug, Clone, Default)]
pub struct ServeArgs {
    /// The YAML file named by `--config` or `DUBBO_CP_CONFIG`.
    pub config_file: Option<PathBuf>,
    matches: Option<clap::ArgMatches>,
}

const CONFIG_FILE_ARG: &str = "config";

impl clap::FromArgMatches for ServeArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self {
            config_file: matches.get_one::<PathBuf>(CONFIG_FILE_ARG).cloned(),
            matches: Some(matches.clone()),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for ServeArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let cmd = cmd.arg(
            clap::Arg::new(CONFIG_FILE_ARG)
                .long("config")
                .env("DUBBO_CP_CONFIG")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("YAML config file (keys as printed by --print-config)"),
        );
        let defaults = flatten_keys(&Config::default());
        <Config as clap::Args>::augment_args(cmd).mut_args(|arg| {
            let Some(default) = defaults.get(arg.get_id().as_str()) else {
                return arg;
            };
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            // Optional whatever the field's type: an absent flag keeps the file's value.
            arg.required(false)
                .help(format!("{help} [default: {default}]"))
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl Config {
    /// Reads the file named by the arguments (if any) and lays flags and environment over it.
    pub fn load(args: &ServeArgs) -> Result<Config, ConfigError> {
        let mut config = match &args.config_file {
            Some(path) => Config::read(path)?,
            None => Config::default(),
        };
        if let Some(matches) = &args.matches {
            config
                .update_from_arg_matches(matches)
                .map_err(ConfigError::Args)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// The YAML file; what it leaves out keeps its default.
    pub fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn parse(text: &str) -> Result<Config, serde_yaml::Error> {
        // A file of comments only is an empty document, which serde_yaml refuses as a struct.
        if serde_yaml::from_str::<serde_yaml::Value>(text)?.is_null() {
            return Ok(Config::default());
        }
        serde_yaml::from_str(text)
    }

    /// The configuration in the file's format, every key included (`serve --print-config`).
    pub fn to_yaml(&self) -> Result<String, serde_yaml::Error> {
        serde_yaml::to_string(self)
    }

    /// Refuses settings that parse but make no sense; every problem names its key and value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut at_least_one = |key: &str, value: u64| {
            if value < 1 {
                problems.push(format!("{key} must be at least 1, not {value}"));
            }
        };
        at_least_one("ingest.queueCapacity", self.ingest.queue_capacity as u64);
        at_least_one("ingest.maxBatch", self.ingest.max_batch as u64);
        at_least_one(
            "ingest.burstPerCaller",
            u64::from(self.ingest.burst_per_caller),
        );
        at_least_one(
            "ingest.maxApplicationsPerKey",
            self.ingest.max_applications_per_key as u64,
        );
        at_least_one("dds.newStreamsBurst", u64::from(self.dds.new_streams_burst));
        at_least_one("dds.maxStreams", self.dds.max_streams as u64);
        at_least_one("xds.maxStreams", self.xds.max_streams as u64);
        at_least_one(
            "grpc.maxConcurrentStreams",
            u64::from(self.grpc.max_concurrent_streams),
        );
        at_least_one("kubernetes.burst", u64::from(self.kubernetes.writer.burst));
        at_least_one(
            "auth.tokenReviewsBurst",
            u64::from(self.auth.token_reviews_burst),
        );
        at_least_one("auth.cacheBytes", self.auth.cache_bytes);
        at_least_one("ca.issueBurst", u64::from(self.ca.issue_burst));
        at_least_one(
            "kubernetes.maxParallelWrites",
            self.kubernetes.writer.max_parallel as u64,
        );
        at_least_one(
            "zookeeper.maxParallelWrites",
            self.zookeeper.max_parallel_writes as u64,
        );
        match (self.mode, &self.zookeeper.address) {
            (Mode::Zookeeper, None) => problems
                .push("mode zookeeper needs zookeeper.address (--zookeeper HOST:PORT)".to_owned()),
            (Mode::Kubernetes, Some(address)) => problems.push(format!(
                "zookeeper.address {address:?} selects ZooKeeper mode, but mode is kubernetes: \
                 use one source of truth"
            )),
            _ => {}
        }
        for (key, rate) in [
            ("ingest.ratePerCaller", self.ingest.rate_per_caller),
            ("dds.newStreamsPerSecond", self.dds.new_streams_per_second),
            ("kubernetes.qps", self.kubernetes.writer.qps),
            (
                "auth.tokenReviewsPerSecond",
                self.auth.token_reviews_per_second,
            ),
            ("ca.issuesPerSecond", self.ca.issues_per_second),
        ] {
            if !(rate.is_finite() && rate > 0.0) {
                problems.push(format!("{key} must be a finite number above 0, not {rate}"));
            }
        }
        // Zero would fire at once, forever (a busy loop, or `interval` panicking) or time
        // everything out; settings where zero means "do not wait" are not listed.
        for (key, value) in [
            ("ingest.commitTimeout", self.ingest.commit_timeout),
            ("dds.sendTimeout", self.dds.send_timeout),
            ("grpc.keepaliveInterval", self.grpc.keepalive_interval),
            ("grpc.keepaliveTimeout", self.grpc.keepalive_timeout),
            ("grpc.maxConnectionAge", self.grpc.max_connection_age),
            ("auth.reloadInterval", self.auth.reload_interval),
            ("auth.keysRefreshInterval", self.auth.keys_refresh_interval),
            ("webhook.timeout", self.webhook.timeout),
            ("canary.queryTimeout", self.canary.query_timeout),
            ("canary.leaseDuration", self.canary.lease_duration),
            (
                "kubernetes.parkedRetryInterval",
                self.kubernetes.writer.parked_retry,
            ),
            ("zookeeper.sessionTimeout", self.zookeeper.session_timeout),
            ("zookeeper.parkedRetryInterval", self.zookeeper.parked_retry),
        ] {
            if value.is_zero() {
                problems.push(format!("{key} must be above zero, not {value:?}"));
            }
        }
        if self.ca.cert_validity < Duration::from_secs(1) {
            problems.push(format!(
                "ca.certValidity must be at least 1s, not {:?}",
                self.ca.cert_validity
            ));
        }
        if let Some(url) = &self.webhook.url
            && (!url.starts_with("https://") || url.contains(['?', '#']))
        {
            problems.push(format!(
                "webhook.url must be an https:// URL without query or fragment (the API server calls only HTTPS), not {url:?}"
            ));
        }
        if let Some(url) = &self.canary.prometheus
            && !url.starts_with("http://")
        {
            problems.push(format!(
                "canary.prometheus must be an http:// URL (https is not supported yet), not {url:?}"
            ));
        }
        if self.webhook.timeout > Duration::from_secs(9) {
            problems.push(format!(
                "webhook.timeout must stay below the API server's 10 s, not {:?}",
                self.webhook.timeout
            ));
        }
        const CENTURY: Duration = Duration::from_secs(100 * 31_557_600);
        for (key, value) in [
            ("ca.rootValidity", self.ca.root_validity),
            ("ca.certValidity", self.ca.cert_validity),
        ] {
            if value > CENTURY {
                problems.push(format!("{key} must be at most 100 years, not {value:?}"));
            }
        }
        if self.ca.root_validity <= self.ca.cert_validity.saturating_mul(3) {
            problems.push(format!(
                "ca.rootValidity ({:?}) must be more than three times ca.certValidity ({:?}): certificates must fit in a root's life with room to rotate",
                self.ca.root_validity, self.ca.cert_validity
            ));
        }
        if self.ca.cert_file.is_some() != self.ca.key_file.is_some() {
            problems
                .push("ca.certFile and ca.keyFile go together: give both or neither".to_owned());
        }
        if self.debounce.after > self.debounce.max {
            problems.push(format!(
                "debounce.after ({:?}) must not exceed debounce.max ({:?})",
                self.debounce.after, self.debounce.max
            ));
        }
        // Below the largest request the server accepts, such requests could never be queued.
        let largest = dubbo_cp_kit::MAX_DECODING_MESSAGE_BYTES;
        if self.ingest.queue_bytes < largest {
            problems.push(format!(
                "ingest.queueBytes must be at least {largest} (the largest request), not {}",
                self.ingest.queue_bytes
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

/// Every key of `config` with its value as YAML prints it: `debounce.after` -> `100ms`.
fn flatten_keys(config: &Config) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(value) = serde_yaml::to_value(config) {
        walk_keys("", &value, &mut out);
    }
    out
}

fn walk_keys(prefix: &str, value: &serde_yaml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        serde_yaml::Value::Mapping(map) => {
            for (key, value) in map {
                let key = key.as_str().unwrap_or_default();
                let path = if prefix.is_empty() {
                    key.to_owned()
                } else {
                    format!("{prefix}.{key}")
                };
                walk_keys(&path, value, out);
            }
        }
        serde_yaml::Value::Null => {
            out.insert(prefix.to_owned(), "unset".to_owned());
        }
        other => {
            let text = serde_yaml::to_string(other).unwrap_or_default();
            out.insert(prefix.to_owned(), text.trim().to_owned());
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
        Cli::try_parse_from(argv).unwrap().serve
    }

    /// The configuration from a file's text and flags, validated.
    fn load(yaml: &str, argv: &[&str]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dubbo-cp.yaml");
        std::fs::write(&path, yaml).unwrap();
        let mut args = args(argv);
        args.config_file = Some(path);
        Config::load(&args)
    }

    fn refusal(yaml: &str) -> String {
        match load(yaml, &[]) {
            Err(ConfigError::Invalid(problems)) => problems.join("; "),
            other => panic!("expected a refusal of {yaml:?}, got {other:?}"),
        }
    }

    /// docs/configuration.md's settings table, generated from the declarations above: key, flag, environment
    /// variable, default and meaning (the field's doc comment) of every setting.
    fn settings_table() -> String {
        let defaults = flatten_keys(&Config::default());
        let cmd = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
        let mut table = String::from(
            "| key | flag | environment | default | meaning |\n|---|---|---|---|---|\n",
        );
        for arg in cmd.get_arguments() {
            let key = arg.get_id().as_str();
            let Some(default) = defaults.get(key) else {
                continue;
            };
            let code = |text: &str| format!("`{text}`");
            let flag = arg.get_long().map(|l| code(&format!("--{l}")));
            let env = arg.get_env().map(|e| code(&e.to_string_lossy()));
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            // The help carries the default for --help; the table has a column for it.
            let meaning = help
                .strip_suffix(&format!(" [default: {default}]"))
                .unwrap_or(&help);
            table.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                code(key),
                flag.unwrap_or_default(),
                env.unwrap_or_default(),
                code(default),
                meaning
            ));
        }
        table
    }

    #[test]
    fn durations_carry_units_and_a_yaml_integer_is_nanoseconds() {
        // The reference's files write integer nanoseconds (wire.md §4).
        let parsed =
            Config::parse("debounce:\n  after: 100000000\n  max: 10s\n  enable: false\n").unwrap();
        assert_eq!(parsed.debounce.after, Duration::from_millis(100));
        assert_eq!(parsed.debounce.max, Duration::from_secs(10));
        assert!(!parsed.debounce.enable);
        // Also inside the flattened writer settings.
        let parsed = Config::parse("kubernetes:\n  parkedRetryInterval: 2000000000\n").unwrap();
        assert_eq!(
            parsed.kubernetes.writer.parked_retry,
            Duration::from_secs(2)
        );
        // A string without a unit is refused, naming the form.
        let refused = Config::parse("debounce:\n  after: \"10\"\n")
            .unwrap_err()
            .to_string();
        assert!(refused.contains("\"10\" has no unit"), "{refused}");
        // Flags take units; a bare number is refused with the flag named.
        let flagged = load("", &["--debounce-after", "5ms", "--debounce-max", "1m"]).unwrap();
        assert_eq!(flagged.debounce.after, Duration::from_millis(5));
        assert_eq!(flagged.debounce.max, Duration::from_secs(60));
        let refused = Cli::try_parse_from(["dubbo-cp", "--debounce-after", "10"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            refused
                .contains("--debounce-after: \"10\" has no unit; write a duration with its unit"),
            "{refused}"
        );
        let zero = load("", &["--mapping-expire-after", "0"]).unwrap();
        assert_eq!(zero.mapping.expire_after, Duration::ZERO);
    }

    #[test]
    fn defaults_match_the_reference() {
        let config = load("", &[]).unwrap();
        assert_eq!(config, Config::default());
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
        // A file of comments only is no file at all.
        assert_eq!(Config::parse("# nothing\n").unwrap(), Config::default());
    }

    #[test]
    fn flags_beat_file_beats_defaults() {
        let config = load(
            "grpcAddr: 127.0.0.1:1000\nadminAddr: 127.0.0.1:2000\ndebounce:\n  after: 1s\n  max: 20s\n\
             kubernetes:\n  qps: 7\n  burst: 9\n",
            &["--grpc-addr", "127.0.0.1:3000", "--debounce-after", "5ms", "--kube-qps", "3.5"],
        )
        .unwrap();
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
        assert_eq!(config.kubernetes.writer.qps, 3.5, "flag beats file");
        assert_eq!(config.kubernetes.writer.burst, 9, "file beats default");
        assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        // Boolean flags given bare mean true; optional settings can be set by a flag.
        let config = load(
            "auth:\n  legacyAnswers: false\n",
            &[
                "--legacy-answers",
                "--auth-token-review",
                "false",
                "--auth-admins",
                "a/b,c/d",
            ],
        )
        .unwrap();
        assert!(config.auth.legacy_answers);
        assert_eq!(config.auth.token_review, Some(false));
        assert_eq!(config.auth.admins, ["a/b", "c/d"]);
    }

    #[test]
    fn unknown_or_malformed_fields_are_errors() {
        let error = |yaml: &str| Config::parse(yaml).expect_err("accepted").to_string();
        assert!(error("grpcAdr: 127.0.0.1:1\n").contains("grpcAdr"));
        assert!(error("debounce:\n  aftr: 1s\n").contains("aftr"));
        // The writer's keys are flattened into the section: unknown keys there are still caught.
        assert!(error("kubernetes:\n  qpss: 1\n").contains("qpss"));
        assert!(error("debounce:\n  after: soon\n").contains("soon"));
        assert!(error("debounce:\n  after: -5\n").contains("negative"));
        assert!(error("grpcAddr: not-an-address\n").contains("grpcAddr"));
        assert!(error("ingest:\n  queueCapacity: many\n").contains("queueCapacity"));
        assert!(Config::parse("").is_ok());
    }

    #[test]
    fn bad_flags_are_errors() {
        let argv = ["dubbo-cp", "--debounce-max", "soon"];
        let err = Cli::try_parse_from(argv).err().unwrap().to_string();
        assert!(
            err.contains("--debounce-max") && err.contains("soon"),
            "{err}"
        );
    }

    #[test]
    fn debounce_after_must_not_exceed_max() {
        let message = refusal("debounce:\n  after: 20s\n  max: 10s\n");
        assert_eq!(
            message,
            "debounce.after (20s) must not exceed debounce.max (10s)"
        );
        assert!(load("debounce:\n  after: 10s\n  max: 10s\n", &[]).is_ok());
        // Relations hold across sources: a flag against the file.
        assert!(matches!(
            load("debounce:\n  max: 1s\n", &["--debounce-after", "2s"]),
            Err(ConfigError::Invalid(_))
        ));
    }

    #[test]
    fn rates_must_be_finite_and_above_zero() {
        for (yaml, key) in [
            ("ingest:\n  ratePerCaller: 0\n", "ingest.ratePerCaller"),
            ("ingest:\n  ratePerCaller: -1\n", "ingest.ratePerCaller"),
            (
                "dds:\n  newStreamsPerSecond: .nan\n",
                "dds.newStreamsPerSecond",
            ),
            ("kubernetes:\n  qps: .inf\n", "kubernetes.qps"),
        ] {
            let message = refusal(yaml);
            assert!(
                message.starts_with(&format!("{key} must be a finite number above 0, not ")),
                "{message}"
            );
        }
        assert_eq!(
            refusal("ingest:\n  ratePerCaller: 0\n"),
            "ingest.ratePerCaller must be a finite number above 0, not 0"
        );
        assert!(load("ingest:\n  ratePerCaller: 0.001\n", &[]).is_ok());
    }

    #[test]
    fn bursts_and_capacities_must_be_at_least_one() {
        for (yaml, key) in [
            ("ingest:\n  queueCapacity: 0\n", "ingest.queueCapacity"),
            ("ingest:\n  maxBatch: 0\n", "ingest.maxBatch"),
            ("ingest:\n  burstPerCaller: 0\n", "ingest.burstPerCaller"),
            (
                "ingest:\n  maxApplicationsPerKey: 0\n",
                "ingest.maxApplicationsPerKey",
            ),
            ("dds:\n  newStreamsBurst: 0\n", "dds.newStreamsBurst"),
            ("dds:\n  maxStreams: 0\n", "dds.maxStreams"),
            (
                "grpc:\n  maxConcurrentStreams: 0\n",
                "grpc.maxConcurrentStreams",
            ),
            ("kubernetes:\n  burst: 0\n", "kubernetes.burst"),
            (
                "kubernetes:\n  maxParallelWrites: 0\n",
                "kubernetes.maxParallelWrites",
            ),
        ] {
            assert_eq!(refusal(yaml), format!("{key} must be at least 1, not 0"));
        }
        assert_eq!(
            refusal("ingest:\n  queueBytes: 1000\n"),
            "ingest.queueBytes must be at least 1048576 (the largest request), not 1000"
        );
    }

    #[test]
    fn timeouts_and_intervals_must_be_above_zero() {
        for (yaml, key) in [
            ("ingest:\n  commitTimeout: 0\n", "ingest.commitTimeout"),
            ("dds:\n  sendTimeout: 0s\n", "dds.sendTimeout"),
            ("grpc:\n  keepaliveInterval: 0\n", "grpc.keepaliveInterval"),
            ("grpc:\n  keepaliveTimeout: 0\n", "grpc.keepaliveTimeout"),
            ("grpc:\n  maxConnectionAge: 0\n", "grpc.maxConnectionAge"),
            ("auth:\n  reloadInterval: 0\n", "auth.reloadInterval"),
            (
                "kubernetes:\n  parkedRetryInterval: 0\n",
                "kubernetes.parkedRetryInterval",
            ),
        ] {
            assert_eq!(refusal(yaml), format!("{key} must be above zero, not 0ns"));
        }
        // Zero is a meaningful "do not wait" here.
        assert!(load("shutdownGrace: 0\ngrpc:\n  maxConnectionAgeGrace: 0\n", &[]).is_ok());
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let message = refusal("ingest:\n  maxBatch: 0\ndds:\n  maxStreams: 0\n");
        assert_eq!(
            message,
            "ingest.maxBatch must be at least 1, not 0; dds.maxStreams must be at least 1, not 0"
        );
    }

    #[test]
    fn printed_config_read_back_is_the_same_config() {
        let config = load(
            "tls:\n  certFile: /c.pem\n  trustDomain: cluster.local\nauth:\n  admins: [ops/admin]\n",
            &[
                "--debounce-max", "3s", "--log-format", "json", "--mode", "kubernetes",
                "--kube-qps", "0.25", "--auth-token-review", "false",
                "--grpc-max-connection-age-grace", "1500ms", "--commit-timeout", "1ns",
            ],
        )
        .unwrap();
        let yaml = config.to_yaml().unwrap();
        assert!(yaml.contains("max: 3s"), "{yaml}");
        let again = load(&yaml, &[]).unwrap();
        assert_eq!(again, config);
        // And the defaults, every key printed.
        let defaults = Config::default().to_yaml().unwrap();
        assert_eq!(Config::parse(&defaults).unwrap(), Config::default());
        assert!(defaults.contains("tokenFile: null"), "{defaults}");
    }

    #[test]
    fn every_setting_is_a_flag_and_a_variable() {
        let keys: Vec<String> = flatten_keys(&Config::default()).into_keys().collect();
        let cmd = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
        let mut ids: Vec<String> = cmd
            .get_arguments()
            .map(|arg| arg.get_id().to_string())
            .filter(|id| id != CONFIG_FILE_ARG)
            .collect();
        ids.sort();
        assert_eq!(ids, keys, "every key is an argument whose id is the key");
        for arg in cmd.get_arguments() {
            assert!(arg.get_long().is_some(), "{} has no flag", arg.get_id());
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert!(
                env.is_some_and(|e| e.starts_with("DUBBO_CP_")),
                "{} has no DUBBO_CP_ variable",
                arg.get_id()
            );
            assert!(!arg.is_required_set(), "{} is required", arg.get_id());
        }
    }

    #[test]
    fn the_documented_table_is_the_generated_one() {
        let readme = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
        )
        .unwrap();
        let table = settings_table();
        assert!(
            readme.contains(&table),
            "docs/configuration.md's settings table is out of date; replace it with:\n\n{table}"
        );
        for key in flatten_keys(&Config::default()).keys() {
            assert!(table.contains(&format!("| `{key}` |")), "{key} missing");
        }
    }

    #[test]
    fn the_example_in_deploy_holds_every_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dubbo-cp.yaml");
        assert_eq!(Config::read(&path).unwrap(), Config::default());
        // Every key is spelled out (empty where the default is unset).
        let text = std::fs::read_to_string(&path).unwrap();
        let value: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let mut in_file = BTreeMap::new();
        walk_keys("", &value, &mut in_file);
        let in_file: Vec<&String> = in_file.keys().collect();
        let keys = flatten_keys(&Config::default());
        assert_eq!(in_file, keys.keys().collect::<Vec<_>>());
    }

    /// Every duration setting goes through the one parser: a bare number is refused with the
    /// flag named, whichever setting it is.
    #[test]
    fn every_duration_flag_needs_a_unit() {
        use clap::Args;
        let command = ServeArgs::augment_args(clap::Command::new("dubbo-cp"));
        // The duration settings: those a value with a unit parses into a Duration for.
        let durations: Vec<(String, String)> = command
            .get_arguments()
            .filter_map(|arg| Some((arg.get_id().to_string(), arg.get_long()?.to_owned())))
            .filter(|(id, long)| {
                command
                    .clone()
                    .try_get_matches_from(["dubbo-cp", &format!("--{long}"), "1500ms"])
                    .is_ok_and(|matches| {
                        matches.try_get_one::<Duration>(id).ok().flatten()
                            == Some(&Duration::from_millis(1500))
                    })
            })
            .collect();
        assert!(durations.len() >= 20, "{durations:?}");
        for (_, long) in durations {
            let flag = format!("--{long}");
            let refused = command
                .clone()
                .try_get_matches_from(["dubbo-cp", &flag, "10"])
                .unwrap_err()
                .to_string();
            assert!(
                refused.contains(&format!("{flag}: \"10\" has no unit; write a duration")),
                "{refused}"
            );
        }
    }
}
