//! ServiceEntry: services and their endpoints declared as a rule, for standalone mode and for
//! workloads outside the cluster. The fields follow Istio's `ServiceEntry`
//! (`networking.istio.io/v1`) where they mean the same: `hosts`, `ports[]{number, name,
//! protocol}`, `endpoints[]{address, ports, labels, weight, locality}`, `resolution`, `location`.
//! What differs, and why, is in docs/xds.md:
//! - a host is a service name in the entry's namespace (`greeter`, or its
//!   `greeter.<namespace>.svc.cluster.local` form, which clients ask for in every Kubernetes
//!   form), or any other DNS name (`api.payments.internal`), served verbatim as Istio does;
//!   wildcard hosts are refused, as no gRPC client can ask for one;
//! - only `resolution: STATIC` (the default here) is served: the control plane hands out
//!   addresses, it does not resolve DNS for clients.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{Checked, FieldError, at_least_one, field, is_dns_label, item, word};
use super::limits;
use crate::service::{CLUSTER_DOMAIN, Service, ServiceEndpoint, ServicePort};

/// An endpoint's weight when it gives none (Dubbo's default provider weight). Istio reads an
/// absent or zero weight as "the default" too.
pub const DEFAULT_ENDPOINT_WEIGHT: u32 = crate::service::DEFAULT_WEIGHT;

/// The largest endpoint weight (Envoy's locality weights are u32 and must not overflow when
/// summed over one service's endpoints).
pub const MAX_ENDPOINT_WEIGHT: u32 = 1_000_000;

/// The resolutions Istio defines; only `STATIC` is served.
pub const RESOLUTIONS: [&str; 1] = ["STATIC"];
/// Istio's `location` values (informational for proxyless clients).
pub const LOCATIONS: [&str; 2] = ["MESH_INTERNAL", "MESH_EXTERNAL"];

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceEntrySpec {
    /// Service names in the entry's namespace (`greeter` or `greeter.<ns>.svc.cluster.local`),
    /// or DNS names served verbatim (`api.payments.internal`).
    #[schemars(length(min = 1, max = limits::MATCHERS), inner(length(max = limits::NAME)))]
    pub hosts: Vec<String>,
    #[schemars(length(min = 1, max = limits::MATCHERS))]
    pub ports: Vec<EntryPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::INSTANCES))]
    pub endpoints: Vec<EntryEndpoint>,
    /// `STATIC`: the endpoints are the addresses (the only resolution served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["STATIC"]), length(max = limits::ENUM))]
    pub resolution: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["MESH_INTERNAL", "MESH_EXTERNAL"]), length(max = limits::ENUM))]
    pub location: Option<String>,
}

/// A port the hosts offer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntryPort {
    #[schemars(range(min = 1, max = 65535))]
    pub number: u32,
    /// Endpoints name the port they serve it on.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// `GRPC`, `HTTP2`, `TRIPLE`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::ENUM))]
    pub protocol: Option<String>,
}

/// One endpoint of the hosts.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntryEndpoint {
    /// An IP address.
    #[schemars(length(min = 1, max = 45))]
    pub address: String,
    /// Port name -> the number this endpoint serves it on (else the port's own number).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = limits::MATCHERS,
        "additionalProperties" = {"type": "integer", "format": "uint32", "minimum": 1, "maximum": 65535},
    ))]
    pub ports: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = limits::PARAMETERS,
        "additionalProperties" = {"type": "string", "maxLength": limits::NAME},
    ))]
    pub labels: BTreeMap<String, String>,
    /// Share of traffic relative to the other endpoints; absent or 0 means the default (100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_ENDPOINT_WEIGHT))]
    pub weight: Option<u32>,
    /// `region/zone/subzone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::NAME))]
    pub locality: Option<String>,
}

