//! `apply`, `get <kind>` and `delete`: clients of the admin API's rule endpoints
//! (`/api/v1/...` on the admin port, see [`crate::admin`]). Manifests are the Kubernetes-style
//! YAML a user would give kubectl, so moving to Kubernetes needs no rewrite.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use super::columns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest answer read from the admin port.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(30);

/// Where the rule commands find the control plane's admin API.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArg {
    /// The control plane's admin address: `host:port` or `http://host:port` (plain HTTP/1.1).
    #[arg(
        long = "admin",
        env = "DUBBO_CP_ADMIN",
        default_value = "127.0.0.1:30070"
    )]
    pub admin_address: String,
    /// Bearer token of an admin identity (needed when authentication is configured); `get
    /// mappings` sends it to the gRPC port (--server) instead.
    #[arg(long, env = "DUBBO_CP_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long a request may wait for its answer (a port that accepts and never answers).
    #[arg(skip = TIMEOUT)]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuleOutput {
    Text,
    Yaml,
    Json,
}

/// The manifests of `path`: a file, every `.yaml`/`.yml`/`.json` file of a directory (sorted),
/// or standard input for `-`; documents joined with `---`.
pub fn read_manifests(paths: &[PathBuf]) -> anyhow::Result<String> {
    let mut documents = Vec::new();
    for path in paths {
        if path == Path::new("-") {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read standard input")?;
            documents.push(text);
        } else if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("cannot read directory {}", path.display()))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| is_manifest_file(p))
                .collect();
            files.sort();
            for file in files {
                documents.push(read_file(&file)?);
            }
        } else {
            documents.push(read_file(path)?);
        }
    }
    Ok(documents.join("\n---\n"))
}

