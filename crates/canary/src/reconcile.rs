//! One reconcile of one Canary: read the Deployments and pods from the shared stores, decide the
//! next step of rollout.md's loop, write only what differs, record the step in status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodTemplateSpec, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::configs::{ConfigKind, references};
use super::crd::{Canary, CanaryCondition, CanaryStatus, HookResult, MetricResult, Step};
use super::deployments::{
    not_ready, primary_from, primary_name, primary_template, ready_pod_ips, spec_hash,
    target_template,
};
use super::events::{Events, Kind as EventType};
use super::hooks;
use super::http::HttpClient;
use super::prometheus::{Placeholders, Prometheus};
use super::stats::{CanaryLabels, CanaryStats};
use super::weight;
use crate::rules::{DynamicConfig, DynamicConfigSpec};

/// Annotation `dubbo-cp canary promote|abort` sets: `promote:<nonce>` or `abort:<nonce>`.
pub const ACTION_ANNOTATION: &str = "dubbo.apache.org/canary-action";
/// Label of the ControllerRevisions of a Canary.
pub const REVISION_LABEL: &str = "dubbo.apache.org/canary";
pub const FINALIZER: &str = "canaries.dubbo.apache.org/restore";
/// Weight history kept in status (the dashboard's chart, `canary status`).
const HISTORY: usize = 60;
/// A halted run looks again this soon (a Deployment change wakes it sooner).
const HALT_RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Initializing,
    Initialized,
    Waiting,
    Progressing,
    WaitingPromotion,
    Promoting,
    Finalising,
    Succeeded,
    Failed,
    Terminating,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Initializing => "Initializing",
            Phase::Initialized => "Initialized",
            Phase::Waiting => "Waiting",
            Phase::Progressing => "Progressing",
            Phase::WaitingPromotion => "WaitingPromotion",
            Phase::Promoting => "Promoting",
            Phase::Finalising => "Finalising",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Terminating => "Terminating",
        }
    }

    pub fn parse(phase: &str) -> Phase {
        match phase {
            "Initialized" => Phase::Initialized,
            "Waiting" => Phase::Waiting,
            "Progressing" => Phase::Progressing,
            "WaitingPromotion" => Phase::WaitingPromotion,
            "Promoting" => Phase::Promoting,
            "Finalising" => Phase::Finalising,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            "Terminating" => Phase::Terminating,
            _ => Phase::Initializing,
        }
    }

    /// `dubbo_cp_canary_status`: Flagger's 0 running, 1 succeeded, 2 failed.
    pub fn metric(self) -> i64 {
        match self {
            Phase::Initialized | Phase::Succeeded => 1,
            Phase::Failed => 2,
            _ => 0,
        }
    }

    /// Phases in which the canary takes traffic and `rollback` hooks are polled.
    fn analysing(self) -> bool {
        matches!(
            self,
            Phase::Waiting | Phase::Progressing | Phase::WaitingPromotion
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Invalid(String),
    /// Nothing wrong: a step waits for the cluster (retried shortly).
    #[error("{0}")]
    Waiting(String),
}

/// Settings of the controller (config `canary.*`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// The Prometheus of Canaries that name none.
    pub prometheus: Option<String>,
    pub query_timeout: Duration,
}

/// What every reconcile shares: the client, the stores the watches keep, the outside clients.
pub struct Context {
    pub client: kube::Client,
    pub deployments: Store<Deployment>,
    pub pods: Store<Pod>,
    pub configs: Store<DynamicConfig>,
    /// Versions (metadata only: no Secret data is held) of the ConfigMaps and Secrets.
    pub config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub secrets: Store<PartialObjectMeta<Secret>>,
    pub events: Events,
    pub prometheus: Prometheus,
    pub http: HttpClient,
    pub settings: Settings,
    pub stats: Arc<CanaryStats>,
    /// Per Canary (uid): the resourceVersion this controller last wrote status over, and the
    /// one it got back. One entry per Canary, removed when it is deleted.
    pub written: dashmap::DashMap<String, (String, String)>,
}

/// The Canary's spec, checked: durations parsed, defaults applied.
#[derive(Debug)]
struct Plan {
    interval: Duration,
    deadline: Duration,
    application: String,
    target: String,
}

fn plan(canary: &Canary) -> Result<Plan, String> {
    let spec = &canary.spec;
    let interval = humantime::parse_duration(&spec.analysis.interval)
        .map_err(|e| format!("spec.analysis.interval {:?}: {e}", spec.analysis.interval))?;
    if interval.is_zero() {
        return Err("spec.analysis.interval must be positive".to_owned());
    }
    if spec.analysis.step_weight.is_none() && spec.analysis.step_weights.is_empty() {
        return Err("spec.analysis: set stepWeight or stepWeights".to_owned());
    }
    if spec.target_ref.kind != "Deployment" {
        return Err(format!(
            "spec.targetRef.kind {:?}: only Deployment is supported",
            spec.target_ref.kind
        ));
    }
    for metric in &spec.analysis.metrics {
        super::prometheus::query_of(metric)
            .map_err(|e| format!("spec.analysis.metrics[{}]: {e}", metric.name))?;
    }
    Ok(Plan {
        interval,
        deadline: Duration::from_secs(u64::from(spec.progress_deadline_seconds)),
        application: spec
            .application
            .clone()
            .unwrap_or_else(|| spec.target_ref.name.clone()),
        target: spec.target_ref.name.clone(),
    })
}

