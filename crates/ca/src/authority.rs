//! The certificate authority's core, without I/O: roots, the bundle of roots peers trust, issuing
//! certificates from CSRs, and the ES256 tokens (`dubbo-jwt`) signed with the root's key
//! (wire.md §6).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType, SerialNumber,
    SubjectPublicKeyInfo,
};
use ring::rand::SecureRandom;
use time::OffsetDateTime;
use x509_parser::prelude::FromDer;

/// `iss` of the tokens this CA signs, as the reference control plane's.
pub const TOKEN_ISSUER: &str = "dubbo-authority";
/// Certificates start this long in the past, so peers whose clocks lag still accept them.
pub const BACKDATE: Duration = Duration::from_secs(60);
/// Clock skew tolerated on tokens' `exp`.
const TOKEN_LEEWAY_SECONDS: u64 = 10;
/// Issuing stops when the root has less life than this left.
const MIN_LIFETIME: Duration = Duration::from_secs(60);
/// Largest CSR accepted (a 4096-bit RSA CSR is about 1.7 KiB of PEM).
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// Why a root or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("{what}: {reason}")]
    Invalid { what: &'static str, reason: String },
}

fn invalid(what: &'static str, reason: impl ToString) -> RootError {
    RootError::Invalid {
        what,
        reason: reason.to_string(),
    }
}

/// Why a CSR was refused; the message goes back to the SDK.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    #[error("csr is empty: send a PEM CERTIFICATE REQUEST")]
    Empty,
    #[error("csr is larger than {MAX_CSR_BYTES} bytes")]
    TooLarge,
    #[error("csr does not parse: {0}")]
    Unparsable(String),
    #[error("csr signature does not verify")]
    BadSignature,
    #[error("csr key {0} is not supported: use ECDSA P-256 or P-384, or RSA of at least 2048 bits")]
    UnsupportedKey(String),
    #[error("cannot sign the certificate: {0}")]
    Signing(String),
    #[error(
        "the CA root expires at {0}; no certificate can be issued from it (rotate or replace the root)"
    )]
    RootExpiring(String),
}

impl IssueError {
    /// The `result` label of the issuing metrics.
    pub fn result(&self) -> &'static str {
        match self {
            IssueError::Empty | IssueError::TooLarge | IssueError::Unparsable(_) => "bad_csr",
            IssueError::BadSignature => "bad_signature",
            IssueError::UnsupportedKey(_) => "unsupported_key",
            IssueError::Signing(_) | IssueError::RootExpiring(_) => "error",
        }
    }
}

/// A root certificate peers trust: the active one, or one retiring after a rotation.
pub struct Root {
    pub der: Vec<u8>,
    pub pem: String,
    /// SHA-256 of the DER, as `openssl x509 -fingerprint -sha256` prints it.
    pub fingerprint: String,
    pub subject: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The root's public key as `EC PUBLIC KEY` PEM (`trusted_token_public_keys`).
    pub token_key_pem: String,
    /// The same key for verifying `dubbo-jwt` tokens; `None` when it is not P-256.
    token_key: Option<DecodingKey>,
}

impl std::fmt::Debug for Root {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Root")
            .field("fingerprint", &self.fingerprint)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Root {
    /// The first certificate of `pem`.
    pub fn from_pem(pem: &str) -> Result<Root, RootError> {
        let parsed = pem::parse(pem).map_err(|e| invalid("root certificate", e))?;
        if parsed.tag() != "CERTIFICATE" {
            return Err(invalid(
                "root certificate",
                format!("PEM block is {}, not CERTIFICATE", parsed.tag()),
            ));
        }
        Root::from_der(parsed.contents())
    }

    pub fn from_der(der: &[u8]) -> Result<Root, RootError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| invalid("root certificate", e))?;
        let spki = cert.public_key();
        let is_p256 = spki.algorithm.algorithm.to_id_string() == OID_EC_PUBLIC_KEY
            && spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .is_some_and(|oid| oid.to_id_string() == OID_P256);
        let validity = cert.validity();
        Ok(Root {
            der: der.to_vec(),
            pem: to_pem("CERTIFICATE", der.to_vec()),
            fingerprint: fingerprint(der),
            subject: cert.subject().to_string(),
            not_before: unix(validity.not_before.timestamp()),
            not_after: unix(validity.not_after.timestamp()),
            token_key_pem: to_pem("EC PUBLIC KEY", spki.raw.to_vec()),
            token_key: is_p256.then(|| DecodingKey::from_ec_der(&spki.subject_public_key.data)),
        })
    }

    pub fn expired(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }
}

