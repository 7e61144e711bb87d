//! The xDS bench's load generators behind one face: tonic streams in this process
//! (xds_streams.rs), lean streams on the h2 crate in this process (xds_h2.rs), or released @grpc/grpc-js in a Node.js process of its own
//! (`grpc_js/streams.js`), whose transport, status codes and reconnection are those of a gRPC
//! library users run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::xds_streams::Acks;

/// The released client the bench installs when it is missing (the versions the tests use).
const GRPC_JS: [&str; 3] = [
    "@grpc/grpc-js@1.14.7",
    "@grpc/grpc-js-xds@1.14.1",
    "@grpc/proto-loader@0.8.1",
];

/// What the load generator waits for.
#[derive(Clone, Copy)]
pub enum Count {
    /// Every stream ACKed its first load assignment.
    Subscribed,
    /// Every stream ACKed one load assignment more than at `Load::mark`.
    Endpoint,
    /// Every stream ACKed a load assignment after a failure.
    Reconnected,
}

impl Count {
    fn name(self) -> &'static str {
        match self {
            Count::Subscribed => "subscribed",
            Count::Endpoint => "endpoint",
            Count::Reconnected => "reconnected",
        }
    }
}

pub enum Load {
    /// Streams in this process: tonic's (xds_streams.rs) or the lean generator's (xds_h2.rs).
    InProcess {
        acks: Arc<Acks>,
        streams: usize,
        mark: usize,
        /// The client, as the report names it.
        client: &'static str,
    },
    /// Node.js processes, each with its share of the streams.
    GrpcJs(Vec<GrpcJs>),
}

impl Load {
    /// Notes how many load assignments were ACKed, for `Count::Endpoint`.
    pub async fn mark(&mut self) -> anyhow::Result<()> {
        match self {
            Load::InProcess { acks, mark, .. } => *mark = acks.endpoint.get(),
            Load::GrpcJs(processes) => {
                for js in processes {
                    js.mark = js.ask("count").await?["endpoint"]
                        .as_u64()
                        .context("count: no number")? as usize;
                }
            }
        }
        Ok(())
    }

    /// Waits until every stream has done `count`.
    pub async fn wait(&mut self, count: Count, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let (mut got, mut wanted) = (0, 0);
        let mut reached = true;
        match self {
            Load::InProcess {
                acks,
                streams,
                mark,
                ..
            } => {
                let (counter, goal) = match count {
                    Count::Subscribed => (&acks.subscribed, *streams),
                    Count::Endpoint => (&acks.endpoint, *mark + *streams),
                    Count::Reconnected => (&acks.reconnected, *streams),
                };
                reached = counter.reach(goal, deadline).await;
                (got, wanted) = (counter.get(), goal);
            }
            Load::GrpcJs(processes) => {
                for js in processes {
                    let goal = js.streams
                        + match count {
                            Count::Endpoint => js.mark,
                            _ => 0,
                        };
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let what = count.name();
                    let answer = js
                        .ask(&format!("wait {what} {goal} {}", left.as_secs().max(1)))
                        .await?;
                    reached &= answer["reached"].as_bool().unwrap_or(false);
                    got += answer[what].as_u64().unwrap_or(0) as usize;
                    wanted += goal;
                }
            }
        }
        if !reached {
            bail!(
                "{} {got} of {wanted} within {timeout:?}; stream failures: {}",
                count.name(),
                self.errors().await?
            );
        }
        Ok(())
    }

    /// Failures by code, with the first message of each.
    async fn codes(&mut self) -> anyhow::Result<BTreeMap<String, (u64, String)>> {
        let mut codes = BTreeMap::new();
        match self {
            Load::InProcess { acks, .. } => return Ok(acks.codes()),
            Load::GrpcJs(processes) => {
                for js in processes {
                    let answer = js.ask("errors").await?;
                    let Some(counted) = answer["codes"].as_object() else {
                        continue;
                    };
                    for (code, n) in counted {
                        let entry = codes.entry(code.clone()).or_insert_with(|| {
                            (0, answer["first"][code].as_str().unwrap_or("").to_owned())
                        });
                        entry.0 += n.as_u64().unwrap_or(0);
                    }
                }
            }
        }
        Ok(codes)
    }

