//! The read-only views of the state (`/debug/...`): sources, mappings, applications, clients,
//! digests, the outbox and the Canaries.

use super::*;

/// One source of the index as `/debug/sources` lists it.
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct SourceView {
    pub kind: String,
    pub loaded: bool,
    /// `synced`, `loading` (no first answer yet), `crd-missing` (served empty, or its last
    /// state, until the CRD is installed) or `failing` (see `condition` for the last error).
    #[serde(default)]
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// The row of the backing store itself (kind `ZooKeeper`): its full state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}

/// ZooKeeper mode's own row of `/debug/sources`: the ensemble, the session, what is watched, the
/// last sync and the last error; `detail` has every unreadable node.
fn zookeeper_source(state: &crate::zookeeper::stats::SourceState) -> SourceView {
    let mut condition = vec![format!(
        "{}: {} session {} ({} nodes watched)",
        state.session,
        state.ensemble,
        state.session_id.as_deref().unwrap_or("none"),
        state.watched_nodes
    )];
    if !state.unreadable.is_empty() {
        condition.push(format!("{} unreadable nodes", state.unreadable.len()));
    }
    if let Some((at, error)) = &state.last_error {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(*at);
        condition.push(format!(
            "last error at {}: {error}",
            humantime::format_rfc3339_seconds(at)
        ));
    }
    SourceView {
        kind: "ZooKeeper".to_owned(),
        loaded: state.last_sync.is_some(),
        state: state.session.clone(),
        condition: Some(condition.join("; ")),
        detail: serde_json::to_value(state).ok(),
    }
}

/// Each kind's source: loaded or not, and why it is not healthy (`dubbo-cp status` prints it).
pub(super) async fn debug_sources(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<Vec<SourceView>>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let views = state
        .index
        .sources()
        .into_iter()
        .map(|(kind, loaded, condition)| SourceView {
            kind: kind.name().to_owned(),
            loaded,
            state: match (&condition, loaded) {
                (Some(c), _) if c.problem == SourceProblem::CrdMissing => "crd-missing",
                (Some(_), _) => "failing",
                (None, true) => "synced",
                (None, false) => "loading",
            }
            .to_owned(),
            condition: condition.map(|c| c.message),
            detail: None,
        })
        .collect::<Vec<_>>();
    let mut views = views;
    if let Some(zk) = &state.zookeeper {
        views.push(zookeeper_source(&zk.stats.state()));
        if let Some(ca) = &state.ca {
            let problem = ca.fleet_problem();
            views.push(SourceView {
                kind: "CA".to_owned(),
                loaded: ca.current().is_some(),
                state: if problem.is_some() {
                    "disagreeing"
                } else {
                    "agreeing"
                }
                .to_owned(),
                condition: Some(problem.unwrap_or_else(|| {
                    "every replica on the ensemble trusts this replica's root".to_owned()
                })),
                detail: None,
            });
        }
    }
    Ok(Json(views))
}

/// One stored mapping as the debug endpoint lists it.
#[derive(Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MappingView {
    pub namespace: String,
    pub interface_name: String,
    pub application_names: Vec<String>,
}

pub(super) fn views(mappings: BTreeMap<MappingKey, BTreeSet<String>>) -> Json<Vec<MappingView>> {
    let views = mappings
        .into_iter()
        .map(|(key, apps)| MappingView {
            namespace: key.namespace,
            interface_name: key.interface,
            application_names: apps.into_iter().collect(),
        })
        .collect();
    Json(views)
}

/// The stored mappings: the embedded store, or what the watch sees in the cluster.
pub(super) async fn list_mappings(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<Vec<MappingView>>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    Ok(views(state.mappings.snapshot()))
}

/// The applications of a namespace and the interfaces each serves: the mappings read the
/// other way round.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationView {
    pub namespace: String,
    pub application: String,
    pub interfaces: Vec<String>,
    /// Kubernetes mode: the distinct pods recorded as registering it (see
    /// [`crate::mapping::registrants`]); `None` where no pod is tracked (standalone, pinned, or
    /// never registered by a pod).
    #[serde(default)]
    pub registering_pods: Option<usize>,
}

