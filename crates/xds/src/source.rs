//! The snapshots the ADS server serves, built from the index: the services registries report
//! (Kubernetes, ZooKeeper) and those ServiceEntry rules declare, ServiceNameMappings for interface
//! names, TagRoutes, DynamicConfigs, ConditionRoutes and the security policies. One task watches the kinds it reads and publishes a new
//! [`Snapshot`] after each burst of changes (one debounce window), so a burst of a thousand
//! registrations costs one rebuild, not a thousand.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use dubbo_cp_domain::rules::{ConditionRouteSpec, DynamicConfigSpec, RuleSpec, TagRouteSpec};
use dubbo_cp_domain::service::Service;
use dubbo_cp_index::{Index, Kind, KindSnapshot, Resource};
use tokio::sync::watch;

use crate::security::{Named, Policies, Settings};
use crate::snapshot::Snapshot;

/// The kinds a snapshot is built from. Nothing is served until each has loaded.
pub const KINDS: [Kind; 8] = [
    Kind::Service,
    Kind::ServiceEntry,
    Kind::ServiceNameMapping,
    Kind::TagRoute,
    Kind::DynamicConfig,
    Kind::ConditionRoute,
    Kind::AuthenticationPolicy,
    Kind::AuthorizationPolicy,
];

/// The state of the index's kinds that one snapshot reflects.
pub fn build(index: &Index, version: u64, settings: &Settings) -> Snapshot {
    build_reporting(index, version, settings).0
}

/// [`build`], and the hosts declared twice in its services (built once for both: every
/// service and endpoint is copied to build them).
fn build_reporting(index: &Index, version: u64, settings: &Settings) -> (Snapshot, Shadowed) {
    let synced = KINDS.iter().all(|kind| index.is_kind_loaded(*kind));
    let state = |kind| index.current(kind);
    let (services, shadowed) = services(&state(Kind::Service), &state(Kind::ServiceEntry));
    let mappings = mappings(&state(Kind::ServiceNameMapping));
    let tag_routes: Vec<(String, TagRouteSpec)> =
        rules(&state(Kind::TagRoute), |spec| match spec {
            RuleSpec::TagRoute(spec) => Some(spec.clone()),
            _ => None,
        });
    let configs: Vec<(String, DynamicConfigSpec)> =
        rules(&state(Kind::DynamicConfig), |spec| match spec {
            RuleSpec::DynamicConfig(spec) => Some(spec.clone()),
            _ => None,
        });
    let conditions: Vec<(String, ConditionRouteSpec)> =
        rules(&state(Kind::ConditionRoute), |spec| match spec {
            RuleSpec::ConditionRoute(spec) => Some(spec.clone()),
            _ => None,
        });
    let policies = Policies {
        settings: settings.clone(),
        authentication: named(&state(Kind::AuthenticationPolicy), |spec| match spec {
            RuleSpec::AuthenticationPolicy(spec) => Some(spec.clone()),
            _ => None,
        }),
        authorization: named(&state(Kind::AuthorizationPolicy), |spec| match spec {
            RuleSpec::AuthorizationPolicy(spec) => Some(spec.clone()),
            _ => None,
        }),
    };
    let snapshot = Snapshot::new(version, services, synced)
        .with_mappings(mappings)
        .with_dynamic_configs(configs)
        .with_tag_routes(tag_routes)
        .with_condition_routes(conditions)
        .with_policies(policies);
    (snapshot, shadowed)
}

/// `(namespace, interface, applications)` of every ServiceNameMapping.
fn mappings(state: &KindSnapshot) -> Vec<(String, String, Vec<String>)> {
    state
        .objects
        .iter()
        .filter_map(
            |(key, object)| match (&object.value, split_client_key(key)) {
                (
                    Resource::Mapping {
                        interface,
                        applications,
                    },
                    Some((_, namespace)),
                ) => Some((
                    namespace.to_owned(),
                    interface.clone(),
                    applications.clone(),
                )),
                _ => None,
            },
        )
        .collect()
}

/// Every rule of one kind with its name and namespace, in (namespace, name) order.
fn named<T>(state: &KindSnapshot, pick: impl Fn(&RuleSpec) -> Option<T>) -> Vec<Named<T>> {
    let mut named: Vec<Named<T>> = state
        .objects
        .iter()
        .filter_map(|(key, object)| {
            let (name, namespace) = split_client_key(key)?;
            match &object.value {
                Resource::Rule(spec) => Some(Named {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    spec: pick(spec)?,
                }),
                Resource::Mapping { .. } | Resource::Service(_) => None,
            }
        })
        .collect();
    named.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    named
}

