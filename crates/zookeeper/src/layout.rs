//! Where each object lives in ZooKeeper, in Dubbo's own layout, and what a znode path is.
//!
//! - A namespace is a Dubbo *group*: namespace `default` has root `/dubbo` (Dubbo's default
//!   group), any other namespace `N` has root `/N`, as a registry group does.
//! - Mappings (metadata report): `/<root>/mapping/<interface>`.
//! - Governance rules (config center, group `dubbo`): `/<root>/config/dubbo/<rule key>`, the rule
//!   key being `<app>.tag-router`, `<app>.condition-router`, `<app>.configurators`, or for a
//!   service `<interface>:<version>:<group>.condition-router` / `.configurators`.
//! - Kinds Dubbo has no config-center form for: `/dubbo-cp/<namespace>/<plural>/<name>`.
//! - Providers: `/<root>/<interface>/providers/<URL-encoded URL>` (interface level) and
//!   `/services/<app>/<instance>` (Dubbo 3's application level).

use crate::mapping::MappingKey;
use crate::rules::{Kind, RuleSpec};

/// The namespace whose root is Dubbo's default group.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Dubbo's default group, the root of namespace `default`.
pub const DEFAULT_ROOT: &str = "dubbo";
/// Our own subtree, for the kinds Dubbo has no config-center form for.
pub const OURS: &str = "dubbo-cp";
/// Dubbo 3's application-level instances.
pub const SERVICES: &str = "services";
/// The config-center group every Dubbo governance reader uses.
pub const CONFIG_GROUP: &str = "dubbo";

/// Top-level names that are not a namespace's root: a namespace with one of these names would
/// share its root with something else, so registrations and rules in it are refused.
pub const RESERVED_NAMESPACES: [&str; 4] = [DEFAULT_ROOT, OURS, SERVICES, "zookeeper"];

/// The suffixes of the rule keys dubbo-cp reads and writes.
const TAG_SUFFIX: &str = ".tag-router";
const CONDITION_SUFFIX: &str = ".condition-router";
const CONFIGURATORS_SUFFIX: &str = ".configurators";

