//! A/B testing: the `ConditionRoute <canary>-canary` that sends the calls an analysis `match`
//! selects to the canary's pods and every other call to the rest. One rule serves both kinds
//! of client: Dubbo SDKs apply ConditionRoutes from the discovery stream, and the xDS edge
//! turns the same rule into header-matched routes to endpoint subsets.
//!
//! A match's headers are the call's attachments (gRPC metadata). Each `match` entry becomes a
//! condition `attachments[h]=v & ... => host=<canary IPs>`; a last condition `=> host=<primary
//! IPs>` sends every other call to the primary, so a canary pod the rule does not list yet (a
//! replacement, a scale-up) takes no production call. Dubbo narrows by every condition a call
//! matches and ignores one that leaves nobody (the rule is not `force`), xDS routes by the first
//! match: for these conditions both give the same answer.

mod regex_glob;

use crate::crd::{HeaderMatch, HttpMatch};
use crate::rules::ConditionRouteSpec;

/// What the match cannot say, for the Canary's `InvalidSpec` condition; `None` when all of it
/// can be said to both kinds of client.
pub fn check(matches: &[HttpMatch]) -> Result<(), String> {
    for (i, m) in matches.iter().enumerate() {
        let at = format!("spec.analysis.match[{i}]");
        if m.uri.is_some() || !m.query_params.is_empty() || !m.source_labels.is_empty() {
            return Err(format!(
                "{at}: only headers can be matched (gRPC calls carry no URI or query, and the \
                 control plane does not know the caller's labels); use headers"
            ));
        }
        if m.headers.is_empty() {
            return Err(format!("{at}: headers must name at least one header"));
        }
        for (name, value) in &m.headers {
            header_name(name).map_err(|e| format!("{at}.headers[{name:?}]: {e}"))?;
            glob(value).map_err(|e| format!("{at}.headers[{name:?}]: {e}"))?;
        }
    }
    Ok(())
}

/// gRPC metadata keys are lower case; Dubbo reads the attachment by the same name (and splits
/// a key on `.`, so a dotted name would never match there).
fn header_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_'))
        && !name.ends_with("-bin");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the header name must be lower-case letters, digits, '-' or '_' (a gRPC metadata \
             key Dubbo reads as an attachment; not '-bin'), got {name:?}"
        ))
    }
}

/// The header's value as a Dubbo condition value: `v`, `v*` or `*v`, or for a `regex` the
/// comma-separated globs matching exactly its values (see [`regex_glob`]).
fn glob(value: &HeaderMatch) -> Result<String, String> {
    let (text, glob) = match value {
        HeaderMatch {
            exact: Some(v),
            prefix: None,
            suffix: None,
            regex: None,
        } => (v, v.clone()),
        HeaderMatch {
            exact: None,
            prefix: Some(v),
            suffix: None,
            regex: None,
        } => (v, format!("{v}*")),
        HeaderMatch {
            exact: None,
            prefix: None,
            suffix: Some(v),
            regex: None,
        } => (v, format!("*{v}")),
        HeaderMatch {
            exact: None,
            prefix: None,
            suffix: None,
            regex: Some(regex),
        } => return regex_glob::globs(regex).map(|globs| globs.join(",")),
        _ => return Err("set exactly one of exact, prefix, suffix, regex".to_owned()),
    };
    // Condition syntax: separators, globs, ranges (`1~9`), parameter references (`$name`).
    if text.is_empty() || text.contains(regex_glob::condition_syntax) || text.starts_with('$') {
        return Err(format!(
            "the value must be non-empty, without whitespace, any of & ! = , * ~ > or a leading $ \
             (they are condition syntax), got {text:?}"
        ));
    }
    Ok(glob)
}

/// The calls a match selects, as people read them: `x-canary=insider & x-region prefix eu or
/// x-user suffix @example.com`, clipped to 256 characters.
pub fn describe(matches: &[HttpMatch]) -> String {
    let text = matches
        .iter()
        .map(|m| {
            m.headers
                .iter()
                .map(|(name, value)| {
                    let (how, text) = match value {
                        v if v.exact.is_some() => ("=", v.exact.as_deref()),
                        v if v.prefix.is_some() => (" prefix ", v.prefix.as_deref()),
                        v if v.suffix.is_some() => (" suffix ", v.suffix.as_deref()),
                        v => (" regex ", v.regex.as_deref()),
                    };
                    format!("{name}{how}{}", text.unwrap_or_default())
                })
                .collect::<Vec<_>>()
                .join(" & ")
        })
        .collect::<Vec<_>>()
        .join(" or ");
    if text.chars().count() > 256 {
        format!("{}...", text.chars().take(253).collect::<String>())
    } else {
        text
    }
}

