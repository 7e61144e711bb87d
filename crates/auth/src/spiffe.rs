//! Identities from client certificates: the SPIFFE ID in a URI SAN,
//! `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`. The TLS handshake has
//! already verified the certificate against the configured client CA.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use x509_parser::extensions::GeneralName;

use super::{AuthError, Identity};

/// The identity in `der` (the client's leaf certificate), `None` when it carries no SPIFFE ID.
pub fn identity_from_certificate(
    der: &[u8],
    trust_domain: Option<&str>,
) -> Result<Option<Identity>, AuthError> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der)
        .map_err(|_| AuthError::Malformed("client certificate does not parse"))?;
    let Ok(Some(names)) = certificate.subject_alternative_name() else {
        return Ok(None);
    };
    // The handshake checked the validity; a connection may outlive it.
    let not_after = certificate.validity().not_after.timestamp();
    let expiry = UNIX_EPOCH + Duration::from_secs(u64::try_from(not_after).unwrap_or(0));
    if SystemTime::now() > expiry {
        return Err(AuthError::Rejected(
            "the client certificate of this connection has expired; reconnect with a fresh one"
                .to_owned(),
        ));
    }
    for name in &names.value.general_names {
        if let GeneralName::URI(uri) = name
            && let Some(id) = uri.strip_prefix("spiffe://")
        {
            return parse_spiffe_id(id, trust_domain).map(|identity| {
                Some(Identity {
                    credential_expiry: Some(expiry),
                    credential_id: Some(format!("cert {}", certificate.raw_serial_as_string())),
                    ..identity
                })
            });
        }
    }
    Ok(None)
}

/// The identity a full SPIFFE ID (`spiffe://...`) names, e.g. a `dubbo-jwt` token's `sub`.
pub fn identity_from_spiffe_id(
    uri: &str,
    trust_domain: Option<&str>,
) -> Result<Identity, AuthError> {
    let id = uri
        .strip_prefix("spiffe://")
        .ok_or_else(|| AuthError::Rejected(format!("{uri:?} is not a SPIFFE ID (spiffe://...)")))?;
    parse_spiffe_id(id, trust_domain)
}

/// `<trust domain>/ns/<namespace>/sa/<service account>` (after `spiffe://`).
fn parse_spiffe_id(id: &str, trust_domain: Option<&str>) -> Result<Identity, AuthError> {
    let malformed = || {
        AuthError::Rejected(format!(
            "SPIFFE ID spiffe://{id} is not spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
        ))
    };
    let mut parts = id.split('/');
    let domain = parts
        .next()
        .filter(|d| !d.is_empty())
        .ok_or_else(malformed)?;
    if let Some(expected) = trust_domain
        && domain != expected
    {
        return Err(AuthError::Rejected(format!(
            "SPIFFE trust domain {domain} is not {expected}"
        )));
    }
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some("ns"), Some(namespace), Some("sa"), Some(account), None)
            if !namespace.is_empty() && !account.is_empty() =>
        {
            Ok(Identity {
                spiffe_id: Some(format!("spiffe://{id}")),
                ..Identity::service_account(namespace, account)
            })
        }
        _ => Err(malformed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids() {
        let identity = parse_spiffe_id("cluster.local/ns/demo/sa/provider", None);
        assert_eq!(
            identity.map(|i| i.name).ok().as_deref(),
            Some("demo/provider")
        );
        assert!(parse_spiffe_id("cluster.local/ns/demo/sa/provider", Some("other")).is_err());
        for bad in [
            "",
            "td",
            "td/ns/demo",
            "td/ns//sa/x",
            "td/ns/a/sa/b/c",
            "td/namespace/a/sa/b",
        ] {
            assert!(parse_spiffe_id(bad, None).is_err(), "{bad:?}");
        }
    }
}
