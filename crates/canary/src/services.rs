//! The ClusterIP Services of a Canary (Flagger's `spec.service`): `<name>` (the apex),
//! `<name>-primary` and `<name>-canary`, and the EndpointSlice of the apex. No I/O.
//!
//! Flagger's apex selects the primary's pods only, because a mesh splits the apex's traffic.
//! Here the split is the provider weight of each pod of the application's Services, so the apex
//! must reach both roles: it has no selector, and the controller writes its EndpointSlice from
//! the ready pods of both Deployments. `-primary` and `-canary` select one role each and carry no
//! application label, so they are applications of their own names: never extra clusters of the
//! apex's application, and the canary's weights do not apply to them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PodTemplateSpec, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::revisions::REVISION_LABEL;
use dubbo_cp_domain::service::APPLICATION_LABEL;

/// The `endpointslice.kubernetes.io/managed-by` of the apex's slice: Kubernetes' EndpointSlice
/// controller leaves slices another manager names alone.
pub const MANAGED_BY: &str = "canary.dubbo.apache.org";
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The API server's limit of endpoints per EndpointSlice.
pub const SLICE_ENDPOINTS: usize = 1000;

/// Flagger's `spec.service`, the fields that mean something without a mesh.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryService {
    /// The apex Service's name; `targetRef.name` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 55)
    )]
    pub name: Option<String>,
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Default `http`, as Flagger's; the xDS edge reads the protocol from it (`grpc`, `tri`,
    /// `http2`, ...) unless `appProtocol` says.
    #[serde(default = "http")]
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 15)
    )]
    pub port_name: String,
    /// The pods' port, a number or a container port's name; `port` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub app_protocol: Option<String>,
}

fn http() -> String {
    "http".to_owned()
}

/// The Canary the objects belong to (this module does not read the resource itself).
#[derive(Debug, Clone, Default)]
pub struct Owner {
    pub name: String,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    /// Its controller owner reference.
    pub reference: Option<OwnerReference>,
}

impl Owner {
    /// Metadata of an object `name` it owns, labelled with its name besides `labels`.
    pub fn meta(&self, name: &str, mut labels: BTreeMap<String, String>) -> ObjectMeta {
        labels.insert(REVISION_LABEL.to_owned(), self.name.clone());
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: self.namespace.clone(),
            labels: Some(labels),
            owner_references: self.reference.clone().map(|r| vec![r]),
            ..ObjectMeta::default()
        }
    }

    /// Whether `meta` is controlled by this Canary (a controller reference with its uid).
    pub fn owns(&self, meta: &ObjectMeta) -> bool {
        self.uid.is_some()
            && meta.owner_references.iter().flatten().any(|r| {
                r.controller == Some(true)
                    && r.kind == "Canary"
                    && Some(r.uid.as_str()) == self.uid.as_deref()
            })
    }
}

/// The three Services' names: apex (`name`, else the target's), primary, canary.
pub fn names(service: &CanaryService, target: &str) -> [String; 3] {
    let apex = service.name.clone().unwrap_or_else(|| target.to_owned());
    [
        apex.clone(),
        format!("{apex}-primary"),
        format!("{apex}-canary"),
    ]
}

