//! What the agent reads out of certificates: PEM blocks, the leaf's validity, serial and SPIFFE
//! ID, whether a key belongs to it, and whether a chain leads to one of the trusted roots.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

/// The DER of every `CERTIFICATE` block in `text`, in order.
pub fn certificates(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let blocks = pem::parse_many(text).map_err(|err| format!("not PEM: {err}"))?;
    Ok(blocks
        .into_iter()
        .filter(|block| block.tag() == "CERTIFICATE")
        .map(pem::Pem::into_contents)
        .collect())
}

/// Certificates as PEM text, one block after the other.
pub fn to_pem(certificates: &[Vec<u8>]) -> String {
    certificates
        .iter()
        .map(|der| pem::encode(&pem::Pem::new("CERTIFICATE", der.clone())))
        .collect()
}

/// What the agent needs to know about a leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// Hex, colon-separated, as `openssl x509 -serial` prints it (without the colons there).
    pub serial: String,
    /// The first URI SAN, the SPIFFE ID the CA put there.
    pub spiffe_id: Option<String>,
    /// The raw public key (for EC keys the curve point), to match against a private key.
    pub public_key: Vec<u8>,
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, cert)| cert)
        .map_err(|err| format!("not an X.509 certificate: {err}"))
}

fn unix(seconds: i64) -> Result<SystemTime, String> {
    u64::try_from(seconds)
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
        .map_err(|_| format!("validity before 1970 ({seconds})"))
}

impl Leaf {
    pub fn read(der: &[u8]) -> Result<Leaf, String> {
        let cert = parse(der)?;
        let spiffe_id = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .and_then(|san| {
                san.value.general_names.iter().find_map(|name| match name {
                    GeneralName::URI(uri) => Some((*uri).to_owned()),
                    _ => None,
                })
            });
        Ok(Leaf {
            not_before: unix(cert.validity().not_before.timestamp())?,
            not_after: unix(cert.validity().not_after.timestamp())?,
            serial: cert.tbs_certificate.raw_serial_as_string(),
            spiffe_id,
            public_key: cert.public_key().subject_public_key.data.to_vec(),
        })
    }

    /// Whether `key_pem` (PKCS#8) is this certificate's private key.
    pub fn matches_key(&self, key_pem: &str) -> Result<(), String> {
        let key = rcgen::KeyPair::from_pem(key_pem)
            .map_err(|err| format!("not a private key this agent writes: {err}"))?;
        if key.public_key_raw() == self.public_key.as_slice() {
            Ok(())
        } else {
            Err("the key is not the certificate's".to_owned())
        }
    }
}

/// How many intermediates a chain may hold before a root is reached.
const MAX_DEPTH: usize = 8;

/// Whether the first certificate of `chain` is signed, directly or through the rest of
/// `chain`, by one of `roots`.
pub fn verifies(chain: &[Vec<u8>], roots: &[Vec<u8>]) -> Result<(), String> {
    let parsed: Vec<X509Certificate<'_>> = chain
        .iter()
        .map(|der| parse(der))
        .collect::<Result<_, _>>()?;
    let roots: Vec<X509Certificate<'_>> = roots
        .iter()
        .map(|der| parse(der))
        .collect::<Result<_, _>>()?;
    let Some(mut current) = parsed.first() else {
        return Err("no certificate".to_owned());
    };
    let signs = |issuer: &X509Certificate<'_>, cert: &X509Certificate<'_>| {
        cert.issuer() == issuer.subject()
            && cert.verify_signature(Some(issuer.public_key())).is_ok()
    };
    for _ in 0..MAX_DEPTH {
        if roots.iter().any(|root| signs(root, current)) {
            return Ok(());
        }
        match parsed[1..].iter().find(|next| signs(next, current)) {
            Some(next) => current = next,
            None => break,
        }
    }
    Err("the certificate is not signed by any of the trusted roots".to_owned())
}

/// Unix seconds of `at`, for gauges.
pub fn unix_seconds(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `at` as RFC 3339 in whole seconds, for logs and health.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test root");
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
    }

    #[test]
    fn leaf_facts_key_match_and_chain() {
        let root = ca();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://cluster.local/ns/a/sa/b".try_into().unwrap(),
        )];
        let leaf = params.signed_by(&key, &root).unwrap();
        let facts = Leaf::read(leaf.der()).unwrap();
        assert_eq!(
            facts.spiffe_id.as_deref(),
            Some("spiffe://cluster.local/ns/a/sa/b")
        );
        assert!(facts.not_after > facts.not_before);
        assert!(facts.matches_key(&key.serialize_pem()).is_ok());
        let other = rcgen::KeyPair::generate().unwrap();
        assert!(facts.matches_key(&other.serialize_pem()).is_err());
        assert!(facts.matches_key("garbage").is_err());

        let chain = vec![leaf.der().to_vec()];
        assert!(verifies(&chain, &[root.der().to_vec()]).is_ok());
        let stranger = ca();
        assert!(verifies(&chain, &[stranger.der().to_vec()]).is_err());
        assert!(verifies(&[], &[root.der().to_vec()]).is_err());
        assert!(verifies(&[b"junk".to_vec()], &[root.der().to_vec()]).is_err());

        let text = to_pem(&[leaf.der().to_vec(), root.der().to_vec()]);
        assert_eq!(
            certificates(&text).unwrap(),
            [leaf.der().to_vec(), root.der().to_vec()]
        );
        assert_eq!(certificates("").unwrap(), Vec::<Vec<u8>>::new());
    }
}