#[derive(serde::Deserialize)]
pub(super) struct ApplicationQuery {
    namespace: Option<String>,
    application: Option<String>,
}

/// `/debug/applications[?namespace=NS][&application=APP]`.
pub(super) async fn list_applications(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ApplicationQuery>,
) -> Result<Json<Vec<ApplicationView>>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let mut views = applications(
        state.mappings.snapshot(),
        query.namespace.as_deref(),
        query.application.as_deref(),
    );
    if let MappingSource::Cluster(cluster) = &state.mappings {
        count_pods(&mut views, &cluster.registrants());
    }
    Ok(Json(views))
}

/// Fills in the registering pods of each application from the objects' records.
pub(super) fn count_pods(
    views: &mut [ApplicationView],
    records: &crate::mapping::registrants::SharedRegistrants,
) {
    use crate::mapping::registrants::Pods;
    for view in views {
        let mut pods = BTreeSet::new();
        let mut tracked = false;
        for interface in &view.interfaces {
            let key = MappingKey::new(view.namespace.clone(), interface.clone());
            if let Some(record) = records.get(&key)
                && let Some(Pods::Tracked(recorded)) = record.get(&view.application)
            {
                tracked = true;
                pods.extend(recorded.iter().cloned());
            }
        }
        view.registering_pods = tracked.then_some(pods.len());
    }
}

/// Inverts the mappings: per (namespace, application) the interfaces it serves, sorted.
pub fn applications(
    mappings: BTreeMap<MappingKey, BTreeSet<String>>,
    namespace: Option<&str>,
    application: Option<&str>,
) -> Vec<ApplicationView> {
    let mut by_app: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (key, apps) in mappings {
        if namespace.is_some_and(|ns| ns != key.namespace) {
            continue;
        }
        for app in apps {
            if application.is_some_and(|wanted| wanted != app) {
                continue;
            }
            by_app
                .entry((key.namespace.clone(), app))
                .or_default()
                .push(key.interface.clone());
        }
    }
    by_app
        .into_iter()
        .map(|((namespace, application), interfaces)| ApplicationView {
            namespace,
            application,
            interfaces,
            registering_pods: None,
        })
        .collect()
}

/// `/debug/clients`: every open discovery stream and how far its client has got.
#[derive(serde::Deserialize, Default)]
pub(super) struct ClientQuery {
    namespace: Option<String>,
    kind: Option<String>,
    /// Only subscriptions behind the current revision.
    #[serde(default)]
    stale: bool,
    /// At most this many streams in the answer (the counts cover all).
    limit: Option<usize>,
    /// Streams skipped before the answer's first (`/debug/xds`: a page).
    #[serde(default)]
    offset: usize,
}

/// `/debug/clients[?namespace=][&kind=][&stale=true][&offset=N][&limit=N]`: open streams and how
/// far each client has got; `total` and `stale` count every open stream, `truncated` says the
/// page ends before the last match.
pub(super) async fn list_clients(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ClientQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let all = state.clients.views(&state.index);
    let total = all.len();
    let stale = all
        .iter()
        .filter(|c| c.kinds.iter().any(|k| !k.synced))
        .count();
    let mut matching: Vec<_> = all
        .into_iter()
        .filter(|c| {
            query
                .namespace
                .as_ref()
                .is_none_or(|ns| c.namespace.as_ref() == Some(ns))
        })
        .filter_map(|mut c| {
            c.kinds.retain(|k| {
                query
                    .kind
                    .as_ref()
                    .is_none_or(|kind| k.kind.eq_ignore_ascii_case(kind))
                    && (!query.stale || !k.synced)
            });
            (!c.kinds.is_empty() || (query.kind.is_none() && !query.stale)).then_some(c)
        })
        .skip(query.offset)
        .collect();
    let truncated = query.limit.is_some_and(|limit| matching.len() > limit);
    if let Some(limit) = query.limit {
        matching.truncate(limit);
    }
    Ok(Json(serde_json::json!({
        "clients": matching, "total": total, "stale": stale, "truncated": truncated,
    })))
}

