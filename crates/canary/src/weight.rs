//! Traffic by weight: the `DynamicConfig <canary>-canary` that gives the ready canary pods
//! `p` percent of the calls while primary pods keep Dubbo's default weight 100 (rollout.md).

use std::collections::BTreeMap;

use crate::rules::{
    self, ConditionMatch, DynamicConfigSpec, OverrideConfig, ParamMatch, StringMatch,
};

/// Dubbo's default provider weight, which primary pods keep.
pub const DEFAULT_WEIGHT: u64 = 100;

/// The largest weight written. At 100 % the formula has no finite answer; this one gives the
/// canary all but about one call in ten thousand per primary pod.
pub const MAX_WEIGHT: u64 = 1_000_000;

/// The weight of each ready canary pod for `percent` of the calls, with `primaries` and
/// `canaries` ready pods: `round(100 * p * Np / ((100 - p) * Nc))`, 0 at 0 %.
/// `None` when there is no canary pod to weigh.
pub fn canary_pod_weight(percent: u32, primaries: usize, canaries: usize) -> Option<u64> {
    if canaries == 0 {
        return None;
    }
    let p = u64::from(percent.min(100));
    if p == 0 {
        return Some(0);
    }
    if primaries == 0 {
        // Only canary pods serve: any positive weight gives them everything.
        return Some(DEFAULT_WEIGHT);
    }
    if p == 100 {
        return Some(MAX_WEIGHT);
    }
    let numerator = DEFAULT_WEIGHT * p * primaries as u64;
    let denominator = (100 - p) * canaries as u64;
    // Rounded half up, in integers.
    Some(((2 * numerator + denominator) / (2 * denominator)).min(MAX_WEIGHT))
}

/// The DynamicConfig spec for `application` with one provider override per canary pod IP, or
/// `None` when no canary pod is ready (nothing to weigh: the object is removed). At 100 % the
/// primary pods get weight 0 too, so the switch is whole (Blue/Green, a Canary at
/// `maxWeight: 100`), not all but one call in ten thousand per primary pod.
///
/// With `affinity`, one more provider-side override for every pod names the header callers are
/// hashed on (`hash.header`): xDS clients keep each caller on the pod it hashes to, and as the
/// canary's weight grows it only gains callers (docs/canary.md). It is written even while no
/// canary pod is ready, so a restarting canary does not reshuffle every caller of the primary.
pub fn dynamic_config(
    application: &str,
    percent: u32,
    primary_ips: &[String],
    canary_ips: &[String],
    affinity: Option<&str>,
) -> Option<DynamicConfigSpec> {
    let override_for = |addresses: Vec<String>, key: &str, value: String| {
        provider_override(addresses, None, key, value)
    };
    let mut configs = Vec::new();
    if let Some(mut weight) = canary_pod_weight(percent, primary_ips.len(), canary_ips.len()) {
        let whole = percent >= 100 && !primary_ips.is_empty();
        if whole {
            weight = DEFAULT_WEIGHT;
        }
        let weigh =
            |ip: &String, weight: u64| override_for(vec![ip.clone()], "weight", weight.to_string());
        configs.extend(canary_ips.iter().map(|ip| weigh(ip, weight)));
        if whole {
            configs.extend(primary_ips.iter().map(|ip| weigh(ip, 0)));
        }
    }
    if let Some(header) = affinity {
        configs.push(override_for(
            Vec::new(),
            rules::HASH_HEADER,
            header.to_owned(),
        ));
    }
    (!configs.is_empty()).then(|| application_config(application, configs))
}

/// The application-scoped DynamicConfig of `application` with `configs`.
fn application_config(application: &str, configs: Vec<OverrideConfig>) -> DynamicConfigSpec {
    DynamicConfigSpec {
        key: application.to_owned(),
        scope: "application".to_owned(),
        config_version: "v3.0".to_owned(),
        enabled: true,
        configs,
    }
}

/// A provider-side override setting `key` to `value` on the pods at `addresses` (none: every
/// pod) that `r#match` selects.
fn provider_override(
    addresses: Vec<String>,
    r#match: Option<ConditionMatch>,
    key: &str,
    value: String,
) -> OverrideConfig {
    OverrideConfig {
        side: "provider".to_owned(),
        addresses,
        provider_addresses: Vec::new(),
        parameters: BTreeMap::from([(key.to_owned(), value)]),
        applications: Vec::new(),
        services: Vec::new(),
        r#type: String::new(),
        enabled: true,
        r#match,
    }
}

