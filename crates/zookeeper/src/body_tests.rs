//! Golden bytes of every rule kind, and the bodies read back the way Dubbo Java 3.3 and
//! dubbo-go 3.3 read them (their parsers' rules, modelled below from their sources).

use super::*;
use crate::rules::parse_manifests;

fn rule(manifest: &str) -> Rule {
    let mut rules = parse_manifests(manifest).unwrap();
    assert_eq!(rules.len(), 1);
    rules.remove(0)
}

fn text(rule: &Rule) -> String {
    String::from_utf8(encode(rule, Origin::Api).unwrap()).unwrap()
}

const TAG_ROUTE: &str = "
apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata: {name: grey, namespace: default}
spec:
  key: shop-provider
  configVersion: v3.0
  tags:
    - name: gray
      match:
        - key: version
          value: {exact: v2}
    - name: canary
      addresses: ['10.0.0.7:20880']
";

const CONDITION_ROUTE: &str = "
apiVersion: dubbo.apache.org/v1alpha1
kind: ConditionRoute
metadata: {name: no-hz, namespace: shop}
spec:
  key: g1/org.apache.dubbo.samples.CommentService:1.0.0
  scope: service
  configVersion: v3.0
  force: true
  priority: 2
  conditions:
    - 'method=getComment => region=hangzhou'
";

const DYNAMIC_CONFIG: &str = "
apiVersion: dubbo.apache.org/v1alpha1
kind: DynamicConfig
metadata: {name: weights, namespace: default}
spec:
  key: shop-provider
  scope: application
  configVersion: v3.0
  configs:
    - addresses: ['10.0.0.7:20880']
      parameters: {weight: '50'}
    - side: consumer
      parameters: {timeout: '3000'}
";

#[test]
fn tag_route_bytes() {
    assert_eq!(
        text(&rule(TAG_ROUTE)),
        "# dubbo-cp: TagRoute default/grey
configVersion: v3.0
scope: application
key: shop-provider
enabled: true
force: false
runtime: true
priority: 0
tags:
- match:
  - key: version
    value:
      exact: v2
  name: gray
- addresses:
  - 10.0.0.7:20880
  name: canary
"
    );
}

#[test]
fn condition_route_bytes() {
    assert_eq!(
        text(&rule(CONDITION_ROUTE)),
        "# dubbo-cp: ConditionRoute shop/no-hz
configVersion: v3.0
scope: service
key: g1/org.apache.dubbo.samples.CommentService:1.0.0
enabled: true
force: true
runtime: true
priority: 2
conditions:
- method=getComment => region=hangzhou
"
    );
}

#[test]
fn dynamic_config_bytes() {
    assert_eq!(
        text(&rule(DYNAMIC_CONFIG)),
        "# dubbo-cp: DynamicConfig default/weights
configVersion: v3.0
scope: application
key: shop-provider
enabled: true
configs:
- addresses:
  - 10.0.0.7:20880
  enabled: true
  parameters:
    weight: '50'
  side: provider
- enabled: true
  parameters:
    timeout: '3000'
  side: consumer
"
    );
}

#[test]
fn nodes_are_named_by_key_and_scope() {
    let node = |manifest| layout::rule_key(&rule(manifest).spec).unwrap().unwrap();
    assert_eq!(node(TAG_ROUTE), "shop-provider.tag-router");
    assert_eq!(
        node(CONDITION_ROUTE),
        "org.apache.dubbo.samples.CommentService:1.0.0:g1.condition-router"
    );
    assert_eq!(node(DYNAMIC_CONFIG), "shop-provider.configurators");
}

