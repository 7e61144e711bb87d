//! Providers registered in ZooKeeper as the domain's services.
//!
//! - Interface level (Dubbo 2 and 3, dubbo-python, dubbo-js): one ephemeral node per provider,
//!   `/<root>/<interface>/providers/<URL-encoded URL>`, the URL being
//!   `tri://10.0.0.1:50051/org.Greeter?application=shop&version=1.0&dubbo.tag=gray&weight=100...`.
//! - Application level (Dubbo 3's default): `/services/<app>/<instance id>`, a Curator
//!   `ServiceInstance` JSON with the address, port and Dubbo's metadata (`dubbo.endpoints` lists
//!   each protocol's port).
//!
//! Each provider becomes an endpoint of the service named after its application (label
//! `dubbo.apache.org/application`), its URL parameters its labels, so tag, condition and weight
//! rules keyed by application apply as they do to ServiceEntry endpoints. Only `tri` and `grpc`
//! endpoints are offered to gRPC clients; others are kept for operators to see.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::service::{APPLICATION_LABEL, DEFAULT_WEIGHT, Service, ServiceEndpoint, ServicePort};

/// Protocols gRPC clients can call.
pub const GRPC_PROTOCOLS: [&str; 2] = ["tri", "grpc"];
/// Largest provider URL or instance body read.
pub const MAX_PROVIDER_BYTES: usize = 64 * 1024;
/// Parameters kept as labels, at most (a URL carries dozens; beyond this they are dropped).
const MAX_LABELS: usize = 64;

/// One provider as a registry node describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    pub namespace: String,
    pub application: String,
    /// The interface, for an interface-level registration.
    pub interface: Option<String>,
    pub protocol: String,
    pub address: IpAddr,
    pub port: u16,
    pub weight: u32,
    pub labels: BTreeMap<String, String>,
}

impl Provider {
    /// Whether gRPC clients are offered this endpoint.
    pub fn served(&self) -> bool {
        GRPC_PROTOCOLS.contains(&self.protocol.as_str())
    }
}

/// Percent-decodes a node name as Java's `URLDecoder` does (`+` is a space).
fn url_decode(text: &str) -> Result<String, String> {
    let plus = text.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "is not UTF-8 once decoded".to_owned())
}

