//! Flagger's `MetricTemplate`: a query and the Prometheus it runs on (address, credentials from a
//! Secret, TLS checking), referenced from `analysis.metrics[].templateRef` with
//! `templateVariables`. Only the `prometheus` provider: the only one Dubbo's provider metrics
//! are exported to.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A reusable metric query, as Flagger's `metrictemplates.flagger.app`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "MetricTemplate",
    doc = "A metric query a Canary's analysis references: the query and the Prometheus it runs on",
    namespaced,
    plural = "metrictemplates",
    singular = "metrictemplate",
    category = "dubbo",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider.type"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.provider.address"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MetricTemplateSpec {
    pub provider: MetricProvider,
    /// The query, with Flagger's variables: `{{ namespace }}`, `{{ target }}`,
    /// `{{ interval }}`, `{{ variables.<name> }}`, and `{{ application }}`.
    #[schemars(length(min = 1, max = 10000))]
    pub query: String,
}

/// Where the query runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricProvider {
    #[serde(rename = "type", default = "prometheus")]
    #[schemars(extend("enum" = ["prometheus"]), length(max = 32))]
    pub r#type: String,
    /// `http://` or `https://`; the Canary's or the server's Prometheus when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"), length(max = 2048))]
    pub address: Option<String>,
    /// A Secret in the template's namespace holding `username` and `password` (basic auth) or
    /// `token` (a bearer token), as Flagger's prometheus provider reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    /// Accept any server certificate (https only). For test setups: the answer could be anyone's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

fn prometheus() -> String {
    "prometheus".to_owned()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct SecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A metric's reference to its template; the Canary's namespace when `namespace` is unset.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct TemplateRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// The credentials a request to the provider carries.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Basic { username: String, password: String },
    Bearer(String),
}

impl std::fmt::Debug for Credentials {
    /// Never the secret itself, in logs or errors.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, <password>)"),
            Credentials::Bearer(_) => f.write_str("Bearer(<token>)"),
        }
    }
}

impl Credentials {
    /// From a Secret's data, as Flagger reads it: `username` and `password`, or `token`.
    pub fn from_secret(
        name: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Credentials, String> {
        let text = |key: &str| {
            data.get(key).map(|v| {
                String::from_utf8_lossy(v)
                    .trim_end_matches(['\n', '\r'])
                    .to_owned()
            })
        };
        match (text("username"), text("password"), text("token")) {
            (Some(username), Some(password), _) => Ok(Credentials::Basic { username, password }),
            (_, _, Some(token)) => Ok(Credentials::Bearer(token)),
            _ => Err(format!(
                "secret {name} holds neither username and password nor token"
            )),
        }
    }

    /// The `Authorization` header's value.
    pub fn header(&self) -> String {
        match self {
            Credentials::Basic { username, password } => {
                use base64::Engine;
                let pair = format!("{username}:{password}");
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )
            }
            Credentials::Bearer(token) => format!("Bearer {token}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_secret_as_flagger_reads_them() {
        let data = |pairs: &[(&str, &str)]| -> BTreeMap<String, Vec<u8>> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        let basic = Credentials::from_secret(
            "s",
            &data(&[("username", "admin"), ("password", "s3cret\n")]),
        );
        assert_eq!(
            basic.as_ref().map(Credentials::header),
            Ok("Basic YWRtaW46czNjcmV0".to_owned())
        );
        assert!(!format!("{basic:?}").contains("s3cret"), "never logged");
        let bearer = Credentials::from_secret("s", &data(&[("token", "abc")]));
        assert_eq!(bearer.map(|c| c.header()), Ok("Bearer abc".to_owned()));
        let none = Credentials::from_secret("prom-auth", &data(&[("user", "x")]));
        assert_eq!(
            none,
            Err("secret prom-auth holds neither username and password nor token".to_owned())
        );
    }
}
