//! ZooKeeper mode: do the replicas on one ensemble issue from roots they all trust? Each
//! replica keeps an ephemeral node under [`REPLICAS_DIR`] with the fingerprints it trusts (the
//! active one first) and reads its peers'. A replica whose root its peers do not trust (an
//! operator's `--ca-cert` on one replica only, or replicas without `zookeeper.auth`, each with a
//! root of its own) says so on `/readyz` and `/debug/sources`, never silently: workloads served
//! by different replicas would fail mTLS with "unable to get local issuer certificate".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ring::rand::SecureRandom;
use tokio::sync::watch;
use zookeeper_client::{Acls, Client, CreateMode, Error};

use super::authority::Bundle;

/// One ephemeral node per live replica, open to every replica (those without `zookeeper.auth`
/// too), so beside the CA's guarded directory, not in it.
pub const REPLICAS_DIR: &str = "/dubbo-cp/.fleet";
/// Peers read at most (a larger directory is not a fleet of ours).
const MAX_PEERS: usize = 256;
/// A peer's node read at most.
const MAX_NODE_BYTES: usize = 64 * 1024;
/// Looked at again this often even without an event.
const RECHECK: Duration = Duration::from_secs(30);
/// Pause after a failed round.
const RETRY: Duration = Duration::from_secs(1);

/// What one replica trusts, as its node holds it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Trust {
    /// Fingerprints, the active root first.
    roots: Vec<String>,
}

/// The fleet's agreement as this replica last saw it: `None` when every live peer trusts this
/// replica's root and it trusts theirs (or there is no peer), else why not.
#[derive(Clone)]
pub struct FleetView(watch::Receiver<Option<String>>);

impl FleetView {
    pub fn problem(&self) -> Option<String> {
        self.0.borrow().clone()
    }
}

/// Why the replica's roots and its peers' do not work together, if they do not.
fn disagreement(mine: &Trust, peers: &BTreeMap<String, Trust>) -> Option<String> {
    let active = mine.roots.first()?;
    let mut apart: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (peer, trust) in peers {
        let Some(theirs) = trust.roots.first() else {
            continue;
        };
        if !trust.roots.contains(active) || !mine.roots.contains(theirs) {
            apart
                .entry(theirs.as_str())
                .or_default()
                .push(peer.as_str());
        }
    }
    if apart.is_empty() {
        return None;
    }
    let short = |fingerprint: &str| fingerprint.get(..23).unwrap_or(fingerprint).to_owned();
    let others: Vec<String> = apart
        .iter()
        .map(|(root, replicas)| {
            format!(
                "{} ({} replica(s): {})",
                short(root),
                replicas.len(),
                replicas.join(", ")
            )
        })
        .collect();
    Some(format!(
        "the replicas on the ensemble do not trust each other's CA roots: this one issues from \
         {}, other replicas from {}; workloads they serve cannot verify each other. Give every \
         replica the same zookeeper.auth (one root shared through the ensemble) or the same \
         --ca-cert/--ca-key",
        short(active),
        others.join("; ")
    ))
}

fn trust_of(bundle: &Bundle) -> Trust {
    Trust {
        roots: bundle.trusted().map(|r| r.fingerprint.clone()).collect(),
    }
}

