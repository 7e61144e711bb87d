//! AuthorizationPolicies as gRPC's RBAC HTTP filters (gRFC A41): a DENY filter, then an ALLOW
//! filter, then the router, as Istio orders them. Never marked optional: an optional filter a
//! client does not know is skipped, which would let every call in.
//!
//! What maps: callers' `namespaces`, `principals` and the `spiffeID`, `id` and
//! `kubernetesEnv.namespace` extends to the peer certificate's SPIFFE ID; `ipBlocks` and the
//! `ips` extend to the peer address; `when` on `method`, `interface`, `path` and
//! `attachments.<name>` (request metadata) to the path and headers; each `not*` form inverted.
//! What gRPC cannot check (pod names, labels and annotations of callers, other `when` keys,
//! sampling, audit) is reported, never dropped silently, and never fails open: an ALLOW rule
//! with such a part allows nobody; a DENY rule loses only that part, so it denies more.

use std::collections::BTreeMap;

use dubbo_cp_domain::rules::{
    AuthorizationPolicySpec, AuthorizationRule, Cidr, Condition, Match, PolicyExtend,
    PolicySelector,
};
use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, permission, principal,
};
use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    PathMatcher, RegexMatcher, StringMatcher, path_matcher, string_matcher,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use prost::Message;

use super::Named;
use crate::conditions::regex_escape;

pub const DENY_FILTER: &str = "envoy.filters.http.rbac.DENY";
pub const ALLOW_FILTER: &str = "envoy.filters.http.rbac";
const RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
const ALLOW: i32 = 0;
const DENY: i32 = 1;

/// Envoy's `config.rbac.v3.RBAC`, with its policies in a sorted map. The generated type holds a
/// `HashMap`, which encodes in a different order each time: an unchanged policy set would be new
/// bytes, so servers would be sent (and drain their connections for) a listener that did not
/// change. Same fields, same tags, same wire format.
#[derive(Clone, PartialEq, Message)]
struct SortedRbac {
    #[prost(int32, tag = "1")]
    action: i32,
    #[prost(btree_map = "string, message", tag = "2")]
    policies: BTreeMap<String, Policy>,
}

/// `extensions.filters.http.rbac.v3.RBAC`: the `rules` field only (shadow rules and matchers
/// are not supported by gRPC).
#[derive(Clone, PartialEq, Message)]
struct RbacFilter {
    #[prost(message, optional, tag = "1")]
    rules: Option<SortedRbac>,
}

/// What a server enforces, and what it cannot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translated {
    /// DENY, then ALLOW; the router goes after them.
    pub filters: Vec<HttpFilter>,
    /// `namespace/name` of every policy enforced, by action.
    pub deny: Vec<String>,
    pub allow: Vec<String>,
    /// `(policy, what is not enforced as written)`.
    pub problems: Vec<(String, String)>,
    /// Policies with rules on the caller's address.
    pub peer_rules: Vec<String>,
}