/// Why an object has no place in ZooKeeper.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason} (got {value:?})")]
pub struct LayoutError {
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

fn refuse(field: &'static str, value: &str, reason: impl Into<String>) -> LayoutError {
    LayoutError {
        field,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

/// The root of `namespace`: `/dubbo` for `default`, `/<namespace>` otherwise.
pub fn root_of(namespace: &str) -> Result<String, LayoutError> {
    if namespace == DEFAULT_NAMESPACE {
        return Ok(format!("/{DEFAULT_ROOT}"));
    }
    if RESERVED_NAMESPACES.contains(&namespace) {
        return Err(refuse(
            "namespace",
            namespace,
            format!(
                "is reserved in ZooKeeper mode ({} are not namespace roots; namespace `default` \
                 is /dubbo)",
                RESERVED_NAMESPACES.join(", ")
            ),
        ));
    }
    segment("namespace", namespace)?;
    Ok(format!("/{namespace}"))
}

/// The namespace whose root is the top-level node `name`, if it is one.
pub fn namespace_of_root(name: &str) -> Option<String> {
    if name == DEFAULT_ROOT {
        return Some(DEFAULT_NAMESPACE.to_owned());
    }
    if name.is_empty() || RESERVED_NAMESPACES.contains(&name) || name == DEFAULT_NAMESPACE {
        // `/default` would read as a second `default` namespace: `default`'s root is /dubbo.
        return None;
    }
    Some(name.to_owned())
}

/// Characters ZooKeeper refuses in a path (its `PathUtils.validatePath`): controls, the
/// surrogate and private-use block, the specials, and anything beyond the Basic Multilingual
/// Plane (the server sees it as surrogates).
fn refused_char(c: char) -> bool {
    let u = u32::from(c);
    [
        0x0000..=0x001f,
        0x007f..=0x009f,
        0xd800..=0xf8ff,
        0xfff0..=0xffff,
    ]
    .into_iter()
    .any(|range| range.contains(&u))
        || u > 0xffff
}

/// One path segment: no `/`, not `.` or `..`, no character ZooKeeper refuses.
fn segment(field: &'static str, value: &str) -> Result<(), LayoutError> {
    if value.is_empty() || value == "." || value == ".." {
        return Err(refuse(field, value, "is not a ZooKeeper node name"));
    }
    if value.contains('/') {
        return Err(refuse(
            field,
            value,
            "must not contain '/' in ZooKeeper mode (it names one node)",
        ));
    }
    if let Some(c) = value.chars().find(|c| refused_char(*c)) {
        return Err(refuse(
            field,
            value,
            format!(
                "contains {c:?} (U+{:04X}), which ZooKeeper refuses in node names (controls, \
                 U+D800-U+F8FF, U+FFF0-U+FFFF and characters beyond U+FFFF)",
                u32::from(c)
            ),
        ));
    }
    Ok(())
}

/// Whether a registration for `namespace` and `interface` has a node (checked before it is
/// acknowledged, so nothing is accepted that could never be written).
pub fn check_registration(namespace: &str, interface: &str) -> Result<(), LayoutError> {
    root_of(namespace)?;
    segment("interfaceNames", interface)
}

/// `/<root>/mapping/<interface>`, where Dubbo's metadata report keeps the applications.
pub fn mapping_path(key: &MappingKey) -> Result<String, LayoutError> {
    let root = root_of(&key.namespace)?;
    segment("interfaceNames", &key.interface)?;
    Ok(format!("{root}/mapping/{}", key.interface))
}

/// `/<root>/config/dubbo`, the config-center directory of a namespace.
pub fn config_dir(namespace: &str) -> Result<String, LayoutError> {
    Ok(format!("{}/config/{CONFIG_GROUP}", root_of(namespace)?))
}

/// `/dubbo-cp/<namespace>/<plural>`, where our own kinds live.
pub fn ours_dir(namespace: &str, kind: Kind) -> Result<String, LayoutError> {
    segment("metadata.namespace", namespace)?;
    Ok(format!("/{OURS}/{namespace}/{}", kind.plural()))
}

/// A rule kind Dubbo reads from its config center.
pub fn in_config_center(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::TagRoute | Kind::ConditionRoute | Kind::DynamicConfig
    )
}

/// The config-center key of a Dubbo rule: what its `key` and `scope` say, with the kind's suffix.
pub fn rule_key(spec: &RuleSpec) -> Option<Result<String, LayoutError>> {
    let (key, scope, suffix) = match spec {
        RuleSpec::TagRoute(spec) => (&spec.key, "application", TAG_SUFFIX),
        RuleSpec::ConditionRoute(spec) => (&spec.key, spec.scope.as_str(), CONDITION_SUFFIX),
        RuleSpec::DynamicConfig(spec) => (&spec.key, spec.scope.as_str(), CONFIGURATORS_SUFFIX),
        _ => return None,
    };
    let base = if scope == "service" {
        service_node_key(key)
    } else {
        if key.contains(':') {
            return Some(Err(refuse(
                "spec.key",
                key,
                "an application name must not contain ':' (Dubbo reads such a key as a service)",
            )));
        }
        key.clone()
    };
    let name = format!("{base}{suffix}");
    Some(segment("spec.key", &name).map(|()| name))
}

/// dubbo-cp's service key `group/interface:version` (group and version optional) as Dubbo's
/// colon-separated `interface:version:group`, empty parts kept.
pub fn service_node_key(key: &str) -> String {
    let (group, rest) = key.split_once('/').unwrap_or(("", key));
    let (interface, version) = rest.split_once(':').unwrap_or((rest, ""));
    format!("{interface}:{version}:{group}")
}

/// Dubbo's `interface:version:group` as dubbo-cp's `group/interface:version`.
pub fn service_key(node_key: &str) -> String {
    let mut parts = node_key.splitn(3, ':');
    let interface = parts.next().unwrap_or_default();
    let version = parts.next().unwrap_or_default();
    let group = parts.next().unwrap_or_default();
    let mut key = String::new();
    if !group.is_empty() {
        key.push_str(group);
        key.push('/');
    }
    key.push_str(interface);
    if !version.is_empty() {
        key.push(':');
        key.push_str(version);
    }
    key
}

/// A rule's config-center node, read back: its kind, `key` and `scope`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleNode {
    pub kind: Kind,
    /// dubbo-cp's form of the key (`group/interface:version` for a service).
    pub key: String,
    /// `application` or `service` (a TagRoute is always `application`).
    pub scope: &'static str,
}

/// The rule a config-center node name holds, if it is one dubbo-cp reads.
pub fn parse_rule_key(name: &str) -> Option<RuleNode> {
    let (kind, base) = [
        (Kind::TagRoute, TAG_SUFFIX),
        (Kind::ConditionRoute, CONDITION_SUFFIX),
        (Kind::DynamicConfig, CONFIGURATORS_SUFFIX),
    ]
    .into_iter()
    .find_map(|(kind, suffix)| name.strip_suffix(suffix).map(|base| (kind, base)))?;
    if base.is_empty() {
        return None;
    }
    if base.contains(':') {
        // A TagRoute is keyed by application only (Dubbo has no service-level tag rule), and
        // Dubbo's service key always has two colons (`interface:version:group`).
        if kind == Kind::TagRoute || base.matches(':').count() != 2 {
            return None;
        }
        return Some(RuleNode {
            kind,
            key: service_key(base),
            scope: "service",
        });
    }
    Some(RuleNode {
        kind,
        key: base.to_owned(),
        scope: "application",
    })
}

/// What a znode path is, for the watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// `/<root>/mapping/<interface>`.
    Mapping(MappingKey),
    /// `/<root>/config/dubbo/<rule key>` of a kind dubbo-cp reads.
    Rule { namespace: String, name: String },
    /// `/dubbo-cp/<namespace>/<plural>/<name>`.
    Ours {
        namespace: String,
        kind: Kind,
        name: String,
    },
    /// `/<root>/<interface>/providers/<URL-encoded URL>`.
    Provider {
        namespace: String,
        interface: String,
        url: String,
    },
    /// `/services/<app>/<instance>`.
    Instance { application: String, id: String },
    /// Anything else (consumers, routers, metadata, parents).
    Other,
}