fn random_id() -> String {
    let mut bytes = [0u8; 8];
    // Failing randomness leaves a zero id; two such replicas would share a node, not crash.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts following the fleet; the task ends with `shutdown`.
pub fn start(
    sessions: watch::Receiver<Option<Client>>,
    bundles: watch::Receiver<Option<Arc<Bundle>>>,
    shutdown: watch::Receiver<bool>,
) -> (FleetView, impl std::future::Future<Output = ()> + Send) {
    let (tx, rx) = watch::channel(None);
    let name = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .map_or_else(random_id, |pod| format!("{pod}-{}", random_id()));
    (FleetView(rx), run(name, sessions, bundles, tx, shutdown))
}

async fn run(
    name: String,
    mut sessions: watch::Receiver<Option<Client>>,
    mut bundles: watch::Receiver<Option<Arc<Bundle>>>,
    problem: watch::Sender<Option<String>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let path = format!("{REPLICAS_DIR}/{name}");
    loop {
        let client = sessions.borrow_and_update().clone();
        let bundle = bundles.borrow_and_update().clone();
        let wait = match (client, bundle) {
            (Some(client), Some(bundle)) => {
                match round(&client, &path, &name, &trust_of(&bundle)).await {
                    Ok((seen, watcher)) => {
                        problem.send_if_modified(|old| {
                            let changed = *old != seen;
                            *old = seen;
                            changed
                        });
                        Some(watcher)
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "cannot compare the CA roots of the replicas yet");
                        None
                    }
                }
            }
            _ => None,
        };
        let delay = if wait.is_some() { RECHECK } else { RETRY };
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = sessions.changed() => {}
            _ = bundles.changed() => {}
            () = tokio::time::sleep(delay) => {}
            _ = async {
                match wait {
                    Some(watcher) => { watcher.changed().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
}

/// Puts this replica's trust in its node (anew when it changed) and reads every peer's; the
/// watcher fires when a replica comes or goes.
async fn round(
    client: &Client,
    path: &str,
    name: &str,
    mine: &Trust,
) -> Result<(Option<String>, zookeeper_client::OneshotWatcher), Error> {
    let data = serde_json::to_vec(mine).unwrap_or_default();
    let current = match client.get_data(path).await {
        Ok((held, _)) => Some(held),
        Err(Error::NoNode) => None,
        Err(err) => return Err(err),
    };
    if current.as_deref() != Some(data.as_slice()) {
        if current.is_some() {
            // Deleted and created again, so peers' child watches hear of the change.
            match client.delete(path, None).await {
                Ok(()) | Err(Error::NoNode) => {}
                Err(err) => return Err(err),
            }
        }
        let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
        match client.mkdir(REPLICAS_DIR, &open).await {
            Ok(()) | Err(Error::NodeExists) => {}
            Err(err) => return Err(err),
        }
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_read());
        match client.create(path, &data, &ephemeral).await {
            Ok(_) | Err(Error::NodeExists) => {}
            Err(err) => return Err(err),
        }
    }
    let (children, _, watcher) = client.get_and_watch_children(REPLICAS_DIR).await?;
    let mut peers = BTreeMap::new();
    for child in children.into_iter().filter(|c| c != name).take(MAX_PEERS) {
        match client.get_data(&format!("{REPLICAS_DIR}/{child}")).await {
            Ok((data, _)) if data.len() <= MAX_NODE_BYTES => {
                if let Ok(trust) = serde_json::from_slice::<Trust>(&data) {
                    peers.insert(child, trust);
                }
            }
            Ok(_) | Err(Error::NoNode) => {}
            Err(err) => return Err(err),
        }
    }
    Ok((disagreement(mine, &peers), watcher))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trust(roots: &[&str]) -> Trust {
        Trust {
            roots: roots.iter().map(|r| (*r).to_owned()).collect(),
        }
    }

    #[test]
    fn replicas_agree_when_each_trusts_the_others_root() {
        let mine = trust(&["A"]);
        let same = BTreeMap::from([("b".to_owned(), trust(&["A"]))]);
        assert_eq!(disagreement(&mine, &same), None);
        assert_eq!(disagreement(&mine, &BTreeMap::new()), None);
        // Mid-rotation: the new root issues, the old one is still trusted on both sides.
        let rotated = BTreeMap::from([("b".to_owned(), trust(&["B", "A"]))]);
        assert_eq!(disagreement(&trust(&["B", "A"]), &rotated), None);
        let foreign = BTreeMap::from([
            ("b".to_owned(), trust(&["X"])),
            ("c".to_owned(), trust(&["A"])),
        ]);
        let problem = disagreement(&mine, &foreign).unwrap();
        assert!(problem.contains("X (1 replica(s): b)"), "{problem}");
        assert!(problem.contains("zookeeper.auth"), "{problem}");
    }
}
