//! Rule bodies in ZooKeeper: the YAML Dubbo Java and dubbo-go parse from the config center, and
//! the manifests of the kinds Dubbo has no config-center form for.
//!
//! Written bodies always carry what both SDKs need to apply a rule as meant (see
//! docs/zookeeper.md): `configVersion` as a string, explicit `enabled`, `force`, `runtime`,
//! `priority`, `key` and `scope` on router rules (dubbo-go dereferences `enabled` and `force`
//! without defaults), and an explicit `side` on every configurator item (Java applies an item
//! only on the side it names; dubbo-cp's empty side means the provider). The first line is a YAML
//! comment naming the object (`# dubbo-cp: TagRoute default/grey`), which every YAML parser skips
//! and which gives the object its name back when it is read.
//!
//! Read bodies may also be dubbo-admin's or hand-written: no comment (the name is derived from the
//! node), no `configVersion` (read as v2.7, as Java does), fields in any order; `key` and `scope`
//! come from the node's name, which is what SDKs look rules up by.

use serde_json::{Map, Value};

use crate::layout::{self, RuleNode};
use crate::rules::{Kind, Rule, RuleSpec, parse_manifests_in};

/// Largest rule body read; larger ones are reported and skipped.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// The comment that names the object a body holds.
const HEADER: &str = "# dubbo-cp: ";
/// The end of the header of an object a rules directory (`--rules-dir`) wrote.
const DIR_MARK: &str = " from rules-dir";

/// Who wrote an object through dubbo-cp: `dubbo-cp apply` (the admin API), or a rules directory,
/// whose reload deletes the objects it no longer holds and only those.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Api,
    Dir,
}

/// The header line of `rule`'s body.
fn header(rule: &Rule, origin: Origin) -> String {
    let mark = match origin {
        Origin::Api => "",
        Origin::Dir => DIR_MARK,
    };
    format!(
        "{HEADER}{} {}/{}{mark}\n",
        rule.kind().name(),
        rule.namespace,
        rule.name
    )
}

/// Who wrote the body `data`, by its header (a body without one is not a directory's).
pub fn origin_of(data: &[u8]) -> Origin {
    let first = data.split(|b| *b == b'\n').next().unwrap_or_default();
    match std::str::from_utf8(first) {
        Ok(line) if line.starts_with(HEADER) && line.trim_end().ends_with(DIR_MARK) => Origin::Dir,
        _ => Origin::Api,
    }
}

/// The body of `rule` as stored at its node.
pub fn encode(rule: &Rule, origin: Origin) -> Result<Vec<u8>, String> {
    if !layout::in_config_center(rule.kind()) {
        // The manifest as YAML (it reads back as `dubbo-cp apply` reads files).
        let text = serde_yaml::to_string(&rule.to_manifest())
            .map_err(|err| format!("cannot encode {}: {err}", rule.name))?;
        return Ok(format!("{}{text}", header(rule, origin)).into_bytes());
    }
    let spec = rule.spec.to_json();
    let field = |name: &str| spec.get(name).cloned().unwrap_or(Value::Null);
    let mut body = serde_yaml::Mapping::new();
    let mut put = |name: &str, value: Value| {
        if let Ok(value) = serde_yaml::to_value(value) {
            body.insert(serde_yaml::Value::String(name.to_owned()), value);
        }
    };
    put("configVersion", field("configVersion"));
    match &rule.spec {
        RuleSpec::TagRoute(_) => {
            put("scope", Value::from("application"));
            put("key", field("key"));
            router_flags(&spec, &mut put);
            put("tags", field("tags"));
        }
        RuleSpec::ConditionRoute(_) => {
            put("scope", field("scope"));
            put("key", field("key"));
            router_flags(&spec, &mut put);
            put("conditions", field("conditions"));
        }
        RuleSpec::DynamicConfig(_) => {
            put("scope", field("scope"));
            put("key", field("key"));
            put("enabled", field("enabled"));
            let mut configs = field("configs");
            for item in configs.as_array_mut().into_iter().flatten() {
                if let Some(item) = item.as_object_mut() {
                    with_side(item);
                }
            }
            put("configs", configs);
        }
        _ => {}
    }
    let yaml = serde_yaml::to_string(&body)
        .map_err(|err| format!("cannot encode {}: {err}", rule.name))?;
    Ok(format!("{}{yaml}", header(rule, origin)).into_bytes())
}

/// `enabled`, `force`, `runtime`, `priority`, all explicit.
fn router_flags(spec: &Value, put: &mut impl FnMut(&str, Value)) {
    for name in ["enabled", "force", "runtime", "priority"] {
        put(name, spec.get(name).cloned().unwrap_or(Value::Null));
    }
}

