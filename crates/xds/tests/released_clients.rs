//! Released xDS clients, grpcio (Python) and @grpc/grpc-js-xds (Node.js), routed by what the
//! server pushes, proven by real traffic: backends on loopback answer their names, and the
//! client counts who answered. Each scenario runs once per client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/released.rs"]
mod released;
mod support;

use released::{Proc, Released, answers, assert_split, backend, count, count_with, settle};
use tokio::io::AsyncWriteExt;

fn bootstrap(server: &support::Server) -> String {
    serde_json::json!({
        "xds_servers": [{
            "server_uri": server.addr.to_string(),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"],
        }],
        // grpc-js-xds refuses a bootstrap without a locality.
        "node": {"id": "released-client-test", "locality": {}},
    })
    .to_string()
}

/// A client process calling `target` through the xDS server.
fn client(kind: Released, server: &support::Server, target: &str) -> Proc {
    released::client_with(kind, target, bootstrap(server))
}

async fn endpoint_weights_split_traffic_and_shifts_move_it_without_a_failed_call(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    server.publish(vec![support::greeter(
        "default",
        &[(port_a, 80), (port_b, 20)],
    )]);
    let mut client = client(kind, &server, "xds:///greeter:7070");
    // The first call waits for the configuration, so every call counted ran on it. With 2,000
    // calls an 80/20 split lands within 5 points except with probability about 2e-8.
    assert_split(&count(&mut client, 2000).await, 80);

    // 0/100: a weight of 0 takes no traffic. Counted once the client acknowledged it and b
    // answered 100 calls in a row (under 80/20 that happens with probability 1e-70).
    let version = server.publish(vec![support::greeter(
        "default",
        &[(port_a, 0), (port_b, 100)],
    )]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "b", 100, "").await;
    let counts = count(&mut client, 2000).await;
    assert_eq!(answers(&counts, "b"), 2000, "all to b: {counts}");

    // 50/50, pushed once 300 of 3,000 calls are done: none of them fails across the switch.
    client
        .stdin
        .write_all(b"count 3000 running\n")
        .await
        .unwrap();
    assert_eq!(client.line().await, "running");
    let version = server.publish(vec![support::greeter(
        "default",
        &[(port_a, 50), (port_b, 50)],
    )]);
    let during: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(
        answers(&during, "a") + answers(&during, "b"),
        3000,
        "no call failed across the switch: {during}"
    );
    // The first 300 ran on 0/100; a answering some of the rest shows the switch came mid-run.
    assert!(
        answers(&during, "b") >= 300 && answers(&during, "a") > 0,
        "the switch landed while calls ran: {during}"
    );
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "a", 1, "").await;
    assert_split(&count(&mut client, 2000).await, 50);
    drop(client.child.start_kill());
}

fn tag_route(force: bool, gray: &[String]) -> dubbo_cp_domain::rules::TagRouteSpec {
    serde_json::from_value(serde_json::json!({
        "key": "greeter", "configVersion": "v3.0", "force": force,
        "tags": [{"name": "gray", "addresses": gray}],
    }))
    .unwrap()
}