/// xDS streams a `/debug/xds` answer holds at most (and unless `limit` says fewer): each is about
/// a kilobyte with its names.
const XDS_PAGE_MAX: usize = 1000;

/// `/debug/xds[?namespace=][&stale=true][&offset=N][&limit=N]`: open xDS streams: node,
/// namespace, protocol, per type the names subscribed, the versions sent and acknowledged and
/// the last rejection (NACK), and why a stream is not in step (`stale`). `total` and `stale`
/// count every stream of the namespace; `offset` and `limit` page through them.
pub(super) async fn list_xds_clients(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ClientQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let Some(clients) = &state.xds_clients else {
        return Ok(Json(serde_json::json!({"enabled": false, "clients": []})));
    };
    let limit = query.limit.unwrap_or(XDS_PAGE_MAX);
    if limit > XDS_PAGE_MAX {
        return Err(api_error(
            StatusCode::BAD_REQUEST,
            format!("limit {limit} is over {XDS_PAGE_MAX}; page with offset"),
        ));
    }
    let clients = clients.clone();
    // Every stream's state is read (each under its own lock): off the async threads.
    let page = tokio::task::spawn_blocking(move || {
        clients.page(
            |c| query.namespace.as_ref().is_none_or(|ns| &c.namespace == ns),
            |c| !query.stale || !c.stale.is_empty(),
            query.offset,
            limit,
        )
    })
    .await
    .map_err(|_| {
        api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "listing xDS clients failed",
        )
    })?;
    let truncated = query.offset + page.clients.len() < page.matched;
    Ok(Json(serde_json::json!({
        "enabled": true, "clients": page.clients, "total": page.total, "stale": page.stale,
        "matched": page.matched, "offset": query.offset, "truncated": truncated,
        "current": page.current.map(|v| v.to_string()),
    })))
}

#[derive(serde::Deserialize)]
pub(super) struct DumpQuery {
    /// Only the clients whose node ID is this.
    node: Option<String>,
    namespace: Option<String>,
    /// At most this many clients (default [`DUMP_LIMIT`], at most [`DUMP_MAX`]: a dump is
    /// large).
    limit: Option<usize>,
}

/// Clients a config dump holds unless `limit` says otherwise, and the most it holds.
const DUMP_LIMIT: usize = 100;
const DUMP_MAX: usize = 1000;

