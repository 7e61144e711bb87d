//! Rules in Kubernetes mode against the API-server fixture: kubectl create/edit/delete reach
//! subscribed clients; an invalid object is skipped and reported while the rest of its kind
//! flows; auth policies reach exactly the clients they select.

// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::apiserver::ApiServer;
use common::sa_tokens::{Claims, Issuer};
use common::{Observer, channel, http_get, start, type_of, wait_ready};
use dubbo_cp::config::Config;
use prost::Message;
use serde_json::json;

fn config(dir: &std::path::Path, api: &ApiServer, authenticate: bool) -> Config {
    let mut config = common::kubernetes_config(dir, api.url());
    config.debounce.after = Duration::from_millis(10);
    config.debounce.max = Duration::from_millis(100);
    config.auth.token_review = Some(authenticate);
    config
}

/// The `key`s of the objects in a response.
fn keys(response: &dubbo_cp::dds::ObserveResponse) -> BTreeSet<String> {
    response
        .data
        .decode()
        .unwrap()
        .iter()
        .map(|any| dubbo_cp::resources::object_key(any).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_edits_of_rules_reach_clients_and_invalid_objects_are_skipped() {
    let api = ApiServer::start().await;
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "grey",
        json!({"key": "demo-provider", "configVersion": "v3.0", "tags": [{"name": "grey", "addresses": ["10.0.0.1"]}]}),
    );
    // Valid YAML the API server would refuse by schema, written here anyway: it must be skipped.
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "broken",
        json!({"key": "", "tags": "not-a-list"}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api, false)).await;
    wait_ready(server.admin_addr).await;

    let mut observer = Observer::open(server.grpc_addr).await;
    let ty = type_of("TagRoute");
    observer.subscribe(&ty).await;
    let first = observer.next().await;
    assert_eq!(keys(&first), BTreeSet::from(["grey/demo".to_string()]));
    let (_, debug) = http_get(server.admin_addr, "/debug/rules").await;
    let debug: serde_json::Value = serde_json::from_str(&debug).unwrap();
    assert_eq!(debug["invalid"][0]["name"], "broken", "{debug}");
    assert!(
        debug["invalid"][0]["error"]
            .as_str()
            .unwrap()
            .contains("spec."),
        "{debug}"
    );
    observer.ack(&first).await;

    // Edit: the new addresses arrive.
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "grey",
        json!({"key": "demo-provider", "configVersion": "v3.0", "tags": [{"name": "grey", "addresses": ["10.0.0.9"]}]}),
    );
    let edited = observer.next().await;
    let objects = edited.data.decode().unwrap();
    let decoded =
        dubbo_cp::pb::rules::TagRouteToClient::decode(objects[0].value.as_slice()).unwrap();
    assert_eq!(decoded.spec.unwrap().tags[0].addresses, vec!["10.0.0.9"]);
    observer.ack(&edited).await;

    // Repairing the broken object brings it in; deleting both empties the kind.
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "broken",
        json!({"key": "other", "configVersion": "v3.0", "tags": [{"name": "blue", "addresses": ["10.0.0.2"]}]}),
    );
    let repaired = observer.next().await;
    assert_eq!(keys(&repaired).len(), 2);
    observer.ack(&repaired).await;
    let (_, debug) = http_get(server.admin_addr, "/debug/rules").await;
    assert!(debug.contains("\"invalid\":[]"), "repaired: {debug}");

    // An edit that breaks an object takes it out and reports it.
    api.kubectl_apply_rule(
        "tagroutes",
        "TagRoute",
        "demo",
        "broken",
        json!({"tags": 7}),
    );
    let broken = observer.next().await;
    assert_eq!(keys(&broken), BTreeSet::from(["grey/demo".to_string()]));
    observer.ack(&broken).await;
    let (_, debug) = http_get(server.admin_addr, "/debug/rules").await;
    assert!(
        debug.contains("\"name\":\"broken\""),
        "broken by an edit: {debug}"
    );
    api.kubectl_delete_rule("tagroutes", "demo", "grey");
    api.kubectl_delete_rule("tagroutes", "demo", "broken");
    let mut last = observer.next().await;
    while !keys(&last).is_empty() {
        observer.ack(&last).await;
        last = observer.next().await;
    }
    // `get` reads what the watch serves.
    let (status, body) = http_get(server.admin_addr, "/api/v1/rules/tagroutes").await;
    assert_eq!(status, 200);
    assert!(body.contains("\"items\":[]"), "{body}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_policies_reach_exactly_the_clients_they_select() {
    let api = ApiServer::start().await;
    let issuer = Issuer::new("key-1");
    api.set_jwks(issuer.jwks.clone());
    api.put_pod("team-a", "a-1", "uid-a", json!({"app": "a"}), &["10.0.1.5"]);
    api.put_pod("team-b", "b-1", "uid-b", json!({"app": "b"}), &["10.0.2.5"]);
    let authn = |ns: &str, name: &str, spec: serde_json::Value| {
        api.kubectl_apply_rule(
            "authenticationpolicies",
            "AuthenticationPolicy",
            ns,
            name,
            spec,
        );
    };
    let root = "dubbo-system";
    authn(root, "everyone", json!({"action": "STRICT"}));
    authn("team-a", "own-namespace", json!({"action": "STRICT"}));
    authn(
        root,
        "ip",
        json!({"action": "STRICT", "selector": [{"ipBlocks": ["10.0.1.0/24"]}]}),
    );
    authn(
        root,
        "not-ip",
        json!({"action": "STRICT", "selector": [{"notIpBlocks": ["10.0.1.0/24"]}]}),
    );
    authn(
        root,
        "principal",
        json!({"action": "STRICT", "selector": [{"principals": ["cluster.local/ns/team-b/sa/b"]}]}),
    );
    authn(
        root,
        "not-principal",
        json!({"action": "STRICT", "selector": [{"notPrincipals": ["spiffe://cluster.local/ns/team-b/sa/b"]}]}),
    );
    authn(
        root,
        "label",
        json!({"action": "STRICT", "selector": [{"extends": [{"key": "kubernetesEnv.podLabels.app", "value": "a"}]}]}),
    );
    authn(
        root,
        "not-label",
        json!({"action": "STRICT", "selector": [{"notExtends": [{"key": "kubernetesEnv.podLabels.app", "value": "a"}]}]}),
    );
    authn(
        root,
        "namespace",
        json!({"action": "STRICT", "selector": [{"namespaces": ["team-b"]}]}),
    );
    authn(
        root,
        "not-namespace",
        json!({"action": "STRICT", "selector": [{"notNamespaces": ["team-b"]}]}),
    );
    let authz = |ns: &str, name: &str, spec: serde_json::Value| {
        api.kubectl_apply_rule(
            "authorizationpolicies",
            "AuthorizationPolicy",
            ns,
            name,
            spec,
        );
    };
    authz(
        root,
        "to-team-a",
        json!({"action": "ALLOW", "rules": [{"from": {"namespaces": ["x"]}, "to": {"namespaces": ["team-a"]}}]}),
    );
    authz("team-b", "no-rules", json!({"action": "DENY"}));

    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api, true)).await;
    wait_ready(server.admin_addr).await;
    let token_a = issuer.mint(&Claims::bound("team-a", "a", ("a-1", "uid-a")));
    let token_b = issuer.mint(&Claims::bound("team-b", "b", ("b-1", "uid-b")));
    let mut a = Observer::connect_as(channel(server.grpc_addr).await, Some(&token_a))
        .await
        .unwrap();
    let mut b = Observer::connect_as(channel(server.grpc_addr).await, Some(&token_b))
        .await
        .unwrap();
    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };

    for observer in [&a, &b] {
        observer.subscribe(&type_of("AuthenticationPolicy")).await;
    }
    assert_eq!(
        keys(&a.next().await),
        set(&[
            "everyone/dubbo-system",
            "own-namespace/team-a",
            "ip/dubbo-system",
            "not-principal/dubbo-system",
            "label/dubbo-system",
            "not-namespace/dubbo-system"
        ])
    );
    assert_eq!(
        keys(&b.next().await),
        set(&[
            "everyone/dubbo-system",
            "not-ip/dubbo-system",
            "principal/dubbo-system",
            "not-label/dubbo-system",
            "namespace/dubbo-system"
        ])
    );

    for observer in [&a, &b] {
        observer.subscribe(&type_of("AuthorizationPolicy")).await;
    }
    let for_a = a.next().await;
    assert_eq!(keys(&for_a), set(&["to-team-a/dubbo-system"]));
    let for_b = b.next().await;
    assert_eq!(keys(&for_b), set(&["no-rules/team-b"]));
    // What is sent carries no `to`, and a policy without rules is sent with one empty rule.
    let sent = dubbo_cp::pb::rules::AuthorizationPolicyToClient::decode(
        for_b.data.decode().unwrap()[0].value.as_slice(),
    )
    .unwrap();
    assert_eq!(sent.spec.unwrap().rules.len(), 1);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_kind_is_created_edited_and_deleted_through_the_api_server() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api, false)).await;
    wait_ready(server.admin_addr).await;
    let mut observer = Observer::open(server.grpc_addr).await;
    // (resource, kind, namespace, first spec, edited spec). Auth policies in the root namespace
    // reach this anonymous client.
    let cases = [
        (
            "tagroutes",
            "TagRoute",
            "demo",
            json!({"key": "p", "configVersion": "v3.0", "tags": [{"name": "g", "addresses": ["10.0.0.1"]}]}),
            json!({"key": "p", "configVersion": "v3.0", "tags": [{"name": "g", "addresses": ["10.0.0.2"]}]}),
        ),
        (
            "conditionroutes",
            "ConditionRoute",
            "demo",
            json!({"key": "I", "scope": "service", "configVersion": "v3.0", "conditions": ["method=a => host=10.0.0.1"]}),
            json!({"key": "I", "scope": "service", "configVersion": "v3.0", "conditions": ["method=b => host=10.0.0.1"]}),
        ),
        (
            "dynamicconfigs",
            "DynamicConfig",
            "demo",
            json!({"key": "p", "scope": "application", "configVersion": "v3.0", "configs": [{"side": "provider", "parameters": {"weight": "10"}}]}),
            json!({"key": "p", "scope": "application", "configVersion": "v3.0", "configs": [{"side": "provider", "parameters": {"weight": "90"}}]}),
        ),
        (
            "authenticationpolicies",
            "AuthenticationPolicy",
            "dubbo-system",
            json!({"action": "STRICT"}),
            json!({"action": "PERMISSIVE"}),
        ),
        (
            "authorizationpolicies",
            "AuthorizationPolicy",
            "dubbo-system",
            json!({"action": "ALLOW", "rules": [{"from": {"namespaces": ["a"]}}]}),
            json!({"action": "DENY", "rules": [{"from": {"namespaces": ["a"]}}]}),
        ),
    ];
    for (resource, kind, namespace, first, edited) in cases {
        let ty = type_of(kind);
        observer.subscribe(&ty).await;
        let empty = observer.next().await;
        assert_eq!(empty.data.len(), 0, "{kind}");
        observer.ack(&empty).await;
        for spec in [first, edited] {
            api.kubectl_apply_rule(resource, kind, namespace, "r", spec.clone());
            let manifest = json!({
                "apiVersion": "dubbo.apache.org/v1alpha1", "kind": kind,
                "metadata": {"name": "r", "namespace": namespace}, "spec": spec,
            });
            let rule = dubbo_cp::rules::parse_manifests(&manifest.to_string())
                .unwrap()
                .remove(0);
            let expected = match dubbo_cp::index::catalog::change_for(&rule, "dubbo-system") {
                dubbo_cp::index::Change::Upsert(key, value)
                | dubbo_cp::index::Change::Scoped(key, value, _) => {
                    dubbo_cp::dds::encode::to_any(&key, &value)
                }
                other => panic!("{other:?}"),
            };
            let response = observer.next().await;
            assert_eq!(response.r#type, ty);
            assert_eq!(response.data.decode().unwrap(), vec![expected], "{kind}");
            observer.ack(&response).await;
        }
        api.kubectl_delete_rule(resource, namespace, "r");
        let gone = observer.next().await;
        assert_eq!(
            (gone.r#type.as_str(), gone.data.len()),
            (ty.as_str(), 0),
            "{kind}"
        );
        observer.ack(&gone).await;
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_kind_whose_crd_is_missing_is_served_empty_and_picked_up_once_installed() {
    let api = ApiServer::start().await;
    api.set_missing("conditionroutes", true);
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api, false)).await;
    // Ready although one kind cannot be listed, and saying which CRD is missing and how to
    // install it.
    wait_ready(server.admin_addr).await;
    let (code, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(
            "ConditionRoute: CustomResourceDefinition conditionroutes.dubbo.apache.org is not \
             installed: install it with `kubectl apply -k deploy/`"
        ),
        "{body}"
    );
    let (_, sources) = http_get(server.admin_addr, "/debug/sources").await;
    let sources: serde_json::Value = serde_json::from_str(&sources).unwrap();
    let condition = sources
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "ConditionRoute")
        .unwrap();
    assert_eq!(condition["loaded"], true);
    assert!(
        condition["condition"]
            .as_str()
            .unwrap()
            .contains("not installed")
    );
    let mut observer = Observer::open(server.grpc_addr).await;
    let ty = type_of("ConditionRoute");
    observer.subscribe(&ty).await;
    let empty = observer.next().await;
    assert_eq!((empty.r#type.as_str(), empty.data.len()), (ty.as_str(), 0));
    observer.ack(&empty).await;
    // The CRD is installed and an object created: the watcher's retry picks it up.
    api.set_missing("conditionroutes", false);
    api.kubectl_apply_rule(
        "conditionroutes",
        "ConditionRoute",
        "demo",
        "r",
        json!({"key": "I", "scope": "service", "configVersion": "v3.0", "conditions": ["method=a => host=10.0.0.1"]}),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let found = loop {
        let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
        match observer.next_within(wait).await {
            Some(response) if keys(&response).contains("r/demo") => break true,
            Some(response) => observer.ack(&response).await,
            None => break false,
        }
    };
    assert!(
        found,
        "the object never arrived after the CRD was installed"
    );
    let (_, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(
        body, "ready\n",
        "the condition is over once the CRD is there"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_whose_watch_fails_holds_only_its_own_subscriptions() {
    let api = ApiServer::start().await;
    // As when RBAC does not let the control plane list a kind.
    api.set_failing("tagroutes", Some(403));
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &api, false)).await;
    // Mappings are served as soon as their list is in.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut observer = loop {
        match Observer::connect(channel(server.grpc_addr).await).await {
            Ok(observer) => break observer,
            Err(refused) => assert!(
                tokio::time::Instant::now() < deadline,
                "streams are still refused: {refused}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    observer.subscribe(&type_of("TagRoute")).await;
    observer.subscribe(&type_of("ServiceNameMapping")).await;
    let first = observer.next().await;
    assert_eq!(
        first.r#type,
        type_of("ServiceNameMapping"),
        "only the synced kind is answered"
    );
    observer.ack(&first).await;
    // Not ready, and /readyz says why.
    let (code, body) = http_get(server.admin_addr, "/readyz").await;
    assert_eq!(code, 503);
    assert!(
        body.contains("TagRoute: the watch of tagroutes.dubbo.apache.org is failing"),
        "{body}"
    );
    // A 403 names the RBAC fix.
    assert!(
        body.contains("get, list and watch") && body.contains("deploy/rbac.yaml"),
        "{body}"
    );
    // The kind's source recovers: its first answer comes, never an empty state before it.
    api.set_failing("tagroutes", None);
    let tags = observer
        .next_within(Duration::from_secs(60))
        .await
        .expect("the TagRoute subscription was never answered after recovery");
    assert_eq!(tags.r#type, type_of("TagRoute"));
    wait_ready(server.admin_addr).await;
    server.stop().await.unwrap();
}
