//! The ServiceNameMapping custom resource (wire.md §3), derived in Rust so the CRD YAML in
//! `deploy/` is generated from the same type the control plane reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use kube::CustomResource;
use kube::api::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mapping::{MappingKey, label_value};

/// Label every mapping object carries: the raw interface name (or its fallback, see
/// [`label_value`]), so `kubectl get snp -l interface=...` finds it.
pub const INTERFACE_LABEL: &str = "interface";

/// Which applications serve an interface in a namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "dubbo.apache.org",
    version = "v1alpha1",
    kind = "ServiceNameMapping",
    namespaced,
    plural = "servicenamemappings",
    singular = "servicenamemapping",
    shortname = "snp",
    // Raw JSON: the structured form repeats `type_ = "string"`, which clippy flags as a
    // duplicated attribute.
    printcolumn = r#"{"name":"Interface","type":"string","jsonPath":".spec.interfaceName"}"#,
    printcolumn = r#"{"name":"Applications","type":"string","jsonPath":".spec.applicationNames"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceNameMappingSpec {
    pub interface_name: String,
    #[serde(default)]
    pub application_names: Vec<String>,
}

impl ServiceNameMapping {
    /// A new object named `name` for `key` holding `applications`, labelled per wire.md §3.
    pub fn for_key(name: &str, key: &MappingKey, applications: &BTreeSet<String>) -> Self {
        let metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(key.namespace.clone()),
            labels: Some(BTreeMap::from([(
                INTERFACE_LABEL.to_owned(),
                label_value(&key.interface),
            )])),
            ..ObjectMeta::default()
        };
        ServiceNameMapping {
            metadata,
            spec: ServiceNameMappingSpec {
                interface_name: key.interface.clone(),
                application_names: applications.iter().cloned().collect(),
            },
        }
    }
}

/// Every CRD (ServiceNameMapping, the rule kinds, then Canary, MetricTemplate and AlertProvider) as
/// multi-document YAML, as
/// `dubbo-cp crd` prints it and `deploy/crd.yaml` holds it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let mut documents = vec![serde_yaml::to_string(&ServiceNameMapping::crd())?];
    for crd in dubbo_cp_crds::crds() {
        documents.push(serde_yaml::to_string(&crd)?);
    }
    documents.push(serde_yaml::to_string(&crate::canary::Canary::crd())?);
    documents.push(serde_yaml::to_string(
        &crate::canary::template::MetricTemplate::crd(),
    )?);
    documents.push(serde_yaml::to_string(
        &crate::canary::alerts::AlertProvider::crd(),
    )?);
    Ok(documents.join("---\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_matches_the_wire_contract() {
        let crd = ServiceNameMapping::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("servicenamemappings.dubbo.apache.org")
        );
        assert_eq!(crd.spec.group, "dubbo.apache.org");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "ServiceNameMapping");
        assert_eq!(crd.spec.names.plural, "servicenamemappings");
        assert_eq!(
            crd.spec.names.singular.as_deref(),
            Some("servicenamemapping")
        );
        assert_eq!(crd.spec.names.short_names, Some(vec!["snp".to_string()]));
        assert_eq!(crd.spec.versions.len(), 1);
        assert_eq!(crd.spec.versions[0].name, "v1alpha1");
        let columns: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.json_path.clone())
            .collect();
        assert_eq!(
            columns,
            vec![
                ".spec.interfaceName",
                ".spec.applicationNames",
                ".metadata.creationTimestamp"
            ]
        );
    }

    #[test]
    fn objects_carry_name_namespace_label_and_spec() {
        let apps: BTreeSet<String> = ["b".to_string(), "a".to_string()].into();
        let object = ServiceNameMapping::for_key(
            "org-apache-dubbo-demo-demoservice",
            &MappingKey::new("ns", "org.apache.dubbo.demo.DemoService"),
            &apps,
        );
        assert_eq!(
            object.metadata.name.as_deref(),
            Some("org-apache-dubbo-demo-demoservice")
        );
        assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));
        let label = object
            .metadata
            .labels
            .unwrap_or_default()
            .get(INTERFACE_LABEL)
            .cloned();
        assert_eq!(label.as_deref(), Some("org.apache.dubbo.demo.DemoService"));
        assert_eq!(object.spec.application_names, vec!["a", "b"]);
        let json = serde_json::to_value(&object.spec).unwrap_or_default();
        assert_eq!(json["interfaceName"], "org.apache.dubbo.demo.DemoService");
        assert_eq!(json["applicationNames"][1], "b");
    }

    #[test]
    fn the_committed_crd_yaml_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crd.yaml");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = crd_yaml().unwrap_or_default();
        assert_eq!(
            committed, generated,
            "deploy/crd.yaml is stale: regenerate it with `cargo run -- crd > deploy/crd.yaml`"
        );
    }
}
