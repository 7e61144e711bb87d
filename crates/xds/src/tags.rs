//! Dubbo's tag routing (TagRoute rules and static `dubbo.tag` labels) as header-matched routes
//! over subsets of a service's endpoints, with Dubbo's fallback and `force` semantics kept:
//!
//! - a request tagged T goes to the endpoints the rule gives T by address; if T has no
//!   addresses in the rule, to the endpoints whose static tag is T; if none is left (listed
//!   addresses all gone without `force`, or no static tag T), unless the request forces its tag
//!   (`dubbo-force-tag: true`), to the endpoints in no tag at all (neither listed by the rule
//!   nor statically tagged);
//! - a request without a tag goes to the endpoints no tag of the rule lists by address, less
//!   those statically tagged with one of the rule's tag names (nothing, when every endpoint is
//!   listed); without a rule, to the endpoints without a static tag.
//!
//! This is Dubbo 3's `TagStateRouter`. A tag that selects instances by their parameters (`match`,
//! configVersion v3.0) takes the endpoints whose labels match, as Dubbo's `TagRouterRule` turns
//! it into the addresses of the providers whose URL parameters match; one that matches no
//! endpoint (disabled ones, of weight 0, are no providers) counts as a tag without addresses
//! (the static tag decides).

use std::collections::BTreeSet;

use dubbo_cp_domain::rules::{Tag, TagRouteSpec};

use crate::conditions::{Condition, Conditions};
use dubbo_cp_domain::service::{ServiceEndpoint, ServicePort};

/// The request header (gRPC metadata) that carries the tag, as Dubbo's Triple clients send it
/// and as gRPC metadata allows it (`dubbo.tag` is the attachment name).
pub const TAG_HEADERS: [&str; 2] = ["dubbo-tag", "dubbo.tag"];
/// The header that forbids the fallback to untagged endpoints (Dubbo's `dubbo.force.tag`).
pub const FORCE_HEADERS: [&str; 2] = ["dubbo-force-tag", "dubbo.force.tag"];
/// The endpoint label of a static tag (Dubbo's `dubbo.tag` URL parameter).
pub const TAG_LABEL: &str = "dubbo.tag";

/// A set of a service's endpoints a route sends to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subset {
    /// What a request tagged with the name gets.
    Tagged(String),
    /// What it gets when it forces its tag (no fallback).
    Forced(String),
    /// What a request without a tag gets.
    Untagged,
    /// What a request matching the ConditionRoute's condition at this position may reach.
    Condition(usize),
}

impl Subset {
    /// The subset's part of a cluster name (`outbound|<port>|<subset>|<fqdn>`). Tag names may
    /// hold any character but whitespace, so they are written in hex: `|` or a `-forced` suffix
    /// in a tag must not change what the name means.
    pub fn name(&self) -> String {
        let hex = |tag: &str| tag.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        match self {
            Subset::Tagged(tag) => format!("tag-{}", hex(tag)),
            Subset::Forced(tag) => format!("forced-{}", hex(tag)),
            Subset::Untagged => "untagged".to_owned(),
            Subset::Condition(i) => format!("condition-{i}"),
        }
    }

    pub fn parse(name: &str) -> Option<Subset> {
        if name == "untagged" {
            return Some(Subset::Untagged);
        }
        if let Some(i) = name.strip_prefix("condition-") {
            // Digits only: `+1` or `01` would be a second name for one subset.
            if i.is_empty()
                || !i.bytes().all(|b| b.is_ascii_digit())
                || (i.len() > 1 && i.starts_with('0'))
            {
                return None;
            }
            return Some(Subset::Condition(i.parse().ok()?));
        }
        let unhex = |hex: &str| -> Option<String> {
            if !hex.len().is_multiple_of(2) {
                return None;
            }
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()?;
            String::from_utf8(bytes).ok()
        };
        if let Some(hex) = name.strip_prefix("tag-") {
            return Some(Subset::Tagged(unhex(hex)?));
        }
        Some(Subset::Forced(unhex(name.strip_prefix("forced-")?)?))
    }

    /// The tag the subset is for (`None` for untagged calls).
    pub fn tag(&self) -> Option<&str> {
        match self {
            Subset::Tagged(tag) | Subset::Forced(tag) => Some(tag),
            Subset::Untagged | Subset::Condition(_) => None,
        }
    }
}

/// One service port's endpoints and the rules of its application, if enabled: its TagRoute,
/// and its ConditionRoute's translated conditions (which route before tags).
pub struct Tagging<'a> {
    pub endpoints: &'a [ServiceEndpoint],
    pub port: &'a ServicePort,
    pub rule: Option<&'a TagRouteSpec>,
    pub conditions: Option<&'a Conditions>,
}

fn static_tag(endpoint: &ServiceEndpoint) -> Option<&str> {
    endpoint
        .labels
        .get(TAG_LABEL)
        .map(String::as_str)
        .filter(|tag| !tag.is_empty())
}

impl<'a> Tagging<'a> {
    /// Whether tags change anything: a rule, or an endpoint with a static tag.
    pub fn applies(&self) -> bool {
        self.rule.is_some() || self.endpoints.iter().any(|e| static_tag(e).is_some())
    }

