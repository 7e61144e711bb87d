//! `/debug/xds/split`: the share of calls each endpoint gets for a target, a client namespace
//! and a call's headers, read from the resources the xDS edge serves (see `dubbo_cp_xds::split`).
//! The dashboard draws it and `dubbo-cp xds split` prints it.

use super::*;

/// Bytes of one header a split may be asked for (gRPC metadata is small).
const MAX_HEADER_BYTES: usize = 1024;

/// The call asked about, from `service=NAME[&namespace=NS][&path=P][&header=k:v]...`.
fn call_of(query: Option<&str>) -> Result<dubbo_cp_xds::split::Call, ApiError> {
    let bad = |message: String| api_error(StatusCode::BAD_REQUEST, message);
    let mut call = dubbo_cp_xds::split::Call {
        namespace: dubbo_cp_xds::server::DEFAULT_NAMESPACE.to_owned(),
        ..Default::default()
    };
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "service" => call.target = value.trim_start_matches("xds:///").to_owned(),
            "namespace" => call.namespace = value.into_owned(),
            "path" => call.path = Some(value.into_owned()),
            "header" => {
                if value.len() > MAX_HEADER_BYTES {
                    return Err(bad(format!(
                        "header {:?}...: {} bytes, over the {MAX_HEADER_BYTES} a split reads",
                        value.chars().take(32).collect::<String>(),
                        value.len()
                    )));
                }
                let Some((name, value)) = value.split_once(':') else {
                    return Err(bad(format!("header {value:?}: expected NAME:VALUE")));
                };
                if call.headers.len() == dubbo_cp_xds::split::MAX_HEADERS {
                    return Err(bad(format!(
                        "more than {} headers: a split reads at most that many",
                        dubbo_cp_xds::split::MAX_HEADERS
                    )));
                }
                call.headers
                    .push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
            other => return Err(bad(format!("unknown parameter {other:?}"))),
        }
    }
    if call.target.is_empty() {
        return Err(bad(
            "service is required: the name a client dials (xds:///NAME)".to_owned(),
        ));
    }
    // Each namespace asked about may cache a listener and a route in the served version: only
    // names a client could have.
    if !is_dns_label(&call.namespace) {
        return Err(bad(format!(
            "namespace {:?}: must be a DNS label (lower-case letters, digits and '-', 1-63 characters)",
            call.namespace.chars().take(70).collect::<String>()
        )));
    }
    for (what, value) in [
        ("service", Some(&call.target)),
        ("path", call.path.as_ref()),
    ] {
        if let Some(value) = value.filter(|v| v.len() > MAX_HEADER_BYTES) {
            return Err(bad(format!(
                "{what}: {} bytes, over the {MAX_HEADER_BYTES} a split reads",
                value.len()
            )));
        }
    }
    Ok(call)
}

/// Kubernetes' namespace form (RFC 1123 label).
fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

pub(super) async fn xds_split(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&state.rules.policy, &headers, peer).await?;
    let call = call_of(query.as_deref())?;
    let Some(snapshots) = &state.xds_snapshots else {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "xDS is not served by this control plane (xds.enabled is false)",
        ));
    };
    let snapshot = snapshots.borrow().clone();
    // Generating resources for a name not served yet is CPU work: off the async threads.
    let answer = tokio::task::spawn_blocking(move || {
        dubbo_cp_xds::split::split(&snapshot, &call).map(|split| (call, split))
    })
    .await
    .map_err(|_| api_error(StatusCode::INTERNAL_SERVER_ERROR, "split failed"))?;
    match answer {
        Ok((call, split)) => Ok(Json(serde_json::json!({
            "service": call.target,
            "namespace": call.namespace,
            "path": call.path,
            "headers": call.headers.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>(),
            "split": split,
        }))),
        Err(error) => Err(api_error(StatusCode::NOT_FOUND, error.to_string())),
    }
}
