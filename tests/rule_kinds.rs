//! Per kind: a manifest -> RuleSpec -> `Any`, decoded against the generated message field by
//! field; invalid manifests refused with the field named; the CRDs and what they enforce.
// A test suite (moved out of src/rules): its helpers panic on what a test should never see.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use serde::Deserialize;
use serde_json::json;

use prost_types::Any;

use dubbo_cp::crds::crds;
use dubbo_cp::pb::rules as pb;
use dubbo_cp::rules::*;

/// What the discovery stream sends of a rule (its encoding lives with the stream).
trait RuleAny {
    fn to_any(&self) -> Any;
}

impl RuleAny for Rule {
    fn to_any(&self) -> Any {
        dubbo_cp::dds::rules::to_any(&self.spec, &self.client_key())
    }
}

trait SpecAny {
    fn to_any(&self, key: &str) -> Any;
}

impl SpecAny for RuleSpec {
    fn to_any(&self, key: &str) -> Any {
        dubbo_cp::dds::rules::to_any(self, key)
    }
}

fn one(text: &str) -> Rule {
    let mut rules = parse_manifests(text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rules.len(), 1);
    rules.remove(0)
}

fn refused(text: &str) -> String {
    match parse_manifests(text) {
        Ok(rules) => panic!("accepted: {rules:?}"),
        Err(err) => err.to_string(),
    }
}

/// Decodes `any` as `M` after checking its type URL, and checks that `M` re-encodes to exactly
/// the same bytes: nothing was sent that `M` does not hold.
fn decode<M: Message + Default>(any: &Any, kind: Kind) -> M {
    assert_eq!(any.type_url, dubbo_cp::dds::pb::type_url(kind));
    let message = M::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        message.encode_to_vec(),
        any.value,
        "bytes beyond the message"
    );
    message
}

fn round_trips(rule: &Rule) {
    assert_eq!(
        RuleSpec::parse(rule.kind(), &rule.spec.to_json()).as_ref(),
        Ok(&rule.spec),
        "to_json does not parse back to the same spec"
    );
    let again = one(&serde_yaml::to_string(&rule.to_manifest()).unwrap());
    assert_eq!(&again, rule, "to_manifest does not parse back");
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|s| s.to_string()).collect()
}

fn exact(value: &str) -> Option<pb::StringMatch> {
    Some(pb::StringMatch {
        exact: value.into(),
        ..Default::default()
    })
}

const TAG_ROUTE: &str = r#"
apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata:
  name: shop-grey
  namespace: demo
spec:
  key: shop-provider
  configVersion: v3.0
  priority: 3
  force: true
  tags:
    - name: grey
      match:
        - key: version
          value:
            exact: v2
        - key: zone
          value:
            wildcard: "hz-*"
    - name: canary
      addresses: ["10.0.0.7:20880", "10.0.0.8:20880"]
"#;

