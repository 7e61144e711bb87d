//! What the index holds for every kind: a mapping's applications, a rule's spec or a service,
//! as the domain understands them. Each protocol edge turns one into its own message (DDS: `<Kind>ToClient`).

use std::collections::BTreeSet;

use crate::kind::Kind;
use crate::mapping::{MappingKey, client_key};
use crate::rules::RuleSpec;
use crate::service::Service;

/// One object of any kind, protocol-neutral.
#[derive(Debug, Clone, PartialEq)]
pub enum Resource {
    /// A ServiceNameMapping: the applications serving `interface`, in the order the source
    /// gave them (the store and the CRD keep them sorted).
    Mapping {
        interface: String,
        applications: Vec<String>,
    },
    Rule(RuleSpec),
    /// A service a registry reports, with its endpoints (Kubernetes, ZooKeeper).
    Service(Service),
}

impl Resource {
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Mapping { .. } => Kind::ServiceNameMapping,
            Resource::Rule(spec) => spec.kind(),
            Resource::Service(_) => Kind::Service,
        }
    }

    /// A mapping of `interface` to `applications`.
    pub fn mapping(
        interface: impl Into<String>,
        applications: impl IntoIterator<Item = String>,
    ) -> Self {
        Resource::Mapping {
            interface: interface.into(),
            applications: applications.into_iter().collect(),
        }
    }
}
/// The object for one mapping named `name`: key `<name>/<namespace>` and its value.
pub fn mapping_object(
    name: &str,
    key: &MappingKey,
    applications: &BTreeSet<String>,
) -> (String, Resource) {
    let client_key = client_key(name, &key.namespace);
    let value = Resource::mapping(key.interface.clone(), applications.iter().cloned());
    (client_key, value)
}
