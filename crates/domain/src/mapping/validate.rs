//! Validation of registrations (behaviour.md "Registration"). Runs before anything is queued, so
//! nothing of a bad request is ever stored.

use std::collections::BTreeSet;

use super::Registration;

/// Longest application name accepted, in bytes (a DNS subdomain's limit).
pub const MAX_APPLICATION_BYTES: usize = 253;
/// Longest interface name accepted, in bytes.
pub const MAX_INTERFACE_BYTES: usize = 1024;
/// Most interfaces one request may carry.
pub const MAX_INTERFACES_PER_REQUEST: usize = 1000;
/// Longest DNS-1123 label.
const MAX_NAMESPACE_BYTES: usize = 63;
/// How much of an offending value an error message quotes.
const QUOTED_VALUE_CHARS: usize = 80;

/// Why a registration was refused; `field` names the request field as SDKs spell it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason} (got {value})")]
pub struct ValidationError {
    pub field: String,
    pub value: String,
    pub reason: String,
}

impl ValidationError {
    fn new(field: impl Into<String>, value: &str, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            value: quote(value),
            reason: reason.into(),
        }
    }
}

/// Quotes a value for an error message, escaped and cut short so a huge input stays a short line.
pub(crate) fn quote(value: &str) -> String {
    let mut chars = value.chars();
    let shown: String = chars.by_ref().take(QUOTED_VALUE_CHARS).collect();
    if chars.next().is_some() {
        format!("{shown:?}... ({} bytes)", value.len())
    } else {
        format!("{shown:?}")
    }
}

/// Checks a raw request and turns it into a [`Registration`]; duplicate interfaces collapse.
pub fn validate_registration(
    namespace: &str,
    application: &str,
    interfaces: &[String],
) -> Result<Registration, ValidationError> {
    validate_namespace(namespace)?;
    validate_application(application)?;
    if interfaces.is_empty() {
        return Err(ValidationError::new(
            "interfaceNames",
            "",
            "at least one interface is required",
        ));
    }
    if interfaces.len() > MAX_INTERFACES_PER_REQUEST {
        return Err(ValidationError {
            field: "interfaceNames".into(),
            value: format!("{} interfaces", interfaces.len()),
            reason: format!("at most {MAX_INTERFACES_PER_REQUEST} interfaces per request"),
        });
    }
    let mut unique = BTreeSet::new();
    for (i, interface) in interfaces.iter().enumerate() {
        validate_interface(interface).map_err(|reason| {
            ValidationError::new(format!("interfaceNames[{i}]"), interface, reason)
        })?;
        unique.insert(interface.clone());
    }
    Ok(Registration {
        namespace: namespace.to_owned(),
        application: application.to_owned(),
        interfaces: unique,
        pod: None,
    })
}

/// A DNS-1123 label, as Kubernetes namespaces are.
fn validate_namespace(namespace: &str) -> Result<(), ValidationError> {
    let fail = |reason: &str| Err(ValidationError::new("namespace", namespace, reason));
    if namespace.is_empty() {
        return fail("must not be empty");
    }
    if namespace.len() > MAX_NAMESPACE_BYTES {
        return fail("must be at most 63 characters (a DNS-1123 label)");
    }
    let bytes = namespace.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    if !bytes.iter().all(allowed) {
        return fail("must consist of lower-case letters, digits and '-' (a DNS-1123 label)");
    }
    if bytes.first() == Some(&b'-') || bytes.last() == Some(&b'-') {
        return fail("must start and end with a letter or digit (a DNS-1123 label)");
    }
    Ok(())
}

fn validate_application(application: &str) -> Result<(), ValidationError> {
    let fail = |reason: &str| Err(ValidationError::new("applicationName", application, reason));
    if application.is_empty() {
        return fail("must not be empty");
    }
    if application.len() > MAX_APPLICATION_BYTES {
        return fail("must be at most 253 bytes");
    }
    if let Some(reason) = forbidden_char(application, true) {
        return fail(reason);
    }
    Ok(())
}

