//! Services and their endpoints, as every protocol edge that routes traffic sees them (xDS first).
//! Registries fill the index's `Service` kind with them (Kubernetes Services and EndpointSlices,
//! ZooKeeper's providers) and ServiceEntry rules declare more; edges only read.
//!
//! A service belongs to a Dubbo application: the one its label `dubbo.apache.org/application`
//! names, else the application of its own name. That is how rules keyed by application (TagRoute,
//! DynamicConfig, Canary) find a service's endpoints.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// The label that names a service's Dubbo application.
pub const APPLICATION_LABEL: &str = "dubbo.apache.org/application";

/// An endpoint's weight when its source gives none: Dubbo's default provider weight.
pub const DEFAULT_WEIGHT: u32 = 100;

/// Kubernetes' cluster domain, the suffix of a service's fully qualified name.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// One service: a name in a namespace, its ports and its ready endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    /// A Kubernetes service name (a DNS label), which clients ask for in the namespace's forms;
    /// or a DNS name of its own (a ServiceEntry host such as `api.payments.internal`), which has
    /// dots where a service name never does, and which clients ask for verbatim.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ports: Vec<ServicePort>,
    pub endpoints: Vec<ServiceEndpoint>,
}

/// A port the service offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub number: u16,
    /// Endpoints name the port they serve it on (`ServiceEndpoint::ports`).
    pub name: String,
    /// `GRPC`, `HTTP2`, `TRIPLE`, ... as given; edges decide what they can carry.
    pub protocol: String,
}

/// One ready endpoint of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEndpoint {
    pub address: IpAddr,
    /// The endpoint's own port per service port name; a port not named here is served on the
    /// service port's number.
    pub ports: BTreeMap<String, u16>,
    pub labels: BTreeMap<String, String>,
    /// Share of the service's traffic relative to its other endpoints, on Dubbo's scale (a
    /// provider's default is 100, which DynamicConfig `weight` overrides); 0 takes none.
    pub weight: u32,
    /// `region/zone/subzone`, any part may be empty.
    pub locality: String,
}

impl Service {
    /// The Dubbo application the service belongs to.
    pub fn application(&self) -> &str {
        self.labels
            .get(APPLICATION_LABEL)
            .map_or(self.name.as_str(), String::as_str)
    }

    /// Whether the service is named by a DNS name of its own rather than in its namespace.
    pub fn is_dns_host(&self) -> bool {
        self.name.contains('.')
    }

    /// `name.namespace.svc.cluster.local`, or the DNS name of a service named by one.
    pub fn fqdn(&self) -> String {
        if self.is_dns_host() {
            return self.name.clone();
        }
        format!("{}.{}.svc.{CLUSTER_DOMAIN}", self.name, self.namespace)
    }

    /// The port a client means: the one numbered `port`, or the only one when none is given
    /// (several ports and none given is ambiguous).
    pub fn port(&self, port: Option<u16>) -> Option<&ServicePort> {
        match port {
            Some(number) => self.ports.iter().find(|p| p.number == number),
            None if self.ports.len() == 1 => self.ports.first(),
            None => None,
        }
    }
}

impl ServiceEndpoint {
    /// Where the endpoint serves `port`.
    pub fn port_for(&self, port: &ServicePort) -> u16 {
        self.ports.get(&port.name).copied().unwrap_or(port.number)
    }
}

/// A name a client asked for, Kubernetes style: `svc`, `svc.ns`, `svc.ns.svc` or
/// `svc.ns.svc.cluster.local`, each with or without `:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostName {
    pub name: String,
    /// `None` when the name does not say; the client's own namespace applies.
    pub namespace: Option<String>,
    pub port: Option<u16>,
}

/// `(host, port)` of a requested `host[:port]`; `None` for a port that is not the canonical
/// digits of a u16 (`+7070` or `07070` would be further names of one port, each a resource of
/// its own) or an empty host.
pub fn split_port(requested: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = match requested.rsplit_once(':') {
        Some((host, port)) => {
            let number = port.parse::<u16>().ok()?;
            (number.to_string() == port).then_some((host, Some(number)))?
        }
        None => (requested, None),
    };
    (!host.is_empty()).then_some((host, port))
}

