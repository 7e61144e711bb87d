//! A Canary's metric read through a MetricTemplate from a Prometheus behind https and basic auth:
//! the template's query with its variables, the Secret's credentials, a CA bundle from
//! `canary.caFile`. The Prometheus is a stub (its answers are the test's to set); the API server
//! is the fixture, with the test playing the Deployment controller and kubelet.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::apiserver::ApiServer;
use common::{start, wait_ready};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "test";
const WAIT: Duration = Duration::from_secs(30);

/// What the stub was asked: (Authorization header, request line).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A CA and a server certificate for 127.0.0.1 it signed: (CA PEM, certificate chain, key).
fn certificates() -> (String, rustls::pki_types::CertificateDer<'static>, Vec<u8>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = server.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.der().clone(), key.serialize_der())
}

/// An https "Prometheus" answering every query with `success` once the request carries
/// `authorization`, and 401 otherwise; one request per connection.
async fn prometheus(authorization: String, success: f64, seen: Seen) -> (SocketAddr, String) {
    let (ca, cert, key) = certificates();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let (authorization, seen) = (authorization.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).into_owned();
                let line = text.lines().next().unwrap_or_default().to_owned();
                let given = text
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("authorization: ")
                            .or_else(|| l.strip_prefix("Authorization: "))
                    })
                    .unwrap_or_default()
                    .to_owned();
                let (status, body) = if given == authorization {
                    let value = json!([1_700_000_000.0, success.to_string()]);
                    let result = json!([{"metric": {}, "value": value}]);
                    (
                        "200 OK",
                        json!({"status": "success", "data": {"resultType": "vector", "result": result}}),
                    )
                } else {
                    (
                        "401 Unauthorized",
                        json!({"status": "error", "error": "unauthorized"}),
                    )
                };
                seen.lock().unwrap().push((given, line));
                let body = body.to_string();
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, ca)
}

/// Plays the Deployment controller and the kubelet every 20 ms.
fn kubelet(api: &ApiServer) {
    let api = api.clone();
    tokio::spawn(async move {
        loop {
            api.roll_out_changed(NS, |name| {
                if name.ends_with("-primary") {
                    "10.1.0."
                } else {
                    "10.0.0."
                }
                .to_owned()
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

fn secret(password: &str) -> Value {
    use base64::Engine;
    let encode = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": "prom-auth", "namespace": NS},
           "data": {"username": encode("admin"), "password": encode(password)}})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_metric_is_read_over_https_with_the_secrets_credentials() {
    let seen: Seen = Arc::default();
    let (prometheus, ca) =
        prometheus("Basic YWRtaW46czNjcmV0".to_owned(), 100.0, seen.clone()).await;
    let api = ApiServer::start().await;
    api.create_namespace(NS);
    api.put_deployment(NS, "podinfo", 2, "podinfo:1");
    kubelet(&api);
    api.put_object("secrets", NS, "prom-auth", secret("s3cret"));
    api.put_object(
        "metrictemplates",
        NS,
        "success",
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "MetricTemplate",
               "metadata": {"name": "success", "namespace": NS},
               "spec": {"provider": {"type": "prometheus",
                                     "address": format!("https://127.0.0.1:{}", prometheus.port()),
                                     "secretRef": {"name": "prom-auth"}},
                        "query": "sum(up{namespace=\"{{ namespace }}\",service=\"{{ variables.service }}\"})"}}),
    );
    api.put_object(
        "canaries",
        NS,
        "podinfo",
        json!({"apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
               "metadata": {"name": "podinfo", "namespace": NS},
               "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "podinfo"},
                        "analysis": {"interval": "200ms", "threshold": 2, "maxWeight": 20, "stepWeight": 20,
                                     "metrics": [{"name": "success", "templateRef": {"name": "success"},
                                                  "templateVariables": {"service": "greeter"},
                                                  "thresholdRange": {"min": 99}}]}}}),
    );
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let mut config = common::kubernetes_config(dir.path(), api.url());
    config.auth.token_review = Some(false);
    config.canary.enabled = true;
    config.canary.ca_file = Some(ca_file);
    config.canary.lease_duration = Duration::from_secs(2);
    let server = start(config).await;
    wait_ready(server.admin_addr).await;
    let phase = |wanted: &'static str| {
        api.wait_for_object("canaries", NS, "podinfo", WAIT, move |c| {
            c.is_some_and(|c| c["status"]["phase"] == wanted)
        })
    };
    phase("Initialized").await;

    // The right credentials: the query runs, 100 is in range, the release is promoted.
    api.set_image(NS, "podinfo", "podinfo:2");
    phase("Succeeded").await;
    let asked = seen.lock().unwrap().clone();
    let (authorization, line) = asked.last().expect("the template's Prometheus was asked");
    assert_eq!(authorization, "Basic YWRtaW46czNjcmV0");
    assert!(
        line.contains("service%3D%22greeter%22") && line.contains("namespace%3D%22test%22"),
        "the template's query with its variables: {line}"
    );

    // A wrong password: Prometheus refuses, the checks fail, the release is rolled back, and
    // the status says why.
    api.put_object("secrets", NS, "prom-auth", secret("wrong"));
    api.set_image(NS, "podinfo", "podinfo:3");
    let failed = phase("Failed").await.unwrap();
    let history = failed["status"]["history"].to_string();
    assert!(history.contains("HTTP 401"), "{history}");
    assert_eq!(
        api.object("deployments", NS, "podinfo-primary").unwrap()["spec"]["template"]["spec"]["containers"]
            [0]["image"],
        "podinfo:2"
    );
    server.stop().await.unwrap();
}
