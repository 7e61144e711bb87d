//! What a run writes: the traffic weights (DynamicConfig), scales, revisions, config copies.

use super::*;

impl Run<'_> {
    /// Writes the weights the phase asks for, only when they differ from what is stored.
    pub(super) async fn sync_traffic(
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

    pub(super) fn config_name(&self) -> String {
        format!("{}-canary", self.name)
    }

    pub(super) async fn write_config(
        &mut self,
        wanted: Option<DynamicConfigSpec>,
    ) -> Result<(), Error> {
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
            (Some(spec), Some(stored)) if stored.spec.0 == spec => Ok(()),
            (Some(spec), stored) => {
                let mut object = DynamicConfig::new(&name, spec.into());
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