#[test]
fn tag_route_reaches_the_wire_field_by_field() {
    let rule = one(TAG_ROUTE);
    assert_eq!(
        (rule.namespace.as_str(), rule.name.as_str()),
        ("demo", "shop-grey")
    );
    assert_eq!(rule.kind(), Kind::TagRoute);
    let message: pb::TagRouteToClient = decode(&rule.to_any(), Kind::TagRoute);
    assert_eq!(message.key, "shop-grey/demo");
    let spec = message.spec.unwrap();
    assert_eq!(spec.priority, 3);
    assert!(spec.enabled, "enabled defaults to true, as in Dubbo");
    assert!(spec.runtime, "runtime defaults to true, as in Dubbo");
    assert_eq!(spec.key, "shop-provider");
    assert_eq!(spec.config_version, "v3.0");
    assert!(spec.force);
    assert_eq!(spec.tags.len(), 2);
    assert_eq!(spec.tags[0].name, "grey");
    assert!(spec.tags[0].addresses.is_empty());
    assert_eq!(
        spec.tags[0].r#match,
        vec![
            pb::ParamMatch {
                key: "version".into(),
                value: exact("v2"),
            },
            pb::ParamMatch {
                key: "zone".into(),
                value: Some(pb::StringMatch {
                    wildcard: "hz-*".into(),
                    ..Default::default()
                }),
            },
        ]
    );
    assert_eq!(spec.tags[1].name, "canary");
    assert_eq!(
        spec.tags[1].addresses,
        strings(&["10.0.0.7:20880", "10.0.0.8:20880"])
    );
    assert!(spec.tags[1].r#match.is_empty());
    round_trips(&rule);
}

const CONDITION_ROUTE: &str = r#"
apiVersion: dubbo.apache.org/v1alpha1
kind: ConditionRoute
metadata:
  name: comment-route
  namespace: demo
spec:
  key: org.apache.dubbo.samples.CommentService
  scope: service
  configVersion: v3.0
  force: true
  runtime: false
  enabled: false
  priority: -1
  conditions:
    - method=getComment => region=Hangzhou
    - >-
      method = sayHello & arguments[0] = x
      => host = 10.0.0.1
"#;

#[test]
fn condition_route_reaches_the_wire_field_by_field() {
    let rule = one(CONDITION_ROUTE);
    let message: pb::ConditionRouteToClient = decode(&rule.to_any(), Kind::ConditionRoute);
    assert_eq!(message.key, "comment-route/demo");
    let spec = message.spec.unwrap();
    assert_eq!(spec.priority, -1);
    assert!(!spec.enabled);
    assert!(spec.force);
    assert!(!spec.runtime);
    assert_eq!(spec.key, "org.apache.dubbo.samples.CommentService");
    assert_eq!(spec.scope, "service");
    // Conditions travel as written; clients parse them with the same grammar.
    assert_eq!(
        spec.conditions,
        strings(&[
            "method=getComment => region=Hangzhou",
            "method = sayHello & arguments[0] = x => host = 10.0.0.1",
        ])
    );
    assert_eq!(spec.config_version, "v3.0");
    round_trips(&rule);
}

const DYNAMIC_CONFIG: &str = r#"
apiVersion: dubbo.apache.org/v1alpha1
kind: DynamicConfig
metadata:
  name: shop-weight
  namespace: demo
spec:
  key: shop-provider
  scope: application
  configVersion: v3.0
  configs:
    - side: provider
      addresses: ["10.0.0.7:20880"]
      providerAddresses: ["10.0.0.9:20880"]
      applications: [shop-consumer]
      services: [org.apache.dubbo.samples.CommentService]
      type: weight
      parameters:
        weight: "20"
        timeout: "3000"
      match:
        address:
          cird: 10.0.0.0/8
        service:
          oneof:
            - prefix: org.apache.
            - regex: "^com\\.example\\..*"
        application:
          oneof:
            - exact: shop-consumer
        param:
          - key: region
            value:
              noempty: "true"
    - enabled: false
      parameters:
        retries: "0"
"#;

#[test]
fn dynamic_config_reaches_the_wire_field_by_field() {
    let rule = one(DYNAMIC_CONFIG);
    let message: pb::DynamicConfigToClient = decode(&rule.to_any(), Kind::DynamicConfig);
    assert_eq!(message.key, "shop-weight/demo");
    let spec = message.spec.unwrap();
    assert_eq!(spec.key, "shop-provider");
    assert_eq!(spec.scope, "application");
    assert_eq!(spec.config_version, "v3.0");
    assert!(spec.enabled);
    assert_eq!(spec.configs.len(), 2);
    let first = &spec.configs[0];
    assert_eq!(first.side, "provider");
    assert_eq!(first.addresses, strings(&["10.0.0.7:20880"]));
    assert_eq!(first.provider_addresses, strings(&["10.0.0.9:20880"]));
    assert_eq!(first.applications, strings(&["shop-consumer"]));
    assert_eq!(
        first.services,
        strings(&["org.apache.dubbo.samples.CommentService"])
    );
    assert_eq!(first.r#type, "weight");
    assert!(first.enabled);
    assert_eq!(first.parameters.len(), 2);
    assert_eq!(first.parameters["weight"], "20");
    assert_eq!(first.parameters["timeout"], "3000");
    assert_eq!(
        first.r#match,
        Some(pb::ConditionMatch {
            address: Some(pb::AddressMatch {
                cird: "10.0.0.0/8".into(),
                ..Default::default()
            }),
            service: Some(pb::ListStringMatch {
                oneof: vec![
                    pb::StringMatch {
                        prefix: "org.apache.".into(),
                        ..Default::default()
                    },
                    pb::StringMatch {
                        regex: r"^com\.example\..*".into(),
                        ..Default::default()
                    },
                ],
            }),
            application: Some(pb::ListStringMatch {
                oneof: vec![exact("shop-consumer").unwrap()],
            }),
            param: vec![pb::ParamMatch {
                key: "region".into(),
                value: Some(pb::StringMatch {
                    noempty: "true".into(),
                    ..Default::default()
                }),
            }],
        })
    );
    let second = &spec.configs[1];
    assert!(!second.enabled);
    assert_eq!(second.side, "");
    assert_eq!(second.parameters.len(), 1);
    assert_eq!(second.parameters["retries"], "0");
    assert_eq!(second.r#match, None);
    round_trips(&rule);
}

const AUTHENTICATION_POLICY: &str = r#"
apiVersion: dubbo.apache.org/v1alpha1
kind: AuthenticationPolicy
metadata:
  name: strict-mtls
  namespace: demo
spec:
  action: STRICT
  selector:
    - namespaces: [demo]
      notNamespaces: [demo-canary]
      ipBlocks: [10.0.0.0/8]
      notIpBlocks: [10.9.0.0/16]
      principals: [cluster.local/ns/demo/sa/shop]
      notPrincipals: ["spiffe://cluster.local/ns/demo/sa/debug"]
      extends:
        - key: kubernetesEnv.podLabels.app.kubernetes.io/name
          value: shop
      notExtends:
        - key: kubernetesEnv.podName
          value: shop-debug
  portLevel:
    - port: 20880
      action: PERMISSIVE
    - port: 22222
      action: DISABLED
"#;

#[test]
fn authentication_policy_reaches_the_wire_without_its_selectors() {
    let rule = one(AUTHENTICATION_POLICY);
    let RuleSpec::AuthenticationPolicy(parsed) = &rule.spec else {
        panic!("{:?}", rule.spec);
    };
    // The pipeline filters by the selectors: they are all there, in the spec.
    let selector = &parsed.selector[0];
    assert_eq!(selector.namespaces, strings(&["demo"]));
    assert_eq!(selector.not_namespaces, strings(&["demo-canary"]));
    assert_eq!(selector.ip_blocks, strings(&["10.0.0.0/8"]));
    assert_eq!(selector.not_ip_blocks, strings(&["10.9.0.0/16"]));
    assert_eq!(
        selector.principals,
        strings(&["cluster.local/ns/demo/sa/shop"])
    );
    assert_eq!(
        selector.not_principals,
        strings(&["spiffe://cluster.local/ns/demo/sa/debug"])
    );
    assert_eq!(
        selector.extends,
        vec![PolicyExtend {
            key: "kubernetesEnv.podLabels.app.kubernetes.io/name".into(),
            value: "shop".into()
        }]
    );
    assert_eq!(
        selector.not_extends,
        vec![PolicyExtend {
            key: "kubernetesEnv.podName".into(),
            value: "shop-debug".into()
        }]
    );
    // `decode` also proves the bytes hold nothing but action and ports: no selector.
    let message: pb::AuthenticationPolicyToClient =
        decode(&rule.to_any(), Kind::AuthenticationPolicy);
    assert_eq!(
        message,
        pb::AuthenticationPolicyToClient {
            key: "strict-mtls/demo".into(),
            spec: Some(pb::AuthenticationSpecToClient {
                action: "STRICT".into(),
                port_level: vec![
                    pb::AuthenticationPolicyPortLevel {
                        port: 20880,
                        action: "PERMISSIVE".into()
                    },
                    pb::AuthenticationPolicyPortLevel {
                        port: 22222,
                        action: "DISABLED".into()
                    },
                ],
            }),
        }
    );
    round_trips(&rule);
}

const SERVICE_ENTRY: &str = r#"
apiVersion: dubbo.apache.org/v1alpha1
kind: ServiceEntry
metadata:
  name: greeter
  namespace: demo
spec:
  hosts: [greeter, hello.demo.svc.cluster.local]
  ports:
    - {number: 50051, name: grpc, protocol: GRPC}
  resolution: STATIC
  location: MESH_INTERNAL
  endpoints:
    - {address: 10.0.0.11, weight: 80, locality: eu/west-1a}
    - {address: "fd00::12", ports: {grpc: 50052}, labels: {version: v2}}
"#;

const AUTHORIZATION_POLICY: &str = r#"
apiVersion: dubbo.apache.org/v1alpha1
kind: AuthorizationPolicy
metadata:
  name: shop-callers
  namespace: demo
spec:
  action: DENY
  matchType: ALL_MATCH
  samples: 50
  order: 1.5
  rules:
    - from:
        namespaces: [prod]
        ipBlocks: ["fd00::/8"]
        notPrincipals: [cluster.local/ns/prod/sa/batch]
        extends:
          - key: spiffeID
            value: spiffe://cluster.local/ns/prod/sa/web
        notExtends:
          - key: kubernetesEnv.podAnnotations.tier
            value: debug
      to:
        namespaces: [demo]
        extends:
          - key: kubernetesEnv.podLabels.app
            value: shop
      when:
        key: method
        values:
          - type: equals
            value: getItem
        notValues:
          - value: deleteItem
    - to:
        principals: [cluster.local/ns/demo/sa/shop]
"#;

#[test]
fn a_service_entry_is_services_for_xds_and_round_trips() {
    let rule = one(SERVICE_ENTRY);
    let RuleSpec::ServiceEntry(entry) = &rule.spec else {
        panic!("{:?}", rule.spec);
    };
    let services = entry.services(&rule.namespace);
    let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["greeter", "hello"]);
    assert_eq!(services[0].endpoints.len(), 2);
    assert_eq!(
        services[0].endpoints[1].weight, 100,
        "Istio's absent weight"
    );
    // What `get -o yaml` prints, `apply` takes back unchanged.
    assert_eq!(
        RuleSpec::parse(Kind::ServiceEntry, &rule.spec.to_json()),
        Ok(rule.spec.clone())
    );
    // Hosts name services of the entry's own namespace.
    let elsewhere = SERVICE_ENTRY.replace("namespace: demo", "namespace: prod");
    assert_eq!(
        refused(&elsewhere),
        "document 1 (ServiceEntry prod/greeter): spec.hosts[1]: names namespace \"demo\", but the \
         entry is in namespace \"prod\": an entry declares services in its own namespace (got \
         \"hello.demo.svc.cluster.local\")"
    );
}

#[test]
fn authorization_policy_reaches_the_wire_without_its_targets() {
    let rule = one(AUTHORIZATION_POLICY);
    let RuleSpec::AuthorizationPolicy(parsed) = &rule.spec else {
        panic!("{:?}", rule.spec);
    };
    // The pipeline filters by every rule's `to`: it is there, in the spec.
    assert_eq!(
        parsed.rules[0].to,
        Some(PolicySelector {
            namespaces: strings(&["demo"]),
            extends: vec![PolicyExtend {
                key: "kubernetesEnv.podLabels.app".into(),
                value: "shop".into()
            }],
            ..Default::default()
        })
    );
    assert_eq!(
        parsed.rules[1].to.as_ref().map(|to| to.principals.clone()),
        Some(strings(&["cluster.local/ns/demo/sa/shop"]))
    );
    let message: pb::AuthorizationPolicyToClient =
        decode(&rule.to_any(), Kind::AuthorizationPolicy);
    assert_eq!(
        message,
        pb::AuthorizationPolicyToClient {
            key: "shop-callers/demo".into(),
            spec: Some(pb::AuthorizationPolicySpecToClient {
                action: "DENY".into(),
                rules: vec![
                    pb::AuthorizationPolicyRuleToClient {
                        from: Some(pb::AuthorizationPolicySource {
                            namespaces: strings(&["prod"]),
                            not_namespaces: vec![],
                            ip_blocks: strings(&["fd00::/8"]),
                            not_ip_blocks: vec![],
                            principals: vec![],
                            not_principals: strings(&["cluster.local/ns/prod/sa/batch"]),
                            extends: vec![pb::AuthorizationPolicyExtend {
                                key: "spiffeID".into(),
                                value: "spiffe://cluster.local/ns/prod/sa/web".into(),
                            }],
                            not_extends: vec![pb::AuthorizationPolicyExtend {
                                key: "kubernetesEnv.podAnnotations.tier".into(),
                                value: "debug".into(),
                            }],
                        }),
                        when: Some(pb::AuthorizationPolicyCondition {
                            key: "method".into(),
                            values: vec![pb::AuthorizationPolicyMatch {
                                r#type: "equals".into(),
                                value: "getItem".into(),
                            }],
                            not_values: vec![pb::AuthorizationPolicyMatch {
                                r#type: String::new(),
                                value: "deleteItem".into(),
                            }],
                        }),
                    },
                    // The second rule had only a `to`: an empty rule goes out.
                    pb::AuthorizationPolicyRuleToClient {
                        from: None,
                        when: None,
                    },
                ],
                samples: 50.0,
                order: 1.5,
                match_type: "ALL_MATCH".into(),
            }),
        }
    );
    round_trips(&rule);
}

#[test]
fn stripping_keeps_everything_but_the_selectors() {
    // The same policy with and without selectors / `to` encodes to the same bytes.
    let RuleSpec::AuthenticationPolicy(mut authn) = one(AUTHENTICATION_POLICY).spec else {
        panic!("not an authentication policy");
    };
    let with = RuleSpec::AuthenticationPolicy(authn.clone()).to_any("k/ns");
    authn.selector.clear();
    assert_eq!(RuleSpec::AuthenticationPolicy(authn).to_any("k/ns"), with);

    let RuleSpec::AuthorizationPolicy(mut authz) = one(AUTHORIZATION_POLICY).spec else {
        panic!("not an authorization policy");
    };
    let with = RuleSpec::AuthorizationPolicy(authz.clone()).to_any("k/ns");
    for rule in &mut authz.rules {
        rule.to = None;
    }
    assert_eq!(
        RuleSpec::AuthorizationPolicy(authz.clone()).to_any("k/ns"),
        with
    );
    // ... but a change elsewhere shows.
    authz.rules[0].when = None;
    assert_ne!(RuleSpec::AuthorizationPolicy(authz).to_any("k/ns"), with);
}

/// `spec` of `manifest` with `edit` applied, as a new manifest.
fn edited(manifest: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut value: serde_json::Value = serde_yaml::from_str(manifest).unwrap();
    edit(&mut value["spec"]);
    serde_yaml::to_string(&value).unwrap()
}

#[test]
fn an_invalid_manifest_of_each_kind_is_refused_with_the_field_named() {
    let cases = [
        (
            edited(TAG_ROUTE, |s| s["tags"][1]["name"] = json!("")),
            r#"document 1 (TagRoute demo/shop-grey): spec.tags[1].name: must not be empty (got "")"#,
        ),
        (
            edited(CONDITION_ROUTE, |s| {
                s["conditions"][1] = json!("method= => host=10.0.0.1")
            }),
            r#"document 1 (ConditionRoute demo/comment-route): spec.conditions[1]: `=` is not followed by a key or value at column 7 (got "method= => host=10.0.0.1")"#,
        ),
        (
            edited(DYNAMIC_CONFIG, |s| {
                s["configs"][0]["parameters"]["weight"] = json!("1000001")
            }),
            r#"document 1 (DynamicConfig demo/shop-weight): spec.configs[0].parameters.weight: must be an integer from 0 to 1000000 (got "1000001")"#,
        ),
        (
            edited(AUTHENTICATION_POLICY, |s| {
                s["selector"][0]["ipBlocks"][0] = json!("10.0.0.1")
            }),
            r#"document 1 (AuthenticationPolicy demo/strict-mtls): spec.selector[0].ipBlocks[0]: must be a CIDR block such as 10.0.0.0/8 (a single address is 10.0.0.1/32) (got "10.0.0.1")"#,
        ),
        (
            edited(AUTHORIZATION_POLICY, |s| s["action"] = json!("PERMIT")),
            r#"document 1 (AuthorizationPolicy demo/shop-callers): spec.action: must be one of ALLOW, DENY, ADULT (got "PERMIT")"#,
        ),
    ];
    for (manifest, expected) in cases {
        assert_eq!(refused(&manifest), expected);
    }
}

/// Parses `spec` as `kind` and returns the error as text.
fn spec_error(kind: Kind, spec: serde_json::Value) -> String {
    match RuleSpec::parse(kind, &spec) {
        Ok(parsed) => panic!("accepted: {parsed:?}"),
        Err(err) => err.to_string(),
    }
}

fn tag_route(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut spec = json!({"key": "app", "configVersion": "v3.0", "tags": [{"name": "a", "addresses": ["10.0.0.1:20880"]}]});
    edit(&mut spec);
    spec
}

fn condition_route(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut spec = json!({"key": "app", "scope": "application", "configVersion": "v3.0", "conditions": ["=> host=a"]});
    edit(&mut spec);
    spec
}

fn dynamic_config(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut spec = json!({"key": "app", "scope": "application", "configVersion": "v3.0", "configs": [{"parameters": {"timeout": "100"}}]});
    edit(&mut spec);
    spec
}

#[test]
fn type_errors_unknown_and_missing_fields_name_the_path() {
    for (kind, spec, expected) in [
        (
            Kind::TagRoute,
            tag_route(|s| s["priority"] = json!("high")),
            r#"spec.priority: invalid type: string "high", expected i32"#,
        ),
        (
            Kind::TagRoute,
            tag_route(|s| s["priority"] = json!(3_000_000_000u64)),
            "spec.priority: invalid value: integer `3000000000`, expected i32",
        ),
        (
            Kind::TagRoute,
            tag_route(|s| s["tags"][0]["nmae"] = json!("x")),
            "spec.tags[0].nmae: unknown field `nmae`, expected one of `name`, `addresses`, `match`",
        ),
        (
            Kind::TagRoute,
            tag_route(|s| {
                s.as_object_mut().unwrap().remove("key");
            }),
            "spec: missing field `key`",
        ),
        (
            Kind::TagRoute,
            tag_route(|s| s["tags"] = json!({"name": "a"})),
            "spec.tags: invalid type: map, expected a sequence",
        ),
        (
            Kind::DynamicConfig,
            dynamic_config(|s| s["configs"][0]["parameters"]["weight"] = json!(50)),
            "spec.configs[0].parameters.weight: invalid type: integer `50`, expected a string",
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "samples": "all"}),
            r#"spec.samples: invalid type: string "all", expected f32"#,
        ),
        (Kind::TagRoute, json!(null), "spec: is required"),
        (
            Kind::ConditionRoute,
            json!(["=> host=a"]),
            "spec: must be an object (got a list)",
        ),
        (
            Kind::TagRoute,
            tag_route(|s| {
                s["tags"] = json!([{"name": "a", "match": [{"key": "v", "value": ["v2"]}]}])
            }),
            "spec.tags[0].match[0].value: must be an object (got a list)",
        ),
        (
            Kind::DynamicConfig,
            dynamic_config(|s| s["configs"][0]["match"] = json!("10.0.0.0/8")),
            "spec.configs[0].match: must be an object (got a string)",
        ),
        (
            Kind::ServiceNameMapping,
            json!({}),
            "kind: ServiceNameMapping is not a rule kind: applications register mappings",
        ),
    ] {
        assert_eq!(spec_error(kind, spec), expected);
    }
}

