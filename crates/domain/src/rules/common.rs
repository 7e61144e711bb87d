//! What several kinds share: the error type, field checks, the match types of routes and dynamic
//! configs, and the selector of auth policies.

use std::fmt::Display;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::cidr::Cidr;
use super::limits;
use crate::mapping::quote;

/// Why a rule is refused: the field (`spec.tags[0].name`) and what is wrong with it, quoting the
/// value where there is one (`must not be empty (got "")`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// `what` is wrong with `value`: the message ends with `(got "<value>")`.
    pub fn value(path: impl Into<String>, what: impl Display, value: &str) -> Self {
        Self::new(path, format!("{what} (got {})", quote(value)))
    }
}

pub(crate) type Checked = Result<(), FieldError>;

/// `path.name`
pub(crate) fn field(path: &str, name: &str) -> String {
    format!("{path}.{name}")
}

/// `path.name[index]`
pub(crate) fn item(path: &str, name: &str, index: usize) -> String {
    format!("{path}.{name}[{index}]")
}

pub(crate) fn yes() -> bool {
    true
}

pub(crate) fn non_empty(path: &str, value: &str) -> Checked {
    if value.trim().is_empty() {
        return Err(FieldError::value(path, "must not be empty", value));
    }
    Ok(())
}

/// A name Dubbo compares literally (application, service key, address): no whitespace.
pub(crate) fn word(path: &str, value: &str) -> Checked {
    non_empty(path, value)?;
    if value.chars().any(char::is_whitespace) {
        return Err(FieldError::value(
            path,
            "must not contain whitespace",
            value,
        ));
    }
    Ok(())
}

pub(crate) fn words(path: &str, name: &str, values: &[String]) -> Checked {
    for (i, value) in values.iter().enumerate() {
        word(&item(path, name, i), value)?;
    }
    Ok(())
}

pub(crate) fn one_of(path: &str, value: &str, allowed: &[&str]) -> Checked {
    if !allowed.contains(&value) {
        return Err(FieldError::value(
            path,
            format!("must be one of {}", allowed.join(", ")),
            value,
        ));
    }
    Ok(())
}

pub(crate) fn at_least_one<T>(path: &str, values: &[T], what: &str) -> Checked {
    if values.is_empty() {
        return Err(FieldError::new(
            path,
            format!("at least one {what} is required"),
        ));
    }
    Ok(())
}

/// A Kubernetes namespace name: a DNS-1123 label.
pub(crate) fn namespace(path: &str, value: &str) -> Checked {
    if !is_dns_label(value) {
        return Err(FieldError::value(
            path,
            "must be a namespace name (lower-case letters, digits and '-', at most 63)",
            value,
        ));
    }
    Ok(())
}

pub(crate) fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The longest pattern accepted, so one rule cannot make every stream compile a huge regex.
const MAX_REGEX_BYTES: usize = 4096;

fn regex(path: &str, value: &str) -> Checked {
    if value.len() > MAX_REGEX_BYTES {
        return Err(FieldError::value(
            path,
            format!("must be at most {MAX_REGEX_BYTES} bytes"),
            value,
        ));
    }
    // RE2-style syntax (what the Go SDK's regexp takes too): no look-around or back-references.
    regex::RegexBuilder::new(value)
        .size_limit(1 << 20)
        .build()
        .map(|_| ())
        .map_err(|e| {
            let reason = match e {
                regex::Error::Syntax(text) => text.lines().last().unwrap_or_default().to_owned(),
                other => other.to_string(),
            };
            FieldError::value(
                path,
                format!("is not a valid regular expression: {reason}"),
                value,
            )
        })
}

pub(crate) fn cidr(path: &str, value: &str) -> Checked {
    Cidr::parse(value)
        .map(|_| ())
        .map_err(|why| FieldError::value(path, why, value))
}

