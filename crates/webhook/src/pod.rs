//! Reading and extending a pod as JSON: what the CA, registry and xDS injections share.

use serde_json::{Value, json};

/// Whether `list` (volumes, env, mounts) has an item named `name`.
pub(crate) fn named(list: Option<&Value>, name: &str) -> bool {
    list.and_then(Value::as_array)
        .is_some_and(|items| items.iter().any(|item| item["name"] == name))
}

/// The pod's containers (not its init containers).
pub(crate) fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Appends `item` to the array at `object[key]`, creating it.
pub(crate) fn push(object: &mut Value, key: &str, item: Value) {
    if !object[key].is_array() {
        object[key] = json!([]);
    }
    if let Some(items) = object[key].as_array_mut() {
        items.push(item);
    }
}
