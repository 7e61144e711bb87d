//! Kubernetes-mode controllers: the expiry of applications whose pods are gone and the canary
//! controller.

use anyhow::Context as _;

use super::*;

/// Kubernetes mode with pod-bound tokens: applications whose registering pods are gone leave
/// their mappings after `mapping.expireAfter`. Without pod identities nothing can expire.
pub(super) fn start_expiry(
    config: &Config,
    source: &Source,
    cluster: Option<(&kube::Client, Arc<PodView>)>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) {
    let (Some((client, pods)), Some((_, outbox)), MappingSource::Cluster(view)) =
        (cluster, &source.kube, &source.mappings)
    else {
        return;
    };
    if config.mapping.expire_after.is_zero() {
        tracing::info!("mapping.expireAfter is 0: applications never expire");
        return;
    }
    let expiry = k8s::expiry::Expiry::new(
        client.clone(),
        view.clone(),
        pods,
        outbox.clone(),
        config.mapping.expire_after,
    );
    expiry.stats().register_metrics(registry);
    let run = expiry.run(tasks.shutdown_receiver());
    tasks.spawn("mapping expiry", async move {
        run.await;
        Ok(())
    });
}

/// What the index serves of a DynamicConfig, for runs that wait for their own weights.
fn served_config(index: Arc<Index>) -> crate::canary::reconcile::ServedConfig {
    crate::canary::reconcile::ServedConfig(Arc::new(move |namespace: &str, name: &str| {
        let state = index.current(Kind::DynamicConfig);
        let object = state.objects.get(&format!("{name}/{namespace}"))?;
        match &object.value {
            crate::index::Resource::Rule(crate::rules::RuleSpec::DynamicConfig(spec)) => {
                Some(spec.clone())
            }
            _ => None,
        }
    }))
}

/// Kubernetes mode: the canary controller, behind its Lease.
pub(super) fn start_canaries(
    config: &Config,
    index: &Arc<Index>,
    client: &kube::Client,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<()> {
    let settings = &config.canary;
    if !settings.enabled {
        return Ok(());
    }
    let roots = match &settings.ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .with_context(|| format!("canary.caFile {}: cannot read it", path.display()))?;
            crate::canary::http::HttpClient::with_roots(Some(&pem))
                .with_context(|| format!("canary.caFile {}", path.display()))?;
            Some(pem)
        }
        None => None,
    };
    let identity = settings.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "dubbo-cp".to_owned());
        format!("{host}-{}", std::process::id())
    });
    let elector = crate::canary::lease::Elector::new(
        client.clone(),
        &settings.lease_namespace,
        "dubbo-cp-canary",
        &identity,
        settings.lease_duration,
    );
    let stats = Arc::new(crate::canary::stats::CanaryStats::default());
    stats.register_metrics(registry);
    let run = crate::canary::controller::run(
        client.clone(),
        elector,
        crate::canary::reconcile::Settings {
            prometheus: settings.prometheus.clone(),
            query_timeout: settings.query_timeout,
            roots,
            served_config: Some(served_config(index.clone())),
            hold_settle: config.debounce.max + config.xds.debounce,
        },
        stats,
        tasks.shutdown_receiver(),
    );
    tasks.spawn("canary controller", async move {
        run.await;
        Ok(())
    });
    Ok(())
}
