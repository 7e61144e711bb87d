#![allow(clippy::unwrap_used, clippy::expect_used)]

use dubbo_cp_domain::rules::{AuthorizationRule, Condition, Match, PolicyExtend, PolicySelector};
use envoy_types::pb::envoy::config::rbac::v3::Rbac;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as RbacConfig;

use super::*;

fn policy(
    name: &str,
    action: &str,
    rules: Vec<AuthorizationRule>,
) -> Named<AuthorizationPolicySpec> {
    Named {
        namespace: "shop".into(),
        name: name.into(),
        spec: AuthorizationPolicySpec {
            action: action.into(),
            rules,
            samples: 0.0,
            order: 0.0,
            match_type: String::new(),
        },
    }
}

fn from(selector: PolicySelector) -> AuthorizationRule {
    AuthorizationRule {
        from: Some(selector),
        ..Default::default()
    }
}

fn when(key: &str, values: &[(&str, &str)], not_values: &[(&str, &str)]) -> AuthorizationRule {
    let matches = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(t, v)| Match {
                r#type: (*t).into(),
                value: (*v).into(),
            })
            .collect()
    };
    AuthorizationRule {
        when: Some(Condition {
            key: key.into(),
            values: matches(values),
            not_values: matches(not_values),
        }),
        ..Default::default()
    }
}

