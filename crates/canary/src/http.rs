//! One small HTTP/1.1 client for the canary's outside calls (Prometheus, webhooks, alerts): a
//! deadline on every call, a bounded answer, and errors that say which URL failed and how.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::rt::TokioExecutor;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Answers larger than this are refused (a Prometheus vector of a few series, a hook's reply).
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum HttpError {
    #[error("invalid URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: {reason}")]
    Transport { url: String, reason: String },
}

/// A status and the body (lossy UTF-8).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// Plain http, and https trusting the system's roots and the configured bundle; a second pool
/// accepts any certificate, for the calls that ask (`insecureSkipVerify`).
#[derive(Clone)]
pub struct HttpClient {
    client: Client<Https, Full<Bytes>>,
    insecure: Client<Https, Full<Bytes>>,
    /// The TLS settings of both pools, for the one-off clients of calls through a proxy.
    tls: Arc<[rustls::ClientConfig; 2]>,
}

/// How one POST goes out besides its body: an `Authorization` header, the certificate check,
/// an HTTP proxy (`http://[user:password@]host:port`, tunnelled with CONNECT).
#[derive(Clone, Copy, Debug, Default)]
pub struct Via<'a> {
    pub authorization: Option<&'a str>,
    pub insecure: bool,
    pub proxy: Option<&'a str>,
}

impl Default for HttpClient {
    fn default() -> Self {
        // The system's roots alone parse whatever they are; a bad bundle is with_roots's error.
        HttpClient::with_roots(None).unwrap_or_else(|_| HttpClient::build(RootCertStore::empty()))
    }
}

