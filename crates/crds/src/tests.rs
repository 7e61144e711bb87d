use super::*;

/// The domain validates specs against its copy of the schemas; a spec change regenerates it.
#[test]
fn the_domains_spec_schemas_are_current() {
    let generated = serde_json::Value::Object(spec_schemas());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../domain/src/rules/spec_schemas.json");
    if std::env::var_os("DUBBO_CP_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&generated).unwrap_or_default() + "\n";
        if let Err(err) = std::fs::write(&path, text) {
            panic!("cannot write {}: {err}", path.display());
        }
    }
    let committed: serde_json::Value =
        serde_json::from_str(rules::SPEC_SCHEMAS).unwrap_or_default();
    assert!(
        committed == generated,
        "crates/domain/src/rules/spec_schemas.json is stale: regenerate it with \
         `DUBBO_CP_BLESS=1 cargo test -p dubbo-cp-crds`, then run it again"
    );
    for kind in rules::RULE_KINDS {
        assert!(rules::spec_schema(kind).is_some(), "{kind:?} has no schema");
    }
}

#[test]
fn the_resources_serialize_their_spec_as_the_domain_does() {
    let spec: rules::ConditionRouteSpec = serde_json::from_value(serde_json::json!({
        "key": "demo", "scope": "application", "configVersion": "v3.0",
        "conditions": ["method=sayHello => region=hangzhou"],
    }))
    .unwrap_or_else(|err| panic!("{err}"));
    let object = ConditionRoute::new("r", spec.clone().into());
    let json = serde_json::to_value(&object).unwrap_or_default();
    assert_eq!(
        json["spec"],
        serde_json::to_value(&spec).unwrap_or_default()
    );
    assert_eq!(json["kind"], "ConditionRoute");
    assert_eq!(object.spec.key, "demo", "the spec reads like the domain's");
    let back: ConditionRoute = serde_json::from_value(json).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(back.spec.0, spec);
}