/// PEM with `\n` line endings, as openssl and Go write it (the crate's default is `\r\n`).
pub fn to_pem(tag: &str, der: Vec<u8>) -> String {
    pem::encode_config(
        &pem::Pem::new(tag, der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

const OID_EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";
const OID_RSA: &str = "1.2.840.113549.1.1.1";

fn unix(seconds: i64) -> SystemTime {
    match u64::try_from(seconds) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH,
    }
}

pub fn unix_seconds(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub fn unix_millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn fingerprint(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The active root with its key: what issues.
pub struct Signer {
    root: Arc<Root>,
    issuer: Issuer<'static, KeyPair>,
    token_key: EncodingKey,
    key_pem: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("root", &self.root).finish()
    }
}

impl Signer {
    /// A new self-signed ECDSA P-256 root valid for `validity` from `now` (backdated).
    pub fn generate(validity: Duration, now: SystemTime) -> Result<Signer, RootError> {
        Signer::generate_after(None, validity, now).map(|(signer, _)| signer)
    }

    /// A new root and, when it replaces `previous`, the same root certificate signed by
    /// `previous` (same subject and key): peers that trust only the old root still verify
    /// chains ending in the new one during the overlap.
    pub fn generate_after(
        previous: Option<&Signer>,
        validity: Duration,
        now: SystemTime,
    ) -> Result<(Signer, Option<Vec<u8>>), RootError> {
        let key =
            KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|e| invalid("root key", e))?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "Apache Dubbo");
        name.push(
            DnType::CommonName,
            format!("dubbo-cp root CA {}", unix_seconds(now)),
        );
        params.distinguished_name = name;
        // One CA below it: the next root, cross-signed during a rotation.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(1));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial().map_err(|e| invalid("root serial", e))?);
        params.not_before = OffsetDateTime::from(now - BACKDATE);
        params.not_after = OffsetDateTime::from(now + validity);
        let cert = params
            .self_signed(&key)
            .map_err(|e| invalid("root certificate", e))?;
        let cross = match previous {
            None => None,
            Some(previous) => {
                params.serial_number =
                    Some(random_serial().map_err(|e| invalid("root serial", e))?);
                params.not_after =
                    OffsetDateTime::from((now + validity).min(previous.root.not_after));
                params.use_authority_key_identifier_extension = true;
                let cross = params
                    .signed_by(&key, &previous.issuer)
                    .map_err(|e| invalid("cross-signed root", e))?;
                Some(cross.der().to_vec())
            }
        };
        Ok((Signer::from_parts(Root::from_der(cert.der())?, key)?, cross))
    }

    /// An existing root: its certificate and its private key (PKCS#8 `PRIVATE KEY` or SEC1
    /// `EC PRIVATE KEY`), which must be ECDSA P-256 (the tokens are ES256) and match.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Signer, RootError> {
        let root = Root::from_pem(cert_pem)?;
        let key = load_key(key_pem)?;
        Signer::from_parts(root, key)
    }

    fn from_parts(root: Root, key: KeyPair) -> Result<Signer, RootError> {
        let (_, cert) = x509_parser::parse_x509_certificate(&root.der)
            .map_err(|e| invalid("root certificate", e))?;
        if cert.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(invalid(
                "root key",
                "the private key does not belong to the root certificate",
            ));
        }
        if !cert.is_ca() {
            return Err(invalid(
                "root certificate",
                "not a CA certificate (basicConstraints CA:TRUE missing)",
            ));
        }
        let key_der = key.serialize_der();
        let key_pem = key.serialize_pem();
        let issuer = Issuer::from_ca_cert_der(&root.der.clone().into(), key)
            .map_err(|e| invalid("root certificate", e))?;
        Ok(Signer {
            root: Arc::new(root),
            issuer,
            token_key: EncodingKey::from_ec_der(&key_der),
            key_pem,
        })
    }

    pub fn root(&self) -> &Arc<Root> {
        &self.root
    }

    /// The root's private key as PKCS#8 PEM, for the store.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Signs a certificate for `public_key`, capped at the root's expiry.
    fn sign(
        &self,
        public_key: &impl rcgen::PublicKeyData,
        mut params: CertificateParams,
        validity: Duration,
        now: SystemTime,
    ) -> Result<(String, Vec<u8>, SystemTime), IssueError> {
        // A certificate shorter than this is no use (the SDK would ask again at once).
        if self.root.not_after < now + MIN_LIFETIME {
            return Err(IssueError::RootExpiring(
                humantime::format_rfc3339_seconds(self.root.not_after).to_string(),
            ));
        }
        let not_after = (now + validity).min(self.root.not_after);
        params.not_before = OffsetDateTime::from(now - BACKDATE);
        params.not_after = OffsetDateTime::from(not_after);
        params.serial_number = Some(random_serial().map_err(IssueError::Signing)?);
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(public_key, &self.issuer)
            .map_err(|e| IssueError::Signing(e.to_string()))?;
        // Whole seconds: what the certificate says is what the SDK is told.
        let not_after = unix(unix_seconds(not_after));
        Ok((cert.pem(), cert.der().to_vec(), not_after))
    }
}