/// The RBAC filters of a server whose applying policies are `policies`; `mtls` says whether its
/// callers present certificates (principal rules can match only then).
pub fn translate<'a>(
    policies: impl Iterator<Item = &'a Named<AuthorizationPolicySpec>>,
    mtls: bool,
) -> Translated {
    let mut out = Translated::default();
    let mut deny = BTreeMap::new();
    let mut allow = BTreeMap::new();
    for policy in policies {
        let key = policy.key();
        let spec = &policy.spec;
        let mut problem = |text: String| out.problems.push((key.clone(), text));
        let (is_deny, into) = match spec.action.as_str() {
            "DENY" => (true, &mut deny),
            "ALLOW" => (false, &mut allow),
            _ => {
                problem(
                    "action ADULT (audit) is not enforced: gRPC ignores RBAC's LOG action"
                        .to_owned(),
                );
                continue;
            }
        };
        if spec.samples > 0.0 && spec.samples < 100.0 {
            problem(format!(
                "samples {}: gRPC checks every call, not a share of them",
                spec.samples
            ));
        }
        let mut context = Context {
            deny: is_deny,
            mtls,
            problems: Vec::new(),
            peer: false,
        };
        let rules: Vec<Option<(Permission, Principal)>> = if spec.rules.is_empty() {
            vec![Some((any_permission(), any_principal()))]
        } else {
            spec.rules.iter().map(|rule| context.rule(rule)).collect()
        };
        for text in context.problems.drain(..) {
            problem(text);
        }
        if context.peer {
            out.peer_rules.push(key.clone());
        }
        let all = spec.match_type == "ALL_MATCH";
        let mut kept = Vec::new();
        if all {
            // Every rule must match: one policy of the conjunctions. An ALLOW rule gRPC cannot
            // check makes the whole policy allow nobody.
            if let Some(rules) = rules.into_iter().collect::<Option<Vec<_>>>() {
                let (permissions, principals): (Vec<_>, Vec<_>) = rules.into_iter().unzip();
                kept.push((
                    format!("{key}[all]"),
                    Policy {
                        permissions: vec![and_permissions(permissions)],
                        principals: vec![and_principals(principals)],
                        ..Default::default()
                    },
                ));
            }
        } else {
            for (i, rule) in rules.into_iter().enumerate() {
                if let Some((permission, principal)) = rule {
                    kept.push((
                        format!("{key}[{i}]"),
                        Policy {
                            permissions: vec![permission],
                            principals: vec![principal],
                            ..Default::default()
                        },
                    ));
                }
            }
        }
        if is_deny {
            out.deny.push(key.clone());
        } else {
            out.allow.push(key.clone());
        }
        into.extend(kept);
    }
    // An ALLOW policy that kept no rule still applies: it allows nobody, so the filter is there
    // (empty), and every call is denied, as Istio does for an ALLOW policy matching nothing.
    if !out.deny.is_empty() {
        out.filters.push(filter(DENY_FILTER, DENY, deny));
    }
    if !out.allow.is_empty() {
        out.filters.push(filter(ALLOW_FILTER, ALLOW, allow));
    }
    out
}

fn filter(name: &str, action: i32, policies: BTreeMap<String, Policy>) -> HttpFilter {
    let config = RbacFilter {
        rules: Some(SortedRbac { action, policies }),
    };
    HttpFilter {
        name: name.to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: RBAC_TYPE.to_owned(),
            value: config.encode_to_vec(),
        })),
        // Never optional: a client that skipped it would let every call in.
        is_optional: false,
        ..Default::default()
    }
}

/// One policy's translation state.
struct Context {
    deny: bool,
    mtls: bool,
    problems: Vec<String>,
    /// Whether a rule names callers by address.
    peer: bool,
}

impl Context {
    /// A rule as (what is called, who calls); `None` when an ALLOW rule cannot be checked.
    fn rule(&mut self, rule: &AuthorizationRule) -> Option<(Permission, Principal)> {
        let principal = match &rule.from {
            Some(from) => self.callers(from)?,
            None => any_principal(),
        };
        let permission = match &rule.when {
            Some(when) => self.condition(when)?,
            None => any_permission(),
        };
        Some((permission, principal))
    }

    /// A part gRPC cannot check: an ALLOW rule holding it never matches (`None`); a DENY rule
    /// goes on without it (`Some(None)`).
    fn unsupported<T>(&mut self, what: String) -> Option<Option<T>> {
        if self.deny {
            self.problems.push(format!(
                "{what}: gRPC cannot check it, so the DENY rule applies without it (denies more)"
            ));
            Some(None)
        } else {
            self.problems.push(format!(
                "{what}: gRPC cannot check it, so the ALLOW rule allows nobody"
            ));
            None
        }
    }

    /// "Not one of these identities". In an ALLOW rule a caller must also have one: a
    /// plaintext caller has none, and is not let in by a `not` form (RBAC alone would: an
    /// absent principal is not any of them).
    fn not_identity(&self, identities: Principal) -> Principal {
        let negated = not_principal(identities);
        if self.deny {
            negated
        } else {
            and_principals(vec![any_identity(), negated])
        }
    }

