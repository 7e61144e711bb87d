//! Kubernetes authentication of bearer tokens (wire.md §5: `kubernetes` and `dubbo-ca-token`).
//!
//! A service-account token is verified locally first: its signature against the cluster's keys
//! ([`keys`](super::keys)), `iss`, `aud` (`dubbo-ca` for `dubbo-ca-token`), `exp`/`nbf`, and the
//! pod it is bound to must exist with the token's UID ([`pods`](super::pods)). That needs no API
//! request, so it keeps working through an API-server outage and cannot be used to flood it.
//! Tokens that cannot be verified locally (not issued by the cluster's current keys, bound to a
//! Secret, made for another audience of the API server) go to a TokenReview, paced by a token
//! bucket. Every answer, positive or negative, is cached (bounded in bytes; concurrent checks of
//! one token share one lookup); a positive answer never outlives the token's `exp`. Answers that
//! could not be decided (API server unreachable, reviews rate-limited) are not cached.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;
use tonic::metadata::MetadataMap;

use super::keys::{KeySet, ServiceAccountKeys};
use super::pods::{PodLookup, PodView};
use super::tokenreview::{Audience, TokenReviewer};
use super::{AuthError, Authenticator, Identity, PodInfo, bearer_token};
use crate::ratelimit::RateLimiter;

/// Longest bearer token accepted; real service-account tokens are 1-2 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 10;
/// Signature algorithms a service-account token may use (never HMAC: the keys are public).
const ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
];

#[derive(Debug, Clone, Copy)]
pub struct CacheSettings {
    /// Longest reuse of a positive answer (shorter when the token expires sooner).
    pub ttl: Duration,
    /// Reuse of a negative answer.
    pub negative_ttl: Duration,
    /// Bytes of tokens the cache may hold.
    pub max_bytes: u64,
}

/// What authentication did, for metrics and tests.
#[derive(Debug, Default)]
pub struct AuthStats {
    pub verified_locally: AtomicU64,
    pub reviewed: AtomicU64,
    pub rejected: AtomicU64,
    pub cache_hits: AtomicU64,
}

impl AuthStats {
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        use crate::metrics::scraped_counter;
        scraped_counter(
            registry,
            "auth_tokens_verified_locally",
            "Bearer tokens verified against the cluster's service-account keys",
            self,
            |s| s.verified_locally.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "auth_token_reviews",
            "Bearer tokens sent to a TokenReview (not verifiable locally)",
            self,
            |s| s.reviewed.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "auth_tokens_rejected",
            "Bearer tokens found invalid (the answer is cached)",
            self,
            |s| s.rejected.load(Ordering::Relaxed),
        );
        scraped_counter(
            registry,
            "auth_cache_hits",
            "Authentications answered from the cache",
            self,
            |s| s.cache_hits.load(Ordering::Relaxed),
        );
    }
}

/// A decided answer and, for a positive one, when the token expires.
#[derive(Debug, Clone)]
struct Verdict {
    identity: Result<Identity, AuthError>,
    expires: Option<SystemTime>,
}

type CacheKey = (Arc<str>, Audience);

/// Expires each cached answer after its own lifetime.
struct VerdictExpiry(CacheSettings);

impl moka::Expiry<CacheKey, Arc<Verdict>> for VerdictExpiry {
    fn expire_after_create(
        &self,
        _key: &CacheKey,
        verdict: &Arc<Verdict>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(lifetime(&self.0, verdict, SystemTime::now()))
    }
}

fn lifetime(settings: &CacheSettings, verdict: &Verdict, now: SystemTime) -> Duration {
    match (&verdict.identity, verdict.expires) {
        (Err(_), _) => settings.negative_ttl,
        (Ok(_), None) => settings.ttl,
        (Ok(_), Some(expires)) => settings
            .ttl
            .min(expires.duration_since(now).unwrap_or_default()),
    }
}

