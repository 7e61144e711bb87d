//! The `auth` section of the configuration.

use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;
use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// Who is calling and what they may do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthConfig {
    /// Static token file: authenticates callers (standalone) and allows non-loopback addresses.
    #[arg(
        id = "auth.tokenFile",
        long = "token-file",
        env = "DUBBO_CP_TOKEN_FILE"
    )]
    pub token_file: Option<PathBuf>,
    /// How often the token file is checked for changes.
    #[arg(id = "auth.reloadInterval", long = "auth-reload-interval",
          env = "DUBBO_CP_AUTH_RELOAD_INTERVAL", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(2))]
    pub reload_interval: Duration,
    /// Identities that may register in any namespace (comma-separated in the variable).
    #[arg(
        id = "auth.admins",
        long = "auth-admins",
        env = "DUBBO_CP_AUTH_ADMINS",
        value_delimiter = ','
    )]
    pub admins: Vec<String>,
    /// Answer refusals with gRPC OK and `success: false`, for SDKs that only read `success`.
    #[arg(id = "auth.legacyAnswers", long = "legacy-answers", env = "DUBBO_CP_LEGACY_ANSWERS",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub legacy_answers: bool,
    /// Kubernetes mode: check bearer tokens with TokenReview (unset: on in Kubernetes mode).
    #[arg(id = "auth.tokenReview", long = "auth-token-review", env = "DUBBO_CP_AUTH_TOKEN_REVIEW",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub token_review: Option<bool>,
    /// How long a positive answer on a token is reused (never past the token's `exp`).
    #[arg(id = "auth.cacheTtl", long = "auth-cache-ttl", env = "DUBBO_CP_AUTH_CACHE_TTL",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(30))]
    pub cache_ttl: Duration,
    /// How long a negative answer on a token is reused.
    #[arg(id = "auth.negativeCacheTtl", long = "auth-negative-cache-ttl",
          env = "DUBBO_CP_AUTH_NEGATIVE_CACHE_TTL", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(10))]
    pub negative_cache_ttl: Duration,
    /// Bytes of tokens the authentication cache may hold (32 MiB by default).
    #[arg(
        id = "auth.cacheBytes",
        long = "auth-cache-bytes",
        env = "DUBBO_CP_AUTH_CACHE_BYTES"
    )]
    #[default(32 * 1024 * 1024)]
    pub cache_bytes: u64,
    /// TokenReviews (and pod GETs) per second, for tokens that cannot be verified locally.
    #[arg(
        id = "auth.tokenReviewsPerSecond",
        long = "auth-token-reviews-per-second",
        env = "DUBBO_CP_AUTH_TOKEN_REVIEWS_PER_SECOND"
    )]
    #[default(20.0)]
    pub token_reviews_per_second: f64,
    /// TokenReviews at once after a quiet period.
    #[arg(
        id = "auth.tokenReviewsBurst",
        long = "auth-token-reviews-burst",
        env = "DUBBO_CP_AUTH_TOKEN_REVIEWS_BURST"
    )]
    #[default(40)]
    pub token_reviews_burst: u32,
    /// How often the cluster's service-account signing keys are fetched again.
    #[arg(id = "auth.keysRefreshInterval", long = "auth-keys-refresh-interval",
          env = "DUBBO_CP_AUTH_KEYS_REFRESH_INTERVAL", value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(300))]
    pub keys_refresh_interval: Duration,
    /// Audiences of the API server, besides its issuer, that `kubernetes` tokens verified
    /// locally may carry (tokens for others go to a TokenReview; comma-separated).
    #[arg(
        id = "auth.apiAudiences",
        long = "auth-api-audiences",
        env = "DUBBO_CP_AUTH_API_AUDIENCES",
        value_delimiter = ','
    )]
    pub api_audiences: Vec<String>,
}
