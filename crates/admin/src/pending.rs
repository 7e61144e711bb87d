//! `/debug/mappings/pending`: registrations acknowledged (`success`) that clients are not served
//! yet, because writes are merged every debounce window before they reach the store's readers,
//! the API server or ZooKeeper. `dubbo-cp get mappings` says so when there are any: a read right
//! after a write can lag by that window, and is not a lost write.

use super::*;

/// Pairs named in an answer; the count covers all.
const EXAMPLES: usize = 10;

pub(super) async fn pending_mappings(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    // Comparing every mapping is CPU work on a large state: off the async threads.
    let pending = tokio::task::spawn_blocking(move || {
        // Acknowledged and waiting to be written (Kubernetes and ZooKeeper modes), and written
        // (standalone: the store; Kubernetes: the watched objects) but not yet in the index.
        let (mut durable, parked) = match (&state.zookeeper, &state.outbox) {
            (Some(zk), _) => (zk.outbox.pending(), zk.writer.parked()),
            (None, Some((writer, outbox))) => (outbox.pending(), writer.parked()),
            (None, None) => (BTreeMap::new(), Vec::new()),
        };
        // A key whose write failed for good is not merging: `/debug/outbox` says why.
        let parked: BTreeSet<(String, String)> = parked
            .into_iter()
            .map(|p| (p.namespace, p.interface_name))
            .collect();
        durable.retain(|key, _| !parked.contains(&(key.namespace.clone(), key.interface.clone())));
        for (key, applications) in state.mappings.snapshot() {
            durable.entry(key).or_default().extend(applications);
        }
        let served = served_mappings(&state.index);
        let mut pairs = Vec::new();
        for (key, applications) in durable {
            let known = served.get(&key);
            for application in applications {
                if known.is_none_or(|apps| !apps.contains(&application)) {
                    pairs.push(format!(
                        "{}/{}: {application}",
                        key.namespace, key.interface
                    ));
                }
            }
        }
        (pairs, parked.len())
    })
    .await
    .map_err(|_| api_error(StatusCode::INTERNAL_SERVER_ERROR, "pending failed"))?;
    let (pending, parked) = pending;
    Ok(Json(serde_json::json!({
        "pending": pending.len(),
        "examples": pending.iter().take(EXAMPLES).collect::<Vec<_>>(),
        // Keys whose write failed for good (see /debug/outbox), left out of `pending`.
        "parked": parked,
    })))
}