#[test]
fn tag_route_rules() {
    for (spec, expected) in [
        (
            tag_route(|s| s["key"] = json!("my app")),
            r#"spec.key: must not contain whitespace (got "my app")"#,
        ),
        (
            tag_route(|s| s["configVersion"] = json!("v3")),
            r#"spec.configVersion: must be one of v3.0, v2.7 (got "v3")"#,
        ),
        (
            tag_route(|s| s["tags"] = json!([])),
            "spec.tags: at least one tag is required",
        ),
        (
            tag_route(|s| {
                s["tags"] =
                    json!([{"name": "a", "addresses": ["x"]}, {"name": "a", "addresses": ["y"]}])
            }),
            r#"spec.tags[1].name: is already the name of an earlier tag (got "a")"#,
        ),
        (
            tag_route(|s| s["tags"] = json!([{"name": "a"}])),
            "spec.tags[0]: set addresses or match: a tag with neither selects no instance",
        ),
        (
            tag_route(|s| s["tags"][0]["match"] = json!([{"key": "v", "value": {"exact": "1"}}])),
            "spec.tags[0]: set either addresses or match, not both (Dubbo ignores match then)",
        ),
        (
            tag_route(|s| {
                s["configVersion"] = json!("v2.7");
                s["tags"] =
                    json!([{"name": "a", "match": [{"key": "v", "value": {"exact": "1"}}]}]);
            }),
            r#"spec.tags[0].match: needs configVersion v3.0 (older versions ignore it) (got "v2.7")"#,
        ),
        (
            tag_route(|s| s["tags"][0]["addresses"] = json!([""])),
            r#"spec.tags[0].addresses[0]: must not be empty (got "")"#,
        ),
        (
            tag_route(|s| s["tags"] = json!([{"name": "a", "match": [{"key": "v", "value": {}}]}])),
            "spec.tags[0].match[0].value: exactly one of exact, prefix, regex, noempty, empty, \
             wildcard must be set to a non-empty value (got none)",
        ),
        (
            tag_route(
                |s| s["tags"] = json!([{"name": "a", "match": [{"key": "v", "value": {"exact": "1", "prefix": "2"}}]}]),
            ),
            "spec.tags[0].match[0].value: exactly one of exact, prefix, regex, noempty, empty, \
             wildcard must be set to a non-empty value (got exact, prefix)",
        ),
        (
            tag_route(|s| {
                s["tags"] =
                    json!([{"name": "a", "match": [{"key": "v", "value": {"regex": "v(1"}}]}])
            }),
            r#"spec.tags[0].match[0].value.regex: is not a valid regular expression: error: unclosed group (got "v(1")"#,
        ),
        (
            tag_route(|s| {
                s["tags"] = json!([{"name": "a", "match": [{"key": "", "value": {"exact": "1"}}]}])
            }),
            r#"spec.tags[0].match[0].key: must not be empty (got "")"#,
        ),
    ] {
        assert_eq!(spec_error(Kind::TagRoute, spec), expected);
    }
}