/// The weight after `current`: the next `stepWeights` entry, or `current + stepWeight`, capped at
/// `maxWeight`. `None` at the top.
pub fn next_weight(canary: &Canary, current: u32) -> Option<u32> {
    let analysis = &canary.spec.analysis;
    let max = analysis.max_weight.min(100);
    let next = if analysis.step_weights.is_empty() {
        current.saturating_add(analysis.step_weight.unwrap_or(max.max(1)))
    } else {
        analysis
            .step_weights
            .iter()
            .copied()
            .find(|w| *w > current)?
    };
    (current < max).then_some(next.min(max))
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn since(time: &str) -> Option<Duration> {
    let then = humantime::parse_rfc3339(time).ok()?;
    SystemTime::now().duration_since(then).ok()
}

/// Why the primary could not be told apart from the target, if so: its selector is the
/// target's with the `-primary` suffix on labels whose value is the target's name, so one such
/// label is needed, and `matchExpressions` cannot be rewritten.
fn selector_problem(target: &Deployment, name: &str) -> Option<String> {
    let selector = &target.spec.selector;
    if selector
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Some(format!(
            "deployment {name}: selector.matchExpressions is not supported; select with matchLabels"
        ));
    }
    let labels = selector.match_labels.clone().unwrap_or_default();
    if !labels.values().any(|v| v == name) {
        return Some(format!(
            "deployment {name}: no selector label has the value {name:?} (e.g. app: {name}), so the primary's pods could not be told apart from the canary's"
        ));
    }
    None
}

/// At most this many bytes of an outside answer or message are kept (status, Events).
const MESSAGE_BYTES: usize = 300;

/// `text` cut to [`MESSAGE_BYTES`] on a character boundary.
pub fn clip(text: &str) -> String {
    clip_to(text, MESSAGE_BYTES)
}

/// `text` cut to `bytes` on a character boundary, marked with an ellipsis.
pub fn clip_to(text: &str, bytes: usize) -> String {
    if text.len() <= bytes {
        return text.to_owned();
    }
    let mut end = bytes.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// One reconcile's working state: the status it will write and the events it will emit.
struct Run<'a> {
    canary: &'a Canary,
    ctx: &'a Context,
    plan: Plan,
    status: CanaryStatus,
    events: Vec<(EventType, &'static str, String)>,
    namespace: String,
    name: String,
}

pub async fn reconcile(canary: Arc<Canary>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    ctx.stats
        .reconciles
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let namespace = canary.namespace().unwrap_or_default();
    let api: Api<Canary> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = kube::runtime::finalizer(&api, FINALIZER, canary, |event| async {
        match event {
            kube::runtime::finalizer::Event::Apply(canary) => apply(&canary, &ctx).await,
            kube::runtime::finalizer::Event::Cleanup(canary) => cleanup(&canary, &ctx).await,
        }
    })
    .await;
    ctx.stats.duration.observe(started.elapsed().as_secs_f64());
    result.map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e)
        | kube::runtime::finalizer::Error::RemoveFinalizer(e) => Error::Kube(e),
        other => Error::Invalid(other.to_string()),
    })
}

pub fn error_policy(canary: Arc<Canary>, error: &Error, _ctx: Arc<Context>) -> Action {
    if let Error::Waiting(message) = error {
        tracing::debug!(%message, "canary waits");
        return Action::requeue(Duration::from_secs(2));
    }
    tracing::warn!(
        canary = %canary.name_any(),
        namespace = canary.namespace().unwrap_or_default(),
        %error,
        "canary reconcile failed; retrying"
    );
    Action::requeue(Duration::from_secs(5))
}

