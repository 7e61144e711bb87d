//! One reconcile of one Canary: read the Deployments and pods from the shared stores, decide the
//! next step of rollout.md's loop, write only what differs, record the step in status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodTemplateSpec, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::abtest;
use super::alerts::Severity;
use super::configs::{ConfigKind, references};
use super::crd::{Canary, CanaryCondition, CanaryStatus, HookResult, MetricResult, Step, Strategy};
use super::deployments::{
    any_pod_ips, not_ready, not_ready_at, primary_from, primary_name, primary_template,
    ready_pod_ips, spec_hash, target_template,
};
use super::events::{Events, Kind as EventType, clip_to};
use super::hooks;
use super::http::HttpClient;
use super::prometheus::{Placeholders, Prometheus};
use super::stats::{CanaryLabels, CanaryStats};
use super::weight;
use crate::rules::{ConditionRouteSpec, DynamicConfigSpec};
use dubbo_cp_crds::{ConditionRoute, DynamicConfig};

pub use super::crd::ACTION_ANNOTATION;
pub use super::revisions::{REVISION_LABEL, revisions_of};
pub const FINALIZER: &str = "canaries.dubbo.apache.org/restore";
/// Weight history kept in status (the dashboard's chart, `canary status`).
const HISTORY: usize = 60;
/// A halted run looks again this soon (a Deployment change wakes it sooner).
const HALT_RETRY: Duration = Duration::from_secs(10);

mod checks;
mod objects;
mod step;
mod writes;

pub use objects::{AUTOSCALER_READY, SERVICES_READY};

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

    /// Phases of a run, whose weights say what the target's pods get (0 outside the analysis
    /// and promotion); outside them the target's pods get no call at all.
    fn in_run(self) -> bool {
        matches!(
            self,
            Phase::Waiting
                | Phase::Progressing
                | Phase::WaitingPromotion
                | Phase::Promoting
                | Phase::Finalising
                | Phase::Failed
        )
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
    /// PEM certificates trusted besides the system's for https (`canary.caFile`).
    pub roots: Option<Vec<u8>>,
    /// What this process serves of DynamicConfig `(namespace, name)`: a run scales its canary
    /// up once its weights (the hold on the canary's pods) are served, so none of its pods is
    /// listed before. `None` where nothing is served: no wait.
    pub served_config: Option<ServedConfig>,
    /// The longest a written rule takes to be served (the debouncer's `max` and the xDS
    /// window): past it a run goes on even if its weights are not seen served.
    pub hold_settle: Duration,
}

/// `(namespace, name)` -> the DynamicConfig spec this process serves under that name.
#[derive(Clone)]
pub struct ServedConfig(pub Arc<ServedConfigFn>);

/// The lookup behind [`ServedConfig`].
pub type ServedConfigFn = dyn Fn(&str, &str) -> Option<DynamicConfigSpec> + Send + Sync;

impl std::fmt::Debug for ServedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServedConfig")
    }
}

/// What every reconcile shares: the client, the stores the watches keep, the outside clients.
pub struct Context {
    pub client: kube::Client,
    pub deployments: Store<Deployment>,
    pub pods: Store<Pod>,
    pub configs: Store<DynamicConfig>,
    /// The ConditionRoutes A/B runs write.
    pub routes: Store<ConditionRoute>,
    /// Versions (metadata only: no Secret data is held) of the ConfigMaps and Secrets.
    pub config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub secrets: Store<PartialObjectMeta<Secret>>,
    pub events: Events,
    pub prometheus: Prometheus,
    pub http: HttpClient,
    pub alerts: crate::notifier::Alerts,
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
    strategy: Strategy,
    /// The header callers are hashed on (session affinity), if asked for.
    affinity: Option<String>,
}

