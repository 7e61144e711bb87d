//! Flagger's alerting resources: the `AlertProvider` (where a chat message goes) and a Canary's
//! `analysis.alerts` (which provider hears which severity). What each type is sent is
//! [`crate::messages`]'s; delivery [`crate::notifier`]'s.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The provider types: Flagger's five and `webhook`, the Canary as JSON to any receiver.
pub const PROVIDER_TYPES: [&str; 6] = ["slack", "msteams", "discord", "rocket", "gchat", "webhook"];

/// Where alerts go, as Flagger's `alertproviders.flagger.app`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, PartialEq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "AlertProvider",
    doc = "A chat or webhook receiver of a Canary's alerts",
    namespaced,
    plural = "alertproviders",
    singular = "alertprovider",
    category = "dubbo",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.address) || has(self.secretRef)")
    .message("set address, or secretRef to a Secret holding it"))]
pub struct AlertProviderSpec {
    #[serde(rename = "type")]
    #[schemars(extend("enum" = PROVIDER_TYPES), length(max = 16))]
    pub r#type: String,
    /// The channel (slack, discord, rocket); `general` when unset, as Flagger's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub channel: Option<String>,
    /// The bot's name (slack, discord, rocket); `dubbo-cp` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub username: Option<String>,
    /// The hook URL; the Secret's `address` wins when `secretRef` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"), length(max = 2048))]
    pub address: Option<String>,
    /// An HTTP proxy, `http://[user:password@]host:port`: every alert goes through a CONNECT
    /// tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^http://"), length(max = 2048))]
    pub proxy: Option<String>,
    /// A Secret in the provider's namespace holding `address` (and, for slack, `token`: a bot
    /// token sent as a bearer token), as Flagger reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<crate::template::SecretRef>,
    /// Accept any server certificate (https only). For test setups: the answer could be anyone's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

// By hand: a hook address is a credential, a proxy URL may hold a password; neither may reach a
// log through `{:?}`.
impl std::fmt::Debug for AlertProviderSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |set: bool| if set { "<redacted>" } else { "none" };
        f.debug_struct("AlertProviderSpec")
            .field("type", &self.r#type)
            .field("channel", &self.channel)
            .field("username", &self.username)
            .field("address", &redacted(self.address.is_some()))
            .field("proxy", &redacted(self.proxy.is_some()))
            .field("secret_ref", &self.secret_ref)
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .finish()
    }
}

/// One entry of `analysis.alerts`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryAlert {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default)]
    pub severity: Severity,
    pub provider_ref: ProviderRef,
}

/// An alert's provider; the Canary's namespace when `namespace` is unset.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct ProviderRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// `info` hears everything, `warn` warnings and errors, `error` errors only (Flagger's levels).
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Default,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    #[default]
    Info,
    Warn,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }

    /// Whether an alert subscribed at `self` hears an event of `event` severity.
    pub fn hears(self, event: Severity) -> bool {
        event >= self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use kube::core::cel::Validator;
    use serde_json::{Value, json};

    #[test]
    fn severities_filter_as_flaggers_do() {
        use Severity::*;
        let heard = |alert: Severity| -> Vec<Severity> {
            [Info, Warn, Error]
                .into_iter()
                .filter(|e| alert.hears(*e))
                .collect()
        };
        assert_eq!(heard(Info), [Info, Warn, Error]);
        assert_eq!(heard(Warn), [Warn, Error]);
        assert_eq!(heard(Error), [Error]);
    }

    #[test]
    fn the_schema_refuses_a_provider_without_an_address_or_an_unknown_type() {
        let crd = AlertProvider::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("alertproviders.dubbo.apache.org")
        );
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap();
        let failures = |spec: Value| -> Vec<String> {
            let object = json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "AlertProvider",
                                "metadata": {"name": "p", "namespace": "test"}, "spec": spec});
            match Validator::new().validate(&schema, &object, None) {
                Ok(()) => vec![],
                Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
            }
        };
        assert_eq!(
            failures(json!({"type": "slack", "address": "https://hooks.slack.com/x"})),
            Vec::<String>::new()
        );
        assert_eq!(
            failures(json!({"type": "msteams", "secretRef": {"name": "teams"}})),
            Vec::<String>::new()
        );
        assert_eq!(
            failures(json!({"type": "slack"})),
            ["set address, or secretRef to a Secret holding it"]
        );
        let spec = &schema["properties"]["spec"]["properties"];
        assert_eq!(spec["type"]["enum"].as_array().unwrap().len(), 6);
        assert_eq!(spec["proxy"]["pattern"], "^http://");
    }

    #[test]
    fn a_providers_debug_shows_no_address_or_proxy_password() {
        let spec: AlertProviderSpec = serde_json::from_value(json!({
            "type": "slack", "address": "https://hooks.slack.com/services/T0/B0/s3cret",
            "proxy": "http://ops:pa55@squid:3128"}))
        .unwrap();
        let debug = format!("{spec:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("pa55"),
            "{debug}"
        );
        assert!(debug.contains("slack"), "{debug}");
    }
}