fn namespaces(list: &[&str]) -> PolicySelector {
    PolicySelector {
        namespaces: list.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

/// The filter's rules, decoded with Envoy's own type (the wire format is the same).
fn rules(filter: &HttpFilter) -> Rbac {
    let Some(http_filter::ConfigType::TypedConfig(any)) = &filter.config_type else {
        panic!("no typed config");
    };
    assert_eq!(any.type_url, RBAC_TYPE);
    RbacConfig::decode(any.value.as_slice())
        .unwrap()
        .rules
        .unwrap()
}

/// Whether `matcher` accepts `value`, evaluated as grpc-js does: a regex anchored as
/// `^<regex>$`, ungrouped (so a regex that is not grouped where it must be fails here).
fn string_accepts(matcher: &StringMatcher, value: &str) -> bool {
    match matcher.match_pattern.as_ref().unwrap() {
        string_matcher::MatchPattern::Exact(e) => value == e,
        string_matcher::MatchPattern::Prefix(p) => value.starts_with(p.as_str()),
        string_matcher::MatchPattern::Suffix(s) => value.ends_with(s.as_str()),
        string_matcher::MatchPattern::Contains(c) => value.contains(c.as_str()),
        string_matcher::MatchPattern::SafeRegex(r) => {
            regex::Regex::new(&format!("^(?:{})$", r.regex))
                .unwrap()
                .is_match(value)
        }
        other => panic!("{other:?}"),
    }
}

/// A call as RBAC sees it: the peer's SPIFFE ID and address, the path, metadata.
struct Call<'a> {
    principal: Option<&'a str>,
    peer: &'a str,
    path: &'a str,
    headers: &'a [(&'a str, &'a str)],
}

fn principal_matches(p: &Principal, call: &Call<'_>) -> bool {
    match p.identifier.as_ref().unwrap() {
        principal::Identifier::Any(_) => true,
        principal::Identifier::AndIds(set) => set.ids.iter().all(|i| principal_matches(i, call)),
        principal::Identifier::OrIds(set) => set.ids.iter().any(|i| principal_matches(i, call)),
        principal::Identifier::NotId(inner) => !principal_matches(inner, call),
        principal::Identifier::Authenticated(a) => call
            .principal
            .is_some_and(|id| string_accepts(a.principal_name.as_ref().unwrap(), id)),
        principal::Identifier::DirectRemoteIp(range) => {
            let cidr = Cidr::parse(&format!(
                "{}/{}",
                range.address_prefix,
                range.prefix_len.as_ref().unwrap().value
            ))
            .unwrap();
            cidr.contains(call.peer.parse().unwrap())
        }
        other => panic!("{other:?}"),
    }
}

fn permission_matches(p: &Permission, call: &Call<'_>) -> bool {
    match p.rule.as_ref().unwrap() {
        permission::Rule::Any(_) => true,
        permission::Rule::AndRules(set) => set.rules.iter().all(|r| permission_matches(r, call)),
        permission::Rule::OrRules(set) => set.rules.iter().any(|r| permission_matches(r, call)),
        permission::Rule::NotRule(inner) => !permission_matches(inner, call),
        permission::Rule::UrlPath(path) => {
            let Some(path_matcher::Rule::Path(m)) = &path.rule else {
                panic!()
            };
            string_accepts(m, call.path)
        }
        permission::Rule::Header(h) => {
            let Some(header_matcher::HeaderMatchSpecifier::StringMatch(m)) =
                &h.header_match_specifier
            else {
                panic!()
            };
            call.headers
                .iter()
                .any(|(k, v)| *k == h.name && string_accepts(m, v))
        }
        other => panic!("{other:?}"),
    }
}

/// What the filters decide for `call`: DENY first, then ALLOW (A41's evaluation).
fn allowed(translated: &Translated, call: &Call<'_>) -> bool {
    for filter in &translated.filters {
        let rules = rules(filter);
        let matched = rules.policies.values().any(|policy| {
            policy
                .permissions
                .iter()
                .any(|p| permission_matches(p, call))
                && policy.principals.iter().any(|p| principal_matches(p, call))
        });
        let deny = rules.action == DENY;
        if deny == matched {
            return false;
        }
    }
    true
}

fn call<'a>(principal: Option<&'a str>, path: &'a str) -> Call<'a> {
    Call {
        principal,
        peer: "10.1.2.3",
        path,
        headers: &[],
    }
}

const A: &str = "spiffe://cluster.local/ns/a/sa/default";
const AB: &str = "spiffe://cluster.local/ns/ab/sa/default";
const B: &str = "spiffe://cluster.local/ns/b/sa/default";

#[test]
fn allow_a_namespace_denies_the_others_and_plaintext() {
    let policies = [policy("only-a", "ALLOW", vec![from(namespaces(&["a"]))])];
    let t = translate(policies.iter(), true);
    assert_eq!(t.allow, ["shop/only-a"]);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(t.filters.len(), 1);
    assert_eq!(t.filters[0].name, ALLOW_FILTER);
    assert!(!t.filters[0].is_optional);
    assert!(allowed(&t, &call(Some(A), "/G/Say")));
    assert!(!allowed(&t, &call(Some(AB), "/G/Say")), "ns/ab is not ns/a");
    assert!(!allowed(&t, &call(Some(B), "/G/Say")));
    assert!(!allowed(&t, &call(None, "/G/Say")));
    // On a plaintext port the rule can never match: said, not hidden.
    let plain = translate(policies.iter(), false);
    assert!(
        plain.problems[0].1.contains("plaintext"),
        "{:?}",
        plain.problems
    );
}

#[test]
fn deny_one_method_then_allow_the_rest_in_that_order() {
    let policies = [
        policy("everyone", "ALLOW", Vec::new()),
        policy(
            "no-delete",
            "DENY",
            vec![when("method", &[("", "Delete")], &[])],
        ),
    ];
    let t = translate(policies.iter(), true);
    let names: Vec<&str> = t.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, [DENY_FILTER, ALLOW_FILTER]);
    assert!(!allowed(&t, &call(Some(A), "/shop.Items/Delete")));
    assert!(allowed(&t, &call(Some(A), "/shop.Items/DeleteAll")));
    assert!(allowed(&t, &call(Some(A), "/shop.Items/Get")));
    assert!(allowed(&t, &call(None, "/shop.Items/Get")));
}

#[test]
fn every_selector_field_and_its_not_form() {
    let cases: Vec<(PolicySelector, Call<'_>, bool)> = vec![
        (
            PolicySelector {
                not_namespaces: vec!["b".into()],
                ..Default::default()
            },
            call(Some(B), "/x/y"),
            false,
        ),
        (
            PolicySelector {
                not_namespaces: vec!["b".into()],
                ..Default::default()
            },
            call(Some(A), "/x/y"),
            true,
        ),
        (
            PolicySelector {
                principals: vec!["cluster.local/ns/a/sa/default".into()],
                ..Default::default()
            },
            call(Some(A), "/x/y"),
            true,
        ),
        (
            PolicySelector {
                not_principals: vec![A.into()],
                ..Default::default()
            },
            call(Some(A), "/x/y"),
            false,
        ),
        (
            PolicySelector {
                ip_blocks: vec!["10.1.9.9/16".into()],
                ..Default::default()
            },
            call(None, "/x/y"),
            true,
        ),
        (
            PolicySelector {
                not_ip_blocks: vec!["10.0.0.0/8".into()],
                ..Default::default()
            },
            call(None, "/x/y"),
            false,
        ),
        (
            PolicySelector {
                extends: vec![PolicyExtend {
                    key: "id".into(),
                    value: "a/default".into(),
                }],
                ..Default::default()
            },
            call(Some(A), "/x/y"),
            true,
        ),
        (
            PolicySelector {
                extends: vec![PolicyExtend {
                    key: "ips".into(),
                    value: "10.1.2.4".into(),
                }],
                ..Default::default()
            },
            call(None, "/x/y"),
            false,
        ),
    ];
    for (i, (selector, call, expected)) in cases.into_iter().enumerate() {
        let policies = [policy("p", "ALLOW", vec![from(selector.clone())])];
        let t = translate(policies.iter(), true);
        assert!(t.problems.is_empty(), "{i}: {:?}", t.problems);
        assert_eq!(allowed(&t, &call), expected, "{i}: {selector:?}");
    }
}

