//! Delivers a Canary's alerts off the reconcile path: a bounded queue, a few deliveries at once,
//! each with a deadline. A full queue drops the event, a stale one is dropped when its turn
//! comes (both counted per delivery it would have made); a failed delivery is logged and
//! counted; none of it touches the run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use tokio::sync::{Semaphore, mpsc};

use crate::alerts::{AlertProvider, CanaryAlert, Severity};
use crate::crd::Canary;
use crate::http::{HttpClient, Via};
use crate::messages::{Field, Message, Poster, payload, post_url};
use crate::stats::{AlertLabels, CanaryStats};

/// Events waiting to be delivered, across all Canaries.
pub const QUEUE: usize = 256;
/// Deliveries in flight at once.
const PARALLEL: usize = 4;
/// One POST to a receiver (Flagger's notifier allows 5 s).
pub const POST_TIMEOUT: Duration = Duration::from_secs(5);
/// Reading the provider and its Secret, then the POST.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(15);
/// An event that waited longer than this behind slow receivers is news no more: dropped.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// One event to alert on.
pub struct Notice {
    /// The Canary with the status the run wrote.
    pub canary: Canary,
    pub text: String,
    pub fields: Vec<Field>,
    pub severity: Severity,
    pub time: String,
}

impl Notice {
    /// How many deliveries it makes: one per alert whose severity hears it.
    fn deliveries(&self) -> u64 {
        let alerts = &self.canary.spec.analysis.alerts;
        alerts
            .iter()
            .filter(|a| a.severity.hears(self.severity))
            .count() as u64
    }
}

/// A notice and when it was queued.
struct Queued {
    notice: Notice,
    at: Instant,
}

/// The sending side; cloned into the controller's context. The worker stops when every sender
/// is dropped (the controller with it).
#[derive(Clone)]
pub struct Alerts {
    queue: mpsc::Sender<Queued>,
    stats: Arc<CanaryStats>,
}

impl Alerts {
    fn channel(capacity: usize, stats: Arc<CanaryStats>) -> (Alerts, mpsc::Receiver<Queued>) {
        let (queue, notices) = mpsc::channel(capacity);
        (Alerts { queue, stats }, notices)
    }

    /// Starts the worker on the current runtime.
    pub fn start(client: kube::Client, http: HttpClient, stats: Arc<CanaryStats>) -> Alerts {
        let (alerts, mut notices) = Alerts::channel(QUEUE, stats.clone());
        let worker = Worker {
            client,
            http,
            stats: stats.clone(),
        };
        tokio::spawn(async move {
            let worker = Arc::new(worker);
            let slots = Arc::new(Semaphore::new(PARALLEL));
            while let Some(queued) = notices.recv().await {
                if !fresh(&queued, Instant::now(), &stats) {
                    continue;
                }
                let notice = Arc::new(queued.notice);
                // One delivery per alert that hears it: a slow receiver holds one slot, not
                // the other receivers of the same event.
                let alerts = notice.canary.spec.analysis.alerts.iter().enumerate();
                for (index, alert) in alerts {
                    if !alert.severity.hears(notice.severity) {
                        continue;
                    }
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (worker, notice) = (worker.clone(), notice.clone());
                    tokio::spawn(async move {
                        if let Some(alert) = notice.canary.spec.analysis.alerts.get(index) {
                            worker.deliver(alert, &notice).await;
                        }
                        drop(slot);
                    });
                }
            }
        });
        alerts
    }

    /// Queues `notice` if one of its Canary's alerts hears its severity (so events nobody
    /// hears take no room); never waits.
    pub fn send(&self, notice: Notice) {
        let deliveries = notice.deliveries();
        if deliveries == 0 {
            return;
        }
        let queued = Queued {
            notice,
            at: Instant::now(),
        };
        if let Err(error) = self.queue.try_send(queued) {
            let (mpsc::error::TrySendError::Full(queued)
            | mpsc::error::TrySendError::Closed(queued)) = error;
            let notice = &queued.notice;
            self.stats
                .alerts_dropped
                .fetch_add(deliveries, Ordering::Relaxed);
            tracing::warn!(
                canary = %notice.canary.name_any(),
                namespace = notice.canary.namespace().unwrap_or_default(),
                message = %notice.text,
                "alert dropped: the queue of events waiting for slow receivers is full"
            );
        }
    }
}

/// Whether `queued` is still worth sending at `now`; a stale one is counted as dropped.
fn fresh(queued: &Queued, now: Instant, stats: &CanaryStats) -> bool {
    let waited = now.saturating_duration_since(queued.at);
    if waited <= MAX_AGE {
        return true;
    }
    let notice = &queued.notice;
    stats
        .alerts_dropped
        .fetch_add(notice.deliveries(), Ordering::Relaxed);
    tracing::warn!(
        canary = %notice.canary.name_any(),
        namespace = notice.canary.namespace().unwrap_or_default(),
        message = %notice.text,
        "alert dropped: it waited {}s behind slow receivers (at most {}s)",
        waited.as_secs(),
        MAX_AGE.as_secs()
    );
    false
}