/// Keys of a Dubbo provider's URL: Dubbo SDKs read a `match.param` against those, so a hold
/// by a pod label of one of these names could hold the primary's providers too.
const DUBBO_URL_KEYS: [&str; 8] = [
    "application",
    "interface",
    "side",
    "group",
    "version",
    "protocol",
    "dubbo",
    "release",
];

/// The labels that select the target's pods and no primary's, for a hold by labels: the
/// target's selector without Dubbo URL keys, as long as one of them still has the target's
/// name as its value (the primary's has `<name>-primary` there); else none.
pub fn hold_labels(selector: &BTreeMap<String, String>, target: &str) -> BTreeMap<String, String> {
    let labels: BTreeMap<String, String> = selector
        .iter()
        .filter(|(key, _)| !DUBBO_URL_KEYS.contains(&key.as_str()))
        // A DynamicConfig's parameter key is at most 253 characters; a label key may be 317.
        .filter(|(key, _)| key.len() <= crate::rules::limits::NAME)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    if labels.values().any(|value| value == target) {
        labels
    } else {
        BTreeMap::new()
    }
}

/// Whether `spec` holds the pods `labels` select at weight 0 (the override
/// [`holding_back`] writes).
pub fn holds_by_labels(spec: &DynamicConfigSpec, labels: &BTreeMap<String, String>) -> bool {
    spec.configs.iter().any(|config| {
        config.parameters.get("weight").map(String::as_str) == Some("0")
            && config.r#match.as_ref().is_some_and(|m| {
                m.param.len() == labels.len()
                    && m.param.iter().all(|p| {
                        labels.get(&p.key) == Some(&p.value.exact) && !p.value.exact.is_empty()
                    })
            })
    })
}

/// `spec` with weight 0 for the target's pods that must take no call yet:
/// - every pod the target's `selector` labels select, first, so the weights of ready canary
///   pods that follow win. The labels are known before any pod exists, so a pod ready the
///   moment it is listed gets weight 0 in the push that first lists it, wherever endpoints
///   carry their pods' labels (xDS in Kubernetes mode). Empty: no such override;
/// - `held`, the pods that are not (or no longer) ready but have an IP, by IP: a pod has its IP
///   before it is ready, so the override is in place before endpoints list it, and stays while
///   a terminating pod is still listed. This one reaches Dubbo SDKs too, whose providers'
///   URLs do not carry pod labels.
pub fn holding_back(
    spec: Option<DynamicConfigSpec>,
    application: &str,
    selector: &BTreeMap<String, String>,
    held: &[String],
) -> Option<DynamicConfigSpec> {
    if held.is_empty() && selector.is_empty() {
        return spec;
    }
    let mut spec = spec.unwrap_or_else(|| application_config(application, Vec::new()));
    let zero = |addresses: Vec<String>, r#match: Option<ConditionMatch>| {
        provider_override(addresses, r#match, "weight", "0".to_owned())
    };
    if !selector.is_empty() {
        let param = selector
            .iter()
            .map(|(key, value)| ParamMatch {
                key: key.clone(),
                value: StringMatch {
                    exact: value.clone(),
                    ..StringMatch::default()
                },
            })
            .collect();
        let by_labels = ConditionMatch {
            param,
            ..ConditionMatch::default()
        };
        spec.configs.insert(0, zero(Vec::new(), Some(by_labels)));
    }
    spec.configs
        .extend(held.iter().map(|ip| zero(vec![ip.clone()], None)));
    Some(spec)
}

