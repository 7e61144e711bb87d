//! The CRD schema as the standalone validator: what the API server checks structurally (types,
//! lengths, counts, enums, ranges, `oneOf` of required fields) is checked here from the same
//! generated schema, so the two modes refuse the same objects and the limits live in one place
//! ([`super::limits`]). CEL rules and semantic checks stay with each kind's `check`.

use serde_json::{Map, Value};

use super::common::FieldError;
use crate::mapping::quote;

/// How far [`check`] goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Only that objects are where objects belong: serde reads a struct from a list as well as
    /// from a map (`value: ["v2"]` would become `exact: v2`), which the API server refuses.
    Types,
    /// Everything the schema says.
    Full,
}

/// Checks `value` at `path` against the schema node `schema`.
pub fn check(schema: &Value, value: &Value, path: &str, depth: Depth) -> Result<(), FieldError> {
    let ty = schema.get("type").and_then(Value::as_str);
    match (ty, value) {
        // Null is for serde to judge: absent where optional, an error where required.
        (_, Value::Null) => Ok(()),
        (Some("object"), Value::Object(map)) => object(schema, map, path, depth),
        (Some("object"), other) => Err(FieldError::new(
            path,
            format!("must be an object (got {})", json_type(other)),
        )),
        (Some("array"), Value::Array(items)) => {
            if depth == Depth::Full {
                count(schema, items.len(), path, "items")?;
            }
            match schema.get("items") {
                Some(item_schema) => items.iter().enumerate().try_for_each(|(i, item)| {
                    check(item_schema, item, &format!("{path}[{i}]"), depth)
                }),
                None => Ok(()),
            }
        }
        (Some("string"), Value::String(text)) if depth == Depth::Full => string(schema, text, path),
        (Some("integer" | "number"), Value::Number(number)) if depth == Depth::Full => {
            range(schema, number, path)
        }
        // Wrong scalar types are serde's to report, with the type it expected.
        _ => Ok(()),
    }
}

fn object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    depth: Depth,
) -> Result<(), FieldError> {
    if depth == Depth::Full {
        let present = map.values().filter(|v| !v.is_null()).count();
        bound(schema, "minProperties", present, |min| {
            format!("must have at least {min} field(s) set (got {present})")
        })
        .map_err(|m| FieldError::new(path, m))?;
        bound(schema, "maxProperties", present, |max| {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                let names: Vec<&str> = properties.keys().map(String::as_str).collect();
                format!(
                    "must have at most {max} of {} set (got {present})",
                    names.join(", ")
                )
            } else {
                format!("must have at most {max} entries (got {present})")
            }
        })
        .map_err(|m| FieldError::new(path, m))?;
        one_of_required(schema, map, path)?;
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (key, value) in map {
        let field_schema = properties.and_then(|p| p.get(key)).or(additional);
        if let Some(field_schema) = field_schema {
            check(field_schema, value, &format!("{path}.{key}"), depth)?;
        }
    }
    Ok(())
}

