//! Rules in standalone mode: manifests applied through the admin API (as `dubbo-cp apply` does)
//! reach a subscribed discovery client exactly, edits replace them, deletions remove them;
//! invalid manifests are refused naming the field and store nothing; rules survive a restart.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Observer, http_get, http_send, start, test_config, type_of};
use dubbo_cp::pb::rules::{Tag, TagRoute, TagRouteToClient};
use dubbo_cp::rules::parse_manifests;
use prost::Message;

const TAG_ROUTE_V1: &str = "
apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata: {name: grey, namespace: demo}
spec:
  key: demo-provider
  configVersion: v3.0
  priority: 5
  force: true
  tags:
    - name: grey
      addresses: [10.0.0.1, 10.0.0.2]
";

const TAG_ROUTE_V2: &str = "
apiVersion: dubbo.apache.org/v1alpha1
kind: TagRoute
metadata: {name: grey, namespace: demo}
spec:
  key: demo-provider
  configVersion: v3.0
  tags:
    - name: grey
      addresses: [10.0.0.3]
";

/// Per kind: a first manifest and an edit of it.
fn manifests() -> Vec<(&'static str, String, String)> {
    // Auth policies in the root namespace: this client is anonymous (no authentication), and
    // policies of other namespaces reach only clients of those namespaces.
    let doc = |kind: &str, name: &str, spec: &str| {
        let namespace = if kind.ends_with("Policy") {
            "dubbo-system"
        } else {
            "demo"
        };
        format!(
            "apiVersion: dubbo.apache.org/v1alpha1\nkind: {kind}\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n{spec}"
        )
    };
    vec![
        ("TagRoute", TAG_ROUTE_V1.to_owned(), TAG_ROUTE_V2.to_owned()),
        (
            "ConditionRoute",
            doc(
                "ConditionRoute",
                "by-method",
                "  key: org.apache.dubbo.demo.DemoService\n  scope: service\n  configVersion: v3.0\n  conditions:\n    - method=sayHello & arguments[0]=x => host=10.0.0.1\n",
            ),
            doc(
                "ConditionRoute",
                "by-method",
                "  key: org.apache.dubbo.demo.DemoService\n  scope: service\n  configVersion: v3.0\n  conditions:\n    - method!=sayHello => host=10.0.0.2,10.0.0.3\n",
            ),
        ),
        (
            "DynamicConfig",
            doc(
                "DynamicConfig",
                "weights",
                "  key: demo-provider\n  scope: application\n  configVersion: v3.0\n  configs:\n    - side: provider\n      addresses: [10.0.0.1]\n      parameters: {weight: \"20\"}\n",
            ),
            doc(
                "DynamicConfig",
                "weights",
                "  key: demo-provider\n  scope: application\n  configVersion: v3.0\n  configs:\n    - side: provider\n      addresses: [10.0.0.1]\n      parameters: {weight: \"80\", timeout: \"3000\"}\n",
            ),
        ),
        (
            "AuthenticationPolicy",
            doc("AuthenticationPolicy", "strict", "  action: STRICT\n"),
            doc(
                "AuthenticationPolicy",
                "strict",
                "  action: PERMISSIVE\n  portLevel:\n    - {port: 20880, action: STRICT}\n",
            ),
        ),
        (
            "AuthorizationPolicy",
            doc(
                "AuthorizationPolicy",
                "allow-demo",
                "  action: ALLOW\n  rules:\n    - from: {namespaces: [demo]}\n",
            ),
            doc(
                "AuthorizationPolicy",
                "allow-demo",
                "  action: DENY\n  rules:\n    - from: {namespaces: [other]}\n",
            ),
        ),
    ]
}

/// The one object of a response, as the server would encode the manifest's rule.
fn expected_any(manifest: &str) -> prost_types::Any {
    let rules = parse_manifests(manifest).unwrap();
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    match &rule.spec {
        // An authorization policy outside the root namespace is sent as the reference does.
        dubbo_cp::rules::RuleSpec::AuthorizationPolicy(_) => {
            match dubbo_cp::index::catalog::change_for(rule, "dubbo-system") {
                dubbo_cp::index::Change::Scoped(key, value, _) => {
                    dubbo_cp::dds::encode::to_any(&key, &value)
                }
                other => panic!("unexpected change {other:?}"),
            }
        }
        _ => dubbo_cp::dds::rules::to_any(&rule.spec, &rule.client_key()),
    }
}

