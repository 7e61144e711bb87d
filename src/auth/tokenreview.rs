//! Kubernetes authentication: the bearer token is checked with a TokenReview (audience
//! `dubbo-ca` when `authorization-type: dubbo-ca-token`), and the identity is the service
//! account's namespace and name. Positive answers are cached briefly, so a start-up storm of
//! SDKs does not become a storm of TokenReviews.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;

use super::{AuthError, Authenticator, Identity, bearer_token};

/// The audience of projected tokens meant for the control plane.
pub const DUBBO_CA_AUDIENCE: &str = "dubbo-ca";
/// Cached identities at most; past this the cache starts afresh.
const MAX_CACHED: usize = 10_000;
/// Longest wait for a TokenReview; a caller is told to retry rather than hang.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// A token and the audience it was reviewed for.
type ReviewKey = (String, Option<&'static str>);

pub struct TokenReviewer {
    client: kube::Client,
    ttl: Duration,
    /// (token, audience) -> identity and when it was confirmed.
    cache: Mutex<HashMap<ReviewKey, (Identity, Instant)>>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, key: &ReviewKey) -> Option<Identity> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(key)
            .filter(|(_, at)| at.elapsed() < self.ttl)
            .map(|(identity, _)| identity.clone())
    }

    fn remember(&self, key: ReviewKey, identity: Identity) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(key, (identity, Instant::now()));
    }
}

/// `system:serviceaccount:<namespace>:<name>` as an identity.
fn service_account(username: &str) -> Option<Identity> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    if namespace.is_empty() || name.is_empty() {
        return None;
    }
    Some(Identity {
        namespace: namespace.to_owned(),
        name: format!("{namespace}/{name}"),
        pod: None,
    })
}

#[tonic::async_trait]
impl Authenticator for TokenReviewer {
    async fn authenticate(&self, metadata: &MetadataMap) -> Result<Identity, AuthError> {
        let token = bearer_token(metadata)?.to_owned();
        let kind = metadata
            .get("authorization-type")
            .map(|v| v.to_str().unwrap_or("?"));
        let audience = match kind {
            None | Some("kubernetes") => None,
            Some("dubbo-ca-token") => Some(DUBBO_CA_AUDIENCE),
            Some("dubbo-jwt") => {
                return Err(AuthError::Unsupported(
                    "authorization-type dubbo-jwt needs the control plane's CA, which this version does not run; use kubernetes or dubbo-ca-token",
                ));
            }
            Some(_) => {
                return Err(AuthError::Malformed(
                    "authorization-type must be kubernetes, dubbo-ca-token or dubbo-jwt",
                ));
            }
        };
        let key = (token, audience);
        if let Some(identity) = self.cached(&key) {
            return Ok(identity);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: key.0.clone(),
                audiences: audience.map(|a| vec![a.to_owned()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| {
                    AuthError::Unavailable(format!(
                        "no TokenReview answer within {REVIEW_TIMEOUT:?}"
                    ))
                })?
                .map_err(|err| AuthError::Unavailable(err.to_string()))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let reason = status
                .error
                .unwrap_or_else(|| "not authenticated".to_owned());
            return Err(AuthError::Rejected(reason));
        }
        if let Some(audience) = audience
            && !status
                .audiences
                .unwrap_or_default()
                .iter()
                .any(|a| a == audience)
        {
            return Err(AuthError::Rejected(format!(
                "the token is not for audience {audience}"
            )));
        }
        let username = status
            .user
            .and_then(|user| user.username)
            .unwrap_or_default();
        let identity = service_account(&username)
            .ok_or_else(|| AuthError::Rejected(format!("{username:?} is not a service account")))?;
        self.remember(key, identity.clone());
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_usernames() {
        let identity = service_account("system:serviceaccount:demo:provider");
        assert_eq!(
            identity.map(|i| (i.namespace, i.name)),
            Some(("demo".into(), "demo/provider".into()))
        );
        assert!(service_account("kubernetes-admin").is_none());
        assert!(service_account("system:serviceaccount:demo").is_none());
        assert!(service_account("system:serviceaccount::x").is_none());
    }
}
