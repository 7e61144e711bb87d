//! Who is calling, and what they may do (wire.md §5, behaviour.md "Security").
//!
//! An [`Authenticator`] turns request metadata into an [`Identity`]; the [`Policy`] decides
//! whether that identity may register in a namespace (its own, or any for configured admins)
//! and how refusals are answered: as gRPC status codes, or the legacy way (OK with
//! `success: false`) for old SDKs that only read `success`.

#![forbid(unsafe_code)]

// The shared crates under the paths the modules name.
use dubbo_cp_domain::{mapping, rules};
use dubbo_cp_kit::{metrics, ratelimit, shutdown};

pub mod config;
pub mod keys;
pub mod pods;
pub mod serviceaccount;
pub mod spiffe;
pub mod tokenreview;
pub mod tokens;

pub use config::AuthConfig;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tonic::Status;

use crate::rules::scope::Endpoint;
use tonic::metadata::MetadataMap;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The namespace the caller belongs to; it may register only there.
    pub namespace: String,
    /// A stable name for logs, rate limits and the admin list (e.g. `ns/service-account`).
    pub name: String,
    /// The pod a Kubernetes token is bound to, when it is (policies select by its labels and
    /// IPs).
    pub pod: Option<Arc<PodInfo>>,
    /// The service account, for Kubernetes tokens and SPIFFE certificates.
    pub service_account: Option<String>,
    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`: from the certificate, or
    /// made from the service account and the configured trust domain.
    pub spiffe_id: Option<String>,
    /// When the credential that proved this identity expires, for credentials the CA issued
    /// (client certificate, `dubbo-jwt`): the CA never issues past it, so a stolen credential
    /// cannot renew itself forever.
    pub credential_expiry: Option<std::time::SystemTime>,
    /// The presented credential itself (certificate serial, token digest): what the CA paces a
    /// caller by when no pod is known (a deployment's pods share a service account).
    pub credential_id: Option<String>,
}

impl Identity {
    /// An identity with a name and a namespace and nothing else known.
    pub fn named(namespace: impl Into<String>, name: impl Into<String>) -> Identity {
        Identity {
            namespace: namespace.into(),
            name: name.into(),
            pod: None,
            service_account: None,
            spiffe_id: None,
            credential_expiry: None,
            credential_id: None,
        }
    }

    /// `namespace/account` of a Kubernetes service account.
    pub fn service_account(namespace: &str, account: &str) -> Identity {
        Identity {
            service_account: Some(account.to_owned()),
            ..Identity::named(namespace, format!("{namespace}/{account}"))
        }
    }
}

/// What the auth-policy filtering of the discovery stream matches: the identity, its pod, and
/// the pod's IPs (or the peer's address when no pod is known).
pub fn endpoint(identity: Option<&Identity>, peer: Option<std::net::IpAddr>) -> Endpoint {
    let Some(identity) = identity else {
        return Endpoint {
            ips: peer.into_iter().collect(),
            ..Endpoint::default()
        };
    };
    let pod = identity.pod.as_deref();
    let mut ips: Vec<std::net::IpAddr> = pod
        .map(|p| p.ips.iter().filter_map(|ip| ip.parse().ok()).collect())
        .unwrap_or_default();
    if ips.is_empty() {
        ips.extend(peer);
    }
    Endpoint {
        id: identity.name.clone(),
        namespace: identity.namespace.clone(),
        spiffe_id: identity.spiffe_id.clone().unwrap_or_default(),
        pod_name: pod.map(|p| p.name.clone()).unwrap_or_default(),
        pod_labels: pod.map(|p| p.labels.clone()).unwrap_or_default(),
        pod_annotations: pod.map(|p| p.annotations.clone()).unwrap_or_default(),
        ips,
    }
}

/// The pod behind a caller, as the pod watch saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PodInfo {
    pub name: String,
    pub uid: String,
    pub ips: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing authorization: send `authorization: Bearer <token>`")]
    Missing,
    #[error("malformed authorization: {0}")]
    Malformed(&'static str),
    #[error("invalid token")]
    InvalidToken,
    #[error("token rejected: {0}")]
    Rejected(String),
    #[error("{0}")]
    Unsupported(&'static str),
    /// The authenticator could not decide (e.g. the API server is unreachable): retryable.
    #[error("cannot check the token now: {0}")]
    Unavailable(String),
}

/// Turns request metadata into an identity.
#[tonic::async_trait]
pub trait Authenticator: Send + Sync {
    async fn authenticate(&self, metadata: &MetadataMap) -> Result<Identity, AuthError>;
}

/// The bearer token of a request: exactly one `authorization: Bearer <token>` value.
pub fn bearer_token(metadata: &MetadataMap) -> Result<&str, AuthError> {
    let mut values = metadata.get_all("authorization").iter();
    let Some(value) = values.next() else {
        return Err(AuthError::Missing);
    };
    if values.next().is_some() {
        return Err(AuthError::Malformed(
            "authorization must have exactly one value",
        ));
    }
    let value = value
        .to_str()
        .map_err(|_| AuthError::Malformed("authorization is not ASCII"))?;
    let token = value
        .strip_prefix("Bearer ")
        .ok_or(AuthError::Malformed(
            "authorization must be `Bearer <token>`",
        ))?
        .trim();
    if token.is_empty() {
        return Err(AuthError::Malformed("empty bearer token"));
    }
    Ok(token)
}

/// Why a caller was refused.
#[derive(Debug)]
pub enum Refusal {
    Unauthenticated(AuthError),
    PermissionDenied(String),
}

impl Refusal {
    pub fn into_status(self) -> Status {
        match self {
            Refusal::Unauthenticated(AuthError::Unavailable(reason)) => {
                Status::unavailable(format!("cannot check the token now: {reason}"))
            }
            Refusal::Unauthenticated(err) => Status::unauthenticated(err.to_string()),
            Refusal::PermissionDenied(message) => Status::permission_denied(message),
        }
    }

    pub fn metric_result(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(AuthError::Unavailable(_)) => "unavailable",
            Refusal::Unauthenticated(_) => "unauthenticated",
            Refusal::PermissionDenied(_) => "denied",
        }
    }
}

/// Verifies `dubbo-jwt` tokens (wire.md §5): implemented by the CA, which signs them.
pub trait TokenVerifier: Send + Sync {
    /// The token's `sub` (a SPIFFE ID) and `exp` when a trusted root signed it and it is
    /// current.
    fn verify(&self, token: &str) -> Result<(String, std::time::SystemTime), String>;
}

/// The trust domain of SPIFFE IDs made for service accounts when none is configured.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// Authentication and authorization as configured. Without an authenticator everyone is
/// anonymous and allowed (the server then binds only to loopback unless told otherwise).
#[derive(Clone, Default)]
pub struct Policy {
    authenticator: Option<Arc<dyn Authenticator>>,
    /// Identities that may register in any namespace.
    admins: Arc<BTreeSet<String>>,
    /// Answer refusals with gRPC OK and `success: false`, for SDKs that only read `success`.
    pub legacy_answers: bool,
    /// Expected trust domain of SPIFFE IDs in client certificates (any when `None`).
    trust_domain: Option<Arc<str>>,
    /// The CA's check of `dubbo-jwt` tokens; without a CA they are refused.
    dubbo_jwt: Option<Arc<dyn TokenVerifier>>,
}

impl Policy {
    pub fn new(
        authenticator: Option<Arc<dyn Authenticator>>,
        admins: impl IntoIterator<Item = String>,
        legacy_answers: bool,
    ) -> Self {
        Self {
            authenticator,
            admins: Arc::new(admins.into_iter().collect()),
            legacy_answers,
            trust_domain: None,
            dubbo_jwt: None,
        }
    }

    /// Accept `authorization-type: dubbo-jwt` tokens this verifier vouches for.
    pub fn with_dubbo_jwt(mut self, verifier: Option<Arc<dyn TokenVerifier>>) -> Self {
        self.dubbo_jwt = verifier;
        self
    }

    /// Client certificates must name `trust_domain` (any when `None` or empty).
    pub fn with_trust_domain(mut self, trust_domain: Option<String>) -> Self {
        self.trust_domain = trust_domain.filter(|d| !d.is_empty()).map(Into::into);
        self
    }

    pub fn is_enabled(&self) -> bool {
        self.authenticator.is_some()
    }

    /// The identity of a `dubbo-jwt` bearer token: its `sub`, a SPIFFE ID in our trust domain.
    fn dubbo_jwt(&self, metadata: &MetadataMap) -> Result<Identity, AuthError> {
        let verifier = self.dubbo_jwt.as_ref().ok_or(AuthError::Unsupported(
            "authorization-type dubbo-jwt needs the control plane's CA, which is disabled (ca.enabled)",
        ))?;
        let token = bearer_token(metadata)?;
        let (subject, expiry) = verifier
            .verify(token)
            .map_err(|reason| AuthError::Rejected(format!("dubbo-jwt: {reason}")))?;
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let id: String = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Identity {
            credential_expiry: Some(expiry),
            credential_id: Some(format!("jwt {id}")),
            ..spiffe::identity_from_spiffe_id(&subject, self.trust_domain.as_deref())?
        })
    }

    /// The caller's identity: the SPIFFE ID of its client certificate (TLS port), else its
    /// bearer token; `None` when authentication is off and no certificate names it.
    pub async fn authenticate(
        &self,
        metadata: &MetadataMap,
        peer_certificates: Option<&[Vec<u8>]>,
    ) -> Result<Option<Identity>, Refusal> {
        if let Some(leaf) = peer_certificates.and_then(|certs| certs.first()) {
            let from_certificate =
                spiffe::identity_from_certificate(leaf, self.trust_domain.as_deref())
                    .map_err(Refusal::Unauthenticated)?;
            if let Some(identity) = from_certificate {
                return Ok(Some(identity));
            }
        }
        let kind = metadata
            .get("authorization-type")
            .and_then(|v| v.to_str().ok());
        if kind == Some("dubbo-jwt") {
            return self
                .dubbo_jwt(metadata)
                .map(Some)
                .map_err(Refusal::Unauthenticated);
        }
        match &self.authenticator {
            None => Ok(None),
            Some(authenticator) => {
                let mut identity = authenticator
                    .authenticate(metadata)
                    .await
                    .map_err(Refusal::Unauthenticated)?;
                if identity.spiffe_id.is_none()
                    && let Some(account) = &identity.service_account
                {
                    let domain = self.trust_domain.as_deref().unwrap_or(DEFAULT_TRUST_DOMAIN);
                    identity.spiffe_id = Some(format!(
                        "spiffe://{domain}/ns/{}/sa/{account}",
                        identity.namespace
                    ));
                }
                Ok(Some(identity))
            }
        }
    }

    /// The caller of a gRPC request: its client certificate (TLS port), else its bearer token.
    pub async fn authenticate_request<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<Option<Identity>, Refusal> {
        let certificates: Option<Vec<Vec<u8>>> = request
            .peer_certs()
            .map(|certs| certs.iter().map(|cert| cert.as_ref().to_vec()).collect());
        self.authenticate(request.metadata(), certificates.as_deref())
            .await
    }

    /// Whether `identity` may act in any namespace and use the admin API.
    pub fn is_admin(&self, identity: &Identity) -> bool {
        self.admins.contains(&identity.name)
    }

    /// Whether `identity` may register in `namespace`.
    pub fn authorize(&self, identity: Option<&Identity>, namespace: &str) -> Result<(), Refusal> {
        let Some(identity) = identity else {
            return Ok(());
        };
        if identity.namespace == namespace || self.admins.contains(&identity.name) {
            return Ok(());
        }
        Err(Refusal::PermissionDenied(format!(
            "namespace: {} may register only in namespace {:?}, not {namespace:?}",
            identity.name, identity.namespace
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(values: &[&str]) -> MetadataMap {
        let mut map = MetadataMap::new();
        for value in values {
            if let Ok(value) = value.parse() {
                map.append("authorization", value);
            }
        }
        map
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        assert_eq!(bearer_token(&metadata(&["Bearer abc"])), Ok("abc"));
        assert_eq!(bearer_token(&metadata(&[])), Err(AuthError::Missing));
        assert!(matches!(
            bearer_token(&metadata(&["Basic abc"])),
            Err(AuthError::Malformed(_))
        ));
        assert!(matches!(
            bearer_token(&metadata(&["Bearer "])),
            Err(AuthError::Malformed(_))
        ));
        assert!(matches!(
            bearer_token(&metadata(&["Bearer a", "Bearer b"])),
            Err(AuthError::Malformed(_))
        ));
    }

    #[test]
    fn own_namespace_or_admin() {
        let policy = Policy::new(None, ["root".to_string()], false);
        let caller = Identity::named("a", "a/app");
        assert!(policy.authorize(Some(&caller), "a").is_ok());
        assert!(matches!(
            policy.authorize(Some(&caller), "b"),
            Err(Refusal::PermissionDenied(_))
        ));
        let admin = Identity::named("ops", "root");
        assert!(policy.authorize(Some(&admin), "b").is_ok());
        assert!(
            policy.authorize(None, "b").is_ok(),
            "authentication off: no identity, no check"
        );
    }
}
