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

mod sections;
pub use sections::{GrpcConfig, LogConfig, Mode, RulesConfig, TlsConfig};

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
mod tests;