    fn callers(&mut self, from: &PolicySelector) -> Option<Principal> {
        let mut parts = Vec::new();
        let mut identity_used = false;
        if !from.namespaces.is_empty() {
            identity_used = true;
            parts.push(or_principals(
                from.namespaces.iter().map(|ns| namespace(ns)),
            ));
        }
        if !from.not_namespaces.is_empty() {
            identity_used = true;
            parts.push(self.not_identity(or_principals(
                from.not_namespaces.iter().map(|ns| namespace(ns)),
            )));
        }
        self.peer |= !from.ip_blocks.is_empty() || !from.not_ip_blocks.is_empty();
        for (blocks, negate, field) in [
            (&from.ip_blocks, false, "ipBlocks"),
            (&from.not_ip_blocks, true, "notIpBlocks"),
        ] {
            if blocks.is_empty() {
                continue;
            }
            let mut ranges = Vec::new();
            for block in blocks {
                match Cidr::parse(block) {
                    Ok(cidr) => ranges.push(peer_in(&cidr)),
                    Err(err) => {
                        if let Some(part) = self.unsupported(format!(
                            "from.{field} {block:?} is not a CIDR block ({err})"
                        ))? {
                            ranges.push(part);
                        }
                    }
                }
            }
            if !ranges.is_empty() {
                let any = or_principals(ranges);
                parts.push(if negate { not_principal(any) } else { any });
            }
        }
        if !from.principals.is_empty() {
            identity_used = true;
            parts.push(or_principals(
                from.principals.iter().map(|p| spiffe_exact(p)),
            ));
        }
        if !from.not_principals.is_empty() {
            identity_used = true;
            parts.push(self.not_identity(or_principals(
                from.not_principals.iter().map(|p| spiffe_exact(p)),
            )));
        }
        for (extends, negate, field) in [
            (&from.extends, false, "extends"),
            (&from.not_extends, true, "notExtends"),
        ] {
            if extends.is_empty() {
                continue;
            }
            let mut alternatives = Vec::new();
            let mut checkable = true;
            let mut identity = false;
            for extend in extends {
                match extend_principal(extend) {
                    Some((principal, by_identity)) => {
                        identity |= by_identity;
                        self.peer |= !by_identity;
                        alternatives.push(principal);
                    }
                    None => checkable = false,
                }
            }
            identity_used |= identity;
            if checkable {
                let any = or_principals(alternatives);
                parts.push(match (negate, identity) {
                    (false, _) => any,
                    (true, true) => self.not_identity(any),
                    (true, false) => not_principal(any),
                });
            } else {
                let keys: Vec<&str> = extends.iter().map(|e| e.key.as_str()).collect();
                self.unsupported::<Principal>(format!(
                    "from.{field} on {keys:?} (a caller's pod name, labels and annotations are not in its call)"
                ))?;
            }
        }
        if identity_used && !self.mtls {
            self.problems.push(
                if self.deny {
                    "from names callers by identity (namespaces, principals), which a server learns \
                     only from client certificates: on this plaintext port callers have none, so \
                     the DENY rule denies nobody (its `not` forms, everybody); set the port STRICT"
                } else {
                    "from names callers by identity (namespaces, principals), which a server learns \
                     only from client certificates: on this plaintext port callers have none, so \
                     the ALLOW rule lets nobody in; set the port STRICT"
                }
                .to_owned(),
            );
        }
        Some(and_principals(parts))
    }

    fn condition(&mut self, when: &Condition) -> Option<Permission> {
        let key = when.key.as_str();
        let mut matcher = |m: &Match| -> Result<Permission, String> {
            if let Some(name) = key
                .strip_prefix("attachments.")
                .or_else(|| key.strip_prefix("headers."))
            {
                let name = name.to_ascii_lowercase();
                // gRPC NACKs a matcher on these (A41): the whole listener would be refused. A
                // name that is not an HTTP/2 header name never matches.
                let token = |b: u8| b.is_ascii_alphanumeric() || b"-_.".contains(&b);
                if name.starts_with("grpc-") || name.is_empty() || !name.bytes().all(token) {
                    return Err(format!("when.key {key:?} names no header gRPC can match"));
                }
                return Ok(permission(permission::Rule::Header(HeaderMatcher {
                    name,
                    header_match_specifier: Some(
                        header_matcher::HeaderMatchSpecifier::StringMatch(string(m)?),
                    ),
                    ..Default::default()
                })));
            }
            let path = match key {
                "path" => string(m)?,
                // gRPC paths are `/<package.Service>/<method>`.
                "method" => regex(format!("/[^/]+/{}", pattern(m)?)),
                "interface" | "service" => regex(format!("/{}/[^/]+", pattern(m)?)),
                _ => {
                    return Err(format!(
                        "when.key {key:?} (gRPC checks method, interface, path, attachments.<name>)"
                    ));
                }
            };
            Ok(permission(permission::Rule::UrlPath(PathMatcher {
                rule: Some(path_matcher::Rule::Path(path)),
            })))
        };
        let mut translate = |values: &[Match]| -> Result<Vec<Permission>, String> {
            values.iter().map(&mut matcher).collect()
        };
        let result = (|| {
            let mut parts = Vec::new();
            if !when.values.is_empty() {
                parts.push(or_permissions(translate(&when.values)?));
            }
            if !when.not_values.is_empty() {
                parts.push(permission(permission::Rule::NotRule(Box::new(
                    or_permissions(translate(&when.not_values)?),
                ))));
            }
            Ok::<_, String>(and_permissions(parts))
        })();
        match result {
            Ok(permission) => Some(permission),
            Err(what) => Some(
                self.unsupported::<Permission>(what)?
                    .unwrap_or_else(any_permission),
            ),
        }
    }
}

