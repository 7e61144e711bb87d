//! The certificate authority, through a gRPC client generated from ca.proto on its own (it
//! shares no types with the server): both RPCs issue to the caller's identity whatever the CSR
//! asks, the chain verifies against `trust_certs`, the token verifies with
//! `trusted_token_public_keys` and works as `dubbo-jwt`; bad CSRs get `success: false`; the
//! Secret, the ConfigMaps and rotation in Kubernetes mode; the root, rotation and the TLS port
//! in standalone mode.

// Tests and their helpers: a failure is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod independent {
    #![allow(clippy::all, clippy::pedantic, dead_code, missing_docs)]
    include!(concat!(
        env!("OUT_DIR"),
        "/independent/org.apache.dubbo.auth.v1alpha1.rs"
    ));
}

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use common::apiserver::ApiServer;
use common::sa_tokens::{Claims, Issuer};
use common::{
    Observer, SNP_TYPE, channel, http_get, http_send, metric, request, start, test_config,
    wait_ready,
};
use dubbo_cp::config::Config;
use independent::authority_service_client::AuthorityServiceClient;
use independent::dubbo_certificate_service_client::DubboCertificateServiceClient;
use independent::{DubboCertificateRequest, IdentityRequest};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rcgen::{CertificateParams, KeyPair, SanType};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const SPIFFE: &str = "spiffe://cluster.local/ns/demo/sa/provider";
const POD_UID: &str = "pod-uid-1";

/// A CSR asking for names we must not give, and its key.
fn csr(alg: &'static rcgen::SignatureAlgorithm) -> (String, KeyPair) {
    let key = KeyPair::generate_for(alg).unwrap();
    let mut params = CertificateParams::new(vec!["evil.example".to_owned()]).unwrap();
    params.subject_alt_names.push(SanType::URI(
        "spiffe://evil.example/ns/kube-system/sa/admin"
            .try_into()
            .unwrap(),
    ));
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    (pem, key)
}

fn p256_csr() -> (String, KeyPair) {
    csr(&rcgen::PKCS_ECDSA_P256_SHA256)
}

fn authorized<T>(message: T, token: &str, kind: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
    metadata.insert("authorization-type", kind.parse().unwrap());
    request
}

/// `CreateIdentity` as an SDK sends it; failures are answered with gRPC OK.
async fn create_identity(
    client: &mut AuthorityServiceClient<Channel>,
    csr: String,
    token: &str,
    kind: &str,
) -> independent::IdentityResponse {
    let request = IdentityRequest {
        csr,
        r#type: "CONNECTION".into(),
        metadata: None,
    };
    client
        .create_identity(authorized(request, token, kind))
        .await
        .expect("failures are answered with gRPC OK")
        .into_inner()
}

fn der_of(pem_text: &str) -> Vec<u8> {
    pem::parse(pem_text).unwrap().into_contents()
}

/// The URI SANs of a certificate.
fn uris(cert_pem: &str) -> Vec<String> {
    common::uri_sans(&der_of(cert_pem))
}

