use std::collections::BTreeMap;

use dubbo_cp_domain::service::{APPLICATION_LABEL, Service, ServiceEndpoint, ServicePort};

use super::*;

/// Service `greeter` in `shop` on port 7070: one endpoint per (last octet, weight, tag).
fn greeter(endpoints: &[(u8, u32, Option<&str>)]) -> Service {
    Service {
        namespace: "shop".into(),
        name: "greeter".into(),
        labels: BTreeMap::from([(APPLICATION_LABEL.to_string(), "greeter".to_string())]),
        ports: vec![ServicePort {
            number: 7070,
            name: "grpc".into(),
            protocol: "GRPC".into(),
        }],
        endpoints: endpoints
            .iter()
            .map(|(octet, weight, tag)| ServiceEndpoint {
                address: std::net::IpAddr::from([10, 0, 0, *octet]),
                ports: BTreeMap::new(),
                labels: tag
                    .map(|t| BTreeMap::from([(crate::tags::TAG_LABEL.to_string(), t.to_string())]))
                    .unwrap_or_default(),
                weight: *weight,
                locality: String::new(),
            })
            .collect(),
    }
}

fn call(headers: &[(&str, &str)]) -> Call {
    Call {
        target: "greeter:7070".into(),
        namespace: "shop".into(),
        path: None,
        headers: headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// Share per address, rounded to a tenth of a point.
fn shares(split: &Split) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    for e in &split.endpoints {
        *by.entry(e.address.clone()).or_insert(0.0) += e.share;
    }
    by.into_iter()
        .map(|(k, v)| (k, (v * 10.0).round() / 10.0))
        .collect()
}

#[test]
fn endpoint_weights_split_the_calls_as_the_client_balances_them() {
    let snapshot = Snapshot::new(
        1,
        vec![greeter(&[(1, 80, None), (2, 20, None), (3, 20, None)])],
        true,
    );
    let split = split(&snapshot, &call(&[])).unwrap();
    assert_eq!(
        shares(&split),
        BTreeMap::from([
            ("10.0.0.1:7070".to_owned(), 66.7),
            ("10.0.0.2:7070".to_owned(), 16.7),
            ("10.0.0.3:7070".to_owned(), 16.7),
        ])
    );
    assert_eq!(split.matched, "every call");
    assert_eq!(split.clusters.len(), 1);
    assert_eq!(split.clusters[0].policy, "ROUND_ROBIN");
    assert_eq!(split.version, "1");
}

#[test]
fn a_tag_header_picks_the_tagged_subset_and_no_tag_the_rest() {
    let snapshot = Snapshot::new(
        1,
        vec![greeter(&[(1, 1, Some("gray")), (2, 1, None), (3, 1, None)])],
        true,
    );
    let gray = split(&snapshot, &call(&[("dubbo-tag", "gray")])).unwrap();
    assert_eq!(
        shares(&gray),
        BTreeMap::from([("10.0.0.1:7070".to_owned(), 100.0)])
    );
    assert!(gray.matched.contains("dubbo-tag=gray"), "{}", gray.matched);
    let plain = split(&snapshot, &call(&[])).unwrap();
    assert_eq!(
        shares(&plain),
        BTreeMap::from([
            ("10.0.0.2:7070".to_owned(), 50.0),
            ("10.0.0.3:7070".to_owned(), 50.0),
        ])
    );
    assert!(plain.route > gray.route);
}

#[test]
fn a_name_that_resolves_to_nothing_says_so() {
    let snapshot = Snapshot::new(1, vec![greeter(&[(1, 1, None)])], true);
    let mut missing = call(&[]);
    missing.target = "nobody:7070".into();
    assert_eq!(
        split(&snapshot, &missing),
        Err(SplitError::NoListener("nobody:7070".into(), "shop".into()))
    );
    let mut elsewhere = call(&[]);
    elsewhere.namespace = "bank".into();
    assert!(matches!(
        split(&snapshot, &elsewhere),
        Err(SplitError::NoListener(..))
    ));
}

#[test]
fn matchers_read_headers_as_grpc_does() {
    let header = |spec, invert_match| HeaderMatcher {
        name: "x-user".into(),
        header_match_specifier: Some(spec),
        invert_match,
        ..Default::default()
    };
    let exact = |value: &str, ignore_case| {
        header_matcher::HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(value.into())),
            ignore_case,
        })
    };
    let headers = |v: &str| vec![("X-User".to_owned(), v.to_owned())];
    assert!(header_matches(
        &header(exact("ann", false), false),
        &headers("ann")
    ));
    assert!(!header_matches(
        &header(exact("ANN", false), false),
        &headers("ann")
    ));
    assert!(header_matches(
        &header(exact("ANN", true), false),
        &headers("ann")
    ));
    assert!(!header_matches(
        &header(exact("ann", false), true),
        &headers("ann")
    ));
    assert!(header_matches(
        &header(exact("bob", false), true),
        &headers("ann")
    ));
    assert!(
        !header_matches(&header(exact("bob", false), true), &[]),
        "an inverted value matcher does not match an absent header"
    );
    let present = header_matcher::HeaderMatchSpecifier::PresentMatch(true);
    assert!(header_matches(
        &header(present.clone(), false),
        &headers("")
    ));
    assert!(!header_matches(&header(present.clone(), false), &[]));
    assert!(header_matches(&header(present, true), &[]), "absent");
    let regex = header_matcher::HeaderMatchSpecifier::StringMatch(StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::SafeRegex(
            envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher {
                regex: "a.n".into(),
                ..Default::default()
            },
        )),
        ignore_case: false,
    });
    assert!(header_matches(
        &header(regex.clone(), false),
        &headers("ann")
    ));
    assert!(
        !header_matches(&header(regex, false), &headers("anne")),
        "a full match"
    );
    assert!(domain_matches("*", "x:1"));
    assert!(domain_matches("*.shop", "a.shop"));
    assert!(!domain_matches("a.shop", "b.shop"));
}

#[test]
fn an_interface_of_several_services_splits_over_their_clusters() {
    let mut v2 = greeter(&[(2, 1, None), (3, 1, None)]);
    v2.name = "greeter-v2".into();
    let snapshot =
        Snapshot::new(1, vec![greeter(&[(1, 1, None)]), v2], true).with_mappings(vec![(
            "shop".into(),
            "org.example.Greeter".into(),
            vec!["greeter".into()],
        )]);
    let mut interface = call(&[]);
    interface.target = "org.example.Greeter".into();
    let split = split(&snapshot, &interface).unwrap();
    assert_eq!(split.clusters.len(), 2, "{split:?}");
    let total: f64 = split.endpoints.iter().map(|e| e.share).sum();
    assert!((total - 100.0).abs() < 1e-6, "{split:?}");
    // Each service's cluster weighs its endpoints: a third per endpoint.
    for share in shares(&split).values() {
        assert!((share - 33.3).abs() < 0.1, "{split:?}");
    }
}