/// How a string is matched; exactly one field is set. Proto3 drops empty strings, so an empty
/// field is the same as an absent one: match an empty value with `empty: "true"`.
// "Exactly one" is said structurally (`minProperties`/`maxProperties` of 1 over optional
// non-empty strings), which costs the API server's CEL budget nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct StringMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::KEY))]
    pub exact: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::KEY))]
    pub prefix: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::REGEX))]
    pub regex: String,
    /// Any non-empty text: matches a value that is present and not empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::KEY))]
    pub noempty: String,
    /// Any non-empty text: matches an absent or empty value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::KEY))]
    pub empty: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::KEY))]
    pub wildcard: String,
}

impl StringMatch {
    pub(crate) fn check(&self, path: &str) -> Checked {
        let set: Vec<&str> = [
            ("exact", &self.exact),
            ("prefix", &self.prefix),
            ("regex", &self.regex),
            ("noempty", &self.noempty),
            ("empty", &self.empty),
            ("wildcard", &self.wildcard),
        ]
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, _)| name)
        .collect();
        if set.len() != 1 {
            let got = if set.is_empty() {
                "none".to_owned()
            } else {
                set.join(", ")
            };
            return Err(FieldError::new(
                path,
                format!(
                    "exactly one of exact, prefix, regex, noempty, empty, wildcard must be set \
                     to a non-empty value (got {got})"
                ),
            ));
        }
        if !self.regex.is_empty() {
            regex(&field(path, "regex"), &self.regex)?;
        }
        Ok(())
    }

    /// Whether `input` (a parameter's value, `None` when absent) matches, as Dubbo's
    /// `StringMatch.isMatch`: the first field set decides; `regex` must match the whole value
    /// (Java's `String.matches`); `wildcard` is the value itself, or `*` for any present value;
    /// `empty` takes an absent or empty value, `noempty` a present, non-empty one.
    pub fn matches(&self, input: Option<&str>) -> bool {
        match input {
            Some(input) if !self.exact.is_empty() => input == self.exact,
            Some(input) if !self.prefix.is_empty() => input.starts_with(&self.prefix),
            Some(input) if !self.regex.is_empty() => {
                whole_regex(&self.regex).is_some_and(|re| re.is_match(input))
            }
            Some(input) if !self.wildcard.is_empty() => {
                self.wildcard == "*" || input == self.wildcard
            }
            _ if !self.empty.is_empty() => input.is_none_or(str::is_empty),
            _ if !self.noempty.is_empty() => input.is_some_and(|i| !i.is_empty()),
            _ => false,
        }
    }
}

/// `pattern` compiled to match a whole value (Java's `String.matches`), from a small cache:
/// a rule is matched against every endpoint on every version, and compiling is the cost.
fn whole_regex(pattern: &str) -> Option<regex::Regex> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};
    /// Patterns kept; past it the cache starts over (rules hold few distinct patterns).
    const KEPT: usize = 256;
    static CACHE: OnceLock<Mutex<HashMap<String, Option<regex::Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(compiled) = cache.get(pattern) {
        return compiled.clone();
    }
    if cache.len() >= KEPT {
        cache.clear();
    }
    let compiled = regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(1 << 20)
        .build()
        .ok();
    cache.insert(pattern.to_owned(), compiled.clone());
    compiled
}

/// A URL parameter of the provider or consumer and how its value is matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParamMatch {
    #[schemars(length(min = 1, max = limits::NAME))]
    pub key: String,
    pub value: StringMatch,
}

impl ParamMatch {
    pub(crate) fn check(&self, path: &str) -> Checked {
        word(&field(path, "key"), &self.key)?;
        self.value.check(&field(path, "value"))
    }

    /// Whether the parameter `key` of `params` matches `value`.
    pub fn matches(&self, params: &std::collections::BTreeMap<String, String>) -> bool {
        self.value
            .matches(params.get(&self.key).map(String::as_str))
    }
}

pub(crate) fn check_params(path: &str, name: &str, params: &[ParamMatch]) -> Checked {
    for (i, param) in params.iter().enumerate() {
        param.check(&item(path, name, i))?;
    }
    Ok(())
}

