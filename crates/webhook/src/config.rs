//! The `webhook` section of the configuration.

use std::net::SocketAddr;
use std::time::Duration;

use clap::ArgAction;
use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};

/// The pod admission webhook (Kubernetes mode, with the CA).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookConfig {
    /// Serve the webhook and keep `MutatingWebhookConfiguration dubbo-cp` (Kubernetes mode
    /// with `ca.enabled`; ignored otherwise).
    #[arg(id = "webhook.enabled", long = "webhook-enabled", env = "DUBBO_CP_WEBHOOK_ENABLED",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enabled: bool,
    /// Address of the webhook's HTTPS port (its port is the one the configuration names).
    #[arg(
        id = "webhook.addr",
        long = "webhook-addr",
        env = "DUBBO_CP_WEBHOOK_ADDR"
    )]
    pub addr: SocketAddr,
    /// Longest time one review may take; then the pod is admitted unchanged.
    #[arg(id = "webhook.timeout", long = "webhook-timeout", env = "DUBBO_CP_WEBHOOK_TIMEOUT",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// Development outside a cluster: the URL the API server calls (`clientConfig.url`)
    /// instead of our Service; its host is added to the webhook's certificate.
    #[arg(id = "webhook.url", long = "webhook-url", env = "DUBBO_CP_WEBHOOK_URL")]
    pub url: Option<String>,
    /// `DUBBO_CA_ADDRESS` injected into pods (unset: `<ca.serviceName>.<ca.namespace>.svc`
    /// and the TLS port).
    #[arg(
        id = "webhook.caAddress",
        long = "webhook-ca-address",
        env = "DUBBO_CP_WEBHOOK_CA_ADDRESS"
    )]
    pub ca_address: Option<String>,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            addr: SocketAddr::from(([127, 0, 0, 1], 30080)),
            timeout: Duration::from_secs(5),
            url: None,
            ca_address: None,
        }
    }
}
