//! What the controller reads from and makes of Deployments and pods: the primary made from the
//! target, readiness as `kubectl rollout status` reads it, the spec hash, the ready pods.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::Resource;
use kube::api::ObjectMeta;

use super::crd::Canary;

pub use super::configs::PRIMARY_SUFFIX;

pub fn primary_name(target: &str) -> String {
    format!("{target}{PRIMARY_SUFFIX}")
}

/// Labels whose value names the target get the `-primary` suffix, so the primary's pods are
/// told apart from the canary's (`app: podinfo` -> `app: podinfo-primary`).
fn suffixed(labels: &BTreeMap<String, String>, target: &str) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| {
            let v = if v == target {
                primary_name(target)
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// Pod-template annotation of the primary: the versions of the configs its copies hold, so a
/// config-only change rolls the primary's pods at promotion (env from a ConfigMap is read at
/// start).
pub const CONFIGS_ANNOTATION: &str = "dubbo.apache.org/configs";

/// The target's pod template as the primary runs it (labels suffixed, ConfigMaps and Secrets
/// the `-primary` copies, annotated with `configs`, their versions' hash; empty: none used).
pub fn primary_template(target: &Deployment, target_name: &str, configs: &str) -> PodTemplateSpec {
    let mut template = super::configs::renamed(&target.spec.template, true);
    let metadata = template.metadata.get_or_insert_with(ObjectMeta::default);
    if let Some(labels) = &metadata.labels {
        metadata.labels = Some(suffixed(labels, target_name));
    }
    if !configs.is_empty() {
        metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CONFIGS_ANNOTATION.to_owned(), configs.to_owned());
    }
    template
}

/// The primary's pod template as the target runs it again (the suffix taken off), for the
/// restore when the Canary is deleted.
pub fn target_template(primary: &Deployment, target_name: &str) -> PodTemplateSpec {
    let mut template = super::configs::renamed(&primary.spec.template, false);
    if let Some(metadata) = template.metadata.as_mut()
        && let Some(annotations) = metadata.annotations.as_mut()
    {
        annotations.remove(CONFIGS_ANNOTATION);
        if annotations.is_empty() {
            metadata.annotations = None;
        }
    }
    let primary = primary_name(target_name);
    if let Some(labels) = template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        for value in labels.values_mut() {
            if *value == primary {
                *value = target_name.to_owned();
            }
        }
    }
    template
}