/// How an address is matched; exactly one field is set. (`cird` is spelled so on the wire.)
// Said structurally, as for `StringMatch`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct AddressMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::KEY))]
    pub wildcard: String,
    /// A CIDR block, `10.0.0.0/8`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::NAME))]
    pub cird: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = limits::KEY))]
    pub exact: String,
}

impl AddressMatch {
    fn check(&self, path: &str) -> Checked {
        let set = [&self.wildcard, &self.cird, &self.exact]
            .into_iter()
            .filter(|v| !v.is_empty())
            .count();
        if set != 1 {
            return Err(FieldError::new(
                path,
                format!("exactly one of wildcard, cird, exact must be set (got {set})"),
            ));
        }
        if !self.cird.is_empty() {
            cidr(&field(path, "cird"), &self.cird)?;
        }
        if !self.exact.is_empty() {
            word(&field(path, "exact"), &self.exact)?;
        }
        if !self.wildcard.is_empty() {
            word(&field(path, "wildcard"), &self.wildcard)?;
        }
        Ok(())
    }
}

impl AddressMatch {
    /// Whether the address `input` (a provider's IP) matches, as Dubbo's `AddressMatch.isMatch`:
    /// `cird` is the address itself or a block holding it; `wildcard` is `*` or `0.0.0.0` for
    /// any, else a pattern with at most one `*` (Dubbo's `isMatchGlobPattern`); `exact` is equal.
    pub fn matches(&self, input: &str) -> bool {
        if !self.cird.is_empty() {
            return input == self.cird
                || super::cidr::Cidr::parse(&self.cird).is_ok_and(|block| {
                    input
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| block.contains(ip))
                });
        }
        if !self.wildcard.is_empty() {
            return self.wildcard == "*"
                || self.wildcard == "0.0.0.0"
                || glob(&self.wildcard, input);
        }
        !self.exact.is_empty() && input == self.exact
    }
}

/// Dubbo's `UrlUtils.isMatchGlobPattern` without parameter references: the last `*` stands for
/// any text between what precedes and what follows it.
fn glob(pattern: &str, value: &str) -> bool {
    match pattern.rsplit_once('*') {
        None => pattern == value,
        Some((prefix, suffix)) => {
            value.len() >= prefix.len() + suffix.len()
                && value.starts_with(prefix)
                && value.ends_with(suffix)
        }
    }
}

impl ListStringMatch {
    /// Whether any of `oneof` matches `input`.
    pub fn matches(&self, input: Option<&str>) -> bool {
        self.oneof.iter().any(|m| m.matches(input))
    }
}

/// Matches if any of `oneof` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListStringMatch {
    #[schemars(length(min = 1, max = limits::MATCHERS))]
    pub oneof: Vec<StringMatch>,
}

impl ListStringMatch {
    fn check(&self, path: &str) -> Checked {
        at_least_one(&field(path, "oneof"), &self.oneof, "match")?;
        for (i, m) in self.oneof.iter().enumerate() {
            m.check(&item(path, "oneof", i))?;
        }
        Ok(())
    }
}

/// Which instances a dynamic config applies to; every field given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConditionMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<AddressMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ListStringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<ListStringMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::MATCHERS))]
    pub param: Vec<ParamMatch>,
}

impl ConditionMatch {
    /// Whether a provider instance at `host` of `application`, whose URL parameters are
    /// `params`, matches every field given but `service`, as Dubbo's `ConditionMatch.isMatch`.
    /// `service` is the caller's to decide: it names the interface a URL is of, which an
    /// instance serving several does not say.
    pub fn matches_instance(
        &self,
        host: &str,
        application: &str,
        params: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        self.address.as_ref().is_none_or(|a| a.matches(host))
            && self
                .application
                .as_ref()
                .is_none_or(|a| a.matches(Some(application)))
            && self.param.iter().all(|p| p.matches(params))
    }

    pub(crate) fn check(&self, path: &str) -> Checked {
        if let Some(address) = &self.address {
            address.check(&field(path, "address"))?;
        }
        if let Some(service) = &self.service {
            service.check(&field(path, "service"))?;
        }
        if let Some(application) = &self.application {
            application.check(&field(path, "application"))?;
        }
        check_params(path, "param", &self.param)
    }
}

