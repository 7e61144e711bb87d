//! Zero trust for proxyless gRPC: what AuthenticationPolicies and AuthorizationPolicies make of
//! a server's listener (its TLS and its RBAC filters, gRFCs A29 and A41) and of its callers'
//! clusters (auto mTLS: a client of a STRICT server gets TLS with our roots and a SPIFFE check).
//!
//! - [`tls`]: the TLS contexts, naming the bootstrap's certificate provider.
//! - [`rbac`]: AuthorizationPolicies as RBAC filters, and what gRPC cannot enforce of them.
//!
//! Which policies apply to a server follows the discovery stream's scoping
//! ([`Audience::includes`]) on the workload behind the listening address; which one wins
//! follows Istio's PeerAuthentication: a policy with selectors over a namespace-wide one, that
//! over the root namespace's, the first by name on a tie; `NONE` (Istio's `UNSET`) inherits
//! from the next, then a port-level entry for the listening port overrides.

pub mod rbac;
pub mod tls;

use std::net::IpAddr;

use dubbo_cp_domain::rules::scope::{Audience, Endpoint};
use dubbo_cp_domain::rules::{AuthenticationPolicySpec, AuthorizationPolicySpec};
use dubbo_cp_domain::service::Service;

/// Settings the security translation needs from the rest of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The CA's SPIFFE trust domain: clients check a server's certificate is of it.
    pub trust_domain: String,
    /// Policies in this namespace reach every workload.
    pub root_namespace: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            trust_domain: "cluster.local".to_owned(),
            root_namespace: "dubbo-system".to_owned(),
        }
    }
}

/// What gRPC servers make of PERMISSIVE, said wherever a policy asks for it.
pub const PERMISSIVE_AS_PLAINTEXT: &str = "PERMISSIVE is served as plaintext: a gRPC server cannot \
     accept TLS and plaintext on one port (use STRICT for mTLS)";

/// How a server port takes its callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// mTLS required: a DownstreamTlsContext requiring client certificates.
    Strict,
    /// Plaintext, because gRPC cannot accept TLS and plaintext on one port (a filter chain match
    /// cannot tell them apart: gRFC A36); Istio does the same for proxyless gRPC.
    Permissive,
    Disabled,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Strict => "STRICT",
            Mode::Permissive => "PERMISSIVE",
            Mode::Disabled => "DISABLED",
        }
    }

    pub fn is_mtls(self) -> bool {
        self == Mode::Strict
    }
}

/// A named policy of one namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Named<T> {
    pub namespace: String,
    pub name: String,
    pub spec: T,
}

impl<T> Named<T> {
    /// `namespace/name`, as operators name objects.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Every auth policy of a snapshot, with the settings to read them.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    pub settings: Settings,
    /// By (namespace, name).
    pub authentication: Vec<Named<AuthenticationPolicySpec>>,
    /// By (namespace, name).
    pub authorization: Vec<Named<AuthorizationPolicySpec>>,
}

/// A port's mode and the policy that decided it (`None`: no policy, the default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub mode: Mode,
    pub policy: Option<String>,
}

impl Policies {
    /// The mode of `port` on `workload`.
    pub fn mode(&self, workload: &Endpoint, port: u16) -> Decision {
        let root = &self.settings.root_namespace;
        let mut applying: Vec<&Named<AuthenticationPolicySpec>> = self
            .authentication
            .iter()
            .filter(|p| Audience::of_authentication(&p.spec, &p.namespace, root).includes(workload))
            .collect();
        // Most specific first; the sort is stable, so names break ties (they are in order).
        applying.sort_by_key(|p| {
            if !p.spec.selector.is_empty() {
                0
            } else if p.namespace != *root {
                1
            } else {
                2
            }
        });
        for policy in applying {
            let action = policy
                .spec
                .port_level
                .iter()
                .find(|level| u16::try_from(level.port).is_ok_and(|p| p == port))
                .map_or(policy.spec.action.as_str(), |level| level.action.as_str());
            let mode = match action {
                "STRICT" => Mode::Strict,
                "PERMISSIVE" => Mode::Permissive,
                "DISABLED" => Mode::Disabled,
                // NONE: no opinion, the next policy decides.
                _ => continue,
            };
            return Decision {
                mode,
                policy: Some(policy.key()),
            };
        }
        Decision {
            mode: Mode::Permissive,
            policy: None,
        }
    }

    /// The AuthorizationPolicies that apply to `workload`, in (namespace, name) order.
    pub fn authorizing<'a>(
        &'a self,
        workload: &'a Endpoint,
    ) -> impl Iterator<Item = &'a Named<AuthorizationPolicySpec>> + 'a {
        let root = &self.settings.root_namespace;
        self.authorization.iter().filter(move |p| {
            Audience::of_authorization(&p.spec, &p.namespace, root).includes(workload)
        })
    }

    /// Whether a client reaching `service`'s endpoints on `port` must use mTLS: any endpoint
    /// being STRICT there. gRPC has no per-endpoint TLS (`transport_socket_matches`), so a
    /// service with mixed modes gets TLS and its plaintext endpoints fail (docs/security.md).
    pub fn upstream_mtls(&self, service: &Service, port_name: &str, port: u16) -> bool {
        service.endpoints.iter().any(|endpoint| {
            let listening = endpoint.ports.get(port_name).copied().unwrap_or(port);
            let workload = workload_of(service, endpoint.address, &endpoint.labels);
            self.mode(&workload, listening).mode.is_mtls()
        })
    }
}

/// The workload a policy sees behind an endpoint of `service`: its namespace, its address and
/// its labels (the service's, then the endpoint's own).
pub fn workload_of(
    service: &Service,
    address: IpAddr,
    labels: &std::collections::BTreeMap<String, String>,
) -> Endpoint {
    let mut pod_labels = service.labels.clone();
    pod_labels.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    Endpoint {
        namespace: service.namespace.clone(),
        ips: vec![address],
        pod_labels,
        ..Endpoint::default()
    }
}

#[cfg(test)]
mod tests;