#[test]
fn condition_route_rules() {
    for (spec, expected) in [
        (
            condition_route(|s| s["scope"] = json!("global")),
            r#"spec.scope: must be one of service, application (got "global")"#,
        ),
        (
            condition_route(|s| s["configVersion"] = json!("v3.1")),
            r#"spec.configVersion: v3.1 conditions are objects, which the discovery stream cannot carry; use v3.0 (got "v3.1")"#,
        ),
        (
            condition_route(|s| s["conditions"] = json!([])),
            "spec.conditions: at least one condition is required",
        ),
        (
            condition_route(|s| s["conditions"] = json!(["=> host=a", "a=1 => b=2 => c=3"])),
            r#"spec.conditions[1]: `=>` may appear only once at column 12 (got "a=1 => b=2 => c=3")"#,
        ),
        (
            condition_route(|s| s["conditions"] = json!(["method => host=a"])),
            r#"spec.conditions[0]: `method` has no value (write `method=value` or `method!=value`) at column 1 (got "method => host=a")"#,
        ),
    ] {
        assert_eq!(spec_error(Kind::ConditionRoute, spec), expected);
    }
    // Both sides optional, as in Dubbo.
    for condition in ["host=10.0.0.1", "=> host=10.0.0.1", "method=sayHello =>"] {
        let spec = condition_route(|s| s["conditions"] = json!([condition]));
        assert!(
            RuleSpec::parse(Kind::ConditionRoute, &spec).is_ok(),
            "{condition}"
        );
    }
}

