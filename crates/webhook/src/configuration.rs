//! `MutatingWebhookConfiguration dubbo-cp`, kept right by the control plane: created at start,
//! put back when it drifts (watched), its `caBundle` following the CA's roots. Two replicas
//! write it idempotently: only when it differs from what they want, with the resourceVersion
//! they read (a 409 means the other replica wrote; the next look finds it right).
//!
//! Selectors make injection opt-in: one webhook per label and per place the label may be (pod
//! or namespace), since a label selector cannot say "any of these labels"; `kube-system` and our
//! own namespace are never called for. A pod matching several webhooks is injected once,
//! because injection is idempotent.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::agent::AGENT_LABEL;
use super::inject::{CA_LABEL, REGISTRY_LABELS};
use super::xds::XDS_LABEL;
use crate::ca::Authority;

pub const NAME: &str = "dubbo-cp";
/// The reference's webhook name, kept for the pod-label CA webhook.
pub const FIRST_WEBHOOK: &str = "dubbo-cp.k8s.io";
const RETRY: Duration = Duration::from_secs(5);
const RESYNC: Duration = Duration::from_secs(300);
/// Shortest time between two writes, so two writers that want different objects (replicas of
/// different versions, a policy engine) do not fight at the API server's speed.
const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(2);
/// More writes than this within [`FIGHT_WINDOW`] means someone keeps undoing ours: back off.
const FIGHT_WRITES: usize = 5;
const FIGHT_WINDOW: Duration = Duration::from_secs(60);

/// Where the API server reaches the webhook.
#[derive(Debug, Clone)]
pub struct Target {
    /// `webhook.url` (development outside a cluster), else our Service.
    pub url: Option<String>,
    pub service: String,
    pub namespace: String,
    pub port: u16,
    /// How long the API server waits for each webhook (a pod may match several).
    pub timeout_seconds: u32,
}

#[derive(Default)]
pub struct ConfigurationStats {
    writes: Counter,
    failures: Counter,
}

impl ConfigurationStats {
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "webhook_configuration_writes",
            "MutatingWebhookConfiguration dubbo-cp created or repaired",
            self.writes.clone(),
        );
        registry.register(
            "webhook_configuration_failures",
            "Failed attempts to write MutatingWebhookConfiguration dubbo-cp",
            self.failures.clone(),
        );
    }
}

/// The configuration this control plane wants, with `ca_bundle` (PEM roots).
pub fn desired(target: &Target, ca_bundle: &str) -> Value {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_bundle);
    let client_config = match &target.url {
        Some(url) => {
            let base = url.trim_end_matches('/');
            let url = if base.ends_with("/mutating-services") {
                base.to_owned()
            } else {
                format!("{base}/mutating-services")
            };
            json!({"url": url, "caBundle": bundle})
        }
        None => json!({
            "service": {"name": target.service, "namespace": target.namespace,
                        "path": "/mutating-services", "port": target.port},
            "caBundle": bundle,
        }),
    };
    let never = json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                       "values": ["kube-system", target.namespace]});
    // The first eight as they always were; the xDS and agent labels after them.
    let labels = std::iter::once((CA_LABEL, "ca"))
        .chain(REGISTRY_LABELS.iter().map(|(label, registry)| {
            (
                *label,
                match registry.name() {
                    "kubernetes" => "k8s",
                    other => other,
                },
            )
        }))
        .chain([(XDS_LABEL, "xds"), (AGENT_LABEL, "agent")]);
    let mut webhooks = Vec::new();
    for (label, short) in labels {
        for place in ["pod", "namespace"] {
            let name = if label == CA_LABEL && place == "pod" {
                FIRST_WEBHOOK.to_owned()
            } else {
                format!("{short}-{place}.dubbo-cp.k8s.io")
            };
            let wanted = json!({"key": label, "operator": "In", "values": ["true"]});
            let (namespace_selector, object_selector) = if place == "pod" {
                (
                    json!({"matchExpressions": [never]}),
                    json!({"matchExpressions": [wanted]}),
                )
            } else {
                (json!({"matchExpressions": [never, wanted]}), json!({}))
            };
            webhooks.push(json!({
                "name": name,
                "clientConfig": client_config,
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "*"}],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": target.timeout_seconds,
                "namespaceSelector": namespace_selector,
                "objectSelector": object_selector,
            }));
        }
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/managed-by": "dubbo-cp"}},
        "webhooks": webhooks,
    })
}

/// Whether everything `want` says is in `have` (fields the API server adds are ignored).
pub fn holds(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(want), Value::Object(have)) => want
            .iter()
            .all(|(key, value)| have.get(key).is_some_and(|h| holds(value, h))),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| holds(w, h))
        }
        _ => want == have,
    }
}

/// One look: creates or repairs the configuration when it is not what we want.
async fn reconcile(
    api: &Api<MutatingWebhookConfiguration>,
    want: &Value,
) -> Result<bool, kube::Error> {
    let wanted: MutatingWebhookConfiguration =
        serde_json::from_value(want.clone()).map_err(kube::Error::SerdeError)?;
    match api.get_opt(NAME).await? {
        None => {
            api.create(&PostParams::default(), &wanted).await?;
            tracing::info!("created MutatingWebhookConfiguration {NAME}");
            Ok(true)
        }
        Some(existing) => {
            let have = serde_json::to_value(&existing).map_err(kube::Error::SerdeError)?;
            if holds(want, &have) {
                return Ok(false);
            }
            // Only what we own changes; labels, annotations and owners others set stay.
            let mut repaired = existing;
            repaired.webhooks = wanted.webhooks;
            repaired
                .metadata
                .labels
                .get_or_insert_with(Default::default)
                .extend(wanted.metadata.labels.unwrap_or_default());
            api.replace(NAME, &PostParams::default(), &repaired).await?;
            tracing::info!("MutatingWebhookConfiguration {NAME} had drifted; repaired it");
            Ok(true)
        }
    }
}