    /// Failures by code, `CODE=n (first message)` joined.
    pub async fn errors(&mut self) -> anyhow::Result<String> {
        let codes = self.codes().await?;
        if codes.is_empty() {
            return Ok("none".to_owned());
        }
        Ok(codes
            .iter()
            .map(|(code, (n, first))| format!("{code}={n} ({first:?})"))
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// Failures a gRPC client reports as other than UNAVAILABLE: for grpc-js its own codes,
    /// transport failures included; in this process the statuses the server sent (the names
    /// for transport failures, which gRPC clients report as UNAVAILABLE, are left out).
    pub async fn beyond_unavailable(&mut self) -> anyhow::Result<u64> {
        let in_process = matches!(self, Load::InProcess { .. });
        Ok(self
            .codes()
            .await?
            .iter()
            .filter(|(code, _)| !code.to_uppercase().starts_with("UNAVAILABLE"))
            .filter(|(code, _)| !(in_process && code.contains(" transport")))
            .map(|(_, (n, _))| n)
            .sum())
    }

    /// Streams ending from now on end because the run is over.
    pub async fn finish(&mut self) -> anyhow::Result<()> {
        match self {
            Load::InProcess { acks, .. } => acks.finished.store(true, Ordering::SeqCst),
            Load::GrpcJs(processes) => {
                for js in processes {
                    js.send("finish").await?;
                }
            }
        }
        Ok(())
    }

    /// The load generator as the report names it: tonic, h2, or grpc-js with the version installed.
    pub async fn describe(&mut self) -> anyhow::Result<String> {
        match self {
            Load::InProcess { client, .. } => Ok((*client).to_owned()),
            Load::GrpcJs(processes) => {
                let count = processes.len();
                let Some(js) = processes.first_mut() else {
                    bail!("no grpc-js process");
                };
                let version = js.ask("version").await?["version"]
                    .as_str()
                    .unwrap_or("?")
                    .to_owned();
                Ok(format!("grpc-js {version} ({count} Node.js processes)"))
            }
        }
    }

    /// The processes whose CPU and memory the load costs: this one, or Node's.
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Load::InProcess { .. } => vec![std::process::id()],
            Load::GrpcJs(processes) => processes.iter().filter_map(|js| js.child.id()).collect(),
        }
    }
}

/// The Node.js load generator, killed when dropped.
pub struct GrpcJs {
    child: Child,
    /// Its share of the streams.
    streams: usize,
    /// Load assignments ACKed at the last `Load::mark`.
    mark: usize,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    _script: tempfile::TempDir,
}

/// Where the streams go and which.
pub struct Streams<'a> {
    pub target: &'a str,
    /// The first stream's number: it picks the services of each.
    pub first: usize,
    pub streams: usize,
    pub per_connection: usize,
    pub services: usize,
    pub per_stream: usize,
    pub delta: bool,
}

impl GrpcJs {
    /// Starts `streams` streams on grpc-js from `prefix` (npm's `--prefix`), installing it there
    /// first when it is not.
    pub async fn spawn(prefix: &Path, streams: Streams<'_>) -> anyhow::Result<GrpcJs> {
        let modules = install(prefix).await?;
        // The script travels inside the binary, which may run far from its source tree.
        let script = tempfile::tempdir()?;
        let path = script.path().join("streams.js");
        std::fs::write(&path, include_str!("../grpc_js/streams.js"))?;
        let mut child = tokio::process::Command::new("node")
            // A heap for 100,000 streams; Node's default stops near 4 GiB.
            .arg("--max-old-space-size=16384")
            .arg(&path)
            .args([
                streams.target.to_owned(),
                streams.first.to_string(),
                streams.streams.to_string(),
                streams.per_connection.to_string(),
                streams.services.to_string(),
                streams.per_stream.to_string(),
                if streams.delta { "delta" } else { "sotw" }.to_owned(),
            ])
            .env("NODE_PATH", &modules)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start node (the grpc-js load generator needs Node.js)")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = child.stdout.take().context("no stdout")?;
        Ok(GrpcJs {
            child,
            streams: streams.streams,
            mark: 0,
            stdin,
            lines: BufReader::new(stdout).lines(),
            _script: script,
        })
    }

    async fn send(&mut self, command: &str) -> anyhow::Result<()> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        Ok(())
    }

    async fn ask(&mut self, command: &str) -> anyhow::Result<serde_json::Value> {
        self.send(command).await?;
        let line = self
            .lines
            .next_line()
            .await?
            .context("the grpc-js load generator exited")?;
        serde_json::from_str(&line).with_context(|| format!("grpc-js answered {line:?}"))
    }
}

async fn install(prefix: &Path) -> anyhow::Result<PathBuf> {
    let modules = prefix.join("node_modules");
    if modules.join("@grpc/grpc-js-xds/package.json").is_file()
        && modules.join("@grpc/proto-loader/package.json").is_file()
    {
        return Ok(modules);
    }
    let installed = tokio::process::Command::new("npm")
        .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
        .arg(prefix)
        .args(GRPC_JS)
        .status()
        .await
        .context("cannot run npm to install grpc-js")?;
    if !installed.success() {
        bail!("npm install {GRPC_JS:?} failed");
    }
    Ok(modules)
}
