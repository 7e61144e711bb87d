//! What a run writes: the traffic weights (DynamicConfig), scales, revisions, config copies.

use super::*;

impl Run<'_> {
    /// Writes the weights (DynamicConfig) and, for A/B runs, the route (ConditionRoute) the
    /// strategy and phase ask for, only when they differ from what is stored. Every state
    /// between writes keeps production calls off the canary: its pods keep weight 0 until the
    /// route naming them is in the store (a refused or failed route write leaves them at 0), and
    /// get weight 0 again before the route goes.
    pub(super) async fn sync_traffic(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
    ) -> Result<Action, Error> {
        let phase = self.phase();
        let pods = self.ctx.pods.state();
        let canary_ips = ready_pod_ips(target, pods.iter().map(|p| p.as_ref()));
        let primary_ips = ready_pod_ips(primary, pods.iter().map(|p| p.as_ref()));
        // The target's pods that have an IP but are not ready (coming up, or terminating).
        let held: Vec<String> = any_pod_ips(target, pods.iter().map(|p| p.as_ref()))
            .into_iter()
            .filter(|ip| !canary_ips.contains(ip))
            .collect();
        let in_run = phase.in_run();
        // The target's pods by its labels, from the run's first write (before it is scaled up)
        // to its end; after it, the hold by IP keeps whatever of the target still runs.
        let selector = if in_run {
            let labels = target.spec.selector.match_labels.clone();
            weight::hold_labels(&labels.unwrap_or_default(), &self.plan.target)
        } else {
            BTreeMap::new()
        };
        // A/B: matching calls reach the canary while it is analysed and promoted, once its
        // pre-rollout hooks passed, and only if no other ConditionRoute routes the application.
        let ab = self.plan.strategy == Strategy::ABTesting
            && matches!(
                phase,
                Phase::Progressing | Phase::WaitingPromotion | Phase::Promoting
            );
        let conflict = if ab { self.route_conflict() } else { None };
        if let Some(other) = &conflict {
            let message = format!(
                "ConditionRoute {other} also routes application {}: the A/B route is not written \
                 and the canary takes no call until it goes",
                self.plan.application
            );
            self.event(EventType::Warning, "RouteConflict", message);
        }
        let routed = ab && conflict.is_none() && self.passed("pre-rollout");
        let route = if routed {
            abtest::condition_route(
                &self.plan.application,
                &self.canary.spec.analysis.r#match,
                &canary_ips,
                &primary_ips,
            )
            .map_err(Error::Invalid)?
        } else {
            None
        };
        match route {
            Some(route) => {
                if self.stored_route().is_some_and(|stored| stored == route) {
                    self.write_config(None).await?;
                } else {
                    let zero =
                        weight::dynamic_config(&self.plan.application, 0, &[], &canary_ips, None);
                    let zero = weight::holding_back(zero, &self.plan.application, &selector, &held);
                    self.write_config(zero).await?;
                    self.write_route(Some(route)).await?;
                }
            }
            None => {
                let weights = if in_run {
                    let weights = weight::dynamic_config(
                        &self.plan.application,
                        if self.plan.strategy == Strategy::ABTesting {
                            0
                        } else {
                            self.status.canary_weight
                        },
                        &primary_ips,
                        &canary_ips,
                        self.plan.affinity.as_deref(),
                    );
                    weight::holding_back(weights, &self.plan.application, &selector, &held)
                } else {
                    None
                };
                self.write_config(weights).await?;
                self.write_route(None).await?;
            }
        }
        Ok(self.requeue())
    }

    /// When to look again if the hold on the canary's pods by their labels, written as the run
    /// started to wait, is not in this process's index yet (from there the xDS window applies
    /// to it and to endpoints alike): until it is, or until the longest a rule takes to be
    /// served has passed since.
    pub(super) fn hold_settling(&self, target: &Deployment) -> Option<Duration> {
        let settle = self.ctx.settings.hold_settle;
        let elapsed = since(&self.status.last_transition_time).unwrap_or(settle);
        if elapsed >= settle {
            return None;
        }
        let served = self.ctx.settings.served_config.as_ref()?;
        let labels = target
            .spec
            .selector
            .match_labels
            .clone()
            .unwrap_or_default();
        let wanted = weight::hold_labels(&labels, &self.plan.target);
        if wanted.is_empty() {
            return None;
        }
        let serving = (served.0)(&self.namespace, &self.config_name());
        let held = serving.is_some_and(|spec| weight::holds_by_labels(&spec, &wanted));
        (!held).then(|| (settle - elapsed).min(Duration::from_millis(50)))
    }

    /// This run's route as stored, if it is this Canary's.
    pub(super) fn stored_route(&self) -> Option<ConditionRouteSpec> {
        let stored = self
            .ctx
            .routes
            .get(&ObjectRef::new(&self.config_name()).within(&self.namespace))?;
        (stored.labels().get(REVISION_LABEL) == Some(&self.name)).then(|| stored.spec.0.clone())
    }

    /// Another enabled ConditionRoute of the application in this namespace, by name: xDS keeps
    /// one route per application, and two rules narrowing in turn would not say A/B.
    pub(super) fn route_conflict(&self) -> Option<String> {
        let ours = self.config_name();
        self.ctx
            .routes
            .state()
            .iter()
            .filter(|r| r.namespace().as_deref() == Some(self.namespace.as_str()))
            .filter(|r| r.name_any() != ours)
            .find(|r| r.spec.0.enabled && r.spec.0.key == self.plan.application)
            .map(|r| r.name_any())
    }

    /// The name of the rules a run writes: `<canary>-canary`.
    pub(super) fn config_name(&self) -> String {
        format!("{}-canary", self.name)
    }

    /// Whether this run's DynamicConfig is stored (and this Canary's).
    pub(super) fn stored_config_is_ours(&self) -> bool {
        self.ctx
            .configs
            .get(&ObjectRef::new(&self.config_name()).within(&self.namespace))
            .is_some_and(|stored| stored.labels().get(REVISION_LABEL) == Some(&self.name))
    }

    pub(super) async fn write_config(
        &mut self,
        wanted: Option<DynamicConfigSpec>,
    ) -> Result<(), Error> {
        let store = self.ctx.configs.clone();
        self.write_owned(&store, wanted).await
    }

    pub(super) async fn write_route(
        &mut self,
        wanted: Option<ConditionRouteSpec>,
    ) -> Result<(), Error> {
        let store = self.ctx.routes.clone();
        self.write_owned(&store, wanted).await
    }

    /// Creates, replaces or deletes this run's rule of kind `K` to match `wanted`; a rule of
    /// that name that is not this Canary's is never touched.
    async fn write_owned<K: Owned>(
        &mut self,
        store: &Store<K>,
        wanted: Option<K::Spec>,
    ) -> Result<(), Error> {
        let name = self.config_name();
        let stored = store.get(&ObjectRef::new(&name).within(&self.namespace));
        let api = self.api::<K>();
        if let Some(stored) = &stored
            && stored.labels().get(REVISION_LABEL) != Some(&self.name)
        {
            // Someone else's rule of that name: never overwritten or deleted.
            if wanted.is_some() {
                let message = format!(
                    "{} {name} exists and is not this canary's (no label {REVISION_LABEL}={}); {} are not applied",
                    K::KIND,
                    self.name,
                    K::WHAT
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
            (Some(spec), Some(stored)) if stored.spec_of() == &spec => Ok(()),
            (Some(spec), stored) => {
                let mut object = K::build(&name, spec);
                let meta = object.meta_mut();
                meta.namespace = Some(self.namespace.clone());
                meta.labels = Some(BTreeMap::from([(
                    REVISION_LABEL.to_owned(),
                    self.name.clone(),
                )]));
                meta.owner_references = self.canary.controller_owner_ref(&()).map(|r| vec![r]);
                match stored {
                    Some(stored) => {
                        object.meta_mut().resource_version = stored.resource_version();
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

    pub(super) async fn scale(&mut self, deployment: &str, replicas: i32) -> Result<(), Error> {
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

    pub(super) fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    /// Records a ControllerRevision for `hash` (once per distinct template) and prunes the
    /// history to `revisionHistoryLimit`.
    pub(super) async fn record_revision(
        &mut self,
        target: &Deployment,
        hash: &str,
    ) -> Result<(), Error> {
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
    pub(super) async fn prune_revisions(
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
    pub(super) fn passed(&self, kind: &str) -> bool {
        hooks::of_type(self.canary, kind).all(|hook| {
            self.status
                .hooks
                .iter()
                .any(|h| h.name == hook.name && h.r#type == kind && h.ok)
        })
    }

    /// The versions of the ConfigMaps and Secrets the target uses, one line each.
    pub(super) fn tracked(&self, target: &Deployment) -> Vec<String> {
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
    pub(super) fn hash(&self, target: &Deployment) -> String {
        spec_hash(&target.spec.template, &self.tracked(target))
    }

    /// The hash of the configs' versions alone (empty when it uses none): the primary's
    /// annotation.
    pub(super) fn configs_hash(&self, target: &Deployment) -> String {
        let tracked = self.tracked(target);
        if tracked.is_empty() {
            return String::new();
        }
        spec_hash(&PodTemplateSpec::default(), &tracked)
    }

    /// Copies every ConfigMap and Secret `template` uses to `<name>-primary` (owned by the
    /// Canary), writing only those that differ. False (with an Event) when one is missing.
    pub(super) async fn copy_configs(&mut self, template: &PodTemplateSpec) -> Result<bool, Error> {
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

    pub(super) async fn copy_config<K>(&mut self, name: &str) -> Result<bool, Error>
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
        let copy_name = format!("{name}{}", crate::configs::PRIMARY_SUFFIX);
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
}

/// A rule kind a run writes under its own name, labelled and owned by the Canary.
pub(super) trait Owned:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    type Spec: PartialEq;
    const KIND: &'static str;
    /// What the rule carries, for the conflict event.
    const WHAT: &'static str;
    fn spec_of(&self) -> &Self::Spec;
    fn build(name: &str, spec: Self::Spec) -> Self;
}

impl Owned for DynamicConfig {
    type Spec = DynamicConfigSpec;
    const KIND: &'static str = "DynamicConfig";
    const WHAT: &'static str = "weights";
    fn spec_of(&self) -> &DynamicConfigSpec {
        &self.spec.0
    }
    fn build(name: &str, spec: DynamicConfigSpec) -> Self {
        DynamicConfig::new(name, spec.into())
    }
}

impl Owned for ConditionRoute {
    type Spec = ConditionRouteSpec;
    const KIND: &'static str = "ConditionRoute";
    const WHAT: &'static str = "A/B routes";
    fn spec_of(&self) -> &ConditionRouteSpec {
        &self.spec.0
    }
    fn build(name: &str, spec: ConditionRouteSpec) -> Self {
        ConditionRoute::new(name, spec.into())
    }
}