fn plan(canary: &Canary) -> Result<Plan, String> {
    let spec = &canary.spec;
    let interval = humantime::parse_duration(&spec.analysis.interval)
        .map_err(|e| format!("spec.analysis.interval {:?}: {e}", spec.analysis.interval))?;
    if interval.is_zero() {
        return Err("spec.analysis.interval must be positive".to_owned());
    }
    let strategy = Strategy::of(&spec.analysis);
    if spec.analysis.mirror {
        return Err(
            "spec.analysis.mirror: proxyless gRPC clients have no mirror policy and Dubbo SDKs \
             cannot copy calls, so traffic cannot be mirrored; remove mirror (Blue/Green without \
             it analyses the canary on the test traffic of its hooks)"
                .to_owned(),
        );
    }
    if strategy == Strategy::Canary
        && (spec.analysis.max_weight == 0 || spec.analysis.step_weights.contains(&0))
    {
        // Checks run only once traffic reaches the canary (as Flagger's): a run that never
        // leaves weight 0 would be promoted unanalysed.
        return Err(format!(
            "spec.analysis: maxWeight {} and every stepWeights entry {:?} must be at least 1 \
             (the Canary strategy judges the canary on the traffic its weights give it)",
            spec.analysis.max_weight, spec.analysis.step_weights
        ));
    }
    if strategy == Strategy::Canary
        && spec.analysis.step_weight.is_none()
        && spec.analysis.step_weights.is_empty()
    {
        return Err(
            "spec.analysis: set stepWeight or stepWeights (Canary), or iterations (A/B testing, \
             Blue/Green)"
                .to_owned(),
        );
    }
    let affinity = match &spec.analysis.session_affinity {
        Some(affinity) => Some(session_affinity(affinity, strategy)?),
        None => None,
    };
    if !spec.analysis.r#match.is_empty() {
        if spec.analysis.iterations.is_none() {
            return Err("spec.analysis.match (A/B testing) needs iterations".to_owned());
        }
        abtest::check(&spec.analysis.r#match)?;
    }
    if let Some(service) = &spec.service {
        let [apex, primary, _] = super::services::names(service, &spec.target_ref.name);
        let label = dns_label(&apex);
        if !label || primary.len() > 63 {
            return Err(format!(
                "spec.service.name {apex:?} (targetRef.name when unset): a Service name is a DNS label (lower case letters, digits, '-') of at most 55 characters, so that {primary:?} fits 63"
            ));
        }
        if !(1..=65535).contains(&service.port) {
            return Err(format!(
                "spec.service.port {}: a port is 1-65535",
                service.port
            ));
        }
    }
    if let Some(reference) = &spec.autoscaler_ref
        && (reference.kind != "HorizontalPodAutoscaler"
            || reference.api_version != "autoscaling/v2")
    {
        return Err(format!(
            "spec.autoscalerRef {}/{}: only autoscaling/v2 HorizontalPodAutoscaler is supported",
            reference.api_version, reference.kind
        ));
    }
    if spec.target_ref.kind != "Deployment" {
        return Err(format!(
            "spec.targetRef.kind {:?}: only Deployment is supported",
            spec.target_ref.kind
        ));
    }
    for metric in &spec.analysis.metrics {
        match (&metric.query, &metric.template_ref) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "spec.analysis.metrics[{}]: set query or templateRef, not both",
                    metric.name
                ));
            }
            (_, Some(_)) => {}
            (_, None) => {
                super::prometheus::query_of(metric)
                    .map_err(|e| format!("spec.analysis.metrics[{}]: {e}", metric.name))?;
            }
        }
    }
    Ok(Plan {
        interval,
        deadline: Duration::from_secs(u64::from(spec.progress_deadline_seconds)),
        application: spec
            .application
            .clone()
            .unwrap_or_else(|| spec.target_ref.name.clone()),
        target: spec.target_ref.name.clone(),
        strategy,
        affinity,
    })
}

/// The header of `spec.analysis.sessionAffinity`, checked: gRPC has no cookies, and a ring hash
/// keeps callers as long as the weights leave them, so `maxAge` has nothing to bound.
fn session_affinity(
    affinity: &crate::crd::SessionAffinity,
    strategy: Strategy,
) -> Result<String, String> {
    const FIELD: &str = "spec.analysis.sessionAffinity";
    if strategy != Strategy::Canary {
        return Err(format!(
            "{FIELD}: only the Canary strategy (stepWeight/stepWeights) moves callers by weight; \
             {} moves them by match or all at once, so remove sessionAffinity",
            strategy.as_str()
        ));
    }
    for (name, set) in [
        ("cookieName", affinity.cookie_name.is_some()),
        ("primaryCookieName", affinity.primary_cookie_name.is_some()),
        ("maxAge", affinity.max_age.is_some()),
    ] {
        if set {
            return Err(format!(
                "{FIELD}.{name}: gRPC calls carry no cookies; name the header that tells callers \
                 apart in headerName instead (a ring hash on it keeps each caller, with no age)"
            ));
        }
    }
    let Some(header) = affinity.header_name.as_deref() else {
        return Err(format!(
            "{FIELD}.headerName is required: the request header that tells callers apart"
        ));
    };
    if !super::rules::hashable_header(header) {
        return Err(format!(
            "{FIELD}.headerName {header:?}: must be a lower-case metadata key of at most 100 \
             characters, not binary ('-bin'), not gRPC's ('grpc-') and not one every call \
             carries (content-type, te, user-agent, host)"
        ));
    }
    Ok(header.to_owned())
}