/// `(name, namespace)` of a client key `<name>/<namespace>` (names and namespaces hold no `/`).
fn split_client_key(key: &str) -> Option<(&str, &str)> {
    key.rsplit_once('/')
}

/// `(namespace, spec)` of every rule of one kind, in key order.
fn rules<T>(state: &KindSnapshot, pick: impl Fn(&RuleSpec) -> Option<T>) -> Vec<(String, T)> {
    state
        .objects
        .iter()
        .filter_map(|(key, object)| {
            let (_, namespace) = split_client_key(key)?;
            match &object.value {
                Resource::Rule(spec) => Some((namespace.to_owned(), pick(spec)?)),
                Resource::Mapping { .. } | Resource::Service(_) => None,
            }
        })
        .collect()
}

/// The services registries report (Kubernetes, ZooKeeper), then the services the ServiceEntries
/// declare, and the hosts declared twice (`namespace/name`, or a DNS name declared in any two
/// namespaces -> the entries not served: a registry's service comes first, then the oldest
/// entry, by the creation time its store keeps, which every replica agrees on).
pub fn services(registered: &KindSnapshot, entries: &KindSnapshot) -> (Vec<Service>, Shadowed) {
    let (services, shadowed) = services_by_origin(registered, entries);
    (
        services.into_iter().map(|(service, _)| service).collect(),
        shadowed,
    )
}

/// Where a served service comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A registry's (Kubernetes Services with their EndpointSlices, ZooKeeper's providers).
    Service,
    /// A ServiceEntry's, by its key (`name/namespace`).
    ServiceEntry { entry: String },
}

/// Hosts declared twice -> the entries not served for them.
pub type Shadowed = BTreeMap<String, Vec<String>>;

/// [`services`], each with where it comes from (operators' views).
pub fn services_by_origin(
    registered: &KindSnapshot,
    entries: &KindSnapshot,
) -> (Vec<(Service, Origin)>, Shadowed) {
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut shadowed = Shadowed::new();
    let mut services = Vec::new();
    // A DNS name is one service whichever namespace declares it.
    let host_of = |service: &Service| match service.is_dns_host() {
        true => (String::new(), service.name.clone()),
        false => (service.namespace.clone(), service.name.clone()),
    };
    let registered = registered
        .objects
        .values()
        .filter_map(|object| match &object.value {
            Resource::Service(service) => Some(service),
            _ => None,
        });
    for service in registered {
        if seen
            .insert(host_of(service), "Service".to_owned())
            .is_none()
        {
            services.push((service.clone(), Origin::Service));
        }
    }
    // Oldest first, then by name and namespace (the key's order), as Istio orders services
    // (`SortServicesByCreationTime`); an entry of unknown age after those of known age.
    let mut oldest_first: Vec<(&String, &Arc<dubbo_cp_index::Object>)> =
        entries.objects.iter().collect();
    oldest_first.sort_by_key(|(_, object)| object.created.unwrap_or(i64::MAX));
    for (key, object) in oldest_first {
        let (Resource::Rule(RuleSpec::ServiceEntry(entry)), Some((_, namespace))) =
            (&object.value, split_client_key(key))
        else {
            continue;
        };
        for service in entry.services(namespace) {
            let host = host_of(&service);
            if seen.contains_key(&host) {
                let reported = match host.0.is_empty() {
                    true => host.1.clone(),
                    false => format!("{}/{}", host.0, host.1),
                };
                shadowed.entry(reported).or_default().push(key.clone());
                continue;
            }
            seen.insert(host, key.clone());
            services.push((service, Origin::ServiceEntry { entry: key.clone() }));
        }
    }
    (services, shadowed)
}