/// A value's comparison as a whole-string matcher.
fn string(m: &Match) -> Result<StringMatcher, String> {
    let pattern = match m.r#type.as_str() {
        "" | "exact" => string_matcher::MatchPattern::Exact(m.value.clone()),
        "prefix" => string_matcher::MatchPattern::Prefix(m.value.clone()),
        "suffix" => string_matcher::MatchPattern::Suffix(m.value.clone()),
        "contains" => string_matcher::MatchPattern::Contains(m.value.clone()),
        "regex" => {
            checked_regex(&m.value)?;
            // grpc-js anchors a regex as `^<regex>$`: ungrouped, `a|b` would be `^a` or `b$`.
            string_matcher::MatchPattern::SafeRegex(RegexMatcher {
                regex: format!("(?:{})", m.value),
                ..Default::default()
            })
        }
        other => {
            return Err(format!(
                "match type {other:?} (exact, prefix, suffix, contains, regex)"
            ));
        }
    };
    Ok(StringMatcher {
        match_pattern: Some(pattern),
        ignore_case: false,
    })
}

/// A value's comparison as a piece of a regular expression.
fn pattern(m: &Match) -> Result<String, String> {
    let escaped = regex_escape(&m.value);
    Ok(match m.r#type.as_str() {
        "" | "exact" => escaped,
        "prefix" => format!("{escaped}.*"),
        "suffix" => format!(".*{escaped}"),
        "contains" => format!(".*{escaped}.*"),
        "regex" => {
            checked_regex(&m.value)?;
            // Matched inside the path, where anchors would never match: a pattern anchored at
            // both ends of a method or interface name means that name.
            format!("(?:{})", unanchored(&m.value))
        }
        other => {
            return Err(format!(
                "match type {other:?} (exact, prefix, suffix, contains, regex)"
            ));
        }
    })
}

/// `text` without a leading `^` and a trailing unescaped `$`.
fn unanchored(text: &str) -> &str {
    let text = text.strip_prefix('^').unwrap_or(text);
    match text.strip_suffix('$') {
        Some(rest) if !rest.ends_with('\\') || rest.ends_with("\\\\") => rest,
        _ => text,
    }
}

/// A regular expression clients would NACK (and the whole listener with it) is refused here:
/// one that does not compile, or that uses what Rust's regex takes and RE2 (which gRPC uses)
/// refuses: flags other than `i`, `m`, `s`, `U`, repetitions over 1,000, `\<`, `\>`, `\b{..}`
/// and class set operations.
fn checked_regex(text: &str) -> Result<(), String> {
    regex::Regex::new(text).map_err(|err| format!("regex {text:?} does not compile ({err})"))?;
    let refused = |why: &str| Err(format!("regex {text:?}: {why}, which gRPC's RE2 refuses"));
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut class_depth = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                match bytes.get(i + 1) {
                    Some(b'<' | b'>') => return refused("a word-boundary escape"),
                    Some(b'b' | b'B') if bytes.get(i + 2) == Some(&b'{') => {
                        return refused("a word-boundary escape");
                    }
                    _ => {}
                }
                i += 2;
                continue;
            }
            b'[' => class_depth += 1,
            b']' if class_depth > 0 => class_depth -= 1,
            b'&' | b'-' | b'~' if class_depth > 0 && bytes.get(i + 1) == Some(&bytes[i]) => {
                return refused("a class set operation");
            }
            b'(' if class_depth == 0 && bytes.get(i + 1) == Some(&b'?') => {
                let flags: Vec<u8> = bytes[i + 2..]
                    .iter()
                    .copied()
                    .take_while(|b| *b != b':' && *b != b')')
                    .collect();
                let named = flags.first().is_some_and(|b| *b == b'P' || *b == b'<');
                if !named && !flags.iter().all(|b| b"imsU-".contains(b)) {
                    return refused("a flag other than i, m, s, U");
                }
            }
            b'{' if class_depth == 0 => {
                let counts: String = bytes[i + 1..]
                    .iter()
                    .take_while(|b| **b != b'}')
                    .map(|b| char::from(*b))
                    .collect();
                if counts
                    .split(',')
                    .filter_map(|n| n.trim().parse::<u32>().ok())
                    .any(|n| n > 1000)
                {
                    return refused("a repetition over 1,000");
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

fn regex(regex: String) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex,
            ..Default::default()
        })),
        ignore_case: false,
    }
}

