//! Webhooks with Flagger's semantics: an HTTP POST of `{name, namespace, phase, checksum,
//! metadata}`; success is a 2xx within the hook's timeout, after up to `retries` retries with
//! backoff.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::crd::{Canary, CanaryStatus, Webhook};
use super::http::HttpClient;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The first retry waits this long; each further one twice as long, at most [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Which hooks of `canary` have type `kind` (no type is `rollout`).
pub fn of_type<'a>(canary: &'a Canary, kind: &'a str) -> impl Iterator<Item = &'a Webhook> + 'a {
    canary
        .spec
        .analysis
        .webhooks
        .iter()
        .filter(move |hook| hook.r#type.as_deref().unwrap_or("rollout") == kind)
}

/// The body every hook receives.
/// `status` is the run's as this reconcile sees it: the checksum of a revision that has just
/// started is already its own.
pub fn payload(
    canary: &Canary,
    status: &CanaryStatus,
    extra: &BTreeMap<String, String>,
) -> serde_json::Value {
    json!({
        "name": canary.metadata.name.clone().unwrap_or_default(),
        "namespace": canary.metadata.namespace.clone().unwrap_or_default(),
        "phase": status.phase,
        "checksum": status.last_applied_spec,
        "metadata": extra,
    })
}

/// A hook's answer: whether it succeeded, and a sentence about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub ok: bool,
    pub message: String,
}

/// Calls `hook` with `body`, retrying failures with backoff.
pub async fn call(http: &HttpClient, hook: &Webhook, body: &serde_json::Value) -> Outcome {
    let timeout = hook
        .timeout
        .as_deref()
        .and_then(|t| humantime::parse_duration(t).ok())
        .unwrap_or(DEFAULT_TIMEOUT);
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0;
    loop {
        let outcome = match http.post_json(&hook.url, body, timeout).await {
            Ok(answer) if (200..300).contains(&answer.status) => Outcome {
                ok: true,
                message: format!("HTTP {}", answer.status),
            },
            Ok(answer) => Outcome {
                ok: false,
                message: format!(
                    "HTTP {}: {}",
                    answer.status,
                    answer.body.trim().chars().take(200).collect::<String>()
                ),
            },
            Err(error) => Outcome {
                ok: false,
                message: error.to_string(),
            },
        };
        if outcome.ok || attempt >= hook.retries {
            return outcome;
        }
        attempt += 1;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