async fn a_tag_route_sends_tagged_calls_to_its_endpoints_with_dubbos_fallback(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_g, port_g) = backend(kind, "g").await;
    let server = support::Server::start().await;
    let greeter = support::greeter("default", &[(port_a, 1), (port_g, 1)]);
    let gray = vec![format!("127.0.0.1:{port_g}")];
    server.publish_with_tags(vec![greeter.clone()], vec![tag_route(false, &gray)]);
    let mut client = client(kind, &server, "xds:///greeter:7070");
    let only = |counts: &serde_json::Value, who: &str, n: u64| {
        assert_eq!(answers(counts, who), n, "{counts}");
    };
    // Tagged calls reach the tagged endpoint; untagged ones never do.
    only(
        &count_with(&mut client, 200, "dubbo-tag=gray").await,
        "g",
        200,
    );
    only(&count(&mut client, 200).await, "a", 200);
    // Tags compare exactly, as in Dubbo: GRAY is a tag nobody has.
    only(
        &count_with(&mut client, 100, "dubbo-tag=GRAY").await,
        "a",
        100,
    );
    // A tag nobody has falls back to the untagged endpoints, unless the call forces it.
    only(
        &count_with(&mut client, 200, "dubbo-tag=blue").await,
        "a",
        200,
    );
    let forced = count_with(&mut client, 50, "dubbo-tag=blue dubbo-force-tag=true").await;
    only(&forced, "error", 50);

    // The gray address gone: without force, gray calls fall back to the endpoints in no tag,
    // which g now is too (the rule no longer lists it); with force they fail.
    let gone = vec!["127.0.0.1:1".to_string()];
    let version = server.publish_with_tags(vec![greeter.clone()], vec![tag_route(false, &gone)]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "a", 1, "dubbo-tag=gray").await;
    let fallback = count_with(&mut client, 200, "dubbo-tag=gray").await;
    assert_eq!(
        answers(&fallback, "a") + answers(&fallback, "g"),
        200,
        "{fallback}"
    );
    assert!(
        answers(&fallback, "a") > 0 && answers(&fallback, "g") > 0,
        "{fallback}"
    );
    let version = server.publish_with_tags(vec![greeter], vec![tag_route(true, &gone)]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "error", 1, "dubbo-tag=gray").await;
    only(
        &count_with(&mut client, 50, "dubbo-tag=gray").await,
        "error",
        50,
    );
    drop(client.child.start_kill());
}

async fn a_dubbo_interface_name_reaches_the_applications_its_mapping_lists(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    server.publish_with_mappings(
        vec![
            support::app_service("greeter-svc", "greeter", port_a),
            support::app_service("billing-svc", "billing", port_b),
        ],
        vec![("org.example.Shared", vec!["greeter", "billing"])],
    );
    // An application name: that application's services.
    let mut by_application = client(kind, &server, "xds:///greeter");
    let counts = count(&mut by_application, 200).await;
    assert_eq!(answers(&counts, "a"), 200, "{counts}");
    // An interface served by two applications of one endpoint each: an even split.
    let mut by_interface = client(kind, &server, "xds:///org.example.Shared:7070");
    assert_split(&count(&mut by_interface, 2000).await, 50);
    drop(by_application.child.start_kill());
    drop(by_interface.child.start_kill());
}

/// An interface served by two applications: `greeter` (a, and g, which its TagRoute tags gray)
/// and `billing` (b, and l, statically tagged blue). Dubbo's tag routing holds over all four at
/// once: a tag reaches its endpoints in either application, and only a tag nobody has falls
/// back, to the endpoints in no tag of both.
async fn tag_routes_hold_across_the_applications_of_an_interface(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_g, port_g) = backend(kind, "g").await;
    let (_b, port_b) = backend(kind, "b").await;
    let (_l, port_l) = backend(kind, "l").await;
    let mut greeter = support::app_service("greeter-svc", "greeter", port_a);
    greeter.endpoints = support::greeter("default", &[(port_a, 1), (port_g, 1)]).endpoints;
    let mut billing = support::app_service("billing-svc", "billing", port_b);
    billing.endpoints = support::greeter("default", &[(port_b, 1), (port_l, 1)]).endpoints;
    billing.endpoints[1]
        .labels
        .insert("dubbo.tag".into(), "blue".into());
    let server = support::Server::start().await;
    let publish = |gray: &[String], force: bool| {
        server.publish_with_mappings_and_tags(
            vec![greeter.clone(), billing.clone()],
            vec![("org.example.Shared", vec!["greeter", "billing"])],
            vec![tag_route(force, gray)],
        )
    };
    publish(&[format!("127.0.0.1:{port_g}")], false);
    let mut client = client(kind, &server, "xds:///org.example.Shared:7070");
    let only = |counts: &serde_json::Value, who: &[&str], n: u64| {
        let reached: u64 = who.iter().map(|w| answers(counts, w)).sum();
        assert_eq!(reached, n, "only {who:?}: {counts}");
        for w in who {
            assert!(answers(counts, w) > 0, "{w} reached: {counts}");
        }
    };
    // A tag reaches its endpoints, whichever application holds them.
    only(
        &count_with(&mut client, 200, "dubbo-tag=gray").await,
        &["g"],
        200,
    );
    only(
        &count_with(&mut client, 200, "dubbo-tag=blue").await,
        &["l"],
        200,
    );
    // No tag: the endpoints in no tag, of both applications.
    only(&count(&mut client, 400).await, &["a", "b"], 400);
    // A tag nobody has falls back to those, unless the call forces it.
    only(
        &count_with(&mut client, 400, "dubbo-tag=red").await,
        &["a", "b"],
        400,
    );
    let forced = count_with(&mut client, 50, "dubbo-tag=red dubbo-force-tag=true").await;
    only(&forced, &["error"], 50);
    only(
        &count_with(&mut client, 100, "dubbo-tag=blue dubbo-force-tag=true").await,
        &["l"],
        100,
    );

    // The gray address gone: gray calls fall back to both applications' untagged endpoints
    // (g is in no tag now); with the rule forcing gray, they fail.
    let gone = vec!["127.0.0.1:1".to_string()];
    let version = publish(&gone, false);
    server.acked(dubbo_cp_xds::ROUTE, &version).await;
    settle(&mut client, "b", 1, "dubbo-tag=gray").await;
    only(
        &count_with(&mut client, 600, "dubbo-tag=gray").await,
        &["a", "g", "b"],
        600,
    );
    let version = publish(&gone, true);
    server.acked(dubbo_cp_xds::ROUTE, &version).await;
    settle(&mut client, "error", 1, "dubbo-tag=gray").await;
    only(
        &count_with(&mut client, 50, "dubbo-tag=gray").await,
        &["error"],
        50,
    );
    drop(client.child.start_kill());
}