/// Whether `name` is a DNS-1035 label's characters: a Service's name.
fn dns_label(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
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

/// One reconcile's working state: the status it will write and the events it will emit.
struct Run<'a> {
    canary: &'a Canary,
    ctx: &'a Context,
    plan: Plan,
    status: CanaryStatus,
    events: Vec<(EventType, &'static str, String)>,
    /// Alerts of this step (severity, message, with the run's description), sent once its
    /// status is written.
    alerts: Vec<(Severity, String, bool)>,
    namespace: String,
    name: String,
}

/// The condition a suspended Canary carries.
const SUSPENDED: &str = "Suspended";

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
    let _ = ctx.routes.wait_until_ready().await;
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
    let mut plan = match plan(canary) {
        // Suspended with a spec that cannot run: nothing to do until it changes.
        Err(_) if canary.spec.suspend => return Ok(Action::await_change()),
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
                    strategy: Strategy::of(&canary.spec.analysis),
                    affinity: None,
                },
                status,
                events: Vec::new(),
                alerts: Vec::new(),
                namespace,
                name,
            };
            run.condition("False", "InvalidSpec", &message);
            run.event(EventType::Warning, "InvalidSpec", clip(&message));
            if run.phase().analysing() || run.phase() == Phase::Promoting {
                // A run in flight cannot go on without a valid spec: its pods get weight 0 and
                // stop, and it counts as failed.
                run.stop_run_in_flight(&message).await?;
            } else if matches!(run.phase(), Phase::Finalising | Phase::Failed) {
                // Draining: the canary's pods stay at weight 0, and nothing the spec asked for
                // (session affinity) outlives it while nothing reconciles.
                run.write_zero_weights().await?;
            }
            run.finish().await?;
            // A spec change wakes it; nothing else can fix the spec.
            return Ok(Action::await_change());
        }
    };
    let mut status = status;
    if canary.spec.suspend {
        // The status is left as it is (but for its Suspended condition), and a run held by
        // `suspend` keeps moving traffic as it did, whatever the spec now says.
        if let Some(running) = Strategy::named(&status.strategy) {
            plan.strategy = running;
        }
    } else {
        if status.conditions.iter().any(|c| c.r#type == SUSPENDED) {
            // Resumed: time held by `suspend` is no lack of progress.
            status.conditions.retain(|c| c.r#type != SUSPENDED);
            if Phase::parse(&status.phase).in_run() {
                status.last_transition_time = now();
            }
        }
        if !status.strategy.is_empty() && status.strategy != plan.strategy.as_str() {
            // A strategy changed mid-run starts its count afresh, from no canary traffic: a
            // weight or iterations of the other strategy mean nothing to it.
            status.iterations = 0;
            status.canary_weight = 0;
        }
        status.strategy = plan.strategy.as_str().to_owned();
        status.r#match = if plan.strategy == Strategy::ABTesting {
            abtest::describe(&canary.spec.analysis.r#match)
        } else {
            String::new()
        };
    }
    let mut run = Run {
        canary,
        ctx,
        plan,
        status,
        events: Vec::new(),
        alerts: Vec::new(),
        namespace,
        name,
    };
    // Flagger's `suspend`: the run neither starts nor moves and its status is left alone, but
    // the weights and the apex's endpoints keep following the pods, which no Kubernetes
    // controller does for us (a replaced pod would take Dubbo's default weight).
    let action = if canary.spec.suspend {
        run.hold_suspended().await
    } else {
        run.step().await
    };
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

    /// An alert to `analysis.alerts` (Flagger's `alert`); `described` adds the run's fields.
    fn alert(&mut self, severity: Severity, message: String, described: bool) {
        self.alerts.push((severity, message, described));
    }

    fn condition(&mut self, status: &str, reason: &str, message: &str) {
        self.set_condition("Promoted", status, reason, message);
    }

    fn set_condition(&mut self, kind: &str, status: &str, reason: &str, message: &str) {
        let conditions = &mut self.status.conditions;
        let time = conditions
            .iter()
            .find(|c| c.r#type == kind && c.status == status)
            .map_or_else(now, |c| c.last_transition_time.clone());
        conditions.retain(|c| c.r#type != kind);
        conditions.push(CanaryCondition {
            r#type: kind.to_owned(),
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
    // Weights first, then the A/B route, as sync_traffic orders them.
    let configs: Api<DynamicConfig> = Api::namespaced(ctx.client.clone(), &namespace);
    delete_owned(&configs, &format!("{name}-canary"), &name).await?;
    let routes: Api<ConditionRoute> = Api::namespaced(ctx.client.clone(), &namespace);
    delete_owned(&routes, &format!("{name}-canary"), &name).await?;
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

/// Deletes `name` if it is the Canary `canary`'s (labelled so); someone else's is left alone.
async fn delete_owned<K>(api: &Api<K>, name: &str, canary: &str) -> Result<(), Error>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let Some(stored) = api.get_opt(name).await? else {
        return Ok(());
    };
    if stored.labels().get(REVISION_LABEL).map(String::as_str) != Some(canary) {
        return Ok(());
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
