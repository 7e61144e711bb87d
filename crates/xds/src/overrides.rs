//! DynamicConfigs as xDS clients feel them: a provider-side override sets an endpoint's weight
//! (or takes it out), as Dubbo providers apply it to their own URL and consumers then read it.
//!
//! Which overrides apply to which endpoints, in Dubbo's order (application-scoped configs, then
//! service-scoped ones; within each, those for any host before those naming an address, and
//! otherwise in order; later ones win):
//! - application scope: the application's endpoints;
//! - service scope: the endpoints of the applications the interface's ServiceNameMapping lists
//!   (those `applications` names, when given). A cluster carries every interface of its
//!   application, so over xDS the weight holds for calls of its other interfaces too;
//! - an override lists endpoints by `addresses` / `providerAddresses` (none lists every one) and
//!   selects them by `match` (address, application, endpoint labels as URL parameters).
//!
//! What clients cannot be given is left out and said by [`untranslated`]: consumer-side
//! overrides, selection by interface inside an application (`services`, `match.service`), and
//! service keys with a group or version (endpoints carry neither).

use std::collections::HashMap;

use dubbo_cp_domain::rules::{DynamicConfigSpec, OverrideConfig};
use dubbo_cp_domain::service::{Service, ServiceEndpoint, ServicePort};

/// (namespace, application) -> the overrides that apply to its endpoints, in order.
pub type ByApplication = HashMap<(String, String), Vec<OverrideConfig>>;

/// The provider-side overrides of the enabled `configs` per application; service-scoped ones
/// through `mappings` ((namespace, interface) -> applications).
pub fn by_application(
    configs: Vec<(String, DynamicConfigSpec)>,
    mappings: &HashMap<(String, String), Vec<String>>,
) -> ByApplication {
    let mut by_application = ByApplication::new();
    let mut service_scoped = Vec::new();
    for (namespace, spec) in configs.into_iter().filter(|(_, spec)| spec.enabled) {
        match spec.scope.as_str() {
            "application" => by_application
                .entry((namespace, spec.key))
                .or_default()
                .extend(
                    spec.configs
                        .into_iter()
                        .filter(|o| applicable(o) && o.services.iter().all(|s| s == "*")),
                ),
            "service" => service_scoped.push((namespace, spec)),
            _ => {}
        }
    }
    for overrides in by_application.values_mut() {
        any_host_first(overrides);
    }
    for (namespace, spec) in service_scoped {
        if plain_interface(&spec.key).is_none() {
            continue;
        }
        let key = (namespace, spec.key);
        for application in mappings.get(&key).into_iter().flatten() {
            let mut overrides: Vec<OverrideConfig> = spec
                .configs
                .iter()
                .filter(|o| {
                    applicable(o)
                        && (o.applications.is_empty()
                            || o.applications.iter().any(|a| a == "*" || a == application))
                })
                .cloned()
                .collect();
            any_host_first(&mut overrides);
            by_application
                .entry((key.0.clone(), application.clone()))
                .or_default()
                .extend(overrides);
        }
    }
    by_application
}

/// Dubbo applies the configurators of a scope sorted by host: those for any host (`0.0.0.0`,
/// or no address) before those naming one, so an address's own override wins over a general
/// one whatever their order in the rule. Stable: otherwise in order.
fn any_host_first(overrides: &mut [OverrideConfig]) {
    overrides.sort_by_key(|o| {
        o.addresses
            .iter()
            .chain(&o.provider_addresses)
            .any(|a| a != "*" && a != "0.0.0.0")
    });
}

/// An override xDS clients can feel: enabled, provider-side, not selecting an interface.
fn applicable(config: &OverrideConfig) -> bool {
    config.enabled
        && (config.side.is_empty() || config.side == "provider")
        && config.r#match.as_ref().is_none_or(|m| m.service.is_none())
}

/// The interface of a service key without group or version (`group/iface:version` names
/// providers by what xDS endpoints do not carry).
fn plain_interface(key: &str) -> Option<&str> {
    (!key.contains('/') && !key.contains(':')).then_some(key)
}

