//! The steps of a run: start, analyse, promote, roll back, restore, idle.

use super::*;

impl Run<'_> {
    /// Decides and does the next step; the status is written by [`Run::finish`].
    pub(super) async fn step(&mut self) -> Result<Action, Error> {
        let Some(target) = self.deployment(&self.plan.target) else {
            let message = format!(
                "target deployment {}/{} not found",
                self.namespace, self.plan.target
            );
            self.condition("False", "TargetNotFound", &message);
            self.event(EventType::Warning, "TargetNotFound", message);
            return Ok(Action::requeue(self.plan.interval));
        };
        if let Some(problem) = selector_problem(&target, &self.plan.target) {
            self.condition("False", "InvalidTarget", &problem);
            self.event(EventType::Warning, "InvalidTarget", problem);
            return Ok(Action::requeue(self.plan.interval));
        }
        let primary = self.deployment(&primary_name(&self.plan.target));
        let hash = self.hash(&target);
        let phase = self.phase();

        // Initialisation: the primary takes over, the target idles at zero.
        let Some(primary) = primary else {
            if !self.status.last_promoted_spec.is_empty() {
                // Rebuilding it from the target would serve a template nobody analysed.
                let message = format!(
                    "deployment {} is gone; restore it, or delete and recreate the Canary to initialise again",
                    primary_name(&self.plan.target)
                );
                self.condition("False", "PrimaryMissing", &message);
                self.event(EventType::Warning, "PrimaryMissing", message);
                return Ok(Action::requeue(self.plan.interval));
            }
            if !self.copy_configs(&target.spec.template).await? {
                return Ok(Action::requeue(HALT_RETRY));
            }
            let object = primary_from(
                &target,
                &self.plan.target,
                &self.configs_hash(&target),
                self.canary,
            );
            self.api::<Deployment>()
                .create(&PostParams::default(), &object)
                .await?;
            self.wrote();
            self.set_phase(Phase::Initializing);
            self.event(
                EventType::Normal,
                "Initializing",
                format!(
                    "created deployment {} from {}; waiting for it to be ready",
                    primary_name(&self.plan.target),
                    self.plan.target
                ),
            );
            return Ok(Action::requeue(HALT_RETRY));
        };
        let autoscaler = self.sync_objects(&target, &primary).await?;
        if phase == Phase::Initializing {
            if let Some(reason) =
                not_ready_at(&primary, self.canary.spec.analysis.primary_ready_threshold)
            {
                self.event(
                    EventType::Normal,
                    "Halted",
                    format!("initialisation: {reason}"),
                );
                return Ok(Action::requeue(HALT_RETRY));
            }
            // The apex moves to the primary's pods before the target's go. The pod cache can
            // lag the Deployment's status: while the Deployment counts available pods the
            // cache does not show ready yet, it waits for them rather than list none.
            let available = primary
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0);
            let pods = self.ctx.pods.state();
            if self.canary.spec.service.is_some()
                && available > 0
                && ready_pod_ips(&primary, pods.iter().map(|p| p.as_ref())).is_empty()
            {
                let message = format!(
                    "initialisation: waiting for the pod cache to show a ready pod of {}",
                    primary_name(&self.plan.target)
                );
                self.event(EventType::Normal, "Halted", message);
                return Ok(Action::requeue(HALT_RETRY));
            }
            self.sync_services(&target, &primary, false).await?;
            self.scale(&self.plan.target.clone(), 0).await?;
            self.status.last_applied_spec = hash.clone();
            self.status.last_promoted_spec = hash.clone();
            self.record_revision(&target, &hash).await?;
            self.set_phase(Phase::Initialized);
            self.condition("True", "Initialized", "the primary serves all traffic");
            let kind = self.canary.spec.target_ref.kind.clone();
            self.alert(
                Severity::Info,
                format!("New {kind} detected, initialization completed."),
                true,
            );
            self.event(
                EventType::Normal,
                "Initialized",
                format!(
                    "initialization done: {} serves all traffic, {} scaled to zero",
                    primary_name(&self.plan.target),
                    self.plan.target
                ),
            );
            return Ok(Action::requeue(self.plan.interval));
        }

        // A new template starts a run, whatever the run in flight was doing.
        if hash != self.status.last_applied_spec && phase != Phase::Terminating {
            self.start_run(&target, &hash).await?;
            if self.canary.spec.skip_analysis {
                let why = "skipAnalysis is set: promoting without analysis".to_owned();
                return self.start_promotion(&target, &primary, why).await;
            }
            // Waiting is written before any gate is asked (a gate may take its whole timeout).
            self.sync_traffic(&target, &primary).await?;
            return Ok(Action::requeue(Duration::from_millis(10)));
        }

        // Every request is consumed whatever the phase, so none waits for a later run.
        let action = self.manual_action();
        if self.phase().analysing() {
            if let Some(action) = action {
                match action {
                    ManualAction::Abort => {
                        self.rollback("aborted by dubbo-cp canary abort", Severity::Warn)
                            .await;
                        return self.sync_traffic(&target, &primary).await;
                    }
                    ManualAction::Promote => {
                        let why = "promotion requested by dubbo-cp canary promote".to_owned();
                        return self.start_promotion(&target, &primary, why).await;
                    }
                }
            }
            if let Some(hook) = self.rollback_requested().await {
                self.rollback(
                    &format!("rollback hook {hook} answered 2xx"),
                    Severity::Warn,
                )
                .await;
                return self.sync_traffic(&target, &primary).await;
            }
        }

        match self.phase() {
            Phase::Initialized | Phase::Succeeded | Phase::Failed => {
                if self.phase() == Phase::Failed
                    && let Some(left) = self.draining()
                {
                    self.sync_traffic(&target, &primary).await?;
                    return Ok(Action::requeue(left));
                }
                self.idle(&target).await?;
                Ok(Action::requeue(self.plan.interval))
            }
            Phase::Waiting => {
                // Flagger alerts once, when the run starts waiting.
                let denied_before = self
                    .status
                    .hooks
                    .iter()
                    .any(|h| h.r#type == "confirm-rollout" && !h.ok);
                if !self.run_hooks("confirm-rollout").await {
                    if !denied_before && !self.muted("confirm-rollout") {
                        let text = "Canary is waiting for approval.".to_owned();
                        self.alert(Severity::Warn, text, false);
                    }
                    self.event(
                        EventType::Normal,
                        "Waiting",
                        "waiting for confirm-rollout hooks to approve the rollout".to_owned(),
                    );
                    self.sync_traffic(&target, &primary).await?;
                    return Ok(Action::requeue(self.plan.interval));
                }
                // With an autoscaler, its minimum (as Flagger's); its HPA scales it from there.
                let replicas = autoscaler.as_ref().map_or_else(
                    || primary.spec.replicas.unwrap_or(1).max(1),
                    crate::autoscaler::canary_replicas,
                );
                // The run's weights, written as it started to wait, hold the canary's pods at
                // 0 by their labels: they must reach every client before a pod can be listed
                // (one without a readiness probe is listed the moment it has an IP).
                if let Some(left) = self.hold_settling(&target) {
                    return Ok(Action::requeue(left));
                }
                self.scale(&self.plan.target.clone(), replicas).await?;
                self.set_phase(Phase::Progressing);
                self.status.last_analysis_time = now();
                // The chart starts at 0 %.
                self.record_step(Vec::new());
                let text = "New revision detected, progressing canary analysis.".to_owned();
                self.alert(Severity::Info, text, true);
                self.event(
                    EventType::Normal,
                    "Progressing",
                    format!(
                        "starting the analysis of {} (revision {}): canary scaled to {replicas}",
                        self.plan.target, self.status.current_revision
                    ),
                );
                self.sync_traffic(&target, &primary).await
            }
            Phase::Progressing | Phase::WaitingPromotion => self.analyse(&target, &primary).await,
            Phase::Promoting => self.promote(&target, &primary).await,
            Phase::Finalising => {
                if let Some(left) = self.draining() {
                    self.sync_traffic(&target, &primary).await?;
                    return Ok(Action::requeue(left));
                }
                self.scale(&self.plan.target.clone(), 0).await?;
                self.status.last_promoted_spec = self.status.last_applied_spec.clone();
                self.set_phase(Phase::Succeeded);
                self.condition("True", "Succeeded", "the canary was promoted");
                let text = if self.canary.spec.skip_analysis {
                    "Canary analysis was skipped, promotion finished."
                } else {
                    "Canary analysis completed successfully, promotion finished."
                };
                self.alert(Severity::Info, text.to_owned(), false);
                self.record_step(Vec::new());
                self.event(
                    EventType::Normal,
                    "Succeeded",
                    format!(
                        "promotion completed: {} runs revision {}",
                        primary_name(&self.plan.target),
                        self.status.current_revision
                    ),
                );
                self.run_hooks("post-rollout").await;
                self.idle(&target).await?;
                Ok(Action::requeue(self.plan.interval))
            }
            Phase::Initializing | Phase::Terminating => Ok(Action::requeue(HALT_RETRY)),
        }
    }

    /// A new template: record its revision, reset the run, wait for approval.
    pub(super) async fn start_run(&mut self, target: &Deployment, hash: &str) -> Result<(), Error> {
        self.status.last_applied_spec = hash.to_owned();
        self.status.canary_weight = 0;
        self.status.failed_checks = 0;
        self.status.iterations = 0;
        self.status.history.clear();
        self.status.hooks.clear();
        self.record_revision(target, hash).await?;
        // A run replacing one in flight: the canary's pods (old template, or old config read at
        // start) stop first; Waiting keeps them at weight 0 until they are gone, and approval
        // starts fresh pods.
        self.scale(&target.metadata.name.clone().unwrap_or_default(), 0)
            .await?;
        self.set_phase(Phase::Waiting);
        self.condition("False", "Progressing", "a new revision is under analysis");
        self.event(
            EventType::Normal,
            "NewRevision",
            format!(
                "new revision {} of {} detected; starting the canary analysis",
                self.status.current_revision, self.plan.target
            ),
        );
        Ok(())
    }

    /// One analysis iteration per interval; otherwise only the weights follow the pods.
    pub(super) async fn analyse(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
    ) -> Result<Action, Error> {
        let halted = not_ready_at(primary, self.canary.spec.analysis.primary_ready_threshold)
            .or_else(|| not_ready_at(target, self.canary.spec.analysis.canary_ready_threshold));
        if let Some(reason) = halted {
            let stalled = since(&self.status.last_transition_time).unwrap_or_default();
            if stalled > self.plan.deadline {
                self.rollback(
                    &format!(
                        "progress deadline exceeded ({}s without progress): {reason}",
                        self.plan.deadline.as_secs()
                    ),
                    Severity::Error,
                )
                .await;
                return self.sync_traffic(target, primary).await;
            }
            self.event(
                EventType::Normal,
                "Halted",
                format!("advancement halted: {reason}"),
            );
            self.sync_traffic(target, primary).await?;
            return Ok(Action::requeue(HALT_RETRY.min(self.plan.interval)));
        }
        let elapsed = since(&self.status.last_analysis_time).unwrap_or(self.plan.interval);
        if elapsed < self.plan.interval {
            self.sync_traffic(target, primary).await?;
            return Ok(Action::requeue(self.plan.interval - elapsed));
        }
        self.status.last_analysis_time = now();

        let mut failed = false;
        // pre-rollout hooks gate the first step: retried each iteration until they pass.
        if self.status.canary_weight == 0
            && !self.passed("pre-rollout")
            && !self.run_hooks("pre-rollout").await
        {
            failed = true;
        }
        if !self.run_hooks("rollout").await {
            failed = true;
        }
        // Metrics judge the calls the canary took: with none there is no data, and each
        // iteration would fail on that alone, so Flagger skips the analysis while no traffic
        // reaches the canary, and so do we: a weight-stepping canary at weight 0, and an A/B
        // run whose route is not in place (its iteration does not count either). Blue/Green
        // keeps weight 0 and is judged on its hooks' test traffic.
        let unrouted = self.plan.strategy == Strategy::ABTesting && self.stored_route().is_none();
        let untried = self.plan.strategy == Strategy::Canary && self.status.canary_weight == 0;
        let metrics = if untried || unrouted {
            Vec::new()
        } else {
            self.check_metrics().await
        };
        if metrics.iter().any(|m| !m.ok) {
            failed = true;
        }
        if unrouted && !failed {
            self.event(
                EventType::Normal,
                "Halted",
                "advancement halted: the A/B route is not in place yet".to_owned(),
            );
        }
        if !failed && !unrouted {
            self.status.iterations += 1;
        }
        if failed {
            self.status.failed_checks += 1;
            let message = metrics
                .iter()
                .filter(|m| !m.ok)
                .map(|m| m.message.clone())
                .chain(
                    self.status
                        .hooks
                        .iter()
                        .filter(|h| !h.ok && h.time == self.status.last_analysis_time)
                        .map(|h| format!("hook {} failed: {}", h.name, h.message)),
                )
                .collect::<Vec<_>>()
                .join("; ");
            self.event(
                EventType::Warning,
                "CheckFailed",
                format!(
                    "failed check {} of {} at weight {}: {message}",
                    self.status.failed_checks,
                    self.canary.spec.analysis.threshold,
                    self.status.canary_weight
                ),
            );
        }
        self.record_step(metrics);
        if self.status.failed_checks >= self.canary.spec.analysis.threshold {
            let message = format!(
                "canary failed {} checks (threshold {})",
                self.status.failed_checks, self.canary.spec.analysis.threshold
            );
            self.rollback(&message, Severity::Error).await;
            return self.sync_traffic(target, primary).await;
        }
        if failed {
            return self
                .sync_traffic(target, primary)
                .await
                .map(|_| self.requeue());
        }
        let promote = match self.plan.strategy {
            Strategy::Canary => self.advance_weight().await,
            Strategy::ABTesting | Strategy::BlueGreen => self.advance_iteration().await,
        };
        if promote {
            if self.run_hooks("confirm-promotion").await {
                let why = format!(
                    "copying {} template to {}",
                    self.plan.target,
                    primary_name(&self.plan.target)
                );
                return self.start_promotion(target, primary, why).await;
            }
            if self.phase() != Phase::WaitingPromotion && !self.muted("confirm-promotion") {
                let text = "Canary promotion is waiting for approval.".to_owned();
                self.alert(Severity::Warn, text, false);
            }
            self.set_phase(Phase::WaitingPromotion);
            self.event(
                EventType::Normal,
                "WaitingPromotion",
                "waiting for confirm-promotion hooks to approve the promotion".to_owned(),
            );
        }
        self.sync_traffic(target, primary).await?;
        Ok(self.requeue())
    }

    /// Canary: the next weight after a passed iteration, once `confirm-traffic-increase`
    /// hooks agree; `true` at `maxWeight` (time to promote).
    async fn advance_weight(&mut self) -> bool {
        let Some(next) = next_weight(self.canary, self.status.canary_weight) else {
            return true;
        };
        // No such hook: run_hooks answers true without a call.
        if !self.run_hooks("confirm-traffic-increase").await {
            self.traffic_increase_waits();
            self.event(
                EventType::Normal,
                "Waiting",
                format!("waiting for confirm-traffic-increase hooks before weight {next}"),
            );
            return false;
        }
        self.status.canary_weight = next;
        self.status.last_transition_time = now();
        if let Some(last) = self.status.history.last_mut() {
            last.weight = next;
        }
        self.event(
            EventType::Normal,
            "WeightIncreased",
            format!("advance {} canary weight {next}", self.plan.target),
        );
        false
    }

    /// A/B testing and Blue/Green, as Flagger runs them: `iterations` passed iterations (A/B:
    /// matching calls on the canary all along; Blue/Green: test traffic only), then Blue/Green
    /// sends every call to the canary (once `confirm-traffic-increase` hooks agree) for one more
    /// iteration; `true` when it is time to promote.
    async fn advance_iteration(&mut self) -> bool {
        let wanted = self.canary.spec.analysis.iterations.unwrap_or(1);
        let done = self.status.iterations;
        if done < wanted {
            self.status.last_transition_time = now();
            self.event(
                EventType::Normal,
                "IterationPassed",
                format!(
                    "advance {} canary iteration {done}/{wanted}",
                    self.plan.target
                ),
            );
            return false;
        }
        if self.plan.strategy == Strategy::BlueGreen && self.status.canary_weight < 100 {
            // The switch is a traffic increase like any: its hooks may hold it.
            if !self.run_hooks("confirm-traffic-increase").await {
                self.traffic_increase_waits();
                self.event(
                    EventType::Normal,
                    "Waiting",
                    "waiting for confirm-traffic-increase hooks before routing all traffic to the canary".to_owned(),
                );
                return false;
            }
            self.status.canary_weight = 100;
            self.status.last_transition_time = now();
            if let Some(last) = self.status.history.last_mut() {
                last.weight = 100;
            }
            self.event(
                EventType::Normal,
                "WeightIncreased",
                format!("routing all traffic to {} (Blue/Green)", self.plan.target),
            );
            return false;
        }
        true
    }

    /// A suspended Canary: traffic and the apex's endpoints follow the pods at the run's
    /// current weight; nothing else happens.
    pub(super) async fn hold_suspended(&mut self) -> Result<Action, Error> {
        tracing::debug!(canary = %self.name, namespace = %self.namespace, "suspended: holding");
        // Said once (the condition keeps its time while it holds); on resume it is removed and
        // a run's progress deadline starts again.
        self.set_condition(
            SUSPENDED,
            "True",
            "Suspended",
            "spec.suspend is true: no run starts or moves until it is cleared",
        );
        let target = self.deployment(&self.plan.target);
        let primary = self.deployment(&primary_name(&self.plan.target));
        if let (Some(target), Some(primary)) = (target, primary)
            && !self.status.last_promoted_spec.is_empty()
        {
            self.sync_objects(&target, &primary).await?;
            if self.phase().in_run() {
                self.sync_traffic(&target, &primary).await?;
            } else {
                // Idle, the target is not scaled down while suspended: any pod of it (a new
                // template applied meanwhile) is held at weight 0, as Flagger's apex would
                // never reach it.
                self.hold_target_at_zero(&target, true).await?;
            }
        }
        Ok(Action::requeue(self.plan.interval))
    }

    /// Flagger alerts every time the traffic increase is held.
    fn traffic_increase_waits(&mut self) {
        if self.muted("confirm-traffic-increase") {
            return;
        }
        let text = "Canary traffic increase is waiting for approval.".to_owned();
        self.alert(Severity::Warn, text, false);
    }

    /// Whether every `kind` gate that just refused has `muteAlert` (Flagger alerts unless the
    /// refusing webhook is muted; here several gates of a kind are asked at once).
    fn muted(&self, kind: &str) -> bool {
        let refused: Vec<&str> = self
            .status
            .hooks
            .iter()
            .filter(|h| h.r#type == kind && !h.ok)
            .map(|h| h.name.as_str())
            .collect();
        !refused.is_empty()
            && hooks::of_type(self.canary, kind)
                .filter(|hook| refused.contains(&hook.name.as_str()))
                .all(|hook| hook.mute_alert)
    }

    /// After a run, the canary pods keep weight 0 for one interval before they are scaled
    /// down, so callers move off them first: the time left, if any.
    pub(super) fn draining(&self) -> Option<Duration> {
        let elapsed = since(&self.status.last_transition_time).unwrap_or(self.plan.interval);
        (elapsed < self.plan.interval).then(|| self.plan.interval - elapsed)
    }

    pub(super) fn requeue(&self) -> Action {
        Action::requeue(self.plan.interval)
    }

    pub(super) async fn start_promotion(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
        why: String,
    ) -> Result<Action, Error> {
        self.event(EventType::Normal, "Promoting", why);
        self.set_phase(Phase::Promoting);
        self.promote(target, primary).await
    }

    /// Copies the canary's template to the primary, then waits for its rolling update.
    pub(super) async fn promote(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
    ) -> Result<Action, Error> {
        let wanted = primary_template(target, &self.plan.target, &self.configs_hash(target));
        let current = primary.spec.template.clone();
        if current != wanted {
            if !self.copy_configs(&target.spec.template).await? {
                let stalled = since(&self.status.last_transition_time).unwrap_or_default();
                if stalled > self.plan.deadline {
                    self.rollback(
                        "promotion could not copy the configs the target uses",
                        Severity::Error,
                    )
                    .await;
                    self.sync_traffic(target, primary).await?;
                }
                return Ok(Action::requeue(HALT_RETRY));
            }
            let mut updated = primary.clone();
            updated.spec.template = wanted;
            updated.status = None;
            self.api::<Deployment>()
                .replace(
                    &primary_name(&self.plan.target),
                    &PostParams::default(),
                    &updated,
                )
                .await?;
            self.wrote();
            self.sync_traffic(target, primary).await?;
            return Ok(Action::requeue(HALT_RETRY));
        }
        if let Some(reason) =
            not_ready_at(primary, self.canary.spec.analysis.primary_ready_threshold)
        {
            let stalled = since(&self.status.last_transition_time).unwrap_or_default();
            if stalled > self.plan.deadline {
                self.rollback(
                    &format!("promotion did not finish: {reason}"),
                    Severity::Error,
                )
                .await;
            } else {
                self.event(EventType::Normal, "Halted", format!("promotion: {reason}"));
            }
            self.sync_traffic(target, primary).await?;
            return Ok(Action::requeue(HALT_RETRY.min(self.plan.interval)));
        }
        // Flagger's stepWeightPromotion: the calls go back to the primary (now the new
        // template) a step per interval, so it warms up under a growing share.
        let step = self.canary.spec.analysis.step_weight_promotion.unwrap_or(0);
        if self.plan.strategy != Strategy::ABTesting && step > 0 && self.status.canary_weight > step
        {
            let elapsed = since(&self.status.last_analysis_time).unwrap_or(self.plan.interval);
            if elapsed < self.plan.interval {
                self.sync_traffic(target, primary).await?;
                return Ok(Action::requeue(self.plan.interval - elapsed));
            }
            self.status.last_analysis_time = now();
            // Progress, as a weight step is: the deadline counts from here.
            self.status.last_transition_time = now();
            self.status.canary_weight -= step;
            self.record_step(Vec::new());
            self.event(
                EventType::Normal,
                "WeightDecreased",
                format!(
                    "promotion: canary weight {}%, the rest on {}",
                    self.status.canary_weight,
                    primary_name(&self.plan.target)
                ),
            );
            self.sync_traffic(target, primary).await?;
            return Ok(Action::requeue(self.plan.interval));
        }
        // The primary runs the new template: traffic goes back to it before the canary stops.
        self.status.canary_weight = 0;
        self.set_phase(Phase::Finalising);
        self.record_step(Vec::new());
        self.sync_traffic(target, primary).await?;
        Ok(self.requeue())
    }

    /// Weight 0, phase Failed; the idle phase then scales the canary down. A rollback during
    /// promotion also puts the last promoted template back on the primary.
    pub(super) async fn rollback(&mut self, reason: &str, severity: Severity) {
        if self.phase() == Phase::Promoting
            && let Err(error) = self.restore_primary().await
        {
            self.event(
                EventType::Warning,
                "RestoreFailed",
                clip(&format!(
                    "cannot put revision {} back on {}: {error}",
                    self.status.last_promoted_spec,
                    primary_name(&self.plan.target)
                )),
            );
        }
        self.status.canary_weight = 0;
        self.set_phase(Phase::Failed);
        self.condition("False", "Failed", reason);
        self.record_step(Vec::new());
        self.event(
            EventType::Warning,
            "RolledBack",
            format!("rolling back {}: {reason}", self.plan.target),
        );
        self.alert(
            severity,
            format!("Rolling back {}: {reason}", self.plan.target),
            false,
        );
        self.run_hooks("post-rollout").await;
    }

    /// The spec turned invalid mid-run: weights to 0 (the stored override, rewritten), the
    /// canary scaled to zero, phase Failed.
    pub(super) async fn stop_run_in_flight(&mut self, reason: &str) -> Result<(), Error> {
        self.write_zero_weights().await?;
        self.scale(&self.plan.target.clone(), 0).await?;
        self.status.canary_weight = 0;
        self.set_phase(Phase::Failed);
        self.condition("False", "InvalidSpec", reason);
        let message = clip(&format!(
            "rolling back {}: the spec is invalid: {reason}",
            self.plan.target
        ));
        self.event(EventType::Warning, "RolledBack", message.clone());
        self.alert(Severity::Error, message, false);
        Ok(())
    }

    /// The canary's pods at weight 0 (the primary's at their default: whatever a Blue/Green
    /// switch had set), without session affinity, and no A/B route: what a run stopped by an
    /// invalid spec leaves. The plan is not valid: the application is read from the spec as
    /// the plan would.
    pub(super) async fn write_zero_weights(&mut self) -> Result<(), Error> {
        let application = self
            .canary
            .spec
            .application
            .clone()
            .unwrap_or_else(|| self.plan.target.clone());
        let pods = self.ctx.pods.state();
        let canary_ips = self
            .deployment(&self.plan.target)
            .map(|target| ready_pod_ips(&target, pods.iter().map(|p| p.as_ref())))
            .unwrap_or_default();
        self.write_config(weight::dynamic_config(
            &application,
            0,
            &[],
            &canary_ips,
            None,
        ))
        .await?;
        self.write_route(None).await
    }

    /// Sets the primary's template back to the last promoted revision's.
    pub(super) async fn restore_primary(&mut self) -> Result<(), Error> {
        let revision_name = format!("{}-{}", self.name, self.status.last_promoted_spec);
        let revision = self
            .api::<ControllerRevision>()
            .get_opt(&revision_name)
            .await?
            .ok_or_else(|| Error::Invalid(format!("revision {revision_name} not found")))?;
        let template = crate::ops::template_of(&revision)
            .ok_or_else(|| Error::Invalid(format!("revision {revision_name} holds no template")))?;
        let deployments = self.api::<Deployment>();
        let Some(mut primary) = deployments
            .get_opt(&primary_name(&self.plan.target))
            .await?
        else {
            return Ok(());
        };
        let mut recorded = primary.clone();
        recorded.spec.template = template;
        // The revision holds the target's form; the primary runs it suffixed, on its copies.
        let wanted = primary_template(&recorded, &self.plan.target, "");
        if primary.spec.template != wanted {
            primary.spec.template = wanted;
            primary.status = None;
            deployments
                .replace(
                    &primary_name(&self.plan.target),
                    &PostParams::default(),
                    &primary,
                )
                .await?;
            self.wrote();
        }
        Ok(())
    }

    /// Idle: the canary at zero, no weights and no route.
    pub(super) async fn idle(&mut self, target: &Deployment) -> Result<(), Error> {
        let replicas = target.spec.replicas.unwrap_or(1);
        if replicas != 0 && self.status.last_applied_spec == self.hash(target) {
            self.scale(&self.plan.target.clone(), 0).await?;
        }
        // After a run the canary's pods keep weight 0 until they are gone: their endpoints
        // leave after the pods do, and without the override one still listed would take the
        // default weight (measured on the real API server: 5 % of calls on a rolled-back
        // canary). Before any run there is nothing to keep: zeroing the target's pods then
        // could leave no weighted endpoint while the primary's are not listed yet.
        let after_a_run = self.stored_config_is_ours();
        self.hold_target_at_zero(target, after_a_run).await
    }

    /// No run's route; the target's pods (any with an IP) at weight 0 when `hold`, else no
    /// weights at all.
    async fn hold_target_at_zero(&mut self, target: &Deployment, hold: bool) -> Result<(), Error> {
        let zero = if hold {
            let pods = self.ctx.pods.state();
            let remaining = any_pod_ips(target, pods.iter().map(|p| p.as_ref()));
            weight::dynamic_config(&self.plan.application, 0, &[], &remaining, None)
        } else {
            None
        };
        self.write_config(zero).await?;
        self.write_route(None).await
    }
}
