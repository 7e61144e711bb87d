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
type Tunnelled = Client<hyper_rustls::HttpsConnector<Tunnel<HttpConnector>>, Full<Bytes>>;

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
/// an HTTP proxy (`http://[user:password@]host:port`, tunnelled with CONNECT), and what errors
/// call the URL when the URL itself is a secret.
#[derive(Clone, Copy, Default)]
pub struct Via<'a> {
    pub authorization: Option<&'a str>,
    pub insecure: bool,
    pub proxy: Option<&'a str>,
    /// Named in errors instead of the URL (a Slack hook URL kept in a Secret is a credential).
    pub shown_as: Option<&'a str>,
}

// By hand: the bearer token, the proxy's password and a secret URL must not reach a log.
impl std::fmt::Debug for Via<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |set: bool| if set { "<redacted>" } else { "none" };
        f.debug_struct("Via")
            .field("authorization", &redacted(self.authorization.is_some()))
            .field("insecure", &self.insecure)
            .field("proxy", &redacted(self.proxy.is_some()))
            .field("shown_as", &self.shown_as)
            .finish()
    }
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
    /// TLS runs inside the tunnel, checked as the pools check it. Also the proxy's `host:port`,
    /// for errors. The proxy string is never put in an error: its password may not parse.
    fn through(&self, proxy: &str, insecure: bool) -> Result<(Tunnelled, String), HttpError> {
        let bad = |reason: &str| HttpError::Url {
            url: "proxy".to_owned(),
            reason: reason.to_owned(),
        };
        let form = "must be http://[user:password@]host:port";
        let rest = proxy.strip_prefix("http://").ok_or_else(|| {
            bad("must be http://host:port (a TLS connection to the proxy itself is not supported)")
        })?;
        // The last `@` ends the user:password, which may hold `/`, `?` or `#` unescaped.
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((credentials, rest)) => (Some(credentials), rest),
            None => (None, rest),
        };
        let host = rest.strip_suffix('/').unwrap_or(rest);
        let target: http::Uri = format!("http://{host}").parse().map_err(|_| bad(form))?;
        let host = match target.authority() {
            Some(authority) if target.path() == "/" && target.query().is_none() => {
                authority.as_str().to_owned()
            }
            _ => return Err(bad(form)),
        };
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
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(https);
        Ok((client, host))
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
            ..Via::default()
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
        // Errors name the label when there is one, so a secret URL never reaches them.
        let shown = || via.shown_as.unwrap_or(url).to_owned();
        let invalid = |reason: String| HttpError::Url {
            url: shown(),
            reason,
        };
        let mut uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        let default_port = match uri.scheme_str() {
            Some("http") => 80,
            Some("https") => 443,
            _ => return Err(invalid("must start with http:// or https://".to_owned())),
        };
        let mut request = http::Request::builder().method(method);
        let proxied = match via.proxy {
            Some(proxy) => {
                let (client, host) = self.through(proxy, via.insecure)?;
                // hyper-util's Tunnel asks the proxy for port 443 whatever the scheme when the
                // URI has none: give it the scheme's, keeping the Host header as written.
                let authority = uri
                    .authority()
                    .cloned()
                    .ok_or_else(|| invalid("no host".to_owned()))?;
                if authority.port().is_none() {
                    request = request.header(http::header::HOST, authority.host());
                    let mut parts = uri.into_parts();
                    parts.authority = Some(
                        format!("{}:{default_port}", authority.host())
                            .parse()
                            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?,
                    );
                    uri = http::Uri::from_parts(parts).map_err(|e| invalid(e.to_string()))?;
                }
                Some((client, host))
            }
            None => None,
        };
        request = request.uri(uri);
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        if let Some(authorization) = via.authorization {
            request = request.header(http::header::AUTHORIZATION, authorization);
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| invalid(e.to_string()))?;
        let through = proxied
            .as_ref()
            .map(|(_, host)| format!(" via proxy {host}"))
            .unwrap_or_default();
        let transport = |reason: String| HttpError::Transport {
            url: format!("{}{through}", shown()),
            reason,
        };
        let sent = match proxied {
            Some((client, _)) => client.request(request),
            None if via.insecure => self.insecure.request(request),
            None => self.client.request(request),
        };
        let exchange = async {
            let response = sent.await.map_err(|e| transport(causes(&e)))?;
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
                url: format!("{}{through}", shown()),
                timeout,
            })?
    }
}