/// Which endpoints a policy selects: an authentication policy's `selector` entries and an
/// authorization rule's `from` / `to`. Every non-empty field must match; `extends` matches if
/// any entry does, `notExtends` fails if any does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySelector {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES), inner(length(max = 63)))]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES), inner(length(max = 63)))]
    pub not_namespaces: Vec<String>,
    /// CIDR blocks one of the endpoint's IPs must lie in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES), inner(length(max = limits::NAME)))]
    pub ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES), inner(length(max = limits::NAME)))]
    pub not_ip_blocks: Vec<String>,
    /// SPIFFE IDs, with or without `spiffe://`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES), inner(length(max = limits::KEY)))]
    pub principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::SELECTOR_ENTRIES), inner(length(max = limits::KEY)))]
    pub not_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::MATCHERS))]
    pub extends: Vec<PolicyExtend>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::MATCHERS))]
    pub not_extends: Vec<PolicyExtend>,
}

/// `key` is a dotted path into the endpoint (`kubernetesEnv.podLabels.app`), equal to `value`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyExtend {
    #[schemars(length(min = 1, max = limits::NAME))]
    pub key: String,
    #[serde(default)]
    #[schemars(length(max = limits::KEY))]
    pub value: String,
}

/// The roots of an endpoint an `extends` key can start with, and the fields under
/// `kubernetesEnv`.
pub const EXTEND_ROOTS: [&str; 4] = ["id", "ips", "spiffeID", "kubernetesEnv"];
pub const KUBERNETES_ENV_FIELDS: [&str; 4] =
    ["namespace", "podName", "podLabels", "podAnnotations"];

impl PolicyExtend {
    fn check(&self, path: &str) -> Checked {
        let key_path = field(path, "key");
        word(&key_path, &self.key)?;
        let mut parts = self.key.splitn(3, '.');
        let root = parts.next().unwrap_or_default();
        let sub = parts.next();
        let rest = parts.next();
        let known = match root {
            "kubernetesEnv" => match sub {
                Some("namespace" | "podName") => rest.is_none(),
                // A label or annotation name follows, and may itself hold dots.
                Some("podLabels" | "podAnnotations") => rest.is_some_and(|r| !r.is_empty()),
                _ => false,
            },
            "id" | "ips" | "spiffeID" => sub.is_none(),
            _ => false,
        };
        if !known {
            return Err(FieldError::value(
                key_path,
                "must be id, ips, spiffeID, kubernetesEnv.namespace, kubernetesEnv.podName, \
                 kubernetesEnv.podLabels.<label> or kubernetesEnv.podAnnotations.<annotation>",
                &self.key,
            ));
        }
        Ok(())
    }
}

