//! The TLS port: server certificate from files, optional client certificates whose SPIFFE URI
//! SAN is the caller's identity.
// Helpers are test code too; clippy.toml's allowance reaches only `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::{request, start, test_config};
use dubbo_cp::config::Config;
use dubbo_cp::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

struct Pki {
    ca_pem: String,
    server: (String, String),
    spiffe_client: (String, String),
    /// Signed by the same CA, for another trust domain.
    foreign_client: (String, String),
    plain_client: (String, String),
}

fn pki() -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |sans: Vec<SanType>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let uri = "spiffe://cluster.local/ns/demo/sa/provider"
        .try_into()
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server: leaf(vec![
            SanType::DnsName("localhost".try_into().unwrap()),
            SanType::IpAddress([127, 0, 0, 1].into()),
        ]),
        spiffe_client: leaf(vec![SanType::URI(uri)]),
        foreign_client: leaf(vec![SanType::URI(
            "spiffe://evil.example/ns/demo/sa/provider"
                .try_into()
                .unwrap(),
        )]),
        plain_client: leaf(vec![SanType::DnsName("client.example".try_into().unwrap())]),
    }
}

fn tls_config(dir: &Path, pki: &Pki) -> Config {
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        assert!(std::fs::write(&path, text).is_ok());
        path
    };
    let mut config = test_config(&dir.join("data"));
    config.tls.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    config.tls.cert_file = Some(write("server.pem", &pki.server.0));
    config.tls.key_file = Some(write("server.key", &pki.server.1));
    config.tls.client_ca_file = Some(write("ca.pem", &pki.ca_pem));
    // Tokens too, so a caller without a SPIFFE certificate is asked for one.
    config.auth.token_file = Some(write(
        "tokens.yaml",
        "tokens:\n  - token: t\n    namespace: other\n",
    ));
    config
}

async fn tls_client(
    addr: SocketAddr,
    pki: &Pki,
    identity: Option<&(String, String)>,
) -> ServiceNameMappingServiceClient<Channel> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let endpoint = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap();
    ServiceNameMappingServiceClient::new(endpoint.connect().await.unwrap())
}

#[tokio::test]
async fn spiffe_certificates_are_identities_on_the_tls_port() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let server = start(tls_config(dir.path(), &pki)).await;
    let tls_addr = server.tls_addr.expect("no TLS port");

    // A SPIFFE certificate for ns demo: may register in demo, not elsewhere.
    let mut spiffe = tls_client(tls_addr, &pki, Some(&pki.spiffe_client)).await;
    let ok = spiffe
        .register_service_app_mapping(request("demo", "app", &["I"]))
        .await;
    assert!(ok.map(|r| r.into_inner().success).unwrap_or(false));
    let denied = spiffe
        .register_service_app_mapping(request("other", "app", &["I"]))
        .await;
    assert_eq!(denied.err().map(|s| s.code()), Some(Code::PermissionDenied));

    // The same CA, a foreign trust domain: refused, although the namespace matches.
    let mut foreign = tls_client(tls_addr, &pki, Some(&pki.foreign_client)).await;
    let refused = foreign
        .register_service_app_mapping(request("demo", "app", &["I"]))
        .await
        .err();
    assert_eq!(
        refused.as_ref().map(|s| s.code()),
        Some(Code::Unauthenticated)
    );
    assert!(
        refused.is_some_and(|s| s.message().contains("evil.example")),
        "the refusal names the trust domain"
    );

    // A certificate without a SPIFFE ID, and no certificate: not an identity; no token either.
    for identity in [Some(&pki.plain_client), None] {
        let mut client = tls_client(tls_addr, &pki, identity).await;
        let refused = client
            .register_service_app_mapping(request("demo", "app", &["I"]))
            .await;
        assert_eq!(refused.err().map(|s| s.code()), Some(Code::Unauthenticated));
    }
    // The plain port never sees certificates.
    let mut plain = common::client(server.grpc_addr).await;
    let refused = plain
        .register_service_app_mapping(request("demo", "app", &["I"]))
        .await;
    assert_eq!(refused.err().map(|s| s.code()), Some(Code::Unauthenticated));
    assert!(server.stop().await.is_ok());
}
