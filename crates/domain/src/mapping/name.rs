//! Object names of ServiceNameMappings (wire.md §3).
//!
//! The reference name is `lowercase(interface with "." replaced by "-")`. Where that is not a
//! valid Kubernetes object name (characters outside `[a-z0-9-]`, a leading or trailing `-`, or
//! longer than 253 characters), the name is the *fallback*: the interface lower-cased with every
//! run of characters outside `[a-z0-9]` replaced by one `-`, cut to 242 characters and trimmed of
//! `-` at both ends, then `-` and the first 10 hex digits of the interface's 64-bit FNV-1a hash
//! (`snp-<hash>` when nothing is left). Deterministic across processes and versions.

/// Longest Kubernetes object name (a DNS-1123 subdomain).
const MAX_NAME: usize = 253;
/// Hex digits of the hash in a fallback name.
const HASH_DIGITS: usize = 10;

/// The object name of the mapping for `interface` when no other interface holds it: the
/// reference name where valid, else the fallback.
pub fn object_name(interface: &str) -> String {
    let reference = interface.replace('.', "-").to_lowercase();
    if is_valid_name(&reference) {
        return reference;
    }
    fallback_name(interface, HASH_DIGITS)
}

/// The names `interface` may take, in order of preference: the reference name (where valid),
/// the fallback with 10 hex digits, the fallback with all 16. Two interfaces can share the
/// reference name (`x.Y` and `x.y`, or `a.b` and `a-b`); the first to take it keeps it and the
/// other takes its fallback, which differs because the hash is of the raw interface.
pub fn candidate_names(interface: &str) -> Vec<String> {
    let mut names = vec![object_name(interface)];
    for digits in [HASH_DIGITS, 16] {
        let name = fallback_name(interface, digits);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

fn fallback_name(interface: &str, digits: usize) -> String {
    let lowered: String = interface.chars().flat_map(char::to_lowercase).collect();
    hashed_fallback(interface, &lowered, MAX_NAME, digits, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit()
    })
}

/// `<prefix>-<hash>` of at most `max_len` characters: the characters of `text` that `keep`
/// accepts, every run of others replaced by one `-`, trimmed so it starts and ends with a letter
/// or digit; then the first `digits` hex digits of the FNV-1a-64 hash of `interface`
/// (`snp-<hash>` when no prefix is left).
fn hashed_fallback(
    interface: &str,
    text: &str,
    max_len: usize,
    digits: usize,
    keep: impl Fn(char) -> bool,
) -> String {
    let mut prefix = String::with_capacity(text.len().min(max_len));
    for c in text.chars() {
        if keep(c) {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with('-') {
            prefix.push('-');
        }
    }
    prefix.truncate(max_len - digits - 1);
    let prefix = prefix.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = format!("{:016x}", fnv1a64(interface.as_bytes()));
    let hash = &hash[..digits.min(hash.len())];
    if prefix.is_empty() {
        format!("snp-{hash}")
    } else {
        format!("{prefix}-{hash}")
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// Longest label value.
const MAX_LABEL: usize = 63;

/// The value of the `interface` label: the raw interface name where it is a valid label value
/// (at most 63 characters of `[A-Za-z0-9-_.]`, starting and ending with a letter or digit);
/// otherwise every run of other characters becomes `-`, the result is cut to 52 characters and
/// trimmed to start and end with a letter or digit, and `-` plus the same 10-hex-digit hash as
/// [`object_name`] is appended.
pub fn label_value(interface: &str) -> String {
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let bytes = interface.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_LABEL
        && bytes.iter().all(allowed)
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
    if valid {
        return interface.to_owned();
    }
    hashed_fallback(interface, interface, MAX_LABEL, HASH_DIGITS, |c| {
        c.is_ascii_alphanumeric() || c == '_' || c == '.'
    })
}

/// The key a discovery-stream client sees: `<object name>/<namespace>`, or just the name when
/// the namespace is empty (wire.md §2).
pub fn client_key(name: &str, namespace: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{name}/{namespace}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_names_where_valid() {
        assert_eq!(
            object_name("org.apache.dubbo.demo.DemoService"),
            "org-apache-dubbo-demo-demoservice"
        );
        assert_eq!(object_name("a.b2.C"), "a-b2-c");
    }

    #[test]
    fn fallback_for_what_the_reference_rule_cannot_express() {
        let inner = object_name("org.example.Outer$Inner");
        assert!(inner.starts_with("org-example-outer-inner-"), "{inner}");
        assert_eq!(inner.len(), "org-example-outer-inner-".len() + 10);
        assert_eq!(
            inner,
            object_name("org.example.Outer$Inner"),
            "not deterministic"
        );
        assert_ne!(
            inner,
            object_name("org.example.Outer_Inner"),
            "distinct inputs collide"
        );

        let long = "a.".repeat(200) + "B";
        let name = object_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(is_valid_name(&name), "{name}");

        assert!(object_name("_").starts_with("snp-"));
        assert!(is_valid_name(&object_name("-lead.trail-")));
        assert!(is_valid_name(&object_name("Ünïcode.Sérvice")));
        // A fixed vector, so the documented rule cannot drift silently.
        assert_eq!(format!("{:016x}", fnv1a64(b"a")), "af63dc4c8601ec8c");
    }

    #[test]
    fn label_values_keep_the_raw_name_where_valid() {
        assert_eq!(
            label_value("org.apache.dubbo.demo.DemoService"),
            "org.apache.dubbo.demo.DemoService"
        );
        assert_eq!(label_value("a_b.C"), "a_b.C");
        let long = format!("org.example.{}", "x".repeat(80));
        let value = label_value(&long);
        assert!(value.len() <= 63, "{value}");
        assert!(value.starts_with("org.example.xxx"), "{value}");
        assert_ne!(value, label_value(&format!("{long}y")));
        let inner = label_value("a.Outer$Inner");
        assert!(inner.starts_with("a.Outer-Inner-"), "{inner}");
        assert!(label_value("$").starts_with("snp-"));
        let leading = label_value("_x$");
        assert!(
            leading.starts_with("x-"),
            "a label must start with a letter or digit: {leading}"
        );
    }

    #[test]
    fn case_variants_have_distinct_candidates() {
        let upper = candidate_names("x.Y");
        let lower = candidate_names("x.y");
        assert_eq!(upper[0], "x-y");
        assert_eq!(lower[0], "x-y");
        assert_ne!(upper[1], lower[1], "the fallback must tell them apart");
        assert!(upper.iter().all(|n| is_valid_name(n)), "{upper:?}");
        assert_eq!(upper.len(), 3);
        // Where the reference name is not valid, it is not a candidate.
        let inner = candidate_names("a.Outer$Inner");
        assert_eq!(inner.len(), 2, "{inner:?}");
        assert!(inner[1].ends_with(&format!("{:016x}", fnv1a64(b"a.Outer$Inner"))));
    }

    #[test]
    fn client_keys() {
        assert_eq!(client_key("n", "ns"), "n/ns");
        assert_eq!(client_key("n", ""), "n");
    }
}