/// Classifies a path (no trailing `/`).
pub fn classify(path: &str) -> Node {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [SERVICES, application, id] => Node::Instance {
            application: (*application).to_owned(),
            id: (*id).to_owned(),
        },
        [OURS, namespace, plural, name] => {
            match crate::rules::RULE_KINDS
                .into_iter()
                .find(|kind| kind.plural() == *plural && !in_config_center(*kind))
            {
                Some(kind) => Node::Ours {
                    namespace: (*namespace).to_owned(),
                    kind,
                    name: (*name).to_owned(),
                },
                None => Node::Other,
            }
        }
        [root, rest @ ..] => {
            let Some(namespace) = namespace_of_root(root) else {
                return Node::Other;
            };
            match rest {
                ["mapping", interface] => Node::Mapping(MappingKey::new(namespace, *interface)),
                ["config", CONFIG_GROUP, name] if parse_rule_key(name).is_some() => Node::Rule {
                    namespace,
                    name: (*name).to_owned(),
                },
                [interface, "providers", url] => Node::Provider {
                    namespace,
                    interface: (*interface).to_owned(),
                    url: (*url).to_owned(),
                },
                _ => Node::Other,
            }
        }
        [] => Node::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_map_to_dubbo_groups() {
        assert_eq!(root_of("default").unwrap(), "/dubbo");
        assert_eq!(root_of("shop").unwrap(), "/shop");
        for reserved in RESERVED_NAMESPACES {
            let err = root_of(reserved).unwrap_err();
            assert_eq!(err.field, "namespace");
            assert!(err.to_string().contains("reserved"), "{err}");
        }
        assert_eq!(namespace_of_root("dubbo").as_deref(), Some("default"));
        assert_eq!(namespace_of_root("shop").as_deref(), Some("shop"));
        assert_eq!(namespace_of_root("default"), None);
        assert_eq!(namespace_of_root("zookeeper"), None);
    }

    #[test]
    fn mapping_paths_are_the_metadata_reports() {
        let key = MappingKey::new("default", "org.apache.dubbo.demo.DemoService");
        assert_eq!(
            mapping_path(&key).unwrap(),
            "/dubbo/mapping/org.apache.dubbo.demo.DemoService"
        );
        assert_eq!(
            classify("/dubbo/mapping/org.apache.dubbo.demo.DemoService"),
            Node::Mapping(key)
        );
        let err = check_registration("default", "a/b").unwrap_err();
        assert_eq!(err.field, "interfaceNames");
        assert!(check_registration("default", "..").is_err());
        let err = check_registration("default", "org.demo.\u{1F600}").unwrap_err();
        assert!(err.to_string().contains("U+1F600"), "{err}");
        assert!(check_registration("default", "org.demo.\u{E000}").is_err());
        assert!(check_registration("default", "org.demo.Caf\u{E9}").is_ok());
        assert!(check_registration("dubbo", "x.Y").is_err());
    }

    #[test]
    fn service_keys_go_both_ways() {
        for (ours, dubbo) in [
            ("com.foo.DemoService", "com.foo.DemoService::"),
            ("com.foo.DemoService:1.0.0", "com.foo.DemoService:1.0.0:"),
            ("g1/com.foo.DemoService", "com.foo.DemoService::g1"),
            (
                "g1/com.foo.DemoService:1.0.0",
                "com.foo.DemoService:1.0.0:g1",
            ),
        ] {
            assert_eq!(service_node_key(ours), dubbo);
            assert_eq!(service_key(dubbo), ours);
        }
    }

    #[test]
    fn rule_nodes_are_classified() {
        assert_eq!(
            parse_rule_key("shop.tag-router"),
            Some(RuleNode {
                kind: Kind::TagRoute,
                key: "shop".into(),
                scope: "application"
            })
        );
        assert_eq!(
            parse_rule_key("com.foo.S:1.0:g.condition-router"),
            Some(RuleNode {
                kind: Kind::ConditionRoute,
                key: "g/com.foo.S:1.0".into(),
                scope: "service"
            })
        );
        assert_eq!(parse_rule_key("x::.tag-router"), None);
        assert_eq!(parse_rule_key("org.Foo:1.0.condition-router"), None);
        assert_eq!(parse_rule_key("shop.script-router"), None);
        assert_eq!(parse_rule_key(".configurators"), None);
        assert_eq!(
            classify("/shop/config/dubbo/a.configurators"),
            Node::Rule {
                namespace: "shop".into(),
                name: "a.configurators".into()
            }
        );
        assert_eq!(
            classify("/dubbo/config/DUBBO_SERVICEDISCOVERY_MIGRATION/a.migration"),
            Node::Other
        );
        assert_eq!(
            classify("/dubbo-cp/shop/serviceentries/greeter"),
            Node::Ours {
                namespace: "shop".into(),
                kind: Kind::ServiceEntry,
                name: "greeter".into()
            }
        );
        assert_eq!(classify("/dubbo-cp/shop/tagroutes/x"), Node::Other);
    }

    #[test]
    fn providers_and_instances_are_classified() {
        assert_eq!(
            classify("/dubbo/org.Greeter/providers/tri%3A%2F%2F10.0.0.1%3A50051"),
            Node::Provider {
                namespace: "default".into(),
                interface: "org.Greeter".into(),
                url: "tri%3A%2F%2F10.0.0.1%3A50051".into()
            }
        );
        assert_eq!(
            classify("/services/shop/10.0.0.1:20880"),
            Node::Instance {
                application: "shop".into(),
                id: "10.0.0.1:20880".into()
            }
        );
        assert_eq!(classify("/dubbo/org.Greeter/consumers/x"), Node::Other);
        assert_eq!(classify("/zookeeper/config"), Node::Other);
        assert_eq!(classify("/"), Node::Other);
    }
}