pub struct ServiceAccountAuthenticator {
    keys: Arc<ServiceAccountKeys>,
    pods: Arc<PodView>,
    reviewer: TokenReviewer,
    /// Paces TokenReviews (and pod GETs): the fallback must not become a flood.
    reviews: Arc<RateLimiter>,
    /// Audiences of the API server that `kubernetes` tokens may carry, besides the issuer.
    api_audiences: Vec<String>,
    cache: moka::future::Cache<CacheKey, Arc<Verdict>>,
    stats: Arc<AuthStats>,
}

impl ServiceAccountAuthenticator {
    pub fn new(
        keys: Arc<ServiceAccountKeys>,
        pods: Arc<PodView>,
        reviewer: TokenReviewer,
        reviews: Arc<RateLimiter>,
        api_audiences: Vec<String>,
        settings: CacheSettings,
    ) -> Self {
        let cache = moka::future::Cache::builder()
            .max_capacity(settings.max_bytes)
            .weigher(|key: &CacheKey, _: &Arc<Verdict>| {
                u32::try_from(key.0.len() + 256).unwrap_or(u32::MAX)
            })
            .expire_after(VerdictExpiry(settings))
            .build();
        Self {
            keys,
            pods,
            reviewer,
            reviews,
            api_audiences,
            cache,
            stats: Arc::new(AuthStats::default()),
        }
    }

    pub fn stats(&self) -> Arc<AuthStats> {
        self.stats.clone()
    }

    /// A decided answer for `token`, or `Unavailable` when it cannot be decided now.
    async fn decide(&self, token: &str, audience: Audience) -> Result<Verdict, AuthError> {
        match self.verify_locally(token, audience).await? {
            Some(verdict) => {
                self.stats.verified_locally.fetch_add(1, Ordering::Relaxed);
                Ok(verdict)
            }
            None => self.review(token, audience).await,
        }
    }

    async fn review(&self, token: &str, audience: Audience) -> Result<Verdict, AuthError> {
        if !self.reviews.try_acquire() {
            return Err(AuthError::Unavailable(
                "too many tokens need a TokenReview right now; retry shortly".into(),
            ));
        }
        self.stats.reviewed.fetch_add(1, Ordering::Relaxed);
        let identity = match self.reviewer.review(token, audience).await? {
            Ok(mut reviewed) => {
                if let Some((name, uid)) = reviewed.pod_name_and_uid.take() {
                    reviewed.identity.pod = Some(
                        self.bound_pod(&reviewed.identity.namespace, name, uid)
                            .await,
                    );
                }
                Ok(reviewed.identity)
            }
            Err(rejected) => Err(rejected),
        };
        // A reviewed JWT is still never trusted past its `exp`.
        let expires = jsonwebtoken::decode_header(token)
            .ok()
            .and_then(|header| peek_claims(token, header.alg))
            .filter(|claims| claims.exp > 0)
            .map(|claims| UNIX_EPOCH + Duration::from_secs(claims.exp));
        Ok(Verdict { identity, expires })
    }

    /// The pod a reviewed token is bound to: from the view when it is there, else its name.
    async fn bound_pod(&self, namespace: &str, name: String, uid: Option<String>) -> Arc<PodInfo> {
        if let Ok(PodLookup::Found(pod)) = self.pods.lookup(namespace, &name).await
            && uid.as_ref().is_none_or(|uid| *uid == pod.uid)
        {
            return pod;
        }
        Arc::new(PodInfo {
            name,
            uid: uid.unwrap_or_default(),
            ..PodInfo::default()
        })
    }

