//! Traffic rules as the control plane understands them: TagRoute, ConditionRoute, DynamicConfig,
//! AuthenticationPolicy and AuthorizationPolicy (wire.md §2-3). Their spec types are the custom
//! resources' specs (the crds crate derives the resources over them, and `deploy/` is generated
//! from those), what `apply` reads and what the store keeps; [`RuleSpec::parse`] validates one, naming the field at fault, and
//! [`RuleSpec::to_any`] makes its discovery-stream message. No I/O here.

pub mod cidr;
pub mod condition;
pub mod scope;

mod authentication;
mod authorization;
mod common;
mod condition_route;
mod dynamic_config;
pub mod limits;
mod manifest;
pub mod schema;
pub mod service_entry;
mod tag_route;

use std::sync::OnceLock;

use serde::de::DeserializeOwned;

pub use crate::kind::Kind;
pub use authentication::{AUTHENTICATION_ACTIONS, AuthenticationPolicySpec, PortLevel};
pub use authorization::{
    AUTHORIZATION_ACTIONS, AuthorizationPolicySpec, AuthorizationRule, Condition, MATCH_TYPES,
    Match,
};
pub use cidr::Cidr;
pub use common::{
    AddressMatch, ConditionMatch, EXTEND_ROOTS, FieldError, KUBERNETES_ENV_FIELDS, ListStringMatch,
    ParamMatch, PolicyExtend, PolicySelector, StringMatch,
};
pub use condition::{ConditionError, MatchClause, RouteCondition, parse_condition};
pub use condition_route::ConditionRouteSpec;
pub use dynamic_config::{DynamicConfigSpec, HASH_HEADER, OverrideConfig, hashable_header};
pub use manifest::{
    API_VERSION, DEFAULT_NAMESPACE, ManifestError, parse_manifests, parse_manifests_in,
};
pub use schema::{limits_markdown, limits_table};
pub use service_entry::{EntryEndpoint, EntryPort, ServiceEntrySpec};
pub use tag_route::{Tag, TagRouteSpec};

/// The kinds that are rules (every kind but ServiceNameMapping).
pub const RULE_KINDS: [Kind; 6] = [
    Kind::TagRoute,
    Kind::ConditionRoute,
    Kind::DynamicConfig,
    Kind::AuthenticationPolicy,
    Kind::AuthorizationPolicy,
    Kind::ServiceEntry,
];

/// `scope` of condition routes and dynamic configs.
pub const SCOPES: [&str; 2] = ["service", "application"];

/// `configVersion` values Dubbo reads for tag routes, condition routes and dynamic configs.
pub const CONFIG_VERSIONS: [&str; 2] = ["v3.0", "v2.7"];

fn config_version(path: &str, value: &str, condition_route: bool) -> Result<(), FieldError> {
    if condition_route && value.starts_with("v3.1") {
        // Dubbo reads v3.1 conditions as objects (several destinations); the wire carries strings.
        return Err(FieldError::value(
            path,
            "v3.1 conditions are objects, which the discovery stream cannot carry; use v3.0",
            value,
        ));
    }
    common::one_of(path, value, &CONFIG_VERSIONS)
}

/// A parsed, validated rule object.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub namespace: String,
    pub name: String,
    pub spec: RuleSpec,
    /// When its store created the object, in milliseconds since the Unix epoch (Kubernetes'
    /// `creationTimestamp`, a ZooKeeper node's `ctime`, the rule table's `created`); `None` where
    /// none is known (a manifest not yet stored). Two ServiceEntries declaring one host are
    /// ordered by it, oldest first, as Istio orders them.
    pub created: Option<i64>,
}

impl Rule {
    pub fn kind(&self) -> Kind {
        self.spec.kind()
    }

    /// `<name>/<namespace>`, the object's `key` on the discovery stream (wire.md §2).
    pub fn client_key(&self) -> String {
        crate::mapping::client_key(&self.name, &self.namespace)
    }

    /// The whole object as a Kubernetes manifest (what `get -o yaml` prints and `apply` takes).
    pub fn to_manifest(&self) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": self.kind().name(),
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self.spec.to_json(),
        })
    }
}

/// The spec of one rule, by kind.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum RuleSpec {
    TagRoute(TagRouteSpec),
    ConditionRoute(ConditionRouteSpec),
    DynamicConfig(DynamicConfigSpec),
    AuthenticationPolicy(AuthenticationPolicySpec),
    AuthorizationPolicy(AuthorizationPolicySpec),
    ServiceEntry(ServiceEntrySpec),
}

impl RuleSpec {
    pub fn kind(&self) -> Kind {
        match self {
            RuleSpec::TagRoute(_) => Kind::TagRoute,
            RuleSpec::ConditionRoute(_) => Kind::ConditionRoute,
            RuleSpec::DynamicConfig(_) => Kind::DynamicConfig,
            RuleSpec::AuthenticationPolicy(_) => Kind::AuthenticationPolicy,
            RuleSpec::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            RuleSpec::ServiceEntry(_) => Kind::ServiceEntry,
        }
    }