async fn apply(canary: &Canary, ctx: &Context) -> Result<Action, Error> {
    // Reads come from the watches' stores: wait for their first lists (the watches run with
    // the controller, so this resolves as soon as they have listed).
    let _ = ctx.deployments.wait_until_ready().await;
    let _ = ctx.pods.wait_until_ready().await;
    let _ = ctx.configs.wait_until_ready().await;
    let _ = ctx.config_maps.wait_until_ready().await;
    let _ = ctx.secrets.wait_until_ready().await;
    // The controller hands over its cached object, which may predate this controller's own
    // last status write: acting on it would repeat or undo a step. Wait for the watch.
    if let (Some(uid), Some(version)) = (canary.uid(), canary.resource_version())
        && ctx
            .written
            .get(&uid)
            .is_some_and(|entry| entry.0 == version)
    {
        return Ok(Action::requeue(Duration::from_millis(50)));
    }
    let namespace = canary.namespace().unwrap_or_default();
    let name = canary.name_any();
    let status = canary.status.clone().unwrap_or_default();
    let plan = match plan(canary) {
        Ok(plan) => plan,
        Err(message) => {
            let mut run = Run {
                canary,
                ctx,
                plan: Plan {
                    interval: Duration::from_secs(60),
                    deadline: Duration::from_secs(600),
                    application: String::new(),
                    target: canary.spec.target_ref.name.clone(),
                },
                status,
                events: Vec::new(),
                namespace,
                name,
            };
            run.condition("False", "InvalidSpec", &message);
            run.event(EventType::Warning, "InvalidSpec", clip(&message));
            if run.phase().analysing() || run.phase() == Phase::Promoting {
                // A run in flight cannot go on without a valid spec: its pods get weight 0 and
                // stop, and it counts as failed.
                run.stop_run_in_flight(&message).await?;
            }
            run.finish().await?;
            // A spec change wakes it; nothing else can fix the spec.
            return Ok(Action::await_change());
        }
    };
    let mut run = Run {
        canary,
        ctx,
        plan,
        status,
        events: Vec::new(),
        namespace,
        name,
    };
    let action = run.step().await;
    run.finish().await?;
    action
}

