//! `dubbo-cp canary status|promote|abort|history|rollback`: talk to the API server (like
//! kubectl), not to the control plane, since Canaries live there.

use anyhow::Context;

use crate::canary::crd::{Canary, CanaryStatus};
use crate::canary::ops;

#[derive(Debug, clap::Args)]
pub struct Target {
    /// The Canary's name.
    pub name: String,
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// API server URL (unset: KUBECONFIG, ~/.kube/config or in-cluster).
    #[arg(long = "kube-api-server", env = "DUBBO_CP_KUBE_API_SERVER")]
    pub api_server: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum CanaryCommand {
    /// The current run: phase, weight history, each metric's last value against its range,
    /// the hooks' last answers.
    Status {
        #[command(flatten)]
        target: Target,
        /// Print the Canary's status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Skip the remaining steps of the run in flight and promote it.
    Promote {
        #[command(flatten)]
        target: Target,
    },
    /// Roll the run in flight back now.
    Abort {
        #[command(flatten)]
        target: Target,
    },
    /// The recorded revisions (ControllerRevisions), oldest first.
    History {
        #[command(flatten)]
        target: Target,
    },
    /// Set the target's pod template to revision N, which starts a new run.
    Rollback {
        #[command(flatten)]
        target: Target,
        #[arg(long = "to-revision")]
        to_revision: i64,
    },
}

pub async fn run(command: CanaryCommand) -> anyhow::Result<()> {
    match command {
        CanaryCommand::Status { target, json } => {
            let client = client(&target).await?;
            let canary = ops::canary(&client, &target.namespace, &target.name).await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&canary.status)?);
            } else {
                out!("{}", render_status(&canary));
            }
            Ok(())
        }
        CanaryCommand::Promote { target } => {
            let client = client(&target).await?;
            ops::request_action(&client, &target.namespace, &target.name, "promote").await?;
            outln!(
                "promotion of {}/{} requested",
                target.namespace,
                target.name
            );
            Ok(())
        }
        CanaryCommand::Abort { target } => {
            let client = client(&target).await?;
            ops::request_action(&client, &target.namespace, &target.name, "abort").await?;
            outln!("abort of {}/{} requested", target.namespace, target.name);
            Ok(())
        }
        CanaryCommand::History { target } => {
            let client = client(&target).await?;
            let current = ops::canary(&client, &target.namespace, &target.name)
                .await?
                .status
                .unwrap_or_default()
                .current_revision;
            outln!("{:<10} {:<30} {:<40} CURRENT", "REVISION", "NAME", "IMAGES");
            for revision in ops::history(&client, &target.namespace, &target.name).await? {
                let name = revision.metadata.name.clone().unwrap_or_default();
                let images = ops::template_of(&revision)
                    .and_then(|t| t.spec)
                    .map(|spec| {
                        spec.containers
                            .iter()
                            .filter_map(|c| c.image.clone())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                let marker = if name == current { "*" } else { "" };
                outln!(
                    "{:<10} {:<30} {:<40} {marker}",
                    revision.revision.unwrap_or_default(),
                    name,
                    images
                );
            }
            Ok(())
        }
        CanaryCommand::Rollback {
            target,
            to_revision,
        } => {
            let client = client(&target).await?;
            let name =
                ops::rollback_to(&client, &target.namespace, &target.name, to_revision).await?;
            outln!(
                "{}/{}: target set to revision {to_revision} ({name}); a new run starts",
                target.namespace,
                target.name
            );
            Ok(())
        }
    }
}

async fn client(target: &Target) -> anyhow::Result<kube::Client> {
    crate::k8s::client(target.api_server.as_deref())
        .await
        .context("cannot reach the API server")
}

/// The strategy as a person reads it: A/B with its match, Blue/Green with its iterations.
fn strategy_line(analysis: &crate::canary::crd::Analysis) -> String {
    use crate::canary::Strategy;
    let strategy = Strategy::of(analysis);
    let iterations = analysis.iterations.unwrap_or_default();
    match strategy {
        Strategy::Canary => match analysis
            .session_affinity
            .as_ref()
            .and_then(|a| a.header_name.as_deref())
        {
            Some(header) => format!("{}, each caller kept by header {header}", strategy.as_str()),
            None => strategy.as_str().to_owned(),
        },
        Strategy::BlueGreen => format!("{} after {iterations} iterations", strategy.as_str()),
        Strategy::ABTesting => {
            format!(
                "{} after {iterations} iterations, canary gets calls with {}",
                strategy.as_str(),
                crate::canary::abtest::describe(&analysis.r#match)
            )
        }
    }
}

/// The status as a person reads it.
pub fn render_status(canary: &Canary) -> String {
    use std::fmt::Write;
    let status: CanaryStatus = canary.status.clone().unwrap_or_default();
    let analysis = &canary.spec.analysis;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "canary {}/{}: phase {}, weight {}% (max {}%), failed checks {}/{}, iterations {}",
        canary.metadata.namespace.as_deref().unwrap_or_default(),
        canary.metadata.name.as_deref().unwrap_or_default(),
        if status.phase.is_empty() {
            "Initializing"
        } else {
            &status.phase
        },
        status.canary_weight,
        analysis.max_weight,
        status.failed_checks,
        analysis.threshold,
        status.iterations,
    );
    if canary.spec.suspend {
        let _ = writeln!(
            out,
            "suspended: nothing moves until spec.suspend is cleared (the status is as last written)"
        );
    }
    let _ = writeln!(out, "strategy {}", strategy_line(analysis));
    let _ = writeln!(
        out,
        "target {}, revision {}, last transition {}",
        canary.spec.target_ref.name,
        if status.current_revision.is_empty() {
            "-"
        } else {
            &status.current_revision
        },
        if status.last_transition_time.is_empty() {
            "-"
        } else {
            &status.last_transition_time
        },
    );
    for condition in &status.conditions {
        let _ = writeln!(
            out,
            "{}={} ({}): {}",
            condition.r#type, condition.status, condition.reason, condition.message
        );
    }
    if !status.history.is_empty() {
        let _ = writeln!(out, "\nweight history:");
        let _ = writeln!(
            out,
            "  {:<26} {:>6}  {:<17} METRICS",
            "TIME", "WEIGHT", "PHASE"
        );
        for step in &status.history {
            let metrics: Vec<String> = step
                .metrics
                .iter()
                .map(|m| {
                    format!(
                        "{}={}{}",
                        m.name,
                        m.value.map_or("none".to_owned(), |v| format!("{v}")),
                        if m.ok { "" } else { " FAIL" }
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  {:<26} {:>5}%  {:<17} {}",
                step.time,
                step.weight,
                step.phase,
                metrics.join(", ")
            );
        }
    }
    if let Some(last) = status.history.iter().rev().find(|s| !s.metrics.is_empty()) {
        let _ = writeln!(out, "\nmetrics (last check):");
        for m in &last.metrics {
            let range = format!(
                "[{}, {}]",
                m.min.map_or("-inf".to_owned(), |v| v.to_string()),
                m.max.map_or("+inf".to_owned(), |v| v.to_string())
            );
            let _ = writeln!(
                out,
                "  {:<24} {:>12} in {:<16} {}{}",
                m.name,
                m.value.map_or("no data".to_owned(), |v| v.to_string()),
                range,
                if m.ok { "ok" } else { "FAILED" },
                if m.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", m.message)
                }
            );
        }
    }
    if !status.hooks.is_empty() {
        let _ = writeln!(out, "\nhooks (last answer):");
        for hook in &status.hooks {
            let _ = writeln!(
                out,
                "  {:<20} {:<26} {:<6} {}",
                hook.name,
                hook.r#type,
                if hook.ok { "ok" } else { "FAILED" },
                hook.message
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canary(analysis: serde_json::Value) -> Canary {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
            "metadata": {"name": "podinfo", "namespace": "test"},
            "spec": {"targetRef": {"name": "podinfo"}, "analysis": analysis},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_status_names_the_strategy_and_an_ab_match() {
        let ab = canary(serde_json::json!({"iterations": 10, "match": [
            {"headers": {"x-canary": {"exact": "insider"}, "x-region": {"prefix": "eu"}}},
            {"headers": {"x-user": {"suffix": "@example.com"}}},
        ]}));
        assert!(
            render_status(&ab).contains(
                "strategy A/B after 10 iterations, canary gets calls with \
                 x-canary=insider & x-region prefix eu or x-user suffix @example.com"
            ),
            "{}",
            render_status(&ab)
        );
        let blue_green = canary(serde_json::json!({"iterations": 3}));
        assert!(render_status(&blue_green).contains("strategy Blue/Green after 3 iterations"));
        let weights = canary(serde_json::json!({"stepWeight": 10}));
        assert!(render_status(&weights).contains("strategy Canary\n"));
        let sticky = canary(serde_json::json!({"stepWeight": 10,
            "sessionAffinity": {"headerName": "x-user"}}));
        assert!(
            render_status(&sticky).contains("strategy Canary, each caller kept by header x-user\n")
        );
        assert!(!render_status(&weights).contains("suspended"));
        let mut suspended = weights;
        suspended.spec.suspend = true;
        assert!(
            render_status(&suspended).contains("\nsuspended: nothing moves until spec.suspend")
        );
    }
}
