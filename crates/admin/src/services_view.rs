//! `/debug/services`: every service the xDS edge serves (registries' and ServiceEntries'), with
//! its hosts, application, where it comes from, and its endpoints with their labels, weight,
//! tag and locality, a page at a time. The dashboard's services view reads it.

use super::*;

use dubbo_cp_domain::service::Service;
use dubbo_cp_xds::source::Origin;

/// Services a page holds unless `limit` says otherwise, and the most it may.
const PAGE: usize = 100;
const PAGE_MAX: usize = 1000;
/// Endpoints listed per service (`endpointCount` counts all), and conflicting hosts per answer.
const ENDPOINTS_SHOWN: usize = 100;
const SHADOWED_SHOWN: usize = 20;

#[derive(serde::Deserialize)]
pub(super) struct ServiceQuery {
    namespace: Option<String>,
    /// Only services whose name, host or application contains this.
    q: Option<String>,
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceView {
    namespace: String,
    name: String,
    /// What clients dial: the name (in its namespace) or the DNS name, and the FQDN.
    hosts: Vec<String>,
    application: String,
    /// `Kubernetes` or `ZooKeeper` (the registry this mode watches), or `ServiceEntry NAME/NS`.
    source: String,
    ports: Vec<String>,
    /// Its endpoints, the first [`ENDPOINTS_SHOWN`].
    endpoints: Vec<EndpointView>,
    endpoint_count: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct EndpointView {
    address: String,
    /// Its own port per service port name, where it differs from the service's.
    ports: BTreeMap<String, u16>,
    weight: u32,
    /// `dubbo.tag`, if it carries one.
    tag: Option<String>,
    locality: String,
    labels: BTreeMap<String, String>,
    /// `serving`, or `held` at weight 0 (a canary's pods before their step): registries list
    /// ready endpoints only.
    state: &'static str,
}

fn view(service: Service, origin: Origin, registry: &str) -> ServiceView {
    let mut hosts = vec![service.name.clone()];
    if !service.is_dns_host() {
        hosts.push(service.fqdn());
    }
    ServiceView {
        application: service.application().to_owned(),
        namespace: service.namespace,
        name: service.name,
        hosts,
        source: match origin {
            Origin::Service => registry.to_owned(),
            Origin::ServiceEntry { entry } => format!("ServiceEntry {entry}"),
        },
        ports: service
            .ports
            .iter()
            .map(|p| format!("{} {}/{}", p.number, p.name, p.protocol))
            .collect(),
        endpoint_count: service.endpoints.len(),
        endpoints: service
            .endpoints
            .into_iter()
            .take(ENDPOINTS_SHOWN)
            .map(|e| EndpointView {
                address: e.address.to_string(),
                ports: e.ports,
                weight: e.weight,
                tag: e.labels.get(dubbo_cp_xds::tags::TAG_LABEL).cloned(),
                locality: e.locality,
                state: if e.weight == 0 { "held" } else { "serving" },
                labels: e.labels,
            })
            .collect(),
    }
}

pub(super) async fn list_services(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(query): axum::extract::Query<ServiceQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let limit = query.limit.unwrap_or(PAGE);
    if limit > PAGE_MAX {
        return Err(api_error(
            StatusCode::BAD_REQUEST,
            format!("limit {limit} is over {PAGE_MAX}; page with offset"),
        ));
    }
    let index = state.index.clone();
    // Services of the `Service` kind come from the registry the mode watches.
    let registry = match (&state.zookeeper, &state.outbox) {
        (Some(_), _) => "ZooKeeper",
        (None, Some(_)) => "Kubernetes",
        (None, None) => "registry",
    };
    // Every service is read and sorted: off the async threads.
    let answer = tokio::task::spawn_blocking(move || {
        let (services, shadowed) = dubbo_cp_xds::source::services_by_origin(
            &index.current(index::Kind::Service),
            &index.current(index::Kind::ServiceEntry),
        );
        let needle = query.q.as_deref().map(str::to_lowercase);
        let mut matching: Vec<(Service, Origin)> = services
            .into_iter()
            .filter(|(s, _)| query.namespace.as_ref().is_none_or(|ns| &s.namespace == ns))
            .filter(|(s, _)| {
                needle.as_ref().is_none_or(|needle| {
                    s.name.to_lowercase().contains(needle)
                        || s.application().to_lowercase().contains(needle)
                })
            })
            .collect();
        matching.sort_by(|(a, _), (b, _)| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let matched = matching.len();
        let page: Vec<ServiceView> = matching
            .into_iter()
            .skip(query.offset)
            .take(limit)
            .map(|(service, origin)| view(service, origin, registry))
            .collect();
        let truncated = query.offset + page.len() < matched;
        let shadowed_count = shadowed.len();
        serde_json::json!({
            "services": page, "matched": matched, "offset": query.offset, "truncated": truncated,
            // Hosts two sources declare, and the entries not served for them.
            "shadowed": shadowed.into_iter().take(SHADOWED_SHOWN).collect::<BTreeMap<_, _>>(),
            "shadowedCount": shadowed_count,
        })
    })
    .await
    .map_err(|_| api_error(StatusCode::INTERNAL_SERVER_ERROR, "listing services failed"))?;
    Ok(Json(answer))
}
