//! ZooKeeper mode: registrations wait in the outbox until the writer has put them in their
//! mapping nodes; one persistent recursive watch is the only way into the index, for mappings,
//! rules and providers (as services) alike, whoever wrote them.

use crate::zookeeper::watch::Sinks;
use crate::zookeeper::{Session, ZkRules, ZkStats, ZkView, ZkWriter};

use super::*;

/// What ZooKeeper mode hands the rest of the wiring.
pub(super) struct ZkParts {
    pub writer: Arc<crate::zookeeper::writer::ZkDrain>,
    pub outbox: Outbox,
    pub rules: Arc<ZkRules>,
    pub stats: Arc<ZkStats>,
    /// The session, for the CA's shared roots; `shares_roots` when it has an identity for them.
    pub session: Arc<Session>,
    pub shares_roots: bool,
}

/// Refuses, before it is acknowledged, a registration that names no node.
fn has_node(key: &crate::mapping::MappingKey) -> Result<(), String> {
    crate::zookeeper::layout::check_registration(&key.namespace, &key.interface)
        .map_err(|err| err.to_string())
}

pub(super) async fn open_zookeeper(
    config: &Config,
    metrics: &Arc<Metrics>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<Source> {
    let address = config
        .zookeeper
        .address
        .clone()
        .context("ZooKeeper mode needs zookeeper.address")?;
    let stats = Arc::new(ZkStats::new(&address));
    stats.register_metrics(registry);
    let credentials = config.zookeeper.credentials()?;
    let shares_roots = credentials.is_some();
    let session = Session::with_identity(
        &address,
        config.zookeeper.session_timeout,
        stats.clone(),
        credentials,
        config.zookeeper.read_only_acl()?,
    )?;
    tasks.spawn("ZooKeeper session", {
        let run = session.clone().run(tasks.shutdown_receiver());
        async move {
            run.await;
            Ok(())
        }
    });

    let view = Arc::new(ZkView::default());
    let catalog = Arc::new(Catalog::default());
    let known = (view.applications(), view.registrants());
    let OpenOutbox {
        outbox,
        writer,
        changes,
        pending,
    } = open_outbox(config, known, registry).await?;
    let index = Arc::new(Index::new(outbox.opened_revision()));

    let zk_writer = ZkWriter::drain(
        session.clone(),
        config.zookeeper.max_parallel_writes,
        config.zookeeper.parked_retry,
    );
    zk_writer.register_metrics(registry, crate::zookeeper::writer::QUEUE_GAUGE);
    start_drain(
        config,
        &zk_writer,
        (&outbox, pending, changes),
        metrics,
        tasks,
        "ZooKeeper writer",
    );

    let sinks = Sinks {
        index: index.clone(),
        catalog: catalog.clone(),
        view: view.clone(),
        root_namespace: config.rules.root_namespace.clone(),
    };
    let watch = crate::zookeeper::watch::run(
        session.clone(),
        sinks,
        config.debounce,
        tasks.shutdown_receiver(),
    );
    tasks.spawn("ServiceNameMapping watch", async move {
        watch.await;
        Ok(())
    });
    let rules = Arc::new(ZkRules::new(session.clone(), catalog.clone()));
    // The directory's objects are written to the ensemble; the watch serves them like any.
    start_rules_dir(config, rules.clone(), &catalog, registry, tasks, false).await?;
    Ok(Source {
        mappings: MappingSource::ZooKeeper(index.clone()),
        index,
        durable: Durable::Checked(outbox.clone(), has_node),
        writer,
        kube: None,
        catalog,
        standalone_rules: None,
        zookeeper: Some(ZkParts {
            writer: zk_writer,
            outbox,
            rules,
            stats,
            session,
            shares_roots,
        }),
    })
}
