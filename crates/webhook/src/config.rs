//! The `webhook` section of the configuration.

use std::net::SocketAddr;
use std::time::Duration;

use clap::ArgAction;
use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The pod admission webhook (Kubernetes mode, with the CA).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookConfig {
    /// Serve the webhook and keep `MutatingWebhookConfiguration dubbo-cp` (Kubernetes mode
    /// with `ca.enabled`; ignored otherwise).
    #[arg(id = "webhook.enabled", long = "webhook-enabled", env = "DUBBO_CP_WEBHOOK_ENABLED",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    #[default(true)]
    pub enabled: bool,
    /// Address of the webhook's HTTPS port (its port is the one the configuration names).
    #[arg(
        id = "webhook.addr",
        long = "webhook-addr",
        env = "DUBBO_CP_WEBHOOK_ADDR"
    )]
    #[default(SocketAddr::from(([127, 0, 0, 1], 30080)))]
    pub addr: SocketAddr,
    /// Longest time one review may take; then the pod is admitted unchanged.
    #[arg(id = "webhook.timeout", long = "webhook-timeout", env = "DUBBO_CP_WEBHOOK_TIMEOUT",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(5))]
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
    /// Image of the `dubbo-cp-agent` sidecar injected into pods labelled `dubbo-agent.inject`
    /// (it runs `dubbo-cp agent`, so the control plane's own image).
    #[arg(
        id = "webhook.agentImage",
        long = "webhook-agent-image",
        env = "DUBBO_CP_WEBHOOK_AGENT_IMAGE"
    )]
    #[default(DEFAULT_AGENT_IMAGE.to_owned())]
    pub agent_image: String,
}

/// The control plane's image as deploy/ names it.
pub const DEFAULT_AGENT_IMAGE: &str = "dubbo-cp:latest";