    /// The conditions that route before tags (none without a ConditionRoute).
    pub fn conditions(&self) -> &'a [Condition] {
        self.conditions.map_or(&[], |c| c.conditions.as_slice())
    }

    /// Whether `addresses` list `endpoint` (`ip:port`, `ip`, or `*`).
    fn listed(&self, endpoint: &ServiceEndpoint, addresses: &[String]) -> bool {
        let ip = endpoint.address.to_string();
        let with_port = format!("{ip}:{}", endpoint.port_for(self.port));
        addresses
            .iter()
            .any(|a| a == "*" || *a == ip || *a == with_port)
    }

    /// Whether the rule's `tag` takes `endpoint`: listed by address, or (v3.0) matched by its
    /// parameters, which are an endpoint's labels as URL parameters are a provider's.
    fn takes(&self, tag: &Tag, endpoint: &ServiceEndpoint) -> bool {
        if !tag.addresses.is_empty() {
            return self.listed(endpoint, &tag.addresses);
        }
        let v3 = self
            .rule
            .is_some_and(|rule| rule.config_version.starts_with("v3.0"));
        // Disabled endpoints (weight 0) are no invokers to Dubbo, so no match takes them.
        v3 && endpoint.weight > 0
            && !tag.r#match.is_empty()
            && tag.r#match.iter().all(|m| m.matches(&endpoint.labels))
    }

    /// The rule's tag named `tag` when it has addresses (Dubbo's `tagnameToAddresses` holds
    /// it): listed ones, even if gone, or a `match` some endpoint passes.
    fn rule_tag(&self, tag: &str) -> Option<&'a Tag> {
        let found = self.rule?.tags.iter().find(|t| t.name == tag)?;
        (!found.addresses.is_empty() || self.endpoints.iter().any(|e| self.takes(found, e)))
            .then_some(found)
    }

    fn in_any_tag(&self, endpoint: &ServiceEndpoint) -> bool {
        self.rule
            .is_some_and(|rule| rule.tags.iter().any(|t| self.takes(t, endpoint)))
    }

    fn select(&self, keep: impl Fn(&ServiceEndpoint) -> bool) -> Vec<&'a ServiceEndpoint> {
        self.endpoints.iter().filter(|e| keep(e)).collect()
    }

    /// The endpoints of `subset`.
    pub fn endpoints_of(&self, subset: &Subset) -> Vec<&'a ServiceEndpoint> {
        match subset {
            Subset::Condition(i) => {
                let Some(condition) = self.conditions().get(*i) else {
                    return Vec::new();
                };
                // Endpoints that take no traffic (weight 0, disabled) are no providers to Dubbo.
                let selected = self.select(|e| e.weight > 0 && condition.selects(e, self.port));
                let force = condition.force;
                // As Dubbo: a `then` that leaves nobody is ignored unless the rule is `force`;
                // an empty `then` (`false`) refuses the call either way.
                if selected.is_empty() && !force && condition.then.is_some() {
                    return self.endpoints.iter().collect();
                }
                selected
            }
            Subset::Untagged => {
                let rule_names: BTreeSet<&str> = self
                    .rule
                    .map(|r| r.tags.iter().map(|t| t.name.as_str()).collect())
                    .unwrap_or_default();
                let Some(_) = self.rule else {
                    return self.select(|e| static_tag(e).is_none());
                };
                let outside = self.select(|e| !self.in_any_tag(e));
                outside
                    .into_iter()
                    .filter(|e| static_tag(e).is_none_or(|tag| !rule_names.contains(tag)))
                    .collect()
            }
            Subset::Forced(tag) => self.only(tag).0,
            Subset::Tagged(tag) => match self.only(tag) {
                (found, _) if !found.is_empty() => found,
                (found, true) => found,
                _ => self.select(|e| !self.in_any_tag(e) && static_tag(e).is_none()),
            },
        }
    }

    /// Whether a request tagged `tag` must not fall back when the tag's endpoints are gone: the
    /// rule gives the tag addresses and is `force`.
    pub fn forbids_fallback(&self, tag: &str) -> bool {
        self.only(tag).1
    }

    /// The endpoints a request tagged `tag` may reach before any fallback, and whether the rule
    /// forbids the fallback (`force` with the tag's addresses given).
    fn only(&self, tag: &str) -> (Vec<&'a ServiceEndpoint>, bool) {
        // Disabled endpoints (weight 0) are no providers to Dubbo: a tag of only those has none.
        if let Some(rule_tag) = self.rule_tag(tag) {
            let found = self.select(|e| e.weight > 0 && self.takes(rule_tag, e));
            let force = self.rule.is_some_and(|r| r.force);
            if !found.is_empty() || force {
                return (found, force);
            }
            // Listed addresses that are all gone, without force: fall back, as Dubbo does.
            return (found, false);
        }
        (
            self.select(|e| e.weight > 0 && static_tag(e) == Some(tag)),
            false,
        )
    }

    /// Whether routes of this tagging name `subset`: it applies, and the subset is untagged calls,
    /// one of [`Tagging::tags`], or any other tag (the empty one). Clients cannot make up others.
    pub fn routes_to(&self, subset: &Subset) -> bool {
        if let Subset::Condition(i) = subset {
            return *i < self.conditions().len();
        }
        self.applies()
            && subset
                .tag()
                .is_none_or(|tag| tag.is_empty() || self.tags().contains(tag))
    }

    /// The tags a request may name that route differently: the rule's and the static ones.
    pub fn tags(&self) -> BTreeSet<&'a str> {
        let mut tags: BTreeSet<&'a str> = self
            .rule
            .map(|r| r.tags.iter().map(|t| t.name.as_str()).collect())
            .unwrap_or_default();
        tags.extend(self.endpoints.iter().filter_map(static_tag));
        tags
    }
}

#[cfg(test)]
mod tests;