/// Publishes a snapshot of `index` on `tx` now and after each burst of changes to [`KINDS`]:
/// the first change of a burst starts a `window`, and the state at its end is published. Runs
/// until every receiver is gone.
/// Encodings are counted in `encodes`.
pub async fn run(
    index: Arc<Index>,
    tx: watch::Sender<Arc<Snapshot>>,
    window: Duration,
    encodes: Arc<AtomicU64>,
    settings: Settings,
) {
    let mut watches: [watch::Receiver<Arc<KindSnapshot>>; 8] =
        KINDS.map(|kind| index.subscribe(kind));
    let mut version = 0u64;
    let mut shadowed_before = BTreeMap::new();
    let mut untranslated_before = BTreeMap::new();
    let mut unenforced_before = BTreeMap::new();
    let mut policies_before = None;
    let mut rules_before = None;
    let mut inputs_before = None;
    loop {
        for watch in &mut watches {
            watch.borrow_and_update();
        }
        // Versions only grow, across restarts too (milliseconds since the epoch, or one more
        // when two builds fall in one): a client that reconnects to a new process is never
        // told an older version is newer.
        version = (version + 1).max(unix_millis());
        let previous = tx.borrow().clone();
        // Every kind but the services: when none moved, the new version says which clusters
        // and load assignments may differ, and streams skip the rest. Read before the build:
        // a rule written meanwhile is then in the build but not here, so the next version does
        // not count as following this one (the other order would hide the rule's change).
        let inputs: Vec<_> = KINDS[2..]
            .iter()
            .map(|kind| index.current(*kind).revision)
            .collect();
        let (snapshot, shadowed) = build_reporting(&index, version, &settings);
        let mut snapshot = snapshot
            .counting_encodes_in(encodes.clone())
            .sharing_encodings_of(&previous);
        if inputs_before.as_ref() == Some(&inputs) {
            snapshot = snapshot.following(&previous);
        }
        inputs_before = Some(inputs);
        report_shadowed(&shadowed, &shadowed_before);
        shadowed_before = shadowed;
        // Translated again only when a rule or a mapping changed, not at every endpoint change.
        let rules_now = [
            Kind::ConditionRoute,
            Kind::TagRoute,
            Kind::ServiceNameMapping,
            Kind::DynamicConfig,
        ]
        .map(|kind| index.current(kind).revision);
        if rules_before != Some(rules_now) {
            let mut untranslated = untranslated(
                &index.current(Kind::ConditionRoute),
                &index.current(Kind::TagRoute),
                &index.current(Kind::ServiceNameMapping),
            );
            untranslated.extend(untranslated_configs(&index.current(Kind::DynamicConfig)));
            report_untranslated(&untranslated, &untranslated_before);
            untranslated_before = untranslated;
            rules_before = Some(rules_now);
        }
        // Translated again only when a policy changed, not at every burst of registrations.
        let policies = (
            index.current(Kind::AuthorizationPolicy).revision,
            index.current(Kind::AuthenticationPolicy).revision,
        );
        if policies_before != Some(policies) {
            let mut unenforced = unenforced(&index.current(Kind::AuthorizationPolicy));
            unenforced.extend(permissive(&index.current(Kind::AuthenticationPolicy)));
            report_unenforced(&unenforced, &unenforced_before);
            unenforced_before = unenforced;
            policies_before = Some(policies);
        }
        if tx.send(Arc::new(snapshot)).is_err() {
            return;
        }
        // Until one of the kinds changes (or the index goes), then the window.
        let [a, b, c, d, e, f, g, h] = &mut watches;
        let changed = tokio::select! {
            changed = a.changed() => changed,
            changed = b.changed() => changed,
            changed = c.changed() => changed,
            changed = d.changed() => changed,
            changed = e.changed() => changed,
            changed = f.changed() => changed,
            changed = g.changed() => changed,
            changed = h.changed() => changed,
            () = tx.closed() => return,
        };
        if changed.is_err() {
            return;
        }
        tokio::time::sleep(window).await;
    }
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `ConditionRoute <name>/<namespace>` -> what clients do not apply of it, given the TagRoutes
/// and (for service-scoped rules) the ServiceNameMappings.
fn untranslated(
    state: &KindSnapshot,
    tags: &KindSnapshot,
    mapped: &KindSnapshot,
) -> BTreeMap<String, Vec<String>> {
    let tagged: std::collections::BTreeSet<(String, String)> = rules(tags, |spec| match spec {
        RuleSpec::TagRoute(spec) if spec.enabled => Some(spec.key.clone()),
        _ => None,
    })
    .into_iter()
    .collect();
    // Read only if some rule is service-scoped: mappings are the largest kind.
    let mappings = std::cell::OnceCell::new();
    let mappings = || {
        mappings.get_or_init(|| {
            self::mappings(mapped)
                .into_iter()
                .map(|(namespace, interface, applications)| ((namespace, interface), applications))
                .collect::<std::collections::HashMap<(String, String), Vec<String>>>()
        })
    };
    state
        .objects
        .iter()
        .filter_map(|(key, object)| match &object.value {
            Resource::Rule(RuleSpec::ConditionRoute(spec)) if spec.enabled => {
                let (conditions, mut problems) = crate::conditions::translate(spec);
                let namespace = split_client_key(key).map(|(_, ns)| ns.to_owned())?;
                if conditions.conditions.is_empty() {
                    return (!problems.is_empty())
                        .then(|| (format!("ConditionRoute {key}"), problems));
                }
                let applications = match spec.scope.as_str() {
                    "application" => vec![spec.key.clone()],
                    _ => {
                        let applications = mappings()
                            .get(&(namespace.clone(), spec.key.clone()))
                            .cloned()
                            .unwrap_or_default();
                        problems.extend(service_scope_problems(&spec.key, &applications));
                        applications
                    }
                };
                if applications
                    .iter()
                    .any(|app| tagged.contains(&(namespace.clone(), app.clone())))
                {
                    problems.push(
                        "its application has a TagRoute too: calls a condition matches go to its \
                         endpoints without tag routing, where Dubbo tag-routes them after"
                            .to_owned(),
                    );
                }
                (!problems.is_empty()).then(|| (format!("ConditionRoute {key}"), problems))
            }
            _ => None,
        })
        .collect()
}

/// What keeps a service-scoped ConditionRoute on `interface` (served by `applications`) from
/// the calls it is for.
fn service_scope_problems(interface: &str, applications: &[String]) -> Option<String> {
    match applications.len() {
        0 => Some(format!(
            "no ServiceNameMapping of its namespace lists an application serving {interface}: \
             it applies to no endpoint until one does"
        )),
        1 => None,
        n => Some(format!(
            "{interface} is served by {n} applications: a client asking for the interface gets \
             a route over all of them, where ConditionRoutes are not applied (a client asking \
             for one application's name applies it)"
        )),
    }
}

/// `DynamicConfig <name>/<namespace>` -> what xDS clients do not apply of it.
fn untranslated_configs(state: &KindSnapshot) -> BTreeMap<String, Vec<String>> {
    state
        .objects
        .iter()
        .filter_map(|(key, object)| match &object.value {
            Resource::Rule(RuleSpec::DynamicConfig(spec)) if spec.enabled => {
                let problems = crate::overrides::untranslated(spec);
                (!problems.is_empty()).then(|| (format!("DynamicConfig {key}"), problems))
            }
            _ => None,
        })
        .collect()
}

/// Warns once per rule (and again only when what is not translated changes).
fn report_untranslated(
    now: &BTreeMap<String, Vec<String>>,
    before: &BTreeMap<String, Vec<String>>,
) {
    for (rule, problems) in now {
        if before.get(rule) != Some(problems) {
            tracing::warn!(
                %rule,
                not_applied = ?problems,
                "xDS clients do not apply all of a rule (docs/xds.md)"
            );
        }
    }
}

/// `AuthorizationPolicy <name>/<namespace>` -> what gRPC servers do not enforce of it as
/// written, whatever the server (the parts that depend on a server's TLS are in its view).
pub fn unenforced(state: &KindSnapshot) -> BTreeMap<String, Vec<String>> {
    let policies = named(state, |spec| match spec {
        RuleSpec::AuthorizationPolicy(spec) => Some(spec.clone()),
        _ => None,
    });
    let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for policy in &policies {
        let translated = crate::security::rbac::translate(std::iter::once(policy), true);
        for (_, problem) in translated.problems {
            problems
                .entry(format!(
                    "AuthorizationPolicy {}/{}",
                    policy.name, policy.namespace
                ))
                .or_default()
                .push(problem);
        }
    }
    problems
}

/// `AuthenticationPolicy <name>/<namespace>` -> why its PERMISSIVE (action or port) is plaintext.
pub fn permissive(state: &KindSnapshot) -> BTreeMap<String, Vec<String>> {
    named(state, |spec| match spec {
        RuleSpec::AuthenticationPolicy(spec) => Some(spec.clone()),
        _ => None,
    })
    .into_iter()
    .filter(|policy| {
        policy.spec.action == "PERMISSIVE"
            || policy
                .spec
                .port_level
                .iter()
                .any(|l| l.action == "PERMISSIVE")
    })
    .map(|policy| {
        (
            format!("AuthenticationPolicy {}/{}", policy.name, policy.namespace),
            vec![crate::security::PERMISSIVE_AS_PLAINTEXT.to_owned()],
        )
    })
    .collect()
}

/// Warns once per policy (and again only when what is not enforced changes).
fn report_unenforced(now: &BTreeMap<String, Vec<String>>, before: &BTreeMap<String, Vec<String>>) {
    for (policy, problems) in now {
        if before.get(policy) != Some(problems) {
            tracing::warn!(
                %policy,
                not_enforced = ?problems,
                "xDS servers do not enforce all of a policy as written (docs/security.md)"
            );
        }
    }
}

/// Logs hosts newly declared twice, once each (a rebuild does not log them again).
fn report_shadowed(now: &BTreeMap<String, Vec<String>>, before: &BTreeMap<String, Vec<String>>) {
    for (host, entries) in now {
        if before.get(host) != Some(entries) {
            tracing::warn!(
                %host,
                ignored = ?entries,
                "a ServiceEntry host is declared by several entries; the oldest is served"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::TypeState;
    use crate::{ROUTE, snapshot::resources};
    use dubbo_cp_index::Change;
    use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};
    use prost::Message;

    fn rule(kind: Kind, spec: serde_json::Value) -> Resource {
        Resource::Rule(RuleSpec::parse(kind, &spec).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn a_dns_name_declared_in_two_namespaces_is_served_from_the_oldest_entry_and_reported() {
        let index = Index::new(1);
        let entry = |address: &str| {
            rule(
                Kind::ServiceEntry,
                serde_json::json!({
                    "hosts": ["api.payments.internal", "payments"],
                    "ports": [{"number": 50051, "name": "grpc"}],
                    "endpoints": [{"address": address}],
                }),
            )
        };
        index.apply(
            Kind::ServiceEntry,
            [
                // shop's is older, although billing's comes first by name and namespace.
                Change::Dated("payments/billing".into(), entry("10.0.0.1"), 2_000),
                Change::Dated("payments/shop".into(), entry("10.0.0.2"), 1_000),
            ],
            2,
        );
        let served = |index: &Index| {
            let (served, shadowed) = services(
                &index.current(Kind::Service),
                &index.current(Kind::ServiceEntry),
            );
            let names: Vec<String> = served
                .iter()
                .map(|s| format!("{}/{} {}", s.namespace, s.name, s.endpoints[0].address))
                .collect();
            (names, shadowed)
        };
        let (names, shadowed) = served(&index);
        // The short name is one service per namespace; the DNS name one for the whole mesh.
        assert_eq!(
            names,
            [
                "shop/api.payments.internal 10.0.0.2",
                "shop/payments 10.0.0.2",
                "billing/payments 10.0.0.1",
            ]
        );
        assert_eq!(
            shadowed,
            BTreeMap::from([(
                "api.payments.internal".to_owned(),
                vec!["payments/billing".to_owned()]
            )])
        );
        // Same age: by name, then namespace (billing before shop); an entry of unknown age
        // comes after both.
        index.apply(
            Kind::ServiceEntry,
            [
                Change::Dated("payments/shop".into(), entry("10.0.0.2"), 2_000),
                Change::Upsert("payments/cart".into(), entry("10.0.0.3")),
            ],
            3,
        );
        let (names, shadowed) = served(&index);
        assert_eq!(names[0], "billing/api.payments.internal 10.0.0.1");
        assert_eq!(
            shadowed["api.payments.internal"],
            ["payments/shop", "payments/cart"]
        );
    }

    #[test]
    fn a_snapshot_holds_what_the_index_holds_and_waits_for_every_kind() {
        let index = Index::new(1);
        let entry = serde_json::json!({
            "hosts": ["greeter"], "ports": [{"number": 7070, "name": "grpc"}],
            "endpoints": [{"address": "10.0.0.1"}, {"address": "10.0.0.2"}],
        });
        index.apply(
            Kind::ServiceEntry,
            [Change::Upsert(
                "greeter/shop".into(),
                rule(Kind::ServiceEntry, entry),
            )],
            2,
        );
        let condition = serde_json::json!({
            "key": "greeter", "scope": "application", "configVersion": "v3.0",
            "conditions": ["method=sayHello => host=10.0.0.2"],
        });
        index.apply(
            Kind::ConditionRoute,
            [Change::Upsert(
                "only-two/shop".into(),
                rule(Kind::ConditionRoute, condition),
            )],
            3,
        );
        let settings = Settings::default();
        assert!(
            !build(&index, 1, &settings).synced,
            "no kind has loaded yet"
        );
        for kind in KINDS.into_iter().filter(|kind| *kind != Kind::Service) {
            index.mark_loaded(kind);
        }
        assert!(
            !build(&index, 1, &settings).synced,
            "the registry's services not listed"
        );
        index.mark_loaded(Kind::Service);
        let snapshot = build(&index, 4, &settings);
        assert!(snapshot.synced);
        let state = TypeState {
            names: ["greeter:7070".to_owned()].into(),
            ..Default::default()
        };
        let routes = resources(&snapshot, ROUTE, &state, "shop");
        let config = RouteConfiguration::decode(routes[0].1.value.as_slice()).unwrap();
        let clusters: Vec<String> = config.virtual_hosts[0]
            .routes
            .iter()
            .filter_map(|r| match &r.action {
                Some(route::Action::Route(action)) => match &action.cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(name)) => Some(name.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert_eq!(
            clusters,
            [
                "outbound|7070|condition-0|greeter.shop.svc.cluster.local",
                "outbound|7070||greeter.shop.svc.cluster.local",
            ]
        );
        let reported = untranslated(
            &index.current(Kind::ConditionRoute),
            &index.current(Kind::TagRoute),
            &index.current(Kind::ServiceNameMapping),
        );
        assert!(reported.is_empty(), "{reported:?}");
    }

    #[test]
    fn a_service_scoped_condition_route_clients_cannot_apply_is_reported() {
        let index = Index::new(1);
        let scoped = |interface: &str| {
            rule(
                Kind::ConditionRoute,
                serde_json::json!({
                    "key": interface, "scope": "service", "configVersion": "v3.0",
                    "conditions": ["method=a => host=10.0.0.1"],
                }),
            )
        };
        index.apply(
            Kind::ConditionRoute,
            [
                Change::Upsert("one/shop".into(), scoped("org.example.One")),
                Change::Upsert("two/shop".into(), scoped("org.example.Two")),
                Change::Upsert("none/shop".into(), scoped("org.example.None")),
            ],
            2,
        );
        index.apply(
            Kind::ServiceNameMapping,
            [
                Change::Upsert(
                    "one/shop".into(),
                    Resource::mapping("org.example.One", ["greeter".to_owned()]),
                ),
                Change::Upsert(
                    "two/shop".into(),
                    Resource::mapping(
                        "org.example.Two",
                        ["greeter".to_owned(), "billing".to_owned()],
                    ),
                ),
            ],
            3,
        );
        let reported = untranslated(
            &index.current(Kind::ConditionRoute),
            &index.current(Kind::TagRoute),
            &index.current(Kind::ServiceNameMapping),
        );
        assert_eq!(
            reported.keys().collect::<Vec<_>>(),
            ["ConditionRoute none/shop", "ConditionRoute two/shop"]
        );
        assert!(reported["ConditionRoute none/shop"][0].contains("no ServiceNameMapping"));
        assert!(reported["ConditionRoute two/shop"][0].contains("2 applications"));
    }

    #[test]
    fn what_servers_do_not_enforce_is_reported_per_policy() {
        let index = Index::new(1);
        let audit = serde_json::json!({"action": "ADULT"});
        let allow =
            serde_json::json!({"action": "ALLOW", "rules": [{"from": {"namespaces": ["a"]}}]});
        index.apply(
            Kind::AuthorizationPolicy,
            [
                Change::Upsert("audit/shop".into(), rule(Kind::AuthorizationPolicy, audit)),
                Change::Upsert("fine/shop".into(), rule(Kind::AuthorizationPolicy, allow)),
            ],
            2,
        );
        let reported = unenforced(&index.current(Kind::AuthorizationPolicy));
        assert_eq!(
            reported.keys().collect::<Vec<_>>(),
            ["AuthorizationPolicy audit/shop"]
        );
        let permissive_port = serde_json::json!({"action": "STRICT", "portLevel": [{"port": 8080, "action": "PERMISSIVE"}]});
        let strict = serde_json::json!({"action": "STRICT"});
        index.apply(
            Kind::AuthenticationPolicy,
            [
                Change::Upsert(
                    "mixed/shop".into(),
                    rule(Kind::AuthenticationPolicy, permissive_port),
                ),
                Change::Upsert(
                    "strict/shop".into(),
                    rule(Kind::AuthenticationPolicy, strict),
                ),
            ],
            3,
        );
        let reported = permissive(&index.current(Kind::AuthenticationPolicy));
        assert_eq!(
            reported.keys().collect::<Vec<_>>(),
            ["AuthenticationPolicy mixed/shop"]
        );
    }
}
