//! Kubernetes-style manifests, as a user gives them to `kubectl apply -f`: YAML (or JSON)
//! documents separated by `---`, each one rule object or a `kind: List` of them.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use super::common::{FieldError, is_dns_label};
use super::{Kind, RULE_KINDS, Rule, RuleSpec};

pub const API_VERSION: &str = "dubbo.apache.org/v1alpha1";
/// The namespace of an object whose manifest names none (kubectl would use its context's).
pub const DEFAULT_NAMESPACE: &str = "default";
/// The longest object name Kubernetes accepts (a DNS-1123 subdomain).
const MAX_NAME_BYTES: usize = 253;

/// Why a manifest is refused: which document (from 1, counting empty ones), which object when
/// it got that far, and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    pub document: usize,
    /// `TagRoute demo/grey`, once kind, namespace and name are known.
    pub object: Option<String>,
    pub error: FieldError,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        if self.error.path.is_empty() {
            write!(f, ": {}", self.error.message)
        } else {
            write!(f, ": {}", self.error)
        }
    }
}

/// Parses every document of `text`; objects without a namespace go to [`DEFAULT_NAMESPACE`].
pub fn parse_manifests(text: &str) -> Result<Vec<Rule>, ManifestError> {
    parse_manifests_in(text, DEFAULT_NAMESPACE)
}

/// Parses every document of `text`; objects without a namespace go to `default_namespace`.
/// Every object is validated, and the same object twice is refused (which one would win?).
pub fn parse_manifests_in(text: &str, default_namespace: &str) -> Result<Vec<Rule>, ManifestError> {
    let mut rules = Vec::new();
    // (kind, namespace, name) -> the document that defined it.
    let mut seen: BTreeMap<(Kind, String, String), usize> = BTreeMap::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let number = index + 1;
        let fail = |object: Option<String>, error: FieldError| ManifestError {
            document: number,
            object,
            error,
        };
        let value = Value::deserialize(document)
            .map_err(|e| fail(None, FieldError::new("", format!("not valid YAML: {e}"))))?;
        let objects = match &value {
            // An empty document (`---` at the end, comments only).
            Value::Null => continue,
            Value::Object(map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = map.get("items").and_then(Value::as_array).ok_or_else(|| {
                    fail(
                        None,
                        FieldError::new("items", "a List needs a list of items"),
                    )
                })?;
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| (format!("items[{i}]."), item))
                    .collect()
            }
            other => vec![(String::new(), other)],
        };
        for (prefix, object) in objects {
            let rule = parse_object(object, default_namespace).map_err(|(object, mut error)| {
                error.path = format!("{prefix}{}", error.path);
                fail(object, error)
            })?;
            let key = (rule.kind(), rule.namespace.clone(), rule.name.clone());
            if let Some(first) = seen.insert(key, number) {
                return Err(fail(
                    Some(describe(rule.kind(), &rule.namespace, &rule.name)),
                    FieldError::new(
                        format!("{prefix}metadata.name"),
                        format!("the same object is already defined in document {first}"),
                    ),
                ));
            }
            rules.push(rule);
        }
    }
    Ok(rules)
}

fn describe(kind: Kind, namespace: &str, name: &str) -> String {
    format!("{} {namespace}/{name}", kind.name())
}

type ObjectError = (Option<String>, FieldError);

fn parse_object(value: &Value, default_namespace: &str) -> Result<Rule, ObjectError> {
    let plain = |error: FieldError| (None, error);
    let Value::Object(object) = value else {
        return Err(plain(FieldError::new(
            "",
            "must be an object with apiVersion, kind, metadata and spec",
        )));
    };
    if let Some(unknown) = object
        .keys()
        .find(|k| !["apiVersion", "kind", "metadata", "spec"].contains(&k.as_str()))
    {
        return Err(plain(FieldError::new(
            unknown.as_str(),
            "unknown field (expected apiVersion, kind, metadata, spec)",
        )));
    }
    let api_version = string(object.get("apiVersion"), "apiVersion").map_err(plain)?;
    if api_version != API_VERSION {
        return Err(plain(FieldError::value(
            "apiVersion",
            format!("must be {API_VERSION}"),
            api_version,
        )));
    }
    let kind_name = string(object.get("kind"), "kind").map_err(plain)?;
    // The Kubernetes-only kinds, said as such with the standalone way to the same end.
    if kind_name == "Canary" {
        return Err(plain(FieldError::value(
            "kind",
            "is Kubernetes-only: the canary controller runs in `serve --mode kubernetes` and \
             moves a Deployment's traffic (apply it with kubectl); here, shift weight with a \
             DynamicConfig's `weight` override, served over xDS and the discovery stream \
             (docs/canary.md \"Without Kubernetes\")",
            kind_name,
        )));
    }
    let kind = Kind::from_name(kind_name)
        .filter(|kind| RULE_KINDS.contains(kind))
        .ok_or_else(|| {
            let kinds: Vec<&str> = RULE_KINDS.iter().map(|k| k.name()).collect();
            plain(FieldError::value(
                "kind",
                format!("must be one of {}", kinds.join(", ")),
                kind_name,
            ))
        })?;
    let metadata = match object.get("metadata") {
        Some(Value::Object(metadata)) => metadata,
        _ => {
            return Err(plain(FieldError::new(
                "metadata",
                "must be an object with a name",
            )));
        }
    };
    let name = string(metadata.get("name"), "metadata.name").map_err(plain)?;
    if !is_object_name(name) {
        return Err(plain(FieldError::value(
            "metadata.name",
            "must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', \
             starting and ending with a letter or digit, at most 253",
            name,
        )));
    }
    let namespace = match metadata.get("namespace") {
        None | Some(Value::Null) => default_namespace,
        namespace => string(namespace, "metadata.namespace").map_err(plain)?,
    };
    if !is_dns_label(namespace) {
        return Err(plain(FieldError::value(
            "metadata.namespace",
            "must be a namespace name (lower-case letters, digits and '-', at most 63)",
            namespace,
        )));
    }
    let described = Some(describe(kind, namespace, name));
    let spec = object.get("spec").unwrap_or(&Value::Null);
    let spec = RuleSpec::parse(kind, spec).map_err(|e| (described.clone(), e))?;
    spec.check_namespace(namespace)
        .map_err(|e| (described, e))?;
    Ok(Rule {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        spec,
        created: None,
    })
}

fn string<'a>(value: Option<&'a Value>, path: &str) -> Result<&'a str, FieldError> {
    match value {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(FieldError::new(path, "is required")),
        Some(other) => Err(FieldError::new(
            path,
            format!("must be a string (got {other})"),
        )),
    }
}

fn is_object_name(name: &str) -> bool {
    name.len() <= MAX_NAME_BYTES
        && name.split('.').all(|part| {
            let bytes = part.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
                && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}
