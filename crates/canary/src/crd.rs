//! The `Canary` custom resource (rollout.md): field names follow Flagger's wherever they mean the
//! same thing, so Flagger users read it without a glossary.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Annotation `dubbo-cp canary promote|abort` sets: `promote:<nonce>` or `abort:<nonce>`.
pub const ACTION_ANNOTATION: &str = "dubbo.apache.org/canary-action";

/// A progressive rollout of one Deployment's pod template, traffic moved by provider weights.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "Canary",
    doc = "A canary release of a Dubbo application: analysis, promotion and rollback by weight",
    namespaced,
    plural = "canaries",
    singular = "canary",
    category = "dubbo",
    status = "CanaryStatus",
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.targetRef.name"}"#,
    printcolumn = r#"{"name":"Strategy","type":"string","jsonPath":".status.strategy"}"#,
    printcolumn = r#"{"name":"Match","type":"string","jsonPath":".status.match"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".status.canaryWeight"}"#,
    printcolumn = r#"{"name":"FailedChecks","type":"integer","jsonPath":".status.failedChecks"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CanarySpec {
    pub target_ref: TargetRef,
    /// The Dubbo application whose provider weights move; the target's name when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub application: Option<String>,
    /// No progress for this long rolls the run back.
    #[serde(default = "default_deadline")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: u32,
    /// Promote the next change without analysis.
    #[serde(default)]
    pub skip_analysis: bool,
    /// Flagger's: while true the controller does nothing for this Canary (no run starts, a run
    /// in flight holds where it is, its status is not written); deleting it still restores the
    /// target.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    #[serde(default = "default_history")]
    #[schemars(range(min = 1, max = 1000))]
    pub revision_history_limit: u32,
    /// The Prometheus to query; the server's `canary.prometheus` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusRef>,
    /// ClusterIP Services `<name>`, `<name>-primary`, `<name>-canary` (Flagger's); none when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<crate::services::CanaryService>,
    /// The target's HorizontalPodAutoscaler: copied for the primary, it bounds the canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler_ref: Option<crate::autoscaler::AutoscalerRef>,
    pub analysis: Analysis,
}

fn default_deadline() -> u32 {
    600
}

fn default_history() -> u32 {
    10
}

/// The Deployment the canary rolls out (only `apps/v1` `Deployment`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    #[serde(default = "apps_v1")]
    #[schemars(extend("enum" = ["apps/v1"]), length(max = 16))]
    pub api_version: String,
    #[serde(default = "deployment")]
    #[schemars(extend("enum" = ["Deployment"]), length(max = 16))]
    pub kind: String,
    #[schemars(length(min = 1, max = 200))]
    pub name: String,
}

fn apps_v1() -> String {
    "apps/v1".to_owned()
}

fn deployment() -> String {
    "Deployment".to_owned()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
pub struct PrometheusRef {
    #[schemars(length(min = 1, max = 2048))]
    pub address: String,
}

/// The analysis: how often, how much traffic per step, what must hold, who is asked.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.stepWeight) || self.stepWeight <= self.maxWeight"
).message("stepWeight must not exceed maxWeight"))]
#[x_kube(validation = Rule::new(
    "!has(self.stepWeights) || self.stepWeights.all(w, w <= self.maxWeight)"
).message("every stepWeights entry must be at most maxWeight"))]
#[x_kube(validation = Rule::new(
    "has(self.stepWeight) || has(self.stepWeights) || has(self.iterations)"
).message("set stepWeight or stepWeights (Canary), or iterations (A/B testing, Blue/Green)"))]
#[x_kube(validation = Rule::new("!has(self.match) || has(self.iterations)")
    .message("match (A/B testing) needs iterations"))]