/// The primary Deployment for `target`, owned by `canary` (so it goes when the Canary does).
pub fn primary_from(
    target: &Deployment,
    target_name: &str,
    configs: &str,
    canary: &Canary,
) -> Deployment {
    let mut spec = target.spec.clone();
    spec.template = primary_template(target, target_name, configs);
    if let Some(labels) = &spec.selector.match_labels {
        spec.selector.match_labels = Some(suffixed(labels, target_name));
    }
    if spec.replicas == Some(0) {
        spec.replicas = Some(1);
    }
    let labels = target
        .metadata
        .labels
        .as_ref()
        .map(|labels| suffixed(labels, target_name));
    Deployment {
        metadata: ObjectMeta {
            name: Some(primary_name(target_name)),
            namespace: target.metadata.namespace.clone(),
            labels,
            owner_references: canary.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// Why `deployment` is not rolled out and healthy, or `None` when it is: the Deployment
/// controller's own rules, as `kubectl rollout status` reads them.
pub fn not_ready(deployment: &Deployment) -> Option<String> {
    not_ready_at(deployment, 100)
}

/// [`not_ready`] with Flagger's ready threshold: `percent` of the updated replicas (rounded
/// down, as Flagger does) must be available.
pub fn not_ready_at(deployment: &Deployment, percent: u32) -> Option<String> {
    let name = deployment.metadata.name.as_deref().unwrap_or_default();
    let generation = deployment.metadata.generation.unwrap_or(0);
    let wanted = deployment.spec.replicas.unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    if status.conditions.iter().flatten().any(|c| {
        c.type_.as_deref() == Some("Progressing")
            && c.status.as_deref() == Some("False")
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    }) {
        return Some(format!("deployment {name} exceeded its progress deadline"));
    }
    if status.observed_generation.unwrap_or(0) < generation {
        return Some(format!(
            "waiting for deployment {name} spec update to be observed"
        ));
    }
    let updated = status.updated_replicas.unwrap_or(0);
    if updated < wanted {
        return Some(format!(
            "deployment {name}: {updated} of {wanted} updated replicas are available"
        ));
    }
    let replicas = status.replicas.unwrap_or(0);
    if replicas > updated {
        return Some(format!(
            "deployment {name}: {} old replicas are pending termination",
            replicas - updated
        ));
    }
    let available = status.available_replicas.unwrap_or(0);
    let needed = i64::from(updated) * i64::from(percent.min(100)) / 100;
    if i64::from(available) < needed {
        let threshold = if percent < 100 {
            format!(" (readyThreshold {percent}%)")
        } else {
            String::new()
        };
        return Some(format!(
            "deployment {name}: {available} of {needed}{threshold} updated replicas are available"
        ));
    }
    None
}

/// A stable hash of `template` and the versions of the ConfigMaps and Secrets it uses (`tracked`,
/// one line each), short enough for names.
pub fn spec_hash(template: &PodTemplateSpec, tracked: &[String]) -> String {
    let mut bytes = serde_json::to_vec(template).unwrap_or_default();
    for line in tracked {
        bytes.push(b'\n');
        bytes.extend_from_slice(line.as_bytes());
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The IPs of the ready, running pods `deployment` selects, sorted (the weights follow them).
pub fn ready_pod_ips<'a>(
    deployment: &Deployment,
    pods: impl Iterator<Item = &'a Pod>,
) -> Vec<String> {
    pod_ips(deployment, pods, true)
}

/// The ready, running pods `deployment` selects, each with its IP, by IP.
pub fn ready_pods<'a>(
    deployment: &Deployment,
    pods: impl Iterator<Item = &'a Pod>,
) -> Vec<(String, &'a Pod)> {
    let mut ready = pods_of(deployment, pods, true);
    ready.sort_by(|a, b| a.0.cmp(&b.0));
    ready
}

/// How an EndpointSlice names `pod` (`targetRef`).
pub fn pod_reference(pod: &Pod) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        kind: Some("Pod".to_owned()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The IPs of every pod of `deployment` that has one: ready or not, terminating too. Endpoints
/// follow pods late, so until these are gone a pod may still be listed and take calls.
pub fn any_pod_ips<'a>(
    deployment: &Deployment,
    pods: impl Iterator<Item = &'a Pod>,
) -> Vec<String> {
    pod_ips(deployment, pods, false)
}

fn pod_ips<'a>(
    deployment: &Deployment,
    pods: impl Iterator<Item = &'a Pod>,
    ready_only: bool,
) -> Vec<String> {
    let mut ips: Vec<String> = pods_of(deployment, pods, ready_only)
        .into_iter()
        .map(|(ip, _)| ip)
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

fn selector_of(deployment: &Deployment) -> BTreeMap<String, String> {
    deployment
        .spec
        .selector
        .match_labels
        .clone()
        .unwrap_or_default()
}

fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The pods of `deployment` with an IP (ready ones only, not terminating, with `ready_only`).
fn pods_of<'a>(
    deployment: &Deployment,
    pods: impl Iterator<Item = &'a Pod>,
    ready_only: bool,
) -> Vec<(String, &'a Pod)> {
    let namespace = deployment.metadata.namespace.as_deref();
    let selector = selector_of(deployment);
    if selector.is_empty() {
        // An empty selector would take every pod of the namespace.
        return Vec::new();
    }
    pods.filter(|pod| pod.metadata.namespace.as_deref() == namespace)
        .filter(|pod| !ready_only || pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| selects(&selector, pod))
        .filter_map(|pod| {
            let status = pod.status.as_ref()?;
            // A pod that ran to its end keeps its IP in status, but the IP may already be
            // another pod's: it is no pod of the target any more.
            if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
                return None;
            }
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = (ready || !ready_only)
                .then(|| status.pod_ip.clone())
                .flatten()?;
            Some((ip, pod))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(value: serde_json::Value) -> Deployment {
        serde_json::from_value(value).unwrap()
    }

    fn target() -> Deployment {
        deployment(json!({
            "metadata": {"name": "podinfo", "namespace": "test", "labels": {"app": "podinfo"},
                         "resourceVersion": "7", "uid": "u1"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "podinfo"}},
                     "template": {"metadata": {"labels": {"app": "podinfo", "tier": "backend"}},
                                  "spec": {"containers": [{"name": "app", "image": "podinfo:1"}]}}},
        }))
    }

    fn canary() -> Canary {
        serde_json::from_value(json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
            "metadata": {"name": "podinfo", "namespace": "test", "uid": "c1"},
            "spec": {"targetRef": {"name": "podinfo"}, "analysis": {"stepWeight": 10}},
        }))
        .unwrap()
    }

    #[test]
    fn the_primary_takes_the_suffix_where_labels_name_the_target() {
        let primary = primary_from(&target(), "podinfo", "", &canary());
        assert_eq!(primary.metadata.name.as_deref(), Some("podinfo-primary"));
        assert_eq!(primary.metadata.resource_version, None);
        let spec = &primary.spec;
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap()["app"],
            "podinfo-primary"
        );
        let labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(labels["app"], "podinfo-primary");
        assert_eq!(labels["tier"], "backend");
        assert_eq!(spec.replicas, Some(3));
        let owner = &primary.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Canary", "c1"));
        // And back again.
        let back = target_template(&primary, "podinfo");
        assert_eq!(back, target().spec.template);
    }

    #[test]
    fn readiness_follows_the_deployment_controller() {
        let mut d = target();
        d.metadata.generation = Some(2);
        assert!(not_ready(&d).unwrap().contains("observed"));
        d.status = Some(
            serde_json::from_value(json!({
                "observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3
            }))
            .unwrap(),
        );
        assert_eq!(not_ready(&d), None);
        d.status.as_mut().unwrap().available_replicas = Some(2);
        assert!(not_ready(&d).unwrap().contains("2 of 3"));
        d.status.as_mut().unwrap().updated_replicas = Some(1);
        assert!(not_ready(&d).unwrap().contains("1 of 3 updated"));
        d.status = Some(
            serde_json::from_value(json!({
                "observedGeneration": 2, "replicas": 4, "updatedReplicas": 3, "availableReplicas": 3
            }))
            .unwrap(),
        );
        assert!(not_ready(&d).unwrap().contains("pending termination"));
        d.status = Some(serde_json::from_value(json!({
            "observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3,
            "conditions": [{"type": "Progressing", "status": "False",
                            "reason": "ProgressDeadlineExceeded"}]
        })).unwrap());
        assert!(not_ready(&d).unwrap().contains("progress deadline"));
    }

    #[test]
    fn a_ready_threshold_asks_for_that_share_of_the_updated_replicas() {
        let mut d = target();
        d.spec.replicas = Some(4);
        d.status = Some(
            serde_json::from_value(json!({
                "replicas": 4, "updatedReplicas": 4, "availableReplicas": 2
            }))
            .unwrap(),
        );
        assert!(not_ready(&d).unwrap().contains("2 of 4 updated"));
        assert_eq!(not_ready_at(&d, 50), None);
        // 4 x 60 % = 2.4, rounded down as Flagger does: 2 are enough.
        assert_eq!(not_ready_at(&d, 60), None);
        assert!(
            not_ready_at(&d, 75)
                .unwrap()
                .contains("2 of 3 (readyThreshold 75%) updated")
        );
        // The threshold is about availability only: a rollout still in progress halts.
        d.status.as_mut().unwrap().updated_replicas = Some(3);
        assert!(not_ready_at(&d, 0).unwrap().contains("3 of 4 updated"));
    }

    #[test]
    fn the_hash_moves_with_the_template_only() {
        let a = target();
        let mut b = target();
        b.spec.replicas = Some(0);
        let hash = |d: &Deployment| spec_hash(&d.spec.template, &[]);
        assert_eq!(hash(&a), hash(&b));
        assert_eq!(hash(&a).len(), 10);
        b.spec.template.spec.as_mut().unwrap().containers[0].image = Some("podinfo:2".to_owned());
        assert_ne!(hash(&a), hash(&b));
        let with =
            |version: &str| spec_hash(&a.spec.template, &[format!("ConfigMap/env@{version}")]);
        assert_ne!(with("1"), with("2"));
        assert_ne!(with("1"), hash(&a));
    }

    #[test]
    fn only_ready_selected_pods_count() {
        let pod = |name: &str, app: &str, ip: &str, ready: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "test", "labels": {"app": app}},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
            }))
            .unwrap()
        };
        let pods = [
            pod("podinfo-a", "podinfo", "10.0.0.2", "True"),
            pod("podinfo-b", "podinfo", "10.0.0.1", "True"),
            pod("podinfo-c", "podinfo", "10.0.0.3", "False"),
            pod("podinfo-primary-a", "podinfo-primary", "10.0.1.1", "True"),
        ];
        assert_eq!(
            ready_pod_ips(&target(), pods.iter()),
            vec!["10.0.0.1".to_owned(), "10.0.0.2".to_owned()]
        );
    }
}
