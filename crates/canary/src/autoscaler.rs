//! The target's HorizontalPodAutoscaler (Flagger's `spec.autoscalerRef`): its `-primary` copy
//! scales the primary, and its bounds size the canary. No I/O.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec,
};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::services::Owner;

/// Flagger's `autoscalerRef`; only `autoscaling/v2` HorizontalPodAutoscalers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerRef {
    #[serde(default = "autoscaling_v2")]
    #[schemars(extend("enum" = ["autoscaling/v2"]), length(max = 32))]
    pub api_version: String,
    #[serde(default = "hpa")]
    #[schemars(extend("enum" = ["HorizontalPodAutoscaler"]), length(max = 32))]
    pub kind: String,
    #[schemars(length(min = 1, max = 245))]
    pub name: String,
}

fn autoscaling_v2() -> String {
    "autoscaling/v2".to_owned()
}

fn hpa() -> String {
    "HorizontalPodAutoscaler".to_owned()
}

/// `<autoscalerRef.name>-primary`, as Flagger names it.
pub fn copy_name(reference: &AutoscalerRef) -> String {
    format!("{}-primary", reference.name)
}

/// The copy of `source` that scales Deployment `primary`, owned by `owner`: the same bounds,
/// metrics and behaviour (Flagger copies these four), and labels.
pub fn primary_copy(
    source: &HorizontalPodAutoscaler,
    reference: &AutoscalerRef,
    primary: &str,
    owner: &Owner,
) -> HorizontalPodAutoscaler {
    let labels = source.metadata.labels.clone().unwrap_or_default();
    let spec = source.spec.clone();
    HorizontalPodAutoscaler {
        metadata: owner.meta(&copy_name(reference), labels),
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".to_owned()),
                kind: "Deployment".to_owned(),
                name: primary.to_owned(),
            },
            min_replicas: spec.min_replicas,
            max_replicas: spec.max_replicas,
            metrics: spec.metrics,
            behavior: spec.behavior,
        },
        status: None,
    }
}

/// Whether `stored` already says what `wanted` does (spec and labels).
pub fn copy_matches(stored: &HorizontalPodAutoscaler, wanted: &HorizontalPodAutoscaler) -> bool {
    stored.spec == wanted.spec && stored.metadata.labels == wanted.metadata.labels
}

/// The canary's replicas when a run starts with an autoscaler: its `minReplicas` (default 1),
/// as Flagger's scale-from-zero; the target's own HPA then scales it within its bounds.
pub fn canary_replicas(source: &HorizontalPodAutoscaler) -> i32 {
    source.spec.min_replicas.unwrap_or(1).max(1)
}

/// Why `source` cannot be copied for the primary of `target`, if so.
pub fn problem(source: &HorizontalPodAutoscaler, target: &str) -> Option<String> {
    let name = source.metadata.name.clone().unwrap_or_default();
    let scaled = &source.spec.scale_target_ref;
    if scaled.kind != "Deployment" || scaled.name != target {
        return Some(format!(
            "HorizontalPodAutoscaler {name} scales {} {}, not Deployment {target} (spec.autoscalerRef)",
            scaled.kind, scaled.name
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_copy_scales_the_primary_with_the_targets_bounds() {
        let reference: AutoscalerRef = serde_json::from_value(json!({"name": "podinfo"})).unwrap();
        let owner = Owner {
            name: "podinfo".to_owned(),
            uid: Some("c1".to_owned()),
            ..Owner::default()
        };
        assert_eq!(reference.api_version, "autoscaling/v2");
        let source: HorizontalPodAutoscaler = serde_json::from_value(json!({
            "metadata": {"name": "podinfo", "namespace": "test", "labels": {"team": "a"}},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                     "minReplicas": 2, "maxReplicas": 4},
        }))
        .unwrap();
        assert_eq!(problem(&source, "podinfo"), None);
        assert!(
            problem(&source, "other")
                .unwrap()
                .contains("not Deployment other")
        );
        let copy = primary_copy(&source, &reference, "podinfo-primary", &owner);
        assert_eq!(copy.metadata.name.as_deref(), Some("podinfo-primary"));
        let spec = &copy.spec;
        assert_eq!(spec.scale_target_ref.name, "podinfo-primary");
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 4));
        assert_eq!(copy.metadata.labels.as_ref().unwrap()["team"], "a");
        assert_eq!(
            copy.metadata.labels.as_ref().unwrap()["dubbo.apache.org/canary"],
            "podinfo"
        );
        assert_eq!(canary_replicas(&source), 2);
    }
}