    /// `Ok(None)`: not verifiable here (review it). `Ok(Some)`: decided.
    async fn verify_locally(
        &self,
        token: &str,
        audience: Audience,
    ) -> Result<Option<Verdict>, AuthError> {
        let Ok(header) = jsonwebtoken::decode_header(token) else {
            return Ok(None);
        };
        // Before the first fetch finished (just after start), wait for it rather than send a
        // cluster token to a TokenReview and cache its answer.
        let current = match self.keys.current() {
            Some(keys) => Some(keys),
            None => self.keys.refresh_if_stale().await,
        };
        let Some(mut keys) = current else {
            return Ok(None);
        };
        let Some(unverified) = peek_claims(token, header.alg) else {
            return Ok(None);
        };
        if unverified.iss != keys.issuer || !ALGORITHMS.contains(&header.alg) {
            return Ok(None);
        }
        let kid = header.kid.unwrap_or_default();
        if keys.jwks.find(&kid).is_none() {
            // A key rotated in since the last fetch, or a forged key ID (fetches are paced).
            match self.keys.refresh_if_stale().await {
                Some(fresh) if fresh.jwks.find(&kid).is_some() => keys = fresh,
                _ => return Ok(None),
            }
        }
        let claims = match check_signature(&keys, &kid, header.alg, token) {
            Checked::Valid(claims) => claims,
            Checked::Invalid(reason) => return Ok(Some(rejected(reason))),
            Checked::Unverifiable => return Ok(None),
        };
        let Some(kubernetes) = claims.kubernetes else {
            return Ok(None);
        };
        match audience {
            Audience::DubboCa
                if !claims
                    .aud
                    .iter()
                    .any(|a| a == super::tokenreview::DUBBO_CA_AUDIENCE) =>
            {
                return Ok(Some(rejected(format!(
                    "the token is not for audience {}",
                    super::tokenreview::DUBBO_CA_AUDIENCE
                ))));
            }
            Audience::DubboCa => {}
            Audience::ApiServer => {
                let for_api_server = claims
                    .aud
                    .iter()
                    .any(|a| *a == keys.issuer || self.api_audiences.contains(a));
                if !for_api_server {
                    // The API server may have audiences we were not told about.
                    return Ok(None);
                }
            }
        }
        if kubernetes.secret.is_some() {
            // Secret-bound tokens live as long as their Secret: only the API server knows.
            return Ok(None);
        }
        let namespace = kubernetes.namespace;
        let account = kubernetes.serviceaccount.name;
        if claims.sub != format!("system:serviceaccount:{namespace}:{account}") {
            return Ok(Some(rejected(format!(
                "token subject {:?} does not match its service account",
                claims.sub
            ))));
        }
        let pod = match kubernetes.pod {
            None => None,
            Some(bound) => match self.pods.lookup(&namespace, &bound.name).await? {
                PodLookup::Found(pod) if pod.uid == bound.uid => Some(pod),
                PodLookup::Found(_) | PodLookup::Missing => {
                    return Ok(Some(rejected(format!(
                        "the pod {namespace}/{} this token is bound to no longer exists",
                        bound.name
                    ))));
                }
            },
        };
        Ok(Some(Verdict {
            identity: Ok(Identity {
                pod,
                ..Identity::service_account(&namespace, &account)
            }),
            expires: Some(UNIX_EPOCH + Duration::from_secs(claims.exp)),
        }))
    }
}

fn rejected(reason: impl Into<String>) -> Verdict {
    Verdict {
        identity: Err(AuthError::Rejected(reason.into())),
        expires: None,
    }
}

/// The claims of a service-account token we read.
#[derive(Debug, Deserialize)]
struct Claims {
    iss: String,
    #[serde(default)]
    sub: String,
    #[serde(default, deserialize_with = "one_or_many")]
    aud: Vec<String>,
    #[serde(default)]
    exp: u64,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

#[derive(Debug, Deserialize)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: ObjectRef,
    pod: Option<ObjectRef>,
    secret: Option<ObjectRef>,
}

#[derive(Debug, Deserialize)]
struct ObjectRef {
    name: String,
    #[serde(default)]
    uid: String,
}

/// `aud` is a string or a list of strings (RFC 7519).
fn one_or_many<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(de)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

/// The claims without checking anything: only to see whose token it claims to be.
fn peek_claims(token: &str, alg: Algorithm) -> Option<Claims> {
    let mut validation = Validation::new(alg);
    validation.insecure_disable_signature_validation();
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    jsonwebtoken::decode::<Claims>(token, &DecodingKey::from_secret(&[]), &validation)
        .ok()
        .map(|data| data.claims)
}

