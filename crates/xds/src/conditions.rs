//! Dubbo's ConditionRoute as routes: what xDS clients can match and select, translated; the rest
//! named, so the source can report it once per rule.
//!
//! A condition `when => then` becomes a route matching the request on the gRPC method (`method`,
//! against the last part of the path) and on metadata (`attachments[name]`), sending it to the
//! subset of endpoints `then` selects by `host`, `address`, `port` and endpoint labels (what
//! providers' URL parameters are to Dubbo). Values take Dubbo's `*` wildcards. As in Dubbo, a
//! `then` that leaves no endpoint is ignored unless the rule is `force`, and an empty (or
//! `false`) `then` refuses matching calls.
//!
//! A service-scoped rule (its key an interface) applies to the calls of that interface (the
//! path's service part), on the endpoints of the applications its ServiceNameMapping lists,
//! before their application-scoped conditions.
//!
//! Not expressible, and reported: `when` keys an xDS route cannot see (`arguments[N]`, the
//! consumer's host or URL parameters), `method!=...`, value ranges (`1~100`) and `$param`
//! references, and service keys with a group or version (endpoints carry neither). Routes are
//! first match, where Dubbo chains every condition a call matches: a call matching several gets
//! the first one's subset (reported for rules of several conditions).

use dubbo_cp_domain::rules::{ConditionRouteSpec, MatchClause, parse_condition};
use dubbo_cp_domain::service::{ServiceEndpoint, ServicePort};

/// Metadata keys with only `!=` values one condition may have (2^n routes).
const MAX_EXCLUDING_KEYS: usize = 3;

/// The translated conditions of the ConditionRoutes of one application, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conditions {
    pub conditions: Vec<Condition>,
}

/// One condition clients can apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// Method patterns the call must match one of (empty: any method).
    pub methods: Vec<String>,
    /// `(metadata key, patterns it must match one of, patterns it must match none of)`.
    pub headers: Vec<(String, Vec<String>, Vec<String>)>,
    /// What an endpoint must match; `None`: no endpoint (the call is refused).
    pub then: Option<Vec<MatchClause>>,
    /// The rule's `force`: a `then` that leaves nobody refuses the call instead of being
    /// ignored.
    pub force: bool,
    /// The interface a service-scoped rule is for: only its calls match.
    pub service: Option<String>,
}

/// `consumer.` and `provider.` are dropped before matching, as Dubbo does.
fn bare(key: &str) -> &str {
    key.strip_prefix("consumer.")
        .or_else(|| key.strip_prefix("provider."))
        .unwrap_or(key)
}

/// Why a value cannot be matched by a client, if it cannot.
fn unsupported_value(value: &str) -> Option<&'static str> {
    if value.starts_with('$') {
        Some("`$param` references")
    } else if value.contains('~') {
        Some("value ranges (`1~100`)")
    } else {
        None
    }
}

/// The rule's conditions clients can apply, and what is not translated (one message each).
pub fn translate(spec: &ConditionRouteSpec) -> (Conditions, Vec<String>) {
    let mut problems = Vec::new();
    let service = match spec.scope.as_str() {
        "application" => None,
        _ if spec.key.contains(['/', ':']) => {
            problems.push(format!(
                "service key {:?}: a group or a version selects providers, and endpoints carry \
                 neither",
                spec.key
            ));
            return (Conditions::default(), problems);
        }
        _ => Some(spec.key.clone()),
    };
    let mut conditions = Vec::new();
    for (i, text) in spec.conditions.iter().enumerate() {
        let Ok(parsed) = parse_condition(text) else {
            // Validated when applied; an invalid one never reaches here.
            continue;
        };
        match condition(&parsed.when, parsed.then) {
            Ok(condition) => conditions.push(Condition {
                force: spec.force,
                service: service.clone(),
                ..condition
            }),
            Err(why) => problems.push(format!(
                "conditions[{i}] is not applied by xDS clients: {why}"
            )),
        }
    }
    if conditions.len() > 1 {
        problems.push(
            "xDS routes are first match: a call matching several conditions gets the first one's \
             endpoints, where Dubbo narrows by each in turn"
                .to_owned(),
        );
    }
    (Conditions { conditions }, problems)
}

