use std::collections::BTreeMap;

use dubbo_cp_domain::rules::TagRouteSpec;
use dubbo_cp_domain::service::{ServiceEndpoint, ServicePort};

use super::*;

fn endpoint(last: u8, tag: Option<&str>) -> ServiceEndpoint {
    ServiceEndpoint {
        address: std::net::IpAddr::from([10, 0, 0, last]),
        ports: BTreeMap::new(),
        labels: tag
            .map(|t| BTreeMap::from([(TAG_LABEL.to_string(), t.to_string())]))
            .unwrap_or_default(),
        weight: 1,
        locality: String::new(),
    }
}

fn port() -> ServicePort {
    ServicePort {
        number: 7070,
        name: "grpc".into(),
        protocol: "GRPC".into(),
    }
}

fn rule(force: bool, tags: &[(&str, &[&str])]) -> TagRouteSpec {
    let tags: Vec<serde_json::Value> = tags
        .iter()
        .map(|(name, addresses)| serde_json::json!({"name": name, "addresses": addresses}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "key": "greeter", "configVersion": "v3.0", "force": force, "tags": tags,
    }))
    .unwrap_or_else(|err| panic!("{err}"))
}

fn picked(tagging: &Tagging<'_>, subset: Subset) -> Vec<u8> {
    tagging
        .endpoints_of(&subset)
        .iter()
        .map(|e| match e.address {
            std::net::IpAddr::V4(v4) => v4.octets()[3],
            std::net::IpAddr::V6(_) => 0,
        })
        .collect()
}

#[test]
fn without_a_rule_static_tags_route_and_untagged_requests_avoid_them() {
    let endpoints = [endpoint(1, None), endpoint(2, Some("gray"))];
    let port = port();
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: None,
        conditions: None,
    };
    assert!(tagging.applies());
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [2]);
    assert_eq!(picked(&tagging, Subset::Untagged), [1]);
    // An unknown tag falls back to the untagged endpoints, unless forced.
    assert_eq!(picked(&tagging, Subset::Tagged("blue".into())), [1]);
    assert_eq!(
        picked(&tagging, Subset::Forced("blue".into())),
        Vec::<u8>::new()
    );
    let plain = [endpoint(1, None)];
    let none = Tagging {
        endpoints: &plain,
        port: &port,
        rule: None,
        conditions: None,
    };
    assert!(!none.applies(), "no rule and no static tag: plain routing");
}

#[test]
fn a_rules_addresses_take_their_endpoints_out_of_untagged_traffic() {
    let endpoints = [
        endpoint(1, None),
        endpoint(2, None),
        endpoint(3, Some("blue")),
    ];
    let port = port();
    let gray = rule(false, &[("gray", &["10.0.0.2:7070"]), ("blue", &[])]);
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: Some(&gray),
        conditions: None,
    };
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [2]);
    // `blue` has no addresses in the rule: its static tag decides.
    assert_eq!(picked(&tagging, Subset::Tagged("blue".into())), [3]);
    // No tag: not listed by the rule, and no static tag named by the rule.
    assert_eq!(picked(&tagging, Subset::Untagged), [1]);
    // An unknown tag: neither listed nor statically tagged.
    assert_eq!(picked(&tagging, Subset::Tagged("red".into())), [1]);
}

#[test]
fn force_decides_what_happens_when_a_tags_addresses_are_gone() {
    let endpoints = [endpoint(1, None)];
    let port = port();
    let lenient = rule(false, &[("gray", &["10.0.0.9"])]);
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: Some(&lenient),
        conditions: None,
    };
    assert_eq!(
        picked(&tagging, Subset::Tagged("gray".into())),
        [1],
        "falls back"
    );
    assert_eq!(
        picked(&tagging, Subset::Forced("gray".into())),
        Vec::<u8>::new()
    );
    let strict = rule(true, &[("gray", &["10.0.0.9"])]);
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: Some(&strict),
        conditions: None,
    };
    assert_eq!(
        picked(&tagging, Subset::Tagged("gray".into())),
        Vec::<u8>::new()
    );
}

#[test]
fn when_every_endpoint_is_in_a_tag_untagged_requests_reach_none() {
    let endpoints = [endpoint(1, None), endpoint(2, None)];
    let port = port();
    let all = rule(false, &[("gray", &["10.0.0.1", "10.0.0.2:7070"])]);
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: Some(&all),
        conditions: None,
    };
    assert_eq!(picked(&tagging, Subset::Untagged), Vec::<u8>::new());
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [1, 2]);
}

#[test]
fn subset_names_round_trip() {
    for subset in [
        Subset::Untagged,
        Subset::Tagged("gray".into()),
        Subset::Forced("gray".into()),
        Subset::Tagged(String::new()),
        Subset::Forced(String::new()),
        Subset::Tagged("canary-forced".into()),
        Subset::Tagged("a|b".into()),
    ] {
        assert_eq!(
            Subset::parse(&subset.name()),
            Some(subset.clone()),
            "{subset:?}"
        );
    }
    assert_eq!(Subset::parse("other"), None);
    assert_ne!(
        Subset::Tagged("x-forced".into()).name(),
        Subset::Forced("x".into()).name()
    );
    assert!(!Subset::Tagged("a|b".into()).name().contains('|'));
}