pub fn is_manifest_file(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// `dubbo-cp apply -f ...`: prints what was created, changed and left unchanged.
/// With `wait`, returns once every object is what clients are served, or fails after it.
pub async fn apply(
    admin: &AdminArg,
    files: &[PathBuf],
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let manifests = read_manifests(files)?;
    // Parsed here only to know what to wait for; the server validates and says why it refuses
    // (so a manifest this CLI cannot read is sent all the same, and the wait then says so).
    let expected = wait.map(|_| crate::rules::parse_manifests(&manifests));
    let report = request(admin, "POST", "/api/v1/apply", Some(manifests)).await?;
    print_report(
        &report,
        &[
            ("created", "created"),
            ("configured", "configured"),
            ("unchanged", "unchanged"),
        ],
    );
    match (wait, expected) {
        (Some(limit), Some(Ok(rules))) => wait_served(admin, &rules, limit).await,
        (Some(_), Some(Err(err))) => {
            bail!("applied, but --wait cannot tell what to wait for: {err}")
        }
        _ => Ok(()),
    }
}

/// Whether `served` says at least what `wanted` does: a store may write back defaults the
/// manifest left out (ZooKeeper's bodies carry `side: provider`, as Dubbo's SDKs read them).
fn includes(served: &serde_json::Value, wanted: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (served, wanted) {
        (Value::Object(served), Value::Object(wanted)) => wanted
            .iter()
            .all(|(key, value)| served.get(key).is_some_and(|s| includes(s, value))),
        (Value::Array(served), Value::Array(wanted)) => {
            served.len() == wanted.len() && served.iter().zip(wanted).all(|(s, w)| includes(s, w))
        }
        _ => served == wanted,
    }
}

/// Polls the rule lists (what clients are served: in ZooKeeper mode what the watch read back)
/// until each of `rules` is there with at least its spec, for at most `limit`.
async fn wait_served(
    admin: &AdminArg,
    rules: &[crate::rules::Rule],
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pending: Vec<&crate::rules::Rule> = rules.iter().collect();
    loop {
        let mut lists: std::collections::BTreeMap<(&str, &str), serde_json::Value> =
            std::collections::BTreeMap::new();
        let mut still = Vec::new();
        for rule in pending {
            let list_key = (rule.kind().plural(), rule.namespace.as_str());
            if let std::collections::btree_map::Entry::Vacant(entry) = lists.entry(list_key) {
                let path = format!("/api/v1/rules/{}?namespace={}", list_key.0, list_key.1);
                entry.insert(request(admin, "GET", &path, None).await?);
            }
            let wanted = rule.to_manifest();
            let served = lists[&list_key]["items"].as_array().is_some_and(|items| {
                items.iter().any(|item| {
                    item["metadata"]["name"] == wanted["metadata"]["name"]
                        && includes(&item["spec"], &wanted["spec"])
                })
            });
            if !served {
                still.push(rule);
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let names: Vec<String> = still
                .iter()
                .map(|r| format!("{} {}/{}", r.kind().name(), r.namespace, r.name))
                .collect();
            bail!(
                "not served within {} (--wait-timeout): {}",
                humantime::format_duration(limit),
                names.join(", ")
            );
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `dubbo-cp delete -f ...`: like kubectl, an object that does not exist is an error (exit 1)
/// unless `--ignore-not-found`; the others are deleted all the same.
pub async fn delete_files(
    admin: &AdminArg,
    files: &[PathBuf],
    ignore_not_found: bool,
) -> anyhow::Result<()> {
    let manifests = read_manifests(files)?;
    let report = request(admin, "POST", "/api/v1/delete", Some(manifests)).await?;
    print_report(&report, &[("deleted", "deleted")]);
    not_found(&report, ignore_not_found)
}

/// Fails naming the objects the server did not find, unless they may be missing.
fn not_found(report: &serde_json::Value, ignore: bool) -> anyhow::Result<()> {
    let missing: Vec<&str> = report["notFound"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.as_str())
        .collect();
    if missing.is_empty() || ignore {
        return Ok(());
    }
    bail!(
        "{} not found (nothing to delete; --ignore-not-found to accept that)",
        missing.join(", ")
    )
}

/// The rule kind `what` names (`tagroutes`, `tagroute`, `TagRoute`), or an error listing them
/// (`get` also takes `mappings` and `applications`, which `command` names when it does).
fn rule_kind(command: &str, what: &str) -> anyhow::Result<crate::index::Kind> {
    crate::rules::RULE_KINDS
        .into_iter()
        .find(|kind| {
            kind.name().eq_ignore_ascii_case(what) || kind.plural().eq_ignore_ascii_case(what)
        })
        .with_context(|| {
            let kinds: Vec<&str> = crate::rules::RULE_KINDS.iter().map(|k| k.plural()).collect();
            let also = if command == "get" {
                "mappings, applications, or "
            } else {
                ""
            };
            format!(
                "{command} {what:?}: not a kind dubbo-cp serves; {command} takes {also}a rule kind: {}",
                kinds.join(", ")
            )
        })
}

/// Refuses a name or namespace that no rule can have (apply takes only DNS-1123 names) before
/// it goes into a request line, where a space or `/` would make an unrelated HTTP error.
fn object_name(field: &str, value: &str) -> anyhow::Result<()> {
    let valid = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    anyhow::ensure!(
        valid,
        "{field} {value:?} is not a valid name: lower-case letters, digits, '-' and '.'"
    );
    Ok(())
}

/// `dubbo-cp delete <kind> NAME -n NS`.
pub async fn delete_named(
    admin: &AdminArg,
    kind: &str,
    name: &str,
    namespace: &str,
    ignore_not_found: bool,
) -> anyhow::Result<()> {
    let kind = rule_kind("delete", kind)?.plural();
    object_name("name", name)?;
    object_name("namespace", namespace)?;
    let path = format!("/api/v1/rules/{kind}/{namespace}/{name}");
    let report = request(admin, "DELETE", &path, None).await?;
    print_report(&report, &[("deleted", "deleted")]);
    not_found(&report, ignore_not_found)
}

/// `dubbo-cp get <kind> [-n NS]`: the objects as the server's index holds them.
pub async fn get(
    admin: &AdminArg,
    kind: &str,
    namespace: Option<&str>,
    output: RuleOutput,
) -> anyhow::Result<()> {
    let rule_kind = rule_kind("get", kind)?;
    let plural = rule_kind.plural();
    let mut path = match namespace {
        Some(namespace) => {
            object_name("namespace", namespace)?;
            format!("/api/v1/rules/{plural}?namespace={namespace}")
        }
        None => format!("/api/v1/rules/{plural}"),
    };
    // The auth kinds: ask who receives each policy.
    if matches!(
        rule_kind,
        crate::index::Kind::AuthenticationPolicy | crate::index::Kind::AuthorizationPolicy
    ) {
        path.push(if namespace.is_some() { '&' } else { '?' });
        path.push_str("audience=true");
    }
    let list = request(admin, "GET", &path, None).await?;
    match output {
        RuleOutput::Json => outln!("{}", serde_json::to_string_pretty(&list)?),
        RuleOutput::Yaml => out!("{}", serde_yaml::to_string(&list)?),
        // As kubectl: no header over nothing, and the note on standard error (scripts read
        // standard output).
        RuleOutput::Text if list["items"].as_array().is_none_or(Vec::is_empty) => match namespace {
            Some(namespace) => eprintln!("No resources found in {namespace} namespace."),
            None => eprintln!("No resources found"),
        },
        RuleOutput::Text => out!("{}", columns::table(kind, &list)?),
    }
    warn_unreceived(&list);
    Ok(())
}

/// On standard error, the auth policies no discovery stream subscribed to their kind receives:
/// `get` shows what is stored, and a policy that selects nobody connected looks served when it
/// is not.
fn warn_unreceived(list: &serde_json::Value) {
    let Some(audiences) = list["audiences"].as_object() else {
        return;
    };
    let root = list["rootNamespace"].as_str().unwrap_or_default();
    let subscribers = list["subscribers"].as_u64().unwrap_or_default();
    // Policies neither a discovery-stream client receives nor an xDS server enforces (a server
    // that does not count enforcers counts none).
    let unreceived: Vec<(&String, &serde_json::Value)> = audiences
        .iter()
        .filter(|(_, a)| {
            a["receiving"].as_u64() == Some(0) && a["xdsServers"].as_u64().unwrap_or(0) == 0
        })
        .collect();
    if unreceived.is_empty() {
        return;
    }
    if subscribers == 0 {
        const SHOWN: usize = 10;
        let mut names: Vec<&str> = unreceived
            .iter()
            .take(SHOWN)
            .map(|(k, _)| k.as_str())
            .collect();
        if unreceived.len() > SHOWN {
            names.push("...");
        }
        eprintln!(
            "note: no discovery-stream client subscribes to this kind now, and {} of these \
             policies reach no xDS server either: {}",
            unreceived.len(),
            names.join(", ")
        );
        return;
    }
    for (key, audience) in unreceived {
        eprintln!(
            "warning: {key}: none of the {subscribers} discovery streams subscribed to its kind \
             receives it, and no xDS server enforces it; it is served to {} (a client without an \
             identity receives only the policies of namespace {root:?})",
            audience["receivers"].as_str().unwrap_or_default(),
        );
    }
}

fn print_report(report: &serde_json::Value, sections: &[(&str, &str)]) {
    for (field, verb) in sections {
        for object in report[*field].as_array().into_iter().flatten() {
            if let Some(object) = object.as_str() {
                outln!("{object} {verb}");
            }
        }
    }
}

/// One HTTP/1.1 request to the admin port; the JSON answer, or the server's error message.
pub(super) async fn request(
    admin: &AdminArg,
    method: &str,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<serde_json::Value> {
    tokio::time::timeout(admin.timeout, exchange(admin, method, path, body))
        .await
        .map_err(|_| {
            let address = admin_address(&admin.admin_address).unwrap_or(&admin.admin_address);
            anyhow::anyhow!(
                "{method} http://{address}{path}: no answer within {}; {ADMIN_HINT}",
                humantime::format_duration(admin.timeout)
            )
        })?
}

/// What follows an answer that is not the admin port's.
const ADMIN_HINT: &str = "is it the control plane's admin port? (--admin, default \
     127.0.0.1:30070, plain HTTP/1.1; the gRPC ports 30060/30062 are --server)";

/// `host:port` of the admin port from `host:port` or `http://host:port`.
fn admin_address(given: &str) -> anyhow::Result<&str> {
    let address = given.trim().trim_end_matches('/');
    if address.starts_with("https://") {
        bail!(
            "--admin {given:?}: the admin port speaks plain HTTP; use host:port or http://host:port"
        );
    }
    let address = address.strip_prefix("http://").unwrap_or(address);
    anyhow::ensure!(
        !address.is_empty() && !address.contains("://") && !address.contains('/'),
        "--admin {given:?}: use host:port or http://host:port, e.g. 127.0.0.1:30070"
    );
    Ok(address)
}

async fn exchange(
    admin: &AdminArg,
    method: &str,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<serde_json::Value> {
    let body = exchange_text(admin, method, path, body).await?;
    Ok(serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

/// A GET of a text answer (`ca root`'s PEM bundle), or the server's error message.
pub(super) async fn request_text(admin: &AdminArg, path: &str) -> anyhow::Result<String> {
    tokio::time::timeout(admin.timeout, exchange_text(admin, "GET", path, None))
        .await
        .map_err(|_| {
            let address = admin_address(&admin.admin_address).unwrap_or(&admin.admin_address);
            anyhow::anyhow!(
                "GET http://{address}{path}: no answer within {}; {ADMIN_HINT}",
                humantime::format_duration(admin.timeout)
            )
        })?
}

/// One exchange; the answer's body when its status is 2xx.
async fn exchange_text(
    admin: &AdminArg,
    method: &str,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<String> {
    let address = admin_address(&admin.admin_address)?;
    let asked = format!("{method} http://{address}{path}");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|err| anyhow::anyhow!("{asked}: cannot connect: {err}; {ADMIN_HINT}"))?;
    let body = body.unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/yaml\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = &admin.token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    let sent = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await
    };
    sent.await
        .map_err(|err| anyhow::anyhow!("{asked}: cannot send the request: {err}; {ADMIN_HINT}"))?;
    let mut response = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE_BYTES as u64)
        .read_to_end(&mut response)
        .await
        .map_err(|err| anyhow::anyhow!("{asked}: no answer ({err}); {ADMIN_HINT}"))?;
    // An HTTP/2-only gRPC port answers an HTTP/1.1 request with a frame, or closes.
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .filter(|_| response.starts_with(b"HTTP/1."))
        .ok_or_else(|| anyhow::anyhow!("{asked}: the answer is not HTTP/1.1; {ADMIN_HINT}"))?;
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let raw_body = &response[split + 4..];
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{asked}: malformed status line; {ADMIN_HINT}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        String::from_utf8_lossy(&dechunk(raw_body)).into_owned()
    } else {
        String::from_utf8_lossy(raw_body).into_owned()
    };
    if !(200..300).contains(&status) {
        let json: serde_json::Value =
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
        let message = json["error"]
            .as_str()
            .map_or(body.trim().to_owned(), str::to_owned);
        let hint = match status {
            401 => "; send an admin token with --token or DUBBO_CP_TOKEN",
            403 => {
                "; the token's identity is not in auth.admins (or, without authentication, \
                    the caller is not local)"
            }
            404 if message.is_empty() => {
                "; this server does not serve that path: is it a dubbo-cp admin port of this \
                 version, and the right port (--admin)?"
            }
            405 if message.is_empty() => {
                "; this server does not take that method on that path: is it a dubbo-cp admin \
                 port of this version, and the right port (--admin)?"
            }
            _ if message.is_empty() => "; is it the control plane's admin port (--admin)?",
            _ => "",
        };
        let message = if message.is_empty() {
            "no message"
        } else {
            &message
        };
        bail!("{asked}: HTTP {status}: {message}{hint}");
    }
    Ok(body)
}

/// The payload of a chunked body (bytes: a chunk may end inside a UTF-8 character).
fn dechunk(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") {
        let Some(size) = std::str::from_utf8(&rest[..line_end])
            .ok()
            .and_then(|size| usize::from_str_radix(size.trim(), 16).ok())
        else {
            break;
        };
        let data = &rest[line_end + 2..];
        if size == 0 || data.len() < size {
            break;
        }
        out.extend_from_slice(&data[..size]);
        rest = data[size..].strip_prefix(b"\r\n").unwrap_or(&data[size..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_spec_may_say_more_than_the_manifest() {
        let served =
            serde_json::json!({"key": "g", "configs": [{"side": "provider", "addresses": ["a"]}]});
        let wanted = serde_json::json!({"key": "g", "configs": [{"addresses": ["a"]}]});
        assert!(includes(&served, &wanted));
        assert!(!includes(&wanted, &served));
        let other = serde_json::json!({"key": "g", "configs": [{"addresses": ["b"]}]});
        assert!(!includes(&served, &other));
        let more = serde_json::json!({"key": "g", "configs": [{"addresses": ["a"]}, {}]});
        assert!(!includes(&served, &more));
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), b"abcde");
        assert!(dechunk(b"").is_empty());
        // A chunk boundary inside a two-byte character.
        assert_eq!(
            String::from_utf8(dechunk("1\r\n\u{e9}\r\n0\r\n\r\n".as_bytes())).ok(),
            None,
            "the size counts bytes"
        );
        assert_eq!(
            dechunk(b"1\r\n\xc3\r\n1\r\n\xa9\r\n0\r\n\r\n"),
            "\u{e9}".as_bytes()
        );
    }

    #[tokio::test]
    async fn a_silent_port_is_an_error_naming_the_request_the_address_and_the_fix() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        // Accepts and holds the connection, never answering.
        let held = tokio::spawn(async move { listener.accept().await.map(|(socket, _)| socket) });
        let admin = AdminArg {
            admin_address: address.clone(),
            token: None,
            timeout: Duration::from_millis(200),
        };
        let run = request(&admin, "GET", "/api/v1/ca", None);
        let err = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("the request still waits on a port that never answers")
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "GET http://{address}/api/v1/ca: no answer within 200ms"
            )) && message.contains("admin port"),
            "{message}"
        );
        held.abort();
    }

    #[test]
    fn directories_give_their_manifest_files_in_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.yaml"), "b: 1").unwrap();
        std::fs::write(dir.path().join("a.yml"), "a: 1").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        let text = read_manifests(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(text, "a: 1\n---\nb: 1");
    }
}