fn validate_interface(interface: &str) -> Result<(), &'static str> {
    if interface.is_empty() {
        return Err("must not be empty");
    }
    if interface.len() > MAX_INTERFACE_BYTES {
        return Err("must be at most 1024 bytes");
    }
    forbidden_char(interface, false).map_or(Ok(()), Err)
}

/// Whitespace and control characters break the comma-joined lists and labels SDKs build from
/// these names; commas are list separators in application names.
fn forbidden_char(value: &str, no_commas: bool) -> Option<&'static str> {
    for c in value.chars() {
        if c.is_control() {
            return Some("must not contain control characters");
        }
        if c.is_whitespace() {
            return Some("must not contain whitespace");
        }
        if no_commas && c == ',' {
            return Some("must not contain commas");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn field_of(ns: &str, app: &str, ifaces: &[&str]) -> String {
        validate_registration(ns, app, &strings(ifaces))
            .expect_err("expected an error")
            .field
    }

    #[test]
    fn accepts_a_typical_registration_and_collapses_duplicates() {
        let reg = validate_registration(
            "dubbo-system",
            "demo-provider",
            &strings(&[
                "org.apache.dubbo.demo.DemoService",
                "org.apache.dubbo.demo.DemoService",
                "a.B$Inner",
            ]),
        )
        .map_err(|e| e.to_string());
        let reg = reg.as_ref().map(|r| r.interfaces.len());
        assert_eq!(reg, Ok(2));
    }

    #[test]
    fn namespace_must_be_a_dns_label() {
        for bad in [
            "",
            "Default",
            "-ns",
            "ns-",
            "ns_1",
            "ns.a",
            &"a".repeat(64),
            "nß",
        ] {
            assert_eq!(
                field_of(bad, "app", &["I"]),
                "namespace",
                "namespace {bad:?}"
            );
        }
        for good in ["a", "default", "ns-1", &"a".repeat(63)] {
            assert!(
                validate_registration(good, "app", &strings(&["I"])).is_ok(),
                "{good:?}"
            );
        }
    }

    #[test]
    fn application_rules() {
        for bad in [
            "",
            "a b",
            "a,b",
            "a\tb",
            "a\u{7}b",
            "a\u{a0}b",
            &"a".repeat(254),
        ] {
            assert_eq!(
                field_of("ns", bad, &["I"]),
                "applicationName",
                "application {bad:?}"
            );
        }
        assert!(validate_registration("ns", &"a".repeat(253), &strings(&["I"])).is_ok());
    }

    #[test]
    fn interface_rules_name_the_index() {
        assert_eq!(field_of("ns", "app", &[]), "interfaceNames");
        assert_eq!(field_of("ns", "app", &["ok", ""]), "interfaceNames[1]");
        assert_eq!(field_of("ns", "app", &["a b"]), "interfaceNames[0]");
        assert_eq!(field_of("ns", "app", &["a\nb"]), "interfaceNames[0]");
        assert_eq!(
            field_of("ns", "app", &[&"i".repeat(1025)]),
            "interfaceNames[0]"
        );
        assert!(validate_registration("ns", "app", &strings(&[&"i".repeat(1024)])).is_ok());
        let many: Vec<String> = (0..1001).map(|i| format!("I{i}")).collect();
        let err = validate_registration("ns", "app", &many).err();
        assert_eq!(err.map(|e| e.field), Some("interfaceNames".to_string()));
        let most: Vec<String> = (0..1000).map(|i| format!("I{i}")).collect();
        assert!(validate_registration("ns", "app", &most).is_ok());
    }

    #[test]
    fn message_quotes_the_value_escaped_and_short() {
        let err =
            validate_registration("ns", "app", &strings(&[&format!("x\n{}", "y".repeat(500))]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
        assert!(
            err.starts_with("interfaceNames[0]: must not contain control characters (got \"x\\n"),
            "{err}"
        );
        assert!(err.contains("(502 bytes)"), "{err}");
        assert!(err.len() < 200, "{err}");
    }
}