/// Keeps the configuration right until shutdown.
pub async fn run(
    client: Client,
    target: Target,
    authority: Authority,
    stats: std::sync::Arc<ConfigurationStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let mut events = Box::pin(
        watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={NAME}")),
        )
        .default_backoff(),
    );
    let mut roots = authority.subscribe();
    let mut wait = Duration::ZERO;
    let mut writes: std::collections::VecDeque<tokio::time::Instant> = Default::default();
    loop {
        tokio::select! {
            _ = crate::shutdown::signalled(&mut shutdown) => return,
            () = tokio::time::sleep(wait) => {}
            Some(_) = events.next() => {}
            Ok(()) = roots.changed() => {}
        }
        let Some(bundle) = authority.current() else {
            wait = RETRY;
            continue;
        };
        let now = tokio::time::Instant::now();
        while writes.front().is_some_and(|at| now - *at > FIGHT_WINDOW) {
            writes.pop_front();
        }
        if let Some(last) = writes.back()
            && now - *last < MIN_WRITE_INTERVAL
        {
            tokio::time::sleep_until(*last + MIN_WRITE_INTERVAL).await;
        }
        if writes.len() >= FIGHT_WRITES {
            tracing::warn!(
                writes = writes.len(),
                "MutatingWebhookConfiguration {NAME} keeps being changed by another writer; backing off"
            );
            tokio::time::sleep(FIGHT_WINDOW).await;
            writes.clear();
        }
        let want = desired(&target, &bundle.ca_crt());
        wait = match reconcile(&api, &want).await {
            Ok(wrote) => {
                if wrote {
                    stats.writes.inc();
                    writes.push_back(tokio::time::Instant::now());
                }
                RESYNC
            }
            Err(err) => {
                stats.failures.inc();
                tracing::warn!(error = %err, "cannot write MutatingWebhookConfiguration {NAME}; retrying");
                RETRY
            }
        };
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn target(url: Option<&str>) -> Target {
        Target {
            url: url.map(str::to_owned),
            service: "dubbo-cp".into(),
            namespace: "dubbo-system".into(),
            port: 30080,
            timeout_seconds: 6,
        }
    }

    #[test]
    fn opt_in_selectors_for_every_label_never_kube_system_or_our_namespace() {
        let want = desired(&target(None), "PEM");
        let webhooks = want["webhooks"].as_array().unwrap();
        assert_eq!(webhooks.len(), 12);
        assert_eq!(webhooks[0]["name"], FIRST_WEBHOOK);
        // Every label the injection reads, on the pod and on its namespace.
        for (index, label, name) in [
            (8, XDS_LABEL, "xds-pod.dubbo-cp.k8s.io"),
            (10, AGENT_LABEL, "agent-pod.dubbo-cp.k8s.io"),
        ] {
            let wanted = json!({"key": label, "operator": "In", "values": ["true"]});
            assert_eq!(webhooks[index]["name"], name);
            assert_eq!(
                webhooks[index]["objectSelector"]["matchExpressions"],
                json!([wanted])
            );
            assert_eq!(
                webhooks[index + 1]["name"],
                name.replace("-pod", "-namespace")
            );
            assert_eq!(
                webhooks[index + 1]["namespaceSelector"]["matchExpressions"][1],
                wanted
            );
        }
        for webhook in webhooks {
            assert_eq!(webhook["failurePolicy"], "Ignore");
            assert_eq!(webhook["sideEffects"], "None");
            assert_eq!(webhook["admissionReviewVersions"], json!(["v1"]));
            assert_eq!(webhook["rules"][0]["resources"], json!(["pods"]));
            assert_eq!(webhook["rules"][0]["operations"], json!(["CREATE"]));
            assert_eq!(
                webhook["namespaceSelector"]["matchExpressions"][0]["values"],
                json!(["kube-system", "dubbo-system"])
            );
            assert_eq!(webhook["clientConfig"]["service"]["port"], 30080);
            assert_eq!(webhook["clientConfig"]["caBundle"], "UEVN");
            // The typed object takes it whole.
        }
        let typed: MutatingWebhookConfiguration = serde_json::from_value(want.clone()).unwrap();
        assert!(holds(&want, &serde_json::to_value(&typed).unwrap()));
        for url in [
            "https://10.0.0.1:30080/",
            "https://10.0.0.1:30080/mutating-services",
        ] {
            let with_url = desired(&target(Some(url)), "PEM");
            assert_eq!(
                with_url["webhooks"][3]["clientConfig"],
                json!({"url": "https://10.0.0.1:30080/mutating-services", "caBundle": "UEVN"})
            );
        }
        assert_eq!(want["webhooks"][0]["timeoutSeconds"], 6);
    }

    #[test]
    fn holds_ignores_added_fields_but_not_changed_ones() {
        let want = json!({"a": [{"b": 1}], "c": "x"});
        assert!(holds(
            &want,
            &json!({"a": [{"b": 1, "extra": 2}], "c": "x", "status": {}})
        ));
        assert!(!holds(&want, &json!({"a": [{"b": 2}], "c": "x"})));
        assert!(!holds(&want, &json!({"a": [{"b": 1}, {"b": 1}], "c": "x"})));
        assert!(!holds(&want, &json!({"a": [{"b": 1}]})));
    }
}
