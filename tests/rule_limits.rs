//! The limits of rule specs have one source: the CRD schema. The API server enforces it (and its
//! CEL cost estimate depends on it), standalone `apply` enforces the same schema with errors that
//! name the field, the value and the limit, and docs/rules.md lists the table generated from it.

// Tests and their helpers: a failure is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dubbo_cp::rules::{Kind, RULE_KINDS, RuleSpec, limits, limits_markdown, spec_schema};
use serde_json::{Value, json};

/// Every string, list and map of every rule schema has an upper bound, so no CEL rule can reach
/// an unbounded one and no object can grow one without limit.
#[test]
fn every_string_list_and_map_of_every_rule_is_bounded() {
    fn walk(schema: &Value, path: &str, unbounded: &mut Vec<String>) {
        match schema.get("type").and_then(Value::as_str) {
            Some("string") if schema.get("maxLength").is_none() => unbounded.push(path.to_owned()),
            Some("array") if schema.get("maxItems").is_none() => unbounded.push(path.to_owned()),
            Some("object")
                if schema.get("additionalProperties").is_some()
                    && schema.get("maxProperties").is_none() =>
            {
                unbounded.push(path.to_owned())
            }
            _ => {}
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, field) in properties {
                walk(field, &format!("{path}.{name}"), unbounded);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(items, &format!("{path}[]"), unbounded);
        }
        if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
            walk(values, &format!("{path}.*"), unbounded);
        }
    }
    let mut unbounded = Vec::new();
    for kind in RULE_KINDS {
        walk(
            spec_schema(kind).unwrap(),
            &format!("{}.spec", kind.name()),
            &mut unbounded,
        );
    }
    assert_eq!(unbounded, Vec::<String>::new());
}

fn tag_route(tags: Value) -> Value {
    json!({"key": "shop", "configVersion": "v3.0", "tags": tags})
}

fn refused(kind: Kind, spec: &Value) -> String {
    match RuleSpec::parse(kind, spec) {
        Ok(_) => panic!("accepted: {spec}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn standalone_refuses_what_is_over_a_limit_naming_field_value_and_limit() {
    let tag = |i: usize| json!({"name": format!("t{i}"), "addresses": ["10.0.0.1:20880"]});
    // At the limit: accepted.
    let most: Vec<Value> = (0..limits::INSTANCES).map(tag).collect();
    RuleSpec::parse(Kind::TagRoute, &tag_route(json!(most))).unwrap();
    let over: Vec<Value> = (0..=limits::INSTANCES).map(tag).collect();
    assert_eq!(
        refused(Kind::TagRoute, &tag_route(json!(over))),
        "spec.tags: must have at most 1000 items (got 1001)"
    );

    let long_key = "k".repeat(limits::KEY + 1);
    let spec = json!({"key": long_key, "configVersion": "v3.0", "tags": [tag(0)]});
    let message = refused(Kind::TagRoute, &spec);
    assert!(
        message.starts_with(&format!(
            "spec.key: must be at most 1024 characters (got 1025: \"{}\"...",
            "k".repeat(80)
        )),
        "{message}"
    );

    let parameters: serde_json::Map<String, Value> = (0..=limits::PARAMETERS)
        .map(|i| (format!("p{i}"), json!("1")))
        .collect();
    let spec = json!({
        "key": "shop", "scope": "application", "configVersion": "v3.0",
        "configs": [{"side": "provider", "parameters": parameters}],
    });
    assert_eq!(
        refused(Kind::DynamicConfig, &spec),
        "spec.configs[0].parameters: must have at most 64 entries (got 65)"
    );

    let oneof: Vec<Value> = (0..=limits::MATCHERS)
        .map(|i| json!({"exact": format!("a{i}")}))
        .collect();
    let spec = json!({
        "key": "shop", "scope": "application", "configVersion": "v3.0",
        "configs": [{"parameters": {"timeout": "5"}, "match": {"application": {"oneof": oneof}}}],
    });
    assert_eq!(
        refused(Kind::DynamicConfig, &spec),
        "spec.configs[0].match.application.oneof: must have at most 64 items (got 65)"
    );

    let condition = format!("host={}", "a".repeat(limits::CONDITION));
    let spec = json!({
        "key": "shop", "scope": "application", "configVersion": "v3.0", "conditions": [condition],
    });
    let message = refused(Kind::ConditionRoute, &spec);
    assert!(
        message.starts_with("spec.conditions[0]: must be at most 4096 characters (got 4101: "),
        "{message}"
    );
}

/// docs/rules.md's limits table is the one the rule schemas generate.
#[test]
fn the_limits_table_in_docs_is_current() {
    check_generated_table("docs/rules.md", &limits_markdown());
}

/// docs/canary.md's limits table is the one the Canary schema generates.
#[test]
fn the_canary_limits_table_in_docs_is_current() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(dubbo_cp::canary::Canary::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut table = String::from("| field | limit |\n|---|---|\n");
    for (path, what) in dubbo_cp::rules::limits_table(spec, "spec") {
        table.push_str(&format!("| `{path}` | {what} |\n"));
    }
    check_generated_table("docs/canary.md", &table);
}

/// Compares the table between the markers of `file` with `generated`; with
/// `DUBBO_CP_UPDATE_DOCS` set, writes it instead.
fn check_generated_table(file: &str, generated: &str) {
    const BEGIN: &str = "<!-- limits: generated from the CRD schemas; do not edit -->\n";
    const END: &str = "<!-- end of limits -->";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find(BEGIN).expect("no limits table") + BEGIN.len();
    let end = start
        + text[start..]
            .find(END)
            .expect("the limits table has no end marker");
    if text[start..end] != *generated {
        if std::env::var_os("DUBBO_CP_UPDATE_DOCS").is_some() {
            let updated = format!("{}{generated}{}", &text[..start], &text[end..]);
            std::fs::write(&path, updated).unwrap();
        } else {
            panic!(
                "{file}'s limits table is stale: run \
                 `DUBBO_CP_UPDATE_DOCS=1 cargo test --all-features --test rule_limits` and commit it"
            );
        }
    }
}
