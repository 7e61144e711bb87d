//! Delivers a Canary's alerts off the reconcile path: a bounded queue, a few deliveries at once,
//! each with a deadline. A full queue drops the alert (counted), a failed delivery is logged and
//! counted; neither touches the run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

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

/// One event to alert on.
pub struct Notice {
    /// The Canary with the status the run wrote.
    pub canary: Canary,
    pub text: String,
    pub fields: Vec<Field>,
    pub severity: Severity,
    pub time: String,
}

/// The sending side; cloned into the controller's context. The worker stops when every sender
/// is dropped (the controller with it).
#[derive(Clone)]
pub struct Alerts {
    queue: mpsc::Sender<Notice>,
    stats: Arc<CanaryStats>,
}

impl Alerts {
    /// Starts the worker on the current runtime.
    pub fn start(client: kube::Client, http: HttpClient, stats: Arc<CanaryStats>) -> Alerts {
        let (queue, mut notices) = mpsc::channel::<Notice>(QUEUE);
        let worker = Worker {
            client,
            http,
            stats: stats.clone(),
        };
        tokio::spawn(async move {
            let worker = Arc::new(worker);
            let slots = Arc::new(Semaphore::new(PARALLEL));
            while let Some(notice) = notices.recv().await {
                let notice = Arc::new(notice);
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
        Alerts { queue, stats }
    }

    /// Queues `notice` if its Canary has alerts; never waits.
    pub fn send(&self, notice: Notice) {
        if notice.canary.spec.analysis.alerts.is_empty() {
            return;
        }
        if let Err(error) = self.queue.try_send(notice) {
            let (mpsc::error::TrySendError::Full(notice)
            | mpsc::error::TrySendError::Closed(notice)) = error;
            self.stats.alerts_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                canary = %notice.canary.name_any(),
                namespace = notice.canary.namespace().unwrap_or_default(),
                message = %notice.text,
                "alert dropped: {QUEUE} alerts are already waiting for slow receivers"
            );
        }
    }
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

impl Worker {
    /// Sends `notice` to `alert`'s provider; logs and counts the outcome.
    async fn deliver(&self, alert: &CanaryAlert, notice: &Notice) {
        let canary = &notice.canary;
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
        let authorization = target
            .token
            .filter(|_| spec.r#type == "slack")
            .map(|token| format!("Bearer {token}"));
        let via = Via {
            authorization: authorization.as_deref(),
            insecure: spec.insecure_skip_verify,
            proxy: spec.proxy.as_deref(),
        };
        let failed = match self
            .http
            .post_json_via(&url, &body, via, POST_TIMEOUT)
            .await
        {
            Ok(answer) if (200..300).contains(&answer.status) => return Ok(r#type),
            Ok(answer) => format!(
                "{url}: HTTP {}: {}",
                answer.status,
                answer.body.trim().chars().take(200).collect::<String>()
            ),
            Err(error) => error.to_string(),
        };
        // An address kept in a Secret (a Slack hook URL is a credential) and a proxy's
        // password are not logged.
        let mut failed = match &spec.secret_ref {
            Some(secret) => failed.replace(&url, &format!("<address of secret {}>", secret.name)),
            None => failed,
        };
        if let Some(proxy) = &spec.proxy {
            failed = failed.replace(proxy, &crate::http::without_credentials(proxy));
        }
        Err((r#type, failed))
    }

    /// Reads the provider `alert` names and, if it has one, its Secret.
    async fn target(&self, alert: &CanaryAlert, canary: &Canary) -> Result<Target, String> {
        let namespace = alert
            .provider_ref
            .namespace
            .clone()
            .or_else(|| canary.namespace())
            .unwrap_or_default();
        let name = &alert.provider_ref.name;
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