/// A provider from its interface-level node name.
pub fn parse_url(namespace: &str, interface: &str, node: &str) -> Result<Provider, String> {
    if node.len() > MAX_PROVIDER_BYTES {
        return Err(format!("is over {MAX_PROVIDER_BYTES} bytes"));
    }
    let url = url_decode(node)?;
    let shown = crate::stats::short(&url);
    let (protocol, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{shown:?} is not a URL (protocol://host:port/path?params)"))?;
    let (authority, query) = match rest.split_once('?') {
        Some((before, query)) => (before, query),
        None => (rest, ""),
    };
    let authority = authority.split('/').next().unwrap_or_default();
    // user:password@ is not an endpoint's business.
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = authority
        .rsplit_once(':')
        .ok_or_else(|| format!("{shown:?} has no port"))?;
    let address: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("{shown:?}: host {host:?} is not an IP address"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{shown:?}: port {port:?} is not a port"))?;
    let params: BTreeMap<String, String> = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    let application = params
        .get("application")
        .cloned()
        .unwrap_or_else(|| interface.to_owned());
    provider(
        namespace,
        application,
        Some(interface),
        protocol,
        address,
        port,
        params,
    )
}

fn provider(
    namespace: &str,
    application: String,
    interface: Option<&str>,
    protocol: &str,
    address: IpAddr,
    port: u16,
    params: BTreeMap<String, String>,
) -> Result<Provider, String> {
    if port == 0 {
        return Err("port 0 is not a port".to_owned());
    }
    // What registrations may not carry, a provider may not either: the name becomes a mapping's
    // application and a service's label.
    if application.is_empty()
        || application.len() > crate::mapping::MAX_APPLICATION_BYTES
        || application
            .chars()
            .any(|c| c == ',' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "application {:?} is not an application name (1-253 bytes, no ',', whitespace or \
             control characters)",
            crate::stats::short(&application)
        ));
    }
    let weight = match params.get("weight") {
        Some(weight) => weight
            .parse::<u32>()
            .map_err(|_| format!("weight {weight:?} is not a whole number"))?,
        None => DEFAULT_WEIGHT,
    };
    let mut labels: BTreeMap<String, String> = params.into_iter().take(MAX_LABELS).collect();
    labels.insert("protocol".to_owned(), protocol.to_owned());
    Ok(Provider {
        namespace: namespace.to_owned(),
        application,
        interface: interface.map(str::to_owned),
        protocol: protocol.to_owned(),
        address,
        port,
        weight,
        labels,
    })
}

/// The providers an application-level instance node describes: one per protocol it lists in
/// `dubbo.endpoints`, else one on its port (Dubbo's default protocol).
pub fn parse_instance(application: &str, data: &[u8]) -> Result<Vec<Provider>, String> {
    if data.len() > MAX_PROVIDER_BYTES {
        return Err(format!("is over {MAX_PROVIDER_BYTES} bytes"));
    }
    let instance: serde_json::Value =
        serde_json::from_slice(data).map_err(|err| format!("is not a JSON instance: {err}"))?;
    let address: IpAddr = instance
        .get("address")
        .and_then(|a| a.as_str())
        .ok_or("has no address")?
        .parse()
        .map_err(|_| "address is not an IP address".to_owned())?;
    let port = instance
        .get("port")
        .and_then(serde_json::Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or("has no port")?;
    let metadata: BTreeMap<String, String> = instance
        .pointer("/payload/metadata")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let endpoints: Vec<(String, u16)> = metadata
        .get("dubbo.endpoints")
        .and_then(|text| serde_json::from_str::<Vec<serde_json::Value>>(text).ok())
        .map(|list| {
            list.iter()
                .filter_map(|e| {
                    let protocol = e.get("protocol")?.as_str()?.to_owned();
                    let port = u16::try_from(e.get("port")?.as_u64()?).ok()?;
                    Some((protocol, port))
                })
                .collect()
        })
        .unwrap_or_default();
    let endpoints = if endpoints.is_empty() {
        vec![("dubbo".to_owned(), port)]
    } else {
        endpoints
    };
    endpoints
        .into_iter()
        .map(|(protocol, port)| {
            provider(
                crate::layout::DEFAULT_NAMESPACE,
                application.to_owned(),
                None,
                &protocol,
                address,
                port,
                metadata.clone(),
            )
        })
        .collect()
}

/// The services the providers form: one per (namespace, application), named after it, with a
/// port per protocol (numbered by the lowest port a provider serves it on) and each endpoint on
/// its own port, as a Kubernetes Service's target ports are.
pub fn services<'a>(providers: impl IntoIterator<Item = &'a Provider>) -> Vec<Service> {
    let mut by_app: BTreeMap<(String, String), Vec<&Provider>> = BTreeMap::new();
    for provider in providers.into_iter().filter(|p| p.served()) {
        by_app
            .entry((provider.namespace.clone(), provider.application.clone()))
            .or_default()
            .push(provider);
    }
    by_app
        .into_iter()
        .map(|((namespace, application), providers)| {
            let mut ports: BTreeMap<&str, u16> = BTreeMap::new();
            for provider in &providers {
                let number = ports
                    .entry(provider.protocol.as_str())
                    .or_insert(provider.port);
                *number = (*number).min(provider.port);
            }
            let ports: Vec<ServicePort> = ports
                .into_iter()
                .map(|(protocol, number)| ServicePort {
                    number,
                    name: protocol.to_owned(),
                    protocol: if protocol == "tri" { "TRIPLE" } else { "GRPC" }.to_owned(),
                })
                .collect();
            let mut endpoints: BTreeMap<(IpAddr, u16), ServiceEndpoint> = BTreeMap::new();
            for provider in providers {
                endpoints
                    .entry((provider.address, provider.port))
                    .or_insert_with(|| ServiceEndpoint {
                        address: provider.address,
                        ports: BTreeMap::new(),
                        labels: provider.labels.clone(),
                        weight: provider.weight,
                        locality: String::new(),
                    })
                    .ports
                    .insert(provider.protocol.clone(), provider.port);
            }
            Service {
                namespace,
                name: crate::mapping::object_name(&application),
                labels: BTreeMap::from([(APPLICATION_LABEL.to_owned(), application)]),
                ports,
                endpoints: endpoints.into_values().collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "tri%3A%2F%2F10.0.0.1%3A50051%2Forg.Greeter%3Fapplication%3Dshop%26dubbo.tag%3Dgray%26version%3D1.0%26weight%3D50";

    #[test]
    fn interface_level_urls_parse() {
        let provider = parse_url("default", "org.Greeter", URL).unwrap();
        assert_eq!(provider.application, "shop");
        assert_eq!(provider.protocol, "tri");
        assert_eq!(provider.address.to_string(), "10.0.0.1");
        assert_eq!(provider.port, 50051);
        assert_eq!(provider.weight, 50);
        assert_eq!(provider.labels["dubbo.tag"], "gray");
        assert_eq!(provider.labels["version"], "1.0");
        assert!(provider.served());
        for bad in [
            "",
            "not-a-url",
            "tri%3A%2F%2Fhost",
            "tri://name.svc:50051/x",
            "tri://10.0.0.1:0/x",
            "tri://10.0.0.1:99999/x",
            "tri://10.0.0.1:1/x?weight=-1",
        ] {
            assert!(parse_url("default", "I", bad).is_err(), "{bad}");
        }
        let dubbo = parse_url("default", "I", "dubbo://10.0.0.2:20880/I").unwrap();
        assert_eq!(dubbo.application, "I");
        assert!(!dubbo.served());
    }

    #[test]
    fn instances_list_their_protocols() {
        let body = br#"{"name":"shop","id":"10.0.0.3:20880","address":"10.0.0.3","port":20880,
            "payload":{"metadata":{"dubbo.endpoints":"[{\"port\":50052,\"protocol\":\"tri\"},{\"port\":20880,\"protocol\":\"dubbo\"}]",
            "dubbo.metadata.revision":"abc"}}}"#;
        let providers = parse_instance("shop", body).unwrap();
        assert_eq!(providers.len(), 2);
        assert_eq!(
            (providers[0].protocol.as_str(), providers[0].port),
            ("tri", 50052)
        );
        assert!(parse_instance("shop", b"garbage").is_err());
        assert!(parse_instance("shop", br#"{"address":"x","port":1}"#).is_err());
    }

    #[test]
    fn services_group_providers_by_application() {
        let a = parse_url("default", "org.Greeter", URL).unwrap();
        let b = parse_url(
            "default",
            "org.Greeter",
            "tri://10.0.0.2:50052/org.Greeter?application=shop",
        )
        .unwrap();
        let other = parse_url("default", "I", "dubbo://10.0.0.9:20880/I?application=shop").unwrap();
        let services = services([&a, &b, &other]);
        assert_eq!(services.len(), 1);
        let shop = &services[0];
        assert_eq!(shop.name, "shop");
        assert_eq!(shop.application(), "shop");
        assert_eq!(shop.ports.len(), 1);
        assert_eq!(shop.endpoints.len(), 2, "the dubbo endpoint is not offered");
        assert_eq!(shop.endpoints[0].weight, 50);
        assert_eq!(shop.endpoints[1].weight, DEFAULT_WEIGHT);
        // One port for the protocol; each endpoint on its own.
        assert_eq!(
            (shop.ports[0].name.as_str(), shop.ports[0].number),
            ("tri", 50051)
        );
        assert_eq!(shop.endpoints[1].ports["tri"], 50052);
        // dubbo-python registers `tri://ip:port?service=I`: no path, no application.
        let python = parse_url(
            "default",
            "dubbo.test.Echo",
            "tri%3A%2F%2F127.0.0.1%3A57625%3Fservice%3Ddubbo.test.Echo",
        )
        .unwrap();
        assert_eq!(
            (python.application.as_str(), python.port),
            ("dubbo.test.Echo", 57625)
        );
        assert_eq!(super::services([&python])[0].name, "dubbo-test-echo");
    }
}
