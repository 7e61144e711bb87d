//! Every CRD of deploy/ against the real API server's CEL cost estimator, with margin: a copy of
//! each in which every rule `R` is rewritten `(R) && (R)` and listed twice (each rule's cost
//! doubles, the schema's total roughly quadruples) must still be accepted. Then each CRD's cost
//! is measured the only way the server tells it: by making it fail on purpose (every rule
//! repeated and listed until over the budget) and reading the factor it reports.

use serde_json::{Value, json};

use crate::common::kube_local::Cluster;

/// Rewrites every `x-kubernetes-validations` list: each rule repeated `repeat` times (joined
/// by `&&`) and the whole entry listed `copies` times. Returns how many rules there were.
fn amplify(node: &mut Value, repeat: usize, copies: usize) -> usize {
    let mut rules = 0;
    match node {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if key == "x-kubernetes-validations" {
                    let original = value.as_array().cloned().unwrap_or_default();
                    rules += original.len();
                    let mut amplified = Vec::new();
                    for rule in &original {
                        let text = rule["rule"].as_str().unwrap();
                        let joined = vec![format!("({text})"); repeat].join(" && ");
                        for _ in 0..copies {
                            let mut copy = rule.clone();
                            copy["rule"] = json!(joined);
                            amplified.push(copy);
                        }
                    }
                    *value = Value::Array(amplified);
                } else {
                    rules += amplify(value, repeat, copies);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                rules += amplify(item, repeat, copies);
            }
        }
        _ => {}
    }
    rules
}

/// A copy of `crd` under another name (so it can be created beside the real one).
fn renamed(crd: &Value) -> Value {
    let mut copy = crd.clone();
    let names = &mut copy["spec"]["names"];
    let plural = format!("{}margin", names["plural"].as_str().unwrap());
    let kind = format!("{}Margin", names["kind"].as_str().unwrap());
    *names = json!({
        "plural": plural, "singular": format!("{}margin", names["singular"].as_str().unwrap()),
        "kind": kind, "listKind": format!("{kind}List"),
    });
    let group = copy["spec"]["group"].as_str().unwrap().to_owned();
    copy["metadata"] = json!({"name": format!("{plural}.{group}")});
    copy
}

/// Creates `crd` with `--dry-run=server`: Ok, or the API server's complaint.
fn dry_run(cluster: &Cluster, crd: &Value) -> Result<(), String> {
    let output = cluster.kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&crd.to_string()),
    );
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The largest "exceeds budget by factor of F" the API server reported, per kind of budget:
/// (per rule, whole schema).
fn factors(complaint: &str) -> (Option<f64>, Option<f64>) {
    let mut per_rule: Option<f64> = None;
    let mut total: Option<f64> = None;
    for part in complaint.split("estimated rule cost").skip(1) {
        let Some(at) = part.find("by factor of ") else {
            continue;
        };
        let number: String = part[at + 13..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let Ok(factor) = number.parse::<f64>() else {
            continue;
        };
        let slot = if part.starts_with(" total") {
            &mut total
        } else {
            &mut per_rule
        };
        *slot = Some(slot.map_or(factor, |f: f64| f.max(factor)));
    }
    (per_rule, total)
}

pub fn fit_the_budget_with_margin(cluster: &Cluster) {
    let text = include_str!("../../deploy/crd.yaml");
    let mut report = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let crd = <Value as serde::Deserialize>::deserialize(document).unwrap();
        let name = crd["metadata"]["name"].as_str().unwrap().to_owned();
        let mut margin = renamed(&crd);
        let rules = amplify(&mut margin, 2, 2);
        if let Err(complaint) = dry_run(cluster, &margin) {
            let (per_rule, total) = factors(&complaint);
            panic!(
                "{name}: with every rule doubled and listed twice the API server refuses it \
                 (per rule over budget by {per_rule:?}x, schema total by {total:?}x): the CRD is \
                 not within half of its CEL budget\n{complaint}"
            );
        }
        if rules == 0 {
            report.push(format!("{name}: no CEL rules (cost 0)"));
            continue;
        }
        // Over the budget on purpose: each rule 1,000 times (its cost x1000) listed 10 times
        // (the total x4,000); a 3 MiB request bounds how far this can go.
        let (repeat, copies) = (1000, 4);
        let mut probe = renamed(&crd);
        amplify(&mut probe, repeat, copies);
        let line = match dry_run(cluster, &probe) {
            Ok(()) => format!(
                "{name}: {rules} rule(s); still accepted with costs x{repeat} per rule and \
                 x{} in total: each rule < 1/{repeat} of the per-rule budget, the total < 1/{} \
                 of the per-CRD budget",
                repeat * copies,
                repeat * copies
            ),
            Err(complaint) => {
                let (per_rule, total) = factors(&complaint);
                assert!(
                    per_rule.is_some() || total.is_some(),
                    "{name}: the probe was refused for another reason: {complaint}"
                );
                let share = |f: Option<f64>, by: usize| {
                    f.map_or(format!("< 1/{by}"), |f| format!("{:.6}", f / by as f64))
                };
                format!(
                    "{name}: {rules} rule(s); most costly rule = {} of the per-rule budget, \
                     total = {} of the per-CRD budget (API server's factors {per_rule:?} at \
                     x{repeat}, {total:?} at x{})",
                    share(per_rule, repeat),
                    share(total, repeat * copies),
                    repeat * copies
                )
            }
        };
        report.push(line);
    }
    // The closing note's numbers come from here (cargo test --test e2e_kube -- --nocapture).
    for line in &report {
        eprintln!("CEL cost: {line}");
    }
    assert_eq!(report.len(), 10, "{report:#?}");
}
