//! What a run checks: webhooks, metrics, manual actions; and how a run finishes.

use super::*;
use crate::prometheus::Endpoint;
use crate::template::{Credentials, MetricTemplate, TemplateRef};

impl Run<'_> {
    /// Calls every hook of `kind`, records each answer; true when all succeeded (or none exist).
    pub(super) async fn run_hooks(&mut self, kind: &str) -> bool {
        let body = hooks::payload(self.canary, &self.status, &BTreeMap::new());
        let mut all = true;
        let called: Vec<_> = hooks::of_type(self.canary, kind).cloned().collect();
        for hook in called {
            let mut body = body.clone();
            body["metadata"] = json!(hook.metadata);
            let outcome = hooks::call(&self.ctx.http, &hook, &body).await;
            all &= outcome.ok;
            if !outcome.ok && kind != "rollback" {
                self.event(
                    EventType::Warning,
                    "HookFailed",
                    format!("{kind} hook {} failed: {}", hook.name, outcome.message),
                );
            }
            self.status.hooks.retain(|h| h.name != hook.name);
            self.status.hooks.push(HookResult {
                name: hook.name.clone(),
                r#type: kind.to_owned(),
                ok: outcome.ok,
                message: clip(&outcome.message),
                time: self.status.last_analysis_time.clone(),
            });
        }
        all
    }

    /// The first `rollback` hook that answers 2xx, if any.
    pub(super) async fn rollback_requested(&mut self) -> Option<String> {
        let body = hooks::payload(self.canary, &self.status, &BTreeMap::new());
        for hook in hooks::of_type(self.canary, "rollback") {
            let mut body = body.clone();
            body["metadata"] = json!(hook.metadata);
            // One attempt per reconcile: this is a poll, not a call that must get through.
            let once = crate::crd::Webhook {
                retries: 0,
                ..hook.clone()
            };
            if hooks::call(&self.ctx.http, &once, &body).await.ok {
                return Some(hook.name.clone());
            }
        }
        None
    }

    pub(super) async fn check_metrics(&mut self) -> Vec<MetricResult> {
        let checks = self.canary.spec.analysis.metrics.clone();
        if checks.is_empty() {
            return Vec::new();
        }
        let address = self
            .canary
            .spec
            .prometheus
            .as_ref()
            .map(|p| p.address.clone())
            .or_else(|| self.ctx.settings.prometheus.clone());
        let mut results = Vec::with_capacity(checks.len());
        for check in &checks {
            let failed = |message: String| MetricResult {
                name: check.name.clone(),
                value: None,
                min: check.threshold_range.min,
                max: check.threshold_range.max,
                ok: false,
                message: clip(&message),
            };
            let (endpoint, template_query) = match &check.template_ref {
                Some(reference) => match self.template(reference, address.as_deref()).await {
                    Ok((endpoint, query)) => (endpoint, Some(query)),
                    Err(message) => {
                        results.push(failed(format!("{}: {message}", check.name)));
                        continue;
                    }
                },
                None => match &address {
                    Some(address) => (Endpoint::plain(address), None),
                    None => {
                        results.push(failed(
                            "no Prometheus: set spec.prometheus.address or the server's canary.prometheus"
                                .to_owned(),
                        ));
                        continue;
                    }
                },
            };
            let interval = check
                .interval
                .clone()
                .unwrap_or_else(|| self.canary.spec.analysis.interval.clone());
            let values = Placeholders {
                namespace: &self.namespace,
                target: &self.plan.target,
                application: &self.plan.application,
                interval: &interval,
                variables: &check.template_variables,
            };
            let mut result = self
                .ctx
                .prometheus
                .check(
                    &endpoint,
                    check,
                    template_query.as_deref(),
                    &values,
                    self.ctx.settings.query_timeout,
                )
                .await;
            result.message = clip(&result.message);
            results.push(result);
        }
        results
    }

    /// The MetricTemplate `reference` names: where its query runs (its provider's address, else
    /// `fallback`; its Secret's credentials) and the query; or why it cannot run.
    async fn template(
        &self,
        reference: &TemplateRef,
        fallback: Option<&str>,
    ) -> Result<(Endpoint, String), String> {
        let namespace = reference.namespace.as_deref().unwrap_or(&self.namespace);
        let api: Api<MetricTemplate> = Api::namespaced(self.ctx.client.clone(), namespace);
        let template = api
            .get_opt(&reference.name)
            .await
            .map_err(|e| {
                format!(
                    "cannot read MetricTemplate {namespace}/{}: {e}",
                    reference.name
                )
            })?
            .ok_or_else(|| format!("MetricTemplate {namespace}/{} not found", reference.name))?;
        let provider = &template.spec.provider;
        let address = provider.address.clone().or_else(|| fallback.map(str::to_owned)).ok_or_else(|| {
            format!(
                "MetricTemplate {namespace}/{} names no address, and neither the Canary nor the server names a Prometheus",
                reference.name
            )
        })?;
        let credentials = match &provider.secret_ref {
            Some(secret) => {
                let secrets: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
                let found = secrets
                    .get_opt(&secret.name)
                    .await
                    .map_err(|e| format!("cannot read secret {namespace}/{}: {e}", secret.name))?
                    .ok_or_else(|| format!("secret {namespace}/{} not found", secret.name))?;
                let data: BTreeMap<String, Vec<u8>> = found
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, value)| (key, value.0))
                    .collect();
                Some(Credentials::from_secret(
                    &format!("{namespace}/{}", secret.name),
                    &data,
                )?)
            }
            None => None,
        };
        Ok((
            Endpoint {
                address,
                credentials,
                insecure: provider.insecure_skip_verify,
            },
            template.spec.query.clone(),
        ))
    }

    /// A `promote:<revision>:<id>` or `abort:<revision>:<id>` request not handled yet, for the
    /// run of that revision while it is analysed; any other is consumed with an Event.
    pub(super) fn manual_action(&mut self) -> Option<ManualAction> {
        let value = self.canary.annotations().get(ACTION_ANNOTATION)?.clone();
        if value == self.status.handled_action {
            return None;
        }
        self.status.handled_action = value.clone();
        let mut parts = value.splitn(3, ':');
        let (verb, revision) = (parts.next(), parts.next());
        let action = match verb {
            Some("promote") => ManualAction::Promote,
            Some("abort") => ManualAction::Abort,
            _ => {
                self.event(
                    EventType::Warning,
                    "InvalidAction",
                    clip(&format!("annotation {ACTION_ANNOTATION}={value:?}: expected promote:<revision>:<id> or abort:<revision>:<id>")),
                );
                return None;
            }
        };
        if revision != Some(self.status.current_revision.as_str()) || !self.phase().analysing() {
            self.event(
                EventType::Warning,
                "ActionIgnored",
                clip(&format!(
                    "{value:?} ignored: it names revision {:?}, the run is {} of {}",
                    revision.unwrap_or_default(),
                    self.status.phase,
                    self.status.current_revision
                )),
            );
            return None;
        }
        Some(action)
    }

    /// Writes the status if it changed, updates the metrics, emits the events (and `event`
    /// hooks) in order.
    pub(super) async fn finish(&mut self) -> Result<(), Error> {
        let labels = CanaryLabels {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        };
        let stats = &self.ctx.stats;
        stats
            .weight
            .get_or_create(&labels)
            .set(i64::from(self.status.canary_weight));
        stats
            .status
            .get_or_create(&labels)
            .set(self.phase().metric());
        // Events first: what they tell happened even if the status write below loses a race.
        let events = std::mem::take(&mut self.events);
        for (kind, reason, note) in events {
            emit(self.ctx, self.canary, &self.status, kind, reason, &note).await;
        }
        if self.canary.status.as_ref() != Some(&self.status) {
            let mut object = self.canary.clone();
            object.status = Some(self.status.clone());
            let written = self
                .api::<Canary>()
                .replace_status(&self.name, &PostParams::default(), &object)
                .await?;
            self.wrote();
            if let (Some(uid), Some(before), Some(after)) = (
                self.canary.uid(),
                self.canary.resource_version(),
                written.resource_version(),
            ) {
                self.ctx.written.insert(uid, (before, after));
            }
        }
        // After the write: a step redone because the write lost a race alerts once.
        let alerts = std::mem::take(&mut self.alerts);
        if !alerts.is_empty() && !self.canary.spec.analysis.alerts.is_empty() {
            let mut canary = self.canary.clone();
            canary.status = Some(self.status.clone());
            for (severity, text, described) in alerts {
                let fields = if described {
                    crate::messages::metadata_fields(self.canary)
                } else {
                    Vec::new()
                };
                self.ctx.alerts.send(crate::notifier::Notice {
                    canary: canary.clone(),
                    text,
                    fields,
                    severity,
                    time: now(),
                });
            }
        }
        Ok(())
    }
}