/// `error` and each of its sources, joined: hyper-util's own text is only "client error
/// (Connect)", the cause (refused, DNS, the proxy's answer) is further down.
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
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

    /// A proxy on loopback that records the first line it is sent and answers 502.
    async fn refusing_proxy() -> (String, tokio::sync::oneshot::Receiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tell, told) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.unwrap() == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let _ = tell.send(head.lines().next().unwrap_or_default().to_owned());
            let _ = socket.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        });
        (addr.to_string(), told)
    }

    async fn post(url: &str, via: Via<'_>) -> HttpError {
        HttpClient::default()
            .post_json_via(url, &serde_json::json!({}), via, Duration::from_secs(10))
            .await
            .unwrap_err()
    }

    #[tokio::test]
    async fn a_portless_receiver_is_tunnelled_to_its_schemes_port() {
        for (url, target) in [
            ("http://alerts.invalid/x", "alerts.invalid:80"),
            ("https://alerts.invalid/x", "alerts.invalid:443"),
            ("http://[::1]/x", "[::1]:80"),
        ] {
            let (proxy, line) = refusing_proxy().await;
            let proxy_url = format!("http://{proxy}");
            let via = Via {
                proxy: Some(&proxy_url),
                ..Via::default()
            };
            let text = post(url, via).await.to_string();
            assert_eq!(line.await.unwrap(), format!("CONNECT {target} HTTP/1.1"));
            assert!(text.contains(&format!("via proxy {proxy}")), "{text}");
        }
    }

    #[tokio::test]
    async fn a_proxy_password_is_never_in_the_error_even_when_it_does_not_parse() {
        // A port nothing listens on: the connection is refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = listener.local_addr().unwrap();
        drop(listener);
        for proxy in [
            format!("http://ops:pa/ss@{closed}"),
            format!("http://ops:pa/ss@{closed}/"),
            "http://ops:pa/ss@no host:1".to_owned(),
            "https://ops:pa/ss@proxy:3128".to_owned(),
        ] {
            let via = Via {
                proxy: Some(&proxy),
                ..Via::default()
            };
            let text = post("http://alerts.invalid/x", via).await.to_string();
            assert!(!text.contains("pa/ss"), "{text}");
            assert!(!text.contains("ops"), "{text}");
        }
        let proxy = format!("http://ops:pa/ss@{closed}");
        let via = Via {
            proxy: Some(&proxy),
            ..Via::default()
        };
        let text = post("http://alerts.invalid/x", via).await.to_string();
        assert!(text.contains(&format!("via proxy {closed}")), "{text}");
    }

    #[tokio::test]
    async fn a_secret_url_is_named_by_its_label_whatever_it_holds() {
        let via = Via {
            shown_as: Some("<the address in secret test/hook>"),
            ..Via::default()
        };
        for url in [
            "https://hooks.example/T0/s3cret\u{feff}",
            "https://hooks.example/T0/s3cret\t",
            "ftp://hooks.example/T0/s3cret",
            "http://127.0.0.1:1/T0/s3cret",
        ] {
            let text = post(url, via).await.to_string();
            assert!(text.contains("<the address in secret test/hook>"), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
            assert!(!text.contains("hooks.example"), "{text}");
        }
        let debug = format!(
            "{:?}",
            Via {
                authorization: Some("Bearer xoxb-1"),
                proxy: Some("http://ops:pw@proxy:3128"),
                ..Via::default()
            }
        );
        assert!(!debug.contains("xoxb") && !debug.contains("pw"), "{debug}");
    }

    #[tokio::test]
    async fn a_refused_connection_says_so() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = listener.local_addr().unwrap();
        drop(listener);
        let text = post(&format!("http://{closed}/x"), Via::default())
            .await
            .to_string();
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }
}