fn dynamic_config(overrides: serde_json::Value) -> dubbo_cp_domain::rules::DynamicConfigSpec {
    serde_json::from_value(serde_json::json!({
        "key": "greeter", "scope": "application", "configVersion": "v3.0",
        "configs": overrides,
    }))
    .unwrap()
}

async fn dynamic_config_weights_and_disabled_instances_move_traffic(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    // Both at Dubbo's default weight, b overridden to 25 by address: 100/25 is 80/20.
    let greeter = support::greeter("default", &[(port_a, 100), (port_b, 100)]);
    let b = format!("127.0.0.1:{port_b}");
    server.publish_with_configs(
        vec![greeter.clone()],
        vec![dynamic_config(serde_json::json!([
            {"side": "provider", "addresses": [b], "parameters": {"weight": "25"}},
        ]))],
    );
    let mut client = client(kind, &server, "xds:///greeter:7070");
    assert_split(&count(&mut client, 2000).await, 80);
    // b disabled: no call reaches it once the client applied the version.
    let version = server.publish_with_configs(
        vec![greeter],
        vec![dynamic_config(serde_json::json!([
            {"addresses": [b], "parameters": {"disabled": "true"}},
        ]))],
    );
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "a", 100, "").await;
    let counts = count(&mut client, 1000).await;
    assert_eq!(answers(&counts, "a"), 1000, "{counts}");
    drop(client.child.start_kill());
}

fn condition_route(
    force: bool,
    conditions: &[String],
) -> dubbo_cp_domain::rules::ConditionRouteSpec {
    serde_json::from_value(serde_json::json!({
        "key": "greeter", "scope": "application", "configVersion": "v3.0", "force": force,
        "conditions": conditions,
    }))
    .unwrap()
}