/// Whether `cert_pem` is signed by one of `roots`.
fn chains_to(cert_pem: &str, roots: &[String]) -> bool {
    let der = der_of(cert_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    roots.iter().any(|root| {
        let root_der = der_of(root);
        let (_, root) = x509_parser::parse_x509_certificate(&root_der).unwrap();
        cert.issuer() == root.subject() && cert.verify_signature(Some(root.public_key())).is_ok()
    })
}

/// (notBefore, notAfter) in unix seconds, and the subject's CN.
fn validity(cert_pem: &str) -> (i64, i64, String) {
    let der = der_of(cert_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
        cn,
    )
}

/// An `EC PUBLIC KEY` PEM (SubjectPublicKeyInfo) as a key jsonwebtoken can verify with.
fn token_key(pem_text: &str) -> DecodingKey {
    let block = pem::parse(pem_text).unwrap();
    assert_eq!(block.tag(), "EC PUBLIC KEY");
    let (_, spki) = <x509_parser::x509::SubjectPublicKeyInfo as x509_parser::prelude::FromDer<
        '_,
        x509_parser::error::X509Error,
    >>::from_der(block.contents())
    .unwrap();
    DecodingKey::from_ec_der(&spki.subject_public_key.data)
}

#[derive(serde::Deserialize, serde::Serialize)]
struct JwtClaims {
    iss: String,
    sub: String,
    exp: i64,
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn jwt(key: &EncodingKey, sub: &str, exp: i64) -> String {
    let claims = JwtClaims {
        iss: "dubbo-authority".into(),
        sub: sub.into(),
        exp,
    };
    jsonwebtoken::encode(&Header::new(Algorithm::ES256), &claims, key).unwrap()
}

async fn register_with(addr: SocketAddr, token: &str, kind: &str) -> Result<bool, tonic::Status> {
    common::client(addr)
        .await
        .register_service_app_mapping(authorized(request("demo", "app", &["I"]), token, kind))
        .await
        .map(|r| r.into_inner().success)
}

/// A TLS channel trusting only `roots`, presenting `identity` when given.
async fn tls_channel(
    addr: SocketAddr,
    roots: &[String],
    identity: Option<(&str, &str)>,
) -> Channel {
    let mut tls = ClientTlsConfig::new().domain_name("localhost");
    for root in roots {
        tls = tls.ca_certificate(Certificate::from_pem(root));
    }
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("TLS connection refused")
}

/// Kubernetes mode; without `authenticate` the admin API answers loopback callers.
fn k8s_config(dir: &std::path::Path, api: &ApiServer, authenticate: bool) -> Config {
    let mut config = common::kubernetes_config(dir, api.url());
    config.auth.token_review = Some(authenticate);
    config
}

async fn ca_view(admin: SocketAddr) -> Value {
    let (status, body) = http_get(admin, "/api/v1/ca").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn fingerprints(view: &Value) -> Vec<String> {
    view["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["fingerprint"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_rpcs_issue_to_the_caller_and_the_token_is_an_identity() {
    let api = ApiServer::start().await;
    let issuer = Issuer::new("key-1");
    api.set_jwks(issuer.jwks.clone());
    api.put_pod(
        "demo",
        "provider-0",
        POD_UID,
        json!({"app": "provider"}),
        &["10.0.0.5"],
    );
    api.put_pod(
        "demo",
        "provider-1",
        "pod-uid-2",
        json!({"app": "provider"}),
        &["10.0.0.6"],
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = k8s_config(dir.path(), &api, true);
    config.ca.cert_validity = Duration::from_secs(2 * 3600);
    config.ca.issues_per_second = 0.001;
    config.ca.issue_burst = 16;
    let server = start(config).await;
    let ca_token = issuer.mint(&Claims {
        audiences: &["dubbo-ca"],
        ..Claims::bound("demo", "provider", ("provider-0", POD_UID))
    });

    // CreateIdentity on the plain port, with the token injected pods send.
    let (csr_pem, key) = p256_csr();
    let mut authority = AuthorityServiceClient::new(channel(server.grpc_addr).await);
    let asked_at = now();
    let identity =
        create_identity(&mut authority, csr_pem.clone(), &ca_token, "dubbo-ca-token").await;
    assert!(identity.success, "{}", identity.message);
    assert_eq!(
        uris(&identity.cert_pem),
        [SPIFFE],
        "only the caller's SPIFFE ID"
    );
    assert!(chains_to(&identity.cert_pem, &identity.trust_certs));
    let (not_before, not_after, cn) = validity(&identity.cert_pem);
    assert_eq!(cn, POD_UID, "CN is the pod's UID");
    assert_eq!(
        not_after - not_before,
        2 * 3600 + 60,
        "as configured, from a minute ago"
    );
    assert!((not_after - asked_at - 2 * 3600).abs() <= 2);
    assert_eq!(identity.expire_time, not_after * 1000, "unix milliseconds");
    assert!(
        (identity.refresh_time / 1000 - (asked_at + 3600)).abs() <= 2,
        "half-way"
    );
    // The token verifies with the published keys and names the caller.
    let mut validation = Validation::new(Algorithm::ES256);
    validation.validate_aud = false;
    validation.set_issuer(&["dubbo-authority"]);
    let keys = &identity.trusted_token_public_keys;
    assert_eq!(keys.len(), identity.trust_certs.len());
    let claims =
        jsonwebtoken::decode::<JwtClaims>(&identity.token, &token_key(&keys[0]), &validation)
            .unwrap()
            .claims;
    assert_eq!(
        (claims.iss.as_str(), claims.sub.as_str()),
        ("dubbo-authority", SPIFFE)
    );
    assert_eq!(claims.exp, not_after);

    // CreateCertificate on the TLS port: a client trusting only the CA's root connects.
    let tls_addr = server
        .tls_addr
        .expect("the TLS port serves a CA certificate");
    let tls = tls_channel(tls_addr, &identity.trust_certs, None).await;
    let (csr_384, _) = csr(&rcgen::PKCS_ECDSA_P384_SHA384);
    let certificate = DubboCertificateServiceClient::new(tls.clone())
        .create_certificate(authorized(
            DubboCertificateRequest {
                csr: csr_384,
                r#type: "CONNECTION".into(),
                metadata: None,
            },
            &ca_token,
            "dubbo-ca-token",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(certificate.success, "{}", certificate.message);
    assert_eq!(uris(&certificate.cert_pem), [SPIFFE]);
    assert!(chains_to(&certificate.cert_pem, &certificate.trust_certs));
    // The issued certificate is an identity on the TLS port (mTLS, no token).
    let mtls = tls_channel(
        tls_addr,
        &identity.trust_certs,
        Some((&identity.cert_pem, &key.serialize_pem())),
    )
    .await;
    let mut registration =
        dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient::new(mtls.clone());
    assert!(
        registration
            .register_service_app_mapping(request("demo", "app", &["I"]))
            .await
            .unwrap()
            .into_inner()
            .success
    );
    let elsewhere = registration
        .register_service_app_mapping(request("other", "app", &["I"]))
        .await;
    assert_eq!(
        elsewhere.err().map(|s| s.code()),
        Some(Code::PermissionDenied)
    );

    // The token is a dubbo-jwt identity for registrations and streams.
    wait_ready(server.admin_addr).await;
    assert_eq!(
        register_with(server.grpc_addr, &identity.token, "dubbo-jwt")
            .await
            .map_err(|s| s.to_string()),
        Ok(true)
    );
    let jwt_metadata = [
        ("authorization", format!("Bearer {}", identity.token)),
        ("authorization-type", "dubbo-jwt".to_owned()),
    ];
    let metadata: Vec<(&'static str, &str)> =
        jwt_metadata.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut observer = Observer::connect_with(channel(server.grpc_addr).await, &metadata)
        .await
        .unwrap();
    observer.subscribe(SNP_TYPE).await;
    assert_eq!(observer.next().await.r#type, SNP_TYPE);
    // Expired (signed with the real CA key, read from the Secret) and foreign-signed: refused.
    let secret = api
        .object("secrets", "dubbo-system", "dubbo-ca-secret")
        .unwrap();
    let ca_key = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["pri.pem"].as_str().unwrap())
        .unwrap();
    let ca_key = EncodingKey::from_ec_pem(&ca_key).unwrap();
    let fresh = jwt(&ca_key, SPIFFE, now() + 600);
    assert_eq!(
        register_with(server.grpc_addr, &fresh, "dubbo-jwt")
            .await
            .map_err(|s| s.to_string()),
        Ok(true),
        "the control case"
    );
    let expired = jwt(&ca_key, SPIFFE, now() - 600);
    let foreign_key = KeyPair::generate().unwrap();
    let foreign = jwt(
        &EncodingKey::from_ec_pem(foreign_key.serialize_pem().as_bytes()).unwrap(),
        SPIFFE,
        now() + 600,
    );
    for (token, why) in [(&expired, "xpired"), (&foreign, "signature")] {
        let refused = register_with(server.grpc_addr, token, "dubbo-jwt")
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated);
        assert!(refused.message().contains(why), "{}", refused.message());
        let metadata = [
            ("authorization", format!("Bearer {token}")),
            ("authorization-type", "dubbo-jwt".to_owned()),
        ];
        let metadata: Vec<(&'static str, &str)> =
            metadata.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let stream = Observer::connect_with(channel(server.grpc_addr).await, &metadata).await;
        assert_eq!(stream.err().map(|s| s.code()), Some(Code::Unauthenticated));
    }

    // Bad CSRs and bad callers: gRPC OK, success false, a message saying why.
    let mut tampered = der_of(&p256_csr().0);
    let at = tampered.len() - 3;
    tampered[at] ^= 0x55;
    let tampered = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", tampered));
    let cases = [
        (String::new(), ca_token.clone(), "empty"),
        (
            "-----BEGIN CERTIFICATE REQUEST-----\nnot base64\n-----END CERTIFICATE REQUEST-----\n"
                .to_owned(),
            ca_token.clone(),
            "parse",
        ),
        (
            identity.trust_certs[0].clone(),
            ca_token.clone(),
            "CERTIFICATE REQUEST",
        ),
        (tampered, ca_token.clone(), "signature"),
        (
            csr(&rcgen::PKCS_ED25519).0,
            ca_token.clone(),
            "not supported",
        ),
        // openssl req -new -newkey rsa:1024 (tests/data): too small.
        (
            include_str!("data/rsa1024.csr").to_owned(),
            ca_token.clone(),
            "RSA 1024 bits",
        ),
        (
            format!("{}{}", "x".repeat(20_000), p256_csr().0),
            ca_token.clone(),
            "larger than",
        ),
        (p256_csr().0, "garbage".to_owned(), "unauthenticated"),
    ];
    for (csr_pem, token, why) in cases {
        let answer = create_identity(&mut authority, csr_pem, &token, "dubbo-ca-token").await;
        assert!(!answer.success);
        assert!(answer.message.contains(why), "{why}: {}", answer.message);
        assert!(answer.cert_pem.is_empty());
    }
    // RSA of 2048 bits (the Java SDK's fallback): issued, for our identity.
    let rsa = create_identity(
        &mut authority,
        include_str!("data/rsa2048.csr").to_owned(),
        &ca_token,
        "dubbo-ca-token",
    )
    .await;
    assert!(rsa.success, "{}", rsa.message);
    assert_eq!(uris(&rsa.cert_pem), [SPIFFE]);
    // A token we issued renews, but never past its own expiry (a stolen one dies with it).
    let renewed = create_identity(&mut authority, p256_csr().0, &fresh, "dubbo-jwt").await;
    assert!(renewed.success, "{}", renewed.message);
    let (_, renewed_until, _) = validity(&renewed.cert_pem);
    assert!(
        renewed_until <= now() + 600,
        "capped at the token's exp, not 2 h"
    );
    let no_token = DubboCertificateServiceClient::new(channel(server.grpc_addr).await)
        .create_certificate(DubboCertificateRequest {
            csr: p256_csr().0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !no_token.success && no_token.message.contains("unauthenticated"),
        "{}",
        no_token.message
    );
    let admin = server.admin_addr;
    for (result, at_least) in [
        ("issued", 4.0),
        ("bad_csr", 4.0),
        ("bad_signature", 1.0),
        ("unsupported_key", 2.0),
        ("unauthenticated", 2.0),
    ] {
        let total = metric(admin, &format!("dubbo_cp_ca_certificates_total{{rpc=\"CreateIdentity\",result=\"{result}\"}}")).await
            + metric(admin, &format!("dubbo_cp_ca_certificates_total{{rpc=\"CreateCertificate\",result=\"{result}\"}}")).await;
        assert!(total >= at_least, "{result}: {total}");
    }

    // One pod's storm is cut off; another pod of the same service account is still served.
    let mut limited = None;
    for _ in 0..20 {
        let answer =
            create_identity(&mut authority, p256_csr().0, &ca_token, "dubbo-ca-token").await;
        if !answer.success {
            limited = Some(answer.message);
            break;
        }
    }
    assert!(limited.is_some_and(|m| m.contains("rate limited")));
    let other_pod = issuer.mint(&Claims {
        audiences: &["dubbo-ca"],
        ..Claims::bound("demo", "provider", ("provider-1", "pod-uid-2"))
    });
    let answer = create_identity(&mut authority, p256_csr().0, &other_pod, "dubbo-ca-token").await;
    assert!(answer.success, "{}", answer.message);
    assert!(
        metric(
            admin,
            "dubbo_cp_ca_certificates_total{rpc=\"CreateIdentity\",result=\"rate_limited\"}"
        )
        .await
            >= 1.0
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_root_published_in_every_namespace_and_rotation_reaches_both() {
    let api = ApiServer::start().await;
    for namespace in ["default", "demo", "kube-system"] {
        api.create_namespace(namespace);
    }
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = tokio::join!(
        start(k8s_config(dir_a.path(), &api, false)),
        start(k8s_config(dir_b.path(), &api, false))
    );
    assert_eq!(
        api.core_writes("secrets", "dubbo-system", "dubbo-ca-secret"),
        1,
        "created once although both started together"
    );
    let root = fingerprints(&ca_view(a.admin_addr).await);
    assert_eq!(root.len(), 1);
    assert_eq!(
        fingerprints(&ca_view(b.admin_addr).await),
        root,
        "the loser reads the winner's"
    );
    let secret = api
        .object("secrets", "dubbo-system", "dubbo-ca-secret")
        .unwrap();
    let root_pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["cert.pem"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();

    let published = |namespace: &str| {
        api.object("configmaps", namespace, "dubbo-ca-cert")
            .and_then(|cm| cm["data"]["ca.crt"].as_str().map(str::to_owned))
    };
    let wait = Duration::from_secs(20);
    api.wait_for("ConfigMaps in default and demo", wait, |_| {
        published("default").as_deref() == Some(root_pem.as_str())
            && published("demo").as_deref() == Some(root_pem.as_str())
    })
    .await;
    assert_eq!(published("kube-system"), None, "never in kube-system");
    // A namespace created later gets it; a deleted or edited one is repaired.
    api.create_namespace("later");
    api.wait_for("ConfigMap in a new namespace", wait, |_| {
        published("later").is_some()
    })
    .await;
    assert!(api.delete_object("configmaps", "demo", "dubbo-ca-cert"));
    api.wait_for("deleted ConfigMap repaired", wait, |_| {
        published("demo").is_some()
    })
    .await;
    let mut edited = api
        .object("configmaps", "default", "dubbo-ca-cert")
        .unwrap();
    edited["data"]["ca.crt"] = json!("tampered");
    edited["data"]["extra"] = json!("kept");
    api.put_object("configmaps", "default", "dubbo-ca-cert", edited);
    api.wait_for("edited ConfigMap repaired", wait, |_| {
        published("default").as_deref() == Some(root_pem.as_str())
    })
    .await;
    assert_eq!(
        api.object("configmaps", "default", "dubbo-ca-cert")
            .unwrap()["data"]["extra"],
        "kept",
        "keys an operator added stay"
    );

    // Rotation on one replica: the other follows the Secret; every ConfigMap trusts both.
    let (status, body) = http_send(a.admin_addr, "POST", "/api/v1/ca/rotate", "", None).await;
    assert_eq!(status, 200, "{body}");
    let rotated = fingerprints(&ca_view(a.admin_addr).await);
    assert_eq!(rotated.len(), 2);
    assert_eq!(
        rotated[1], root[0],
        "the old root is retiring, still trusted"
    );
    let deadline = tokio::time::Instant::now() + wait;
    while fingerprints(&ca_view(b.admin_addr).await) != rotated {
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica b never saw the rotation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    api.wait_for("ConfigMaps with both roots", wait, |_| {
        ["default", "demo", "later"].iter().all(|ns| {
            published(ns).is_some_and(|crt| {
                crt.matches("BEGIN CERTIFICATE").count() == 2 && crt.contains(root_pem.trim())
            })
        })
    })
    .await;
    // Both replicas rotate at once: one wins the Secret, the other is told and takes it; they
    // end on the same roots.
    let ((a_status, _), (b_status, _)) = tokio::join!(
        http_send(a.admin_addr, "POST", "/api/v1/ca/rotate", "", None),
        http_send(b.admin_addr, "POST", "/api/v1/ca/rotate", "", None)
    );
    assert!(a_status == 200 || b_status == 200, "{a_status} {b_status}");
    let deadline = tokio::time::Instant::now() + wait;
    let rotated = loop {
        let (va, vb) = (
            fingerprints(&ca_view(a.admin_addr).await),
            fingerprints(&ca_view(b.admin_addr).await),
        );
        if va == vb && va[0] != rotated[0] {
            break va;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replicas diverged: {va:?} {vb:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        rotated.contains(&root[0]),
        "the first root is still trusted: {rotated:?}"
    );
    // The Secret is deleted: it is written back with the roots being served.
    assert!(api.delete_object("secrets", "dubbo-system", "dubbo-ca-secret"));
    api.wait_for("Secret recreated", wait, |api| {
        api.object("secrets", "dubbo-system", "dubbo-ca-secret")
            .is_some()
    })
    .await;
    assert_eq!(fingerprints(&ca_view(a.admin_addr).await), rotated);
    assert!(a.stop().await.is_ok());
    assert!(b.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_root_is_used_as_is() {
    // The operator's root: a Secret of the same shape, key in SEC1 as Go writes it.
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "operator root");
    let cert = params.self_signed(&key).unwrap();
    let api = ApiServer::start().await;
    api.create_namespace("demo");
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    api.put_object(
        "secrets",
        "dubbo-system",
        "dubbo-ca-secret",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "dubbo-ca-secret"},
               "data": {"cert.pem": b64(&cert.pem()), "pri.pem": b64(&key.serialize_pem())}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = start(k8s_config(dir.path(), &api, false)).await;
    let view = ca_view(server.admin_addr).await;
    assert_eq!(view["managed"], false);
    assert_eq!(view["roots"][0]["subject"], "CN=operator root");
    let (status, body) = http_send(server.admin_addr, "POST", "/api/v1/ca/rotate", "", None).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("operator"), "{body}");
    assert_eq!(
        api.core_writes("secrets", "dubbo-system", "dubbo-ca-secret"),
        0,
        "never written"
    );
    api.wait_for(
        "the operator's root published",
        Duration::from_secs(20),
        |api| {
            api.object("configmaps", "demo", "dubbo-ca-cert")
                .is_some_and(|cm| cm["data"]["ca.crt"] == cert.pem())
        },
    )
    .await;
    // Issued certificates chain to it (admin issue: no Kubernetes identity needed here).
    let issue = json!({"csr": p256_csr().0, "spiffeId": SPIFFE}).to_string();
    let (status, body) =
        http_send(server.admin_addr, "POST", "/api/v1/ca/issue", &issue, None).await;
    assert_eq!(status, 200, "{body}");
    let issued: Value = serde_json::from_str(&body).unwrap();
    assert!(chains_to(
        issued["certPem"].as_str().unwrap(),
        &[cert.pem()]
    ));
    assert!(server.stop().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_root_is_private_persistent_and_rotates_with_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.ca.cert_validity = Duration::from_secs(2);
    config.ca.root_validity = Duration::from_secs(30 * 86_400);
    let server = start(config.clone()).await;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("dubbo-cp.db"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the database holds the CA key");
    }
    let first = fingerprints(&ca_view(server.admin_addr).await);
    assert_eq!(first.len(), 1);

    let issue = json!({"csr": p256_csr().0, "spiffeId": SPIFFE}).to_string();
    let (status, body) = http_send(
        server.admin_addr,
        "POST",
        "/api/v1/ca/issue",
        &json!({"csr": "x", "spiffeId": SPIFFE}).to_string(),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("csr"), "{body}");

    // A stream open on the TLS port before the rotation (which re-issues the port's
    // certificate) keeps flowing after it: renewal drops no connection.
    let first_root: Vec<String> =
        serde_json::from_value(issued_trust(&server, &issue).await).unwrap();
    let mut observer =
        Observer::connect(tls_channel(server.tls_addr.unwrap(), &first_root, None).await)
            .await
            .unwrap();
    observer.subscribe(SNP_TYPE).await;
    let before = observer.next().await;
    observer.ack(&before).await;

    // Rotation: issuing switches at once, both roots trusted, and it survives a restart.
    let (status, body) = http_send(server.admin_addr, "POST", "/api/v1/ca/rotate", "", None).await;
    assert_eq!(status, 200, "{body}");
    // The port's certificate now comes from the new root, with the new root cross-signed by
    // the old one: clients trusting only the old root or only the new one both connect.
    let both: Vec<String> = serde_json::from_value(issued_trust(&server, &issue).await).unwrap();
    assert_eq!(both.len(), 2);
    tls_channel(server.tls_addr.unwrap(), &both[..1], None).await;
    tls_channel(server.tls_addr.unwrap(), &first_root, None).await;
    let mut sdk = common::client(server.grpc_addr).await;
    assert!(
        sdk.register_service_app_mapping(request("demo", "after-rotation", &["I"]))
            .await
            .unwrap()
            .into_inner()
            .success
    );
    let after = observer.next().await;
    assert!(
        after.revision > before.revision,
        "the open stream still receives"
    );
    let rotated = fingerprints(&ca_view(server.admin_addr).await);
    assert_eq!((rotated.len(), rotated[1].as_str()), (2, first[0].as_str()));
    assert!(server.stop().await.is_ok());
    let server = start(config).await;
    assert_eq!(
        fingerprints(&ca_view(server.admin_addr).await),
        rotated,
        "persisted"
    );
    // The TLS port now serves a certificate of the new root: a client trusting only it connects.
    let view = ca_view(server.admin_addr).await;
    let (status, body) =
        http_send(server.admin_addr, "POST", "/api/v1/ca/issue", &issue, None).await;
    assert_eq!(status, 200, "{body}");
    let issued: Value = serde_json::from_str(&body).unwrap();
    let trust: Vec<String> = serde_json::from_value(issued["trustCerts"].clone()).unwrap();
    assert_eq!(trust.len(), 2);
    tls_channel(server.tls_addr.unwrap(), &trust[..1], None).await;
    // The old root is dropped once every certificate it issued has expired (2 s + slack).
    let drop_after =
        humantime::parse_rfc3339(view["roots"][1]["dropAfter"].as_str().unwrap()).unwrap();
    assert!(drop_after <= SystemTime::now() + Duration::from_secs(70));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while fingerprints(&ca_view(server.admin_addr).await).len() == 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old root was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(SystemTime::now() >= drop_after, "not before its drop time");
    assert_eq!(
        fingerprints(&ca_view(server.admin_addr).await),
        rotated[..1]
    );
    assert!(server.stop().await.is_ok());
}

#[tokio::test]
async fn operator_root_files_are_used_and_never_rotated() {
    let dir = tempfile::tempdir().unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let cert_file = dir.path().join("ca.pem");
    let key_file = dir.path().join("ca.key");
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let mut config = test_config(&dir.path().join("data"));
    config.ca.cert_file = Some(cert_file.clone());
    config.ca.key_file = Some(key_file);
    let server = start(config.clone()).await;
    let view = ca_view(server.admin_addr).await;
    assert_eq!(view["managed"], false);
    let (status, body) = http_send(server.admin_addr, "POST", "/api/v1/ca/rotate", "", None).await;
    assert_eq!((status, body.contains("--ca-cert")), (409, true), "{body}");
    // An admin issues a certificate by hand; it authenticates its holder on the TLS port,
    // whose own certificate a client trusting only the operator's root accepts.
    let (csr_pem, client_key) = p256_csr();
    let issue = json!({"csr": csr_pem, "spiffeId": SPIFFE}).to_string();
    let (status, body) =
        http_send(server.admin_addr, "POST", "/api/v1/ca/issue", &issue, None).await;
    assert_eq!(status, 200, "{body}");
    let issued: Value = serde_json::from_str(&body).unwrap();
    let cert_pem = issued["certPem"].as_str().unwrap();
    assert_eq!(uris(cert_pem), [SPIFFE]);
    assert!(chains_to(cert_pem, &[cert.pem()]));
    let mtls = tls_channel(
        server.tls_addr.unwrap(),
        &[cert.pem()],
        Some((cert_pem, &client_key.serialize_pem())),
    )
    .await;
    let answer = dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient::new(mtls)
        .register_service_app_mapping(request("demo", "app", &["I"]))
        .await;
    assert!(
        answer.unwrap().into_inner().success,
        "the certificate is the identity"
    );
    assert!(server.stop().await.is_ok());
    // A key that is not the certificate's: the start fails and says so.
    let other = KeyPair::generate().unwrap();
    std::fs::write(dir.path().join("other.key"), other.serialize_pem()).unwrap();
    config.ca.key_file = Some(dir.path().join("other.key"));
    let err = dubbo_cp::server::start(config).await.err().unwrap();
    assert!(format!("{err:#}").contains("does not belong"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_at_start_waits_for_the_secret_or_serves_the_cached_roots() {
    let api = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // First start ever, API server down: the control plane serves, the CA waits.
    api.set_down(true);
    let server = start(k8s_config(dir.path(), &api, false)).await;
    let (status, body) = http_get(server.admin_addr, "/api/v1/ca").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not loaded"), "{body}");
    api.set_down(false);
    api.wait_for(
        "the Secret created once the API server is back",
        Duration::from_secs(30),
        |api| {
            api.object("secrets", "dubbo-system", "dubbo-ca-secret")
                .is_some()
        },
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while http_get(server.admin_addr, "/api/v1/ca").await.0 != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the CA never loaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let roots = fingerprints(&ca_view(server.admin_addr).await);
    assert!(server.stop().await.is_ok());
    // Restarted inside an outage: the roots read before are served from the data directory.
    api.set_down(true);
    let server = start(k8s_config(dir.path(), &api, false)).await;
    assert_eq!(fingerprints(&ca_view(server.admin_addr).await), roots);
    let trust = vec![api_root_pem(&api)];
    tls_channel(server.tls_addr.unwrap(), &trust, None).await;
    api.set_down(false);
    assert!(server.stop().await.is_ok());
}

fn api_root_pem(api: &ApiServer) -> String {
    let secret = api
        .object("secrets", "dubbo-system", "dubbo-ca-secret")
        .unwrap();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["cert.pem"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap()
}

/// The `trustCerts` of an admin-issued certificate.
async fn issued_trust(server: &dubbo_cp::server::RunningServer, issue: &str) -> Value {
    let (status, body) =
        http_send(server.admin_addr, "POST", "/api/v1/ca/issue", issue, None).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["trustCerts"].clone()
}

#[tokio::test]
async fn standalone_token_file_identities_with_a_service_account_get_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        "tokens:\n  - token: sdk\n    namespace: demo\n    serviceAccount: provider\n  - token: plain\n    namespace: demo\n",
    )
    .unwrap();
    let mut config = test_config(&dir.path().join("data"));
    config.auth.token_file = Some(tokens);
    let server = start(config).await;
    let mut client = DubboCertificateServiceClient::new(channel(server.grpc_addr).await);
    let ask = |token: &str| {
        let mut request = tonic::Request::new(DubboCertificateRequest {
            csr: p256_csr().0,
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        request
    };
    let issued = client
        .create_certificate(ask("sdk"))
        .await
        .unwrap()
        .into_inner();
    assert!(issued.success, "{}", issued.message);
    assert_eq!(uris(&issued.cert_pem), [SPIFFE]);
    let refused = client
        .create_certificate(ask("plain"))
        .await
        .unwrap()
        .into_inner();
    assert!(!refused.success);
    assert!(
        refused.message.contains("not a service account"),
        "{}",
        refused.message
    );
    assert!(server.stop().await.is_ok());
}