/// The longest condition the ConditionRoute schema takes (`limits::CONDITION`).
const MAX_CONDITION: usize = dubbo_cp_domain::rules::limits::CONDITION;

/// The rule for `application` that sends matching calls to `canary_ips` and the others to
/// `primary_ips` (no canary pod: no rule, the canary takes no call), or the reason it cannot be
/// said.
pub fn condition_route(
    application: &str,
    matches: &[HttpMatch],
    canary_ips: &[String],
    primary_ips: &[String],
) -> Result<Option<ConditionRouteSpec>, String> {
    check(matches)?;
    if canary_ips.is_empty() {
        return Ok(None);
    }
    let hosts = canary_ips.join(",");
    let primaries = primary_ips.join(",");
    let mut conditions = Vec::with_capacity(matches.len() + 1);
    for m in matches {
        let when = m
            .headers
            .iter()
            .map(|(name, value)| glob(value).map(|v| format!("attachments[{name}]={v}")))
            .collect::<Result<Vec<_>, _>>()?
            .join(" & ");
        conditions.push(format!("{when} => host={hosts}"));
    }
    conditions.push(if primaries.is_empty() {
        // No primary pod: nobody else to send other calls to, but never the canary.
        format!("=> host!={hosts}")
    } else {
        format!("=> host={primaries}")
    });
    if let Some(long) = conditions.iter().find(|c| c.len() > MAX_CONDITION) {
        return Err(format!(
            "the A/B route's condition is {} characters, over the ConditionRoute limit of \
             {MAX_CONDITION} (too many pods or too long a match): {}...",
            long.len(),
            long.chars().take(80).collect::<String>()
        ));
    }
    Ok(Some(ConditionRouteSpec {
        priority: 0,
        enabled: true,
        force: false,
        runtime: true,
        key: application.to_owned(),
        scope: "application".to_owned(),
        conditions,
        config_version: "v3.0".to_owned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(value: serde_json::Value) -> Vec<HttpMatch> {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn each_match_routes_to_the_canary_and_the_rest_avoids_it() {
        let spec = condition_route(
            "podinfo",
            &matches(serde_json::json!([
                {"headers": {"x-canary": {"exact": "insider"}, "x-region": {"prefix": "eu"}}},
                {"headers": {"x-user": {"suffix": "@example.com"}}},
            ])),
            &["10.0.0.1".to_owned(), "10.0.0.2".to_owned()],
            &["10.1.0.1".to_owned()],
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("canary pods: a rule"));
        assert_eq!(
            spec.conditions,
            [
                "attachments[x-canary]=insider & attachments[x-region]=eu* => host=10.0.0.1,10.0.0.2",
                "attachments[x-user]=*@example.com => host=10.0.0.1,10.0.0.2",
                "=> host=10.1.0.1",
            ]
        );
        assert_eq!(
            (spec.key.as_str(), spec.scope.as_str()),
            ("podinfo", "application")
        );
        assert!(spec.enabled && !spec.force);
        // The rule is valid as any ConditionRoute is.
        for condition in &spec.conditions {
            dubbo_cp_domain::rules::parse_condition(condition)
                .unwrap_or_else(|e| panic!("{condition}: {e:?}"));
        }
        let none = condition_route("podinfo", &matches(serde_json::json!([])), &[], &[]);
        assert_eq!(none, Ok(None), "no canary pod, no rule");
    }

    #[test]
    fn what_a_condition_cannot_say_is_refused_by_name() {
        let refused = |value: serde_json::Value| check(&matches(value)).expect_err("refused");
        assert!(refused(serde_json::json!([{"uri": {"prefix": "/"}}])).contains("only headers"));
        assert!(
            refused(serde_json::json!([{"sourceLabels": {"app": "web"}}])).contains("only headers")
        );
        assert!(
            refused(serde_json::json!([{"headers": {"X-Canary": {"exact": "a"}}}]))
                .contains("lower-case")
        );
        assert!(
            refused(serde_json::json!([{"headers": {"x": {"exact": "a,b"}}}]))
                .contains("& ! = , *")
        );
        assert!(
            refused(serde_json::json!([{"headers": {"x": {"exact": "a b"}}}]))
                .contains("whitespace")
        );
        assert!(refused(serde_json::json!([{"headers": {}}])).contains("at least one"));
        assert!(
            refused(serde_json::json!([{"headers": {"x.y": {"exact": "a"}}}]))
                .contains("'-' or '_'")
        );
        assert!(refused(serde_json::json!([{"headers": {"x": {"exact": "1~9"}}}])).contains("~"));
        assert!(
            refused(serde_json::json!([{"headers": {"x": {"exact": "$a"}}}])).contains("leading $")
        );
        assert!(
            refused(serde_json::json!([{"headers": {"x": {"exact": ">beta"}}}])).contains("~ >")
        );
        assert!(
            refused(serde_json::json!([{"headers": {"x": {"regex": "insider|>beta"}}}]))
                .contains("condition syntax")
        );
        assert!(refused(serde_json::json!([{"headers": {"x": {}}}])).contains("exactly one"));
    }

    #[test]
    fn a_regex_becomes_the_globs_matching_the_same_values() {
        let spec = condition_route(
            "podinfo",
            &matches(serde_json::json!([
                {"headers": {"x-canary": {"regex": "^(insider|beta-.*)$"}}},
                {"headers": {"user-agent": {"regex": ".*-qa|app-.*_canary"}}},
            ])),
            &["10.0.0.1".to_owned()],
            &["10.1.0.1".to_owned()],
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("canary pods: a rule"));
        assert_eq!(
            spec.conditions,
            [
                "attachments[x-canary]=insider,beta-* => host=10.0.0.1",
                "attachments[user-agent]=*-qa,app-*_canary => host=10.0.0.1",
                "=> host=10.1.0.1",
            ]
        );
        for condition in &spec.conditions {
            dubbo_cp_domain::rules::parse_condition(condition)
                .unwrap_or_else(|e| panic!("{condition}: {e:?}"));
        }
    }

    /// Each regex no glob list says, refused with the field, the value and the reason.
    #[test]
    fn a_regex_no_glob_says_is_refused_by_field_value_and_reason() {
        let long = "a".repeat(1025);
        for (regex, reason) in [
            (".*", "matches every call"),
            ("^.*$", "matches every call"),
            ("a|.*", "matches every call"),
            (".*Firefox.*", "more than one `.*`"),
            ("a.*b.*c", "more than one `.*`"),
            (".+", "repetition `.+`"),
            ("beta-.+", "repetition `.+`"),
            ("a*", "repetition `a*`"),
            ("a?", "repetition `a?`"),
            ("a{2}", "repetition `a{2}`"),
            (".*?x", "repetition `.*?`"),
            ("(.)*", "repetition `(.)*`"),
            ("beta-[0-9]", "character class `[0-9]`"),
            ("\\d", "character class `\\d`"),
            ("\\pL", "character class `\\pL`"),
            ("(?i)insider", "case-insensitive"),
            ("(?i:insider)", "case-insensitive"),
            ("(?m)^a$", "flags `(?m)`"),
            ("(?-u)a", "flags `(?-u)`"),
            ("a.", "`.` at offset 1"),
            ("\\bword", "assertion `\\b`"),
            ("a|", "empty alternative"),
            ("", "empty alternative"),
            ("^$", "empty alternative"),
            ("a^b", "inside the value"),
            ("ab.*bc", "would also match `abc`"),
            ("app-.*-canary", "would also match `app-canary`"),
            ("a.*a", "would also match `a`"),
            ("aba.*ab", "would also match `abab`"),
            ("ab.*ba", "would also match `aba`"),
            ("a b", "condition syntax"),
            ("a,b", "condition syntax"),
            ("a\\*b", "condition syntax"),
            ("a&b|c", "condition syntax"),
            ("a!", "condition syntax"),
            ("a=b", "condition syntax"),
            ("1~9", "condition syntax"),
            ("\\$a", "starts with `$`"),
            ("\\$a.*", "starts with `$`"),
            ("(a", "does not parse: unclosed group"),
            (
                "(((((((((((((((((a)))))))))))))))))",
                "does not parse: exceed the maximum number of nested",
            ),
            ("(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)", "more than 64 globs"),
            (&long, "over 1024 characters"),
        ] {
            let refused = check(&matches(serde_json::json!([
                {"headers": {"x-canary": {"exact": "insider"}}},
                {"headers": {"user-agent": {"regex": regex}}},
            ])))
            .expect_err(regex);
            let said = format!(
                "spec.analysis.match[1].headers[\"user-agent\"]: regex {regex:?} cannot be said \
                 to Dubbo SDKs: "
            );
            assert!(
                refused.starts_with(&said)
                    && refused.contains(reason)
                    && refused.contains("; supported: "),
                "{regex}: {refused}"
            );
        }
    }
}