/// 128 random bits, positive as DER integers must be.
fn random_serial() -> Result<SerialNumber, String> {
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness available".to_owned())?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x40; // never shorter than 128 bits once encoded
    Ok(SerialNumber::from_slice(&bytes))
}

/// A private key in PKCS#8 (`PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`, what Go's
/// `x509.MarshalECPrivateKey` writes) PEM; ECDSA P-256 only.
fn load_key(key_pem: &str) -> Result<KeyPair, RootError> {
    let parsed = pem::parse(key_pem).map_err(|e| invalid("root key", e))?;
    let pkcs8 = match parsed.tag() {
        "PRIVATE KEY" => parsed.contents().to_vec(),
        "EC PRIVATE KEY" => sec1_to_pkcs8_p256(parsed.contents()),
        other => {
            return Err(invalid(
                "root key",
                format!("PEM block is {other}; expected PRIVATE KEY or EC PRIVATE KEY"),
            ));
        }
    };
    KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8.as_slice().into(), &PKCS_ECDSA_P256_SHA256)
        .map_err(|e| invalid("root key", format!("not an ECDSA P-256 key ({e})")))
}

/// Wraps a SEC1 `ECPrivateKey` into PKCS#8 `PrivateKeyInfo` naming P-256 (ring reads only
/// PKCS#8, and checks that the curve matches the key).
fn sec1_to_pkcs8_p256(sec1: &[u8]) -> Vec<u8> {
    const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const PRIME256V1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    let algorithm = der(
        0x30,
        &[der(0x06, EC_PUBLIC_KEY), der(0x06, PRIME256V1)].concat(),
    );
    der(
        0x30,
        &[der(0x02, &[0]), algorithm, der(0x04, sec1)].concat(),
    )
}

/// One DER TLV.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .iter()
            .copied()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// Who a certificate is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The only URI SAN.
    pub spiffe_id: String,
    /// The pod UID where known, else the service account.
    pub common_name: String,
}

/// An issued certificate and the token that goes with it.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub not_after: SystemTime,
    /// When the SDK should ask again: half-way through the validity.
    pub refresh_at: SystemTime,
    /// ES256 JWT: `iss: dubbo-authority`, `sub`: the SPIFFE ID, `exp` = `not_after`.
    pub token: String,
}