impl Run<'_> {
    fn deployment(&self, name: &str) -> Option<Arc<Deployment>> {
        self.ctx
            .deployments
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    fn phase(&self) -> Phase {
        Phase::parse(&self.status.phase)
    }

    fn set_phase(&mut self, phase: Phase) {
        if self.status.phase != phase.as_str() {
            self.status.phase = phase.as_str().to_owned();
            self.status.last_transition_time = now();
        }
    }

    fn event(&mut self, kind: EventType, reason: &'static str, note: String) {
        self.events.push((kind, reason, note));
    }

    fn condition(&mut self, status: &str, reason: &str, message: &str) {
        let conditions = &mut self.status.conditions;
        let time = conditions
            .iter()
            .find(|c| c.r#type == "Promoted" && c.status == status)
            .map_or_else(now, |c| c.last_transition_time.clone());
        conditions.retain(|c| c.r#type != "Promoted");
        conditions.push(CanaryCondition {
            r#type: "Promoted".to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: time,
        });
    }

    fn record_step(&mut self, metrics: Vec<MetricResult>) {
        self.status.history.push(Step {
            time: now(),
            weight: self.status.canary_weight,
            phase: self.status.phase.clone(),
            metrics,
        });
        let excess = self.status.history.len().saturating_sub(HISTORY);
        self.status.history.drain(..excess);
    }

    fn wrote(&self) {
        self.ctx
            .stats
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Decides and does the next step; the status is written by [`Run::finish`].
    async fn step(&mut self) -> Result<Action, Error> {
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
        if phase == Phase::Initializing {
            if let Some(reason) = not_ready(&primary) {
                self.event(
                    EventType::Normal,
                    "Halted",
                    format!("initialisation: {reason}"),
                );
                return Ok(Action::requeue(HALT_RETRY));
            }
            self.scale(&self.plan.target.clone(), 0).await?;
            self.status.last_applied_spec = hash.clone();
            self.status.last_promoted_spec = hash.clone();
            self.record_revision(&target, &hash).await?;
            self.set_phase(Phase::Initialized);
            self.condition("True", "Initialized", "the primary serves all traffic");
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
                        self.rollback("aborted by dubbo-cp canary abort").await;
                        return self.sync_traffic(&target, &primary).await;
                    }
                    ManualAction::Promote => {
                        let why = "promotion requested by dubbo-cp canary promote".to_owned();
                        return self.start_promotion(&target, &primary, why).await;
                    }
                }
            }
            if let Some(hook) = self.rollback_requested().await {
                self.rollback(&format!("rollback hook {hook} answered 2xx"))
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
                if !self.run_hooks("confirm-rollout").await {
                    self.event(
                        EventType::Normal,
                        "Waiting",
                        "waiting for confirm-rollout hooks to approve the rollout".to_owned(),
                    );
                    self.sync_traffic(&target, &primary).await?;
                    return Ok(Action::requeue(self.plan.interval));
                }
                let replicas = primary.spec.replicas.unwrap_or(1).max(1);
                self.scale(&self.plan.target.clone(), replicas).await?;
                self.set_phase(Phase::Progressing);
                self.status.last_analysis_time = now();
                // The chart starts at 0 %.
                self.record_step(Vec::new());
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
    async fn start_run(&mut self, target: &Deployment, hash: &str) -> Result<(), Error> {
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
    async fn analyse(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
    ) -> Result<Action, Error> {
        let halted = not_ready(primary).or_else(|| not_ready(target));
        if let Some(reason) = halted {
            let stalled = since(&self.status.last_transition_time).unwrap_or_default();
            if stalled > self.plan.deadline {
                self.rollback(&format!(
                    "progress deadline exceeded ({}s without progress): {reason}",
                    self.plan.deadline.as_secs()
                ))
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
        let metrics = self.check_metrics().await;
        if metrics.iter().any(|m| !m.ok) {
            failed = true;
        }
        self.status.iterations += 1;
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
            self.rollback(&message).await;
            return self.sync_traffic(target, primary).await;
        }
        if failed {
            return self
                .sync_traffic(target, primary)
                .await
                .map(|_| self.requeue());
        }
        match next_weight(self.canary, self.status.canary_weight) {
            Some(next) => {
                // No such hook: run_hooks answers true without a call.
                if !self.run_hooks("confirm-traffic-increase").await {
                    self.event(
                        EventType::Normal,
                        "Waiting",
                        format!("waiting for confirm-traffic-increase hooks before weight {next}"),
                    );
                } else {
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
                }
            }
            None => {
                if self.run_hooks("confirm-promotion").await {
                    let why = format!(
                        "copying {} template to {}",
                        self.plan.target,
                        primary_name(&self.plan.target)
                    );
                    return self.start_promotion(target, primary, why).await;
                }
                self.set_phase(Phase::WaitingPromotion);
                self.event(
                    EventType::Normal,
                    "WaitingPromotion",
                    "waiting for confirm-promotion hooks to approve the promotion".to_owned(),
                );
            }
        }
        self.sync_traffic(target, primary).await?;
        Ok(self.requeue())
    }

    /// After a run, the canary pods keep weight 0 for one interval before they are scaled
    /// down, so callers move off them first: the time left, if any.
    fn draining(&self) -> Option<Duration> {
        let elapsed = since(&self.status.last_transition_time).unwrap_or(self.plan.interval);
        (elapsed < self.plan.interval).then(|| self.plan.interval - elapsed)
    }

    fn requeue(&self) -> Action {
        Action::requeue(self.plan.interval)
    }

    async fn start_promotion(
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
    async fn promote(
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
                    self.rollback("promotion could not copy the configs the target uses")
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
        if let Some(reason) = not_ready(primary) {
            let stalled = since(&self.status.last_transition_time).unwrap_or_default();
            if stalled > self.plan.deadline {
                self.rollback(&format!("promotion did not finish: {reason}"))
                    .await;
            } else {
                self.event(EventType::Normal, "Halted", format!("promotion: {reason}"));
            }
            self.sync_traffic(target, primary).await?;
            return Ok(Action::requeue(HALT_RETRY.min(self.plan.interval)));
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
    async fn rollback(&mut self, reason: &str) {
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
        self.run_hooks("post-rollout").await;
    }

    /// The spec turned invalid mid-run: weights to 0 (the stored override, rewritten), the
    /// canary scaled to zero, phase Failed.
    async fn stop_run_in_flight(&mut self, reason: &str) -> Result<(), Error> {
        let stored = self
            .ctx
            .configs
            .get(&ObjectRef::new(&self.config_name()).within(&self.namespace));
        if let Some(stored) = stored {
            let mut spec = stored.spec.clone();
            for config in &mut spec.configs {
                config
                    .parameters
                    .insert("weight".to_owned(), "0".to_owned());
            }
            self.write_config(Some(spec)).await?;
        }
        self.scale(&self.plan.target.clone(), 0).await?;
        self.status.canary_weight = 0;
        self.set_phase(Phase::Failed);
        self.condition("False", "InvalidSpec", reason);
        self.event(
            EventType::Warning,
            "RolledBack",
            clip(&format!(
                "rolling back {}: the spec is invalid: {reason}",
                self.plan.target
            )),
        );
        Ok(())
    }

    /// Sets the primary's template back to the last promoted revision's.
    async fn restore_primary(&mut self) -> Result<(), Error> {
        let revision_name = format!("{}-{}", self.name, self.status.last_promoted_spec);
        let revision = self
            .api::<ControllerRevision>()
            .get_opt(&revision_name)
            .await?
            .ok_or_else(|| Error::Invalid(format!("revision {revision_name} not found")))?;
        let template = super::ops::template_of(&revision)
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

    /// Idle: the canary at zero and no weights.
    async fn idle(&mut self, target: &Deployment) -> Result<(), Error> {
        let replicas = target.spec.replicas.unwrap_or(1);
        if replicas != 0 && self.status.last_applied_spec == self.hash(target) {
            self.scale(&self.plan.target.clone(), 0).await?;
        }
        self.write_config(None).await
    }

    /// Writes the weights the phase asks for, only when they differ from what is stored.
    async fn sync_traffic(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
    ) -> Result<Action, Error> {
        let wanted = match self.phase() {
            // Waiting: any canary pod still up (a run replaced mid-way) stays at weight 0.
            Phase::Waiting
            | Phase::Progressing
            | Phase::WaitingPromotion
            | Phase::Promoting
            | Phase::Finalising
            | Phase::Failed => {
                let pods = self.ctx.pods.state();
                let canary_ips = ready_pod_ips(target, pods.iter().map(|p| p.as_ref()));
                let primaries = ready_pod_ips(primary, pods.iter().map(|p| p.as_ref())).len();
                weight::dynamic_config(
                    &self.plan.application,
                    self.status.canary_weight,
                    primaries,
                    &canary_ips,
                )
            }
            _ => None,
        };
        self.write_config(wanted).await?;
        Ok(self.requeue())
    }

    fn config_name(&self) -> String {
        format!("{}-canary", self.name)
    }

    async fn write_config(&mut self, wanted: Option<DynamicConfigSpec>) -> Result<(), Error> {
        let name = self.config_name();
        let stored = self
            .ctx
            .configs
            .get(&ObjectRef::new(&name).within(&self.namespace));
        let api = self.api::<DynamicConfig>();
        if let Some(stored) = &stored
            && stored.labels().get(REVISION_LABEL) != Some(&self.name)
        {
            // Someone else's rule of that name: never overwritten or deleted.
            if wanted.is_some() {
                let message = format!(
                    "DynamicConfig {name} exists and is not this canary's (no label {REVISION_LABEL}={}); weights are not applied",
                    self.name
                );
                self.event(EventType::Warning, "WeightsConflict", message);
            }
            return Ok(());
        }
        match (wanted, stored) {
            (None, None) => Ok(()),
            (None, Some(_)) => {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                self.wrote();
                Ok(())
            }
            (Some(spec), Some(stored)) if stored.spec == spec => Ok(()),
            (Some(spec), stored) => {
                let mut object = DynamicConfig::new(&name, spec);
                object.metadata.namespace = Some(self.namespace.clone());
                object.metadata.labels = Some(BTreeMap::from([(
                    REVISION_LABEL.to_owned(),
                    self.name.clone(),
                )]));
                object.metadata.owner_references =
                    self.canary.controller_owner_ref(&()).map(|r| vec![r]);
                match stored {
                    Some(stored) => {
                        object.metadata.resource_version = stored.resource_version();
                        api.replace(&name, &PostParams::default(), &object).await?;
                    }
                    None => match api.create(&PostParams::default(), &object).await {
                        Ok(_) => {}
                        // The store has not seen it yet; the watch event retries.
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        Err(e) => return Err(e.into()),
                    },
                }
                self.wrote();
                Ok(())
            }
        }
    }

    async fn scale(&mut self, deployment: &str, replicas: i32) -> Result<(), Error> {
        let current = self.deployment(deployment).and_then(|d| d.spec.replicas);
        if current == Some(replicas) {
            return Ok(());
        }
        self.api::<Deployment>()
            .patch(
                deployment,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await?;
        self.wrote();
        Ok(())
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    /// Records a ControllerRevision for `hash` (once per distinct template) and prunes the
    /// history to `revisionHistoryLimit`.
    async fn record_revision(&mut self, target: &Deployment, hash: &str) -> Result<(), Error> {
        let api = self.api::<ControllerRevision>();
        let name = format!("{}-{hash}", self.name);
        let mut revisions = revisions_of(&api, &self.name).await?;
        if !revisions.iter().any(|r| r.name_any() == name) {
            let number = revisions
                .iter()
                .filter_map(|r| r.revision)
                .max()
                .unwrap_or(0)
                + 1;
            let template = target.spec.template.clone();
            let revision = ControllerRevision {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        REVISION_LABEL.to_owned(),
                        self.name.clone(),
                    )])),
                    owner_references: self.canary.controller_owner_ref(&()).map(|r| vec![r]),
                    ..Default::default()
                },
                data: k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                    json!({"template": template}),
                ),
                revision: Some(number),
            };
            match api.create(&PostParams::default(), &revision).await {
                Ok(created) => revisions.push(created),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            self.wrote();
        }
        self.status.current_revision = name;
        self.prune_revisions(revisions).await
    }

    /// Deletes the oldest revisions past `revisionHistoryLimit`, never the one under analysis
    /// nor the one the primary runs (a rollback during promotion restores it).
    async fn prune_revisions(
        &mut self,
        mut revisions: Vec<ControllerRevision>,
    ) -> Result<(), Error> {
        revisions.sort_by_key(|r| r.revision);
        let limit = self.canary.spec.revision_history_limit.max(1) as usize;
        let promoted = format!("{}-{}", self.name, self.status.last_promoted_spec);
        let api = self.api::<ControllerRevision>();
        let mut left = revisions.len();
        for old in &revisions {
            if left <= limit {
                break;
            }
            let name = old.name_any();
            if name == self.status.current_revision || name == promoted {
                continue;
            }
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => self.wrote(),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            left -= 1;
        }
        Ok(())
    }

    /// Whether every hook of `kind` answered 2xx in this run.
    fn passed(&self, kind: &str) -> bool {
        hooks::of_type(self.canary, kind).all(|hook| {
            self.status
                .hooks
                .iter()
                .any(|h| h.name == hook.name && h.r#type == kind && h.ok)
        })
    }

    /// The versions of the ConfigMaps and Secrets the target uses, one line each.
    fn tracked(&self, target: &Deployment) -> Vec<String> {
        references(&target.spec.template)
            .into_iter()
            .map(|(kind, name)| {
                let at = ObjectRef::new(&name).within(&self.namespace);
                let version = match kind {
                    ConfigKind::ConfigMap => self
                        .ctx
                        .config_maps
                        .get(&at)
                        .and_then(|o| o.metadata.resource_version.clone()),
                    ConfigKind::Secret => self
                        .ctx
                        .secrets
                        .get(&ObjectRef::new(&name).within(&self.namespace))
                        .and_then(|o| o.metadata.resource_version.clone()),
                };
                format!(
                    "{kind:?}/{name}@{}",
                    version.unwrap_or_else(|| "absent".to_owned())
                )
            })
            .collect()
    }

    /// The hash of the target's template and the versions of the configs it uses.
    fn hash(&self, target: &Deployment) -> String {
        spec_hash(&target.spec.template, &self.tracked(target))
    }

    /// The hash of the configs' versions alone (empty when it uses none): the primary's
    /// annotation.
    fn configs_hash(&self, target: &Deployment) -> String {
        let tracked = self.tracked(target);
        if tracked.is_empty() {
            return String::new();
        }
        spec_hash(&PodTemplateSpec::default(), &tracked)
    }

    /// Copies every ConfigMap and Secret `template` uses to `<name>-primary` (owned by the
    /// Canary), writing only those that differ. False (with an Event) when one is missing.
    async fn copy_configs(&mut self, template: &PodTemplateSpec) -> Result<bool, Error> {
        for (kind, name) in references(template) {
            let copied = match kind {
                ConfigKind::ConfigMap => self.copy_config::<ConfigMap>(&name).await?,
                ConfigKind::Secret => self.copy_config::<Secret>(&name).await?,
            };
            if !copied {
                let message = format!(
                    "{kind:?} {name} used by {} not found; waiting for it",
                    self.plan.target
                );
                self.event(EventType::Warning, "ConfigNotFound", message);
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn copy_config<K>(&mut self, name: &str) -> Result<bool, Error>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
    {
        const CONTENT: [&str; 3] = ["data", "binaryData", "type"];
        let api = self.api::<K>();
        let Some(source) = api.get_opt(name).await? else {
            return Ok(false);
        };
        let source = serde_json::to_value(&source).map_err(|e| Error::Invalid(e.to_string()))?;
        let copy_name = format!("{name}{}", super::deployments::PRIMARY_SUFFIX);
        let mut copy = json!({
            "apiVersion": K::api_version(&()), "kind": K::kind(&()),
            "metadata": {
                "name": copy_name, "namespace": self.namespace,
                "labels": {REVISION_LABEL: self.name},
                "ownerReferences": self.canary.controller_owner_ref(&()).map(|r| vec![r]),
            },
        });
        for field in CONTENT {
            if let Some(value) = source.get(field) {
                copy[field] = value.clone();
            }
        }
        let existing = api.get_opt(&copy_name).await?;
        if let Some(existing) = &existing {
            if existing.labels().get(REVISION_LABEL) != Some(&self.name) {
                // Someone's own object of that name: never overwritten (nor garbage-collected
                // with the Canary, which an owner reference would do).
                return Err(Error::Invalid(format!(
                    "{} {copy_name} exists and is not this canary's copy (no label {REVISION_LABEL}={}); rename it",
                    K::kind(&()),
                    self.name
                )));
            }
            let existing =
                serde_json::to_value(existing).map_err(|e| Error::Invalid(e.to_string()))?;
            if CONTENT.iter().all(|f| existing.get(*f) == copy.get(*f)) {
                return Ok(true);
            }
            copy["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
        }
        let object: K = serde_json::from_value(copy).map_err(|e| Error::Invalid(e.to_string()))?;
        match existing {
            Some(_) => {
                api.replace(&copy_name, &PostParams::default(), &object)
                    .await?;
            }
            None => {
                api.create(&PostParams::default(), &object).await?;
            }
        }
        self.wrote();
        Ok(true)
    }

    /// Calls every hook of `kind`, records each answer; true when all succeeded (or none exist).
    async fn run_hooks(&mut self, kind: &str) -> bool {
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
    async fn rollback_requested(&mut self) -> Option<String> {
        let body = hooks::payload(self.canary, &self.status, &BTreeMap::new());
        for hook in hooks::of_type(self.canary, "rollback") {
            let mut body = body.clone();
            body["metadata"] = json!(hook.metadata);
            // One attempt per reconcile: this is a poll, not a call that must get through.
            let once = super::crd::Webhook {
                retries: 0,
                ..hook.clone()
            };
            if hooks::call(&self.ctx.http, &once, &body).await.ok {
                return Some(hook.name.clone());
            }
        }
        None
    }

    async fn check_metrics(&mut self) -> Vec<MetricResult> {
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
            let Some(address) = &address else {
                results.push(MetricResult {
                    name: check.name.clone(),
                    value: None,
                    min: check.threshold_range.min,
                    max: check.threshold_range.max,
                    ok: false,
                    message: "no Prometheus: set spec.prometheus.address or the server's canary.prometheus".to_owned(),
                });
                continue;
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
            };
            let mut result = self
                .ctx
                .prometheus
                .check(address, check, &values, self.ctx.settings.query_timeout)
                .await;
            result.message = clip(&result.message);
            results.push(result);
        }
        results
    }

    /// A `promote:<revision>:<id>` or `abort:<revision>:<id>` request not handled yet, for the
    /// run of that revision while it is analysed; any other is consumed with an Event.
    fn manual_action(&mut self) -> Option<ManualAction> {
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
    async fn finish(&mut self) -> Result<(), Error> {
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
        Ok(())
    }
}

/// Records an Event on `canary` and sends it to its `event` hooks.
async fn emit(
    ctx: &Context,
    canary: &Canary,
    status: &CanaryStatus,
    kind: EventType,
    reason: &str,
    note: &str,
) {
    if let Err(error) = ctx
        .events
        .publish(&canary.object_ref(&()), kind, reason, note)
        .await
    {
        tracing::warn!(%error, canary = %canary.name_any(), "cannot record an event");
    }
    ctx.stats
        .writes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for hook in hooks::of_type(canary, "event") {
        let mut metadata = hook.metadata.clone();
        metadata.extend([
            ("eventMessage".to_owned(), note.to_owned()),
            ("eventType".to_owned(), kind.as_str().to_owned()),
            ("timestamp".to_owned(), now()),
        ]);
        let body = hooks::payload(canary, status, &metadata);
        let outcome = hooks::call(&ctx.http, hook, &body).await;
        if !outcome.ok {
            tracing::warn!(hook = %hook.name, message = %outcome.message, "event hook failed");
        }
    }
}

enum ManualAction {
    Promote,
    Abort,
}

/// The ControllerRevisions of Canary `name`, oldest first.
pub async fn revisions_of(
    api: &Api<ControllerRevision>,
    name: &str,
) -> Result<Vec<ControllerRevision>, kube::Error> {
    let selector = format!("{REVISION_LABEL}={name}");
    let mut revisions: Vec<ControllerRevision> = api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        // A server that ignores the selector still gives the right answer.
        .filter(|r| r.labels().get(REVISION_LABEL).map(String::as_str) == Some(name))
        .collect();
    revisions.sort_by_key(|r| r.revision);
    Ok(revisions)
}

/// Deletion: the target serves again with the primary's template, and no weights remain.
async fn cleanup(canary: &Canary, ctx: &Context) -> Result<Action, Error> {
    let namespace = canary.namespace().unwrap_or_default();
    let name = canary.name_any();
    let target_name = canary.spec.target_ref.name.clone();
    if canary.status.as_ref().map(|s| s.phase.as_str()) != Some(Phase::Terminating.as_str()) {
        let mut object = canary.clone();
        let status = object.status.get_or_insert_with(CanaryStatus::default);
        status.phase = Phase::Terminating.as_str().to_owned();
        status.canary_weight = 0;
        status.last_transition_time = now();
        Api::<Canary>::namespaced(ctx.client.clone(), &namespace)
            .replace_status(&name, &PostParams::default(), &object)
            .await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let primary = deployments.get_opt(&primary_name(&target_name)).await?;
    if let (Some(primary), Some(mut target)) = (primary, deployments.get_opt(&target_name).await?) {
        let template = target_template(&primary, &target_name);
        let replicas = primary.spec.replicas.unwrap_or(1);
        let spec = &mut target.spec;
        if spec.template != template || spec.replicas != Some(replicas) {
            spec.template = template;
            spec.replicas = Some(replicas);
            target.status = None;
            deployments
                .replace(&target_name, &PostParams::default(), &target)
                .await?;
            ctx.stats
                .writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    // The primary goes with the Canary (its owner): keep the Canary until the restored target
    // serves, at most its progress deadline after the deletion.
    if let Some(target) = ctx
        .deployments
        .get(&ObjectRef::new(&target_name).within(&namespace))
        && let Some(reason) = not_ready(&target)
    {
        let deleted = canary
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
            .unwrap_or_default();
        let waited = k8s_openapi::jiff::Timestamp::now().as_second() - deleted;
        if waited < i64::from(canary.spec.progress_deadline_seconds) {
            return Err(Error::Waiting(format!(
                "canary {namespace}/{name} deleted; waiting for {target_name} to serve again: {reason}"
            )));
        }
    }
    let configs: Api<DynamicConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    match configs
        .delete(&format!("{name}-canary"), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.stats.forget(&CanaryLabels { namespace, name });
    if let Some(uid) = canary.uid() {
        ctx.written.remove(&uid);
    }
    let note = format!("canary deleted: {target_name} restored with the primary's template");
    let mut status = canary.status.clone().unwrap_or_default();
    status.phase = Phase::Terminating.as_str().to_owned();
    emit(
        ctx,
        canary,
        &status,
        EventType::Normal,
        "Terminating",
        &note,
    )
    .await;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canary(analysis: serde_json::Value) -> Canary {
        serde_json::from_value(json!({
            "apiVersion": "dubbo.apache.org/v1alpha1", "kind": "Canary",
            "metadata": {"name": "podinfo", "namespace": "test"},
            "spec": {"targetRef": {"name": "podinfo"}, "analysis": analysis},
        }))
        .unwrap()
    }

    #[test]
    fn weights_step_up_to_the_maximum() {
        let c = canary(json!({"maxWeight": 50, "stepWeight": 10}));
        let mut weights = vec![0];
        while let Some(next) = next_weight(&c, *weights.last().unwrap()) {
            weights.push(next);
        }
        assert_eq!(weights, [0, 10, 20, 30, 40, 50]);
        let c = canary(json!({"maxWeight": 50, "stepWeight": 20}));
        assert_eq!(next_weight(&c, 40), Some(50));
        assert_eq!(next_weight(&c, 50), None);
    }

    #[test]
    fn explicit_steps_are_followed() {
        let c = canary(json!({"maxWeight": 50, "stepWeights": [1, 5, 10, 50]}));
        let mut weights = vec![0];
        while let Some(next) = next_weight(&c, *weights.last().unwrap()) {
            weights.push(next);
        }
        assert_eq!(weights, [0, 1, 5, 10, 50]);
    }

    #[test]
    fn the_spec_is_checked_with_clear_messages() {
        let c = canary(json!({"stepWeight": 10, "interval": "soon"}));
        assert!(
            plan(&c)
                .unwrap_err()
                .contains("spec.analysis.interval \"soon\"")
        );
        let c = canary(json!({}));
        assert!(plan(&c).unwrap_err().contains("stepWeight or stepWeights"));
        let c = canary(json!({"stepWeight": 10, "metrics": [{"name": "latency"}]}));
        assert!(plan(&c).unwrap_err().contains("give it a query"));
        let c = canary(json!({"stepWeight": 10, "interval": "1m30s"}));
        assert_eq!(plan(&c).unwrap().interval, Duration::from_secs(90));
        assert_eq!(plan(&c).unwrap().application, "podinfo");
    }

    #[test]
    fn outside_messages_are_clipped_on_a_character_boundary() {
        assert_eq!(clip_to("short", 10), "short");
        let long = "é".repeat(600);
        let clipped = clip(&long);
        assert!(
            clipped.len() <= MESSAGE_BYTES + "…".len(),
            "{}",
            clipped.len()
        );
        assert!(clipped.ends_with('…'));
        assert_eq!(clip_to("abcdefghij", 6), "abc…");
    }

    #[test]
    fn selectors_the_primary_cannot_tell_apart_are_refused() {
        let deployment = |selector: serde_json::Value| -> Deployment {
            serde_json::from_value(json!({"metadata": {"name": "provider"},
                "spec": {"selector": selector, "template": {}}}))
            .unwrap()
        };
        assert_eq!(
            selector_problem(
                &deployment(json!({"matchLabels": {"app": "provider"}})),
                "provider"
            ),
            None
        );
        assert!(
            selector_problem(
                &deployment(json!({"matchLabels": {"app": "dubbo"}})),
                "provider"
            )
            .unwrap()
            .contains("no selector label has the value \"provider\"")
        );
        assert!(
            selector_problem(
                &deployment(json!({"matchLabels": {"app": "provider"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]})),
                "provider"
            )
            .unwrap()
            .contains("matchExpressions")
        );
    }

    #[test]
    fn phases_round_trip() {
        for phase in [
            Phase::Initializing,
            Phase::Initialized,
            Phase::Waiting,
            Phase::Progressing,
            Phase::WaitingPromotion,
            Phase::Promoting,
            Phase::Finalising,
            Phase::Succeeded,
            Phase::Failed,
            Phase::Terminating,
        ] {
            assert_eq!(Phase::parse(phase.as_str()), phase);
        }
        assert_eq!(Phase::parse(""), Phase::Initializing);
    }
}