#[test]
fn dynamic_config_rules() {
    for (spec, expected) in [
        (
            dynamic_config(|s| s["configs"][0]["parameters"] = json!({})),
            "spec.configs[0].parameters: at least one parameter is required",
        ),
        (
            dynamic_config(|s| s["configs"][0]["parameters"]["weight"] = json!("-1")),
            r#"spec.configs[0].parameters.weight: must be an integer from 0 to 1000000 (got "-1")"#,
        ),
        (
            dynamic_config(|s| s["configs"][0]["parameters"]["weight"] = json!("+50")),
            r#"spec.configs[0].parameters.weight: must be an integer from 0 to 1000000 (got "+50")"#,
        ),
        (
            dynamic_config(|s| s["configs"][0]["parameters"]["weight"] = json!("12.5")),
            r#"spec.configs[0].parameters.weight: must be an integer from 0 to 1000000 (got "12.5")"#,
        ),
        (
            dynamic_config(|s| s["configs"][0]["parameters"]["timeout"] = json!("3s")),
            r#"spec.configs[0].parameters.timeout: must be an integer from 0 to 2147483647 (got "3s")"#,
        ),
        (
            dynamic_config(|s| s["configs"][0]["parameters"][""] = json!("1")),
            r#"spec.configs[0].parameters: must not be empty (got "")"#,
        ),
        (
            dynamic_config(|s| s["configs"][0]["side"] = json!("server")),
            r#"spec.configs[0].side: must be one of provider, consumer (got "server")"#,
        ),
        (
            dynamic_config(|s| s["configs"][0]["type"] = json!("heavy")),
            r#"spec.configs[0].type: must be one of general, weight, balancing, disabled (got "heavy")"#,
        ),
        (
            dynamic_config(|s| {
                s["configs"][0]["match"] = json!({"address": {"cird": "10.0.0.0/40"}})
            }),
            r#"spec.configs[0].match.address.cird: the prefix length must be a number from 0 to 32 (got "10.0.0.0/40")"#,
        ),
        (
            dynamic_config(|s| {
                s["configs"][0]["match"] =
                    json!({"address": {"cird": "10.0.0.0/8", "exact": "10.0.0.1"}})
            }),
            "spec.configs[0].match.address: exactly one of wildcard, cird, exact must be set (got 2)",
        ),
        (
            dynamic_config(|s| s["configs"][0]["match"] = json!({"service": {"oneof": []}})),
            "spec.configs[0].match.service.oneof: at least one match is required",
        ),
        (
            dynamic_config(|s| s["configs"] = json!([])),
            "spec.configs: at least one config is required",
        ),
    ] {
        assert_eq!(spec_error(Kind::DynamicConfig, spec), expected);
    }
    for weight in ["0", "100", "37"] {
        let spec = dynamic_config(|s| s["configs"][0]["parameters"]["weight"] = json!(weight));
        assert!(
            RuleSpec::parse(Kind::DynamicConfig, &spec).is_ok(),
            "{weight}"
        );
    }
}

#[test]
fn auth_policy_rules() {
    for (kind, spec, expected) in [
        (
            Kind::AuthenticationPolicy,
            json!({"action": "strict"}),
            r#"spec.action: must be one of NONE, DISABLED, PERMISSIVE, STRICT (got "strict")"#,
        ),
        (
            Kind::AuthenticationPolicy,
            json!({"action": "STRICT", "portLevel": [{"port": 0, "action": "STRICT"}]}),
            r#"spec.portLevel[0].port: must be a port from 1 to 65535 (got "0")"#,
        ),
        (
            Kind::AuthenticationPolicy,
            json!({"action": "STRICT", "portLevel": [{"port": 80, "action": "STRICT"}, {"port": 80, "action": "NONE"}]}),
            r#"spec.portLevel[1].port: is already given by an earlier entry (got "80")"#,
        ),
        (
            Kind::AuthenticationPolicy,
            json!({"action": "STRICT", "selector": [{"namespaces": ["Demo"]}]}),
            r#"spec.selector[0].namespaces[0]: must be a namespace name (lower-case letters, digits and '-', at most 63) (got "Demo")"#,
        ),
        (
            Kind::AuthenticationPolicy,
            json!({"action": "STRICT", "selector": [{"notIpBlocks": ["10.0.0.0/8", "fd00::/200"]}]}),
            r#"spec.selector[0].notIpBlocks[1]: the prefix length must be a number from 0 to 128 (got "fd00::/200")"#,
        ),
        (
            Kind::AuthenticationPolicy,
            json!({"action": "STRICT", "selector": [{"principals": [""]}]}),
            r#"spec.selector[0].principals[0]: must not be empty (got "")"#,
        ),
        (
            Kind::AuthenticationPolicy,
            json!({"action": "STRICT", "selector": [{"extends": [{"key": "kubernetesEnv.labels.app", "value": "x"}]}]}),
            r#"spec.selector[0].extends[0].key: must be id, ips, spiffeID, kubernetesEnv.namespace, kubernetesEnv.podName, kubernetesEnv.podLabels.<label> or kubernetesEnv.podAnnotations.<annotation> (got "kubernetesEnv.labels.app")"#,
        ),
        (
            Kind::AuthenticationPolicy,
            json!({"action": "STRICT", "selector": [{"notExtends": [{"key": "kubernetesEnv.podLabels", "value": "x"}]}]}),
            r#"spec.selector[0].notExtends[0].key: must be id, ips, spiffeID, kubernetesEnv.namespace, kubernetesEnv.podName, kubernetesEnv.podLabels.<label> or kubernetesEnv.podAnnotations.<annotation> (got "kubernetesEnv.podLabels")"#,
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "samples": 101}),
            r#"spec.samples: must be a percentage from 0 to 100 (got "101")"#,
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "order": 1e39}),
            r#"spec.order: must be a finite number (got "inf")"#,
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "matchType": "SOME_MATCH"}),
            r#"spec.matchType: must be one of ANY_MATCH, ALL_MATCH (got "SOME_MATCH")"#,
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "rules": [{"to": {"ipBlocks": ["10.0.0.0"]}}]}),
            r#"spec.rules[0].to.ipBlocks[0]: must be a CIDR block such as 10.0.0.0/8 (a single address is 10.0.0.1/32) (got "10.0.0.0")"#,
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "rules": [{"from": {"notNamespaces": ["-x"]}}]}),
            r#"spec.rules[0].from.notNamespaces[0]: must be a namespace name (lower-case letters, digits and '-', at most 63) (got "-x")"#,
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "rules": [{"when": {"key": " ", "values": [{"value": "x"}]}}]}),
            r#"spec.rules[0].when.key: must not be empty (got " ")"#,
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "ALLOW", "rules": [{"when": {"key": "method", "notValues": [{"type": "equals", "value": ""}]}}]}),
            r#"spec.rules[0].when.notValues[0].value: must not be empty (got "")"#,
        ),
    ] {
        assert_eq!(spec_error(kind, spec), expected);
    }
    // A policy may be just an action; an authorization policy without rules is namespace-wide.
    for kind in [Kind::AuthenticationPolicy, Kind::AuthorizationPolicy] {
        let action = if kind == Kind::AuthenticationPolicy {
            "PERMISSIVE"
        } else {
            "ALLOW"
        };
        assert!(RuleSpec::parse(kind, &json!({"action": action})).is_ok());
    }
}