#[test]
fn when_keys_match_the_path_and_metadata() {
    let policies = [policy(
        "p",
        "ALLOW",
        vec![
            when("interface", &[("prefix", "shop.")], &[]),
            when("attachments.Tenant", &[("", "gold")], &[]),
            when(
                "path",
                &[("regex", "/health\\..*")],
                &[("", "/health.Health/Watch")],
            ),
        ],
    )];
    let t = translate(policies.iter(), true);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert!(allowed(&t, &call(None, "/shop.Items/Get")));
    assert!(!allowed(&t, &call(None, "/bank.Items/Get")));
    let gold = Call {
        headers: &[("tenant", "gold")],
        ..call(None, "/bank.Items/Get")
    };
    assert!(allowed(&t, &gold));
    assert!(allowed(&t, &call(None, "/health.Health/Check")));
    assert!(!allowed(&t, &call(None, "/health.Health/Watch")));
}

#[test]
fn what_grpc_cannot_check_never_fails_open() {
    let pod_label = PolicySelector {
        extends: vec![PolicyExtend {
            key: "kubernetesEnv.podLabels.app".into(),
            value: "admin".into(),
        }],
        ..Default::default()
    };
    // ALLOW: the rule allows nobody; the other rule still allows.
    let allow = [policy(
        "p",
        "ALLOW",
        vec![from(pod_label.clone()), from(namespaces(&["a"]))],
    )];
    let t = translate(allow.iter(), true);
    assert!(
        t.problems[0].1.contains("allows nobody"),
        "{:?}",
        t.problems
    );
    assert!(allowed(&t, &call(Some(A), "/x/y")));
    assert!(!allowed(&t, &call(Some(B), "/x/y")));
    // ALLOW with ALL_MATCH: the whole policy allows nobody.
    let mut all = allow.clone();
    all[0].spec.match_type = "ALL_MATCH".into();
    let t = translate(all.iter(), true);
    assert!(!allowed(&t, &call(Some(A), "/x/y")));
    // DENY: the rule denies without the part (more, not less).
    let deny = [policy(
        "d",
        "DENY",
        vec![AuthorizationRule {
            from: Some(PolicySelector {
                namespaces: vec!["b".into()],
                ..pod_label
            }),
            when: Some(Condition {
                key: "attachments.grpc-timeout".into(),
                values: vec![Match {
                    r#type: String::new(),
                    value: "1s".into(),
                }],
                not_values: Vec::new(),
            }),
            to: None,
        }],
    )];
    let t = translate(deny.iter(), true);
    assert_eq!(t.problems.len(), 2, "{:?}", t.problems);
    assert!(!allowed(&t, &call(Some(B), "/x/y")));
    assert!(allowed(&t, &call(Some(A), "/x/y")));
    // A regex that does not compile is never sent (the client would NACK the listener).
    let bad = [policy(
        "r",
        "ALLOW",
        vec![when("method", &[("regex", "(")], &[])],
    )];
    let t = translate(bad.iter(), true);
    assert!(
        t.problems[0].1.contains("does not compile"),
        "{:?}",
        t.problems
    );
    assert!(!allowed(&t, &call(None, "/x/(")));
}

