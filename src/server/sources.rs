//! Where the state comes from: the embedded store, the rule table and directory, or the
//! Kubernetes API (writer, watches, outbox).

use super::*;

/// Standalone: the embedded store is the truth; its change feed is debounced into the index.
pub(super) async fn open_store(
    config: &Config,
    metrics: &Arc<Metrics>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<Source> {
    let (changes_tx, changes) = mpsc::channel::<StoredChange>(CHANGE_FEED_CAPACITY);
    let data_dir = config.data_dir.clone();
    let limits = store_limits(config);
    let (store, writer) =
        tokio::task::spawn_blocking(move || Store::open(&data_dir, limits, changes_tx))
            .await
            .context("store open task failed")?
            .with_context(|| format!("cannot open the store in {}", config.data_dir.display()))?;
    let index = Arc::new(Index::new(store.opened_revision()));
    let catalog = Arc::new(Catalog::default());
    let rules = open_rules(config, &index, &catalog, store.opened_revision()).await?;
    // Applied before the index is marked loaded: clients never see a state without it.
    start_rules_dir(config, rules.clone(), &catalog, registry, tasks, true).await?;
    store::load_index(&store, &index);
    tracing::info!(
        mappings = index.current(Kind::ServiceNameMapping).objects.len(),
        revision = store.opened_revision(),
        data_dir = %config.data_dir.display(),
        "store opened"
    );
    let publish = store::publish(
        config.debounce,
        changes,
        store.clone(),
        index.clone(),
        metrics.clone(),
    );
    tasks.spawn("store publisher", async move {
        publish.await;
        Ok(())
    });
    Ok(Source {
        index,
        durable: Durable::Store(store.clone()),
        writer,
        mappings: MappingSource::Store(store),
        kube: None,
        catalog,
        standalone_rules: Some(rules),
        zookeeper: None,
    })
}

/// `--rules-dir`: watched first (so a change during the first apply is not missed), applied, and
/// applied again on every change. With `at_once` the first apply is done before this returns
/// (standalone: before the index is loaded); otherwise in the task (ZooKeeper: it waits for a
/// session).
pub(super) async fn start_rules_dir(
    config: &Config,
    rules: Arc<dyn store::rules_dir::DirRules>,
    catalog: &Arc<Catalog>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
    at_once: bool,
) -> anyhow::Result<()> {
    let Some(dir) = config.rules.dir.clone() else {
        return Ok(());
    };
    let watching = store::rules_dir::watch(&dir)?;
    let state = store::rules_dir::DirState::default();
    state.stats().register_metrics(registry);
    let first = {
        let (rules, catalog, dir) = (rules.clone(), catalog.clone(), dir.clone());
        move || {
            let mut state = state;
            let stored = store::rules_dir::apply_once(rules.as_ref(), &catalog, &dir, &mut state);
            (state, stored)
        }
    };
    let shutdown = tasks.shutdown_receiver();
    let catalog = catalog.clone();
    if at_once {
        let (state, stored) = tokio::task::spawn_blocking(first)
            .await
            .context("rules directory task failed")?;
        let reload = store::rules_dir::run(rules, catalog, dir, state, watching, stored, shutdown);
        tasks.spawn("rules directory", reload);
    } else {
        tasks.spawn("rules directory", async move {
            let (state, stored) = tokio::task::spawn_blocking(first)
                .await
                .context("rules directory task failed")?;
            store::rules_dir::run(rules, catalog, dir, state, watching, stored, shutdown).await
        });
    }
    Ok(())
}

/// Standalone rules: the store's rule table (same file, its own connection) into the index.
pub(super) async fn open_rules(
    config: &Config,
    index: &Arc<Index>,
    catalog: &Arc<Catalog>,
    revision: i64,
) -> anyhow::Result<Arc<StandaloneRules>> {
    let data_dir = config.data_dir.clone();
    let (store, rules) = tokio::task::spawn_blocking(move || RuleStore::open(&data_dir))
        .await
        .context("rule store open task failed")?
        .context("cannot open the rule store")?;
    tracing::info!(rules = rules.len(), "rules loaded");
    Ok(Arc::new(StandaloneRules::new(
        store,
        rules,
        index.clone(),
        catalog.clone(),
        config.rules.root_namespace.clone(),
        revision,
    )))
}

/// Kubernetes mode: registrations wait in the outbox until the per-key writer has put them in
/// the cluster; the watch of the objects is the only way into the index.
pub(super) async fn open_kubernetes(
    config: &Config,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<Source> {
    anyhow::ensure!(
        config.rules.dir.is_none(),
        "rules.dir (--rules-dir) is for standalone mode; in Kubernetes mode apply the manifests with kubectl"
    );
    let cluster = Arc::new(ClusterView::default());
    let catalog = Arc::new(Catalog::default());
    let known = (cluster.applications(), cluster.registrants());
    let OpenOutbox {
        outbox,
        writer,
        changes,
        pending,
    } = open_outbox(config, known, registry).await?;
    let index = Arc::new(Index::new(outbox.opened_revision()));

    let kube_writer =
        k8s::writer::KubeWriter::new(client.clone(), config.kubernetes.writer, cluster.clone());
    let kube_writer = kube_writer.drain(config.kubernetes.writer);
    kube_writer.sink().register_metrics(registry);
    kube_writer.register_metrics(registry, k8s::writer::QUEUE_GAUGE);
    let shutdown = tasks.shutdown_receiver();
    start_drain(
        config,
        &kube_writer,
        (&outbox, pending, changes),
        metrics,
        tasks,
        "Kubernetes writer",
    );

    let watch_stats = Arc::new(WatchStats::default());
    watch_stats.register_metrics(registry);
    let mappings = Arc::new(MappingKind {
        cluster: cluster.clone(),
    });
    let watch = k8s::watch::run(
        mappings,
        client.clone(),
        index.clone(),
        config.debounce,
        metrics.clone(),
        watch_stats.clone(),
        shutdown,
    );
    tasks.spawn("ServiceNameMapping watch", async move {
        watch.await;
        Ok(())
    });
    // One watch per rule kind, through the same debounce stage; each marks its kind loaded
    // after its first list.
    for kind in crate::rules::RULE_KINDS {
        let watched = Arc::new(RuleKind {
            kind,
            catalog: catalog.clone(),
            root_namespace: config.rules.root_namespace.clone(),
        });
        let watch = k8s::watch::run(
            watched,
            client.clone(),
            index.clone(),
            config.debounce,
            metrics.clone(),
            watch_stats.clone(),
            tasks.shutdown_receiver(),
        );
        // Named by the plural, as `kubectl get` names them.
        tasks.spawn(kind.plural(), async move {
            watch.await;
            Ok(())
        });
    }
    // The cluster's Services and EndpointSlices, for xDS only: without it, none are read.
    if config.xds.enabled {
        let (client, index, shutdown) = (client.clone(), index.clone(), tasks.shutdown_receiver());
        tasks.spawn("Service and EndpointSlice watch", async move {
            k8s::services::run(client, index, shutdown).await;
            Ok(())
        });
    } else {
        index.mark_loaded(Kind::Service);
    }
    Ok(Source {
        index,
        durable: Durable::Outbox(outbox.clone()),
        writer,
        mappings: MappingSource::Cluster(cluster),
        kube: Some((kube_writer, outbox)),
        catalog,
        standalone_rules: None,
        zookeeper: None,
    })
}

/// The outbox's queue in front of the mode's truth: what was acknowledged but not written
/// before the last stop goes first, then what the change feed brings, merged by the debouncer.
pub(super) fn start_drain<S: store::drain::Sink>(
    config: &Config,
    drain: &Arc<store::drain::Drain<S>>,
    (outbox, pending, changes): (
        &Outbox,
        crate::mapping::MappingDelta,
        mpsc::Receiver<StoredChange>,
    ),
    metrics: &Arc<Metrics>,
    tasks: &mut Supervisor,
    name: &'static str,
) {
    drain.enqueue(pending);
    let run = drain.clone().run(outbox.clone(), tasks.shutdown_receiver());
    tasks.spawn(name, async move {
        run.await;
        Ok(())
    });
    let feed = store::drain::feed(config.debounce, changes, drain.clone(), metrics.clone());
    tasks.spawn("outbox feed", async move {
        feed.await;
        Ok(())
    });
}

/// An outbox opened in the data directory, with what it hands on.
pub(super) struct OpenOutbox {
    pub outbox: Outbox,
    pub writer: StoreWriter,
    /// Committed pairs, for the mode's write stage (through the debouncer).
    pub changes: mpsc::Receiver<StoredChange>,
    /// What was acknowledged but not written before the last stop: written first.
    pub pending: crate::mapping::MappingDelta,
}

/// Opens the outbox of Kubernetes and ZooKeeper modes: `known` is what the mode's watch sees
/// stored already (pairs there need no write).
pub(super) async fn open_outbox(
    config: &Config,
    known: (
        Arc<crate::mapping::SharedMappings>,
        Arc<crate::mapping::registrants::SharedRegistrants>,
    ),
    registry: &mut Registry,
) -> anyhow::Result<OpenOutbox> {
    let (changes_tx, changes) = mpsc::channel::<StoredChange>(CHANGE_FEED_CAPACITY);
    let data_dir = config.data_dir.clone();
    let limits = store_limits(config);
    let (outbox, writer) =
        tokio::task::spawn_blocking(move || Outbox::open(&data_dir, known, limits, changes_tx))
            .await
            .context("outbox open task failed")?
            .with_context(|| format!("cannot open the outbox in {}", config.data_dir.display()))?;
    outbox.register_metrics(registry);
    let backlog = outbox.pending();
    tracing::info!(pending = backlog.len(), data_dir = %config.data_dir.display(), "outbox opened");
    let mut pending = crate::mapping::MappingDelta::default();
    for (key, apps) in backlog {
        for app in apps {
            pending.add(key.clone(), app);
        }
    }
    Ok(OpenOutbox {
        outbox,
        writer,
        changes,
        pending,
    })
}

pub(super) fn store_limits(config: &Config) -> StoreLimits {
    StoreLimits {
        queue_capacity: config.ingest.queue_capacity,
        queue_bytes: config.ingest.queue_bytes,
        max_batch: config.ingest.max_batch,
        max_applications_per_key: config.ingest.max_applications_per_key,
        ..StoreLimits::default()
    }
}