#[test]
fn what_we_write_reads_back_as_the_same_rule() {
    for manifest in [TAG_ROUTE, CONDITION_ROUTE] {
        let rule = rule(manifest);
        let node = layout::rule_key(&rule.spec).unwrap().unwrap();
        let back = decode_rule(&rule.namespace, &node, &encode(&rule, Origin::Api).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(back, rule);
    }
    // The DynamicConfig comes back with its provider side explicit, and encodes the same.
    let rule = rule(DYNAMIC_CONFIG);
    let bytes = encode(&rule, Origin::Api).unwrap();
    let back = decode_rule("default", "shop-provider.configurators", &bytes)
        .unwrap()
        .unwrap();
    assert_eq!(back.name, "weights");
    let RuleSpec::DynamicConfig(spec) = &back.spec else {
        panic!("{back:?}")
    };
    assert_eq!(spec.configs[0].side, "provider");
    assert_eq!(encode(&back, Origin::Api).unwrap(), bytes);
}

#[test]
fn our_kinds_are_manifests_under_our_path() {
    let entry = rule(
        "
apiVersion: dubbo.apache.org/v1alpha1
kind: ServiceEntry
metadata: {name: greeter, namespace: shop}
spec:
  hosts: [greeter]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  endpoints: [{address: 10.0.0.1}]
",
    );
    assert_eq!(
        layout::ours_dir("shop", entry.kind()).unwrap(),
        "/dubbo-cp/shop/serviceentries"
    );
    let bytes = encode(&entry, Origin::Api).unwrap();
    assert_eq!(
        decode_ours("shop", Kind::ServiceEntry, "greeter", &bytes).unwrap(),
        entry
    );
    assert!(decode_ours("shop", Kind::ServiceEntry, "other", &bytes).is_err());
}

/// dubbo-admin 0.6.0's shapes (SnakeYAML dumpAsMap, alphabetical, no configVersion).
#[test]
fn admin_bodies_are_read() {
    let condition = "conditions:\n- method=sayHello => region=hz\nenabled: true\nforce: false\n\
                     key: org.apache.dubbo.demo.DemoService\npriority: 0\nruntime: true\nscope: service\n";
    let rule = decode_rule(
        "default",
        "org.apache.dubbo.demo.DemoService::.condition-router",
        condition.as_bytes(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(rule.namespace, "default");
    assert!(
        rule.name.starts_with("org-apache-dubbo-demo-demoservice"),
        "{}",
        rule.name
    );
    let RuleSpec::ConditionRoute(spec) = &rule.spec else {
        panic!()
    };
    assert_eq!(spec.config_version, "v2.7");
    assert_eq!(spec.key, "org.apache.dubbo.demo.DemoService");
    assert_eq!(spec.scope, "service");

    let tag = "enabled: true\nforce: false\nkey: shop\npriority: 0\nruntime: true\n\
               tags:\n- addresses:\n  - 10.0.0.1:20880\n  name: gray\n";
    let rule = decode_rule("default", "shop.tag-router", tag.as_bytes())
        .unwrap()
        .unwrap();
    assert_eq!(rule.name, "shop");

    let weight = "configVersion: v2.7\nconfigs:\n- addresses:\n  - 10.0.0.1:20880\n  enabled: true\n  \
                  parameters:\n    weight: 50\n  side: provider\n  type: weight\nenabled: true\nkey: shop\nscope: application\n";
    let read = decode_rule("default", "shop.configurators", weight.as_bytes());
    // An unquoted number where dubbo-cp takes strings: reported, never guessed.
    assert!(read.is_err(), "{read:?}");
}

#[test]
fn unreadable_bodies_are_reported() {
    let node = "shop.tag-router";
    assert_eq!(decode_rule("default", node, b"").unwrap(), None);
    assert_eq!(decode_rule("default", node, b"  \n").unwrap(), None);
    for bad in [
        &b"\xff\xfe"[..],
        b"tags: [",
        b"- override://0.0.0.0/x?weight=1",
        b"tags: []",
        b"configVersion: 3.0\ntags: [{name: a, addresses: [x]}]",
    ] {
        assert!(decode_rule("default", node, bad).is_err(), "{bad:?}");
    }
    let big = vec![b'#'; MAX_BODY_BYTES + 1];
    assert!(
        decode_rule("default", node, &big)
            .unwrap_err()
            .contains("limit")
    );
}

#[test]
fn a_header_naming_another_kind_or_namespace_is_ignored() {
    let body = text(&rule(TAG_ROUTE));
    let read = decode_rule("shop", "shop-provider.tag-router", body.as_bytes())
        .unwrap()
        .unwrap();
    assert_eq!(
        (read.namespace.as_str(), read.name.as_str()),
        ("shop", "shop-provider")
    );
}

// ---- The SDKs' readers, as their sources read (§1b of the spec this crate follows). ----

/// What Dubbo Java 3.3 does with a body: SnakeYAML into a map; `configVersion` cast to String
/// (a number throws); router flags default enabled=true, force=false, runtime=true; a tag's
/// `match` honoured only when configVersion starts with v3.0; a configurator item applied only on
/// the side it names, and only with non-empty parameters.
fn java_reads(body: &str) -> Result<serde_yaml::Mapping, String> {
    let value: serde_yaml::Value = serde_yaml::from_str(body).map_err(|e| e.to_string())?;
    let map = value.as_mapping().cloned().ok_or("not a map")?;
    match map.get("configVersion") {
        None | Some(serde_yaml::Value::String(_)) => {}
        Some(other) => return Err(format!("ClassCastException: {other:?}")),
    }
    Ok(map)
}

fn java_items_applied(map: &serde_yaml::Mapping, side: &str) -> usize {
    map.get("configs")
        .and_then(|c| c.as_sequence())
        .into_iter()
        .flatten()
        .filter(|item| {
            item.get("side").and_then(|s| s.as_str()) == Some(side)
                && item
                    .get("parameters")
                    .and_then(|p| p.as_mapping())
                    .is_some_and(|p| !p.is_empty())
        })
        .count()
}

/// What dubbo-go 3.3 does: `*bool` fields dereferenced without defaults (a missing `enabled` or
/// `force` is a nil dereference), condition rules need configVersion `^[Vv]\d+(\.\d+)*$`, and the
/// v3.0 condition path reads enabled from `force`; configurators' `enabled` is a plain bool.
fn go_applies_condition(body: &str) -> Result<bool, String> {
    let map = java_reads(body)?;
    let flag = |name: &str| map.get(name).and_then(|v| v.as_bool());
    let (Some(_enabled), Some(force)) = (flag("enabled"), flag("force")) else {
        return Err("nil pointer dereference".into());
    };
    let version = map
        .get("configVersion")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let valid = version.len() > 1
        && version.starts_with(['v', 'V'])
        && version[1..]
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !valid {
        return Err("rejected: configVersion".into());
    }
    Ok(force)
}

#[test]
fn java_and_go_read_what_we_write() {
    let tag = text(&rule(TAG_ROUTE));
    let map = java_reads(&tag).unwrap();
    assert_eq!(
        map.get("configVersion").and_then(|v| v.as_str()),
        Some("v3.0")
    );
    assert!(
        map.get("configVersion")
            .unwrap()
            .as_str()
            .unwrap()
            .starts_with("v3.0")
    );
    for flag in ["enabled", "force", "runtime"] {
        assert!(map.get(flag).and_then(|v| v.as_bool()).is_some(), "{flag}");
    }
    assert!(map.get("priority").and_then(|v| v.as_i64()).is_some());

    let condition = text(&rule(CONDITION_ROUTE));
    assert_eq!(go_applies_condition(&condition), Ok(true));
    // force: false is written as such; dubbo-go 3.3 then drops the rule (docs/zookeeper.md).
    let soft = text(&rule(
        &CONDITION_ROUTE.replace("force: true", "force: false"),
    ));
    assert_eq!(go_applies_condition(&soft), Ok(false));
    // An admin-0.6.0 body (no configVersion) is what dubbo-go refuses; ours never is.
    assert!(go_applies_condition("enabled: true\nforce: true\nconditions: []\n").is_err());

    let config = text(&rule(DYNAMIC_CONFIG));
    let map = java_reads(&config).unwrap();
    assert_eq!(java_items_applied(&map, "provider"), 1);
    assert_eq!(java_items_applied(&map, "consumer"), 1);
    assert_eq!(map.get("enabled").and_then(|v| v.as_bool()), Some(true));
    // Parameter values stay strings for both maps (Map<String,String>, map[string]string).
    assert!(config.contains("weight: '50'"));
}

#[test]
fn a_directorys_objects_say_so_and_read_back_the_same() {
    let rule = rule(TAG_ROUTE);
    let bytes = encode(&rule, Origin::Dir).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(
        text.starts_with("# dubbo-cp: TagRoute default/grey from rules-dir\n"),
        "{text}"
    );
    assert_eq!(origin_of(&bytes), Origin::Dir);
    assert_eq!(origin_of(&encode(&rule, Origin::Api).unwrap()), Origin::Api);
    assert_eq!(origin_of(b"tags: []"), Origin::Api);
    let back = decode_rule("default", "shop-provider.tag-router", &bytes)
        .unwrap()
        .unwrap();
    assert_eq!(back, rule);
}

#[test]
fn a_policy_body_carries_what_the_user_wrote_not_unset_defaults() {
    const POLICY: &str = "
apiVersion: dubbo.apache.org/v1alpha1
kind: AuthorizationPolicy
metadata: {name: callers, namespace: shop}
spec:
  action: ALLOW
  rules:
    - from: {namespaces: [a]}
";
    let written = text(&rule(POLICY));
    for unset in ["order", "samples", "matchType"] {
        assert!(!written.contains(unset), "{unset} in {written}");
    }
    let set = text(&rule(&format!("{POLICY}  samples: 50\n  order: 2\n")));
    assert!(set.contains("samples: 50"), "{set}");
    assert!(set.contains("order: 2"), "{set}");
}
