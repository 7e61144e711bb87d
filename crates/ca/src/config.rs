//! The `ca` section of the configuration.

use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;
use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The certificate authority (workload identity, the TLS port's own certificate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct CaConfig {
    /// Run the CA: issue certificates, serve the TLS port with a CA certificate when no
    /// `tls.certFile` is given, accept `dubbo-jwt` tokens.
    #[arg(id = "ca.enabled", long = "ca-enabled", env = "DUBBO_CP_CA_ENABLED",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    #[default(true)]
    pub enabled: bool,
    /// Validity of a generated root (rotated at two thirds of it when `ca.autoRotate`).
    #[arg(id = "ca.rootValidity", long = "ca-root-validity", env = "DUBBO_CP_CA_ROOT_VALIDITY",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    // A year as humantime counts it (365.25 days), so it prints as `1year`.
    #[default(Duration::from_secs(31_557_600))]
    pub root_validity: Duration,
    /// Validity of issued certificates (SDKs renew at half of it).
    #[arg(id = "ca.certValidity", long = "ca-cert-validity", env = "DUBBO_CP_CA_CERT_VALIDITY",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(3600))]
    pub cert_validity: Duration,
    /// Replace a generated root at two thirds of its life (old and new trusted side by side).
    #[arg(id = "ca.autoRotate", long = "ca-auto-rotate", env = "DUBBO_CP_CA_AUTO_ROTATE",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    #[default(true)]
    pub auto_rotate: bool,
    /// An operator's root certificate (PEM, ECDSA P-256), used as is with `ca.keyFile`.
    #[arg(id = "ca.certFile", long = "ca-cert", env = "DUBBO_CP_CA_CERT")]
    pub cert_file: Option<PathBuf>,
    /// The operator root's private key (PEM: PKCS#8 or EC PRIVATE KEY).
    #[arg(id = "ca.keyFile", long = "ca-key", env = "DUBBO_CP_CA_KEY")]
    pub key_file: Option<PathBuf>,
    /// The control plane's namespace: where Secret `dubbo-ca-secret` lives, and part of the
    /// TLS port's names.
    #[arg(id = "ca.namespace", long = "ca-namespace", env = "DUBBO_CP_NAMESPACE")]
    #[default("dubbo-system".to_owned())]
    pub namespace: String,
    /// The control plane's Service, named in the TLS port's certificate
    /// (`<service>.<namespace>.svc`).
    #[arg(
        id = "ca.serviceName",
        long = "ca-service-name",
        env = "DUBBO_CP_SERVICE_NAME"
    )]
    #[default("dubbo-cp".to_owned())]
    pub service_name: String,
    /// Certificates per second one caller (pod, else service account) may ask for.
    #[arg(
        id = "ca.issuesPerSecond",
        long = "ca-issues-per-second",
        env = "DUBBO_CP_CA_ISSUES_PER_SECOND"
    )]
    #[default(1.0)]
    pub issues_per_second: f64,
    /// Certificates one caller may ask for at once after a quiet period.
    #[arg(
        id = "ca.issueBurst",
        long = "ca-issue-burst",
        env = "DUBBO_CP_CA_ISSUE_BURST"
    )]
    #[default(5)]
    pub issue_burst: u32,
}