pub struct Analysis {
    /// One iteration per interval (`1m`, `30s`).
    #[serde(default = "one_minute")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub interval: String,
    /// Failed checks before rollback.
    #[serde(default = "default_threshold")]
    #[schemars(range(min = 1, max = 1000))]
    pub threshold: u32,
    /// Percent of traffic the canary reaches before promotion.
    #[serde(default = "default_max_weight")]
    #[schemars(range(min = 0, max = 100))]
    pub max_weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub step_weight: Option<u32>,
    /// Flagger's: once the primary runs the promoted template, calls go back to it this many
    /// percent per interval instead of all at once (Canary and Blue/Green).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub step_weight_promotion: Option<u32>,
    /// Explicit steps, ascending; used instead of `stepWeight` when set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(range(min = 0, max = 100)))]
    pub step_weights: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub metrics: Vec<MetricCheck>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub webhooks: Vec<Webhook>,
    /// Passed analysis iterations before promotion: A/B testing (with `match`) or Blue/Green
    /// (without), as Flagger's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub iterations: Option<u32>,
    /// A/B testing: the calls that reach the canary (any entry; every header of an entry).
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub r#match: Vec<HttpMatch>,
    /// Flagger's traffic mirroring: proxyless gRPC clients have no mirror policy, so a Canary
    /// that asks for it is refused (status condition `InvalidSpec`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mirror: bool,
    /// Keeps a caller on the version it first got while weights step (Canary strategy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinity>,
    /// Chat or webhook alerts on the run's events, by severity (Flagger's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub alerts: Vec<crate::alerts::CanaryAlert>,
    /// Flagger's: the percent of the primary's updated replicas that must be available for it
    /// to count as ready (initialisation, analysis, promotion).
    #[serde(default = "all_replicas", skip_serializing_if = "is_all_replicas")]
    #[schemars(range(max = 100))]
    pub primary_ready_threshold: u32,
    /// Flagger's: the same for the canary (the target) during analysis.
    #[serde(default = "all_replicas", skip_serializing_if = "is_all_replicas")]
    #[schemars(range(max = 100))]
    pub canary_ready_threshold: u32,
}

fn all_replicas() -> u32 {
    100
}

fn is_all_replicas(percent: &u32) -> bool {
    *percent == 100
}

/// Flagger's session affinity, for gRPC: callers are told apart by a request header
/// (`headerName`, ours) instead of a cookie, which gRPC does not have. Flagger's cookie fields
/// are accepted by the schema so they are not dropped silently, and refused by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinity {
    /// The request header (gRPC metadata key) whose value names a caller: `x-user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9._-]+$"), length(max = 100))]
    pub header_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub cookie_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub primary_cookie_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31536000))]
    pub max_age: Option<u32>,
}

/// Which calls an A/B run sends to the canary: Flagger's HTTP match. gRPC calls carry headers
/// (metadata); `uri`, `queryParams` and `sourceLabels` are accepted by the schema so they are
/// not dropped silently, and refused by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatch {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 10))]
    pub headers: BTreeMap<String, HeaderMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<HeaderMatch>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 10))]
    pub query_params: BTreeMap<String, HeaderMatch>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = 10,
        "additionalProperties" = {"type": "string", "maxLength": 253},
    ))]
    pub source_labels: BTreeMap<String, String>,
}

/// How a header's value matches (Flagger's, from Istio's StringMatch): one of the four.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct HeaderMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub suffix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub regex: Option<String>,
}

/// How a run moves traffic, from the analysis as Flagger reads it: `iterations` with `match`
/// is A/B testing, `iterations` alone Blue/Green, weights otherwise Canary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Canary,
    ABTesting,
    BlueGreen,
}

impl Strategy {
    pub fn of(analysis: &Analysis) -> Strategy {
        match (analysis.iterations, analysis.r#match.is_empty()) {
            (Some(_), false) => Strategy::ABTesting,
            (Some(_), true) => Strategy::BlueGreen,
            (None, _) => Strategy::Canary,
        }
    }

