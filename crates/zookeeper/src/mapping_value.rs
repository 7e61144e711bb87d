//! The value of a mapping node, byte for byte as Dubbo's metadata report keeps it: application
//! names joined by `,` in append order, no spaces, no empty items (Java trims and drops empty
//! items when it reads; dubbo-go splits on `,` and does neither, so we never write them).

/// Largest mapping value read; larger ones are reported and skipped (ZooKeeper's own limit is
/// about 1 MiB, far above any real list of applications).
pub const MAX_VALUE_BYTES: usize = 256 * 1024;

/// Why a mapping node's value was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("is {0} bytes, over the {MAX_VALUE_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("is not UTF-8 text (Dubbo writes application names joined by ',')")]
    NotUtf8,
}

/// The applications a node names, as Java's reader sees them: split on `,`, trimmed, empty ones
/// dropped; in node order, duplicates once.
pub fn parse(data: &[u8]) -> Result<Vec<String>, ValueError> {
    if data.len() > MAX_VALUE_BYTES {
        return Err(ValueError::TooLarge(data.len()));
    }
    let text = std::str::from_utf8(data).map_err(|_| ValueError::NotUtf8)?;
    let mut seen = std::collections::HashSet::new();
    Ok(text
        .split(',')
        .map(str::trim)
        .filter(|app| !app.is_empty() && seen.insert(*app))
        .map(str::to_owned)
        .collect())
}

/// The new value once `applications` are appended to `current` (the node's raw text) as Java's
/// `MetadataServiceNameMapping` appends one: an application already listed (the exact item, not
/// a substring as dubbo-go tests it) is not added again. None when nothing is missing. A value
/// written with spaces or empty items (`java-app, go-app,,`) is written back as readers should
/// see it (`java-app,go-app,...`): dubbo-go would read ` go-app`.
pub fn append<'a>(
    current: &str,
    applications: impl IntoIterator<Item = &'a String>,
) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    let mut listed: Vec<&str> = Vec::new();
    for item in current.split(',').map(str::trim) {
        if !item.is_empty() && seen.insert(item) {
            listed.push(item);
        }
    }
    let before = listed.len();
    for application in applications {
        if seen.insert(application.as_str()) {
            listed.push(application);
        }
    }
    (listed.len() > before).then(|| listed.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apps(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn reads_as_java_does() {
        assert_eq!(parse(b"a,b").unwrap(), apps(&["a", "b"]));
        assert_eq!(parse(b" a , ,b,a,").unwrap(), apps(&["a", "b"]));
        assert_eq!(parse(b"").unwrap(), apps(&[]));
        assert_eq!(parse(&[0xff, 0xfe]), Err(ValueError::NotUtf8));
        let big = vec![b'a'; MAX_VALUE_BYTES + 1];
        assert_eq!(parse(&big), Err(ValueError::TooLarge(MAX_VALUE_BYTES + 1)));
    }

    #[test]
    fn appends_in_order_with_exact_items() {
        assert_eq!(append("", &apps(&["a"])).as_deref(), Some("a"));
        assert_eq!(append("a", &apps(&["b", "c"])).as_deref(), Some("a,b,c"));
        // `order` is not `order-v2` (dubbo-go's substring test would skip it).
        assert_eq!(
            append("order-v2", &apps(&["order"])).as_deref(),
            Some("order-v2,order")
        );
        assert_eq!(append("a,b", &apps(&["b", "a"])), None);
        // A list someone else wrote with spaces keeps its items; ours adds none.
        assert_eq!(append("a, b", &apps(&["b"])), None);
        assert_eq!(append("a,", &apps(&["c"])).as_deref(), Some("a,c"));
        // Adding to such a list writes it back without spaces or empty items.
        assert_eq!(
            append("java-app, go-app,,", &apps(&["rust-app"])).as_deref(),
            Some("java-app,go-app,rust-app")
        );
        assert_eq!(append(" a ,a, b", &apps(&["c"])).as_deref(), Some("a,b,c"));
        assert_eq!(append("", &apps(&["x", "x"])).as_deref(), Some("x"));
    }
}
