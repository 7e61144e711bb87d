//! The CA's two RPCs (wire.md §6): `AuthorityService/CreateIdentity` (the reference control
//! plane's) and `DubboCertificateService/CreateCertificate` (the released Java SDK's). Both
//! authenticate like every RPC and answer every failure with gRPC OK, `success: false` and a
//! message, because old SDKs read only `success`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use super::Authority;
use super::authority::{self, Bundle, Issued, Subject};
use crate::auth::{Identity, Policy, Refusal};
use crate::pb::authority_service_server::AuthorityService;
use crate::pb::dubbo_certificate_service_server::DubboCertificateService;
use crate::pb::{
    DubboCertificateRequest, DubboCertificateResponse, IdentityRequest, IdentityResponse,
};
use crate::ratelimit::RateLimiter;

/// Callers remembered by the per-caller rate limit (a bound on what untrusted callers grow).
const MAX_TRACKED_CALLERS: u64 = 100_000;
/// A caller's bucket is forgotten after this long without a request.
const CALLER_IDLE: Duration = Duration::from_secs(600);
/// Shortest certificate worth issuing.
const MIN_VALIDITY: Duration = Duration::from_secs(60);
/// How long a request waits for a signing slot before it is told to retry.
const SLOT_WAIT: Duration = Duration::from_secs(5);

/// How issuing is paced.
#[derive(Debug, Clone, Copy)]
pub struct IssueLimits {
    /// Certificates per second per caller (pod, else SPIFFE ID), on average.
    pub per_second: f64,
    pub burst: u32,
    /// Signings at the same time; the rest wait (never more than half the cores, so a
    /// start-up storm leaves room for registrations).
    pub concurrency: usize,
}

#[derive(Clone)]
pub struct CaService {
    authority: Authority,
    policy: Policy,
    limits: IssueLimits,
    callers: moka::sync::Cache<String, Arc<RateLimiter>>,
    slots: Arc<Semaphore>,
}

/// What an RPC answers, before it is put in either response type.
struct Answer {
    issued: Issued,
    bundle: Arc<Bundle>,
}

impl CaService {
    pub fn new(authority: Authority, policy: Policy, limits: IssueLimits) -> CaService {
        CaService {
            authority,
            policy,
            limits,
            callers: moka::sync::Cache::builder()
                .max_capacity(MAX_TRACKED_CALLERS)
                .time_to_idle(CALLER_IDLE)
                .build(),
            slots: Arc::new(Semaphore::new(limits.concurrency.max(1))),
        }
    }

    async fn issue<T>(
        &self,
        rpc: &'static str,
        request: &Request<T>,
        csr: &str,
    ) -> Result<Answer, String> {
        let stats = &self.authority.stats;
        let fail = |result: &'static str, message: String| {
            stats.count(rpc, result);
            tracing::debug!(rpc, result, %message, "certificate refused");
            message
        };
        let identity = match self.policy.authenticate_request(request).await {
            Ok(Some(identity)) => identity,
            Ok(None) => {
                return Err(fail(
                    "unauthenticated",
                    "unauthenticated: a certificate needs an identity; send `authorization: Bearer <token>` (authorization-type dubbo-ca-token) or a client certificate".to_owned(),
                ));
            }
            Err(refusal) => {
                let result = match &refusal {
                    Refusal::Unauthenticated(crate::auth::AuthError::Unavailable(_)) => {
                        "unavailable"
                    }
                    _ => "unauthenticated",
                };
                return Err(fail(
                    result,
                    format!("unauthenticated: {}", refusal.into_status().message()),
                ));
            }
        };
        let subject = subject(&identity).map_err(|m| fail("unauthenticated", m))?;
        let caller = rate_key(&identity, &subject);
        let limiter = self.callers.get_with(caller.clone(), || {
            Arc::new(RateLimiter::new(self.limits.per_second, self.limits.burst))
        });
        if !limiter.try_acquire() {
            return Err(fail(
                "rate_limited",
                format!(
                    "rate limited: {caller} asked for more than {} certificates per second; retry later",
                    self.limits.per_second
                ),
            ));
        }
        let Ok(Ok(_slot)) = tokio::time::timeout(SLOT_WAIT, self.slots.acquire()).await else {
            return Err(fail(
                "busy",
                "busy: too many certificates being signed; retry later".to_owned(),
            ));
        };
        let Some(bundle) = self.authority.current() else {
            return Err(fail("unavailable", super::NOT_READY.to_owned()));
        };
        let now = SystemTime::now();
        // A certificate or token we issued may renew itself, but never past its own expiry.
        let mut validity = self.authority.settings.cert_validity;
        if let Some(expiry) = identity.credential_expiry {
            let left = expiry.duration_since(now).unwrap_or_default();
            if left < MIN_VALIDITY.min(validity) {
                return Err(fail(
                    "unauthenticated",
                    "unauthenticated: the presented certificate or dubbo-jwt expires too soon to renew with; authenticate with a service-account token".to_owned(),
                ));
            }
            validity = validity.min(left);
        }
        let issued = bundle
            .issue(csr, &subject, validity, now)
            .map_err(|err| fail(err.result(), err.to_string()))?;
        stats.count(rpc, "issued");
        tracing::debug!(rpc, spiffe_id = %subject.spiffe_id, "certificate issued");
        Ok(Answer { issued, bundle })
    }
}

