//! The objects a Canary keeps besides the primary, as Flagger does: its Services (and the
//! apex's EndpointSlice) and the primary's HorizontalPodAutoscaler. Read fresh from the API
//! server (few, rarely written); one of the same name that is not this Canary's (no controller
//! owner reference to it) is never written, and a condition names it.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::*;
use crate::autoscaler;
use crate::deployments::{pod_reference, ready_pods};
use crate::services::{self, Owner};

/// Condition types besides Flagger's `Promoted`, one per kind of object kept.
pub const SERVICES_READY: &str = "ServicesReady";
pub const AUTOSCALER_READY: &str = "AutoscalerReady";

impl Run<'_> {
    /// Keeps the Services and the primary's HPA; answers the target's HPA, if one is named and
    /// found (it sizes the canary).
    pub(super) async fn sync_objects(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
    ) -> Result<Option<HorizontalPodAutoscaler>, Error> {
        // Outside a run the target's pods are unanalysed (a template applied while suspended)
        // or on their way out: only the primary's are listed, as Flagger's apex selects the
        // primary alone. While initialising they run what the primary copies and serve until
        // its pods are ready (Flagger's target serves until then too).
        let phase = self.phase();
        let with_target = phase.in_run() || phase == Phase::Initializing;
        self.sync_services(target, primary, with_target).await?;
        self.sync_autoscaler().await
    }

    /// Keeps the Services; the apex's slice lists the primary's ready pods, and the target's
    /// too when `with_target`.
    pub(super) async fn sync_services(
        &mut self,
        target: &Deployment,
        primary: &Deployment,
        with_target: bool,
    ) -> Result<(), Error> {
        let Some(spec) = self.canary.spec.service.clone() else {
            return Ok(());
        };
        let port = match services::target_port(&spec, &target.spec.template) {
            Ok(port) => port,
            Err(message) => {
                self.object_condition(SERVICES_READY, false, "InvalidService", message);
                return Ok(());
            }
        };
        let [apex, primary_name, canary_name] = services::names(&spec, &self.plan.target);
        let owner = self.owner();
        let wanted = [
            (&apex, None, Some(self.plan.application.clone())),
            (
                &primary_name,
                primary.spec.selector.match_labels.clone(),
                None,
            ),
            (
                &canary_name,
                target.spec.selector.match_labels.clone(),
                None,
            ),
        ];
        let mut foreign = Vec::new();
        let mut refused = Vec::new();
        let mut apex_ours = false;
        for (name, selector, application) in wanted {
            let object = services::service(&owner, &spec, name, selector, application.as_deref());
            match refusal(self.write_service(name, object).await)? {
                Ok(true) => apex_ours |= name == &apex,
                Ok(false) => foreign.push(format!("Service {name}")),
                Err(why) => refused.push(format!("Service {name}: {why}")),
            }
        }
        if apex_ours {
            let pods = self.ctx.pods.state();
            let mut ready = if with_target {
                ready_pods(target, pods.iter().map(|p| p.as_ref()))
            } else {
                Vec::new()
            };
            ready.extend(ready_pods(primary, pods.iter().map(|p| p.as_ref())));
            let mut endpoints: Vec<(String, Option<ObjectReference>)> = ready
                .into_iter()
                .map(|(ip, pod)| (ip, Some(pod_reference(pod))))
                .collect();
            endpoints.sort_by(|a, b| a.0.cmp(&b.0));
            endpoints.dedup_by(|a, b| a.0 == b.0);
            let slice = services::apex_slice(&owner, &spec, &apex, port, &endpoints);
            let name = services::slice_name(&apex);
            match refusal(self.write_slice(slice).await)? {
                Ok(true) => {}
                Ok(false) => foreign.push(format!("EndpointSlice {name}")),
                Err(why) => refused.push(format!("EndpointSlice {name}: {why}")),
            }
        }
        if !refused.is_empty() {
            let message = format!("refused by the API server: {}", refused.join("; "));
            self.object_condition(SERVICES_READY, false, "ServiceRefused", message);
        } else if foreign.is_empty() {
            let message = format!(
                "Services {apex} (both roles), {primary_name} and {canary_name} are this canary's"
            );
            self.object_condition(SERVICES_READY, true, "ServicesReady", message);
        } else {
            let message = format!(
                "{} exists and is not this canary's (no controller ownerReference to it): left as it is; rename or delete it, or set spec.service.name",
                foreign.join(", ")
            );
            self.object_condition(SERVICES_READY, false, "ServiceConflict", message);
        }
        Ok(())
    }

    /// Creates or updates Service `name`; false (nothing written) when it is not this Canary's.
    async fn write_service(&mut self, name: &str, wanted: Service) -> Result<bool, Error> {
        let api = self.api::<Service>();
        match api.get_opt(name).await? {
            None => {
                create(&api, &wanted).await?;
                self.wrote();
            }
            Some(stored) if !self.owner().owns(&stored.metadata) => return Ok(false),
            Some(stored) if services::service_matches(&stored, &wanted) => {}
            Some(mut stored) => {
                // The API server's own fields (clusterIP, ipFamilies, ...) stay as they are.
                stored.metadata.labels = wanted.metadata.labels;
                let wanted_spec = wanted.spec.unwrap_or_default();
                let spec = stored.spec.get_or_insert_with(Default::default);
                spec.selector = wanted_spec.selector;
                spec.ports = wanted_spec.ports;
                stored.status = None;
                api.replace(name, &PostParams::default(), &stored).await?;
                self.wrote();
            }
        }
        Ok(true)
    }

    /// Creates or updates the apex's EndpointSlice; false when that name is not this Canary's.
    async fn write_slice(&mut self, wanted: EndpointSlice) -> Result<bool, Error> {
        let api = self.api::<EndpointSlice>();
        let name = wanted.metadata.name.clone().unwrap_or_default();
        match api.get_opt(&name).await? {
            None => {
                create(&api, &wanted).await?;
                self.wrote();
            }
            Some(stored) if !self.owner().owns(&stored.metadata) => return Ok(false),
            Some(stored)
                if stored.endpoints == wanted.endpoints
                    && stored.ports == wanted.ports
                    && stored.address_type == wanted.address_type
                    && stored.metadata.labels == wanted.metadata.labels => {}
            Some(stored) if stored.address_type != wanted.address_type => {
                // The address type cannot change in place.
                api.delete(&name, &DeleteParams::default()).await?;
                create(&api, &wanted).await?;
                self.wrote();
            }
            Some(stored) => {
                let mut object = wanted;
                object.metadata.resource_version = stored.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &object).await?;
                self.wrote();
            }
        }
        Ok(true)
    }

    /// Keeps `<autoscalerRef.name>-primary`, the target's HPA copied for the primary (which
    /// from then on only it scales); answers the target's HPA.
    async fn sync_autoscaler(&mut self) -> Result<Option<HorizontalPodAutoscaler>, Error> {
        let Some(reference) = self.canary.spec.autoscaler_ref.clone() else {
            return Ok(None);
        };
        let api = self.api::<HorizontalPodAutoscaler>();
        let Some(source) = api.get_opt(&reference.name).await? else {
            let message = format!(
                "HorizontalPodAutoscaler {} (spec.autoscalerRef.name) not found",
                reference.name
            );
            self.object_condition(AUTOSCALER_READY, false, "AutoscalerNotFound", message);
            return Ok(None);
        };
        if let Some(problem) = autoscaler::problem(&source, &self.plan.target) {
            self.object_condition(AUTOSCALER_READY, false, "InvalidAutoscaler", problem);
            return Ok(None);
        }
        let wanted = autoscaler::primary_copy(
            &source,
            &reference,
            &primary_name(&self.plan.target),
            &self.owner(),
        );
        let name = autoscaler::copy_name(&reference);
        match refusal(self.write_autoscaler(&api, &name, wanted).await)? {
            Ok(true) => {}
            Ok(false) => {
                let message = format!(
                    "HorizontalPodAutoscaler {name} exists and is not this canary's (no controller ownerReference to it): left as it is; rename or delete it"
                );
                self.object_condition(AUTOSCALER_READY, false, "AutoscalerConflict", message);
                return Ok(Some(source));
            }
            Err(why) => {
                let message =
                    format!("HorizontalPodAutoscaler {name} refused by the API server: {why}");
                self.object_condition(AUTOSCALER_READY, false, "AutoscalerRefused", message);
                return Ok(Some(source));
            }
        }
        let message = format!(
            "HorizontalPodAutoscaler {name} scales {}",
            primary_name(&self.plan.target)
        );
        self.object_condition(AUTOSCALER_READY, true, "AutoscalerReady", message);
        Ok(Some(source))
    }

    /// Creates or updates the primary's HPA copy; false when that name is not this Canary's.
    async fn write_autoscaler(
        &mut self,
        api: &Api<HorizontalPodAutoscaler>,
        name: &str,
        wanted: HorizontalPodAutoscaler,
    ) -> Result<bool, Error> {
        match api.get_opt(name).await? {
            None => {
                create(api, &wanted).await?;
                self.wrote();
            }
            Some(stored) if !self.owner().owns(&stored.metadata) => return Ok(false),
            Some(stored) if autoscaler::copy_matches(&stored, &wanted) => {}
            Some(mut stored) => {
                stored.metadata.labels = wanted.metadata.labels;
                stored.spec = wanted.spec;
                stored.status = None;
                api.replace(name, &PostParams::default(), &stored).await?;
                self.wrote();
            }
        }
        Ok(true)
    }

    /// This Canary as the owner of what it keeps.
    fn owner(&self) -> Owner {
        Owner {
            name: self.name.clone(),
            namespace: Some(self.namespace.clone()),
            uid: self.canary.uid(),
            reference: self.canary.controller_owner_ref(&()),
        }
    }

    /// Sets condition `kind`; a change to False is also a Warning event.
    fn object_condition(&mut self, kind: &str, ok: bool, reason: &'static str, message: String) {
        let status = if ok { "True" } else { "False" };
        let changed = !self
            .status
            .conditions
            .iter()
            .any(|c| c.r#type == kind && c.status == status && c.message == message);
        self.set_condition(kind, status, reason, &message);
        if changed && !ok {
            self.event(EventType::Warning, reason, clip(&message));
        }
    }
}

/// A write's outcome, with the API server's refusal of the object itself (an invalid or
/// forbidden object: 4xx but a conflict or throttling) as `Err(why)`, which retrying would not
/// change: it becomes a condition, and the run goes on. Other errors retry the reconcile.
fn refusal(result: Result<bool, Error>) -> Result<Result<bool, String>, Error> {
    match result {
        Ok(ours) => Ok(Ok(ours)),
        Err(Error::Kube(kube::Error::Api(e)))
            if (400..500).contains(&e.code) && e.code != 409 && e.code != 429 =>
        {
            Ok(Err(e.message))
        }
        Err(e) => Err(e),
    }
}

/// Creates `object`; one the API server already has (a create racing another) is left to the
/// next reconcile.
async fn create<K>(api: &Api<K>, object: &K) -> Result<(), Error>
where
    K: Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