async fn a_condition_route_sends_matching_calls_to_the_endpoints_it_selects(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    let greeter = support::greeter("default", &[(port_a, 1), (port_b, 1)]);
    // By metadata (Dubbo's attachment), then by method (the path's last part), in order.
    server.publish_with_conditions(
        vec![greeter.clone()],
        vec![condition_route(
            false,
            &[
                format!("attachments[x-user]=vip => port={port_a}"),
                format!("attachments[x-env]!=test & method=Who => address=127.0.0.1:{port_b}"),
            ],
        )],
    );
    let mut client = client(kind, &server, "xds:///greeter:7070");
    let counts = count_with(&mut client, 200, "x-user=vip").await;
    assert_eq!(answers(&counts, "a"), 200, "{counts}");
    // `x-env!=test` holds for a call that sends no x-env, as in Dubbo.
    let counts = count(&mut client, 200).await;
    assert_eq!(answers(&counts, "b"), 200, "{counts}");
    // A call that matches no condition reaches every endpoint.
    let counts = count_with(&mut client, 200, "x-env=test").await;
    assert_eq!(
        answers(&counts, "a") + answers(&counts, "b"),
        200,
        "{counts}"
    );
    assert!(
        answers(&counts, "a") > 0 && answers(&counts, "b") > 0,
        "{counts}"
    );

    // A condition that leaves nobody is ignored, as Dubbo ignores it without force...
    let nobody = vec!["method=Who => port=1".to_string()];
    let version = server
        .publish_with_conditions(vec![greeter.clone()], vec![condition_route(false, &nobody)]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "a", 1, "").await;
    let counts = count(&mut client, 200).await;
    assert_eq!(
        answers(&counts, "a") + answers(&counts, "b"),
        200,
        "{counts}"
    );
    assert!(
        answers(&counts, "a") > 0 && answers(&counts, "b") > 0,
        "{counts}"
    );
    // ...and refuses the call with force.
    let version =
        server.publish_with_conditions(vec![greeter], vec![condition_route(true, &nobody)]);
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    settle(&mut client, "error", 1, "").await;
    let counts = count(&mut client, 50).await;
    assert_eq!(answers(&counts, "error"), 50, "{counts}");
    drop(client.child.start_kill());
}

/// A service-scoped ConditionRoute applies to its interface's calls (the clients call
/// `dubbo.test.Echo`) on the applications its mapping lists, before their own rules; one for
/// another interface (which comes first: it sorts first) applies to none of them.
async fn a_service_scoped_condition_route_applies_to_its_interfaces_calls(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    let greeter = support::greeter("default", &[(port_a, 1), (port_b, 1)]);
    let scoped = |interface: &str, port: u16| -> dubbo_cp_domain::rules::ConditionRouteSpec {
        serde_json::from_value(serde_json::json!({
            "key": interface, "scope": "service", "configVersion": "v3.0",
            "conditions": [format!("method=Who => port={port}")],
        }))
        .unwrap()
    };
    let publish = |rules: Vec<dubbo_cp_domain::rules::ConditionRouteSpec>| {
        let mappings = ["dubbo.test.Echo", "a.example.Other"]
            .map(|interface| {
                (
                    "default".to_string(),
                    interface.to_string(),
                    vec!["greeter".to_string()],
                )
            })
            .to_vec();
        let rules = rules
            .into_iter()
            .map(|r| ("default".to_string(), r))
            .collect();
        server.publish_with(vec![greeter.clone()], |snapshot| {
            snapshot
                .with_mappings(mappings)
                .with_condition_routes(rules)
        })
    };
    let application = condition_route(false, &[format!("=> port={port_b}")]);
    publish(vec![
        scoped("a.example.Other", port_b),
        scoped("dubbo.test.Echo", port_a),
        application.clone(),
    ]);
    let mut client = client(kind, &server, "xds:///greeter:7070");
    let counts = count(&mut client, 200).await;
    assert_eq!(answers(&counts, "a"), 200, "{counts}");
    // Without it, the other interface's rule matches no call: the application's decides.
    let version = publish(vec![scoped("a.example.Other", port_a), application]);
    server.acked(dubbo_cp_xds::ROUTE, &version).await;
    settle(&mut client, "b", 1, "").await;
    let counts = count(&mut client, 200).await;
    assert_eq!(answers(&counts, "b"), 200, "{counts}");
    drop(client.child.start_kill());
}

