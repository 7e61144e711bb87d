//! DynamicConfig: parameters (weight, timeout, retries, ...) overridden at run time for a service
//! (scope `service`) or an application (`application`), on the provider or consumer side.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Checked, ConditionMatch, FieldError, at_least_one, field, item, one_of, word, words, yes,
};
use super::{SCOPES, config_version, limits};

/// The provider-side parameter that asks for session affinity: callers' calls are placed by a
/// hash of this request header (attachment). dubbo-cp's: Dubbo SDKs ignore it; xDS clients get
/// a ring hash.
pub const HASH_HEADER: &str = "hash.header";

/// Headers every call carries with one value (gRPC sets them): hashing on one would put all of
/// an application's callers on one pod.
const CONSTANT_HEADERS: [&str; 4] = ["content-type", "te", "user-agent", "host"];

/// A header gRPC clients hash on: a lower-case metadata key that is not binary (`-bin`), not a
/// pseudo-header, not gRPC's own (`grpc-`) nor one gRPC sets on every call (`content-type`, `te`,
/// `user-agent`, `host`), at most 100 characters.
pub fn hashable_header(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && !name.ends_with("-bin")
        && !name.starts_with("grpc-")
        && !CONSTANT_HEADERS.contains(&name)
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DynamicConfigSpec {
    /// A service key (`group/interface:version`, scope `service`) or an application name.
    #[schemars(length(min = 1, max = limits::KEY))]
    pub key: String,
    #[schemars(extend("enum" = ["service", "application"]), length(max = limits::ENUM))]
    pub scope: String,
    #[schemars(extend("enum" = ["v3.0", "v2.7"]), length(max = limits::ENUM))]
    pub config_version: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[schemars(length(min = 1, max = limits::INSTANCES))]
    pub configs: Vec<OverrideConfig>,
}

/// One override: `parameters` for the instances the other fields select.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OverrideConfig {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("enum" = ["provider", "consumer"]), length(max = limits::ENUM))]
    pub side: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::INSTANCES), inner(length(max = limits::KEY)))]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::INSTANCES), inner(length(max = limits::KEY)))]
    pub provider_addresses: Vec<String>,
    /// At least one; values are strings (quote numbers in YAML: `weight: "50"`).
    #[schemars(extend(
        "minProperties" = 1,
        "maxProperties" = limits::PARAMETERS,
        "additionalProperties" = {"type": "string", "maxLength": limits::KEY},
        "x-kubernetes-validations" = [{
            "rule": "!has(self.weight) || (int(self.weight) >= 0 && int(self.weight) <= 1000000)",
            "message": "weight must be an integer from 0 to 1000000",
        }],
    ))]
    pub parameters: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::INSTANCES), inner(length(max = limits::NAME)))]
    pub applications: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::INSTANCES), inner(length(max = limits::KEY)))]
    pub services: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("enum" = ["general", "weight", "balancing", "disabled"]), length(max = limits::ENUM))]
    pub r#type: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#match: Option<ConditionMatch>,
}

/// Parameters whose values clients parse as integers, and the range each must be in.
const INTEGER_PARAMETERS: [(&str, i64, i64); 4] = [
    // Dubbo's default is 100; a canary pod among many primaries needs more (canary::weight).
    ("weight", 0, 1_000_000),
    ("timeout", 0, i32::MAX as i64),
    ("retries", 0, i32::MAX as i64),
    ("warmup", 0, i32::MAX as i64),
];

impl DynamicConfigSpec {
    pub(crate) fn check(&self, path: &str) -> Checked {
        word(&field(path, "key"), &self.key)?;
        one_of(&field(path, "scope"), &self.scope, &SCOPES)?;
        config_version(&field(path, "configVersion"), &self.config_version, false)?;
        at_least_one(&field(path, "configs"), &self.configs, "config")?;
        for (i, config) in self.configs.iter().enumerate() {
            let path = item(path, "configs", i);
            config.check(&path)?;
            if config.parameters.contains_key(HASH_HEADER) && self.scope != "application" {
                return Err(FieldError::value(
                    field(&field(&path, "parameters"), HASH_HEADER),
                    "asks for affinity on an application's callers: only in an \
                     application-scoped config",
                    &self.scope,
                ));
            }
        }
        Ok(())
    }
}