/// An extend as a principal, and whether it names the caller by identity; `None` when a call
/// does not carry what it selects.
fn extend_principal(extend: &PolicyExtend) -> Option<(Principal, bool)> {
    let value = extend.value.as_str();
    let mut parts = extend.key.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("spiffeID"), None, None) => Some((spiffe_exact(value), true)),
        (Some("kubernetesEnv"), Some("namespace"), None) => Some((namespace(value), true)),
        // `<namespace>/<service account>`, as the CA names identities.
        (Some("id"), None, None) => {
            let (ns, account) = value.split_once('/')?;
            Some((
                authenticated(regex(format!(
                    "spiffe://[^/]+/ns/{}/sa/{}",
                    regex_escape(ns),
                    regex_escape(account)
                ))),
                true,
            ))
        }
        (Some("ips"), None, None) => {
            let ip: std::net::IpAddr = value.parse().ok()?;
            let bits = if ip.is_ipv4() { 32 } else { 128 };
            let cidr = Cidr::parse(&format!("{ip}/{bits}")).ok()?;
            Some((peer_in(&cidr), false))
        }
        _ => None,
    }
}

/// Any caller with a SPIFFE ID (a client certificate from our CA).
fn any_identity() -> Principal {
    authenticated(regex("spiffe://.+".to_owned()))
}

fn authenticated(name: StringMatcher) -> Principal {
    principal_of(principal::Identifier::Authenticated(
        principal::Authenticated {
            principal_name: Some(name),
        },
    ))
}

/// Any service account of `namespace`, of any trust domain (as the discovery stream's
/// selectors match namespaces).
fn namespace(ns: &str) -> Principal {
    authenticated(regex(format!(
        "spiffe://[^/]+/ns/{}/sa/[^/]+",
        regex_escape(ns)
    )))
}

/// A SPIFFE ID, given with or without `spiffe://`.
fn spiffe_exact(id: &str) -> Principal {
    let id = id.strip_prefix("spiffe://").unwrap_or(id);
    authenticated(StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Exact(format!(
            "spiffe://{id}"
        ))),
        ignore_case: false,
    })
}

fn peer_in(cidr: &Cidr) -> Principal {
    principal_of(principal::Identifier::DirectRemoteIp(CidrRange {
        address_prefix: cidr.network().to_string(),
        prefix_len: Some(UInt32Value {
            value: u32::from(cidr.prefix()),
        }),
    }))
}

fn principal_of(identifier: principal::Identifier) -> Principal {
    Principal {
        identifier: Some(identifier),
    }
}

fn any_principal() -> Principal {
    principal_of(principal::Identifier::Any(true))
}

fn not_principal(inner: Principal) -> Principal {
    principal_of(principal::Identifier::NotId(Box::new(inner)))
}

fn or_principals(ids: impl IntoIterator<Item = Principal>) -> Principal {
    let mut ids: Vec<Principal> = ids.into_iter().collect();
    if ids.len() == 1 {
        return ids.remove(0);
    }
    principal_of(principal::Identifier::OrIds(principal::Set { ids }))
}

/// All of `ids` (none: anyone).
fn and_principals(mut ids: Vec<Principal>) -> Principal {
    match ids.len() {
        0 => any_principal(),
        1 => ids.remove(0),
        _ => principal_of(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

fn permission(rule: permission::Rule) -> Permission {
    Permission { rule: Some(rule) }
}

fn any_permission() -> Permission {
    permission(permission::Rule::Any(true))
}

fn or_permissions(rules: Vec<Permission>) -> Permission {
    let mut rules = rules;
    if rules.len() == 1 {
        return rules.remove(0);
    }
    permission(permission::Rule::OrRules(permission::Set { rules }))
}

/// All of `rules` (none: anything).
fn and_permissions(mut rules: Vec<Permission>) -> Permission {
    match rules.len() {
        0 => any_permission(),
        1 => rules.remove(0),
        _ => permission(permission::Rule::AndRules(permission::Set { rules })),
    }
}

#[cfg(test)]
#[path = "rbac_tests.rs"]
mod tests;