#[cfg(test)]
fn canary_share(weight: u64, primaries: usize, canaries: usize) -> f64 {
    let canary = weight as f64 * canaries as f64;
    let total = canary + DEFAULT_WEIGHT as f64 * primaries as f64;
    if total == 0.0 { 0.0 } else { canary / total }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_percent_is_weight_zero() {
        assert_eq!(canary_pod_weight(0, 3, 1), Some(0));
        assert_eq!(canary_pod_weight(0, 0, 2), Some(0));
    }

    #[test]
    fn equal_pods_at_half_keep_the_default_weight() {
        assert_eq!(canary_pod_weight(50, 2, 2), Some(100));
        assert_eq!(canary_pod_weight(10, 1, 1), Some(11)); // 1000/90 = 11.1
        assert_eq!(canary_pod_weight(20, 4, 4), Some(25));
    }

    #[test]
    fn one_canary_pod_against_many_primaries_weighs_more() {
        // 50 % against ten primaries: one pod must weigh as much as the ten together.
        assert_eq!(canary_pod_weight(50, 10, 1), Some(1000));
        let w = canary_pod_weight(10, 20, 1).unwrap();
        assert_eq!(w, 222); // 100*10*20/90 = 222.2
        assert!((canary_share(w, 20, 1) - 0.10).abs() < 0.001);
    }

    #[test]
    fn uneven_readiness_divides_the_share_among_the_ready_pods() {
        // Three canary pods of which two are ready, five primaries of which four are ready: the
        // caller passes the ready counts, and the two pods together get the percentage.
        let w = canary_pod_weight(30, 4, 2).unwrap();
        assert_eq!(w, 86); // 100*30*4/(70*2) = 85.7
        assert!((canary_share(w, 4, 2) - 0.30).abs() < 0.005);
    }

    #[test]
    fn the_share_matches_the_percentage_at_every_step() {
        for primaries in 1..12 {
            for canaries in 1..6 {
                for percent in (5..=95).step_by(5) {
                    let w = canary_pod_weight(percent, primaries, canaries).unwrap();
                    let share = canary_share(w, primaries, canaries);
                    // Rounding the weight moves the share by at most one weight unit's worth.
                    let tolerance = canary_share(w + 1, primaries, canaries)
                        - canary_share(w.saturating_sub(1), primaries, canaries);
                    assert!(
                        (share - f64::from(percent) / 100.0).abs() <= tolerance,
                        "{percent}% {primaries}/{canaries}: w={w} share={share}"
                    );
                }
            }
        }
    }

    #[test]
    fn edges_are_finite() {
        assert_eq!(canary_pod_weight(100, 3, 1), Some(MAX_WEIGHT));
        assert_eq!(canary_pod_weight(40, 0, 2), Some(DEFAULT_WEIGHT));
        assert_eq!(canary_pod_weight(40, 3, 0), None);
        assert_eq!(canary_pod_weight(99, 10_000, 1), Some(MAX_WEIGHT));
    }

    #[test]
    fn the_config_has_one_provider_override_per_ready_pod() {
        let ips = vec!["10.0.0.7".to_owned(), "10.0.0.8".to_owned()];
        let primaries = vec!["10.1.0.1".to_owned(), "10.1.0.2".to_owned()];
        let spec = dynamic_config("podinfo", 50, &primaries, &ips, None).unwrap();
        assert_eq!(spec.key, "podinfo");
        assert_eq!(spec.scope, "application");
        assert!(spec.enabled);
        assert_eq!(spec.configs.len(), 2);
        for (config, ip) in spec.configs.iter().zip(&ips) {
            assert_eq!(config.side, "provider");
            assert_eq!(config.addresses, vec![ip.clone()]);
            assert_eq!(config.parameters["weight"], "100");
        }
        assert!(dynamic_config("podinfo", 50, &primaries, &[], None).is_none());
    }

    #[test]
    fn pods_not_ready_are_held_at_weight_zero() {
        let ready = vec!["10.0.0.7".to_owned()];
        let spec = dynamic_config("podinfo", 20, &["10.1.0.1".to_owned()], &ready, None);
        let none = BTreeMap::new();
        let held = holding_back(spec.clone(), "podinfo", &none, &["10.0.0.9".to_owned()]).unwrap();
        let weights: Vec<(&str, &str)> = held
            .configs
            .iter()
            .map(|c| (c.addresses[0].as_str(), c.parameters["weight"].as_str()))
            .collect();
        assert_eq!(weights, [("10.0.0.7", "25"), ("10.0.0.9", "0")]);
        // Only pods coming up: a config of zeros alone.
        let alone = holding_back(None, "podinfo", &none, &["10.0.0.9".to_owned()]).unwrap();
        assert_eq!(alone.configs.len(), 1);
        assert!(holding_back(None, "podinfo", &none, &[]).is_none());
        // By the target's labels, before any other override: ready pods' weights come after
        // and win; every other pod of the target is held from before it exists.
        let selector = BTreeMap::from([("app".to_owned(), "podinfo".to_owned())]);
        let held = holding_back(spec, "podinfo", &selector, &[]).unwrap();
        let first = &held.configs[0];
        assert!(first.addresses.is_empty());
        assert_eq!(first.parameters["weight"], "0");
        let matched = first.r#match.as_ref().unwrap();
        assert_eq!(matched.param[0].key, "app");
        assert_eq!(matched.param[0].value.exact, "podinfo");
        assert_eq!(held.configs[1].addresses, ["10.0.0.7"]);
        let alone = holding_back(None, "podinfo", &selector, &[]).unwrap();
        assert_eq!(alone.configs.len(), 1);
        assert!(holds_by_labels(&alone, &selector));
        let other = BTreeMap::from([("app".to_owned(), "other".to_owned())]);
        assert!(!holds_by_labels(&alone, &other));
        let by_ip = holding_back(None, "podinfo", &none, &["10.0.0.9".to_owned()]).unwrap();
        assert!(!holds_by_labels(&by_ip, &selector));
    }

    #[test]
    fn the_hold_selects_by_labels_only_the_primary_lacks_and_no_dubbo_url_carries() {
        let selector = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let both = selector(&[("app", "podinfo"), ("tier", "web")]);
        assert_eq!(hold_labels(&both, "podinfo"), both);
        // Dubbo providers' URLs carry `application`: left out, and then nothing tells the
        // canary's pods from the primary's.
        assert_eq!(
            hold_labels(
                &selector(&[("app", "podinfo"), ("version", "v1")]),
                "podinfo"
            ),
            selector(&[("app", "podinfo")])
        );
        assert!(hold_labels(&selector(&[("application", "podinfo")]), "podinfo").is_empty());
        assert!(hold_labels(&selector(&[("tier", "web")]), "podinfo").is_empty());
    }

    #[test]
    fn affinity_is_one_more_override_for_every_pod() {
        let ips = vec!["10.0.0.7".to_owned()];
        let spec = dynamic_config(
            "podinfo",
            20,
            &["10.1.0.1".to_owned()],
            &ips,
            Some("x-user"),
        )
        .unwrap();
        assert_eq!(spec.configs.len(), 2);
        let last = &spec.configs[1];
        assert_eq!(last.side, "provider");
        assert!(last.addresses.is_empty(), "every pod of the application");
        assert_eq!(
            last.parameters,
            BTreeMap::from([("hash.header".to_owned(), "x-user".to_owned())])
        );
        // No canary pod ready: the header alone, so callers are not reshuffled meanwhile.
        let alone = dynamic_config("podinfo", 20, &ips, &[], Some("x-user")).unwrap();
        assert_eq!(alone.configs.len(), 1);
        assert_eq!(alone.configs[0].parameters["hash.header"], "x-user");
        // Both are valid rules (the API server's admission and ours would take them).
        for spec in [&spec, &alone] {
            let json = serde_json::to_value(spec).unwrap();
            rules::RuleSpec::parse(rules::Kind::DynamicConfig, &json).unwrap();
        }
    }

    #[test]
    fn at_a_hundred_percent_the_primaries_get_weight_zero() {
        let canaries = vec!["10.0.0.7".to_owned()];
        let primaries = vec!["10.1.0.1".to_owned(), "10.1.0.2".to_owned()];
        let spec = dynamic_config("podinfo", 100, &primaries, &canaries, None).unwrap();
        let weights: Vec<(&str, &str)> = spec
            .configs
            .iter()
            .map(|c| (c.addresses[0].as_str(), c.parameters["weight"].as_str()))
            .collect();
        assert_eq!(
            weights,
            [("10.0.0.7", "100"), ("10.1.0.1", "0"), ("10.1.0.2", "0")]
        );
        // Without primaries the canary's default weight is everything already.
        let alone = dynamic_config("podinfo", 100, &[], &canaries, None).unwrap();
        assert_eq!(alone.configs.len(), 1);
    }
}