#[test]
fn only_subsets_the_routes_name_are_served() {
    let endpoints = [endpoint(1, None), endpoint(2, Some("gray"))];
    let port = port();
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: None,
        conditions: None,
    };
    assert!(tagging.routes_to(&Subset::Tagged("gray".into())));
    assert!(tagging.routes_to(&Subset::Forced(String::new())));
    assert!(tagging.routes_to(&Subset::Untagged));
    assert!(!tagging.routes_to(&Subset::Tagged("made-up".into())));
    let plain = [endpoint(1, None)];
    let none = Tagging {
        endpoints: &plain,
        port: &port,
        rule: None,
        conditions: None,
    };
    assert!(
        !none.routes_to(&Subset::Untagged),
        "no tag routing, no subsets"
    );
}

fn labelled(last: u8, labels: &[(&str, &str)]) -> ServiceEndpoint {
    ServiceEndpoint {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..endpoint(last, None)
    }
}

fn match_rule(version: &str, force: bool, matches: serde_json::Value) -> TagRouteSpec {
    serde_json::from_value(serde_json::json!({
        "key": "greeter", "configVersion": version, "force": force,
        "tags": [{"name": "gray", "match": matches}],
    }))
    .unwrap_or_else(|err| panic!("{err}"))
}

#[test]
fn a_match_tag_takes_the_endpoints_whose_labels_match_as_dubbos_addresses() {
    let endpoints = [
        labelled(1, &[("version", "v1")]),
        labelled(2, &[("version", "v2"), ("zone", "east")]),
        labelled(3, &[("version", "v2")]),
        labelled(4, &[(TAG_LABEL, "gray")]),
    ];
    let port = port();
    // Every param of the match must hold (Dubbo ANDs them).
    let rule = match_rule(
        "v3.0",
        false,
        serde_json::json!([
            {"key": "version", "value": {"exact": "v2"}},
            {"key": "zone", "value": {"prefix": "ea"}},
        ]),
    );
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: Some(&rule),
        conditions: None,
    };
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [2]);
    // Untagged calls avoid what the rule's tags take, and static tags named by the rule.
    assert_eq!(picked(&tagging, Subset::Untagged), [1, 3]);

    // A match no endpoint passes: the tag has no addresses, so the static tag decides.
    let nobody = match_rule(
        "v3.0",
        true,
        serde_json::json!([{"key": "version", "value": {"exact": "v9"}}]),
    );
    let tagging = Tagging {
        rule: Some(&nobody),
        ..tagging
    };
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [4]);
    assert_eq!(picked(&tagging, Subset::Untagged), [1, 2, 3]);

    // A v2.7 rule knows no match: as if the tag had no addresses.
    let old = match_rule(
        "v2.7",
        false,
        serde_json::json!([{"key": "version", "value": {"exact": "v2"}}]),
    );
    let tagging = Tagging {
        rule: Some(&old),
        ..tagging
    };
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [4]);
}

#[test]
fn a_match_tag_is_forced_like_an_address_tag() {
    let endpoints = [
        labelled(1, &[("version", "v1")]),
        labelled(2, &[("version", "v2")]),
    ];
    let port = port();
    let rule = match_rule(
        "v3.0",
        true,
        serde_json::json!([{"key": "version", "value": {"regex": "v[2-9]"}}]),
    );
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: Some(&rule),
        conditions: None,
    };
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [2]);
    assert_eq!(picked(&tagging, Subset::Forced("gray".into())), [2]);
    assert_eq!(picked(&tagging, Subset::Untagged), [1]);
}

#[test]
fn a_conditions_subset_has_one_name() {
    assert_eq!(Subset::Condition(3).name(), "condition-3");
    assert_eq!(Subset::parse("condition-3"), Some(Subset::Condition(3)));
    for other in ["condition-03", "condition-", "condition-+3", "condition-x"] {
        assert_eq!(Subset::parse(other), None, "{other}");
    }
}

#[test]
fn a_tag_whose_endpoints_are_all_disabled_falls_back_as_one_with_none() {
    // 10.0.0.2 is listed for gray and 10.0.0.3 statically blue, both disabled (weight 0):
    // Dubbo sees no provider of either tag.
    let mut endpoints = [
        endpoint(1, None),
        endpoint(2, None),
        endpoint(3, Some("blue")),
    ];
    endpoints[1].weight = 0;
    endpoints[2].weight = 0;
    let port = port();
    let gray = rule(false, &[("gray", &["10.0.0.2"])]);
    let tagging = Tagging {
        endpoints: &endpoints,
        port: &port,
        rule: Some(&gray),
        conditions: None,
    };
    assert_eq!(picked(&tagging, Subset::Tagged("gray".into())), [1]);
    assert_eq!(picked(&tagging, Subset::Tagged("blue".into())), [1]);
    assert!(picked(&tagging, Subset::Forced("gray".into())).is_empty());
    assert!(!tagging.forbids_fallback("gray"));
    // With force, the rule's tag does not fall back.
    let forced = rule(true, &[("gray", &["10.0.0.2"])]);
    let tagging = Tagging {
        rule: Some(&forced),
        ..tagging
    };
    assert!(tagging.forbids_fallback("gray"));
    assert!(picked(&tagging, Subset::Tagged("gray".into())).is_empty());
}
