//! Service-account tokens as the API server issues them: ES256 JWTs with the `kubernetes.io`
//! claims, signed by a key the fixture serves as its JWKS.
#![allow(dead_code)]
// Test helpers: a failure here is a broken test set-up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use super::apiserver::ISSUER;

pub struct Issuer {
    key: EncodingKey,
    pub kid: String,
    /// The public key as a JWKS document.
    pub jwks: Value,
}

/// What a token says.
pub struct Claims<'a> {
    pub namespace: &'a str,
    pub account: &'a str,
    /// The bound pod: (name, UID).
    pub pod: Option<(&'a str, &'a str)>,
    pub audiences: &'a [&'a str],
    /// Seconds from now until `exp` (negative: already expired).
    pub expires_in: i64,
    pub issuer: &'a str,
}

impl<'a> Claims<'a> {
    /// A token of `namespace/account` bound to `pod`, for the API server, valid for an hour.
    pub fn bound(namespace: &'a str, account: &'a str, pod: (&'a str, &'a str)) -> Self {
        Claims {
            namespace,
            account,
            pod: Some(pod),
            audiences: &[ISSUER],
            expires_in: 3600,
            issuer: ISSUER,
        }
    }
}

impl Issuer {
    pub fn new(kid: &str) -> Issuer {
        let pair = rcgen::KeyPair::generate().unwrap();
        let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
        let raw = pair.public_key_raw();
        assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
        let jwks = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&raw[33..65]),
        }]});
        Issuer {
            key,
            kid: kid.to_owned(),
            jwks,
        }
    }

    pub fn mint(&self, claims: &Claims<'_>) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut kubernetes = json!({
            "namespace": claims.namespace,
            "serviceaccount": {"name": claims.account, "uid": "sa-uid"},
        });
        if let Some((name, uid)) = claims.pod {
            kubernetes["pod"] = json!({"name": name, "uid": uid});
        }
        let body = json!({
            "iss": claims.issuer,
            "sub": format!("system:serviceaccount:{}:{}", claims.namespace, claims.account),
            "aud": claims.audiences,
            "iat": now - 10,
            "nbf": now - 10,
            "exp": now + claims.expires_in,
            "kubernetes.io": kubernetes,
        });
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &body, &self.key).unwrap()
    }
}

/// The API-server fixture serving `issuer`'s keys, with pod `demo/provider-1` (UID `uid-1`,
/// `app: provider`, 10.0.0.7) running.
pub async fn cluster_with_provider() -> (super::apiserver::ApiServer, Issuer) {
    let api = super::apiserver::ApiServer::start().await;
    let issuer = Issuer::new("key-1");
    api.set_jwks(issuer.jwks.clone());
    api.put_pod(
        "demo",
        "provider-1",
        "uid-1",
        json!({"app": "provider"}),
        &["10.0.0.7"],
    );
    (api, issuer)
}