/// Service `name`, owned by `owner`: `selector` picks one role's pods; the apex has none (its
/// slice is written) and the label of `application`.
pub fn service(
    owner: &Owner,
    spec: &CanaryService,
    name: &str,
    selector: Option<BTreeMap<String, String>>,
    application: Option<&str>,
) -> Service {
    let mut labels = BTreeMap::new();
    if let Some(application) = application {
        labels.insert(APPLICATION_LABEL.to_owned(), application.to_owned());
    }
    Service {
        metadata: owner.meta(name, labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector,
            ports: Some(vec![ServicePort {
                name: Some(spec.port_name.clone()),
                protocol: Some("TCP".to_owned()),
                port: spec.port,
                target_port: Some(
                    spec.target_port
                        .clone()
                        .unwrap_or(IntOrString::Int(spec.port)),
                ),
                app_protocol: spec.app_protocol.clone(),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Whether `stored` already says what `wanted` does (the fields this controller sets; the API
/// server fills in the rest: clusterIP, ipFamilies, ...).
pub fn service_matches(stored: &Service, wanted: &Service) -> bool {
    let (Some(have), Some(want)) = (&stored.spec, &wanted.spec) else {
        return false;
    };
    let ports = |spec: &ServiceSpec| {
        spec.ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone(),
                    p.port,
                    p.target_port.clone(),
                    p.app_protocol.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    stored.metadata.labels == wanted.metadata.labels
        && have.selector.clone().filter(|s| !s.is_empty()) == want.selector
        && ports(have) == ports(want)
}

/// The pods' port number: `targetPort` as a number, or the container port of that name in
/// `template` (the target's; the primary runs a copy).
pub fn target_port(spec: &CanaryService, template: &PodTemplateSpec) -> Result<i32, String> {
    match &spec.target_port {
        None => Ok(spec.port),
        Some(IntOrString::Int(port)) if (1..=65535).contains(port) => Ok(*port),
        Some(IntOrString::Int(port)) => Err(format!(
            "spec.service.targetPort {port}: a port is 1-65535"
        )),
        Some(IntOrString::String(name)) => template
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| {
                format!(
                    "spec.service.targetPort {name:?}: no container port of that name in the target's pod template"
                )
            }),
    }
}

/// The apex's EndpointSlice `<apex>-dubbo-cp`: the ready pods of both roles (`ips`, sorted), of
/// the first one's address family, at most [`SLICE_ENDPOINTS`].
pub fn apex_slice(
    owner: &Owner,
    spec: &CanaryService,
    apex: &str,
    port: i32,
    pods: &[(String, Option<ObjectReference>)],
) -> EndpointSlice {
    let usable: Vec<&(String, Option<ObjectReference>)> =
        pods.iter().filter(|(ip, _)| endpoint_address(ip)).collect();
    let v6 = usable.first().is_some_and(|(ip, _)| ip.contains(':'));
    let endpoints: Vec<Endpoint> = usable
        .into_iter()
        .filter(|(ip, _)| ip.contains(':') == v6)
        .take(SLICE_ENDPOINTS)
        .map(|(ip, pod)| Endpoint {
            addresses: vec![ip.clone()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..EndpointConditions::default()
            }),
            // As Kubernetes' own slices name their pods: the xDS edge reads each pod's labels
            // through it (a canary's pods are selected by label from before they exist).
            target_ref: pod.clone(),
            ..Endpoint::default()
        })
        .collect();
    EndpointSlice {
        metadata: owner.meta(
            &slice_name(apex),
            BTreeMap::from([
                (SERVICE_NAME_LABEL.to_owned(), apex.to_owned()),
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
            ]),
        ),
        address_type: if v6 { "IPv6" } else { "IPv4" }.to_owned(),
        endpoints: Some(endpoints),
        ports: Some(vec![EndpointPort {
            name: Some(spec.port_name.clone()),
            port: Some(port),
            protocol: Some("TCP".to_owned()),
            app_protocol: spec.app_protocol.clone(),
        }]),
    }
}

/// Whether the API server takes `ip` in an EndpointSlice: not loopback, link-local, multicast
/// or unspecified (one such address would make it refuse the whole slice).
fn endpoint_address(ip: &str) -> bool {
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => {
            !(v4.is_loopback() || v4.is_link_local() || v4.is_multicast() || v4.is_unspecified())
        }
        Ok(std::net::IpAddr::V6(v6)) => {
            !(v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unspecified()
                || v6.is_unicast_link_local())
        }
        Err(_) => false,
    }
}

pub fn slice_name(apex: &str) -> String {
    format!("{apex}-dubbo-cp")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> CanaryService {
        serde_json::from_value(json!({"port": 9898, "targetPort": "grpc", "portName": "grpc"}))
            .unwrap()
    }

    fn owner() -> Owner {
        Owner {
            name: "podinfo".to_owned(),
            namespace: Some("test".to_owned()),
            uid: Some("c1".to_owned()),
            reference: Some(OwnerReference {
                api_version: "dubbo.apache.org/v1alpha1".to_owned(),
                kind: "Canary".to_owned(),
                name: "podinfo".to_owned(),
                uid: "c1".to_owned(),
                controller: Some(true),
                block_owner_deletion: None,
            }),
        }
    }

    fn template(port: &str) -> PodTemplateSpec {
        serde_json::from_value(json!({"spec": {"containers": [
            {"name": "app", "ports": [{"name": port, "containerPort": 50051}]}
        ]}}))
        .unwrap()
    }

    #[test]
    fn the_names_and_ports_follow_flaggers_defaults() {
        let spec = spec();
        assert_eq!(
            names(&spec, "podinfo"),
            ["podinfo", "podinfo-primary", "podinfo-canary"]
        );
        assert_eq!(target_port(&spec, &template("grpc")), Ok(50051));
        let missing = target_port(&spec, &template("http")).unwrap_err();
        assert!(
            missing.contains("spec.service.targetPort \"grpc\""),
            "{missing}"
        );
        let plain: CanaryService = serde_json::from_value(json!({"port": 80})).unwrap();
        assert_eq!(plain.port_name, "http");
        assert_eq!(target_port(&plain, &template("grpc")), Ok(80));
    }

    #[test]
    fn the_apex_has_no_selector_and_its_slice_holds_one_address_family() {
        let (owner, spec) = (owner(), spec());
        let apex = service(&owner, &spec, "podinfo", None, Some("podinfo"));
        assert!(owner.owns(&apex.metadata));
        let stranger = Owner {
            uid: Some("c2".to_owned()),
            ..owner.clone()
        };
        assert!(!stranger.owns(&apex.metadata));
        assert_eq!(apex.spec.as_ref().unwrap().selector, None);
        let pod = ObjectReference {
            kind: Some("Pod".to_owned()),
            name: Some("podinfo-1".to_owned()),
            ..ObjectReference::default()
        };
        let ips = [
            ("10.0.0.1".to_owned(), Some(pod.clone())),
            ("10.1.0.1".to_owned(), None),
            ("127.0.0.1".to_owned(), None),
            ("fd00::1".to_owned(), None),
        ];
        let slice = apex_slice(&owner, &spec, "podinfo", 50051, &ips);
        assert_eq!(slice.endpoints.as_ref().unwrap()[0].target_ref, Some(pod));
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(slice.endpoints.as_ref().unwrap().len(), 2);
        assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(50051));
        let mut stored = apex.clone();
        stored.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.9".to_owned());
        stored.spec.as_mut().unwrap().selector = Some(BTreeMap::new());
        assert!(service_matches(&stored, &apex));
        stored.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 80;
        assert!(!service_matches(&stored, &apex));
    }
}
