//! `dubbo-cp status` (which clients have which revisions, `/debug/clients`), `status --compare`
//! (do replicas serve the same state, `/debug/digest`) and the reverse lookups `get mappings
//! --application` and `get applications` (`/debug/applications`).

use anyhow::Context;

use super::rules::{AdminArg, request};
use crate::admin::ApplicationView;
use crate::dds::clients::ClientView;
use crate::digest::{DigestView, compare};
use crate::xds::clients::ClientView as XdsClientView;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub admin: AdminArg,
    /// Only this kind (e.g. ServiceNameMapping, TagRoute).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only clients of this namespace.
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Only subscriptions whose client has not acknowledged the current revision.
    #[arg(long)]
    pub stale: bool,
    /// Instead: read these replicas' admin ports (host:port) and say which kinds agree.
    #[arg(long, num_args = 1..)]
    pub compare: Vec<String>,
    /// Instead: wait until the control plane answers ready (`/readyz`), as a script does after
    /// starting `serve` in the background; fails after `--wait-timeout` saying what is missing.
    #[arg(long)]
    pub wait_ready: bool,
    /// How long `--wait-ready` waits.
    #[arg(long, default_value = "30s", value_parser = crate::duration::DurationArg)]
    pub wait_timeout: std::time::Duration,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    if !args.compare.is_empty() {
        return compare_replicas(&args.admin, &args.compare).await;
    }
    if args.wait_ready {
        return wait_ready(&args.admin, args.wait_timeout).await;
    }
    // Filtered by the server too, so a large fleet's answer stays small.
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(namespace) = &args.namespace {
        query.append_pair("namespace", namespace);
    }
    if let Some(kind) = &args.kind {
        query.append_pair("kind", kind);
    }
    if args.stale {
        query.append_pair("stale", "true");
    }
    let path = with_query("/debug/clients", query.finish());
    let answer = request(&args.admin, "GET", &path, None).await?;
    let clients: Vec<ClientView> = serde_json::from_value(answer["clients"].clone())
        .context("unexpected /debug/clients answer")?;
    // Sources first: a kind whose CRD is missing or whose watch fails explains stale clients.
    let sources = request(&args.admin, "GET", "/debug/sources", None).await?;
    let sources: Vec<crate::admin::SourceView> =
        serde_json::from_value(sources).context("unexpected /debug/sources answer")?;
    out!("{}", sources_table(&sources));
    out!("{}", status_table(&clients, &args));
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(namespace) = &args.namespace {
        query.append_pair("namespace", namespace);
    }
    // A page (the server answers at most that many); `--stale` filters the xDS table here, not
    // the servers and not-found tables.
    query.append_pair("limit", "1000");
    let xds = request(
        &args.admin,
        "GET",
        &with_query("/debug/xds", query.finish()),
        None,
    )
    .await?;
    let clients: Vec<XdsClientView> =
        serde_json::from_value(xds["clients"].clone()).context("unexpected /debug/xds answer")?;
    // Only when there are xDS clients: scripts reading the table above see no change.
    if !clients.is_empty() {
        out!("\n{}", xds_table(&clients, &args));
    }
    let missing = not_found_table(&clients, &args);
    if missing.lines().count() > 1 {
        out!("\n{missing}");
    }
    let matched = xds["matched"].as_u64().unwrap_or(0);
    if matched > clients.len() as u64 {
        outln!(
            "... and {} more xDS clients (narrow with -n or --stale; /debug/xds pages with offset)",
            matched - clients.len() as u64
        );
    }
    let servers = servers_table(&clients, &args);
    if servers.lines().count() > 1 {
        out!("\n{servers}");
    }
    Ok(())
}

