//! The ConfigMaps and Secrets a pod template uses (volumes, projections, `envFrom`, `env`
//! `valueFrom`): a change of one starts a run like a template change, and the primary runs on
//! copies named `<name>-primary`, so a change under analysis does not reach it before promotion
//! (Flagger's tracked configs).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

pub const PRIMARY_SUFFIX: &str = "-primary";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigKind {
    ConfigMap,
    Secret,
}

/// A ConfigMap or Secret a template names.
pub type ConfigRef = (ConfigKind, String);

/// Where a template names a ConfigMap or Secret: the key of the object holding the reference
/// and the field with the name.
fn reference(key: &str, object: &Value) -> Option<(ConfigKind, &'static str)> {
    match key {
        "configMap" | "configMapRef" | "configMapKeyRef" => Some((ConfigKind::ConfigMap, "name")),
        // A volume's `secret` names it `secretName`; a projection's `secret`, `name`.
        "secret" if object.get("secretName").is_some() => Some((ConfigKind::Secret, "secretName")),
        "secret" | "secretRef" | "secretKeyRef" => Some((ConfigKind::Secret, "name")),
        _ => None,
    }
}

fn walk(value: &mut Value, visit: &mut impl FnMut(ConfigKind, &mut Value)) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                // An optional reference to something missing is fine for the kubelet; tracking
                // it would block on an object that need not exist.
                let optional = child.get("optional") == Some(&Value::Bool(true));
                if let Some((kind, field)) = reference(key, child)
                    && !optional
                    && let Some(name) = child.get_mut(field)
                {
                    visit(kind, name);
                }
                walk(child, visit);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| walk(item, visit)),
        _ => {}
    }
}

/// The ConfigMaps and Secrets `template` uses.
pub fn references(template: &PodTemplateSpec) -> BTreeSet<ConfigRef> {
    let mut found = BTreeSet::new();
    if let Ok(mut json) = serde_json::to_value(template) {
        walk(&mut json, &mut |kind, name| {
            if let Some(name) = name.as_str() {
                found.insert((kind, name.to_owned()));
            }
        });
    }
    found
}

/// `template` with every ConfigMap and Secret name given the `-primary` suffix (`add`), or
/// that suffix taken off again.
pub fn renamed(template: &PodTemplateSpec, add: bool) -> PodTemplateSpec {
    let Ok(mut json) = serde_json::to_value(template) else {
        return template.clone();
    };
    walk(&mut json, &mut |_, name| {
        if let Some(current) = name.as_str() {
            let next = if add {
                format!("{current}{PRIMARY_SUFFIX}")
            } else {
                current
                    .strip_suffix(PRIMARY_SUFFIX)
                    .unwrap_or(current)
                    .to_owned()
            };
            *name = Value::String(next);
        }
    });
    serde_json::from_value(json).unwrap_or_else(|_| template.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template() -> PodTemplateSpec {
        serde_json::from_value(json!({
            "spec": {
                "containers": [{
                    "name": "app", "image": "podinfo:1",
                    "envFrom": [{"configMapRef": {"name": "env"}}, {"secretRef": {"name": "env-secret"}}],
                    "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "single", "key": "a"}}},
                            {"name": "B", "valueFrom": {"secretKeyRef": {"name": "token", "key": "b"}}}],
                }],
                "volumes": [
                    {"name": "c", "configMap": {"name": "files"}},
                    {"name": "s", "secret": {"secretName": "tls"}},
                    {"name": "p", "projected": {"sources": [
                        {"configMap": {"name": "projected-cm"}}, {"secret": {"name": "projected-secret"}}]}},
                ],
                "imagePullSecrets": [{"name": "registry"}],
                "initContainers": [{"name": "init", "envFrom": [{"configMapRef": {"name": "maybe", "optional": true}}]}],
            }
        }))
        .unwrap()
    }

    #[test]
    fn every_kind_of_reference_is_found() {
        let found = references(&template());
        let names = |kind| -> Vec<&str> {
            found
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, n)| n.as_str())
                .collect()
        };
        assert_eq!(
            names(ConfigKind::ConfigMap),
            ["env", "files", "projected-cm", "single"]
        );
        assert_eq!(
            names(ConfigKind::Secret),
            ["env-secret", "projected-secret", "tls", "token"]
        );
    }

    #[test]
    fn renaming_adds_and_removes_the_suffix() {
        let primary = renamed(&template(), true);
        let found = references(&primary);
        assert_eq!(found.len(), 8);
        assert!(
            found.iter().all(|(_, n)| n.ends_with("-primary")),
            "{found:?}"
        );
        assert_eq!(renamed(&primary, false), template());
        // Image pull secrets are not copied.
        let json = serde_json::to_value(&primary).unwrap();
        assert_eq!(json["spec"]["imagePullSecrets"][0]["name"], "registry");
    }
}