impl ServiceEntrySpec {
    /// Checks what the schema cannot say; needs the entry's namespace to check host names.
    pub(crate) fn check(&self, path: &str) -> Checked {
        at_least_one(&field(path, "hosts"), &self.hosts, "host")?;
        let mut services = BTreeSet::new();
        for (i, host) in self.hosts.iter().enumerate() {
            let host_path = item(path, "hosts", i);
            let named = entry_host(host).map_err(|why| FieldError::value(&host_path, why, host))?;
            if !services.insert(named.name()) {
                return Err(FieldError::value(
                    host_path,
                    "names a service an earlier host names already",
                    host,
                ));
            }
        }
        at_least_one(&field(path, "ports"), &self.ports, "port")?;
        let mut names = BTreeSet::new();
        let mut numbers = BTreeSet::new();
        for (i, port) in self.ports.iter().enumerate() {
            let port_path = item(path, "ports", i);
            if !is_dns_label(&port.name) {
                return Err(FieldError::value(
                    field(&port_path, "name"),
                    "must be a DNS label (lower-case letters, digits and '-', at most 63)",
                    &port.name,
                ));
            }
            if !names.insert(port.name.as_str()) {
                return Err(FieldError::value(
                    field(&port_path, "name"),
                    "is already the name of an earlier port",
                    &port.name,
                ));
            }
            port_number(&field(&port_path, "number"), port.number)?;
            if !numbers.insert(port.number) {
                return Err(FieldError::value(
                    field(&port_path, "number"),
                    "is already the number of an earlier port",
                    &port.number.to_string(),
                ));
            }
            if let Some(protocol) = &port.protocol {
                word(&field(&port_path, "protocol"), protocol)?;
            }
        }
        if let Some(resolution) = &self.resolution
            && !RESOLUTIONS.contains(&resolution.as_str())
        {
            return Err(FieldError::value(
                field(path, "resolution"),
                "must be STATIC: the control plane serves the endpoints' addresses and resolves no DNS",
                resolution,
            ));
        }
        if let Some(location) = &self.location {
            super::common::one_of(&field(path, "location"), location, &LOCATIONS)?;
        }
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            endpoint.check(&item(path, "endpoints", i), &names)?;
        }
        Ok(())
    }

    /// The services this entry declares in `namespace`, one per host, each with every endpoint.
    pub fn services(&self, namespace: &str) -> Vec<Service> {
        let ports: Vec<ServicePort> = self
            .ports
            .iter()
            .filter_map(|port| {
                Some(ServicePort {
                    number: u16::try_from(port.number).ok()?,
                    name: port.name.clone(),
                    protocol: port.protocol.clone().unwrap_or_else(|| "GRPC".to_owned()),
                })
            })
            .collect();
        let endpoints: Vec<ServiceEndpoint> = self
            .endpoints
            .iter()
            .filter_map(|endpoint| {
                Some(ServiceEndpoint {
                    address: endpoint.address.parse().ok()?,
                    ports: endpoint
                        .ports
                        .iter()
                        .filter_map(|(name, n)| Some((name.clone(), u16::try_from(*n).ok()?)))
                        .collect(),
                    labels: endpoint.labels.clone(),
                    weight: match endpoint.weight {
                        None | Some(0) => DEFAULT_ENDPOINT_WEIGHT,
                        Some(weight) => weight.min(MAX_ENDPOINT_WEIGHT),
                    },
                    locality: endpoint.locality.clone().unwrap_or_default(),
                })
            })
            .collect();
        self.hosts
            .iter()
            .filter_map(|host| entry_host(host).ok())
            .filter(|named| named.namespace().is_none_or(|ns| ns == namespace))
            .map(|named| Service {
                namespace: namespace.to_owned(),
                name: named.name().to_owned(),
                labels: BTreeMap::new(),
                ports: ports.clone(),
                endpoints: endpoints.clone(),
            })
            .collect()
    }

    /// Hosts naming another namespace than `namespace` (an entry declares services only in its
    /// own namespace, as a Service does).
    pub(crate) fn check_namespace(&self, path: &str, namespace: &str) -> Checked {
        for (i, host) in self.hosts.iter().enumerate() {
            if let Ok(named) = entry_host(host)
                && let Some(other) = named.namespace()
                && other != namespace
            {
                return Err(FieldError::value(
                    item(path, "hosts", i),
                    format!(
                        "names namespace {other:?}, but the entry is in namespace {namespace:?}: \
                         an entry declares services in its own namespace"
                    ),
                    host,
                ));
            }
        }
        Ok(())
    }
}

impl EntryEndpoint {
    fn check(&self, path: &str, port_names: &BTreeSet<&str>) -> Checked {
        let address_path = field(path, "address");
        if self.address.parse::<IpAddr>().is_err() {
            return Err(FieldError::value(
                address_path,
                "must be an IP address (resolution STATIC serves addresses, not DNS names)",
                &self.address,
            ));
        }
        for (name, number) in &self.ports {
            let port_path = format!("{path}.ports.{name}");
            if !port_names.contains(name.as_str()) {
                let known: Vec<&str> = port_names.iter().copied().collect();
                return Err(FieldError::value(
                    port_path,
                    format!("names no port of the entry (ports: {})", known.join(", ")),
                    name,
                ));
            }
            port_number(&port_path, *number)?;
        }
        if let Some(weight) = self.weight
            && weight > MAX_ENDPOINT_WEIGHT
        {
            return Err(FieldError::value(
                field(path, "weight"),
                format!("must be at most {MAX_ENDPOINT_WEIGHT}"),
                &weight.to_string(),
            ));
        }
        if let Some(locality) = &self.locality
            && locality.split('/').count() > 3
        {
            return Err(FieldError::value(
                field(path, "locality"),
                "must be region/zone/subzone (at most three parts)",
                locality,
            ));
        }
        Ok(())
    }
}