/// A serving certificate and its freshly made key.
pub struct ServingCertificate {
    /// The leaf, then the cross-signed root during a rotation.
    pub chain: Vec<Vec<u8>>,
    pub key_der: Vec<u8>,
    pub not_after: SystemTime,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    exp: u64,
    /// Ours carry it; the reference's tokens do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
}

/// The roots as served at one moment: the active signer, and the roots retiring after a
/// rotation (trusted until every certificate they issued has expired).
#[derive(Debug)]
pub struct Bundle {
    pub signer: Arc<Signer>,
    pub retiring: Vec<Arc<Root>>,
    /// While roots are retiring: the active root signed by the one it replaced, sent after
    /// every certificate so peers that trust only the old root accept it.
    pub cross: Option<Arc<Root>>,
    /// Generated and rotated by us (`false`: an operator's root, used as is).
    pub managed: bool,
}

impl Bundle {
    /// Every trusted root, the active one first.
    pub fn trusted(&self) -> impl Iterator<Item = &Arc<Root>> {
        std::iter::once(self.signer.root()).chain(self.retiring.iter())
    }

    pub fn trust_pems(&self) -> Vec<String> {
        self.trusted().map(|r| r.pem.clone()).collect()
    }

    pub fn token_public_keys(&self) -> Vec<String> {
        self.trusted().map(|r| r.token_key_pem.clone()).collect()
    }

    /// `ca.crt` of the published ConfigMap: every trusted root, concatenated.
    pub fn ca_crt(&self) -> String {
        self.trusted().map(|r| r.pem.as_str()).collect()
    }

    /// A certificate for `subject` from `csr_pem`: the CSR's key, our names.
    pub fn issue(
        &self,
        csr_pem: &str,
        subject: &Subject,
        validity: Duration,
        now: SystemTime,
    ) -> Result<Issued, IssueError> {
        let public_key = verified_csr_key(csr_pem)?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, subject.common_name.as_str());
        params.distinguished_name = name;
        let uri = subject
            .spiffe_id
            .as_str()
            .try_into()
            .map_err(|e: rcgen::Error| IssueError::Signing(e.to_string()))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let (mut cert_pem, _, not_after) = self.signer.sign(&public_key, params, validity, now)?;
        if let Some(cross) = &self.cross {
            cert_pem.push_str(&cross.pem);
        }
        let lifetime = not_after.duration_since(now).unwrap_or_default();
        let token = self.token(&subject.spiffe_id, not_after, now)?;
        Ok(Issued {
            cert_pem,
            not_after,
            refresh_at: now + lifetime / 2,
            token,
        })
    }

    /// A serving certificate for `dns_names` with a new P-256 key.
    pub fn issue_serving(
        &self,
        dns_names: &[String],
        validity: Duration,
        now: SystemTime,
    ) -> Result<ServingCertificate, IssueError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(|e| IssueError::Signing(e.to_string()))?;
        let mut params = CertificateParams::new(dns_names.to_vec())
            .map_err(|e| IssueError::Signing(e.to_string()))?;
        let mut name = DistinguishedName::new();
        name.push(
            DnType::CommonName,
            dns_names.first().map(String::as_str).unwrap_or("dubbo-cp"),
        );
        params.distinguished_name = name;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let (_, cert_der, not_after) = self.signer.sign(&key, params, validity, now)?;
        Ok(ServingCertificate {
            chain: std::iter::once(cert_der)
                .chain(self.cross.iter().map(|c| c.der.clone()))
                .collect(),
            key_der: key.serialize_der(),
            not_after,
        })
    }

    fn token(
        &self,
        spiffe_id: &str,
        not_after: SystemTime,
        now: SystemTime,
    ) -> Result<String, IssueError> {
        let claims = Claims {
            iss: TOKEN_ISSUER.to_owned(),
            sub: spiffe_id.to_owned(),
            exp: unix_seconds(not_after).max(0).unsigned_abs(),
            iat: Some(unix_seconds(now).max(0).unsigned_abs()),
        };
        jsonwebtoken::encode(
            &Header::new(Algorithm::ES256),
            &claims,
            &self.signer.token_key,
        )
        .map_err(|e| IssueError::Signing(format!("token: {e}")))
    }

    /// The SPIFFE ID (`sub`) and expiry of a `dubbo-jwt` token signed by any trusted root.
    pub fn verify_token(&self, token: &str) -> Result<(String, SystemTime), String> {
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_issuer(&[TOKEN_ISSUER]);
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        validation.validate_aud = false;
        validation.leeway = TOKEN_LEEWAY_SECONDS;
        let mut last = "no trusted root can verify ES256 tokens".to_owned();
        for root in self.trusted() {
            let Some(key) = &root.token_key else { continue };
            match jsonwebtoken::decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    let exp = UNIX_EPOCH + Duration::from_secs(data.claims.exp);
                    return Ok((data.claims.sub, exp));
                }
                Err(err) => match err.kind() {
                    jsonwebtoken::errors::ErrorKind::InvalidSignature => {
                        last = "signature does not verify with any trusted root".to_owned();
                    }
                    _ => return Err(err.to_string()),
                },
            }
        }
        Err(last)
    }
}