#[test]
fn manifests_hold_many_documents_and_lists() {
    let text = format!(
        "{TAG_ROUTE}---\n# only a comment\n---\n{CONDITION_ROUTE}\n---\napiVersion: v1\nkind: List\nitems:\n{}",
        [
            DYNAMIC_CONFIG,
            AUTHENTICATION_POLICY,
            AUTHORIZATION_POLICY,
            SERVICE_ENTRY
        ]
        .iter()
        .map(|doc| {
            let value: serde_json::Value = serde_yaml::from_str(doc).unwrap();
            format!("  - {}\n", serde_json::to_string(&value).unwrap())
        })
        .collect::<String>()
    );
    let rules = parse_manifests(&text).unwrap();
    let kinds: Vec<Kind> = rules.iter().map(Rule::kind).collect();
    assert_eq!(kinds, RULE_KINDS);
    // An error in a List names the document and the item.
    let broken = text.replace("\"action\":\"DENY\"", "\"action\":\"NO\"");
    assert_eq!(
        refused(&broken),
        r#"document 4 (AuthorizationPolicy demo/shop-callers): items[2].spec.action: must be one of ALLOW, DENY, ADULT (got "NO")"#
    );
    // JSON is YAML too.
    let json_text = serde_json::to_string(&one(TAG_ROUTE).to_manifest()).unwrap();
    assert_eq!(one(&json_text), one(TAG_ROUTE));
    assert_eq!(parse_manifests("").unwrap(), vec![]);
}

#[test]
fn manifest_envelopes_are_checked() {
    let tag = |apply: &dyn Fn(&mut serde_json::Value)| {
        let mut value: serde_json::Value = serde_yaml::from_str(TAG_ROUTE).unwrap();
        apply(&mut value);
        serde_yaml::to_string(&value).unwrap()
    };
    let cases: Vec<(String, &str)> = vec![
        (
            tag(&|v| v["apiVersion"] = json!("dubbo.apache.org/v1")),
            r#"document 1: apiVersion: must be dubbo.apache.org/v1alpha1 (got "dubbo.apache.org/v1")"#,
        ),
        (
            tag(&|v| v["kind"] = json!("ServiceNameMapping")),
            r#"document 1: kind: must be one of TagRoute, ConditionRoute, DynamicConfig, AuthenticationPolicy, AuthorizationPolicy, ServiceEntry (got "ServiceNameMapping")"#,
        ),
        (
            tag(&|v| v["kind"] = json!("Tagroute")),
            r#"document 1: kind: must be one of TagRoute, ConditionRoute, DynamicConfig, AuthenticationPolicy, AuthorizationPolicy, ServiceEntry (got "Tagroute")"#,
        ),
        (
            tag(&|v| {
                v.as_object_mut().unwrap().remove("kind");
            }),
            "document 1: kind: is required",
        ),
        (
            tag(&|v| {
                v["metadata"].as_object_mut().unwrap().remove("name");
            }),
            "document 1: metadata.name: is required",
        ),
        (
            tag(&|v| v["metadata"]["name"] = json!("Shop_Grey")),
            r#"document 1: metadata.name: must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 (got "Shop_Grey")"#,
        ),
        (
            tag(&|v| v["metadata"]["namespace"] = json!(7)),
            "document 1: metadata.namespace: must be a string (got 7)",
        ),
        (
            tag(&|v| v["metadata"]["namespace"] = json!("a.b")),
            r#"document 1: metadata.namespace: must be a namespace name (lower-case letters, digits and '-', at most 63) (got "a.b")"#,
        ),
        (
            tag(&|v| v["status"] = json!({})),
            "document 1: status: unknown field (expected apiVersion, kind, metadata, spec)",
        ),
        (
            tag(&|v| {
                v.as_object_mut().unwrap().remove("spec");
            }),
            "document 1 (TagRoute demo/shop-grey): spec: is required",
        ),
        (
            format!("{TAG_ROUTE}---\n{TAG_ROUTE}"),
            "document 2 (TagRoute demo/shop-grey): metadata.name: the same object is already defined in document 1",
        ),
        (
            "- a\n- b\n".to_owned(),
            "document 1: must be an object with apiVersion, kind, metadata and spec",
        ),
        (
            "apiVersion: v1\nkind: List\n".to_owned(),
            "document 1: items: a List needs a list of items",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(refused(&text), expected);
    }
    let syntax = refused(&format!("{TAG_ROUTE}---\nkey: [unclosed\n"));
    assert!(
        syntax.starts_with("document 2: not valid YAML: "),
        "{syntax}"
    );
    // Without a namespace, the default; the same name in two namespaces is two objects.
    let no_namespace = tag(&|v| {
        v["metadata"].as_object_mut().unwrap().remove("namespace");
    });
    assert_eq!(one(&no_namespace).namespace, DEFAULT_NAMESPACE);
    assert_eq!(
        parse_manifests_in(&no_namespace, "team-a").unwrap()[0].namespace,
        "team-a"
    );
    assert_eq!(
        parse_manifests(&format!("{TAG_ROUTE}---\n{no_namespace}")).map(|r| r.len()),
        Ok(2)
    );
}

#[test]
fn crds_match_the_wire_contract() {
    let crds = crds();
    assert_eq!(crds.len(), RULE_KINDS.len());
    for (crd, kind) in crds.iter().zip(RULE_KINDS) {
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{}.dubbo.apache.org", kind.plural()).as_str())
        );
        assert_eq!(crd.spec.group, "dubbo.apache.org");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, kind.name());
        assert_eq!(crd.spec.names.plural, kind.plural());
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["dubbo".to_string()]),
            "`kubectl get dubbo` lists every rule"
        );
        assert_eq!(crd.spec.versions.len(), 1);
        assert_eq!(crd.spec.versions[0].name, "v1alpha1");
        assert_eq!(Kind::from_name(kind.name()), Some(kind));
    }
    let columns = |kind: Kind| -> Vec<String> {
        crds[RULE_KINDS.iter().position(|k| *k == kind).unwrap()]
            .spec
            .versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.json_path.clone())
            .collect()
    };
    assert_eq!(
        columns(Kind::TagRoute),
        [
            ".spec.key",
            ".spec.enabled",
            ".spec.tags[*].name",
            ".spec.priority",
            ".metadata.creationTimestamp"
        ]
    );
    assert_eq!(
        columns(Kind::ConditionRoute)[..3],
        [".spec.key", ".spec.scope", ".spec.enabled"]
    );
    assert_eq!(
        columns(Kind::DynamicConfig)[..3],
        [".spec.key", ".spec.scope", ".spec.enabled"]
    );
    assert_eq!(columns(Kind::AuthenticationPolicy)[0], ".spec.action");
    assert_eq!(columns(Kind::AuthorizationPolicy)[0], ".spec.action");
}

