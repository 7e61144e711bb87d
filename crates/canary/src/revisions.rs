//! The ControllerRevisions that record each run's template (Flagger's revisions): labelled with
//! the Canary they belong to.

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

/// Label of the ControllerRevisions of a Canary.
pub const REVISION_LABEL: &str = "dubbo.apache.org/canary";

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
