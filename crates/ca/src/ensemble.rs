//! ZooKeeper mode: the roots shared by every replica on the ensemble, as Kubernetes mode shares
//! them through Secret `dubbo-ca-secret`. The first replica creates them, the others read them,
//! a rotation is a compare-and-set on the node's version, and every replica follows the node
//! with a data watch.
//!
//! The node holds the signing key, so it is created with ZooKeeper's `auth` ACL: only sessions
//! authenticated as its creator (dubbo-cp's `zookeeper.auth` identity) may read or change it.
//! Without that identity the roots are not put in the ensemble at all (see the server's wiring).

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use zookeeper_client::{Acl, Acls, Client, CreateMode, Error, Permission};

use super::store::{CaStoreError, StoredRoots};

/// Everything of the CA's in the ensemble, beside the rule and mapping trees (a name no
/// Kubernetes namespace can have, so it never reads as one). Changed only by dubbo-cp's
/// identity: ZooKeeper checks a delete or create against the parent's ACL, so an open
/// directory would let anyone replace the roots node with a root of their own.
pub const DIR: &str = "/dubbo-cp/.ca";
/// The directory above it, open as dubbo-cp's other nodes are.
const PARENT: &str = "/dubbo-cp";
/// [`DIR`]'s ACL: dubbo-cp's identity may do anything, everyone may list it.
static GUARDED: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];
/// The roots and the signing key.
pub const ROOTS_NODE: &str = "/dubbo-cp/.ca/roots";
/// Longest wait for a session when the roots are needed.
const SESSION_WAIT: Duration = Duration::from_secs(10);
/// Pause before the watch is armed again after a failure.
const REARM: Duration = Duration::from_millis(500);

/// The node's content: the same four PEM fields and flag as the Secret's keys.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Node {
    cert_pem: String,
    key_pem: String,
    #[serde(default)]
    retiring_pem: String,
    #[serde(default)]
    cross_pem: String,
    #[serde(default = "managed")]
    managed: bool,
}

fn managed() -> bool {
    true
}

/// The roots in the ensemble, through the current session of ZooKeeper mode.
pub struct EnsembleRoots {
    sessions: watch::Receiver<Option<Client>>,
}

fn unavailable(err: impl std::fmt::Display) -> CaStoreError {
    CaStoreError::Unavailable(format!("ZooKeeper {ROOTS_NODE}: {err}"))
}

/// What a failed call means for the roots: a refusal names the identity to fix; anything else
/// is the ensemble not answering (the cached roots are served meanwhile).
fn failed(err: Error) -> CaStoreError {
    match err {
        Error::NoAuth | Error::InvalidAcl | Error::AuthFailed => CaStoreError::Unmanaged(format!(
            "ZooKeeper refuses {ROOTS_NODE} to this replica ({err}): every replica must \
             authenticate as the identity that created it (zookeeper.auth, the same file on every replica)"
        )),
        err => unavailable(err),
    }
}

fn encode(roots: &StoredRoots) -> Vec<u8> {
    let node = Node {
        cert_pem: roots.cert_pem.clone(),
        key_pem: roots.key_pem.clone(),
        retiring_pem: roots.retiring_pem.clone(),
        cross_pem: roots.cross_pem.clone(),
        managed: roots.managed,
    };
    serde_json::to_vec(&node).unwrap_or_default()
}

fn decode(data: &[u8]) -> Result<StoredRoots, CaStoreError> {
    let node: Node = serde_json::from_slice(data).map_err(|e| {
        CaStoreError::Unmanaged(format!("ZooKeeper {ROOTS_NODE} is not the CA's roots: {e}"))
    })?;
    Ok(StoredRoots {
        cert_pem: node.cert_pem,
        key_pem: node.key_pem,
        retiring_pem: node.retiring_pem,
        cross_pem: node.cross_pem,
        managed: node.managed,
    })
}

impl EnsembleRoots {
    /// `sessions`: ZooKeeper mode's sessions (authenticated with `zookeeper.auth`).
    pub fn new(sessions: watch::Receiver<Option<Client>>) -> EnsembleRoots {
        EnsembleRoots { sessions }
    }

    async fn client(&self) -> Result<Client, CaStoreError> {
        let mut sessions = self.sessions.clone();
        let wait = sessions.wait_for(Option::is_some);
        match tokio::time::timeout(SESSION_WAIT, wait).await {
            Ok(Ok(client)) => client.clone().ok_or_else(|| unavailable("no session")),
            _ => Err(unavailable(format!("no session within {SESSION_WAIT:?}"))),
        }
    }

    /// Makes [`DIR`] exist with [`GUARDED`], taking it back if it was left open (by an older
    /// version, or by someone else first); refuses when it is guarded by another identity.
    async fn guard(&self, client: &Client) -> Result<(), CaStoreError> {
        let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
        match client.mkdir(PARENT, &open).await {
            Ok(()) | Err(Error::NodeExists) => {}
            Err(err) => return Err(failed(err)),
        }
        let guarded = CreateMode::Persistent.with_acls(Acls::new(&GUARDED));
        match client.create(DIR, &[], &guarded).await {
            Ok(_) => return Ok(()),
            Err(Error::NodeExists) => {}
            Err(err) => return Err(failed(err)),
        }
        let (acls, _) = client.get_acl(DIR).await.map_err(failed)?;
        if acls.iter().all(|acl| {
            acl.scheme() == "digest"
                || (acl.scheme() == "world" && acl.permission() == Permission::READ)
        }) {
            return Ok(());
        }
        tracing::warn!(
            node = DIR,
            "the CA's directory in the ensemble was open to anyone; closing it to dubbo-cp's identity"
        );
        client.set_acl(DIR, &GUARDED, None).await.map_err(failed)?;
        Ok(())
    }