/// The `openAPIV3Schema` of `kind`'s spec, as JSON.
fn spec_schema(kind: Kind) -> serde_json::Value {
    let crd = &crds()[RULE_KINDS.iter().position(|k| *k == kind).unwrap()];
    let schema = crd.spec.versions[0].schema.as_ref().unwrap();
    serde_json::to_value(schema.open_api_v3_schema.as_ref().unwrap()).unwrap()["properties"]["spec"]
        .clone()
}

#[test]
fn schemas_type_every_field_so_the_api_server_refuses_wrong_types() {
    let tag = spec_schema(Kind::TagRoute);
    let props = &tag["properties"];
    assert_eq!(props["priority"]["type"], "integer");
    assert_eq!(props["enabled"]["type"], "boolean");
    assert_eq!(props["enabled"]["default"], true);
    assert_eq!(props["key"]["minLength"], 1);
    assert_eq!(props["configVersion"]["enum"], json!(["v3.0", "v2.7"]));
    assert_eq!(props["tags"]["type"], "array");
    assert_eq!(props["tags"]["minItems"], 1);
    let tag_item = &props["tags"]["items"];
    assert_eq!(tag_item["properties"]["name"]["minLength"], 1);
    assert_eq!(
        tag_item["properties"]["addresses"]["items"]["type"],
        "string"
    );
    let string_match = &tag_item["properties"]["match"]["items"]["properties"]["value"];
    assert_eq!(string_match["properties"]["regex"]["type"], "string");
    // "Exactly one" is structural: no CEL cost.
    assert_eq!(string_match["minProperties"], 1);
    assert_eq!(string_match["maxProperties"], 1);
    let required = |schema: &serde_json::Value| -> Vec<String> {
        serde_json::from_value(schema["required"].clone()).unwrap_or_default()
    };
    assert_eq!(required(&tag), ["configVersion", "key", "tags"]);

    let condition = spec_schema(Kind::ConditionRoute);
    assert_eq!(
        condition["properties"]["scope"]["enum"],
        json!(["service", "application"])
    );
    assert_eq!(
        condition["properties"]["conditions"]["items"]["minLength"],
        1
    );
    assert_eq!(
        required(&condition),
        ["conditions", "configVersion", "key", "scope"]
    );

    let dynamic = spec_schema(Kind::DynamicConfig);
    let config = &dynamic["properties"]["configs"]["items"]["properties"];
    assert_eq!(
        config["parameters"]["additionalProperties"]["type"],
        "string"
    );
    assert_eq!(config["parameters"]["minProperties"], 1);
    assert!(
        config["parameters"]["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("int(self.weight) <= 100")
    );
    assert_eq!(config["enabled"]["default"], true);

    let authn = spec_schema(Kind::AuthenticationPolicy);
    let port = &authn["properties"]["portLevel"]["items"]["properties"]["port"];
    assert_eq!(
        (port["minimum"].as_f64(), port["maximum"].as_f64()),
        (Some(1.0), Some(65535.0))
    );
    let selector = &authn["properties"]["selector"]["items"]["properties"];
    for field in [
        "namespaces",
        "notNamespaces",
        "ipBlocks",
        "notIpBlocks",
        "principals",
        "notPrincipals",
    ] {
        assert_eq!(selector[field]["items"]["type"], "string", "{field}");
    }
    assert_eq!(
        selector["extends"]["items"]["properties"]["key"]["minLength"],
        1
    );
    assert_eq!(required(&authn), ["action"]);

    let authz = spec_schema(Kind::AuthorizationPolicy);
    assert_eq!(authz["properties"]["samples"]["type"], "number");
    assert_eq!(
        authz["properties"]["action"]["enum"],
        json!(["ALLOW", "DENY", "ADULT"])
    );
    let rule = &authz["properties"]["rules"]["items"]["properties"];
    assert_eq!(
        rule["to"]["properties"]["ipBlocks"]["items"]["type"],
        "string"
    );
    assert_eq!(
        rule["when"]["properties"]["values"]["items"]["properties"]["value"]["minLength"],
        1
    );
}

/// Rules are people's: the control plane reads them, and writes only DynamicConfigs (a
/// canary's weights, `<canary>-canary`; the canary controller never touches another's).
#[test]
fn rbac_lets_the_control_plane_read_rules_and_write_only_a_canarys_rules() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let role = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap())
        .find(|doc| doc["kind"] == "ClusterRole")
        .unwrap();
    for kind in RULE_KINDS {
        let verbs: Vec<&serde_json::Value> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| {
                rule["resources"]
                    .as_array()
                    .is_some_and(|r| r.contains(&json!(kind.plural())))
            })
            .map(|rule| &rule["verbs"])
            .collect();
        // The canary controller writes its weights and its A/B routes.
        let expected = if kind == Kind::DynamicConfig || kind == Kind::ConditionRoute {
            json!(["get", "list", "watch", "create", "update", "delete"])
        } else {
            json!(["get", "list", "watch"])
        };
        assert_eq!(verbs, [&expected], "{}", kind.name());
    }
}

#[test]
fn the_same_rule_always_encodes_to_the_same_bytes() {
    // The index skips an object whose `Any` is unchanged; a map in random order would defeat it.
    let rule = one(DYNAMIC_CONFIG);
    let first = rule.to_any();
    for _ in 0..20 {
        assert_eq!(one(DYNAMIC_CONFIG).to_any(), first);
    }
}

/// The CRDs' CEL rules (`x-kubernetes-validations`), evaluated as an API server would.
mod cel {
    use kube::core::cel::{CompiledSchema, ScopeContext, Validator, WarningKind, analyze_rule};

    use super::*;

