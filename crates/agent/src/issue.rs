//! One certificate request to the CA: a fresh P-256 key and CSR, `AuthorityService/
//! CreateIdentity` with the token read from its file now, and the answer checked before
//! anything is written (the leaf holds our key and chains to the roots the CA sent).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use super::pki::{self, Leaf};
use crate::pb::IdentityRequest;
use crate::pb::authority_service_client::AuthorityServiceClient;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take in all (a CA that accepts and never answers).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the CA is and how the agent authenticates to it.
#[derive(Debug, Clone)]
pub struct Ca {
    /// As the user gave it, for messages.
    pub address: String,
    uri: String,
    tls: bool,
    pub ca_cert_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    token_type: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
}

/// A request that did not give us a certificate: a metric label and what to log.
#[derive(Debug, Clone)]
pub struct Failure {
    /// `unreachable`, `refused`, `bad_response`, `token`, `ca_cert` or `internal`.
    pub reason: &'static str,
    pub message: String,
}

fn failure(reason: &'static str, message: String) -> Failure {
    Failure { reason, message }
}

/// A certificate the CA issued, checked.
pub struct Issued {
    pub key_pem: String,
    pub chain: Vec<Vec<u8>>,
    pub roots: Vec<Vec<u8>>,
    pub leaf: Leaf,
    /// When the CA says to ask again (`refresh_time`), if it said.
    pub refresh: Option<SystemTime>,
}

/// `http://host:port` (plain) or `host:port`/`https://host:port` (TLS) as a URI tonic takes.
pub fn parse_address(address: &str) -> anyhow::Result<(String, bool)> {
    let trimmed = address.trim().trim_end_matches('/');
    let (uri, tls) = if let Some(rest) = trimmed.strip_prefix("http://") {
        (format!("http://{rest}"), false)
    } else if let Some(rest) = trimmed.strip_prefix("https://") {
        (format!("https://{rest}"), true)
    } else {
        anyhow::ensure!(
            !trimmed.contains("://"),
            "--ca-address {address:?}: use host:port (TLS), https://host:port (TLS) or \
             http://host:port (the plain gRPC port)"
        );
        (format!("https://{trimmed}"), true)
    };
    let authority = uri.split_once("://").map_or("", |(_, rest)| rest);
    anyhow::ensure!(
        !authority.is_empty() && !authority.contains('/'),
        "--ca-address {address:?}: use host:port, https://host:port or http://host:port"
    );
    let parsed: http::Uri = uri
        .parse()
        .map_err(|err| anyhow::anyhow!("--ca-address {address:?} is not an address: {err}"))?;
    anyhow::ensure!(
        parsed.port_u16().is_some(),
        "--ca-address {address:?} has no port (the CA's gRPC port is 30060 plain, 30062 TLS)"
    );
    Ok((uri, tls))
}

impl Ca {
    pub fn new(
        address: &str,
        ca_cert_file: Option<PathBuf>,
        token_file: Option<PathBuf>,
        token_type: &str,
    ) -> anyhow::Result<Ca> {
        let (uri, tls) = parse_address(address)?;
        anyhow::ensure!(
            !tls || ca_cert_file.is_some(),
            "--ca-address {address:?} is TLS: give the CA's roots with --ca-cert-file \
             (DUBBO_CA_CERT_PATH; `dubbo-cp ca root > ca.pem`), or use http://host:port for the \
             plain gRPC port"
        );
        let token_type = token_type.parse().map_err(|_| {
            anyhow::anyhow!("--token-type {token_type:?} holds characters a header cannot carry")
        })?;
        Ok(Ca {
            address: address.to_owned(),
            uri,
            tls,
            ca_cert_file,
            token_file,
            token_type,
        })
    }