    /// Parses and validates the `spec` of an object of `kind`. Errors name the field path
    /// (`spec.conditions[0]: ...`), what is wrong and the value (`(got "...")`).
    pub fn parse(kind: Kind, spec: &serde_json::Value) -> Result<RuleSpec, FieldError> {
        const PATH: &str = "spec";
        if spec.is_null() {
            return Err(FieldError::new(PATH, "is required"));
        }
        let schema = spec_schema(kind);
        if let Some(schema) = schema {
            schema::check(schema, spec, PATH, schema::Depth::Types)?;
        }
        let parsed = match kind {
            Kind::TagRoute => RuleSpec::TagRoute(deserialize(spec)?),
            Kind::ConditionRoute => RuleSpec::ConditionRoute(deserialize(spec)?),
            Kind::DynamicConfig => RuleSpec::DynamicConfig(deserialize(spec)?),
            Kind::AuthenticationPolicy => RuleSpec::AuthenticationPolicy(deserialize(spec)?),
            Kind::AuthorizationPolicy => RuleSpec::AuthorizationPolicy(deserialize(spec)?),
            Kind::ServiceEntry => RuleSpec::ServiceEntry(deserialize(spec)?),
            Kind::ServiceNameMapping => {
                return Err(FieldError::new(
                    "kind",
                    "ServiceNameMapping is not a rule kind: applications register mappings",
                ));
            }
            Kind::Service => {
                return Err(FieldError::new(
                    "kind",
                    "Service is not a rule kind: services come from Kubernetes or ZooKeeper; \
                     declare one with a ServiceEntry",
                ));
            }
        };
        match &parsed {
            RuleSpec::TagRoute(spec) => spec.check(PATH)?,
            RuleSpec::ConditionRoute(spec) => spec.check(PATH)?,
            RuleSpec::DynamicConfig(spec) => spec.check(PATH)?,
            RuleSpec::AuthenticationPolicy(spec) => spec.check(PATH)?,
            RuleSpec::AuthorizationPolicy(spec) => spec.check(PATH)?,
            RuleSpec::ServiceEntry(spec) => spec.check(PATH)?,
        }
        // After the kind's own checks, whose messages say more for what they cover: what is
        // left is the schema's bounds, the same the API server enforces.
        if let Some(schema) = schema {
            schema::check(schema, spec, PATH, schema::Depth::Full)?;
        }
        Ok(parsed)
    }

    /// What a spec may say only about its own namespace (a ServiceEntry's hosts), checked where
    /// the object's namespace is known.
    pub fn check_namespace(&self, namespace: &str) -> Result<(), FieldError> {
        match self {
            RuleSpec::ServiceEntry(spec) => spec.check_namespace("spec", namespace),
            _ => Ok(()),
        }
    }

    /// Back to the spec JSON (for `get -o yaml`, the store); [`RuleSpec::parse`] takes it back.
    pub fn to_json(&self) -> serde_json::Value {
        let json = match self {
            RuleSpec::TagRoute(spec) => serde_json::to_value(spec),
            RuleSpec::ConditionRoute(spec) => serde_json::to_value(spec),
            RuleSpec::DynamicConfig(spec) => serde_json::to_value(spec),
            RuleSpec::AuthenticationPolicy(spec) => serde_json::to_value(spec),
            RuleSpec::AuthorizationPolicy(spec) => serde_json::to_value(spec),
            RuleSpec::ServiceEntry(spec) => serde_json::to_value(spec),
        };
        // Plain structs with string keys: serialising them cannot fail.
        json.unwrap_or_default()
    }
}

/// Deserialises a spec, naming the field at fault (`spec.tags[0].name: invalid type: ...`).
fn deserialize<T: DeserializeOwned>(spec: &serde_json::Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(spec).map_err(|err| {
        let path = match err.path().to_string() {
            root if root == "." => "spec".to_owned(),
            index if index.starts_with('[') => format!("spec{index}"),
            inner => format!("spec.{inner}"),
        };
        FieldError::new(path, err.into_inner().to_string())
    })
}

/// The CRD schema of `kind`'s spec, parsed once from `spec_schemas.json`: the custom resources
/// are derived in the crds crate (the domain knows no Kubernetes), whose test keeps the file equal
/// to what it generates.
pub fn spec_schema(kind: Kind) -> Option<&'static serde_json::Value> {
    static SCHEMAS: OnceLock<serde_json::Value> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| {
        serde_json::from_str(SPEC_SCHEMAS).unwrap_or_else(|err| {
            tracing::error!(%err, "spec_schemas.json does not parse; rule specs go unchecked by schema");
            serde_json::Value::Null
        })
    });
    schemas.get(kind.name())
}

/// The text of `spec_schemas.json`, for the crds crate's freshness test.
pub const SPEC_SCHEMAS: &str = include_str!("spec_schemas.json");
