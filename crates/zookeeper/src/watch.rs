//! One persistent recursive watch on the whole tree (ZooKeeper 3.6+), feeding the index.
//!
//! At every new session, and after every reconnection (events during a connection loss can be
//! lost, ZOOKEEPER-4698), everything is listed and read again and the index reset to it. Between
//! re-lists each node event names a path; the paths of a burst are merged by the debouncer, read
//! once each, and applied in one batch per kind.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Mutex, mpsc, watch};
use zookeeper_client::{AddWatchMode, Client, Error, EventType, SessionState};

use crate::debounce::{Batch, DebounceConfig, Merge};
use crate::index::catalog::Catalog;
use crate::index::{Index, Kind, Resource, SourceCondition, SourceProblem};
use crate::layout::{self, OURS, SERVICES};
use crate::mapping::client_key;
use crate::session::Session;
use crate::state::{Changes, Read, State};
use crate::stats::ZkStats;
use crate::view::ZkView;

/// Node reads in flight at once during a re-list.
const PARALLEL_READS: usize = 64;
/// Paths one batch may name before it becomes a re-list (a burst that large is cheaper read
/// whole, and the set stays bounded).
const MAX_PENDING_PATHS: usize = 10_000;
/// How long a failed batch waits before the whole tree is read again.
const RETRY: Duration = Duration::from_secs(1);

/// What the watch has to read next.
#[derive(Debug, Default)]
pub struct Pending {
    paths: BTreeSet<String>,
    relist: bool,
}

impl Pending {
    fn relist() -> Self {
        Pending {
            paths: BTreeSet::new(),
            relist: true,
        }
    }

    fn path(path: String) -> Self {
        Pending {
            paths: BTreeSet::from([path]),
            relist: false,
        }
    }
}

impl Merge for Pending {
    fn merge(&mut self, other: Self) {
        self.relist |= other.relist;
        if self.relist || self.paths.len() + other.paths.len() > MAX_PENDING_PATHS {
            self.relist = true;
            self.paths.clear();
        } else {
            self.paths.extend(other.paths);
        }
    }
}

/// Where the watch puts what it reads.
pub struct Sinks {
    pub index: Arc<Index>,
    pub catalog: Arc<Catalog>,
    pub view: Arc<ZkView>,
    /// Auth policies in this namespace reach every client.
    pub root_namespace: String,
}

/// Runs the watch until shutdown.
pub async fn run(
    session: Arc<Session>,
    sinks: Sinks,
    debounce: DebounceConfig,
    shutdown: watch::Receiver<bool>,
) {
    let (tx, rx) = mpsc::channel::<Pending>(1024);
    let retry = tx.downgrade();
    let events = tokio::spawn(events(session.clone(), tx, shutdown));
    let state = Arc::new(Mutex::new(State::default()));
    let sinks = Arc::new(sinks);
    crate::debounce::run(debounce, rx, |batch: Batch<Pending>| {
        let (session, sinks, state, retry) =
            (session.clone(), sinks.clone(), state.clone(), retry.clone());
        async move {
            let mut state = state.lock().await;
            if let Err(err) = flush(&session, &sinks, &mut state, batch.value).await {
                tracing::warn!(error = %err, "ZooKeeper read failed; reading everything again");
                session.stats().error(format!("read: {err}"));
                fail(&sinks.index, &err.to_string());
                // Read everything again once the session is back (the loss may have hidden events).
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY).await;
                    if let Some(tx) = retry.upgrade() {
                        let _ = tx.send(Pending::relist()).await;
                    }
                });
            }
        }
    })
    .await;
    let _ = events.await;
}

/// Says on every kind why the source is not in sync (readiness and `/debug/sources` show it).
fn fail(index: &Index, error: &str) {
    for kind in Kind::ALL {
        index.set_condition(
            kind,
            Some(SourceCondition {
                problem: SourceProblem::Failing,
                message: format!("ZooKeeper: {error}"),
            }),
        );
    }
}