/// The certificate's names: the caller's SPIFFE ID (never what the CSR asks for) and, as CN,
/// its pod's UID where known.
fn subject(identity: &Identity) -> Result<Subject, String> {
    let spiffe_id = identity.spiffe_id.clone().ok_or_else(|| {
        format!(
            "unauthenticated: {} is not a service account; certificates are issued to service accounts",
            identity.name
        )
    })?;
    let common_name = identity
        .pod
        .as_ref()
        .map(|pod| pod.uid.clone())
        .filter(|uid| !uid.is_empty())
        .or_else(|| identity.service_account.clone())
        .unwrap_or_else(|| identity.name.clone());
    Ok(Subject {
        spiffe_id,
        common_name,
    })
}

/// Callers are paced per pod when the token is bound to one (a deployment's pods share a
/// service account), else per presented certificate or token, else per SPIFFE ID.
fn rate_key(identity: &Identity, subject: &Subject) -> String {
    match identity.pod.as_ref().filter(|pod| !pod.uid.is_empty()) {
        Some(pod) => format!("pod {}", pod.uid),
        None => identity
            .credential_id
            .clone()
            .unwrap_or_else(|| subject.spiffe_id.clone()),
    }
}

#[tonic::async_trait]
impl AuthorityService for CaService {
    async fn create_identity(
        &self,
        request: Request<IdentityRequest>,
    ) -> Result<Response<IdentityResponse>, Status> {
        let answer = self
            .issue("CreateIdentity", &request, &request.get_ref().csr)
            .await;
        Ok(Response::new(match answer {
            Ok(Answer { issued, bundle }) => IdentityResponse {
                success: true,
                cert_pem: issued.cert_pem,
                trust_certs: bundle.trust_pems(),
                token: issued.token,
                trusted_token_public_keys: bundle.token_public_keys(),
                refresh_time: authority::unix_millis(issued.refresh_at),
                expire_time: authority::unix_millis(issued.not_after),
                message: "OK".to_owned(),
            },
            Err(message) => IdentityResponse {
                success: false,
                message,
                ..IdentityResponse::default()
            },
        }))
    }
}

#[tonic::async_trait]
impl DubboCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<DubboCertificateRequest>,
    ) -> Result<Response<DubboCertificateResponse>, Status> {
        let answer = self
            .issue("CreateCertificate", &request, &request.get_ref().csr)
            .await;
        Ok(Response::new(match answer {
            Ok(Answer { issued, bundle }) => DubboCertificateResponse {
                success: true,
                cert_pem: issued.cert_pem,
                trust_certs: bundle.trust_pems(),
                expire_time: authority::unix_millis(issued.not_after),
                message: "OK".to_owned(),
            },
            Err(message) => DubboCertificateResponse {
                success: false,
                message,
                ..DubboCertificateResponse::default()
            },
        }))
    }
}
