//! AuthorizationPolicy: which callers (`from`, `when`) a workload (`to`) lets in or turns away.
//!
//! A stream receives only the policies whose every rule's `to` matches its endpoint, and `to` is
//! not sent ([`AuthorizationPolicySpec::to_client`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{Checked, FieldError, PolicySelector, field, item, non_empty, one_of};
use super::limits;

/// What the Java SDK's `AuthorizationAction` takes (`ADULT` is its spelling of audit).
pub const AUTHORIZATION_ACTIONS: [&str; 3] = ["ALLOW", "DENY", "ADULT"];
/// What the Java SDK's `AuthorizationMatchType` takes; empty means `ANY_MATCH`.
pub const MATCH_TYPES: [&str; 2] = ["ANY_MATCH", "ALL_MATCH"];

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizationPolicySpec {
    #[schemars(extend("enum" = ["ALLOW", "DENY", "ADULT"]), length(max = limits::ENUM))]
    pub action: String,
    /// None: the policy applies to its whole namespace (or everyone, in the root namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::MATCHERS))]
    pub rules: Vec<AuthorizationRule>,
    /// Percentage of requests checked.
    // Unset (0) is not written back: stores keep what the user wrote, not defaults never set.
    #[serde(default, skip_serializing_if = "unset")]
    #[schemars(range(min = 0, max = 100))]
    pub samples: f32,
    #[serde(default, skip_serializing_if = "unset")]
    pub order: f32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("enum" = ["ANY_MATCH", "ALL_MATCH"]), length(max = limits::ENUM))]
    pub match_type: String,
}

/// Whether a number is its default (0), which readers assume when it is absent.
fn unset(value: &f32) -> bool {
    value.to_bits() == 0
}

/// Callers `from`, meeting `when`, calling endpoints `to`; an absent part matches everything.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizationRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<PolicySelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<PolicySelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Condition>,
}

/// A request attribute `key` whose value must match one of `values` and none of `notValues`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Condition {
    #[schemars(length(min = 1, max = limits::NAME))]
    pub key: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES))]
    pub values: Vec<Match>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES))]
    pub not_values: Vec<Match>,
}

/// A value and how it is compared (`type`, interpreted by the SDK).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Match {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = limits::NAME))]
    pub r#type: String,
    #[schemars(length(min = 1, max = limits::KEY))]
    pub value: String,
}

impl AuthorizationPolicySpec {
    pub(crate) fn check(&self, path: &str) -> Checked {
        one_of(&field(path, "action"), &self.action, &AUTHORIZATION_ACTIONS)?;
        for (i, rule) in self.rules.iter().enumerate() {
            rule.check(&item(path, "rules", i))?;
        }
        if !(0.0..=100.0).contains(&self.samples) {
            return Err(FieldError::value(
                field(path, "samples"),
                "must be a percentage from 0 to 100",
                &self.samples.to_string(),
            ));
        }
        if !self.order.is_finite() {
            return Err(FieldError::value(
                field(path, "order"),
                "must be a finite number",
                &self.order.to_string(),
            ));
        }
        if !self.match_type.is_empty() {
            one_of(&field(path, "matchType"), &self.match_type, &MATCH_TYPES)?;
        }
        Ok(())
    }
}

impl AuthorizationRule {
    fn check(&self, path: &str) -> Checked {
        if let Some(from) = &self.from {
            from.check(&field(path, "from"))?;
        }
        if let Some(to) = &self.to {
            to.check(&field(path, "to"))?;
        }
        if let Some(when) = &self.when {
            when.check(&field(path, "when"))?;
        }
        Ok(())
    }
}

impl Condition {
    fn check(&self, path: &str) -> Checked {
        non_empty(&field(path, "key"), &self.key)?;
        for (name, matches) in [("values", &self.values), ("notValues", &self.not_values)] {
            for (i, m) in matches.iter().enumerate() {
                non_empty(&field(&item(path, name, i), "value"), &m.value)?;
            }
        }
        Ok(())
    }
}
