//! `dubbo-cp xds`: what the xDS edge serves, as operators ask about it. `split` prints the share
//! of calls each endpoint gets for a target, a client namespace and a call's headers (the
//! dashboard draws the same answer of `/debug/xds/split`).

use anyhow::Context;

use super::rules::{AdminArg, request};
use super::status::printable;

#[derive(clap::Subcommand, Debug)]
pub enum XdsCommand {
    /// The share of calls each endpoint gets, as a client in NAMESPACE calling SERVICE with
    /// these headers is told by the routes, clusters and load assignments it is served.
    Split(SplitArgs),
}

#[derive(clap::Args, Debug)]
pub struct SplitArgs {
    #[command(flatten)]
    pub admin: AdminArg,
    /// What the client dials (`xds:///SERVICE`): a host with its port, a ServiceEntry's name,
    /// an interface or an application.
    pub service: String,
    /// The client's namespace (its bootstrap's `-n`).
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// A header (metadata) the call carries, `name:value`; repeat for several.
    #[arg(long = "header", value_name = "NAME:VALUE")]
    pub headers: Vec<String>,
    /// The call's path, `/package.Service/Method`, for routes that match on it.
    #[arg(long)]
    pub path: Option<String>,
}

pub async fn run(command: XdsCommand) -> anyhow::Result<()> {
    match command {
        XdsCommand::Split(args) => split(args).await,
    }
}

async fn split(args: SplitArgs) -> anyhow::Result<()> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("service", &args.service);
    query.append_pair("namespace", &args.namespace);
    for header in &args.headers {
        anyhow::ensure!(
            header.contains(':'),
            "--header {header:?}: expected NAME:VALUE, e.g. dubbo-tag:gray"
        );
        query.append_pair("header", header);
    }
    if let Some(path) = &args.path {
        query.append_pair("path", path);
    }
    let path = format!("/debug/xds/split?{}", query.finish());
    let answer = request(&args.admin, "GET", &path, None).await?;
    out!(
        "{}",
        table(&answer).context("unexpected /debug/xds/split answer")?
    );
    Ok(())
}

/// The answer as the CLI prints it: the route, the clusters, then one line per endpoint with
/// its share and a bar of it.
/// An xDS version with the time it stands for: versions are published at Unix milliseconds (or
/// one past the previous), so `1796691594678 (2026-12-08T00:59:54.678Z)`.
fn readable_version(version: &str) -> String {
    match version.parse::<u64>() {
        Ok(millis) if millis >= 1_000_000_000_000 => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(millis);
            format!("{version} ({})", humantime::format_rfc3339_millis(at))
        }
        _ => version.to_owned(),
    }
}

fn table(answer: &serde_json::Value) -> Option<String> {
    let split = &answer["split"];
    let headers: Vec<&str> = answer["headers"]
        .as_array()?
        .iter()
        .filter_map(|h| h.as_str())
        .collect();
    let mut out = format!(
        "{} from namespace {}{}, version {}\nroute {}: {}\n",
        printable(answer["service"].as_str()?),
        printable(answer["namespace"].as_str()?),
        if headers.is_empty() {
            String::new()
        } else {
            format!(" with {}", printable(&headers.join(", ")))
        },
        readable_version(split["version"].as_str()?),
        split["route"].as_u64()?,
        printable(split["matched"].as_str()?),
    );
    out.push_str(&format!(
        "{:<64} {:<12} {:>7}\n",
        "CLUSTER", "POLICY", "SHARE"
    ));
    for cluster in split["clusters"].as_array()? {
        out.push_str(&format!(
            "{:<64} {:<12} {:>6.1}%\n",
            printable(cluster["name"].as_str()?),
            printable(cluster["policy"].as_str()?),
            cluster["share"].as_f64()?
        ));
    }
    out.push_str(&format!(
        "{:<24} {:<28} {:>7}  CLUSTER\n",
        "ENDPOINT", "LOCALITY", "SHARE"
    ));
    for endpoint in split["endpoints"].as_array()? {
        let share = endpoint["share"].as_f64()?;
        out.push_str(&format!(
            "{:<24} {:<28} {:>6.1}%  {} {}\n",
            printable(endpoint["address"].as_str()?),
            printable(endpoint["locality"].as_str()?),
            share,
            printable(endpoint["cluster"].as_str()?),
            "#".repeat((share / 2.0).round().clamp(0.0, 50.0) as usize),
        ));
    }
    for note in split["notes"].as_array()? {
        out.push_str(&format!("note: {}\n", printable(note.as_str()?)));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_the_route_the_clusters_and_each_endpoints_share() {
        let answer = serde_json::json!({
            "service": "greeter:7070", "namespace": "shop", "headers": ["dubbo-tag:gray"],
            "split": {
                "version": "9", "route": 2, "matched": "dubbo-tag=gray",
                "clusters": [{"name": "outbound|7070|gray|greeter", "policy": "ROUND_ROBIN", "share": 100.0}],
                "endpoints": [
                    {"address": "10.0.0.1:7070", "cluster": "outbound|7070|gray|greeter", "locality": "//#weight=80", "share": 80.0},
                    {"address": "10.0.0.2:7070", "cluster": "outbound|7070|gray|greeter", "locality": "//#weight=20", "share": 20.0},
                ],
                "notes": ["hashing"],
            },
        });
        let text = table(&answer).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "greeter:7070 from namespace shop with dubbo-tag:gray, version 9"
        );
        assert_eq!(lines[1], "route 2: dubbo-tag=gray");
        // Versions that are times say which.
        assert_eq!(
            readable_version("1796691594678"),
            "1796691594678 (2026-12-08T00:59:54.678Z)"
        );
        assert!(
            lines[5].starts_with("10.0.0.1:7070") && lines[5].contains(" 80.0%"),
            "{text}"
        );
        assert!(lines[5].ends_with(&"#".repeat(40)), "{text}");
        assert!(
            lines[6].ends_with(&format!(" {}", "#".repeat(10))),
            "{text}"
        );
        assert_eq!(lines[7], "note: hashing");
        assert!(table(&serde_json::json!({"error": "x"})).is_none());
    }
}