/// `oneOf: [{required: [a]}, {required: [b]}]`: exactly one branch's fields are present.
fn one_of_required(schema: &Value, map: &Map<String, Value>, path: &str) -> Result<(), FieldError> {
    let Some(branches) = schema.get("oneOf").and_then(Value::as_array) else {
        return Ok(());
    };
    let required = |branch: &Value| -> Vec<String> {
        branch
            .get("required")
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let met = branches
        .iter()
        .filter(|branch| {
            required(branch)
                .iter()
                .all(|name| map.get(name).is_some_and(|v| !v.is_null()))
        })
        .count();
    if met == 1 {
        return Ok(());
    }
    let names: Vec<String> = branches.iter().map(|b| required(b).join(" and ")).collect();
    Err(FieldError::new(
        path,
        format!("set exactly one of {} (got {met})", names.join(", ")),
    ))
}

fn count(schema: &Value, n: usize, path: &str, what: &str) -> Result<(), FieldError> {
    bound(schema, "minItems", n, |min| {
        format!("must have at least {min} {what} (got {n})")
    })
    .and_then(|()| {
        bound(schema, "maxItems", n, |max| {
            format!("must have at most {max} {what} (got {n})")
        })
    })
    .map_err(|m| FieldError::new(path, m))
}

fn string(schema: &Value, text: &str, path: &str) -> Result<(), FieldError> {
    // The API server counts characters (runes), not bytes.
    let n = text.chars().count();
    let shown = quote(text);
    bound(schema, "minLength", n, |min| {
        format!("must be at least {min} characters (got {n}: {shown})")
    })
    .and_then(|()| {
        bound(schema, "maxLength", n, |max| {
            format!("must be at most {max} characters (got {n}: {shown})")
        })
    })
    .map_err(|m| FieldError::new(path, m))?;
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.iter().any(|a| a.as_str() == Some(text))
    {
        let names: Vec<&str> = allowed.iter().filter_map(Value::as_str).collect();
        return Err(FieldError::new(
            path,
            format!("must be one of {} (got {shown})", names.join(", ")),
        ));
    }
    // The schema's patterns are ours and compile; one that did not would not be applied.
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        && regex::Regex::new(pattern).is_ok_and(|re| !re.is_match(text))
    {
        return Err(FieldError::new(
            path,
            format!("must match {pattern} (got {shown})"),
        ));
    }
    Ok(())
}

fn range(schema: &Value, number: &serde_json::Number, path: &str) -> Result<(), FieldError> {
    let Some(n) = number.as_f64() else {
        return Ok(());
    };
    let limit = |key: &str| schema.get(key).and_then(Value::as_f64);
    if let Some(min) = limit("minimum").filter(|min| n < *min) {
        return Err(FieldError::new(
            path,
            format!("must be at least {min} (got {number})"),
        ));
    }
    if let Some(max) = limit("maximum").filter(|max| n > *max) {
        return Err(FieldError::new(
            path,
            format!("must be at most {max} (got {number})"),
        ));
    }
    Ok(())
}

/// `Err(message(bound))` when `n` is under the schema's `min...` bound `key` (or over its
/// `max...` one).
fn bound(
    schema: &Value,
    key: &str,
    n: usize,
    message: impl Fn(u64) -> String,
) -> Result<(), String> {
    let n = n as u64;
    match schema.get(key).and_then(Value::as_u64) {
        Some(min) if key.starts_with("min") && n < min => Err(message(min)),
        Some(max) if key.starts_with("max") && n > max => Err(message(max)),
        _ => Ok(()),
    }
}

pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Every bound of a schema as `(path, what)` rows, `spec.tags[]` for list items and
/// `spec.configs[].parameters.*` for map values: the limits table of docs/rules.md.
pub fn limits_table(schema: &Value, path: &str) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    collect(schema, path, &mut rows);
    rows
}

fn collect(schema: &Value, path: &str, rows: &mut Vec<(String, String)>) {
    let number = |key: &str| schema.get(key).and_then(Value::as_u64);
    let mut said = Vec::new();
    let pair = |min: Option<u64>, max: Option<u64>, unit: &str| match (min, max) {
        (Some(min), Some(max)) if min == max => Some(format!("exactly {min} {unit}")),
        (Some(min), Some(max)) => Some(format!("{min}-{max} {unit}")),
        (None, Some(max)) => Some(format!("at most {max} {unit}")),
        (Some(min), None) => Some(format!("at least {min} {unit}")),
        (None, None) => None,
    };
    said.extend(pair(number("minLength"), number("maxLength"), "characters"));
    said.extend(pair(number("minItems"), number("maxItems"), "items"));
    let entries = if schema.get("properties").is_some() {
        "field(s) set"
    } else {
        "entries"
    };
    said.extend(pair(
        number("minProperties"),
        number("maxProperties"),
        entries,
    ));
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        let names: Vec<&str> = required.iter().filter_map(Value::as_str).collect();
        said.push(format!("requires {}", names.join(", ")));
    }
    if let Some(branches) = schema.get("oneOf").and_then(Value::as_array) {
        let names: Vec<String> = branches
            .iter()
            .filter_map(|b| b.get("required").and_then(Value::as_array))
            .map(|names| {
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" and ")
            })
            .collect();
        said.push(format!("exactly one of {}", names.join(", ")));
    }
    if !said.is_empty() {
        rows.push((path.to_owned(), said.join("; ")));
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, field) in properties {
            collect(field, &format!("{path}.{name}"), rows);
        }
    }
    if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        collect(additional, &format!("{path}.*"), rows);
    }
    if let Some(items) = schema.get("items") {
        collect(items, &format!("{path}[]"), rows);
    }
}

/// The limits of every rule kind as a Markdown table, as docs/rules.md holds it.
pub fn limits_markdown() -> String {
    let mut out = String::from("| kind | field | limit |\n|---|---|---|\n");
    for kind in super::RULE_KINDS {
        let Some(schema) = super::spec_schema(kind) else {
            continue;
        };
        for (path, what) in limits_table(schema, "spec") {
            out.push_str(&format!("| {} | `{path}` | {what} |\n", kind.name()));
        }
    }
    out
}