struct Worker {
    client: kube::Client,
    http: HttpClient,
    stats: Arc<CanaryStats>,
}

/// Where one alert goes, read from its provider and Secret.
struct Target {
    provider: AlertProvider,
    address: String,
    token: Option<String>,
}

/// The namespace and name of `alert`'s provider: the Canary's namespace unless it names one.
fn provider_of(alert: &CanaryAlert, canary: &Canary) -> (String, String) {
    let namespace = alert
        .provider_ref
        .namespace
        .clone()
        .or_else(|| canary.namespace())
        .unwrap_or_default();
    (namespace, alert.provider_ref.name.clone())
}

impl Worker {
    /// Sends `notice` to `alert`'s provider; logs and counts the outcome.
    async fn deliver(&self, alert: &CanaryAlert, notice: &Notice) {
        let canary = &notice.canary;
        let (namespace, name) = provider_of(alert, canary);
        let outcome =
            match tokio::time::timeout(DELIVERY_TIMEOUT, self.deliver_one(alert, notice)).await {
                Ok(outcome) => outcome,
                Err(_) => Err((
                    String::new(),
                    format!("no delivery within {DELIVERY_TIMEOUT:?}"),
                )),
            };
        let (r#type, result) = match outcome {
            Ok(r#type) => (r#type, "sent"),
            Err((r#type, error)) => {
                tracing::warn!(
                    canary = %canary.name_any(),
                    namespace = canary.namespace().unwrap_or_default(),
                    alert = %alert.name,
                    provider = %format!("{namespace}/{name}"),
                    %error,
                    "alert not delivered"
                );
                (r#type, "failed")
            }
        };
        self.stats
            .alerts
            .get_or_create(&AlertLabels {
                r#type,
                outcome: result.to_owned(),
            })
            .inc();
    }

    /// The provider's type, or it (when known) and why the alert did not get through.
    async fn deliver_one(
        &self,
        alert: &CanaryAlert,
        notice: &Notice,
    ) -> Result<String, (String, String)> {
        let target = self
            .target(alert, &notice.canary)
            .await
            .map_err(|e| (String::new(), e))?;
        let spec = &target.provider.spec;
        let r#type = spec.r#type.clone();
        let poster = Poster {
            r#type: &spec.r#type,
            // Flagger's defaults, but the bot is this control plane.
            username: spec.username.as_deref().unwrap_or("dubbo-cp"),
            channel: spec.channel.as_deref().unwrap_or("general"),
        };
        let message = Message {
            canary: &notice.canary,
            text: &notice.text,
            fields: &notice.fields,
            severity: notice.severity,
            time: &notice.time,
        };
        let body = payload(&poster, &message);
        let url = post_url(&spec.r#type, &target.address);
        // Flagger sends the Secret's token to Slack only (its Web API, chat.postMessage).
        let web_api = target.token.is_some() && spec.r#type == "slack";
        let authorization = target
            .token
            .filter(|_| web_api)
            .map(|token| format!("Bearer {token}"));
        // An address kept in a Secret (a Slack hook URL is a credential) is named, not shown.
        let (namespace, _) = provider_of(alert, &notice.canary);
        let secret_address = spec
            .secret_ref
            .as_ref()
            .map(|secret| format!("<the address in secret {namespace}/{}>", secret.name));
        let via = Via {
            authorization: authorization.as_deref(),
            insecure: spec.insecure_skip_verify,
            proxy: spec.proxy.as_deref(),
            shown_as: secret_address.as_deref(),
        };
        let shown = secret_address.as_deref().unwrap_or(&url);
        let failed = match self
            .http
            .post_json_via(&url, &body, via, POST_TIMEOUT)
            .await
        {
            Ok(answer) if (200..300).contains(&answer.status) => {
                match slack_refusal(&answer.body).filter(|_| web_api) {
                    None => return Ok(r#type),
                    Some(error) => format!("{shown}: Slack answered ok: false: {error}"),
                }
            }
            Ok(answer) => format!(
                "{shown}: HTTP {}: {}",
                answer.status,
                answer.body.trim().chars().take(200).collect::<String>()
            ),
            Err(error) => error.to_string(),
        };
        Err((r#type, failed))
    }

    /// Reads the provider `alert` names and, if it has one, its Secret.
    async fn target(&self, alert: &CanaryAlert, canary: &Canary) -> Result<Target, String> {
        let (namespace, name) = provider_of(alert, canary);
        let name = &name;
        let providers: Api<AlertProvider> = Api::namespaced(self.client.clone(), &namespace);
        let provider = providers
            .get_opt(name)
            .await
            .map_err(|e| format!("cannot read AlertProvider {namespace}/{name}: {e}"))?
            .ok_or_else(|| format!("AlertProvider {namespace}/{name} not found"))?;
        let mut address = provider.spec.address.clone();
        let mut token = None;
        if let Some(secret) = &provider.spec.secret_ref {
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
            let found = secrets
                .get_opt(&secret.name)
                .await
                .map_err(|e| format!("cannot read secret {namespace}/{}: {e}", secret.name))?
                .ok_or_else(|| format!("secret {namespace}/{} not found", secret.name))?;
            let data: BTreeMap<String, String> = found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, value)| {
                    let text = String::from_utf8_lossy(&value.0);
                    (key, text.trim_end_matches(['\n', '\r']).to_owned())
                })
                .collect();
            // As Flagger: the Secret's address wins over the spec's.
            address = Some(data.get("address").cloned().ok_or_else(|| {
                format!(
                    "secret {namespace}/{} (AlertProvider {name}) holds no address",
                    secret.name
                )
            })?);
            token = data.get("token").cloned();
        }
        let address =
            address.ok_or_else(|| format!("AlertProvider {namespace}/{name} names no address"))?;
        Ok(Target {
            provider,
            address,
            token,
        })
    }
}

/// Slack's Web API answers 200 even when it refuses: `{"ok": false, "error": "..."}`. Its
/// `error` (at most 100 characters) when it did. Any other answer is a delivery: an incoming
/// webhook given a token anyway answers a plain `ok`.
fn slack_refusal(body: &str) -> Option<String> {
    let answer: serde_json::Value = serde_json::from_str(body).ok()?;
    if answer.get("ok") != Some(&serde_json::Value::Bool(false)) {
        return None;
    }
    let error = answer["error"].as_str().unwrap_or("no error given");
    Some(error.chars().take(100).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A notice of `severity` from a Canary with an `error` alert and a `warn` one.
    fn notice(severity: Severity) -> Notice {
        let canary: Canary = serde_json::from_value(json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
            "metadata": {"name": "podinfo", "namespace": "test"},
            "spec": {"targetRef": {"name": "podinfo"},
                     "analysis": {"stepWeight": 10, "maxWeight": 50, "alerts": [
                         {"name": "pager", "severity": "error", "providerRef": {"name": "p"}},
                         {"name": "chat", "severity": "warn", "providerRef": {"name": "c"}}]}},
        }))
        .unwrap();
        Notice {
            canary,
            text: "t".to_owned(),
            fields: Vec::new(),
            severity,
            time: String::new(),
        }
    }

    fn dropped(stats: &CanaryStats) -> u64 {
        stats.alerts_dropped.load(Ordering::Relaxed)
    }

    #[test]
    fn events_no_alert_hears_take_no_room_and_drops_count_deliveries() {
        let stats = Arc::new(CanaryStats::default());
        let (alerts, mut queue) = Alerts::channel(1, stats.clone());
        // Heard by nobody: not queued, so the one slot stays free.
        alerts.send(notice(Severity::Info));
        assert!(queue.try_recv().is_err());
        alerts.send(notice(Severity::Warn));
        assert_eq!(dropped(&stats), 0);
        // The queue is full: an error (heard by both alerts) drops two deliveries.
        alerts.send(notice(Severity::Error));
        assert_eq!(dropped(&stats), 2);
        assert_eq!(queue.try_recv().unwrap().notice.severity, Severity::Warn);
    }

    #[test]
    fn a_notice_older_than_a_minute_is_dropped_and_counted() {
        let stats = CanaryStats::default();
        let now = Instant::now();
        let queued = Queued {
            notice: notice(Severity::Error),
            at: now,
        };
        assert!(fresh(&queued, now + MAX_AGE, &stats));
        assert_eq!(dropped(&stats), 0);
        assert!(!fresh(
            &queued,
            now + MAX_AGE + Duration::from_secs(1),
            &stats
        ));
        assert_eq!(dropped(&stats), 2);
    }

    #[test]
    fn slacks_ok_false_is_a_refusal_with_its_error() {
        let refused = r#"{"ok": false, "error": "channel_not_found"}"#;
        assert_eq!(slack_refusal(refused).as_deref(), Some("channel_not_found"));
        assert_eq!(
            slack_refusal(r#"{"ok": false}"#).as_deref(),
            Some("no error given")
        );
        assert_eq!(slack_refusal(r#"{"ok": true, "ts": "1"}"#), None);
        assert_eq!(slack_refusal("ok"), None);
    }
}