    fn root_schema(kind: Kind) -> serde_json::Value {
        let crd = &crds()[RULE_KINDS.iter().position(|k| *k == kind).unwrap()];
        let schema = crd.spec.versions[0].schema.as_ref().unwrap();
        serde_json::to_value(schema.open_api_v3_schema.as_ref().unwrap()).unwrap()
    }

    /// Every rule of every node of `schema`, with the node it sits on.
    fn rules_of<'a>(schema: &'a CompiledSchema, out: &mut Vec<(String, &'a CompiledSchema)>) {
        for rule in schema.validations.iter().flatten() {
            out.push((rule.rule.rule.clone(), schema));
        }
        for child in schema
            .properties
            .values()
            .chain(schema.items.as_deref())
            .chain(schema.additional_properties.as_deref())
        {
            rules_of(child, out);
        }
    }

    #[test]
    fn every_rule_compiles_and_stays_within_the_cost_budget() {
        let mut distinct = std::collections::BTreeSet::new();
        for kind in RULE_KINDS {
            let compiled = kube::core::cel::compile_schema(&root_schema(kind));
            let mut rules = Vec::new();
            rules_of(&compiled, &mut rules);
            fn errors(schema: &CompiledSchema) -> usize {
                schema.compilation_errors().len()
                    + schema.properties.values().map(errors).sum::<usize>()
                    + schema.items.as_deref().map_or(0, errors)
                    + schema.additional_properties.as_deref().map_or(0, errors)
            }
            assert_eq!(errors(&compiled), 0, "{}", kind.name());
            for (rule, node) in &rules {
                let costly: Vec<_> = analyze_rule(rule, node, ScopeContext::CrdValidation)
                    .into_iter()
                    .filter(|w| w.kind == WarningKind::CostExceeded)
                    .collect();
                assert!(costly.is_empty(), "{}: {costly:?}", kind.name());
            }
            distinct.extend(rules.into_iter().map(|(rule, _)| rule));
        }
        // TagRouteSpec, OverrideConfig.parameters (StringMatch, AddressMatch and Tag say theirs
        // structurally): a rule added or lost shows here, so the tests below keep covering each.
        assert_eq!(distinct.len(), 2, "{distinct:#?}");
    }

    /// The CEL failures of `manifest` (a full object), as messages.
    fn cel_failures(manifest: &str) -> Vec<String> {
        let object: serde_json::Value = serde_yaml::from_str(manifest).unwrap();
        let kind = Kind::from_name(object["kind"].as_str().unwrap()).unwrap();
        match Validator::new().validate(&root_schema(kind), &object, None) {
            Ok(()) => vec![],
            Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
        }
    }

    #[test]
    fn the_examples_pass_every_rule() {
        for manifest in [
            TAG_ROUTE,
            CONDITION_ROUTE,
            DYNAMIC_CONFIG,
            AUTHENTICATION_POLICY,
            AUTHORIZATION_POLICY,
            SERVICE_ENTRY,
        ] {
            assert_eq!(cel_failures(manifest), Vec::<String>::new(), "{manifest}");
        }
    }

    /// What the schema refuses structurally (the API server's structural checks, which the
    /// standalone validator runs from the same schema), as messages.
    fn structural_failures(manifest: &str) -> Vec<String> {
        let object: serde_json::Value = serde_yaml::from_str(manifest).unwrap();
        let kind = Kind::from_name(object["kind"].as_str().unwrap()).unwrap();
        let schema = dubbo_cp::rules::spec_schema(kind).unwrap();
        match dubbo_cp::rules::schema::check(
            schema,
            &object["spec"],
            "spec",
            dubbo_cp::rules::schema::Depth::Full,
        ) {
            Ok(()) => vec![],
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn the_api_server_refuses_what_the_schema_can_say() {
        let exactly_one =
            "must have at most 1 of empty, exact, noempty, prefix, regex, wildcard set (got 2)";
        for (manifest, expected) in [
            (
                edited(TAG_ROUTE, |s| {
                    s["tags"][0]["match"][0]["value"] = json!({"exact": "v2", "prefix": "v"})
                }),
                format!("spec.tags[0].match[0].value: {exactly_one}"),
            ),
            (
                edited(TAG_ROUTE, |s| s["tags"][0]["match"][0]["value"] = json!({})),
                "spec.tags[0].match[0].value: must have at least 1 field(s) set (got 0)".to_owned(),
            ),
            (
                edited(TAG_ROUTE, |s| {
                    s["tags"][1]["match"] = s["tags"][0]["match"].clone()
                }),
                "spec.tags[1]: set exactly one of addresses, match (got 2)".to_owned(),
            ),
            (
                edited(TAG_ROUTE, |s| {
                    s["tags"][1].as_object_mut().unwrap().remove("addresses");
                }),
                "spec.tags[1]: set exactly one of addresses, match (got 0)".to_owned(),
            ),
            (
                edited(DYNAMIC_CONFIG, |s| {
                    s["configs"][0]["match"]["address"] =
                        json!({"cird": "10.0.0.0/8", "exact": "10.0.0.1"})
                }),
                "spec.configs[0].match.address: must have at most 1 of cird, exact, wildcard set (got 2)".to_owned(),
            ),
        ] {
            assert_eq!(structural_failures(&manifest), [expected], "{manifest}");
            assert_eq!(cel_failures(&manifest), Vec::<String>::new(), "no CEL cost for these");
        }
        for (manifest, expected) in [
            (
                edited(TAG_ROUTE, |s| s["configVersion"] = json!("v2.7")),
                "tags[].match needs configVersion v3.0 (older versions ignore it)",
            ),
            (
                edited(DYNAMIC_CONFIG, |s| {
                    s["configs"][0]["parameters"]["weight"] = json!("1000001")
                }),
                "weight must be an integer from 0 to 1000000",
            ),
        ] {
            assert_eq!(cel_failures(&manifest), [expected], "{manifest}");
        }
        // A weight that is not a number fails the rule too (its int() errors).
        let not_a_number = edited(DYNAMIC_CONFIG, |s| {
            s["configs"][0]["parameters"]["weight"] = json!("heavy")
        });
        assert_eq!(cel_failures(&not_a_number).len(), 1);
        let no_weight = edited(DYNAMIC_CONFIG, |s| {
            s["configs"][0]["parameters"] = json!({"timeout": "10"})
        });
        assert_eq!(cel_failures(&no_weight), Vec::<String>::new());
    }
}

#[test]
fn the_examples_in_docs_rules_md_are_valid() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/rules.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut kinds = Vec::new();
    for block in text.split("```yaml\n").skip(1) {
        let body = block.split("```").next().unwrap();
        // The envelope sketch, not an object.
        if body.contains("  ...") {
            continue;
        }
        let rules = parse_manifests(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
        kinds.extend(rules.iter().map(Rule::kind));
    }
    assert_eq!(kinds, RULE_KINDS, "one worked example per kind, in order");
}