enum Checked {
    Valid(Box<Claims>),
    Invalid(String),
    /// The key cannot be used (unsupported type): let the API server decide.
    Unverifiable,
}

fn check_signature(keys: &KeySet, kid: &str, alg: Algorithm, token: &str) -> Checked {
    let Some(key) = keys
        .jwks
        .find(kid)
        .and_then(|jwk| DecodingKey::from_jwk(jwk).ok())
    else {
        return Checked::Unverifiable;
    };
    let mut validation = Validation::new(alg);
    validation.leeway = LEEWAY_SECONDS;
    validation.validate_nbf = true;
    // Checked by the caller: the expected audience depends on the token type.
    validation.validate_aud = false;
    validation.set_issuer(&[&keys.issuer]);
    validation.set_required_spec_claims(&["exp", "iss", "sub"]);
    match jsonwebtoken::decode::<Claims>(token, &key, &validation) {
        Ok(data) => Checked::Valid(Box::new(data.claims)),
        Err(err) => Checked::Invalid(match err.kind() {
            ErrorKind::ExpiredSignature => "the token has expired".into(),
            ErrorKind::ImmatureSignature => "the token is not valid yet".into(),
            ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
            ErrorKind::InvalidAlgorithm => "the token's algorithm does not match its key".into(),
            _ => format!("invalid token: {err}"),
        }),
    }
}

#[tonic::async_trait]
impl Authenticator for ServiceAccountAuthenticator {
    async fn authenticate(&self, metadata: &MetadataMap) -> Result<Identity, AuthError> {
        let token = bearer_token(metadata)?;
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::Malformed("bearer token is too long"));
        }
        let audience = Audience::of(metadata)?;
        let key: CacheKey = (Arc::from(token), audience);
        let mut computed = false;
        let verdict = self
            .cache
            .try_get_with(key.clone(), async {
                computed = true;
                self.decide(&key.0, audience).await.map(Arc::new)
            })
            .await
            .map_err(|err| (*err).clone())?;
        if !computed {
            self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        // Entries expire at the token's `exp`, but the cache's clock is coarse.
        if verdict.identity.is_ok() && verdict.expires.is_some_and(|e| e <= SystemTime::now()) {
            self.cache.invalidate(&key).await;
            return Err(AuthError::Rejected("the token has expired".into()));
        }
        if verdict.identity.is_err() && computed {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        }
        verdict.identity.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CacheSettings {
        CacheSettings {
            ttl: Duration::from_secs(30),
            negative_ttl: Duration::from_secs(5),
            max_bytes: 1 << 20,
        }
    }

    fn identity() -> Identity {
        Identity::service_account("demo", "provider")
    }

    #[test]
    fn a_positive_answer_never_outlives_its_token() {
        let now = SystemTime::now();
        let soon = Verdict {
            identity: Ok(identity()),
            expires: Some(now + Duration::from_secs(3)),
        };
        assert_eq!(lifetime(&settings(), &soon, now), Duration::from_secs(3));
        let later = Verdict {
            identity: Ok(identity()),
            expires: Some(now + Duration::from_secs(3600)),
        };
        assert_eq!(lifetime(&settings(), &later, now), Duration::from_secs(30));
        let expired = Verdict {
            identity: Ok(identity()),
            expires: Some(now - Duration::from_secs(1)),
        };
        assert_eq!(lifetime(&settings(), &expired, now), Duration::ZERO);
        assert_eq!(
            lifetime(&settings(), &rejected("no"), now),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn audiences_may_be_one_or_many() {
        let one: Claims =
            serde_json::from_value(serde_json::json!({"iss": "i", "aud": "a"})).unwrap();
        assert_eq!(one.aud, vec!["a"]);
        let many: Claims =
            serde_json::from_value(serde_json::json!({"iss": "i", "aud": ["a", "b"]})).unwrap();
        assert_eq!(many.aud, vec!["a", "b"]);
    }
}
