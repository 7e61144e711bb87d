//! AuthenticationPolicy: whether the selected workloads require mTLS from their callers
//! (`STRICT`), accept both (`PERMISSIVE`) or neither (`DISABLED`), per port if need be.
//!
//! A stream receives only the policies whose every selector matches its endpoint, and the
//! selectors are not sent ([`AuthenticationPolicySpec::to_client`]).

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{Checked, FieldError, PolicySelector, field, item, one_of};
use super::limits;

/// What the Java SDK's `AuthenticationAction` takes.
pub const AUTHENTICATION_ACTIONS: [&str; 4] = ["NONE", "DISABLED", "PERMISSIVE", "STRICT"];

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthenticationPolicySpec {
    #[schemars(extend("enum" = ["NONE", "DISABLED", "PERMISSIVE", "STRICT"]), length(max = limits::ENUM))]
    pub action: String,
    /// Which endpoints the policy applies to: all of them must match; none means every endpoint
    /// (of the policy's namespace, unless it is in the root namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::MATCHERS))]
    pub selector: Vec<PolicySelector>,
    /// Per-port exceptions to `action`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::MATCHERS))]
    pub port_level: Vec<PortLevel>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortLevel {
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    #[schemars(extend("enum" = ["NONE", "DISABLED", "PERMISSIVE", "STRICT"]), length(max = limits::ENUM))]
    pub action: String,
}

impl AuthenticationPolicySpec {
    pub(crate) fn check(&self, path: &str) -> Checked {
        one_of(
            &field(path, "action"),
            &self.action,
            &AUTHENTICATION_ACTIONS,
        )?;
        for (i, selector) in self.selector.iter().enumerate() {
            selector.check(&item(path, "selector", i))?;
        }
        let mut ports = BTreeSet::new();
        for (i, level) in self.port_level.iter().enumerate() {
            let level_path = item(path, "portLevel", i);
            let port_path = field(&level_path, "port");
            if !(1..=65535).contains(&level.port) {
                return Err(FieldError::value(
                    port_path,
                    "must be a port from 1 to 65535",
                    &level.port.to_string(),
                ));
            }
            if !ports.insert(level.port) {
                return Err(FieldError::value(
                    port_path,
                    "is already given by an earlier entry",
                    &level.port.to_string(),
                ));
            }
            one_of(
                &field(&level_path, "action"),
                &level.action,
                &AUTHENTICATION_ACTIONS,
            )?;
        }
        Ok(())
    }
}