fn condition(when: &[MatchClause], then: Option<Vec<MatchClause>>) -> Result<Condition, String> {
    let mut methods = Vec::new();
    let mut headers = Vec::new();
    for clause in when {
        for value in clause.matches.iter().chain(&clause.mismatches) {
            if let Some(what) = unsupported_value(value) {
                return Err(format!("`{}` uses {what}", clause.key));
            }
        }
        let key = bare(&clause.key);
        if key == "method" {
            if !clause.mismatches.is_empty() {
                return Err("`method!=` (a route cannot match a method it excludes)".to_owned());
            }
            methods.extend(clause.matches.iter().cloned());
        } else if let Some(name) = key
            .strip_prefix("attachments[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            headers.push((
                name.to_ascii_lowercase(),
                clause.matches.clone(),
                clause.mismatches.clone(),
            ));
        } else {
            return Err(format!(
                "`when` key `{}`: xDS routes match only `method` and `attachments[...]`",
                clause.key
            ));
        }
    }
    // Each metadata key with only `!=` values doubles the condition's routes (sent, or not).
    let only_excluding = headers.iter().filter(|(_, m, _)| m.is_empty()).count();
    if only_excluding > MAX_EXCLUDING_KEYS {
        return Err(format!(
            "{only_excluding} attachments with only `!=` values; at most {MAX_EXCLUDING_KEYS} \
             (each doubles the routes)"
        ));
    }
    for clause in then.iter().flatten() {
        for value in clause.matches.iter().chain(&clause.mismatches) {
            if let Some(what) = unsupported_value(value) {
                return Err(format!("`{}` uses {what}", clause.key));
            }
        }
    }
    Ok(Condition {
        methods,
        headers,
        then,
        force: false,
        service: None,
    })
}

pub use dubbo_cp_domain::rules::condition::glob;

/// A pattern as an RE2 regex over the whole value (what a route's safe_regex takes), as
/// [`glob`] reads it; an overlapping prefix and suffix (`a*a` against `a`) do not match here.
pub fn glob_regex(pattern: &str) -> String {
    if pattern == "*" {
        return ".*".to_owned();
    }
    match pattern.rfind('*') {
        None => regex_escape(pattern),
        Some(at) => format!(
            "{}.*{}",
            regex_escape(&pattern[..at]),
            regex_escape(&pattern[at + 1..])
        ),
    }
}