/// After `get mappings`: says on stderr when registrations acknowledged are not served yet
/// (merged every debounce window), so a read right after a write is not taken for a lost one.
/// Only when the admin port was named (`--admin`, `DUBBO_CP_ADMIN`): `get mappings` itself
/// needs only --server, and a default admin address may be another control plane's or nobody's.
/// Silent when it does not answer within a few seconds.
pub async fn say_pending(admin: &AdminArg) {
    let named = std::env::var_os("DUBBO_CP_ADMIN").is_some()
        || std::env::args().any(|a| a == "--admin" || a.starts_with("--admin="));
    if !named {
        return;
    }
    let mut admin = admin.clone();
    admin.timeout = admin.timeout.min(std::time::Duration::from_secs(3));
    let Ok(answer) = request(&admin, "GET", "/debug/mappings/pending", None).await else {
        return;
    };
    let pending = answer["pending"].as_u64().unwrap_or(0);
    let parked = answer["parked"].as_u64().unwrap_or(0);
    if parked > 0 {
        eprintln!(
            "note: {parked} mapping(s) whose write failed for good are not served; \
             /debug/outbox says why"
        );
    }
    if pending == 0 {
        return;
    }
    let examples: Vec<&str> = answer["examples"]
        .as_array()
        .map(|e| e.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    eprintln!(
        "note: {pending} registration(s) acknowledged are not served yet ({}{}): writes are \
         merged every debounce window (--debounce-after, --debounce-max) before clients see \
         them; run again in a moment, or register with --wait",
        examples.join("; "),
        if pending as usize > examples.len() {
            "; ..."
        } else {
            ""
        }
    );
}

/// Whether `client` is in the namespace asked for (all without one).
fn in_namespace(client: &XdsClientView, args: &StatusArgs) -> bool {
    args.namespace
        .as_ref()
        .is_none_or(|ns| &client.namespace == ns)
}

/// Names xDS clients subscribed to that resolve to nothing (a typo, a missing registration or
/// ServiceEntry, a bootstrap's wrong namespace): the clients are told they do not exist, and
/// their calls fail or hang until gRPC's timer says so.
fn not_found_table(clients: &[XdsClientView], args: &StatusArgs) -> String {
    let mut out = format!(
        "{:<40} {:<20} {:<9} NOT FOUND (resolves to nothing)\n",
        "XDS CLIENT", "NAMESPACE", "TYPE"
    );
    for client in clients.iter().filter(|c| in_namespace(c, args)) {
        for status in client.types.iter().filter(|t| t.not_found_count > 0) {
            let more = status
                .not_found_count
                .saturating_sub(status.not_found.len());
            out.push_str(&format!(
                "{:<40} {:<20} {:<9} {}{}\n",
                printable(&client.node_id),
                printable(&client.namespace),
                status.r#type,
                printable(&status.not_found.join(", ")),
                if more > 0 {
                    format!(" (+{more})")
                } else {
                    String::new()
                },
            ));
        }
    }
    out
}

/// The xDS-enabled servers among the clients: where they listen, the TLS their listener
/// requires and the policy that decided it, and the AuthorizationPolicies they enforce.
fn servers_table(clients: &[XdsClientView], args: &StatusArgs) -> String {
    let mut out = format!(
        "{:<40} {:<22} {:<22} {:<28} RBAC (DENY / ALLOW)\n",
        "XDS SERVER", "ADDRESS", "TLS", "DECIDED BY"
    );
    let list = |names: &[String]| {
        if names.is_empty() {
            "-".to_owned()
        } else {
            printable(&names.join(","))
        }
    };
    for client in clients {
        if !in_namespace(client, args) {
            continue;
        }
        for server in &client.servers {
            let tls = if server.tls == "STRICT" {
                "mTLS".to_owned()
            } else {
                format!("plaintext ({})", server.tls)
            };
            out.push_str(&format!(
                "{:<40} {:<22} {:<22} {:<28} {} / {}{}\n",
                printable(&client.node_id),
                server.address,
                tls,
                server.tls_policy.as_deref().unwrap_or("(default)"),
                list(&server.deny),
                list(&server.allow),
                if server.not_enforced.is_empty() {
                    String::new()
                } else {
                    format!("  ({} not enforced as written)", server.not_enforced.len())
                },
            ));
        }
    }
    out
}

/// Client-supplied text as one printable line: control characters (a terminal's escape
/// sequences, newlines) escaped.
pub(super) fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// The xDS clients beside the discovery-stream ones: per type the names subscribed, the
/// versions sent and acknowledged, and the last rejection with its message.
fn xds_table(clients: &[XdsClientView], args: &StatusArgs) -> String {
    // The columns of the discovery-stream table where they mean the same: SENT and ACKED are
    // versions, SYNCED says the type is in step (acknowledged, not rejected, not behind).
    let mut out = format!(
        "{:<40} {:<20} {:<8} {:<9} {:>6} {:>8} {:>8} {:>9} {:<6} NACK\n",
        "XDS CLIENT", "NAMESPACE", "PROTOCOL", "TYPE", "NAMES", "SENT", "ACKED", "LAG", "SYNCED"
    );
    let version = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    for client in clients {
        if !in_namespace(client, args) {
            continue;
        }
        let behind = client
            .stale
            .iter()
            .any(|reason| reason.starts_with("behind"));
        for status in &client.types {
            let synced = status.sent == status.acked && status.nack.is_none() && !behind;
            if args.stale && synced {
                continue;
            }
            let names = if status.wildcard {
                "*".to_owned()
            } else {
                status.names.to_string()
            };
            let nack = status.nack.as_ref().map_or("-".to_owned(), |nack| {
                format!(
                    "version {}: {}",
                    printable(&nack.version),
                    printable(&nack.message)
                )
            });
            out.push_str(&format!(
                "{:<40} {:<20} {:<8} {:<9} {:>6} {:>8} {:>8} {:>9} {:<6} {nack}\n",
                printable(&client.node_id),
                printable(&client.namespace),
                client.protocol,
                status.r#type,
                names,
                version(&status.sent),
                version(&status.acked),
                status
                    .lag_seconds
                    .map_or("-".to_owned(), |lag| format!("{lag:.1}s")),
                if synced { "yes" } else { "no" },
            ));
        }
    }
    out
}

/// `path?query`, or `path` when there is no query (errors quote the path).
fn with_query(path: &str, query: String) -> String {
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// The sources that are not loaded or not healthy, one condition a line (nothing when all are).
fn sources_table(sources: &[crate::admin::SourceView]) -> String {
    let mut out = String::new();
    for source in sources {
        let condition = match (&source.condition, source.loaded) {
            (Some(condition), _) => condition.as_str(),
            (None, false) => "initial state not loaded yet",
            (None, true) => continue,
        };
        if out.is_empty() {
            out.push_str(&format!("{:<22} CONDITION\n", "SOURCE"));
        }
        out.push_str(&format!("{:<22} {condition}\n", source.kind));
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// The rows `status` prints, filtered by its flags.
fn status_table(clients: &[ClientView], args: &StatusArgs) -> String {
    let mut out = format!(
        "{:<48} {:<20} {:<22} {:>8} {:>8} {:>9} SYNCED\n",
        "CLIENT", "NAMESPACE", "KIND", "SENT", "ACKED", "LAG"
    );
    let revision = |r: Option<i64>| r.map_or("-".to_owned(), |r| r.to_string());
    for client in clients {
        if args
            .namespace
            .as_ref()
            .is_some_and(|ns| client.namespace.as_ref() != Some(ns))
        {
            continue;
        }
        let who = match (&client.identity, &client.peer) {
            (Some(identity), _) => identity.clone(),
            (None, Some(peer)) => peer.clone(),
            (None, None) => "-".into(),
        };
        let name = format!("#{} {who}", client.id);
        for kind in &client.kinds {
            if args
                .kind
                .as_ref()
                .is_some_and(|k| !kind.kind.eq_ignore_ascii_case(k))
                || (args.stale && kind.synced)
            {
                continue;
            }
            out.push_str(&format!(
                "{:<48} {:<20} {:<22} {:>8} {:>8} {:>8.1}s {}\n",
                name,
                client.namespace.as_deref().unwrap_or("-"),
                kind.kind,
                revision(kind.sent),
                revision(kind.acked),
                kind.lag_seconds,
                if kind.synced { "yes" } else { "NO" }
            ));
        }
    }
    out
}

/// Reads every replica's digests and prints per kind whether they agree, naming the objects
/// that differ. Fails when any kind differs, so scripts can alert on it.
async fn compare_replicas(admin: &AdminArg, addresses: &[String]) -> anyhow::Result<()> {
    let mut views = Vec::new();
    for address in addresses {
        let replica = AdminArg {
            admin_address: address.clone(),
            token: admin.token.clone(),
            timeout: admin.timeout,
        };
        let answer = request(&replica, "GET", "/debug/digest?objects=true", None)
            .await
            .with_context(|| format!("replica {address}"))?;
        let view: DigestView = serde_json::from_value(answer)
            .with_context(|| format!("unexpected /debug/digest answer from {address}"))?;
        views.push(view);
    }
    let report = compare(&views);
    let (mut text, disagreeing) = comparison_text(addresses, &report);
    let roots_agree = ca_roots_text(addresses, &views, &mut text);
    out!("{text}");
    anyhow::ensure!(
        disagreeing == 0,
        "the replicas disagree on {disagreeing} kind(s)"
    );
    anyhow::ensure!(
        roots_agree,
        "the replicas' CA roots differ: workloads their agents serve cannot verify each other \
         (ZooKeeper mode: give every replica the same zookeeper.auth, or the same \
         --ca-cert/--ca-key)"
    );
    Ok(())
}

/// The CA row: whether every replica issues from the same root and trusts the same ones (by
/// fingerprint, the active one first). Replicas without a CA are left out.
fn ca_roots_text(addresses: &[String], views: &[DigestView], out: &mut String) -> bool {
    let with_ca: Vec<(&String, &Vec<String>)> = addresses
        .iter()
        .zip(views)
        .map(|(address, view)| (address, &view.ca_roots))
        .collect();
    // No replica runs a CA: nothing to compare. Once one does, a replica without roots (its CA
    // disabled or not loaded) disagrees too.
    if with_ca.iter().all(|(_, roots)| roots.is_empty()) {
        return true;
    }
    let first = with_ca[0].1;
    let agree = with_ca.iter().all(|(_, roots)| *roots == first);
    let states: Vec<String> = with_ca
        .iter()
        .map(|(address, roots)| {
            let short: Vec<&str> = roots.iter().map(|r| r.get(..16).unwrap_or(r)).collect();
            if short.is_empty() {
                format!("{address} -")
            } else {
                format!("{address} {}", short.join("+"))
            }
        })
        .collect();
    out.push_str(&format!(
        "{:<22} {:<6} {}\n",
        "CA roots",
        if agree { "yes" } else { "NO" },
        states.join(", ")
    ));
    agree
}

fn comparison_text(
    addresses: &[String],
    report: &[crate::digest::KindComparison],
) -> (String, usize) {
    let mut out = format!("{:<22} {:<6} REPLICAS (revision digest)\n", "KIND", "AGREE");
    let mut disagreeing = 0;
    for kind in report {
        let states: Vec<String> = addresses
            .iter()
            .zip(&kind.states)
            .map(|(address, state)| match state {
                Some((revision, digest)) => {
                    format!(
                        "{address} {revision} {}",
                        digest.get(..12).unwrap_or(digest)
                    )
                }
                None => format!("{address} -"),
            })
            .collect();
        out.push_str(&format!(
            "{:<22} {:<6} {}\n",
            kind.kind,
            if kind.agree { "yes" } else { "NO" },
            states.join(", ")
        ));
        if !kind.agree {
            disagreeing += 1;
            for (key, versions) in &kind.differing {
                let versions: Vec<String> = addresses
                    .iter()
                    .zip(versions)
                    .map(|(address, v)| format!("{address} {}", v.as_deref().unwrap_or("missing")))
                    .collect();
                out.push_str(&format!("  differs: {key}: {}\n", versions.join(", ")));
            }
        }
    }
    (out, disagreeing)
}

/// `get mappings --application APP` (the interfaces it serves) and `get applications`.
pub async fn applications(
    admin: &AdminArg,
    namespace: Option<&str>,
    application: Option<&str>,
    output: super::RuleOutput,
) -> anyhow::Result<()> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(namespace) = namespace {
        query.append_pair("namespace", namespace);
    }
    if let Some(application) = application {
        query.append_pair("application", application);
    }
    let path = with_query("/debug/applications", query.finish());
    let answer = request(admin, "GET", &path, None).await?;
    let views: Vec<ApplicationView> =
        serde_json::from_value(answer).context("unexpected /debug/applications answer")?;
    if output == super::RuleOutput::Json {
        outln!("{}", serde_json::to_string_pretty(&views)?);
    } else if output == super::RuleOutput::Yaml {
        out!("{}", serde_yaml::to_string(&views)?);
    } else if application.is_some() {
        outln!("{:<24} {:<40} INTERFACE", "NAMESPACE", "APPLICATION");
        for view in &views {
            for interface in &view.interfaces {
                outln!(
                    "{:<24} {:<40} {interface}",
                    view.namespace,
                    view.application
                );
            }
        }
    } else {
        outln!(
            "{:<24} {:<40} {:>10} PODS",
            "NAMESPACE",
            "APPLICATION",
            "INTERFACES"
        );
        for view in &views {
            outln!(
                "{:<24} {:<40} {:>10} {}",
                view.namespace,
                view.application,
                view.interfaces.len(),
                view.registering_pods
                    .map_or("-".to_owned(), |pods| pods.to_string())
            );
        }
    }
    Ok(())
}

/// `dubbo-cp unregister -n NS -a APP [IFACE...]`.
pub async fn unregister(
    admin: &AdminArg,
    namespace: String,
    application: String,
    interfaces: Vec<String>,
) -> anyhow::Result<()> {
    let body = serde_json::json!({
        "namespace": namespace, "application": application, "interfaces": interfaces,
    });
    let answer = request(admin, "POST", "/api/v1/unregister", Some(body.to_string())).await?;
    for interface in answer["removed"].as_array().into_iter().flatten() {
        outln!(
            "{application} removed from {namespace}/{}",
            interface.as_str().unwrap_or_default()
        );
    }
    Ok(())
}

/// Polls `/readyz` until it answers 200: a port not listening yet and a 503 (sources still
/// loading) are waited through, the last of them the error when time runs out; any other
/// answer, or none (a wrong port, a refused token), is an error at once.
async fn wait_ready(admin: &AdminArg, timeout: std::time::Duration) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let not_ready = |why: &str| {
        anyhow::anyhow!(
            "not ready within {}: {why}",
            humantime::format_duration(timeout)
        )
    };
    loop {
        let attempt = request(admin, "GET", "/readyz", None);
        let error = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(_)) => {
                outln!("ready after {} ms", started.elapsed().as_millis());
                return Ok(());
            }
            Ok(Err(error)) => error,
            Err(_) => return Err(not_ready("GET /readyz was still unanswered")),
        };
        let message = format!("{error:#}");
        // A port not listening yet, or sources still loading (503); a port that accepts and
        // does not answer, or answers otherwise, is not one that becomes ready.
        let passing = ["cannot connect", "not ready"]
            .iter()
            .any(|m| message.contains(m));
        if !passing {
            return Err(error);
        }
        // A CLI's poll of a server starting up, not a test's wait; the last look is the one
        // the timeout reports.
        let next = tokio::time::Instant::now() + std::time::Duration::from_millis(100);
        if next >= deadline {
            tokio::time::sleep_until(deadline).await;
            return Err(not_ready(&message));
        }
        tokio::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dds::clients::KindStatus;

    fn args(kind: Option<&str>, namespace: Option<&str>, stale: bool) -> StatusArgs {
        StatusArgs {
            admin: AdminArg {
                admin_address: String::new(),
                token: None,
                timeout: std::time::Duration::from_secs(1),
            },
            kind: kind.map(Into::into),
            namespace: namespace.map(Into::into),
            stale,
            compare: vec![],
            wait_ready: false,
            wait_timeout: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn the_table_filters_by_kind_namespace_and_staleness() {
        let status = |kind: &str, acked, synced| KindStatus {
            kind: kind.into(),
            sent: Some(5),
            acked,
            current: 5,
            synced,
            lag_seconds: if synced { 0.0 } else { 2.5 },
        };
        let clients = vec![
            ClientView {
                id: 1,
                identity: Some("demo/sdk".into()),
                namespace: Some("demo".into()),
                peer: Some("10.0.0.1:4000".into()),
                connected_since: "2026-11-23T00:00:00Z".into(),
                kinds: vec![
                    status("ServiceNameMapping", Some(5), true),
                    status("TagRoute", Some(4), false),
                ],
            },
            ClientView {
                id: 2,
                identity: None,
                namespace: None,
                peer: Some("10.0.0.2:4000".into()),
                connected_since: "2026-11-23T00:00:00Z".into(),
                kinds: vec![status("TagRoute", Some(5), true)],
            },
        ];
        let all = status_table(&clients, &args(None, None, false));
        assert_eq!(all.lines().count(), 4, "{all}");
        assert!(all.contains("#2 10.0.0.2:4000"), "{all}");
        let stale = status_table(&clients, &args(None, None, true));
        let rows: Vec<&str> = stale.lines().skip(1).collect();
        assert_eq!(rows.len(), 1, "{stale}");
        assert!(
            rows[0].contains("TagRoute") && rows[0].contains("2.5s") && rows[0].ends_with("NO")
        );
        let tags = status_table(&clients, &args(Some("tagroute"), None, false));
        assert_eq!(tags.lines().count(), 3, "{tags}");
        let demo = status_table(&clients, &args(None, Some("demo"), false));
        assert_eq!(demo.lines().count(), 3, "{demo}");
    }

    #[test]
    fn the_servers_table_shows_tls_its_policy_and_rbac() {
        let server = |tls: &str, policy: Option<&str>| crate::xds::clients::ServerView {
            address: "127.0.0.1:50051".into(),
            service: Some("shop/greeter".into()),
            namespace: "shop".into(),
            tls: tls.into(),
            tls_policy: policy.map(str::to_owned),
            deny: vec!["shop/no-delete".into()],
            allow: Vec::new(),
            not_enforced: vec!["shop/audit: ADULT".into()],
        };
        let client = |node: &str, namespace: &str, servers| XdsClientView {
            node_id: node.into(),
            namespace: namespace.into(),
            protocol: "sotw".into(),
            identity: None,
            connected_since: None,
            seen: None,
            types: Vec::new(),
            stale: Vec::new(),
            servers,
        };
        let clients = [
            client(
                "greeter-0",
                "shop",
                vec![server("STRICT", Some("shop/strict"))],
            ),
            client("plain-0", "bank", vec![server("PERMISSIVE", None)]),
            client("caller", "shop", Vec::new()),
        ];
        let table = servers_table(&clients, &args(None, None, false));
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 3, "{table}");
        assert!(
            rows[1].starts_with("greeter-0") && rows[1].contains("mTLS"),
            "{table}"
        );
        assert!(rows[1].contains("shop/strict") && rows[1].contains("shop/no-delete / -"));
        assert!(rows[1].ends_with("(1 not enforced as written)"), "{table}");
        assert!(rows[2].contains("plaintext (PERMISSIVE)") && rows[2].contains("(default)"));
        let shop = servers_table(&clients, &args(None, Some("shop"), false));
        assert_eq!(shop.lines().count(), 2, "{shop}");
    }

    #[test]
    fn the_xds_table_says_the_protocol_and_which_types_are_in_step() {
        use dubbo_cp_xds::clients::{Nack, TypeView};
        let view = |r#type: &str, sent: &str, acked: &str, nack: Option<Nack>| TypeView {
            r#type: r#type.into(),
            names: 2,
            wildcard: false,
            subscribed: vec!["a".into(), "b".into()],
            lag_seconds: (sent != acked || nack.is_some()).then_some(2.5),
            not_found: Vec::new(),
            not_found_count: 0,
            sent: Some(sent.into()),
            acked: Some(acked.into()),
            nack,
        };
        let client = |node: &str, protocol: &str, types, stale: Vec<String>| XdsClientView {
            node_id: node.into(),
            namespace: "shop".into(),
            protocol: protocol.into(),
            identity: None,
            connected_since: None,
            seen: Some("7".into()),
            types,
            stale,
            servers: Vec::new(),
        };
        let nack = Nack {
            version: "7".into(),
            message: "bad".into(),
            nonce: 3,
        };
        let clients = [
            client(
                "steady",
                "sotw",
                vec![view("cluster", "7", "7", None)],
                vec![],
            ),
            client(
                "rejects",
                "delta",
                vec![
                    view("cluster", "7", "6", Some(nack)),
                    view("endpoint", "7", "7", None),
                ],
                vec!["cluster NACKed version 7: bad".into()],
            ),
            client(
                "slow",
                "sotw",
                vec![view("listener", "7", "7", None)],
                vec!["behind: version 7 taken in hand, 9 published".into()],
            ),
        ];
        let table = xds_table(&clients, &args(None, None, false));
        let row = |node: &str, r#type: &str| {
            table
                .lines()
                .find(|l| l.starts_with(node) && l.contains(r#type))
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(
            row("steady", "cluster")[2..9],
            ["sotw", "cluster", "2", "7", "7", "-", "yes"]
        );
        assert_eq!(
            row("rejects", "cluster")[2..10],
            ["delta", "cluster", "2", "7", "6", "2.5s", "no", "version"]
        );
        assert_eq!(row("rejects", "endpoint")[8], "yes", "{table}");
        assert_eq!(row("slow", "listener")[8], "no", "behind: {table}");
        let stale = xds_table(&clients, &args(None, None, true));
        assert_eq!(
            stale.lines().count(),
            3,
            "header, rejects' cluster, slow's listener: {stale}"
        );
    }
}
