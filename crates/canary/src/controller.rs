//! The kube-runtime Controller for Canaries: one watch per kind shared between the triggers and
//! the reads (reflector stores), reconciles per Canary in parallel, and only while this control
//! plane holds the Lease.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::configs::{ConfigKind, references};
use super::crd::Canary;
use super::deployments::PRIMARY_SUFFIX;
use super::lease::Elector;
use super::reconcile::{Context, Settings, error_policy, reconcile};
use super::stats::CanaryStats;
use dubbo_cp_crds::{ConditionRoute, DynamicConfig};

/// Runs the controller whenever this process holds the lease, until `shutdown`; releases the
/// lease on the way out so another replica takes over at once.
///
/// The controller is dropped (in-flight reconciles cancelled, not finished) the moment the lease
/// is lost, or when renewals have failed for so long that another replica may already hold it:
/// two replicas must not drive the same Canary.
pub async fn run(
    client: kube::Client,
    elector: Elector,
    settings: Settings,
    stats: Arc<CanaryStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    // One call may take no longer than a renewal period (kube's own timeouts are minutes). A
    // call that times out failed; it does not say another control plane holds the lease: the
    // holder tries again soon and keeps driving until a renewal period before the lease would
    // expire (below), rather than dropping every reconcile in flight because the API server
    // was slow once.
    let attempt = |elector: &Elector| {
        let elector = elector.clone();
        async move {
            match tokio::time::timeout(elector.renew_every(), elector.try_acquire()).await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err(format!(
                    "no answer within {}",
                    humantime::format_duration(elector.renew_every())
                )),
            }
        }
    };
    loop {
        // Wait for the lease (or shutdown).
        let mut acquired_at;
        loop {
            if *shutdown.borrow() {
                return;
            }
            acquired_at = tokio::time::Instant::now();
            match attempt(&elector).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "canary lease: cannot read or take it"),
            }
            tokio::select! {
                () = tokio::time::sleep(elector.renew_every()) => {}
                _ = shutdown.changed() => {}
            }
        }
        tracing::info!(
            identity = elector.identity(),
            "canary lease held: driving Canaries"
        );
        let holding = async {
            // The lease runs from the start of the try that last renewed it (its renewTime is
            // taken then). Driving stops a renewal period before it would expire, on a timer,
            // whatever a try is doing: another replica may take it at expiry.
            let hold = elector.duration().saturating_sub(elector.renew_every());
            let mut valid_until = acquired_at + hold;
            let mut pause = elector.renew_every();
            loop {
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = tokio::time::sleep_until(valid_until) => break,
                    _ = shutdown.changed() => return,
                }
                if *shutdown.borrow() {
                    return;
                }
                let started = tokio::time::Instant::now();
                let outcome = tokio::select! {
                    outcome = attempt(&elector) => outcome,
                    () = tokio::time::sleep_until(valid_until) => break,
                };
                match outcome {
                    Ok(true) => {
                        valid_until = started + hold;
                        pause = elector.renew_every();
                    }
                    Ok(false) => {
                        tracing::warn!("canary lease lost to another control plane");
                        return;
                    }
                    Err(error) => {
                        // Soon again: one slow answer should not cost the lease.
                        tracing::warn!(%error, "canary lease: renewal failed");
                        pause = elector.renew_every() / 4;
                    }
                }
            }
            tracing::warn!("canary lease not renewed in time: stopping");
        };
        tokio::select! {
            () = drive(
                client.clone(),
                elector.identity().to_owned(),
                settings.clone(),
                stats.clone(),
            ) => {}
            () = holding => {}
        }
        if *shutdown.borrow() {
            match tokio::time::timeout(elector.renew_every(), elector.release()).await {
                Ok(Ok(())) => tracing::info!("canary lease released"),
                Ok(Err(error)) => tracing::warn!(%error, "canary lease: cannot release it"),
                Err(_) => tracing::warn!("canary lease: release timed out"),
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The controller itself; it runs until dropped (the lease holder drops it on loss or shutdown).
pub async fn drive(
    client: kube::Client,
    identity: String,
    settings: Settings,
    stats: Arc<CanaryStats>,
) {
    let (deployments, deployments_writer) = reflector::store::<Deployment>();
    let (pods, pods_writer) = reflector::store::<Pod>();
    let (configs, configs_writer) = reflector::store::<DynamicConfig>();
    let (routes, routes_writer) = reflector::store::<ConditionRoute>();
    let deployment_events = watcher(
        Api::<Deployment>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(deployments_writer)
    .touched_objects();
    let pod_events = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(pods_writer)
        .touched_objects();
    let config_events = watcher(
        Api::<DynamicConfig>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(configs_writer)
    .touched_objects();
    let route_events = watcher(
        Api::<ConditionRoute>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(routes_writer)
    .touched_objects();

    // Metadata only: versions are enough to notice a change, and no Secret data is held.
    let (config_maps, config_maps_writer) = reflector::store::<PartialObjectMeta<ConfigMap>>();
    let (secrets, secrets_writer) = reflector::store::<PartialObjectMeta<Secret>>();
    let config_map_events = watcher(
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(config_maps_writer)
    .touched_objects();
    let secret_events = watcher(
        Api::<PartialObjectMeta<Secret>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(secrets_writer)
    .touched_objects();

    let controller = Controller::new(
        Api::<Canary>::all(client.clone()),
        watcher::Config::default(),
    );
    let canaries = controller.store();
    // The bundle was checked at start (canary.caFile); the system's roots otherwise.
    let http = super::http::HttpClient::with_roots(settings.roots.as_deref()).unwrap_or_default();
    let alerts = super::notifier::Alerts::start(client.clone(), http.clone(), stats.clone());
    let ctx = Arc::new(Context {
        events: super::events::Events::new(client.clone(), &identity),
        client,
        deployments: deployments.clone(),
        pods,
        configs,
        routes,
        config_maps,
        secrets,
        prometheus: super::prometheus::Prometheus::new(http.clone()),
        alerts,
        http,
        settings,
        stats,
        written: Default::default(),
    });
    let by_deployment = canaries.clone();
    let by_pod = (canaries.clone(), deployments.clone());
    let by_config_map = (canaries.clone(), deployments.clone());
    let by_secret = (canaries.clone(), deployments.clone());
    let controller = controller
        .watches_stream(deployment_events, move |d: Deployment| {
            for_deployment(&by_deployment, &d)
        })
        .watches_stream(pod_events, move |pod: Pod| {
            for_pod(&by_pod.0, &by_pod.1, &pod)
        })
        .watches_stream(config_events, |config: DynamicConfig| {
            let namespace = config.namespace().unwrap_or_default();
            config
                .name_any()
                .strip_suffix("-canary")
                .map(|name| ObjectRef::new(name).within(&namespace))
        })
        .watches_stream(route_events, |route: ConditionRoute| {
            let namespace = route.namespace().unwrap_or_default();
            route
                .name_any()
                .strip_suffix("-canary")
                .map(|name| ObjectRef::new(name).within(&namespace))
        })
        .watches_stream(
            config_map_events,
            move |object: PartialObjectMeta<ConfigMap>| {
                for_config(
                    &by_config_map.0,
                    &by_config_map.1,
                    ConfigKind::ConfigMap,
                    &object.metadata,
                )
            },
        )
        .watches_stream(secret_events, move |object: PartialObjectMeta<Secret>| {
            for_config(
                &by_secret.0,
                &by_secret.1,
                ConfigKind::Secret,
                &object.metadata,
            )
        });
    let results = controller.run(reconcile, error_policy, ctx);
    tokio::pin!(results);
    while let Some(result) = results.next().await {
        if let Err(error) = result {
            tracing::debug!(%error, "canary controller");
        }
    }
}

/// The Canaries a Deployment event concerns: those targeting it or its primary.
fn for_deployment(canaries: &Store<Canary>, deployment: &Deployment) -> Vec<ObjectRef<Canary>> {
    let namespace = deployment.namespace();
    let name = deployment.name_any();
    let target = name.strip_suffix(PRIMARY_SUFFIX).unwrap_or(&name);
    canaries
        .state()
        .iter()
        .filter(|c| c.namespace() == namespace && c.spec.target_ref.name == target)
        .map(|c| ObjectRef::from(c.as_ref()))
        .collect()
}

/// The Canaries whose target uses a changed ConfigMap or Secret.
fn for_config(
    canaries: &Store<Canary>,
    deployments: &Store<Deployment>,
    kind: ConfigKind,
    metadata: &kube::api::ObjectMeta,
) -> Vec<ObjectRef<Canary>> {
    let namespace = metadata.namespace.clone().unwrap_or_default();
    let used = (kind, metadata.name.clone().unwrap_or_default());
    canaries
        .state()
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|c| {
            deployments
                .get(&ObjectRef::new(&c.spec.target_ref.name).within(&namespace))
                .is_some_and(|target| references(&target.spec.template).contains(&used))
        })
        .map(|c| ObjectRef::from(c.as_ref()))
        .collect()
}

/// The Canaries a pod event concerns: those whose target or primary selects it.
fn for_pod(
    canaries: &Store<Canary>,
    deployments: &Store<Deployment>,
    pod: &Pod,
) -> Vec<ObjectRef<Canary>> {
    let namespace = pod.namespace().unwrap_or_default();
    let labels = pod.labels();
    let selects = |name: &str| {
        deployments
            .get(&ObjectRef::new(name).within(&namespace))
            .and_then(|d| d.spec.selector.match_labels.clone())
            .is_some_and(|selector| {
                !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
    };
    canaries
        .state()
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|c| {
            let target = &c.spec.target_ref.name;
            selects(target) || selects(&format!("{target}{PRIMARY_SUFFIX}"))
        })
        .map(|c| ObjectRef::from(c.as_ref()))
        .collect()
}