#[test]
fn all_match_needs_every_rule_and_audit_and_samples_are_reported() {
    let mut both = policy(
        "both",
        "ALLOW",
        vec![
            from(namespaces(&["a"])),
            when("method", &[("", "Get")], &[]),
        ],
    );
    both.spec.match_type = "ALL_MATCH".into();
    both.spec.samples = 50.0;
    let audit = policy("audit", "ADULT", Vec::new());
    let policies = [audit, both];
    let t = translate(policies.iter(), true);
    assert!(allowed(&t, &call(Some(A), "/x/Get")));
    assert!(!allowed(&t, &call(Some(A), "/x/Put")));
    assert!(!allowed(&t, &call(Some(B), "/x/Get")));
    let problems: Vec<&str> = t.problems.iter().map(|(_, p)| p.as_str()).collect();
    assert!(problems[0].contains("ADULT"), "{problems:?}");
    assert!(problems[1].contains("samples 50"), "{problems:?}");
    assert_eq!(t.filters.len(), 1, "no filter for audit");
}

#[test]
fn the_same_policies_encode_to_the_same_bytes() {
    let policies: Vec<_> = (0..20)
        .map(|i| policy(&format!("p{i}"), "ALLOW", vec![from(namespaces(&["a"]))]))
        .collect();
    let first = translate(policies.iter(), true);
    for _ in 0..5 {
        assert_eq!(translate(policies.iter(), true).filters, first.filters);
    }
}

#[test]
fn not_forms_in_an_allow_rule_let_no_plaintext_caller_in() {
    let allow = [policy(
        "p",
        "ALLOW",
        vec![from(PolicySelector {
            not_namespaces: vec!["b".into()],
            ..Default::default()
        })],
    )];
    let t = translate(allow.iter(), false);
    assert!(!allowed(&t, &call(None, "/x/y")), "no identity, not let in");
    assert!(allowed(&t, &call(Some(A), "/x/y")));
    assert!(!allowed(&t, &call(Some(B), "/x/y")));
    // In a DENY rule the `not` form denies a caller without identity (it is not in b).
    let deny = [
        policy("all", "ALLOW", Vec::new()),
        policy(
            "d",
            "DENY",
            vec![from(PolicySelector {
                not_principals: vec![A.into()],
                ..Default::default()
            })],
        ),
    ];
    let t = translate(deny.iter(), false);
    assert!(!allowed(&t, &call(None, "/x/y")));
    assert!(allowed(&t, &call(Some(A), "/x/y")));
    assert!(t.problems[0].1.contains("everybody"), "{:?}", t.problems);
}

#[test]
fn regexes_are_grouped_unanchored_in_paths_and_what_re2_refuses_is_not_sent() {
    let policies = [policy(
        "p",
        "ALLOW",
        vec![
            when("method", &[("regex", "^Get.*$")], &[]),
            when("path", &[("regex", "/a/One|/a/Two")], &[]),
        ],
    )];
    let t = translate(policies.iter(), true);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert!(allowed(&t, &call(None, "/shop.Items/GetAll")));
    assert!(!allowed(&t, &call(None, "/shop.Items/Put")));
    assert!(allowed(&t, &call(None, "/a/Two")));
    // Ungrouped, grpc-js would read `^/a/One` or `/a/Two$`.
    assert!(!allowed(&t, &call(None, "/a/OneMore")));
    for refused in [
        "a{1001}",
        "(?x) a b",
        "(?u)abc",
        "\\<word",
        "[a-z&&[^x]]",
        "\\b{start}x",
    ] {
        let bad = [policy(
            "r",
            "DENY",
            vec![when("method", &[("regex", refused)], &[])],
        )];
        let t = translate(bad.iter(), true);
        assert!(
            t.problems[0].1.contains("RE2"),
            "{refused}: {:?}",
            t.problems
        );
        // The DENY rule goes on without its condition: it denies more, never less.
        assert!(!allowed(&t, &call(None, "/x/Anything")), "{refused}");
    }
    for accepted in ["(?i)get", "a{2,1000}", "(?P<m>x)", "[a-z]"] {
        let ok = [policy(
            "r",
            "DENY",
            vec![when("method", &[("regex", accepted)], &[])],
        )];
        assert!(translate(ok.iter(), true).problems.is_empty(), "{accepted}");
    }
}

#[test]
fn header_names_grpc_cannot_match_are_reported() {
    for key in [
        "attachments.Tenant ID",
        "attachments.grpc-timeout",
        "attachments.é",
        "attachments.",
    ] {
        let policies = [policy("p", "ALLOW", vec![when(key, &[("", "x")], &[])])];
        let t = translate(policies.iter(), true);
        assert!(
            t.problems
                .first()
                .is_some_and(|p| p.1.contains("names no header")),
            "{key}: {:?}",
            t.problems
        );
    }
}