impl PolicySelector {
    pub(crate) fn check(&self, path: &str) -> Checked {
        for (name, values) in [
            ("namespaces", &self.namespaces),
            ("notNamespaces", &self.not_namespaces),
        ] {
            for (i, value) in values.iter().enumerate() {
                namespace(&item(path, name, i), value)?;
            }
        }
        for (name, values) in [
            ("ipBlocks", &self.ip_blocks),
            ("notIpBlocks", &self.not_ip_blocks),
        ] {
            for (i, value) in values.iter().enumerate() {
                cidr(&item(path, name, i), value)?;
            }
        }
        words(path, "principals", &self.principals)?;
        words(path, "notPrincipals", &self.not_principals)?;
        for (name, values) in [
            ("extends", &self.extends),
            ("notExtends", &self.not_extends),
        ] {
            for (i, extend) in values.iter().enumerate() {
                extend.check(&item(path, name, i))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod string_match_tests {
    use super::StringMatch;

    fn m(field: &str, value: &str) -> StringMatch {
        serde_json::from_value(serde_json::json!({ field: value })).unwrap_or_default()
    }

    #[test]
    fn each_field_matches_as_dubbos_string_match() {
        assert!(m("exact", "gray").matches(Some("gray")));
        assert!(!m("exact", "gray").matches(Some("grayer")));
        assert!(!m("exact", "gray").matches(None));
        assert!(m("prefix", "gr").matches(Some("gray")));
        assert!(!m("prefix", "gr").matches(None));
        // The whole value, as Java's String.matches.
        assert!(m("regex", "g.a").matches(Some("gra")));
        assert!(!m("regex", "g.a").matches(Some("gray")));
        assert!(m("regex", "a|gray").matches(Some("gray")));
        assert!(m("wildcard", "*").matches(Some("anything")));
        assert!(!m("wildcard", "*").matches(None));
        assert!(m("wildcard", "v1").matches(Some("v1")));
        assert!(!m("wildcard", "v1").matches(Some("v2")));
        assert!(m("empty", "x").matches(None));
        assert!(m("empty", "x").matches(Some("")));
        assert!(!m("empty", "x").matches(Some("a")));
        assert!(m("noempty", "x").matches(Some("a")));
        assert!(!m("noempty", "x").matches(Some("")));
        assert!(!m("noempty", "x").matches(None));
        assert!(!StringMatch::default().matches(Some("a")));
    }
}

#[cfg(test)]
mod condition_match_tests {
    use super::ConditionMatch;
    use std::collections::BTreeMap;

    fn m(json: serde_json::Value) -> ConditionMatch {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_instance_matches_as_dubbos_condition_match() {
        let labels = BTreeMap::from([("version".to_owned(), "v2".to_owned())]);
        let on = |json: serde_json::Value, host: &str| {
            m(json).matches_instance(host, "greeter", &labels)
        };
        // Address: exact, a block or the address itself as cird, wildcards with one `*`.
        assert!(on(
            serde_json::json!({"address": {"exact": "10.0.0.1"}}),
            "10.0.0.1"
        ));
        assert!(!on(
            serde_json::json!({"address": {"exact": "10.0.0.1"}}),
            "10.0.0.10"
        ));
        assert!(on(
            serde_json::json!({"address": {"cird": "10.0.0.0/24"}}),
            "10.0.0.9"
        ));
        assert!(!on(
            serde_json::json!({"address": {"cird": "10.0.0.0/24"}}),
            "10.0.1.9"
        ));
        assert!(on(
            serde_json::json!({"address": {"cird": "fd00::/8"}}),
            "fd00::1"
        ));
        for any in ["*", "0.0.0.0"] {
            assert!(on(
                serde_json::json!({"address": {"wildcard": any}}),
                "10.9.9.9"
            ));
        }
        assert!(on(
            serde_json::json!({"address": {"wildcard": "10.0.*"}}),
            "10.0.3.4"
        ));
        assert!(!on(
            serde_json::json!({"address": {"wildcard": "10.0.*"}}),
            "10.1.3.4"
        ));
        assert!(on(
            serde_json::json!({"address": {"wildcard": "*.4"}}),
            "10.0.3.4"
        ));
        assert!(!on(
            serde_json::json!({"address": {"wildcard": "10.*.10"}}),
            "10.0"
        ));
        // Application and URL parameters (an endpoint's labels); every field given must match.
        let app = |name: &str| serde_json::json!({"application": {"oneof": [{"exact": "x"}, {"exact": name}]}});
        assert!(on(app("greeter"), "10.0.0.1"));
        assert!(!on(app("billing"), "10.0.0.1"));
        let param = |v: &str| serde_json::json!([{"key": "version", "value": {"exact": v}}]);
        assert!(on(serde_json::json!({"param": param("v2")}), "10.0.0.1"));
        assert!(!on(serde_json::json!({"param": param("v1")}), "10.0.0.1"));
        assert!(!on(
            serde_json::json!({"param": param("v2"), "address": {"exact": "10.0.0.2"}}),
            "10.0.0.1"
        ));
        assert!(
            on(serde_json::json!({}), "10.0.0.1"),
            "nothing given: every instance"
        );
    }
}