/// Sets the weights of `services`' endpoints from the overrides of their applications: an
/// override selecting an endpoint sets its `weight`, or takes it out with `disabled: "true"`,
/// which a later weight does not undo.
pub fn apply(services: &mut [Service], by_application: &ByApplication) {
    for service in services {
        let key = (service.namespace.clone(), service.application().to_owned());
        let Some(overrides) = by_application.get(&key) else {
            continue;
        };
        let application = service.application().to_owned();
        let ports = service.ports.clone();
        for endpoint in &mut service.endpoints {
            let mut disabled = false;
            for config in overrides {
                if !ports
                    .iter()
                    .any(|port| selects(config, &application, endpoint, port))
                {
                    continue;
                }
                if let Some(flag) = config.parameters.get("disabled") {
                    disabled = flag == "true";
                }
                if let Some(weight) = config.parameters.get("weight").and_then(|w| w.parse().ok()) {
                    endpoint.weight = weight;
                }
            }
            if disabled {
                endpoint.weight = 0;
            }
        }
    }
}

/// Whether `config` selects `endpoint` (serving `port`) of `application`: its addresses list it
/// (`ip`, `ip:port`, `0.0.0.0` or `*`; none lists every one) and its `match` takes it.
fn selects(
    config: &OverrideConfig,
    application: &str,
    endpoint: &ServiceEndpoint,
    port: &ServicePort,
) -> bool {
    let ip = endpoint.address.to_string();
    let with_port = format!("{ip}:{}", endpoint.port_for(port));
    let listed = (config.addresses.is_empty() && config.provider_addresses.is_empty())
        || config
            .addresses
            .iter()
            .chain(&config.provider_addresses)
            .any(|a| a == "*" || a == "0.0.0.0" || *a == ip || *a == with_port);
    listed
        && config
            .r#match
            .as_ref()
            .is_none_or(|m| m.matches_instance(&ip, application, &endpoint.labels))
}