impl HostName {
    /// Parses `requested`; `None` for what is no such name (empty parts, a bad port, a domain
    /// other than the cluster's).
    pub fn parse(requested: &str) -> Option<HostName> {
        let (host, port) = split_port(requested)?;
        let parts: Vec<&str> = host.split('.').collect();
        if parts.iter().any(|part| part.is_empty()) {
            return None;
        }
        let cluster_domain: Vec<&str> = CLUSTER_DOMAIN.split('.').collect();
        let namespace = match parts.as_slice() {
            [_] => None,
            [_, ns] | [_, ns, "svc"] => Some(*ns),
            [_, ns, "svc", domain @ ..] if domain == cluster_domain.as_slice() => Some(*ns),
            _ => return None,
        };
        Some(HostName {
            name: parts[0].to_owned(),
            namespace: namespace.map(str::to_owned),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(labels: &[(&str, &str)], ports: &[u16]) -> Service {
        Service {
            namespace: "shop".into(),
            name: "greeter".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ports: ports
                .iter()
                .map(|n| ServicePort {
                    number: *n,
                    name: format!("grpc-{n}"),
                    protocol: "GRPC".into(),
                })
                .collect(),
            endpoints: Vec::new(),
        }
    }

    #[test]
    fn the_application_is_the_label_else_the_name() {
        assert_eq!(service(&[], &[]).application(), "greeter");
        let labelled = service(&[(APPLICATION_LABEL, "greeter-app")], &[]);
        assert_eq!(labelled.application(), "greeter-app");
        assert_eq!(labelled.fqdn(), "greeter.shop.svc.cluster.local");
        assert!(!labelled.is_dns_host());
        let mut external = service(&[], &[]);
        external.name = "api.payments.internal".into();
        assert!(external.is_dns_host());
        assert_eq!(external.fqdn(), "api.payments.internal");
    }

    #[test]
    fn a_port_is_the_one_asked_for_or_the_only_one() {
        let one = service(&[], &[7070]);
        assert_eq!(one.port(None).map(|p| p.number), Some(7070));
        assert_eq!(one.port(Some(7070)).map(|p| p.number), Some(7070));
        assert_eq!(one.port(Some(8080)), None);
        let two = service(&[], &[7070, 8080]);
        assert_eq!(two.port(None), None, "ambiguous");
        assert_eq!(two.port(Some(8080)).map(|p| p.number), Some(8080));
        let endpoint = ServiceEndpoint {
            address: "10.0.0.1".parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
            ports: BTreeMap::from([("grpc-8080".to_string(), 18080)]),
            labels: BTreeMap::new(),
            weight: 1,
            locality: String::new(),
        };
        assert_eq!(endpoint.port_for(&two.ports[1]), 18080);
        assert_eq!(endpoint.port_for(&two.ports[0]), 7070);
    }

    #[test]
    fn host_names_in_every_kubernetes_form() {
        let name = |n: &str, ns: Option<&str>, port: Option<u16>| HostName {
            name: n.into(),
            namespace: ns.map(str::to_owned),
            port,
        };
        assert_eq!(
            HostName::parse("greeter"),
            Some(name("greeter", None, None))
        );
        assert_eq!(
            HostName::parse("greeter:7070"),
            Some(name("greeter", None, Some(7070)))
        );
        for other_spelling in ["greeter:+7070", "greeter:07070", "greeter:"] {
            assert_eq!(HostName::parse(other_spelling), None, "{other_spelling}");
        }
        for full in [
            "greeter.shop",
            "greeter.shop.svc",
            "greeter.shop.svc.cluster.local",
        ] {
            assert_eq!(
                HostName::parse(full),
                Some(name("greeter", Some("shop"), None)),
                "{full}"
            );
            assert_eq!(
                HostName::parse(&format!("{full}:7070")),
                Some(name("greeter", Some("shop"), Some(7070))),
                "{full}:7070"
            );
        }
        for bad in [
            "",
            ":7070",
            "greeter:",
            "greeter:70000",
            "greeter..shop",
            "greeter.shop.svc.example.com",
            "greeter.shop.other",
        ] {
            assert_eq!(HostName::parse(bad), None, "{bad:?}");
        }
    }
}