/// The session's node events as paths to read, and a re-list at each (re)connection.
///
/// The watch is added again after every reconnection, not only with a new session: the client
/// (zookeeper-client 0.11) re-sends only one-shot watches when it reconnects a session that
/// survived, so a persistent watch would silently stop across an ensemble restart. Adding it
/// again is idempotent on the server; the re-list that follows covers what happened meanwhile.
async fn events(
    session: Arc<Session>,
    tx: mpsc::Sender<Pending>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut sessions = session.subscribe();
    let mut watched = None;
    loop {
        // A session other than the one whose watch ended.
        let client = tokio::select! {
            () = crate::shutdown::signalled(&mut shutdown) => return,
            client = sessions.wait_for(|c| c.as_ref().is_some_and(|c| Some(c.session_id()) != watched)) => match client {
                Ok(client) => client.clone(),
                Err(_) => return,
            },
        };
        let Some(client) = client else { continue };
        watched = Some(client.session_id());
        match watch_session(&session, &client, &tx, &mut shutdown).await {
            SessionEnd::Shutdown => return,
            SessionEnd::Ended => {}
            // The same session may work again; forget it so the loop takes it once more.
            SessionEnd::Retry => {
                watched = None;
                tokio::select! {
                    () = crate::shutdown::signalled(&mut shutdown) => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    }
}

/// How watching one session ended.
enum SessionEnd {
    /// Shutdown, or nobody reads the paths any more.
    Shutdown,
    /// The session is over; wait for the next.
    Ended,
    /// The watch could not be added; try this session again after a pause.
    Retry,
}

/// Watches `client`'s session until it ends: the watch added (again at each reconnection), then
/// a re-list, then node events as paths.
async fn watch_session(
    session: &Session,
    client: &Client,
    tx: &mpsc::Sender<Pending>,
    shutdown: &mut watch::Receiver<bool>,
) -> SessionEnd {
    let stats = session.stats();
    let mut watcher = match client.watch("/", AddWatchMode::PersistentRecursive).await {
        Ok(watcher) => watcher,
        Err(err) => {
            tracing::warn!(error = %err, "cannot watch ZooKeeper; trying again");
            stats.error(format!("watch: {err}"));
            return SessionEnd::Retry;
        }
    };
    loop {
        if tx.send(Pending::relist()).await.is_err() {
            return SessionEnd::Shutdown;
        }
        // Node events until the connection comes back (or the session ends).
        loop {
            let event = tokio::select! {
                () = crate::shutdown::signalled(shutdown) => return SessionEnd::Shutdown,
                event = watcher.changed() => event,
            };
            let pending = match event.event_type {
                EventType::Session => match event.session_state {
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => break,
                    SessionState::Disconnected => continue,
                    // Terminal: the watcher must not be asked again; a new session comes.
                    _ => return SessionEnd::Ended,
                },
                _ => {
                    ZkStats::count(&stats.watch_events);
                    // Consumers, metadata, other systems' nodes: nothing to read.
                    if matches!(layout::classify(&event.path), layout::Node::Other) {
                        continue;
                    }
                    Pending::path(event.path)
                }
            };
            if tx.send(pending).await.is_err() {
                return SessionEnd::Shutdown;
            }
        }
        // Reconnected: add the watch again before the re-list, so nothing written after the
        // re-list's reads goes unheard. The old watcher goes only once the new one is in place
        // (dropping it then asks the server to remove nothing: the path is still watched).
        ZkStats::count(&stats.rewatches);
        loop {
            match client.watch("/", AddWatchMode::PersistentRecursive).await {
                Ok(again) => {
                    watcher = again;
                    break;
                }
                Err(err) if session_over(&err) => return SessionEnd::Ended,
                Err(err) => {
                    // Disconnected again before the watch was added: the re-list waits for the
                    // next attempt, as a re-list without the watch would miss what follows.
                    tracing::warn!(error = %err, "cannot watch ZooKeeper again after reconnecting; retrying");
                    stats.error(format!("watch after reconnecting: {err}"));
                    tokio::select! {
                        () = crate::shutdown::signalled(shutdown) => return SessionEnd::Shutdown,
                        () = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }
}

/// Whether `err` says this session can do nothing more.
fn session_over(err: &Error) -> bool {
    matches!(
        err,
        Error::SessionExpired | Error::ClientClosed | Error::AuthFailed
    )
}

/// Reads what `pending` names and applies it.
async fn flush(
    session: &Session,
    sinks: &Sinks,
    state: &mut State,
    pending: Pending,
) -> Result<(), Error> {
    let client = session.client().ok_or(Error::ConnectionLoss)?;
    if pending.relist {
        return relist(session, &client, sinks, state).await;
    }
    let reads = read_all(&client, pending.paths.into_iter().collect()).await?;
    let mut changes = Changes::default();
    for (path, read) in reads {
        state.set(&path, read, &mut changes);
    }
    for (rule, removed) in &changes.rules {
        match (rule, removed) {
            (Some(rule), _) => sinks.catalog.upsert(rule.clone()),
            (None, Some(key)) => sinks.catalog.remove(key),
            (None, None) => {}
        }
    }
    State::rule_changes(&mut changes, &sinks.root_namespace);
    for (kind, kind_changes) in std::mem::take(&mut changes.by_kind) {
        sinks.index.apply(kind, kind_changes, 0);
    }
    // The outbox's view follows the mapping nodes.
    for key in &changes.mapping_nodes {
        sinks
            .view
            .set(key, state.mapping_node(key).unwrap_or_default());
    }
    if changes.services_changed {
        publish_services(sinks, state);
    }
    // The count follows every batch, not only re-lists.
    session.stats().update(|s| {
        s.unreadable = state.unreadable.clone();
        s.watched_nodes = state.node_count();
    });
    Ok(())
}

/// Providers as the index's services (the index keeps those that did not change as they were).
/// Of two applications whose names make one service name, the first keeps it, as before the
/// kind existed.
fn publish_services(sinks: &Sinks, state: &State) {
    let mut services = std::collections::BTreeMap::new();
    for service in state.services() {
        services
            .entry(client_key(&service.name, &service.namespace))
            .or_insert(Resource::Service(service));
    }
    sinks.index.reset(Kind::Service, services, 0);
}

/// Lists and reads the whole tree, and makes the index exactly that.
async fn relist(
    session: &Session,
    client: &Client,
    sinks: &Sinks,
    state: &mut State,
) -> Result<(), Error> {
    ZkStats::count(&session.stats().relists);
    let (paths, skipped) = list_all(client).await?;
    let reads = read_all(client, paths).await?;
    let mut fresh = State::after(state);
    let mut ignored = Changes::default();
    fresh.nodes_read = reads.len();
    for (path, why) in skipped {
        fresh.set(&path, Read::Failed(why), &mut ignored);
    }
    for (path, read) in reads {
        fresh.set(&path, read, &mut ignored);
    }
    fresh.drop_unused_names();
    *state = fresh;
    for (kind, upserts) in state.everything(&sinks.root_namespace) {
        sinks.index.reset_changes(kind, upserts, 0);
    }
    for kind in crate::rules::RULE_KINDS {
        sinks
            .catalog
            .reset(kind, state.rules().filter(|r| r.kind() == kind).cloned());
        sinks.catalog.clear_invalid(kind);
    }
    sinks.view.reset(state.mapping_nodes());
    publish_services(sinks, state);
    for kind in Kind::ALL {
        sinks.index.set_condition(kind, None);
    }
    sinks.index.mark_all_loaded();
    crate::session::synced(session.stats(), state.node_count());
    session
        .stats()
        .update(|s| s.unreadable = state.unreadable.clone());
    tracing::info!(
        nodes = state.nodes_read,
        unreadable = state.unreadable.len(),
        "ZooKeeper listed"
    );
    Ok(())
}

/// Whether `err` says the session or the connection failed (the batch must be read again),
/// rather than something about one node (it is reported and skipped: an ACL'd node of another
/// system sharing the ensemble must not stop the rest).
fn session_failed(err: &Error) -> bool {
    matches!(
        err,
        Error::ConnectionLoss
            | Error::SessionExpired
            | Error::SessionMoved
            | Error::Timeout
            | Error::ClientClosed
            | Error::NoHosts
            | Error::AuthFailed
    )
}

/// The children of `path`; none when it does not exist or cannot be listed (reported).
async fn children(
    client: &Client,
    path: &str,
    skipped: &mut Vec<(String, String)>,
) -> Result<Vec<String>, Error> {
    match client.list_children(path).await {
        Ok(children) => Ok(children),
        Err(Error::NoNode) => Ok(Vec::new()),
        Err(err) if !session_failed(&err) => {
            skipped.push((path.to_owned(), format!("cannot be listed: {err}")));
            Ok(Vec::new())
        }
        Err(err) => Err(err),
    }
}

fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// One directory's children, and why it could not be listed if it could not.
type Listed = (String, Vec<String>, Option<String>);

/// Every path dubbo-cp reads (mapping, rule, our own, provider and instance nodes), sorted, and
/// the directories that could not be listed, with why.
async fn list_all(client: &Client) -> Result<(Vec<String>, Vec<(String, String)>), Error> {
    let mut skipped = Vec::new();
    // Directories whose children are the nodes, found level by level.
    let mut dirs: Vec<String> = Vec::new();
    for root in children(client, "/", &mut skipped).await? {
        let top = join("/", &root);
        if root == OURS {
            for namespace in children(client, &top, &mut skipped).await? {
                // The CA's own nodes (`/dubbo-cp/.ca`), which no namespace can be named.
                if namespace.starts_with('.') {
                    continue;
                }
                let ns_dir = join(&top, &namespace);
                for plural in children(client, &ns_dir, &mut skipped).await? {
                    dirs.push(join(&ns_dir, &plural));
                }
            }
        } else if root == SERVICES {
            for application in children(client, &top, &mut skipped).await? {
                dirs.push(join(&top, &application));
            }
        } else if layout::namespace_of_root(&root).is_some() {
            for child in children(client, &top, &mut skipped).await? {
                match child.as_str() {
                    "mapping" => dirs.push(join(&top, "mapping")),
                    "config" => dirs.push(format!("{top}/config/{}", layout::CONFIG_GROUP)),
                    "metadata" => {}
                    _ => dirs.push(format!("{top}/{child}/providers")),
                }
            }
        }
    }
    let listed: Vec<Result<Listed, Error>> = futures::stream::iter(dirs)
        .map(|dir| async move {
            let mut skipped = Vec::new();
            let names = children(client, &dir, &mut skipped).await?;
            Ok((dir, names, skipped.pop().map(|(_, why)| why)))
        })
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    let mut leaves: Vec<String> = Vec::new();
    for result in listed {
        let (dir, names, why) = result?;
        if let Some(why) = why {
            skipped.push((dir.clone(), why));
        }
        leaves.extend(names.iter().map(|name| join(&dir, name)));
    }
    leaves.retain(|path| !matches!(layout::classify(path), layout::Node::Other));
    leaves.sort();
    Ok((leaves, skipped))
}

/// Reads each path, in path order whatever order the answers came in (so every replica, and
/// every re-list, decides clashes alike), removals first.
async fn read_all(client: &Client, paths: Vec<String>) -> Result<Vec<(String, Read)>, Error> {
    let reads: Vec<Result<(String, Read), Error>> = futures::stream::iter(paths)
        .map(|path| async move {
            let read = match client.get_data(&path).await {
                Ok((data, stat)) => Read::Data(data, stat.ctime),
                Err(Error::NoNode) => Read::Absent,
                Err(err) if !session_failed(&err) => Read::Failed(err.to_string()),
                Err(err) => return Err(err),
            };
            Ok((path, read))
        })
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    let mut reads: Vec<(String, Read)> = reads.into_iter().collect::<Result<_, _>>()?;
    reads.sort_by(|(a, read_a), (b, read_b)| {
        let present = |read: &Read| !matches!(read, Read::Absent);
        (present(read_a), a).cmp(&(present(read_b), b))
    });
    Ok(reads)
}
