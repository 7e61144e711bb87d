//! The rule API (`/api/v1/apply | delete | rules`) and unregistering an application.

use super::*;

/// The kind named in a path: `TagRoute`, `tagroute` or `tagroutes`.
pub(super) fn rule_kind(name: &str) -> Result<Kind, ApiError> {
    crate::rules::RULE_KINDS
        .into_iter()
        .find(|kind| {
            kind.name().eq_ignore_ascii_case(name) || kind.plural().eq_ignore_ascii_case(name)
        })
        .ok_or_else(|| {
            api_error(
                StatusCode::NOT_FOUND,
                format!(
                    "unknown rule kind {name:?}; one of TagRoute, ConditionRoute, DynamicConfig, \
                     AuthenticationPolicy, AuthorizationPolicy"
                ),
            )
        })
}

/// Where an admin caller's rule writes go, by mode.
pub(super) enum Writable {
    Standalone(Arc<StandaloneRules>),
    ZooKeeper(Arc<crate::zookeeper::ZkRules>),
}

/// What a rule write does, whichever store it goes to.
pub(super) enum RuleWrite {
    Apply(String),
    DeleteManifests(String),
    Delete(Vec<RuleKey>),
}

/// The rule store an admin caller may write to (standalone and ZooKeeper modes).
pub(super) async fn writable(
    admin: &RuleAdmin,
    headers: &axum::http::HeaderMap,
    peer: std::net::SocketAddr,
) -> Result<Writable, ApiError> {
    require_admin(&admin.policy, headers, peer).await?;
    if let Some(rules) = &admin.zookeeper {
        return Ok(Writable::ZooKeeper(rules.clone()));
    }
    admin
        .standalone
        .clone()
        .map(Writable::Standalone)
        .ok_or_else(|| {
            api_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "in Kubernetes mode rules are custom resources: use kubectl apply / kubectl delete",
            )
        })
}

/// Runs a rule write (SQLite off the async threads; ZooKeeper on them) and turns its result into
/// an answer.
pub(super) async fn write_rules(
    rules: Writable,
    write: RuleWrite,
) -> Result<Json<Report>, ApiError> {
    match rules {
        Writable::Standalone(rules) => {
            let written = tokio::task::spawn_blocking(move || match write {
                RuleWrite::Apply(body) => rules.apply(&body),
                RuleWrite::DeleteManifests(body) => rules.delete_manifests(&body),
                RuleWrite::Delete(keys) => rules.delete(&keys),
            })
            .await;
            match written {
                Ok(Ok(report)) => Ok(Json(report)),
                Ok(Err(RuleWriteError::Invalid(err))) => {
                    Err(api_error(StatusCode::BAD_REQUEST, err.to_string()))
                }
                Ok(Err(err)) => Err(api_error(StatusCode::SERVICE_UNAVAILABLE, err.to_string())),
                Err(_) => Err(api_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the rule write did not finish",
                )),
            }
        }
        Writable::ZooKeeper(rules) => {
            use crate::zookeeper::rules_writer::RuleError;
            let written = match write {
                RuleWrite::Apply(body) => rules.apply(&body).await,
                RuleWrite::DeleteManifests(body) => rules.delete_manifests(&body).await,
                RuleWrite::Delete(keys) => rules.delete(&keys).await,
            };
            match written {
                Ok(report) => Ok(Json(report)),
                Err(err @ (RuleError::Invalid(_) | RuleError::Refused(_))) => {
                    Err(api_error(StatusCode::BAD_REQUEST, err.to_string()))
                }
                Err(err) => Err(api_error(StatusCode::SERVICE_UNAVAILABLE, err.to_string())),
            }
        }
    }
}

pub(super) async fn apply_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<Report>, ApiError> {
    let rules = writable(&state.rules, &headers, peer).await?;
    write_rules(rules, RuleWrite::Apply(body)).await
}

pub(super) async fn delete_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<Report>, ApiError> {
    let rules = writable(&state.rules, &headers, peer).await?;
    write_rules(rules, RuleWrite::DeleteManifests(body)).await
}

pub(super) async fn delete_rule(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Path((kind, namespace, name)): axum::extract::Path<(String, String, String)>,
) -> Result<Json<Report>, ApiError> {
    let rules = writable(&state.rules, &headers, peer).await?;
    let kind = rule_kind(&kind)?;
    let key: RuleKey = (kind, namespace, name);
    write_rules(rules, RuleWrite::Delete(vec![key])).await
}

#[derive(serde::Deserialize)]
pub(super) struct NamespaceQuery {
    namespace: Option<String>,
    /// The auth kinds: who receives each policy (`audiences`, beside the items).
    #[serde(default)]
    audience: bool,
}

