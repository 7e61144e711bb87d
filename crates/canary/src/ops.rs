//! What `dubbo-cp canary promote|abort|history|rollback` do to the cluster: the controller
//! reads the request from an annotation, and a rollback sets the target's template to a
//! recorded revision (which starts a new run).

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::crd::ACTION_ANNOTATION;
use super::crd::Canary;
use super::revisions::revisions_of;

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("canary {namespace}/{name} not found")]
    NoCanary { namespace: String, name: String },
    #[error("canary {0} has no revision {1} (see `dubbo-cp canary history`)")]
    NoRevision(String, i64),
    #[error("revision {0} holds no pod template")]
    BadRevision(String),
    #[error("canary {0} has no run in flight (phase {1}); nothing to promote or abort")]
    NotRunning(String, String),
    #[error("target deployment {0} not found")]
    NoTarget(String),
    #[error(
        "canary {0} is suspended (spec.suspend: true): it would act only once resumed; clear \
         spec.suspend first"
    )]
    Suspended(String),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

pub async fn canary(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Canary, OpsError> {
    Api::<Canary>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .ok_or_else(|| OpsError::NoCanary {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
}

/// Asks the controller to `promote` or `abort` the run in flight; each request carries a new
/// id so a repeated command is a new request.
pub async fn request_action(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    action: &str,
) -> Result<(), OpsError> {
    let current = canary(client, namespace, name).await?;
    if current.spec.suspend {
        return Err(OpsError::Suspended(format!("{namespace}/{name}")));
    }
    let status = current.status.unwrap_or_default();
    if !matches!(
        status.phase.as_str(),
        "Waiting" | "Progressing" | "WaitingPromotion"
    ) {
        return Err(OpsError::NotRunning(
            format!("{namespace}/{name}"),
            if status.phase.is_empty() {
                "Initializing".to_owned()
            } else {
                status.phase
            },
        ));
    }
    let id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    Api::<Canary>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            // Bound to the run's revision: a request that arrives late cannot act on the next.
            &Patch::Merge(json!({"metadata": {"annotations": {
                ACTION_ANNOTATION: format!("{action}:{}:{id}", status.current_revision)
            }}})),
        )
        .await?;
    Ok(())
}

/// The recorded revisions of Canary `name`, oldest first.
pub async fn history(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<ControllerRevision>, OpsError> {
    canary(client, namespace, name).await?;
    let api = Api::<ControllerRevision>::namespaced(client.clone(), namespace);
    Ok(revisions_of(&api, name).await?)
}

/// The pod template a revision recorded.
pub fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    serde_json::from_value(revision.data.0.get("template")?.clone()).ok()
}

/// Sets the target's pod template to revision `number`'s; the controller then runs it as a new
/// release. Returns the revision's name.
pub async fn rollback_to(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    number: i64,
) -> Result<String, OpsError> {
    let canary = canary(client, namespace, name).await?;
    let revision = history(client, namespace, name)
        .await?
        .into_iter()
        .find(|r| r.revision == Some(number))
        .ok_or_else(|| OpsError::NoRevision(name.to_owned(), number))?;
    let revision_name = revision.metadata.name.clone().unwrap_or_default();
    let template =
        template_of(&revision).ok_or_else(|| OpsError::BadRevision(revision_name.clone()))?;
    let target_name = &canary.spec.target_ref.name;
    let api = Api::<Deployment>::namespaced(client.clone(), namespace);
    let mut target = api
        .get_opt(target_name)
        .await?
        .ok_or_else(|| OpsError::NoTarget(target_name.clone()))?;
    target.spec.template = template;
    target.status = None;
    // The resourceVersion read above: a concurrent edit makes this fail rather than be lost.
    api.replace(target_name, &PostParams::default(), &target)
        .await?;
    Ok(revision_name)
}
