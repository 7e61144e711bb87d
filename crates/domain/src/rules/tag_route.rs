//! TagRoute: route requests carrying a tag (`dubbo.tag`) to the instances of that tag, for grey
//! releases. `key` is the provider application.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Checked, FieldError, ParamMatch, at_least_one, check_params, field, item, word, words, yes,
};
use super::{config_version, limits};

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
// A CEL rule the API server checks (kube's `x_kube(validation)` writes the same keyword).
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.configVersion == 'v3.0' || self.tags.all(t, !has(t.match))",
    "message": "tags[].match needs configVersion v3.0 (older versions ignore it)",
}]))]
pub struct TagRouteSpec {
    #[serde(default)]
    pub priority: i32,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "yes")]
    pub runtime: bool,
    /// The provider application the tags divide.
    #[schemars(length(min = 1, max = limits::KEY))]
    pub key: String,
    #[schemars(extend("enum" = ["v3.0", "v2.7"]), length(max = limits::ENUM))]
    pub config_version: String,
    #[serde(default)]
    pub force: bool,
    #[schemars(length(min = 1, max = limits::INSTANCES))]
    pub tags: Vec<Tag>,
}

/// One tag: its instances by address (`addresses`) or by their parameters (`match`, v3.0).
// "One of the two" is a structural `oneOf` (no CEL cost).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("oneOf" = [{"required": ["addresses"]}, {"required": ["match"]}]))]
pub struct Tag {
    #[schemars(length(min = 1, max = limits::NAME))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = limits::INSTANCES), inner(length(max = limits::KEY)))]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = limits::MATCHERS))]
    pub r#match: Vec<ParamMatch>,
}

impl TagRouteSpec {
    pub(crate) fn check(&self, path: &str) -> Checked {
        word(&field(path, "key"), &self.key)?;
        config_version(&field(path, "configVersion"), &self.config_version, false)?;
        at_least_one(&field(path, "tags"), &self.tags, "tag")?;
        let mut names = BTreeSet::new();
        for (i, tag) in self.tags.iter().enumerate() {
            let tag_path = item(path, "tags", i);
            word(&field(&tag_path, "name"), &tag.name)?;
            if !names.insert(tag.name.as_str()) {
                return Err(FieldError::value(
                    field(&tag_path, "name"),
                    "is already the name of an earlier tag",
                    &tag.name,
                ));
            }
            // Dubbo uses `match` only for a tag without addresses, and only from v3.0 on.
            match (tag.addresses.is_empty(), tag.r#match.is_empty()) {
                (true, true) => {
                    return Err(FieldError::new(
                        tag_path,
                        "set addresses or match: a tag with neither selects no instance",
                    ));
                }
                (false, false) => {
                    return Err(FieldError::new(
                        tag_path,
                        "set either addresses or match, not both (Dubbo ignores match then)",
                    ));
                }
                _ => {}
            }
            words(&tag_path, "addresses", &tag.addresses)?;
            if !tag.r#match.is_empty() && self.config_version != "v3.0" {
                return Err(FieldError::value(
                    field(&tag_path, "match"),
                    "needs configVersion v3.0 (older versions ignore it)",
                    &self.config_version,
                ));
            }
            check_params(&tag_path, "match", &tag.r#match)?;
        }
        Ok(())
    }
}
