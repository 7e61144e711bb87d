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
use dubbo_cp_domain::service::{Service, ServiceEndpoint, ServicePort};

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

/// A server as policies see it: the workload behind its address, and whether one was found
/// there (else only its namespace is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub endpoint: Endpoint,
    pub found: bool,
}

/// `(policy, why it was applied without knowing all its selectors say)`.
pub type Unknown = Vec<(String, String)>;

impl Policies {
    /// The mode of `port` on `workload`, and the policies applied to it on selectors the
    /// control plane could not check.
    pub fn mode(&self, workload: &Workload, port: u16) -> (Decision, Unknown) {
        let root = &self.settings.root_namespace;
        let mut unknown = Vec::new();
        let mut applying: Vec<&Named<AuthenticationPolicySpec>> = Vec::new();
        for policy in &self.authentication {
            let audience = Audience::of_authentication(&policy.spec, &policy.namespace, root);
            if let Some(guessed) = applies(audience, workload) {
                unknown.extend(guessed.into_iter().map(|why| (policy.key(), why)));
                applying.push(policy);
            }
        }
        // Most specific first: with selectors (of the workload's namespace, then the root's),
        // then namespace-wide, then the root namespace's; the sort is stable, so names break
        // ties (they are in order).
        applying.sort_by_key(|p| (p.spec.selector.is_empty(), p.namespace == *root));
        for policy in applying {
            let mode = |action: &str| match action {
                "STRICT" => Some(Mode::Strict),
                "PERMISSIVE" => Some(Mode::Permissive),
                "DISABLED" => Some(Mode::Disabled),
                _ => None,
            };
            let port_level = policy
                .spec
                .port_level
                .iter()
                .find(|level| u16::try_from(level.port).is_ok_and(|p| p == port))
                .and_then(|level| mode(&level.action));
            // A port-level NONE inherits the policy's own action; a policy-level NONE has no
            // opinion, and the next policy decides (Istio's UNSET).
            let Some(mode) = port_level.or_else(|| mode(&policy.spec.action)) else {
                continue;
            };
            return (
                Decision {
                    mode,
                    policy: Some(policy.key()),
                },
                unknown,
            );
        }
        (
            Decision {
                mode: Mode::Permissive,
                policy: None,
            },
            unknown,
        )
    }

    /// The AuthorizationPolicies that apply to `workload`, in (namespace, name) order, and
    /// those applied on selectors the control plane could not check.
    pub fn authorizing(
        &self,
        workload: &Workload,
    ) -> (Vec<&Named<AuthorizationPolicySpec>>, Unknown) {
        let root = &self.settings.root_namespace;
        let mut unknown = Vec::new();
        let mut applying = Vec::new();
        for policy in &self.authorization {
            let audience = Audience::of_authorization(&policy.spec, &policy.namespace, root);
            if let Some(guessed) = applies(audience, workload) {
                unknown.extend(guessed.into_iter().map(|why| (policy.key(), why)));
                applying.push(policy);
            }
        }
        (applying, unknown)
    }

    /// Whether a client reaching `endpoints` of `service` on `port` must use mTLS: any of them
    /// being STRICT there. gRPC has no per-endpoint TLS (`transport_socket_matches`), so a
    /// cluster with mixed modes gets TLS and its plaintext endpoints fail (docs/security.md).
    pub fn upstream_mtls<'a>(
        &self,
        service: &Service,
        endpoints: impl IntoIterator<Item = &'a ServiceEndpoint>,
        port: &ServicePort,
    ) -> bool {
        endpoints.into_iter().any(|endpoint| {
            let workload = Workload {
                endpoint: workload_of(service, endpoint.address, &endpoint.labels),
                found: true,
            };
            self.mode(&workload, endpoint.port_for(port))
                .0
                .mode
                .is_mtls()
        })
    }
}

/// Whether a policy of `audience` applies to a server, with what it had to assume: a selector
/// field the control plane cannot know of a server (its identity: principals, `id`, `spiffeID`;
/// its pod's name and annotations; its IP and labels when no endpoint was found at its address)
/// is taken as matching, so the policy applies rather than being silently left out (which would
/// let every caller past an ALLOW policy). `None`: it does not apply.
fn applies(mut audience: Audience, workload: &Workload) -> Option<Vec<String>> {
    let mut guessed = Vec::new();
    for selector in &mut audience.selectors {
        let mut unknown = |what: &str, cleared: bool| {
            if cleared {
                guessed.push(format!(
                    "to.{what} cannot be known of a server, so the policy is applied as if it matched"
                ));
            }
        };
        unknown(
            "principals",
            !std::mem::take(&mut selector.principals).is_empty(),
        );
        unknown(
            "notPrincipals",
            !std::mem::take(&mut selector.not_principals).is_empty(),
        );
        for (extends, what) in [
            (&mut selector.extends, "extends"),
            (&mut selector.not_extends, "notExtends"),
        ] {
            if extends.iter().any(|e| !knowable(&e.key, workload.found)) {
                extends.clear();
                unknown(what, true);
            }
        }
        if !workload.found {
            unknown(
                "ipBlocks",
                !std::mem::take(&mut selector.ip_blocks).is_empty(),
            );
            unknown(
                "notIpBlocks",
                !std::mem::take(&mut selector.not_ip_blocks).is_empty(),
            );
        }
    }
    audience.includes(&workload.endpoint).then_some(guessed)
}

/// Whether an extend's key can be known of a server (`found`: an endpoint is at its address).
fn knowable(key: &str, found: bool) -> bool {
    if key == "kubernetesEnv.namespace" {
        return true;
    }
    found && (key == "ips" || key.starts_with("kubernetesEnv.podLabels."))
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
