//! ConditionRoute: which providers requests may reach, by conditions in Dubbo's grammar
//! ([`super::condition`]). `key` is a service (scope `service`) or an application (`application`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{Checked, FieldError, at_least_one, field, item, one_of, word, yes};
use super::condition::parse_condition;
use super::{SCOPES, config_version, limits};

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConditionRouteSpec {
    #[serde(default)]
    pub priority: i32,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub force: bool,
    #[serde(default = "yes")]
    pub runtime: bool,
    #[schemars(length(min = 1, max = limits::KEY))]
    pub key: String,
    #[schemars(extend("enum" = ["service", "application"]), length(max = limits::ENUM))]
    pub scope: String,
    /// `when => then` conditions, e.g. `method=sayHello => region=hangzhou`.
    #[schemars(length(min = 1, max = limits::INSTANCES), inner(length(min = 1, max = limits::CONDITION)))]
    pub conditions: Vec<String>,
    #[schemars(extend("enum" = ["v3.0", "v2.7"]), length(max = limits::ENUM))]
    pub config_version: String,
}

impl ConditionRouteSpec {
    pub(crate) fn check(&self, path: &str) -> Checked {
        word(&field(path, "key"), &self.key)?;
        one_of(&field(path, "scope"), &self.scope, &SCOPES)?;
        config_version(&field(path, "configVersion"), &self.config_version, true)?;
        at_least_one(&field(path, "conditions"), &self.conditions, "condition")?;
        for (i, condition) in self.conditions.iter().enumerate() {
            parse_condition(condition)
                .map_err(|e| FieldError::value(item(path, "conditions", i), e, condition))?;
        }
        Ok(())
    }
}