/// The public key of a CSR whose signature verifies, if its type is one we issue for.
fn verified_csr_key(csr_pem: &str) -> Result<SubjectPublicKeyInfo, IssueError> {
    let csr_pem = csr_pem.trim();
    if csr_pem.is_empty() {
        return Err(IssueError::Empty);
    }
    if csr_pem.len() > MAX_CSR_BYTES {
        return Err(IssueError::TooLarge);
    }
    let block = pem::parse(csr_pem).map_err(|e| IssueError::Unparsable(e.to_string()))?;
    if !matches!(
        block.tag(),
        "CERTIFICATE REQUEST" | "NEW CERTIFICATE REQUEST"
    ) {
        return Err(IssueError::Unparsable(format!(
            "PEM block is {}, not CERTIFICATE REQUEST",
            block.tag()
        )));
    }
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(block.contents())
            .map_err(|e| IssueError::Unparsable(e.to_string()))?;
    let spki = &csr.certification_request_info.subject_pki;
    let algorithm = spki.algorithm.algorithm.to_id_string();
    let described = match algorithm.as_str() {
        OID_EC_PUBLIC_KEY => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| oid.to_id_string())
                .unwrap_or_default();
            match curve.as_str() {
                OID_P256 | OID_P384 => None,
                other => Some(format!("ECDSA on curve {other:?}")),
            }
        }
        OID_RSA => match spki.parsed() {
            Ok(x509_parser::public_key::PublicKey::RSA(rsa)) if rsa.key_size() >= 2048 => None,
            Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => {
                Some(format!("RSA {} bits", rsa.key_size()))
            }
            _ => Some("RSA (unparsable)".to_owned()),
        },
        other => Some(format!("algorithm {other}")),
    };
    if let Some(described) = described {
        return Err(IssueError::UnsupportedKey(described));
    }
    csr.verify_signature()
        .map_err(|_| IssueError::BadSignature)?;
    SubjectPublicKeyInfo::from_der(spki.raw).map_err(|e| IssueError::UnsupportedKey(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn bundle() -> Bundle {
        Bundle {
            signer: Arc::new(Signer::generate(30 * 24 * HOUR, SystemTime::now()).unwrap()),
            retiring: Vec::new(),
            cross: None,
            managed: true,
        }
    }

    fn csr(alg: &'static rcgen::SignatureAlgorithm, san: &str) -> String {
        let key = KeyPair::generate_for(alg).unwrap();
        CertificateParams::new(vec![san.to_owned()])
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
    }

    fn subject() -> Subject {
        Subject {
            spiffe_id: "spiffe://cluster.local/ns/demo/sa/provider".into(),
            common_name: "pod-uid".into(),
        }
    }

    #[test]
    fn issues_with_our_names_only() {
        let bundle = bundle();
        let now = SystemTime::now();
        let issued = bundle
            .issue(
                &csr(&PKCS_ECDSA_P256_SHA256, "evil.example"),
                &subject(),
                HOUR,
                now,
            )
            .unwrap();
        let block = pem::parse(&issued.cert_pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).unwrap();
        let names: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            names,
            ["URI(spiffe://cluster.local/ns/demo/sa/provider)"],
            "the CSR's DNS name is dropped"
        );
        let root = bundle.signer.root();
        let (_, root_cert) = x509_parser::parse_x509_certificate(&root.der).unwrap();
        cert.verify_signature(Some(root_cert.public_key())).unwrap();
        assert!(cert.serial.bits() >= 120, "random 128-bit serial");
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert_eq!(lifetime, 3600 + 60, "an hour, started a minute ago");
        assert_eq!(
            bundle.verify_token(&issued.token).unwrap().0,
            "spiffe://cluster.local/ns/demo/sa/provider"
        );
    }

    #[test]
    fn refuses_bad_csrs() {
        let bundle = bundle();
        let now = SystemTime::now();
        let issue = |csr: &str| bundle.issue(csr, &subject(), HOUR, now).map(|_| ());
        assert_eq!(issue(""), Err(IssueError::Empty));
        assert!(matches!(issue("not pem"), Err(IssueError::Unparsable(_))));
        let good = csr(&PKCS_ECDSA_P256_SHA256, "a");
        let cert_pem = bundle.signer.root().pem.clone();
        assert!(matches!(issue(&cert_pem), Err(IssueError::Unparsable(_))));
        // Flip a byte of the signature (the end of the DER).
        let mut der = pem::parse(&good).unwrap().into_contents();
        let last = der.len() - 3;
        der[last] ^= 0x55;
        let tampered = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
        assert_eq!(issue(&tampered), Err(IssueError::BadSignature));
        assert!(
            issue(&csr(&rcgen::PKCS_ED25519, "a")).is_err_and(|e| e.result() == "unsupported_key")
        );
        assert!(issue(&csr(&rcgen::PKCS_ECDSA_P384_SHA384, "a")).is_ok());
    }

    #[test]
    fn operator_keys_in_both_encodings() {
        let signer = Signer::generate(HOUR, SystemTime::now()).unwrap();
        let pkcs8 = pem::parse(signer.key_pem()).unwrap();
        // PKCS#8 of ring: SEQ { INT 0, SEQ {oid, oid}, OCTET STRING { ECPrivateKey } }.
        let (_, info) = x509_parser::der_parser::parse_der(pkcs8.contents()).unwrap();
        let items = info.as_sequence().unwrap();
        let sec1 = items[2].as_slice().unwrap().to_vec();
        let sec1_pem = pem::encode(&pem::Pem::new("EC PRIVATE KEY", sec1));
        let cert = signer.root().pem.clone();
        assert!(Signer::from_pem(&cert, &sec1_pem).is_ok());
        assert!(Signer::from_pem(&cert, signer.key_pem()).is_ok());
        let other = Signer::generate(HOUR, SystemTime::now()).unwrap();
        let err = Signer::from_pem(&cert, other.key_pem()).unwrap_err();
        assert!(err.to_string().contains("does not belong"), "{err}");
    }

    #[test]
    fn tokens_of_retiring_roots_verify_and_foreign_ones_do_not() {
        let old = bundle();
        let issued = old
            .issue(
                &csr(&PKCS_ECDSA_P256_SHA256, "a"),
                &subject(),
                HOUR,
                SystemTime::now(),
            )
            .unwrap();
        let rotated = Bundle {
            signer: Arc::new(Signer::generate(HOUR * 48, SystemTime::now()).unwrap()),
            retiring: vec![old.signer.root().clone()],
            cross: None,
            managed: true,
        };
        assert!(rotated.verify_token(&issued.token).is_ok());
        let foreign = bundle();
        let err = foreign.verify_token(&issued.token).unwrap_err();
        assert!(err.contains("signature"), "{err}");
        let expired = old
            .issue(
                &csr(&PKCS_ECDSA_P256_SHA256, "a"),
                &subject(),
                HOUR,
                SystemTime::now() - 3 * HOUR,
            )
            .unwrap();
        assert!(
            old.verify_token(&expired.token)
                .unwrap_err()
                .contains("xpired")
        );
    }
}