impl HttpClient {
    /// Trusts the system's roots and the PEM certificates of `bundle` (`canary.caFile`).
    pub fn with_roots(bundle: Option<&[u8]>) -> Result<HttpClient, HttpError> {
        let mut roots = RootCertStore::empty();
        // Unreadable system certificates are skipped, as every rustls client does.
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(bundle) = bundle {
            let bad = |reason: String| HttpError::Url {
                url: "canary.caFile".to_owned(),
                reason,
            };
            let mut added = 0;
            for cert in CertificateDer::pem_slice_iter(bundle) {
                let cert = cert.map_err(|e| bad(format!("not a PEM certificate bundle: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("a certificate is not a CA: {e}")))?;
                added += 1;
            }
            if added == 0 {
                return Err(bad("holds no certificate".to_owned()));
            }
        }
        Ok(HttpClient::build(roots))
    }

    fn build(roots: RootCertStore) -> HttpClient {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let checked = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth());
        let unchecked = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map(|b| {
                b.dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                    .with_no_client_auth()
            });
        // ring's default protocol versions always build; an error here would be rustls's bug.
        let or_empty = |tls: Result<rustls::ClientConfig, rustls::Error>| {
            tls.unwrap_or_else(|_| {
                rustls::ClientConfig::builder()
                    .with_root_certificates(RootCertStore::empty())
                    .with_no_client_auth()
            })
        };
        let (checked, unchecked) = (or_empty(checked), or_empty(unchecked));
        HttpClient {
            client: pool(checked.clone(), connector()),
            insecure: pool(unchecked.clone(), connector()),
            tls: Arc::new([checked, unchecked]),
        }
    }

    /// A one-off client whose connections are CONNECT tunnels through `proxy`: the receiver's
    /// TLS runs inside the tunnel, checked as the pools check it.
    fn through(
        &self,
        proxy: &str,
        insecure: bool,
    ) -> Result<Client<hyper_rustls::HttpsConnector<Tunnel<HttpConnector>>, Full<Bytes>>, HttpError>
    {
        let bad = |reason: &str| HttpError::Url {
            url: without_credentials(proxy),
            reason: format!("proxy: {reason}"),
        };
        let uri: http::Uri = proxy.parse().map_err(|e| bad(&format!("{e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "must be http://host:port (a TLS connection to the proxy itself is not supported)",
            ));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?.as_str();
        let (credentials, host) = match authority.rsplit_once('@') {
            Some((credentials, host)) => (Some(credentials), host),
            None => (None, authority),
        };
        let target: http::Uri = format!("http://{host}")
            .parse()
            .map_err(|e| bad(&format!("{e}")))?;
        let mut tunnel = Tunnel::new(target, connector());
        if let Some(credentials) = credentials {
            use base64::Engine;
            let decoded: Vec<u8> = percent_encoding::percent_decode_str(credentials).collect();
            let value = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(decoded)
            );
            let value = http::HeaderValue::from_str(&value)
                .map_err(|_| bad("credentials are not a valid header"))?;
            tunnel = tunnel.with_auth(value);
        }
        let [checked, unchecked] = self.tls.as_ref();
        let tls = if insecure { unchecked } else { checked }.clone();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tunnel);
        Ok(Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(https))
    }

    pub async fn get(&self, url: &str, timeout: Duration) -> Result<Answer, HttpError> {
        self.call(http::Method::GET, url, None, Via::default(), timeout)
            .await
    }

    /// A GET with an `Authorization` header, through the pool that checks no certificate when
    /// `insecure`.
    pub async fn get_with(
        &self,
        url: &str,
        authorization: Option<&str>,
        insecure: bool,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let via = Via {
            authorization,
            insecure,
            proxy: None,
        };
        self.call(http::Method::GET, url, None, via, timeout).await
    }

    pub async fn post_json(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        self.post_json_via(url, body, Via::default(), timeout).await
    }

    /// A POST of `body` as JSON the way `via` says.
    pub async fn post_json_via(
        &self,
        url: &str,
        body: &serde_json::Value,
        via: Via<'_>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let body = Bytes::from(body.to_string());
        self.call(http::Method::POST, url, Some(body), via, timeout)
            .await
    }

    async fn call(
        &self,
        method: http::Method,
        url: &str,
        body: Option<Bytes>,
        via: Via<'_>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| HttpError::Url {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => {
                return Err(HttpError::Url {
                    url: url.to_owned(),
                    reason: "must start with http:// or https://".to_owned(),
                });
            }
        }
        let mut request = http::Request::builder().method(method).uri(uri);
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        if let Some(authorization) = via.authorization {
            request = request.header(http::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| HttpError::Url {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        let transport = |reason: String| HttpError::Transport {
            url: url.to_owned(),
            reason,
        };
        let sent = match via.proxy {
            Some(proxy) => self.through(proxy, via.insecure)?.request(request),
            None if via.insecure => self.insecure.request(request),
            None => self.client.request(request),
        };
        let exchange = async {
            let response = sent.await.map_err(|e| transport(format!("{e:#}")))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok(Answer {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| HttpError::Timeout {
                url: url.to_owned(),
                timeout,
            })?
    }
}

/// `url` with any `user:password@` taken out, for errors and logs.
pub fn without_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((_, host)) if scheme.is_empty() => format!("{host}{path}"),
        Some((_, host)) => format!("{scheme}://{host}{path}"),
        None => url.to_owned(),
    }
}

fn connector() -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    connector.enforce_http(false);
    connector
}

fn pool(tls: rustls::ClientConfig, connector: HttpConnector) -> Client<Https, Full<Bytes>> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(4)
        .build(https)
}

/// Accepts any server certificate, still checking the handshake's signatures: what
/// `insecureSkipVerify` asks for.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_taken_out_of_urls() {
        assert_eq!(
            without_credentials("http://ops:s3cret@proxy:3128"),
            "http://proxy:3128"
        );
        assert_eq!(
            without_credentials("http://ops:p@ss@proxy:3128/x?y"),
            "http://proxy:3128/x?y"
        );
        assert_eq!(
            without_credentials("http://proxy:3128"),
            "http://proxy:3128"
        );
    }

    #[tokio::test]
    async fn a_proxy_must_be_plain_http_and_its_password_is_never_in_the_error() {
        let client = HttpClient::default();
        let via = Via {
            proxy: Some("https://ops:s3cret@127.0.0.1:1"),
            ..Via::default()
        };
        let error = client
            .post_json_via(
                "http://127.0.0.1:1/hook",
                &serde_json::json!({}),
                via,
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(text.contains("must be http://host:port"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
    }
}
