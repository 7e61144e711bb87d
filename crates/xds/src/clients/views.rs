//! The clients as operators read them (`/debug/xds`, `dubbo-cp status`, the dashboard): pages,
//! clients, their server listeners and their types.

use super::{ClientStatus, NAMES_SHOWN, Nack};

/// A page of clients and the counts around it.
#[derive(Debug, Default)]
pub struct ClientPage {
    pub clients: Vec<ClientView>,
    /// Streams in scope.
    pub total: usize,
    /// Of those, the ones not in step.
    pub stale: usize,
    /// Of those in scope, the ones kept.
    pub matched: usize,
    /// The version published when the page was read: what `stale`'s "behind" compares with.
    pub current: Option<u64>,
}

/// One client as operators read it (`/debug/xds`, `dubbo-cp status`, the dashboard).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClientView {
    pub node_id: String,
    pub namespace: String,
    /// `sotw` (state of the world) or `delta`.
    #[serde(default)]
    pub protocol: String,
    /// The authenticated caller's namespace, when authentication is on.
    #[serde(default)]
    pub identity: Option<String>,
    /// RFC 3339, to the second.
    #[serde(default)]
    pub connected_since: Option<String>,
    /// The last published version the stream has taken in hand.
    pub seen: Option<String>,
    pub types: Vec<TypeView>,
    /// Why the client is not in step, one reason each (a rejection, a response it has not
    /// acknowledged, a version it has not taken in hand); empty when it is.
    #[serde(default)]
    pub stale: Vec<String>,
    /// The server listeners it was sent (gRFC A36), with their TLS and RBAC.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerView>,
}

impl ClientView {
    pub(super) fn of(mut client: ClientStatus, current: Option<u64>) -> ClientView {
        let types: Vec<TypeView> = std::mem::take(&mut client.types)
            .into_iter()
            .map(|(type_url, status)| TypeView {
                r#type: crate::short_type(type_url).to_owned(),
                names: status.names,
                wildcard: status.wildcard,
                subscribed: client.subscribed.remove(type_url).unwrap_or_default(),
                // As the discovery stream's lag: how long the client has left the last
                // response unacknowledged (or rejected); none when it is in step.
                not_found: status.absent.iter().take(NAMES_SHOWN).cloned().collect(),
                not_found_count: status.absent.len(),
                lag_seconds: status
                    .sent_at
                    .filter(|_| status.acked_nonce < status.sent_nonce)
                    .map(|at| at.elapsed().as_secs_f64()),
                sent: status.sent,
                acked: status.acked,
                nack: status.nack,
            })
            .collect();
        let mut stale = Vec::new();
        for view in &types {
            if let Some(nack) = &view.nack {
                stale.push(format!(
                    "{} NACKed version {}: {}",
                    view.r#type, nack.version, nack.message
                ));
            } else if view.lag_seconds.is_some() {
                stale.push(format!(
                    "{} version {} sent, not acknowledged",
                    view.r#type,
                    view.sent.as_deref().unwrap_or_default()
                ));
            }
        }
        let seen = client.seen.as_deref().and_then(|v| v.parse::<u64>().ok());
        if let Some(current) = current
            && !types.is_empty()
            && seen.is_some_and(|seen| seen < current)
        {
            stale.push(format!(
                "behind: version {} taken in hand, {current} published",
                client.seen.as_deref().unwrap_or_default()
            ));
        }
        ClientView {
            node_id: client.node_id,
            namespace: client.namespace,
            protocol: client.protocol.to_owned(),
            identity: client.identity,
            connected_since: client
                .connected
                .map(|at| humantime::format_rfc3339_seconds(at).to_string()),
            seen: client.seen,
            types,
            stale,
            servers: client.servers,
        }
    }
}

/// What an xDS-enabled server was told to enforce, as operators read it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerView {
    /// `IP:port` it listens on.
    pub address: String,
    /// `namespace/name` of the service found behind the address, if any.
    #[serde(default)]
    pub service: Option<String>,
    pub namespace: String,
    /// `STRICT` (mTLS), `PERMISSIVE` or `DISABLED` (both plaintext).
    pub tls: String,
    /// The AuthenticationPolicy that decided it (`namespace/name`), none for the default.
    #[serde(default)]
    pub tls_policy: Option<String>,
    /// AuthorizationPolicies enforced, `namespace/name`.
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    /// `namespace/name: what` the server does not enforce as written.
    #[serde(default)]
    pub not_enforced: Vec<String>,
}

impl ServerView {
    pub fn of(server: &crate::inbound::Server) -> ServerView {
        ServerView {
            address: std::net::SocketAddr::new(server.listening.ip, server.listening.port)
                .to_string(),
            service: server.service.clone(),
            namespace: server.namespace.clone(),
            tls: server.tls.mode.name().to_owned(),
            tls_policy: server.tls.policy.clone(),
            deny: server.rbac.deny.clone(),
            allow: server.rbac.allow.clone(),
            not_enforced: server
                .tls
                .policy
                .iter()
                .filter(|_| server.tls.mode == crate::security::Mode::Permissive)
                .map(|policy| format!("{policy}: {}", crate::security::PERMISSIVE_AS_PLAINTEXT))
                .chain(
                    server
                        .unknown
                        .iter()
                        .chain(&server.rbac.problems)
                        .map(|(policy, problem)| format!("{policy}: {problem}")),
                )
                .collect(),
        }
    }
}

/// One type of one client, as operators read it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TypeView {
    /// `cluster`, `endpoint`, `listener` or `route`.
    pub r#type: String,
    /// Names subscribed (not counting a wildcard).
    pub names: usize,
    pub wildcard: bool,
    /// The first `NAMES_SHOWN` of them.
    #[serde(default)]
    pub subscribed: Vec<String>,
    /// Seconds the last response has waited for an acknowledgement (or since it was rejected);
    /// none when the type is in step.
    #[serde(default)]
    pub lag_seconds: Option<f64>,
    /// Names subscribed to that resolve to nothing (the client was told they do not exist), the
    /// first `NAMES_SHOWN`; `not_found_count` counts all.
    #[serde(default)]
    pub not_found: Vec<String>,
    #[serde(default)]
    pub not_found_count: usize,
    pub sent: Option<String>,
    pub acked: Option<String>,
    /// The last rejection, until a later version is acknowledged.
    pub nack: Option<Nack>,
}