impl OverrideConfig {
    /// `hash.header` applies to every pod of the application, for all its callers: it is
    /// refused where it would read as narrower (some addresses, a match, the consumer side).
    fn check_hash_header(&self, path: &str, value: &str) -> Checked {
        if !hashable_header(value) {
            return Err(FieldError::value(
                path,
                "must be a lower-case metadata key of at most 100 characters (letters, digits, \
                 '-', '_', '.'), not binary ('-bin'), not gRPC's ('grpc-') and not one every \
                 call carries (content-type, te, user-agent, host)",
                value,
            ));
        }
        let narrowed = [
            (
                !self.side.is_empty() && self.side != "provider",
                "the consumer side",
            ),
            (
                !self.addresses.is_empty() || !self.provider_addresses.is_empty(),
                "addresses",
            ),
            (self.r#match.is_some(), "a match"),
        ];
        if let Some((_, what)) = narrowed.iter().find(|(narrowed, _)| *narrowed) {
            return Err(FieldError::value(
                path,
                format!(
                    "applies to every pod of the application: set it in a provider-side \
                     override without {what}"
                ),
                value,
            ));
        }
        Ok(())
    }

    fn check(&self, path: &str) -> Checked {
        if !self.side.is_empty() {
            one_of(&field(path, "side"), &self.side, &["provider", "consumer"])?;
        }
        words(path, "addresses", &self.addresses)?;
        words(path, "providerAddresses", &self.provider_addresses)?;
        words(path, "applications", &self.applications)?;
        words(path, "services", &self.services)?;
        if !self.r#type.is_empty() {
            one_of(
                &field(path, "type"),
                &self.r#type,
                &["general", "weight", "balancing", "disabled"],
            )?;
        }
        let parameters = field(path, "parameters");
        if self.parameters.is_empty() {
            // Dubbo refuses such a config: it would change nothing.
            return Err(FieldError::new(
                parameters,
                "at least one parameter is required",
            ));
        }
        for (key, value) in &self.parameters {
            word(&parameters, key)?;
            if key == HASH_HEADER {
                self.check_hash_header(&field(&parameters, key), value)?;
            }
            let Some((_, min, max)) = INTEGER_PARAMETERS.iter().find(|(name, ..)| name == key)
            else {
                continue;
            };
            let in_range = value
                .parse::<i64>()
                .ok()
                .filter(|v| (*min..=*max).contains(v));
            // Digits only: Rust would take `+5`, Dubbo's clients may not.
            if in_range.is_none() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err(FieldError::value(
                    field(&parameters, key),
                    format!("must be an integer from {min} to {max}"),
                    value,
                ));
            }
        }
        if let Some(matches) = &self.r#match {
            matches.check(&field(path, "match"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_header_grpc_cannot_hash_on_is_refused_by_name() {
        let config: OverrideConfig = serde_json::from_value(serde_json::json!({
            "side": "provider", "parameters": {"hash.header": "X-User"},
        }))
        .unwrap_or_else(|err| panic!("{err}"));
        let err = config.check("spec.configs[0]").err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(
            err.contains("spec.configs[0].parameters.hash.header") && err.contains("X-User"),
            "{err}"
        );
    }

    #[test]
    fn a_hash_header_is_refused_where_it_would_read_narrower_than_the_application() {
        let spec = |scope: &str, config: serde_json::Value| -> DynamicConfigSpec {
            serde_json::from_value(serde_json::json!({
                "key": "greeter", "scope": scope, "configVersion": "v3.0", "configs": [config],
            }))
            .unwrap_or_else(|err| panic!("{err}"))
        };
        let header = serde_json::json!({"hash.header": "x-user"});
        assert_eq!(
            spec("application", serde_json::json!({"parameters": header})).check("spec"),
            Ok(())
        );
        for (scope, config, said) in [
            (
                "service",
                serde_json::json!({"parameters": header}),
                "application-scoped",
            ),
            (
                "application",
                serde_json::json!({"side": "consumer", "parameters": header}),
                "without the consumer side",
            ),
            (
                "application",
                serde_json::json!({"addresses": ["10.0.0.1"], "parameters": header}),
                "without addresses",
            ),
        ] {
            let err = spec(scope, config.clone()).check("spec").err();
            let err = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                err.contains("spec.configs[0].parameters.hash.header") && err.contains(said),
                "{config}: {err}"
            );
        }
    }

    #[test]
    fn hashable_headers_are_lower_case_metadata_keys_grpc_hashes() {
        for good in ["x-user", "session_id", "a.b", "x1"] {
            assert!(hashable_header(good), "{good}");
        }
        let long = "x".repeat(101);
        for bad in [
            "",
            "X-User",
            ":authority",
            "grpc-trace",
            "x-bin",
            "a b",
            &long,
        ] {
            assert!(!hashable_header(bad), "{bad}");
        }
    }
}