async fn apply(admin: std::net::SocketAddr, manifest: &str) -> serde_json::Value {
    let (status, body) = http_send(admin, "POST", "/api/v1/apply", manifest, None).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_applied_edited_and_deleted_on_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let admin = server.admin_addr;
    let mut observer = Observer::open(server.grpc_addr).await;

    for (kind, v1, v2) in manifests() {
        let ty = type_of(kind);
        observer.subscribe(&ty).await;
        let empty = observer.next().await;
        assert_eq!((empty.r#type.as_str(), empty.data.len()), (ty.as_str(), 0));
        observer.ack(&empty).await;

        let report = apply(admin, &v1).await;
        assert_eq!(
            report["created"].as_array().map(Vec::len),
            Some(1),
            "{report}"
        );
        let first = observer.next().await;
        assert_eq!(first.r#type, ty);
        assert!(first.revision > empty.revision);
        assert_eq!(
            first.data.decode().unwrap(),
            vec![expected_any(&v1)],
            "{kind}: first version"
        );
        observer.ack(&first).await;

        // The same manifest again changes nothing and pushes nothing.
        let report = apply(admin, &v1).await;
        assert_eq!(report["unchanged"].as_array().map(Vec::len), Some(1));

        let report = apply(admin, &v2).await;
        assert_eq!(report["configured"].as_array().map(Vec::len), Some(1));
        let second = observer.next().await;
        assert_eq!(
            second.r#type, ty,
            "the unchanged apply pushed nothing before the edit"
        );
        assert_eq!(
            second.data.decode().unwrap(),
            vec![expected_any(&v2)],
            "{kind}: edited"
        );
        assert!(second.revision > first.revision);
        observer.ack(&second).await;

        let (status, body) = http_send(admin, "POST", "/api/v1/delete", &v2, None).await;
        assert_eq!(status, 200, "{body}");
        let gone = observer.next().await;
        assert_eq!(
            (gone.r#type.as_str(), gone.data.len()),
            (ty.as_str(), 0),
            "{kind}: deleted"
        );
        observer.ack(&gone).await;
    }

    // The TagRoute decoded field by field against the generated message.
    apply(admin, TAG_ROUTE_V1).await;
    let tag_route = observer.next().await;
    let objects = tag_route.data.decode().unwrap();
    let decoded = TagRouteToClient::decode(objects[0].value.as_slice()).unwrap();
    assert_eq!(
        objects[0].type_url,
        "type.googleapis.com/dubbo.apache.org.v1alpha1.TagRouteToClient"
    );
    assert_eq!(
        decoded,
        TagRouteToClient {
            key: "grey/demo".into(),
            spec: Some(TagRoute {
                priority: 5,
                enabled: true,
                runtime: true,
                key: "demo-provider".into(),
                config_version: "v3.0".into(),
                force: true,
                tags: vec![Tag {
                    name: "grey".into(),
                    addresses: vec!["10.0.0.1".into(), "10.0.0.2".into()],
                    r#match: Vec::new(),
                }],
            }),
        }
    );

    // `get` reads what is served; rules survive a restart.
    let (status, body) = http_get(admin, "/api/v1/rules/tagroutes?namespace=demo").await;
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "grey");
    assert_eq!(
        list["items"][0]["spec"]["tags"][0]["addresses"][1],
        "10.0.0.2"
    );
    drop(observer);
    server.stop().await.unwrap();
    let server = start(test_config(dir.path())).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    observer.subscribe(&type_of("TagRoute")).await;
    let after = observer.next().await;
    assert_eq!(
        after.data.decode().unwrap(),
        vec![expected_any(TAG_ROUTE_V1)]
    );
    assert!(
        after.revision > tag_route.revision,
        "revisions go on rising"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_manifests_are_refused_naming_the_field_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(test_config(dir.path())).await;
    let admin = server.admin_addr;
    let head = |kind: &str| {
        format!(
            "apiVersion: dubbo.apache.org/v1alpha1\nkind: {kind}\nmetadata: {{name: x, namespace: demo}}\n"
        )
    };
    let cases = [
        (
            format!(
                "{}spec:\n  key: a\n  configVersion: v3.0\n  tags: [{{name: \"\"}}]\n",
                head("TagRoute")
            ),
            "spec.tags[0].name",
        ),
        (
            format!(
                "{}spec:\n  key: a\n  scope: service\n  configVersion: v3.0\n  conditions: [\"method=a => => host=b\"]\n",
                head("ConditionRoute")
            ),
            "spec.conditions[0]",
        ),
        (
            format!(
                "{}spec:\n  key: a\n  scope: everywhere\n  configVersion: v3.0\n  configs: [{{side: provider, parameters: {{weight: \"10\"}}}}]\n",
                head("DynamicConfig")
            ),
            "spec.scope",
        ),
        (
            format!(
                "{}spec:\n  action: STRICT\n  selector: [{{ipBlocks: [\"10.0.0.0/33\"]}}]\n",
                head("AuthenticationPolicy")
            ),
            "spec.selector[0].ipBlocks[0]",
        ),
        (
            format!(
                "{}spec:\n  action: ALLOW\n  samples: \"many\"\n",
                head("AuthorizationPolicy")
            ),
            "spec.samples",
        ),
    ];
    // A valid first document: all or nothing means it is not stored either.
    let valid = TAG_ROUTE_V1;
    for (manifest, field) in cases {
        let both = format!("{valid}\n---\n{manifest}");
        let (status, body) = http_send(admin, "POST", "/api/v1/apply", &both, None).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains(field), "{field} not named in {body}");
        assert!(body.contains("document 2"), "{body}");
    }
    for kind in [
        "tagroutes",
        "conditionroutes",
        "dynamicconfigs",
        "authenticationpolicies",
        "authorizationpolicies",
    ] {
        let (_, body) = http_get(admin, &format!("/api/v1/rules/{kind}")).await;
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            list["items"].as_array().map(Vec::len),
            Some(0),
            "{kind}: {body}"
        );
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_directory_is_applied_and_reloaded_and_a_broken_file_keeps_its_last_good_objects() {
    let dir = tempfile::tempdir().unwrap();
    let rules_dir = dir.path().join("rules");
    std::fs::create_dir(&rules_dir).unwrap();
    let file = rules_dir.join("grey.yaml");
    std::fs::write(&file, TAG_ROUTE_V1).unwrap();
    let mut config = test_config(&dir.path().join("data"));
    config.rules.dir = Some(rules_dir.clone());
    let server = start(config).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    let ty = type_of("TagRoute");
    observer.subscribe(&ty).await;
    // The directory may be applied just after the stream opens: wait for its object.
    let mut state = observer.next().await;
    while state.data.decode().unwrap() != vec![expected_any(TAG_ROUTE_V1)] {
        observer.ack(&state).await;
        state = observer.next().await;
    }
    observer.ack(&state).await;

    // An edit of the file is applied.
    std::fs::write(&file, TAG_ROUTE_V2).unwrap();
    let edited = observer.next().await;
    assert_eq!(
        edited.data.decode().unwrap(),
        vec![expected_any(TAG_ROUTE_V2)]
    );
    observer.ack(&edited).await;

    // A broken edit keeps the last good objects and is reported.
    std::fs::write(&file, "apiVersion: dubbo.apache.org/v1alpha1\nkind: TagRoute\nmetadata: {name: grey, namespace: demo}\nspec: {tags: 7}\n").unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, body) = http_get(server.admin_addr, "/debug/rules").await;
        if body.contains("grey.yaml") {
            assert!(
                body.contains("spec.tags"),
                "the error names the field: {body}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broken file never reported: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, body) = http_get(server.admin_addr, "/api/v1/rules/tagroutes").await;
    assert!(
        body.contains("10.0.0.3"),
        "the last good version is still served: {body}"
    );

    // Removing the file removes its objects.
    std::fs::remove_file(&file).unwrap();
    let gone = observer.next().await;
    assert_eq!(gone.data.len(), 0);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_the_rule_api_needs_an_admin_identity() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        "tokens:\n  - {token: admin-token, namespace: ops, identity: ops-admin}\n  - {token: app-token, namespace: demo}\n",
    )
    .unwrap();
    let mut config = test_config(&dir.path().join("data"));
    config.auth.token_file = Some(tokens);
    config.auth.admins = vec!["ops-admin".into()];
    let server = start(config).await;
    let admin = server.admin_addr;
    for (token, expected) in [(None, 401), (Some("wrong"), 401), (Some("app-token"), 403)] {
        let (status, body) = http_send(admin, "POST", "/api/v1/apply", TAG_ROUTE_V1, token).await;
        assert_eq!(status, expected, "{token:?}: {body}");
        let (status, _) = http_send(admin, "GET", "/api/v1/rules/tagroutes", "", token).await;
        assert_eq!(status, expected, "{token:?} reading");
    }
    let (status, body) = http_send(
        admin,
        "POST",
        "/api/v1/apply",
        TAG_ROUTE_V1,
        Some("admin-token"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_send(
        admin,
        "GET",
        "/api/v1/rules/tagroutes",
        "",
        Some("admin-token"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("grey"), "{body}");
    server.stop().await.unwrap();
}
