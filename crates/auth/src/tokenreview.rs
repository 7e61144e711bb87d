//! TokenReview: the API server's own answer on a bearer token, for tokens that cannot be
//! verified locally (see [`serviceaccount`](super::serviceaccount), which caches and paces it).
//! The identity is the service account's namespace and name; the pod a token is bound to comes
//! from the review's `extra` fields.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use tonic::metadata::MetadataMap;

use super::{AuthError, Identity};

/// The audience of projected tokens meant for the control plane.
pub const DUBBO_CA_AUDIENCE: &str = "dubbo-ca";
/// Longest wait for a TokenReview; a caller is told to retry rather than hang.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// Whom a token must be for, from `authorization-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Audience {
    /// `kubernetes` (the default): a token for the API server.
    ApiServer,
    /// `dubbo-ca-token`: a projected token with audience `dubbo-ca`.
    DubboCa,
}

impl Audience {
    pub fn of(metadata: &MetadataMap) -> Result<Audience, AuthError> {
        let kind = metadata
            .get("authorization-type")
            .map(|v| v.to_str().unwrap_or("?"));
        match kind {
            None | Some("kubernetes") => Ok(Audience::ApiServer),
            Some("dubbo-ca-token") => Ok(Audience::DubboCa),
            // Checked by the policy against the CA before any authenticator runs.
            Some("dubbo-jwt") => Err(AuthError::Unsupported(
                "authorization-type dubbo-jwt is checked by the CA, not by Kubernetes",
            )),
            Some(_) => Err(AuthError::Malformed(
                "authorization-type must be kubernetes, dubbo-ca-token or dubbo-jwt",
            )),
        }
    }

    fn name(self) -> Option<&'static str> {
        match self {
            Audience::ApiServer => None,
            Audience::DubboCa => Some(DUBBO_CA_AUDIENCE),
        }
    }
}

/// A positive review: the identity, and the pod (name, UID) the token is bound to.
#[derive(Debug)]
pub struct Reviewed {
    pub identity: Identity,
    pub pod_name_and_uid: Option<(String, Option<String>)>,
}

pub struct TokenReviewer {
    client: kube::Client,
}

impl TokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// The API server's answer: `Ok(Ok)` authenticated, `Ok(Err)` refused (a decided answer),
    /// `Err` no answer (retryable).
    pub async fn review(
        &self,
        token: &str,
        audience: Audience,
    ) -> Result<Result<Reviewed, AuthError>, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: audience.name().map(|a| vec![a.to_owned()]),
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
        Ok(decide(answer, audience))
    }
}

fn decide(answer: TokenReview, audience: Audience) -> Result<Reviewed, AuthError> {
    let status = answer.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        let reason = status
            .error
            .unwrap_or_else(|| "not authenticated".to_owned());
        return Err(AuthError::Rejected(reason));
    }
    if let Some(audience) = audience.name()
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
    let user = status.user.unwrap_or_default();
    let username = user.username.unwrap_or_default();
    let identity = service_account(&username)
        .ok_or_else(|| AuthError::Rejected(format!("{username:?} is not a service account")))?;
    let extra = user.extra.unwrap_or_default();
    let first = |key: &str| extra.get(key).and_then(|values| values.first()).cloned();
    Ok(Reviewed {
        identity,
        pod_name_and_uid: first(POD_NAME).map(|name| (name, first(POD_UID))),
    })
}

/// `system:serviceaccount:<namespace>:<name>` as an identity.
fn service_account(username: &str) -> Option<Identity> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    if namespace.is_empty() || name.is_empty() {
        return None;
    }
    Some(Identity::service_account(namespace, name))
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

    #[test]
    fn reviews_name_the_bound_pod() {
        let answer: TokenReview = serde_json::from_value(serde_json::json!({
            "spec": {},
            "status": {"authenticated": true, "audiences": ["dubbo-ca"], "user": {
                "username": "system:serviceaccount:demo:provider",
                "extra": {POD_NAME: ["p-1"], POD_UID: ["u-1"]}}}
        }))
        .unwrap();
        let reviewed = decide(answer.clone(), Audience::DubboCa).unwrap();
        assert_eq!(
            reviewed.pod_name_and_uid,
            Some(("p-1".into(), Some("u-1".into())))
        );
        let mut not_for_us = answer;
        if let Some(status) = not_for_us.status.as_mut() {
            status.audiences = Some(vec!["api".into()]);
        }
        assert!(decide(not_for_us, Audience::DubboCa).is_err());
    }
}
