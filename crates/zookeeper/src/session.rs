//! The session with the ensemble: connected at start, watched, and replaced by a new one when it
//! expires (a terminal state for a ZooKeeper client). Everyone who talks to the ensemble takes
//! the current client from here; between sessions there is none and they wait or retry.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client::{Acls, Client, CreateMode, CreateOptions, SessionState};

use crate::config::Credentials;
use crate::stats::{ZkStats, now};

/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub struct Session {
    /// Hosts only (`host:port,host:port`).
    hosts: String,
    /// The chroot, `""` for none.
    chroot: String,
    timeout: Duration,
    current: watch::Sender<Option<Client>>,
    stats: Arc<ZkStats>,
    /// dubbo-cp's identity (`zookeeper.auth`), given at every connection.
    credentials: Option<Credentials>,
    /// Nodes dubbo-cp creates are read-only to everyone else (`zookeeper.acl: read`).
    read_only: bool,
}

/// Why a connect string is refused.
#[derive(Debug, thiserror::Error)]
#[error("zookeeper.address {address:?}: {reason}")]
pub struct AddressError {
    address: String,
    reason: &'static str,
}

impl Session {
    /// A session with `address` (`host:port[,host:port...][/chroot]`), not connected yet.
    pub fn new(
        address: &str,
        timeout: Duration,
        stats: Arc<ZkStats>,
    ) -> Result<Arc<Self>, AddressError> {
        Self::with_identity(address, timeout, stats, None, false)
    }

    /// A session that authenticates as `credentials` at every connection; with `read_only`, the
    /// nodes it creates may be changed by that identity alone (everyone may read them).
    pub fn with_identity(
        address: &str,
        timeout: Duration,
        stats: Arc<ZkStats>,
        credentials: Option<Credentials>,
        read_only: bool,
    ) -> Result<Arc<Self>, AddressError> {
        let refuse = |reason| AddressError {
            address: address.to_owned(),
            reason,
        };
        let address = address.trim().trim_start_matches("zookeeper://");
        let (hosts, chroot) = match address.find('/') {
            Some(i) => (&address[..i], address[i..].trim_end_matches('/')),
            None => (address, ""),
        };
        if chroot.split('/').skip(1).any(str::is_empty) && !chroot.is_empty() {
            return Err(refuse("the chroot has an empty segment (/a//b)"));
        }
        if hosts.is_empty() {
            return Err(refuse("names no host (host:port[,host:port...][/chroot])"));
        }
        for host in hosts.split(',') {
            let port = host.rsplit_once(':').map(|(_, port)| port);
            if port.is_none_or(|port| port.parse::<u16>().is_err()) {
                return Err(refuse("every host needs a port (host:port)"));
            }
        }
        Ok(Arc::new(Session {
            hosts: hosts.to_owned(),
            chroot: chroot.to_owned(),
            timeout,
            current: watch::Sender::new(None),
            stats,
            credentials,
            read_only,
        }))
    }

    /// How the directories above them are made: open to all, whatever `zookeeper.acl` says, as
    /// SDKs create their own nodes beside ours (`/dubbo/<interface>/providers/...`).
    pub fn parent_options(&self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(Acls::anyone_all())
    }