    /// The roots and the node's version; `None` when there are none yet. A node that anyone
    /// but dubbo-cp's identity may read or change is refused, not used.
    pub async fn read(&self) -> Result<Option<(StoredRoots, String)>, CaStoreError> {
        let client = self.client().await?;
        self.guard(&client).await?;
        let (data, stat) = match client.get_data(ROOTS_NODE).await {
            Ok(read) => read,
            Err(Error::NoNode) => return Ok(None),
            Err(err) => return Err(failed(err)),
        };
        let (acls, _) = client.get_acl(ROOTS_NODE).await.map_err(failed)?;
        if let Some(open) = acls.iter().find(|acl| acl.scheme() != "digest") {
            return Err(CaStoreError::Unmanaged(format!(
                "ZooKeeper {ROOTS_NODE} is not dubbo-cp's: its ACL lets {}:{} {} it, so anyone \
                 could read the signing key or replace the root. Delete the node with \
                 zookeeper.auth's identity; the next replica to start creates it",
                open.scheme(),
                open.id(),
                open.permission()
            )));
        }
        Ok(Some((decode(&data)?, stat.version.to_string())))
    }

    /// The roots in the ensemble, created from `generate` by the first replica to get there.
    pub async fn load_or_create(
        &self,
        generate: impl Fn() -> Result<StoredRoots, super::authority::RootError>,
    ) -> Result<(StoredRoots, String), CaStoreError> {
        if let Some(found) = self.read().await? {
            return Ok(found);
        }
        let roots = generate()?;
        match self.write(&roots, None).await {
            Ok(written) => {
                tracing::info!(node = ROOTS_NODE, "created the CA root in the ensemble");
                Ok(written)
            }
            // Another replica created them first: use theirs.
            Err(CaStoreError::Conflict) => self
                .read()
                .await?
                .ok_or_else(|| unavailable("created by another replica, then gone")),
            Err(err) => Err(err),
        }
    }

    /// Writes `roots` if the node is still at `expected` (`None`: if there is no node).
    pub async fn write(
        &self,
        roots: &StoredRoots,
        expected: Option<String>,
    ) -> Result<(StoredRoots, String), CaStoreError> {
        let client = self.client().await?;
        let data = encode(roots);
        let version = match expected.map(|v| v.parse::<i32>()) {
            Some(Ok(version)) => match client.set_data(ROOTS_NODE, &data, Some(version)).await {
                Ok(stat) => stat.version,
                Err(Error::BadVersion | Error::NoNode) => return Err(CaStoreError::Conflict),
                Err(err) => return Err(failed(err)),
            },
            Some(Err(_)) => return Err(CaStoreError::Conflict),
            None => {
                self.guard(&client).await?;
                // Only sessions authenticated as this one's identity may read the key.
                let secret = CreateMode::Persistent.with_acls(Acls::creator_all());
                match client.create(ROOTS_NODE, &data, &secret).await {
                    Ok((stat, _)) => stat.version,
                    Err(Error::NodeExists) => return Err(CaStoreError::Conflict),
                    Err(err) => return Err(failed(err)),
                }
            }
        };
        Ok((roots.clone(), version.to_string()))
    }

    /// A notification each time the node may have changed (and once the watch is first set):
    /// a data watch armed again after each event, each reconnection and each new session.
    pub fn changes(&self) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel(1);
        let mut sessions = self.sessions.clone();
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    client = sessions.wait_for(Option::is_some) => match client {
                        Ok(client) => client.clone(),
                        Err(_) => return,
                    },
                    () = tx.closed() => return,
                };
                let Some(client) = client else { continue };
                let armed = client.check_and_watch_stat(ROOTS_NODE).await;
                // Armed before the reader looks, so no change falls between the two.
                match tx.try_send(()) {
                    Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                    Err(mpsc::error::TrySendError::Closed(())) => return,
                }
                match armed {
                    Ok((_, watcher)) => {
                        let event = tokio::select! {
                            event = watcher.changed() => event,
                            () = tx.closed() => return,
                        };
                        if event.event_type == zookeeper_client::EventType::Session {
                            // The session ended: wait for the next one.
                            pause(&tx).await;
                        }
                    }
                    Err(_) => pause(&tx).await,
                }
            }
        });
        rx
    }
}

/// [`REARM`], or less when nobody listens any more.
async fn pause(tx: &mpsc::Sender<()>) {
    tokio::select! {
        () = tokio::time::sleep(REARM) => {}
        () = tx.closed() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_reads_back_what_was_written() {
        let roots = StoredRoots {
            cert_pem: "cert".into(),
            key_pem: "key".into(),
            retiring_pem: "old".into(),
            cross_pem: String::new(),
            managed: true,
        };
        assert_eq!(decode(&encode(&roots)).unwrap(), roots);
        assert!(decode(b"not json").is_err());
    }
}
