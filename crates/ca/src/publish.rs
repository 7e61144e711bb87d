//! Kubernetes mode: the trusted roots published as ConfigMap `dubbo-ca-cert` (key `ca.crt`) in
//! every namespace but `kube-system`, where the webhook mounts them into pods (wire.md §6-7).
//! A kube-runtime controller over namespaces: a new namespace gets the ConfigMap, a deleted or
//! edited ConfigMap is put back, and a change of the roots (rotation, drop) rewrites them all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::WatchStream;

use super::Authority;

pub const CONFIGMAP_NAME: &str = "dubbo-ca-cert";
pub const CONFIGMAP_KEY: &str = "ca.crt";
/// Never published here, as the reference.
const SKIPPED_NAMESPACE: &str = "kube-system";
/// Namespaces reconciled at once.
const CONCURRENCY: u16 = 8;
/// Wait before trying a failed namespace again.
const RETRY: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct PublishStats {
    writes: Counter,
    failures: Counter,
}

impl PublishStats {
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "ca_configmap_writes",
            "ConfigMaps dubbo-ca-cert created or repaired",
            self.writes.clone(),
        );
        registry.register(
            "ca_configmap_failures",
            "Failed attempts to publish ConfigMap dubbo-ca-cert",
            self.failures.clone(),
        );
    }
}

struct Context {
    client: Client,
    authority: Authority,
    stats: Arc<PublishStats>,
}

#[derive(Debug, thiserror::Error)]
#[error("ConfigMap {CONFIGMAP_NAME} in {namespace}: {source}")]
struct PublishError {
    namespace: String,
    source: kube::Error,
}

/// Runs until shutdown.
pub async fn run(
    client: Client,
    authority: Authority,
    stats: Arc<PublishStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let roots_changed = WatchStream::from_changes(authority.subscribe()).map(|_| ());
    let context = Arc::new(Context {
        client: client.clone(),
        authority,
        stats,
    });
    let controller = Controller::new(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<ConfigMap>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={CONFIGMAP_NAME}")),
        |cm: ConfigMap| {
            cm.metadata
                .namespace
                .map(|ns| ObjectRef::<Namespace>::new(&ns))
        },
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
    .reconcile_all_on(roots_changed)
    .graceful_shutdown_on(async move { crate::shutdown::signalled(&mut shutdown).await })
    .run(reconcile, error_policy, context);
    tokio::pin!(controller);
    while controller.next().await.is_some() {}
}

async fn reconcile(
    namespace: Arc<Namespace>,
    context: Arc<Context>,
) -> Result<Action, PublishError> {
    let name = namespace.name_any();
    let terminating = namespace.metadata.deletion_timestamp.is_some()
        || namespace.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    if name == SKIPPED_NAMESPACE || terminating {
        return Ok(Action::await_change());
    }
    // Not loaded yet: the change that loads them reconciles every namespace.
    let Some(bundle) = context.authority.current() else {
        return Ok(Action::await_change());
    };
    let wanted = bundle.ca_crt();
    let api: Api<ConfigMap> = Api::namespaced(context.client.clone(), &name);
    let error = |source| PublishError {
        namespace: name.clone(),
        source,
    };
    let existing = api.get_opt(CONFIGMAP_NAME).await.map_err(error)?;
    let result = match existing {
        Some(cm) if cm.data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)) == Some(&wanted) => {
            return Ok(Action::await_change());
        }
        Some(mut cm) => {
            // Only our key is put back; other keys and metadata an operator added stay.
            cm.data
                .get_or_insert_with(BTreeMap::new)
                .insert(CONFIGMAP_KEY.to_owned(), wanted);
            api.replace(CONFIGMAP_NAME, &PostParams::default(), &cm)
                .await
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(CONFIGMAP_NAME.to_owned()),
                    namespace: Some(name.clone()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/managed-by".to_owned(),
                        "dubbo-cp".to_owned(),
                    )])),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(CONFIGMAP_KEY.to_owned(), wanted)])),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm).await
        }
    };
    result.map_err(error)?;
    context.stats.writes.inc();
    tracing::debug!(namespace = %name, "published {CONFIGMAP_NAME}");
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Namespace>, error: &PublishError, context: Arc<Context>) -> Action {
    context.stats.failures.inc();
    tracing::warn!(%error, "cannot publish the CA roots; retrying");
    Action::requeue(RETRY)
}
