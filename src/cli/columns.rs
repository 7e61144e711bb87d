//! `dubbo-cp get <rule kind>` as kubectl prints it: NAMESPACE, NAME and the CRD's printer
//! columns (those kubectl shows without `-o wide`), read from the same generated CRDs, so the
//! two tools show the same columns.

use anyhow::Context;
use serde_json::Value;

/// The table of `list` (`{"items": [...]}`) of the rule kind `what` (a plural, singular or kind
/// name, as kubectl takes them).
pub fn table(what: &str, list: &Value) -> anyhow::Result<String> {
    let crd = crate::crds::crds()
        .into_iter()
        .find(|crd| {
            let names = &crd.spec.names;
            let wanted = what.to_ascii_lowercase();
            names.plural == wanted
                || names.singular.as_deref() == Some(wanted.as_str())
                || names.kind.to_ascii_lowercase() == wanted
        })
        .with_context(|| format!("{what:?} is not a rule kind"))?;
    let columns: Vec<(String, String)> = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.additional_printer_columns.clone())
        .unwrap_or_default()
        .into_iter()
        // kubectl's default view: no `priority` columns; Age needs a creation time, which
        // standalone objects do not have.
        .filter(|c| c.priority.unwrap_or(0) == 0 && c.type_ != "date")
        .map(|c| (c.name.to_ascii_uppercase(), c.json_path))
        .collect();
    // The auth kinds: who receives each policy, how many subscribed discovery streams do now,
    // and how many xDS servers enforce it.
    let audiences = list["audiences"].as_object();
    let mut header: Vec<String> = ["NAMESPACE", "NAME"]
        .into_iter()
        .map(str::to_owned)
        .chain(columns.iter().map(|(name, _)| name.clone()))
        .collect();
    if audiences.is_some() {
        header.extend([
            "RECEIVING".to_owned(),
            "XDS SERVERS".to_owned(),
            "AUDIENCE".to_owned(),
        ]);
    }
    let mut rows = vec![header];
    for item in list["items"].as_array().into_iter().flatten() {
        let meta = &item["metadata"];
        let mut row = vec![text(&meta["namespace"]), text(&meta["name"])];
        row.extend(columns.iter().map(|(_, path)| cell(item, path)));
        if let Some(audiences) = audiences {
            let key = format!("{}/{}", text(&meta["namespace"]), text(&meta["name"]));
            let audience = audiences.get(&key).unwrap_or(&Value::Null);
            row.push(format!(
                "{}/{}",
                text(&audience["receiving"]),
                text(&list["subscribers"])
            ));
            row.push(text(&audience["xdsServers"]));
            row.push(text(&audience["receivers"]));
        }
        rows.push(row);
    }
    Ok(aligned(&rows))
}

/// The value at a printer column's JSONPath (`.spec.key`, `.spec.tags[*].name`), as kubectl
/// prints it: list values joined with commas, `<none>` when absent.
fn cell(item: &Value, path: &str) -> String {
    let mut values = vec![item];
    for part in path.trim_start_matches('.').split('.') {
        let (field, all) = match part.strip_suffix("[*]") {
            Some(field) => (field, true),
            None => (part, false),
        };
        values = values
            .into_iter()
            .map(|v| &v[field])
            .flat_map(|v| match (all, v) {
                (true, Value::Array(items)) => items.iter().collect(),
                (true, _) => Vec::new(),
                (false, v) => vec![v],
            })
            .filter(|v| !v.is_null())
            .collect();
    }
    let texts: Vec<String> = values.into_iter().map(text).collect();
    if texts.is_empty() {
        "<none>".to_owned()
    } else {
        texts.join(",")
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "<none>".to_owned(),
        Value::Array(items) => items.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Columns padded to their widest cell, three spaces apart, as kubectl aligns them.
fn aligned(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tag_route_has_kubectls_columns() {
        let list = json!({"items": [{
            "metadata": {"namespace": "demo", "name": "shop-grey"},
            "spec": {"key": "shop", "enabled": true, "tags": [{"name": "grey"}, {"name": "canary"}]},
        }]});
        assert_eq!(
            table("tagroutes", &list).unwrap(),
            "NAMESPACE   NAME        KEY    ENABLED   TAGS\n\
             demo        shop-grey   shop   true      grey,canary\n"
        );
        assert!(table("nothing", &list).is_err());
    }
}