/// What xDS clients do not apply of an enabled DynamicConfig, each with the reason.
pub fn untranslated(spec: &DynamicConfigSpec) -> Vec<String> {
    let mut problems = Vec::new();
    if spec.scope == "service" && plain_interface(&spec.key).is_none() {
        problems.push(format!(
            "key {:?} names a group or version, which xDS endpoints do not carry: not applied",
            spec.key
        ));
    }
    for (i, config) in spec.configs.iter().enumerate() {
        if !config.enabled {
            continue;
        }
        if config.side == "consumer" {
            problems.push(format!(
                "configs[{i}]: consumer-side, which xDS clients do not read"
            ));
        }
        if spec.scope == "application" && config.services.iter().any(|s| s != "*") {
            problems.push(format!(
                "configs[{i}].services: selects interfaces, and a cluster carries every \
                 interface of its application: not applied"
            ));
        }
        if config.r#match.as_ref().is_some_and(|m| m.service.is_some()) {
            problems.push(format!(
                "configs[{i}].match.service: selects interfaces, and a cluster carries every \
                 interface of its application: not applied"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn endpoint(last: u8, version: &str) -> ServiceEndpoint {
        ServiceEndpoint {
            address: std::net::IpAddr::from([10, 0, 0, last]),
            ports: BTreeMap::new(),
            labels: BTreeMap::from([("version".to_owned(), version.to_owned())]),
            weight: 100,
            locality: String::new(),
        }
    }

    fn service(application: &str) -> Service {
        Service {
            namespace: "shop".into(),
            name: application.into(),
            labels: BTreeMap::new(),
            ports: vec![ServicePort {
                number: 50051,
                name: "grpc".into(),
                protocol: "GRPC".into(),
            }],
            endpoints: vec![endpoint(1, "v1"), endpoint(2, "v2"), endpoint(3, "v2")],
        }
    }

    fn config(scope: &str, key: &str, configs: serde_json::Value) -> (String, DynamicConfigSpec) {
        let spec = serde_json::json!({
            "key": key, "scope": scope, "configVersion": "v3.0", "configs": configs,
        });
        let spec = serde_json::from_value(spec).unwrap_or_else(|e| panic!("{e}"));
        ("shop".to_owned(), spec)
    }

    fn weights(configs: Vec<(String, DynamicConfigSpec)>) -> BTreeMap<String, Vec<u32>> {
        let mappings = HashMap::from([(
            ("shop".to_owned(), "org.example.Greeter".to_owned()),
            vec!["greeter".to_owned(), "billing".to_owned()],
        )]);
        let mut services = vec![service("greeter"), service("billing"), service("other")];
        apply(&mut services, &by_application(configs, &mappings));
        services
            .into_iter()
            .map(|s| (s.name, s.endpoints.iter().map(|e| e.weight).collect()))
            .collect()
    }

    #[test]
    fn match_selects_endpoints_by_label_address_and_application() {
        let by_label = config(
            "application",
            "greeter",
            serde_json::json!([{
                "match": {"param": [{"key": "version", "value": {"exact": "v2"}}]},
                "parameters": {"weight": "10"},
            }]),
        );
        assert_eq!(weights(vec![by_label])["greeter"], [100, 10, 10]);
        let by_block = config(
            "application",
            "greeter",
            serde_json::json!([{
                "match": {"address": {"cird": "10.0.0.0/31"}},
                "parameters": {"disabled": "true"},
            }]),
        );
        assert_eq!(weights(vec![by_block])["greeter"], [0, 100, 100]);
        let other_app = config(
            "application",
            "greeter",
            serde_json::json!([{
                "match": {"application": {"oneof": [{"exact": "billing"}]}},
                "parameters": {"weight": "1"},
            }]),
        );
        assert_eq!(weights(vec![other_app])["greeter"], [100, 100, 100]);
    }

    #[test]
    fn a_service_scoped_config_reaches_the_applications_of_the_interface_after_theirs() {
        let app = config(
            "application",
            "greeter",
            serde_json::json!([{"parameters": {"weight": "50"}}]),
        );
        let service = config(
            "service",
            "org.example.Greeter",
            serde_json::json!([
                {"addresses": ["10.0.0.1"], "parameters": {"weight": "7"}},
                {"applications": ["billing"], "parameters": {"weight": "3"}},
            ]),
        );
        // Given in either order, the service scope comes last, as Dubbo applies it.
        let weights = weights(vec![service, app]);
        assert_eq!(weights["greeter"], [7, 50, 50]);
        // billing's own override sets 3, and the one naming 10.0.0.1 comes after it (Dubbo
        // sorts those for any host first).
        assert_eq!(weights["billing"], [7, 3, 3]);
        assert_eq!(
            weights["other"],
            [100, 100, 100],
            "not mapped to the interface"
        );
    }

    #[test]
    fn an_addresss_own_override_wins_over_a_general_one_written_after_it() {
        let configs = config(
            "application",
            "greeter",
            serde_json::json!([
                {"addresses": ["10.0.0.1"], "parameters": {"weight": "0"}},
                {"parameters": {"weight": "50"}},
            ]),
        );
        assert_eq!(weights(vec![configs])["greeter"], [0, 50, 50]);
    }

    #[test]
    fn what_clients_cannot_apply_is_left_out_and_said() {
        let skipped = vec![
            config(
                "service",
                "shop/org.example.Greeter:1.0",
                serde_json::json!([{"parameters": {"weight": "1"}}]),
            ),
            config(
                "application",
                "greeter",
                serde_json::json!([
                    {"side": "consumer", "parameters": {"timeout": "1000"}},
                    {"services": ["org.example.Greeter"], "parameters": {"weight": "1"}},
                    {"match": {"service": {"oneof": [{"exact": "org.example.Greeter"}]}},
                     "parameters": {"weight": "1"}},
                ]),
            ),
        ];
        let said: Vec<Vec<String>> = skipped.iter().map(|(_, s)| untranslated(s)).collect();
        assert_eq!(weights(skipped)["greeter"], [100, 100, 100]);
        assert!(said[0][0].contains("group or version"), "{said:?}");
        assert_eq!(said[1].len(), 3, "{said:?}");
        assert!(
            said[1][0].starts_with("configs[0]: consumer-side"),
            "{said:?}"
        );
        assert!(said[1][1].starts_with("configs[1].services"), "{said:?}");
        assert!(
            said[1][2].starts_with("configs[2].match.service"),
            "{said:?}"
        );
    }
}