/// The rules of a kind as clients are served them (in Kubernetes mode: as the watch sees them).
pub(super) async fn get_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Path(kind): axum::extract::Path<String>,
    axum::extract::Query(query): axum::extract::Query<NamespaceQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let kind = rule_kind(&kind)?;
    let rules = state.rules.catalog.list(kind, query.namespace.as_deref());
    let items: Vec<serde_json::Value> = rules.iter().map(crate::rules::Rule::to_manifest).collect();
    let mut list = serde_json::json!({
        "apiVersion": "v1", "kind": "List",
        "revision": state.index.current(kind).revision,
        "items": items,
    });
    // Asked for (the dashboard polls this list every second and does not show it), and beside
    // the items, not in them: an item stays a manifest `apply` takes back.
    if query.audience && matches!(kind, Kind::AuthenticationPolicy | Kind::AuthorizationPolicy) {
        let subscribers = state.clients.subscribers(kind);
        // xDS servers enforce the policies too: which, read off the async threads (one lock per
        // open xDS stream).
        let mut enforcing: BTreeMap<String, usize> = rules
            .iter()
            .map(|rule| (format!("{}/{}", rule.namespace, rule.name), 0))
            .collect();
        if let Some(xds) = state.xds_clients.clone() {
            let authorization = kind == Kind::AuthorizationPolicy;
            enforcing = tokio::task::spawn_blocking(move || {
                xds.count_enforcing(authorization, &mut enforcing);
                enforcing
            })
            .await
            .map_err(|_| {
                api_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "counting the xDS servers that enforce the policies failed",
                )
            })?;
        }
        let audiences: serde_json::Map<String, serde_json::Value> = rules
            .iter()
            .filter_map(|rule| {
                let key = format!("{}/{}", rule.namespace, rule.name);
                let mut audience = audience(&state.rules.root_namespace, &subscribers, rule)?;
                audience["xdsServers"] = enforcing.get(&key).copied().unwrap_or(0).into();
                Some((key, audience))
            })
            .collect();
        list["audiences"] = serde_json::Value::Object(audiences);
        list["subscribers"] = subscribers.len().into();
        list["rootNamespace"] = state.rules.root_namespace.clone().into();
    }
    Ok(Json(list))
}

/// Who receives an auth policy (a client of the discovery stream receives only the policies
/// that select it), and how many of the streams subscribed to its kind do now.
fn audience(
    root: &str,
    subscribers: &[Arc<crate::rules::scope::Endpoint>],
    rule: &crate::rules::Rule,
) -> Option<serde_json::Value> {
    use crate::rules::RuleSpec;
    use crate::rules::scope::Audience;
    let (audience, selectors) = match &rule.spec {
        RuleSpec::AuthenticationPolicy(spec) => (
            Audience::of_authentication(spec, &rule.namespace, root),
            "selector",
        ),
        RuleSpec::AuthorizationPolicy(spec) => (
            Audience::of_authorization(spec, &rule.namespace, root),
            "rule's `to`",
        ),
        _ => return None,
    };
    let receiving = subscribers.iter().filter(|e| audience.includes(e)).count();
    Some(serde_json::json!({
        "receivers": audience.describe(selectors),
        "receiving": receiving,
    }))
}

/// Objects skipped by a watch (do not deserialize or validate), with why.
pub(super) async fn debug_rules(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    Ok(Json(serde_json::json!({
        "invalid": state.rules.catalog.invalid(),
        "files": state.rules.catalog.file_errors(),
    })))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct UnregisterRequest {
    namespace: String,
    application: String,
    /// Empty: every interface the application serves in the namespace.
    #[serde(default)]
    interfaces: Vec<String>,
}

/// `dubbo-cp unregister` (standalone): an operator removes an application from mappings,
/// durably and pushed to clients like any change. In Kubernetes mode the objects are the truth:
/// `kubectl edit` them, or let expiry remove applications whose pods are gone.
pub(super) async fn unregister(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let store = match &state.mappings {
        MappingSource::Store(store) => store,
        MappingSource::Cluster(_) => {
            return Err(api_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "in Kubernetes mode ServiceNameMapping objects are the truth: edit them with kubectl",
            ));
        }
        MappingSource::ZooKeeper(_) => {
            return Err(api_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "in ZooKeeper mode the mapping nodes are the truth (/<root>/mapping/<interface>): \
                 edit them as Dubbo's SDKs do",
            ));
        }
    };
    let request: UnregisterRequest = serde_json::from_str(&body).map_err(|err| {
        api_error(
            StatusCode::BAD_REQUEST,
            format!(
                "body must be {{\"namespace\": NS, \"application\": APP, \"interfaces\": [...]}}: {err}"
            ),
        )
    })?;
    for (field, value) in [
        ("namespace", &request.namespace),
        ("application", &request.application),
    ] {
        if value.is_empty() {
            return Err(api_error(
                StatusCode::BAD_REQUEST,
                format!("{field}: must not be empty"),
            ));
        }
    }
    let interfaces =
        (!request.interfaces.is_empty()).then(|| request.interfaces.iter().cloned().collect());
    let removed = store
        .unregister(&request.namespace, &request.application, interfaces)
        .await
        .map_err(|err| api_error(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    if removed.is_empty() {
        let which = if request.interfaces.is_empty() {
            "no interface".to_owned()
        } else {
            format!("none of {:?}", request.interfaces)
        };
        return Err(api_error(
            StatusCode::NOT_FOUND,
            format!(
                "application {:?} serves {which} in namespace {:?}",
                request.application, request.namespace
            ),
        ));
    }
    tracing::info!(namespace = %request.namespace, application = %request.application,
        interfaces = removed.len(), "application unregistered by an admin");
    Ok(Json(serde_json::json!({ "removed": removed })))
}