    /// As `status.strategy` and `kubectl get canaries` show it.
    /// The strategy [`Strategy::as_str`] names (a status's), if any.
    pub fn named(name: &str) -> Option<Strategy> {
        [Strategy::Canary, Strategy::ABTesting, Strategy::BlueGreen]
            .into_iter()
            .find(|s| s.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Canary => "Canary",
            Strategy::ABTesting => "A/B",
            Strategy::BlueGreen => "Blue/Green",
        }
    }
}

fn one_minute() -> String {
    "1m".to_owned()
}

fn default_threshold() -> u32 {
    5
}

fn default_max_weight() -> u32 {
    50
}

/// A metric that must stay in range: a built-in (`request-success-rate`, `request-duration`) or
/// any name with a `query`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricCheck {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 10000))]
    pub query: Option<String>,
    #[serde(default)]
    pub threshold_range: ThresholdRange,
    /// The `{{ interval }}` of the query; the analysis interval when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub interval: Option<String>,
    /// A MetricTemplate's query (and Prometheus) instead of `query`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<crate::template::TemplateRef>,
    /// The template's `{{ variables.<name> }}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = 32,
        "additionalProperties" = {"type": "string", "maxLength": 1024},
    ))]
    pub template_variables: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
pub struct ThresholdRange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

/// The eight hook types of rollout.md; no type means `rollout`.
pub const HOOK_TYPES: [&str; 8] = [
    "confirm-rollout",
    "pre-rollout",
    "rollout",
    "confirm-traffic-increase",
    "confirm-promotion",
    "post-rollout",
    "rollback",
    "event",
];

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = HOOK_TYPES), length(max = 32))]
    pub r#type: Option<String>,
    #[schemars(regex(pattern = r"^https?://"), length(max = 2048))]
    pub url: String,
    /// Default 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"), length(max = 32))]
    pub timeout: Option<String>,
    #[serde(default)]
    #[schemars(range(min = 0, max = 10))]
    pub retries: u32,
    /// Sent to the hook as they are.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = 32,
        "additionalProperties" = {"type": "string", "maxLength": 4096},
    ))]
    pub metadata: BTreeMap<String, String>,
    /// Flagger's: no alert when the run waits on this gate (`confirm-*` hooks); its events and
    /// status still say so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mute_alert: bool,
}

/// What the controller observed and decided, for `kubectl get`, the CLI and the dashboard.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    #[serde(default)]
    pub phase: String,
    /// `Canary`, `A/B` or `Blue/Green` ([`Strategy`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub strategy: String,
    /// A/B: the calls the canary gets, for `kubectl get` (`x-canary=insider or x-user suffix
    /// @example.com`); empty for the other strategies.
    #[serde(default, rename = "match", skip_serializing_if = "String::is_empty")]
    pub r#match: String,
    #[serde(default)]
    pub canary_weight: u32,
    #[serde(default)]
    pub failed_checks: u32,
    /// Analysis iterations of this run that passed.
    #[serde(default)]
    pub iterations: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_applied_spec: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_promoted_spec: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_revision: String,
    /// When the phase or weight last moved: the progress deadline counts from here (RFC 3339).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
    /// When the last analysis iteration ran (RFC 3339): iterations are `interval` apart however
    /// often the Canary is reconciled.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_analysis_time: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<CanaryCondition>,
    /// The weight over the current run, one entry per step (at most 60).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Step>,
    /// The last answer of each hook (by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookResult>,
    /// The last `dubbo-cp canary promote|abort` request handled (its annotation value).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub handled_action: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryCondition {
    #[serde(rename = "type")]
    pub r#type: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: String,
}