/// `/debug/xds/config_dump[?node=][&namespace=][&limit=N]`: what each xDS client was served, as
/// CSDS's `ClientStatusResponse` (`config`: one `ClientConfig` per stream) in protobuf JSON,
/// the shape clients show of themselves through CSDS. A client whose dump cannot be rendered is
/// listed with the error instead.
pub(super) async fn xds_config_dump(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<DumpQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let Some(clients) = &state.xds_clients else {
        return Ok(Json(serde_json::json!({"enabled": false, "config": []})));
    };
    let limit = query.limit.unwrap_or(DUMP_LIMIT);
    if limit > DUMP_MAX {
        return Err(api_error(
            StatusCode::BAD_REQUEST,
            format!("limit {limit} is over {DUMP_MAX}; ask per node or namespace"),
        ));
    }
    let mut matching: Vec<_> = clients
        .list()
        .into_iter()
        .filter(|c| query.node.as_ref().is_none_or(|node| &c.node_id == node))
        .filter(|c| query.namespace.as_ref().is_none_or(|ns| &c.namespace == ns))
        .collect();
    let total = matching.len();
    matching.truncate(limit);
    // Rendering JSON from descriptors is CPU work: off the async threads.
    let rendered = tokio::task::spawn_blocking(move || {
        matching
            .iter()
            .map(|client| {
                let config = dubbo_cp_xds::dump::client_config(client);
                dubbo_cp_xds::dump::to_json(&config).unwrap_or_else(
                    |e| serde_json::json!({"node": {"id": client.node_id}, "error": e.to_string()}),
                )
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|_| api_error(StatusCode::INTERNAL_SERVER_ERROR, "config dump failed"))?;
    Ok(Json(serde_json::json!({
        "enabled": true, "config": rendered, "total": total, "truncated": total > limit,
    })))
}

#[derive(serde::Deserialize)]
pub(super) struct DigestQuery {
    #[serde(default)]
    objects: bool,
}

/// `/debug/digest[?objects=true]`: per kind the digest of the served state and its revision.
pub(super) async fn digest(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<DigestQuery>,
) -> Result<Json<crate::digest::DigestView>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let index = state.index.clone();
    // Hashing a large state is CPU work: off the async threads.
    let encoder = state.encoder.clone();
    let mut view =
        tokio::task::spawn_blocking(move || crate::digest::view(&index, &encoder, query.objects))
            .await
            .map_err(|_| api_error(StatusCode::INTERNAL_SERVER_ERROR, "digest failed"))?;
    // Replicas that issue from different roots make workloads that cannot talk: compared too.
    if let Some(bundle) = state.ca.as_ref().and_then(|ca| ca.current()) {
        view.ca_roots = bundle.trusted().map(|r| r.fingerprint.clone()).collect();
    }
    Ok(Json(view))
}

/// What `/debug/outbox` shows.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxView {
    /// Acknowledged pairs not yet written to the API server.
    pub pending: Vec<MappingView>,
    /// Keys whose write failed for a reason retrying soon cannot fix, with the reason.
    pub parked: Vec<ParkedKey>,
}

/// Kubernetes mode: what is acknowledged but not in the cluster yet, and what is stuck and
/// why. Standalone has no outbox: the answer is empty.
pub(super) async fn list_outbox(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<OutboxView>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    if let Some(zk) = &state.zookeeper {
        return Ok(Json(OutboxView {
            pending: views(zk.outbox.pending()).0,
            parked: zk.writer.parked(),
        }));
    }
    let Some((writer, outbox)) = &state.outbox else {
        return Ok(Json(OutboxView::default()));
    };
    Ok(Json(OutboxView {
        pending: views(outbox.pending()).0,
        parked: writer.parked(),
    }))
}

/// At most this many Canaries per `/debug/canaries` answer.
pub(super) const CANARY_LIMIT: u32 = 200;

/// `/debug/canaries[?namespace=]`: each Canary's run, weight history and metric results, read
/// from the API server (the dashboard's chart).
pub(super) async fn list_canaries(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ClientQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let Some(client) = state.canaries.clone() else {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "canaries run in Kubernetes mode with canary.enabled",
        ));
    };
    let api: kube::Api<crate::canary::Canary> = match &query.namespace {
        Some(namespace) => kube::Api::namespaced(client, namespace),
        None => kube::Api::all(client),
    };
    let list = api
        .list(&kube::api::ListParams::default().limit(CANARY_LIMIT))
        .await
        .map_err(|e| api_error(StatusCode::BAD_GATEWAY, format!("listing canaries: {e}")))?;
    let truncated = list
        .metadata
        .continue_
        .as_ref()
        .is_some_and(|c| !c.is_empty());
    let canaries: Vec<serde_json::Value> = list
        .items
        .iter()
        .map(|canary| {
            let status = canary.status.clone().unwrap_or_default();
            serde_json::json!({
                "namespace": canary.metadata.namespace,
                "name": canary.metadata.name,
                "target": canary.spec.target_ref.name,
                "phase": status.phase,
                "strategy": status.strategy,
                "iterations": status.iterations,
                "wantedIterations": canary.spec.analysis.iterations,
                "match": canary.spec.analysis.r#match,
                "affinityHeader": canary
                    .spec
                    .analysis
                    .session_affinity
                    .as_ref()
                    .and_then(|a| a.header_name.clone()),
                "weight": status.canary_weight,
                "maxWeight": canary.spec.analysis.max_weight,
                "failedChecks": status.failed_checks,
                "threshold": canary.spec.analysis.threshold,
                "revision": status.current_revision,
                "lastTransitionTime": status.last_transition_time,
                "history": status.history,
                "hooks": status.hooks,
            })
        })
        .collect();
    Ok(Json(
        serde_json::json!({"canaries": canaries, "truncated": truncated}),
    ))
}
