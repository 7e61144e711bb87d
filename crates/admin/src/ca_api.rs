//! The CA API (`/api/v1/ca`): show the roots, rotate them, issue a certificate.

use super::*;

/// The CA an admin caller may use.
pub(super) async fn authority(
    state: &AdminState,
    headers: &axum::http::HeaderMap,
    peer: std::net::SocketAddr,
) -> Result<crate::ca::Authority, ApiError> {
    require_admin(&state.rules.policy, headers, peer).await?;
    state.ca.clone().ok_or_else(|| {
        api_error(
            StatusCode::NOT_FOUND,
            "the certificate authority is disabled (ca.enabled: false)",
        )
    })
}

/// `dubbo-cp ca show`: the trusted roots.
pub(super) async fn show_ca(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<crate::ca::CaView>, ApiError> {
    authority(&state, &headers, peer)
        .await?
        .view()
        .map(Json)
        .ok_or_else(|| api_error(StatusCode::SERVICE_UNAVAILABLE, crate::ca::NOT_READY))
}

/// `dubbo-cp ca root`: the trusted roots as one PEM bundle, the active one first. Public, as
/// the `dubbo-ca-cert` ConfigMap is readable by every pod and SPIFFE's bundle endpoint needs no
/// credential: certificates are what every peer is shown anyway, and a workload needs them
/// before it has an identity to ask with (docs/agent.md's TLS steps).
pub(super) async fn ca_roots(
    State(state): State<AdminState>,
) -> Result<impl IntoResponse, ApiError> {
    let ca = state.ca.as_ref().ok_or_else(|| {
        api_error(
            StatusCode::NOT_FOUND,
            "the certificate authority is disabled (ca.enabled: false)",
        )
    })?;
    let bundle = ca
        .current()
        .ok_or_else(|| api_error(StatusCode::SERVICE_UNAVAILABLE, crate::ca::NOT_READY))?;
    let pem: String = bundle
        .trust_pems()
        .iter()
        .map(|pem| format!("{}\n", pem.trim_end()))
        .collect();
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-pem-file")],
        pem,
    ))
}

/// `dubbo-cp ca rotate`: a new active root, the old one trusted until its certificates expire.
pub(super) async fn rotate_ca(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
) -> Result<Json<crate::ca::CaView>, ApiError> {
    let ca = authority(&state, &headers, peer).await?;
    ca.rotate()
        .await
        .map_err(|message| api_error(StatusCode::CONFLICT, message))?;
    ca.view()
        .map(Json)
        .ok_or_else(|| api_error(StatusCode::SERVICE_UNAVAILABLE, crate::ca::NOT_READY))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct IssueRequest {
    csr: String,
    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    spiffe_id: String,
    /// Sign an identity of another trust domain than the CA's own (refused otherwise).
    #[serde(default)]
    allow_other_trust_domain: bool,
}

/// `dubbo-cp ca issue`: a certificate for any identity, by an admin's hand.
pub(super) async fn issue_certificate(
    State(state): State<AdminState>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<Json<serde_json::Value>, ApiError> {
    let ca = authority(&state, &headers, peer).await?;
    let request: IssueRequest = serde_json::from_str(&body).map_err(|err| {
        api_error(
            StatusCode::BAD_REQUEST,
            format!("body must be {{\"csr\": PEM, \"spiffeId\": ID}}: {err}"),
        )
    })?;
    let identity = crate::auth::spiffe::identity_from_spiffe_id(&request.spiffe_id, None)
        .map_err(|err| api_error(StatusCode::BAD_REQUEST, format!("spiffeId: {err}")))?;
    // A certificate of another trust domain is trusted wherever our roots are: only on purpose.
    let domain = request
        .spiffe_id
        .trim_start_matches("spiffe://")
        .split('/')
        .next()
        .unwrap_or_default();
    if domain != &*ca.trust_domain && !request.allow_other_trust_domain {
        return Err(api_error(
            StatusCode::BAD_REQUEST,
            format!(
                "spiffeId: trust domain {domain:?} is not this CA's ({:?}); pass \
                 --allow-other-trust-domain to sign it anyway",
                ca.trust_domain
            ),
        ));
    }
    let subject = crate::ca::Subject {
        spiffe_id: request.spiffe_id,
        common_name: identity.service_account.unwrap_or(identity.name),
    };
    let bundle = ca
        .current()
        .ok_or_else(|| api_error(StatusCode::SERVICE_UNAVAILABLE, crate::ca::NOT_READY))?;
    let issued = bundle
        .issue(
            &request.csr,
            &subject,
            ca.settings.cert_validity,
            std::time::SystemTime::now(),
        )
        .map_err(|err| {
            ca.stats.count("admin", err.result());
            api_error(StatusCode::BAD_REQUEST, err.to_string())
        })?;
    ca.stats.count("admin", "issued");
    tracing::info!(spiffe_id = %subject.spiffe_id, "certificate issued by an admin");
    Ok(Json(serde_json::json!({
        "certPem": issued.cert_pem,
        "trustCerts": bundle.trust_pems(),
        "token": issued.token,
        "expireTime": humantime::format_rfc3339_seconds(issued.not_after).to_string(),
    })))
}