fn port_number(path: &str, number: u32) -> Checked {
    if !(1..=65535).contains(&number) {
        return Err(FieldError::value(
            path,
            "must be a port number from 1 to 65535",
            &number.to_string(),
        ));
    }
    Ok(())
}

/// What a ServiceEntry host names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryHost<'a> {
    /// A service name in a namespace: the entry's (`greeter`), or the one its cluster form says
    /// (`greeter.<namespace>.svc.cluster.local`).
    Service {
        name: &'a str,
        namespace: Option<&'a str>,
    },
    /// Any other DNS name, served verbatim.
    Dns(&'a str),
}

impl<'a> EntryHost<'a> {
    /// The service's name: its Kubernetes name, or the DNS name itself.
    fn name(self) -> &'a str {
        match self {
            EntryHost::Service { name, .. } | EntryHost::Dns(name) => name,
        }
    }

    fn namespace(self) -> Option<&'a str> {
        match self {
            EntryHost::Service { namespace, .. } => namespace,
            EntryHost::Dns(_) => None,
        }
    }
}

/// What `host` names, or why it names nothing a client can ask for.
fn entry_host(host: &str) -> Result<EntryHost<'_>, &'static str> {
    if host.contains('*') {
        return Err(
            "is a wildcard host: a gRPC client asks for one name and resolves no \
                    wildcard, so no client could ask for it; list each host",
        );
    }
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err("must be lower-case (clients ask for names exactly as written)");
    }
    let labels: Vec<&str> = host.split('.').collect();
    if !labels.iter().all(|label| is_dns_label(label)) || host.len() > limits::NAME {
        return Err(
            "must be a DNS name: labels of lower-case letters, digits and '-' (at most \
                    63 each, starting and ending with a letter or digit) separated by dots, at \
                    most 253 characters",
        );
    }
    let cluster_domain = format!(".svc.{CLUSTER_DOMAIN}");
    match labels.as_slice() {
        [name] => Ok(EntryHost::Service {
            name,
            namespace: None,
        }),
        [name, namespace, "svc", ..] if host.ends_with(&cluster_domain) => {
            if labels.len() != 3 + CLUSTER_DOMAIN.split('.').count() {
                return Err("names no service: a cluster name is \
                            <service>.<namespace>.svc.cluster.local");
            }
            Ok(EntryHost::Service {
                name,
                namespace: Some(namespace),
            })
        }
        _ if host.ends_with(&cluster_domain) => Err("names no service: a cluster name is \
                                                     <service>.<namespace>.svc.cluster.local"),
        _ => Ok(EntryHost::Dns(host)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Result<ServiceEntrySpec, FieldError> {
        let spec: ServiceEntrySpec =
            serde_json::from_value(json).map_err(|e| FieldError::new("spec", e.to_string()))?;
        spec.check("spec")?;
        spec.check_namespace("spec", "shop")?;
        Ok(spec)
    }

    fn entry() -> serde_json::Value {
        serde_json::json!({
            "hosts": ["greeter"],
            "ports": [{"number": 50051, "name": "grpc", "protocol": "GRPC"}],
            "endpoints": [
                {"address": "127.0.0.1", "ports": {"grpc": 50061}, "weight": 80, "locality": "r/z"},
                {"address": "::1", "labels": {"version": "v2"}},
            ],
        })
    }

    #[test]
    fn an_entry_becomes_one_service_per_host() {
        let mut json = entry();
        json["hosts"] = serde_json::json!(["greeter", "hello.shop.svc.cluster.local"]);
        let services = spec(json)
            .unwrap_or_else(|e| panic!("{e}"))
            .services("shop");
        assert_eq!(services.len(), 2);
        assert_eq!(services[1].name, "hello");
        let greeter = &services[0];
        assert_eq!(
            (greeter.namespace.as_str(), greeter.name.as_str()),
            ("shop", "greeter")
        );
        assert_eq!(greeter.ports[0].number, 50051);
        assert_eq!(greeter.endpoints[0].port_for(&greeter.ports[0]), 50061);
        assert_eq!(greeter.endpoints[1].port_for(&greeter.ports[0]), 50051);
        // Istio's absent weight is the default; Dubbo's default is 100.
        let weights: Vec<u32> = greeter.endpoints.iter().map(|e| e.weight).collect();
        assert_eq!(weights, [80, DEFAULT_ENDPOINT_WEIGHT]);
        assert_eq!(greeter.endpoints[0].locality, "r/z");
        assert_eq!(greeter.endpoints[1].labels["version"], "v2");
        assert_eq!(greeter.application(), "greeter");
    }

    #[test]
    fn any_other_dns_name_is_a_service_of_its_own_served_verbatim() {
        let mut json = entry();
        json["hosts"] = serde_json::json!(["api.payments.internal", "greeter", "example.com"]);
        let services = spec(json)
            .unwrap_or_else(|e| panic!("{e}"))
            .services("shop");
        let names: Vec<(&str, String, bool)> = services
            .iter()
            .map(|s| (s.name.as_str(), s.fqdn(), s.is_dns_host()))
            .collect();
        assert_eq!(
            names,
            [
                (
                    "api.payments.internal",
                    "api.payments.internal".to_owned(),
                    true
                ),
                (
                    "greeter",
                    "greeter.shop.svc.cluster.local".to_owned(),
                    false
                ),
                ("example.com", "example.com".to_owned(), true),
            ]
        );
        // Every host has the entry's ports and endpoints, in the entry's namespace.
        assert!(
            services
                .iter()
                .all(|s| s.namespace == "shop" && s.endpoints.len() == 2 && s.ports.len() == 1)
        );
    }

    #[test]
    fn refusals_name_the_field_and_the_value() {
        let refused = |change: &dyn Fn(&mut serde_json::Value)| {
            let mut json = entry();
            change(&mut json);
            match spec(json) {
                Ok(_) => panic!("accepted"),
                Err(e) => e.to_string(),
            }
        };
        assert!(
            refused(&|j| j["hosts"][0] = "*.example.com".into())
                .starts_with("spec.hosts[0]: is a wildcard host")
        );
        assert!(
            refused(&|j| j["hosts"][0] = "API.example.com".into())
                .starts_with("spec.hosts[0]: must be lower-case")
        );
        for bad in ["api..example.com", "api.example.com.", "-api.example.com"] {
            assert!(
                refused(&|j| j["hosts"][0] = bad.into())
                    .starts_with("spec.hosts[0]: must be a DNS name"),
                "{bad}"
            );
        }
        for not_a_service in [
            "greeter.svc.cluster.local",
            "a.greeter.shop.svc.cluster.local",
        ] {
            assert!(
                refused(&|j| j["hosts"][0] = not_a_service.into())
                    .starts_with("spec.hosts[0]: names no service"),
                "{not_a_service}"
            );
        }
        assert!(
            refused(&|j| j["hosts"] = serde_json::json!(["api.example.com", "api.example.com"]))
                .starts_with("spec.hosts[1]: names a service an earlier host names already")
        );
        assert!(
            refused(&|j| j["hosts"][0] = "greeter.other.svc.cluster.local".into())
                .contains("names namespace \"other\"")
        );
        assert_eq!(
            refused(&|j| j["endpoints"][0]["address"] = "greeter.local".into()),
            "spec.endpoints[0].address: must be an IP address (resolution STATIC serves \
             addresses, not DNS names) (got \"greeter.local\")"
        );
        assert_eq!(
            refused(&|j| j["endpoints"][0]["ports"] = serde_json::json!({"http": 80})),
            "spec.endpoints[0].ports.http: names no port of the entry (ports: grpc) (got \"http\")"
        );
        assert!(
            refused(&|j| j["resolution"] = "DNS".into())
                .starts_with("spec.resolution: must be STATIC")
        );
        assert!(refused(&|j| j["ports"][0]["number"] = 0.into()).contains("1 to 65535"));
        assert!(refused(&|j| j["ports"] = serde_json::json!([])).contains("at least one port"));
        assert!(
            refused(&|j| j["endpoints"][0]["weight"] = (MAX_ENDPOINT_WEIGHT + 1).into())
                .contains("at most 1000000")
        );
        assert!(refused(&|j| j["ports"][0]["name"] = "GRPC".into()).contains("DNS label"));
        assert!(
            refused(
                &|j| j["hosts"] = serde_json::json!(["greeter", "greeter.shop.svc.cluster.local"])
            )
            .starts_with("spec.hosts[1]: names a service an earlier host names already")
        );
    }
}