    /// A new key, a CSR for it, and the CA's answer, checked.
    pub async fn issue(&self) -> Result<Issued, Failure> {
        let token = self.token()?;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|err| failure("internal", format!("cannot generate a key: {err}")))?;
        let csr = csr(&key)?;
        let mut request = tonic::Request::new(IdentityRequest {
            csr,
            r#type: "CONNECTION".to_owned(),
            metadata: None,
        });
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", token);
            request
                .metadata_mut()
                .insert("authorization-type", self.token_type.clone());
        }
        let call = async {
            let channel = self.endpoint()?.connect().await.map_err(|err| {
                failure(
                    "unreachable",
                    format!(
                        "cannot connect to the CA at {} (--ca-address, DUBBO_CA_ADDRESS; \
                         without them DUBBO_CP_SERVER, else 127.0.0.1:30060): {}",
                        self.address,
                        dubbo_cp_kit::error_chain(&err)
                    ),
                )
            })?;
            AuthorityServiceClient::new(channel)
                .create_identity(request)
                .await
                .map_err(|status| {
                    let message = if status.message().is_empty() {
                        "no message"
                    } else {
                        status.message()
                    };
                    // Transport trouble, or something in the way (a proxy, not a CA) that
                    // said no: the CA itself answers every refusal with OK and a message.
                    let reason = match status.code() {
                        tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                        | tonic::Code::Unknown
                        | tonic::Code::Internal => "unreachable",
                        _ => "refused",
                    };
                    failure(
                        reason,
                        format!(
                            "CreateIdentity at the CA {}: {:?}: {message}",
                            self.address,
                            status.code()
                        ),
                    )
                })
        };
        let response = tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .map_err(|_| {
                failure(
                    "unreachable",
                    format!(
                        "the CA at {} (--ca-address, DUBBO_CA_ADDRESS) did not answer within {}",
                        self.address,
                        humantime::format_duration(REQUEST_TIMEOUT)
                    ),
                )
            })??
            .into_inner();
        if !response.success {
            let message = if response.message.is_empty() {
                "no message"
            } else {
                &response.message
            };
            return Err(failure(
                "refused",
                format!("the CA at {} refused: {message}", self.address),
            ));
        }
        self.check(key, &response)
    }

    /// `authorization: Bearer <token>` from the token file as it is now.
    fn token(
        &self,
    ) -> Result<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>, Failure> {
        let Some(file) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(file).map_err(|err| {
            failure(
                "token",
                format!("cannot read --token-file {}: {err}", file.display()),
            )
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(failure(
                "token",
                format!("--token-file {} is empty", file.display()),
            ));
        }
        format!("Bearer {token}").parse().map(Some).map_err(|_| {
            failure(
                "token",
                format!(
                    "--token-file {} holds characters a header cannot carry",
                    file.display()
                ),
            )
        })
    }

    fn endpoint(&self) -> Result<Endpoint, Failure> {
        let mut endpoint = Endpoint::from_shared(self.uri.clone())
            .map_err(|err| {
                failure(
                    "internal",
                    format!("--ca-address {:?}: {err}", self.address),
                )
            })?
            .connect_timeout(CONNECT_TIMEOUT);
        if self.tls {
            // Read at every request: in Kubernetes the bundle is a ConfigMap that changes when
            // the roots rotate, and the CA's own certificate may come from the new root.
            let bundle = match &self.ca_cert_file {
                Some(file) => std::fs::read_to_string(file).map_err(|err| {
                    failure(
                        "ca_cert",
                        format!("cannot read --ca-cert-file {}: {err}", file.display()),
                    )
                })?,
                None => String::new(),
            };
            if pki::certificates(&bundle).map_or(true, |c| c.is_empty()) {
                return Err(failure(
                    "ca_cert",
                    format!(
                        "--ca-cert-file {} holds no PEM certificate",
                        self.ca_cert_file
                            .as_ref()
                            .map_or_else(String::new, |f| f.display().to_string())
                    ),
                ));
            }
            let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(bundle));
            endpoint = endpoint.tls_config(config).map_err(|err| {
                failure(
                    "internal",
                    format!("cannot set up TLS for {}: {err}", self.address),
                )
            })?;
        }
        Ok(endpoint)
    }

    /// The CA's answer as files to write, or why it is unusable.
    fn check(
        &self,
        key: rcgen::KeyPair,
        response: &crate::pb::IdentityResponse,
    ) -> Result<Issued, Failure> {
        let bad = |reason: String| {
            failure(
                "bad_response",
                format!("the CA at {} answered {reason}", self.address),
            )
        };
        let chain = pki::certificates(&response.cert_pem)
            .map_err(|e| bad(format!("a cert_pem that is {e}")))?;
        let leaf_der = chain
            .first()
            .ok_or_else(|| bad("no certificate in cert_pem".to_owned()))?;
        let leaf = Leaf::read(leaf_der).map_err(|e| bad(format!("a certificate that is {e}")))?;
        let key_pem = key.serialize_pem();
        leaf.matches_key(&key_pem)
            .map_err(|_| bad("a certificate for another key than the CSR's".to_owned()))?;
        let mut roots = Vec::new();
        for text in &response.trust_certs {
            roots.extend(
                pki::certificates(text).map_err(|e| bad(format!("trust_certs that are {e}")))?,
            );
        }
        if roots.is_empty() {
            return Err(bad("no trust_certs".to_owned()));
        }
        pki::verifies(&chain, &roots).map_err(|e| bad(format!("a chain where {e}")))?;
        let now = SystemTime::now();
        if leaf.not_after <= now {
            return Err(bad(format!(
                "a certificate that expired at {}",
                pki::rfc3339(leaf.not_after)
            )));
        }
        let refresh = u64::try_from(response.refresh_time)
            .ok()
            .filter(|ms| *ms > 0)
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
        Ok(Issued {
            key_pem,
            chain,
            roots,
            leaf,
            refresh,
        })
    }
}

/// A CSR for `key`. Its names do not matter: the CA issues to the caller's SPIFFE ID.
fn csr(key: &rcgen::KeyPair) -> Result<String, Failure> {
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, "dubbo-cp agent");
    params.distinguished_name = name;
    params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(|err| failure("internal", format!("cannot build the CSR: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_plain_only_with_http() {
        assert_eq!(
            parse_address("dubbo-cp.dubbo-system.svc:30062").unwrap(),
            ("https://dubbo-cp.dubbo-system.svc:30062".to_owned(), true)
        );
        assert_eq!(
            parse_address("http://127.0.0.1:30060/").unwrap(),
            ("http://127.0.0.1:30060".to_owned(), false)
        );
        assert!(parse_address("https://x:1").unwrap().1);
        for bad in [
            "grpc://x:1",
            "",
            "x",
            "http://",
            "http://x:1/path",
            "x:port",
        ] {
            let err = parse_address(bad).unwrap_err().to_string();
            assert!(err.contains("--ca-address"), "{bad}: {err}");
        }
        let tls = Ca::new("x:1", None, None, "dubbo-ca-token").unwrap_err();
        assert!(tls.to_string().contains("--ca-cert-file"), "{tls}");
        let header = Ca::new("http://x:1", None, None, "a\nb").unwrap_err();
        assert!(header.to_string().contains("--token-type"), "{header}");
    }

    #[test]
    fn csr_is_p256() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let pem = csr(&key).unwrap();
        assert!(pem.contains("BEGIN CERTIFICATE REQUEST"));
    }
}