/// One analysis iteration: the weight it left and each metric's value against its range.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub time: String,
    pub weight: u32,
    pub phase: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricResult>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricResult {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookResult {
    pub name: String,
    #[serde(rename = "type")]
    pub r#type: String,
    pub ok: bool,
    pub message: String,
    pub time: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use kube::core::cel::Validator;
    use serde_json::json;

    fn schema() -> serde_json::Value {
        let crd = Canary::crd();
        let schema = crd.spec.versions[0].schema.as_ref().unwrap();
        serde_json::to_value(schema.open_api_v3_schema.as_ref().unwrap()).unwrap()
    }

    fn failures(analysis: serde_json::Value) -> Vec<String> {
        let object = json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
            "metadata": {"name": "podinfo", "namespace": "test"},
            "spec": {"targetRef": {"name": "podinfo"}, "analysis": analysis},
        });
        match Validator::new().validate(&schema(), &object, None) {
            Ok(()) => vec![],
            Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
        }
    }

    #[test]
    fn the_crd_matches_the_contract() {
        let crd = Canary::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("canaries.dubbo.apache.org")
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<&str> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Target",
                "Strategy",
                "Match",
                "Phase",
                "Weight",
                "FailedChecks",
                "Age"
            ]
        );
    }

    #[test]
    fn the_api_server_refuses_inconsistent_weights() {
        assert_eq!(
            failures(json!({"maxWeight": 50, "stepWeight": 10})),
            Vec::<String>::new()
        );
        assert_eq!(
            failures(json!({"maxWeight": 50, "stepWeights": [1, 5, 10, 50]})),
            Vec::<String>::new()
        );
        assert_eq!(
            failures(json!({"maxWeight": 30, "stepWeight": 40})),
            ["stepWeight must not exceed maxWeight"]
        );
        assert_eq!(
            failures(json!({"maxWeight": 30, "stepWeights": [10, 60]})),
            ["every stepWeights entry must be at most maxWeight"]
        );
        assert_eq!(
            failures(json!({"maxWeight": 30})),
            ["set stepWeight or stepWeights (Canary), or iterations (A/B testing, Blue/Green)"]
        );
        assert_eq!(failures(json!({"iterations": 5})), Vec::<String>::new());
        let ab =
            json!({"iterations": 5, "match": [{"headers": {"x-canary": {"exact": "insider"}}}]});
        assert_eq!(failures(ab), Vec::<String>::new());
        assert_eq!(
            failures(
                json!({"stepWeight": 5, "match": [{"headers": {"x-canary": {"exact": "a"}}}]})
            ),
            ["match (A/B testing) needs iterations"]
        );
    }

    #[test]
    fn the_strategy_is_read_from_the_analysis_as_flagger_reads_it() {
        let analysis =
            |value: serde_json::Value| -> Analysis { serde_json::from_value(value).unwrap() };
        assert_eq!(
            Strategy::of(&analysis(json!({"stepWeight": 10}))),
            Strategy::Canary
        );
        assert_eq!(
            Strategy::of(&analysis(json!({"iterations": 3}))),
            Strategy::BlueGreen
        );
        // Iterations win over weights, as in Flagger's scheduler.
        assert_eq!(
            Strategy::of(&analysis(json!({"iterations": 3, "stepWeight": 10}))),
            Strategy::BlueGreen
        );
        let ab = json!({"iterations": 3, "match": [{"headers": {"x-canary": {"prefix": "in"}}}]});
        assert_eq!(Strategy::of(&analysis(ab)), Strategy::ABTesting);
    }

    #[test]
    fn ranges_are_in_the_schema() {
        let schema = schema();
        let analysis = &schema["properties"]["spec"]["properties"]["analysis"]["properties"];
        assert_eq!(analysis["threshold"]["minimum"], 1.0);
        assert_eq!(analysis["maxWeight"]["maximum"], 100.0);
        assert_eq!(analysis["stepWeight"]["maximum"], 100.0);
        assert_eq!(analysis["stepWeights"]["items"]["maximum"], 100.0);
        let hook_type = &analysis["webhooks"]["items"]["properties"]["type"]["enum"];
        assert_eq!(hook_type.as_array().unwrap().len(), HOOK_TYPES.len());
    }
}