/// An item's `side` explicit: dubbo-cp's empty side is the provider's. (Nested fields come
/// out in alphabetical order, as dubbo-admin's SnakeYAML dump writes them.)
fn with_side(item: &mut Map<String, Value>) {
    let side = item.get("side").and_then(Value::as_str).unwrap_or_default();
    if side.is_empty() {
        item.insert("side".to_owned(), Value::from("provider"));
    }
}

/// Fields of each config-center kind dubbo-cp reads (others, such as dubbo-admin's `key` on a
/// tag rule or Dubbo's `valid` and `dynamic`, are left out; `key` and `scope` come from the node).
fn known_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::TagRoute => &[
            "priority",
            "enabled",
            "runtime",
            "configVersion",
            "force",
            "tags",
        ],
        Kind::ConditionRoute => &[
            "priority",
            "enabled",
            "force",
            "runtime",
            "conditions",
            "configVersion",
        ],
        Kind::DynamicConfig => &["configVersion", "enabled", "configs"],
        _ => &[],
    }
}

/// The rule a config-center node holds. `Ok(None)` for an empty body, which dubbo-go reads as
/// a deleted rule (dubbo-cp never writes one).
pub fn decode_rule(namespace: &str, node: &str, data: &[u8]) -> Result<Option<Rule>, String> {
    let Some(RuleNode { kind, key, scope }) = layout::parse_rule_key(node) else {
        return Err(format!("{node:?} is not a rule key dubbo-cp reads"));
    };
    let text = text_of(data)?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let parsed: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|err| format!("is not YAML: {err}"))?;
    let serde_yaml::Value::Mapping(_) = &parsed else {
        return Err(
            "is not a YAML mapping (a list of override:// URLs, Dubbo 2.6's form, is not read)"
                .to_owned(),
        );
    };
    let body: Value =
        serde_json::to_value(&parsed).map_err(|err| format!("cannot be read: {err}"))?;
    let mut spec = Map::new();
    for name in known_fields(kind) {
        if let Some(value) = body.get(*name).filter(|v| !v.is_null()) {
            spec.insert((*name).to_owned(), value.clone());
        }
    }
    // Java reads a rule without configVersion as v2.7 (its default branch).
    spec.entry("configVersion")
        .or_insert_with(|| Value::from("v2.7"));
    spec.insert("key".to_owned(), Value::from(key.clone()));
    if kind != Kind::TagRoute {
        spec.insert("scope".to_owned(), Value::from(scope));
    }
    let base = node.rsplit_once('.').map_or(node, |(base, _)| base);
    let named = named_in_header(text, kind, namespace);
    let derived = crate::mapping::object_name(base);
    for name in named.iter().chain(std::iter::once(&derived)) {
        let manifest = serde_json::json!({
            "apiVersion": crate::rules::API_VERSION,
            "kind": kind.name(),
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        });
        match parse_manifests_in(&manifest.to_string(), namespace) {
            Ok(mut rules) if rules.len() == 1 => return Ok(rules.pop()),
            Ok(_) => return Err("is not one object".to_owned()),
            // A name in the header that does not parse: the derived name is tried next.
            Err(err) if err.error.path.starts_with("metadata") && name != &derived => continue,
            Err(err) => return Err(err.error.to_string()),
        }
    }
    Err("has no usable name".to_owned())
}

/// The name the header gives, when it names this kind in this namespace.
fn named_in_header(text: &str, kind: Kind, namespace: &str) -> Option<String> {
    let line = text.lines().next()?.strip_prefix(HEADER)?;
    let line = line.trim();
    let line = line.strip_suffix(DIR_MARK).unwrap_or(line);
    let (named_kind, object) = line.split_once(' ')?;
    let (named_namespace, name) = object.split_once('/')?;
    (named_kind == kind.name() && named_namespace == namespace).then(|| name.to_owned())
}

/// The rule of our own kinds at `/dubbo-cp/<namespace>/<plural>/<name>`.
pub fn decode_ours(namespace: &str, kind: Kind, name: &str, data: &[u8]) -> Result<Rule, String> {
    let text = text_of(data)?;
    let mut rules = parse_manifests_in(text, namespace).map_err(|err| err.to_string())?;
    match rules.pop() {
        Some(rule)
            if rules.is_empty()
                && rule.kind() == kind
                && rule.name == name
                && rule.namespace == namespace =>
        {
            Ok(rule)
        }
        _ => Err(format!(
            "must hold exactly one {} named {name} in namespace {namespace}",
            kind.name()
        )),
    }
}

fn text_of(data: &[u8]) -> Result<&str, String> {
    if data.len() > MAX_BODY_BYTES {
        return Err(format!(
            "is {} bytes, over the {MAX_BODY_BYTES}-byte limit",
            data.len()
        ));
    }
    std::str::from_utf8(data).map_err(|_| "is not UTF-8 text".to_owned())
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;