/// `callers 1000 3 x-user`: who answered each caller, every one of whose calls one backend
/// answered.
async fn callers(client: &mut Proc) -> serde_json::Value {
    client
        .stdin
        .write_all(b"callers 1000 3 x-user\n")
        .await
        .unwrap();
    let callers: serde_json::Value = serde_json::from_str(&client.line().await).unwrap();
    assert_eq!(
        answers(&callers, "mixed") + answers(&callers, "error"),
        0,
        "{callers}"
    );
    assert_eq!(
        answers(&callers, "a") + answers(&callers, "b"),
        1000,
        "{callers}"
    );
    callers
}

/// Asserts that about `percent` of 1,000 callers are on a, within 10 points. Two errors add
/// up: the binomial's (1.6 points at 50 %) and the ring's (a backend's share of a 4,096-entry
/// ring is off its weight by about 0.8 points), so 10 points is over five standard deviations.
fn assert_callers_on_a(callers: &serde_json::Value, percent: u64) {
    let a = answers(callers, "a");
    assert!(
        a.abs_diff(percent * 10) <= 100,
        "{a} of 1000 callers on a, wanted {percent}% +/- 10: {callers}"
    );
}

async fn a_hash_header_keeps_each_caller_on_one_endpoint_as_weights_move(kind: Released) {
    let (_a, port_a) = backend(kind, "a").await;
    let (_b, port_b) = backend(kind, "b").await;
    let server = support::Server::start().await;
    let greeter = support::greeter("default", &[(port_a, 100), (port_b, 100)]);
    let b = format!("127.0.0.1:{port_b}");
    let configs = |weight: u32| {
        vec![dynamic_config(serde_json::json!([
            {"side": "provider", "addresses": [b], "parameters": {"weight": weight.to_string()}},
            {"side": "provider", "parameters": {"hash.header": "x-user"}},
        ]))]
    };
    // 100/25 is 80/20. Every caller's five calls land on one backend, callers split by weight.
    server.publish_with_configs(vec![greeter.clone()], configs(25));
    let mut client = client(kind, &server, "xds:///greeter:7070");
    let before = callers(&mut client).await;
    assert_callers_on_a(&before, 80);
    // A call without the header is placed at random on the ring: per call, by weight (the
    // ring's error, 0.6 points at 80/20, leaves 5 points over four standard deviations).
    assert_split(&count(&mut client, 2000).await, 80);

    // 50/50: the canary's share grows and nobody it had leaves it (its ring points are kept,
    // the primary's only thinned). Counted once b answers well over 20% of calls.
    let version = server.publish_with_configs(vec![greeter], configs(100));
    server.acked(dubbo_cp_xds::ENDPOINT, &version).await;
    let mut applied = false;
    for _ in 0..50 {
        // Under 80/20, 70 or more of 200 is five standard deviations out.
        if answers(&count(&mut client, 200).await, "b") >= 70 {
            applied = true;
            break;
        }
    }
    assert!(applied, "the client never applied 50/50");
    let after = callers(&mut client).await;
    assert_callers_on_a(&after, 50);
    let kept_b = before["by"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, who)| *who == "b")
        .filter(|(caller, _)| after["by"][caller.as_str()] != "b")
        .map(|(caller, _)| caller.clone())
        .collect::<Vec<_>>();
    assert!(kept_b.is_empty(), "callers that left b: {kept_b:?}");
    drop(client.child.start_kill());
}

macro_rules! per_client {
    ($($scenario:ident),* $(,)?) => {
        mod grpcio {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    super::$scenario(super::Released::Grpcio).await;
                }
            )*
        }
        mod grpc_js_xds {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $scenario() {
                    super::$scenario(super::Released::GrpcJs).await;
                }
            )*
        }
    };
}

per_client!(
    endpoint_weights_split_traffic_and_shifts_move_it_without_a_failed_call,
    a_tag_route_sends_tagged_calls_to_its_endpoints_with_dubbos_fallback,
    a_dubbo_interface_name_reaches_the_applications_its_mapping_lists,
    tag_routes_hold_across_the_applications_of_an_interface,
    dynamic_config_weights_and_disabled_instances_move_traffic,
    a_condition_route_sends_matching_calls_to_the_endpoints_it_selects,
    a_service_scoped_condition_route_applies_to_its_interfaces_calls,
    a_hash_header_keeps_each_caller_on_one_endpoint_as_weights_move,
);