pub(crate) fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Condition {
    /// Whether `endpoint` (serving `port`) is among the providers `then` leaves.
    pub fn selects(&self, endpoint: &ServiceEndpoint, port: &ServicePort) -> bool {
        let Some(then) = &self.then else {
            return false;
        };
        let ip = endpoint.address.to_string();
        let port_number = endpoint.port_for(port).to_string();
        let address = format!("{ip}:{port_number}");
        then.iter().all(|clause| {
            let value = match bare(&clause.key) {
                "host" => Some(ip.as_str()),
                "address" => Some(address.as_str()),
                "port" => Some(port_number.as_str()),
                label => endpoint.labels.get(label).map(String::as_str),
            };
            // As Dubbo: a provider without the parameter fails `key=...` and passes `key!=...`.
            let Some(value) = value else {
                return clause.matches.is_empty();
            };
            (clause.matches.is_empty() || clause.matches.iter().any(|p| glob(p, value)))
                && !clause.mismatches.iter().any(|p| glob(p, value))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(scope: &str, conditions: &[&str]) -> ConditionRouteSpec {
        keyed(scope, "greeter", conditions)
    }

    fn keyed(scope: &str, key: &str, conditions: &[&str]) -> ConditionRouteSpec {
        serde_json::from_value(serde_json::json!({
            "key": key, "scope": scope, "configVersion": "v3.0",
            "conditions": conditions, "force": true,
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn what_clients_can_match_is_translated_and_the_rest_named() {
        let (conditions, problems) = translate(&spec(
            "application",
            &[
                "method=sayHello,say* & attachments[X-User]=vip => host=10.0.0.*",
                "arguments[0]=1 => port=1",
                "method!=x => port=1",
                "method=a => port=1~5",
                "=> false",
            ],
        ));
        assert_eq!(conditions.conditions.len(), 2, "{conditions:?}");
        let first = &conditions.conditions[0];
        assert_eq!(first.methods, ["sayHello", "say*"]);
        assert_eq!(first.headers[0].0, "x-user");
        assert_eq!(conditions.conditions[1].then, None, "refuses every call");
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].starts_with("conditions[1]") && problems[0].contains("arguments[0]"));
        assert!(problems[1].contains("method!="));
        assert!(problems[2].contains("ranges"));
        assert!(problems[3].contains("first match"));
        assert!(
            conditions
                .conditions
                .iter()
                .all(|c| c.force && c.service.is_none())
        );
        // A service-scoped rule is for its interface's calls.
        let (scoped, problems) = translate(&keyed(
            "service",
            "org.example.Greeter",
            &["method=a => host=1.1.1.1"],
        ));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            scoped.conditions[0].service.as_deref(),
            Some("org.example.Greeter")
        );
        // A group or a version: refused, as endpoints carry neither.
        for key in ["shop/org.example.Greeter", "org.example.Greeter:1.0.0"] {
            let (none, problems) = translate(&keyed("service", key, &["=> host=1.1.1.1"]));
            assert!(none.conditions.is_empty());
            assert!(problems[0].contains("group or a version"), "{problems:?}");
        }
    }

    #[test]
    fn globs_match_as_dubbo_reads_them() {
        for (pattern, value, matched) in [
            ("10.0.0.*", "10.0.0.7", true),
            ("10.0.0.*", "10.0.1.7", false),
            ("*Hello", "sayHello", true),
            // Only the last `*` is a wildcard; the one before it is a character.
            ("s*H*o", "sayHello", false),
            ("s*H*o", "s*Hello", true),
            // Prefix and suffix may overlap, as in Dubbo.
            ("a*a", "a", true),
            ("exact", "exact", true),
            ("*", "", true),
            ("x*", "", false),
        ] {
            assert_eq!(glob(pattern, value), matched, "{pattern} {value}");
        }
        assert_eq!(glob_regex("say.*(x)"), r"say\..*\(x\)");
        assert_eq!(glob_regex("a*b*c"), r"a\*b.*c");
        assert_eq!(glob_regex("say.(x)*"), r"say\.\(x\).*");
        assert_eq!(glob_regex("*"), ".*");
    }

    #[test]
    fn then_selects_by_host_address_port_and_labels() {
        let endpoint = ServiceEndpoint {
            address: std::net::IpAddr::from([10, 0, 0, 7]),
            ports: std::collections::BTreeMap::new(),
            labels: [("version".to_string(), "v2".to_string())].into(),
            weight: 100,
            locality: String::new(),
        };
        let port = ServicePort {
            number: 7070,
            name: "grpc".into(),
            protocol: "GRPC".into(),
        };
        let then = |text: &str| {
            let parsed = parse_condition(text).unwrap_or_else(|e| panic!("{e}"));
            condition(&parsed.when, parsed.then).unwrap_or_else(|e| panic!("{e}"))
        };
        assert!(then("=> host=10.0.0.*").selects(&endpoint, &port));
        assert!(then("=> address=10.0.0.7:7070 & version=v2").selects(&endpoint, &port));
        assert!(!then("=> version!=v2").selects(&endpoint, &port));
        // Without the label: `=` fails, `!=` passes, as in Dubbo.
        assert!(!then("=> zone=*").selects(&endpoint, &port));
        assert!(then("=> zone!=a").selects(&endpoint, &port));
        assert!(!then("=> port=7071").selects(&endpoint, &port));
        assert!(!then("=> false").selects(&endpoint, &port));
    }
}