    /// How the mapping and rule nodes dubbo-cp creates are made: open to all (Dubbo SDKs read
    /// and write them), or with `zookeeper.acl: read`, readable by all and changed by this
    /// identity only.
    pub fn create_options(&self) -> CreateOptions<'static> {
        static READ_ONLY: std::sync::OnceLock<[zookeeper_client::Acl; 2]> =
            std::sync::OnceLock::new();
        if !self.read_only {
            return CreateMode::Persistent.with_acls(Acls::anyone_all());
        }
        let acls = READ_ONLY.get_or_init(|| {
            use zookeeper_client::{Acl, AuthId, Permission};
            [
                Acl::new(Permission::READ, AuthId::anyone()),
                Acl::new(Permission::ALL, AuthId::authed()),
            ]
        });
        CreateMode::Persistent.with_acls(Acls::new(acls))
    }

    /// The client of the current session, if there is one.
    pub fn client(&self) -> Option<Client> {
        self.current.borrow().clone()
    }

    /// Every new session (and the end of one, as `None`).
    pub fn subscribe(&self) -> watch::Receiver<Option<Client>> {
        self.current.subscribe()
    }

    pub fn stats(&self) -> &Arc<ZkStats> {
        &self.stats
    }

    /// Waits for a session, up to `limit`.
    pub async fn wait_client(&self, limit: Duration) -> Option<Client> {
        let mut sessions = self.subscribe();
        let wait = sessions.wait_for(Option::is_some);
        match tokio::time::timeout(limit, wait).await {
            Ok(Ok(client)) => client.clone(),
            _ => None,
        }
    }

    /// Connects, and connects again whenever the session ends, until shutdown.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            self.stats.session("connecting");
            let connected = tokio::select! {
                () = crate::shutdown::signalled(&mut shutdown) => break,
                connected = self.connect() => connected,
            };
            let client = match connected {
                Ok(client) => client,
                Err(err) => {
                    tracing::warn!(ensemble = %self.hosts, error = %err, retry_in = ?backoff,
                        "cannot connect to ZooKeeper");
                    self.stats.error(format!("connect: {err}"));
                    tokio::select! {
                        () = crate::shutdown::signalled(&mut shutdown) => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            ZkStats::count(&self.stats.sessions);
            let id = format!("{:x}", client.session_id().0);
            tracing::info!(ensemble = %self.hosts, chroot = %self.chroot, session = %id,
                timeout = ?client.session_timeout(), "ZooKeeper session established");
            let timeout_ms = client.session_timeout().as_millis() as u64;
            self.stats.update(|state| {
                state.session = "connected".to_owned();
                state.session_id = Some(id.clone());
                state.session_timeout_ms = timeout_ms;
            });
            let mut states = client.state_watcher();
            // A session that ended between the connect and the subscription reports no change.
            let ended = matches!(
                client.state(),
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
            );
            self.current.send_replace((!ended).then_some(client));
            if ended {
                self.stats.session("expired");
                continue;
            }
            loop {
                let state = tokio::select! {
                    () = crate::shutdown::signalled(&mut shutdown) => {
                        self.current.send_replace(None);
                        return;
                    }
                    state = states.changed() => state,
                };
                match state {
                    SessionState::SyncConnected => self.stats.session("connected"),
                    SessionState::ConnectedReadOnly => self.stats.session("read-only"),
                    SessionState::Disconnected => {
                        tracing::warn!(session = %id, "ZooKeeper disconnected; reconnecting");
                        self.stats.session("disconnected");
                        self.stats.error("disconnected from the ensemble");
                    }
                    SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                        tracing::warn!(session = %id, ?state,
                            "ZooKeeper session ended; starting a new one");
                        self.stats.session("expired");
                        self.stats.error(format!("session {id} ended: {state:?}"));
                        self.current.send_replace(None);
                        break;
                    }
                }
            }
        }
        self.current.send_replace(None);
    }

    /// One connection attempt: the hosts, then the chroot (created when missing, as it is ours).
    async fn connect(&self) -> Result<Client, zookeeper_client::Error> {
        let mut connector = Client::connector().with_session_timeout(self.timeout);
        if let Some(credentials) = &self.credentials {
            connector = connector.with_auth(&credentials.scheme, &credentials.secret);
        }
        let connect = connector.connect(&self.hosts);
        let client = tokio::time::timeout(self.timeout, connect)
            .await
            .map_err(|_| zookeeper_client::Error::Timeout)??;
        if self.chroot.is_empty() {
            return Ok(client);
        }
        client.mkdir(&self.chroot, &self.parent_options()).await?;
        client
            .chroot(self.chroot.as_str())
            .map_err(|_| zookeeper_client::Error::BadArguments(&"invalid chroot"))
    }
}

/// Records a complete re-list: when, and how many nodes it knows.
pub(crate) fn synced(stats: &ZkStats, nodes: usize) {
    stats.update(|state| {
        state.last_sync = Some(now());
        state.watched_nodes = nodes;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings_are_checked() {
        let stats = Arc::new(ZkStats::default());
        let session = |address| Session::new(address, Duration::from_secs(1), stats.clone());
        let ok = session("zookeeper://a:2181,b:2182/dubbo-cp/").unwrap();
        assert_eq!(
            (ok.hosts.as_str(), ok.chroot.as_str()),
            ("a:2181,b:2182", "/dubbo-cp")
        );
        assert_eq!(session("127.0.0.1:2181").unwrap().chroot, "");
        for bad in ["", "/chroot", "host", "a:2181,b", "a:x", "a:1/x//y"] {
            assert!(session(bad).is_err(), "{bad}");
        }
    }
}
