//! The rule kinds as Kubernetes custom resources. The domain owns their specs (fields,
//! limits, CEL rules, validation) and knows nothing of Kubernetes; this crate wraps each spec in
//! kube's `CustomResource` derive, so `deploy/crd.yaml`, the watches and the canary controller get
//! the typed resources, and the domain's copy of the schemas (`spec_schemas.json`) is checked
//! against what is generated here.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use dubbo_cp_domain::rules::{self, Kind};

/// A newtype over a domain spec reads and converts like the spec it holds.
macro_rules! spec_newtype {
    ($spec:ident) => {
        impl std::ops::Deref for $spec {
            type Target = rules::$spec;
            fn deref(&self) -> &Self::Target {
                &self.0
            }
        }
        impl std::ops::DerefMut for $spec {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.0
            }
        }
        impl From<rules::$spec> for $spec {
            fn from(spec: rules::$spec) -> Self {
                Self(spec)
            }
        }
    };
}

// The domain's `TagRouteSpec` as the resource's spec: kube's derive needs a type of its own, serde and
// schemars see straight through it (a doc comment here would become the schema's description).
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "TagRoute",
    doc = "A tag route: requests carrying a tag go to the instances of that tag (grey releases)",
    namespaced,
    plural = "tagroutes",
    singular = "tagroute",
    category = "dubbo",
    printcolumn = r#"{"name":"Key","type":"string","jsonPath":".spec.key"}"#,
    printcolumn = r#"{"name":"Enabled","type":"boolean","jsonPath":".spec.enabled"}"#,
    printcolumn = r#"{"name":"Tags","type":"string","jsonPath":".spec.tags[*].name"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct TagRouteSpec(pub rules::TagRouteSpec);

spec_newtype!(TagRouteSpec);

// The domain's `ConditionRouteSpec` as the resource's spec: kube's derive needs a type of its own, serde and
// schemars see straight through it (a doc comment here would become the schema's description).
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "ConditionRoute",
    doc = "A condition route: which providers the requests a condition matches may reach",
    namespaced,
    plural = "conditionroutes",
    singular = "conditionroute",
    category = "dubbo",
    printcolumn = r#"{"name":"Key","type":"string","jsonPath":".spec.key"}"#,
    printcolumn = r#"{"name":"Scope","type":"string","jsonPath":".spec.scope"}"#,
    printcolumn = r#"{"name":"Enabled","type":"boolean","jsonPath":".spec.enabled"}"#,
    printcolumn = r#"{"name":"Conditions","type":"string","jsonPath":".spec.conditions"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct ConditionRouteSpec(pub rules::ConditionRouteSpec);

spec_newtype!(ConditionRouteSpec);

// The domain's `DynamicConfigSpec` as the resource's spec: kube's derive needs a type of its own, serde and
// schemars see straight through it (a doc comment here would become the schema's description).
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "DynamicConfig",
    doc = "A dynamic config: parameters (weight, timeout, retries, ...) overridden at run time",
    namespaced,
    plural = "dynamicconfigs",
    singular = "dynamicconfig",
    category = "dubbo",
    printcolumn = r#"{"name":"Key","type":"string","jsonPath":".spec.key"}"#,
    printcolumn = r#"{"name":"Scope","type":"string","jsonPath":".spec.scope"}"#,
    printcolumn = r#"{"name":"Enabled","type":"boolean","jsonPath":".spec.enabled"}"#,
    printcolumn = r#"{"name":"Sides","type":"string","jsonPath":".spec.configs[*].side"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct DynamicConfigSpec(pub rules::DynamicConfigSpec);

spec_newtype!(DynamicConfigSpec);

// The domain's `AuthenticationPolicySpec` as the resource's spec: kube's derive needs a type of its own, serde and
// schemars see straight through it (a doc comment here would become the schema's description).
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "AuthenticationPolicy",
    doc = "An authentication policy: whether the selected workloads require mTLS from callers",
    namespaced,
    plural = "authenticationpolicies",
    singular = "authenticationpolicy",
    category = "dubbo",
    printcolumn = r#"{"name":"Action","type":"string","jsonPath":".spec.action"}"#,
    printcolumn = r#"{"name":"Selected Namespaces","type":"string","jsonPath":".spec.selector[*].namespaces"}"#,
    printcolumn = r#"{"name":"Ports","type":"string","jsonPath":".spec.portLevel[*].port"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct AuthenticationPolicySpec(pub rules::AuthenticationPolicySpec);

spec_newtype!(AuthenticationPolicySpec);

// The domain's `AuthorizationPolicySpec` as the resource's spec: kube's derive needs a type of its own, serde and
// schemars see straight through it (a doc comment here would become the schema's description).
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "AuthorizationPolicy",
    doc = "An authorization policy: which callers the selected workloads let in or turn away",
    namespaced,
    plural = "authorizationpolicies",
    singular = "authorizationpolicy",
    category = "dubbo",
    printcolumn = r#"{"name":"Action","type":"string","jsonPath":".spec.action"}"#,
    printcolumn = r#"{"name":"Match Type","type":"string","jsonPath":".spec.matchType"}"#,
    printcolumn = r#"{"name":"Target Namespaces","type":"string","jsonPath":".spec.rules[*].to.namespaces"}"#,
    printcolumn = r#"{"name":"Samples","type":"number","jsonPath":".spec.samples","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct AuthorizationPolicySpec(pub rules::AuthorizationPolicySpec);

spec_newtype!(AuthorizationPolicySpec);

// The domain's `ServiceEntrySpec` as the resource's spec: kube's derive needs a type of its own, serde and
// schemars see straight through it (a doc comment here would become the schema's description).
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "ServiceEntry",
    doc = "A service entry: services and their endpoints, declared (Istio's ServiceEntry fields), served to xDS clients",
    namespaced,
    plural = "serviceentries",
    singular = "serviceentry",
    category = "dubbo",
    printcolumn = r#"{"name":"Hosts","type":"string","jsonPath":".spec.hosts"}"#,
    printcolumn = r#"{"name":"Ports","type":"string","jsonPath":".spec.ports[*].number"}"#,
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.endpoints[*].address","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct ServiceEntrySpec(pub rules::ServiceEntrySpec);

spec_newtype!(ServiceEntrySpec);

/// The rule CRDs, in [`rules::RULE_KINDS`] order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        TagRoute::crd(),
        ConditionRoute::crd(),
        DynamicConfig::crd(),
        AuthenticationPolicy::crd(),
        AuthorizationPolicy::crd(),
        ServiceEntry::crd(),
    ]
}

/// The OpenAPI schema of each rule kind's `spec`, by kind name: what the domain's
/// `spec_schemas.json` must hold.
pub fn spec_schemas() -> serde_json::Map<String, serde_json::Value> {
    rules::RULE_KINDS
        .iter()
        .zip(crds())
        .map(|(kind, crd): (&Kind, CustomResourceDefinition)| {
            let root = crd
                .spec
                .versions
                .first()
                .and_then(|version| version.schema.as_ref())
                .and_then(|schema| schema.open_api_v3_schema.as_ref())
                .and_then(|root| serde_json::to_value(root).ok())
                .unwrap_or_default();
            (kind.name().to_owned(), root["properties"]["spec"].clone())
        })
        .collect()
}

#[cfg(test)]
mod tests;
