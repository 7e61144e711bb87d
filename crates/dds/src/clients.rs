//! Who is connected and how far each client has got, `istioctl proxy-status` style but for every
//! kind: per open stream its identity and peer, and per subscribed kind the revision last sent,
//! the revision last acknowledged, and since when it lags behind a change.
//!
//! Each stream task updates its own entry (a short lock, never held across an `.await`); the
//! admin endpoint `/debug/clients`, `dubbo-cp status` and the metrics read every entry. Entries
//! live exactly as long as their streams, so they are bounded by `dds.maxStreams`.

use crate::index::Labelled as _;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use dubbo_cp_domain::rules::scope::Endpoint;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::index::{Index, Kind};

/// What one stream has got of one kind.
#[derive(Debug, Clone, Copy)]
struct Progress {
    sent: Option<i64>,
    acked: Option<i64>,
    /// When the oldest state the client has not acknowledged was published (never before the
    /// subscription: a new client is not "behind" by the age of the state it asked for).
    behind_since: Option<Instant>,
    /// The same for the first change that arrived while a response awaited its ACK: what the
    /// client is behind once that ACK comes.
    next_behind: Option<Instant>,
    subscribed: Instant,
}

impl Progress {
    fn awaiting_ack(&self) -> bool {
        self.sent.is_some() && self.sent != self.acked
    }
}

/// The kinds a stream subscribed to, in kind order: a few per stream, so a small vector (a
/// map's node would cost most of a kilobyte per stream).
#[derive(Debug, Default)]
struct Subscribed(Vec<(Kind, Progress)>);

impl Subscribed {
    fn get_mut(&mut self, kind: &Kind) -> Option<&mut Progress> {
        self.0
            .iter_mut()
            .find(|(k, _)| k == kind)
            .map(|(_, progress)| progress)
    }

    fn iter(&self) -> impl Iterator<Item = (&Kind, &Progress)> {
        self.0.iter().map(|(kind, progress)| (kind, progress))
    }
}

/// One open stream.
#[derive(Debug)]
pub struct Client {
    pub id: u64,
    identity: Option<String>,
    namespace: Option<String>,
    peer: Option<SocketAddr>,
    /// What auth policies select it by (kept so operators can ask who receives a policy).
    pub endpoint: Arc<Endpoint>,
    connected: SystemTime,
    kinds: Mutex<Subscribed>,
    /// Where ACK delays are counted (shared by every client).
    ack_delay: Histogram,
}

impl Client {
    fn kinds(&self) -> std::sync::MutexGuard<'_, Subscribed> {
        self.kinds.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribed(&self, kind: Kind) {
        let mut kinds = self.kinds();
        if kinds.get_mut(&kind).is_none() {
            kinds.0.push((
                kind,
                Progress {
                    sent: None,
                    acked: None,
                    behind_since: None,
                    next_behind: None,
                    subscribed: Instant::now(),
                },
            ));
            kinds.0.sort_by_key(|(kind, _)| *kind);
        }
    }

    /// The stream learnt of state `revision`, published at `published`.
    pub fn saw(&self, kind: Kind, revision: i64, published: Instant) {
        let mut kinds = self.kinds();
        let Some(progress) = kinds.get_mut(&kind) else {
            return;
        };
        if progress.acked.is_some_and(|acked| acked >= revision) {
            return;
        }
        let since = published.max(progress.subscribed);
        if progress.behind_since.is_none() {
            progress.behind_since = Some(since);
        } else if progress.awaiting_ack()
            && progress.sent.is_some_and(|sent| revision > sent)
            && progress.next_behind.is_none()
        {
            progress.next_behind = Some(since);
        }
    }

    pub fn sent(&self, kind: Kind, revision: i64) {
        if let Some(progress) = self.kinds().get_mut(&kind) {
            progress.sent = Some(revision);
        }
    }

    /// The client acknowledged the last response of `kind`.
    pub fn acked(&self, kind: Kind) {
        let mut kinds = self.kinds();
        let Some(progress) = kinds.get_mut(&kind) else {
            return;
        };
        progress.acked = progress.sent;
        if let Some(since) = progress.behind_since {
            self.ack_delay.observe(since.elapsed().as_secs_f64());
        }
        progress.behind_since = progress.next_behind.take();
    }

    /// State `revision` leaves this client's filtered view as it was: it has it already.
    pub fn unchanged(&self, kind: Kind, revision: i64) {
        if let Some(progress) = self.kinds().get_mut(&kind)
            && !progress.awaiting_ack()
        {
            progress.sent = Some(revision);
            progress.acked = Some(revision);
            progress.behind_since = None;
            progress.next_behind = None;
        }
    }

    /// This client as `/debug/clients` shows it, against the index's current revisions.
    pub fn view(&self, index: &Index) -> ClientView {
        let kinds = self
            .kinds()
            .iter()
            .map(|(kind, progress)| {
                let current = index.current(*kind);
                let synced = progress.acked == Some(current.revision);
                let lag = if synced {
                    0.0
                } else {
                    // Not yet seen by the stream task: behind since that state's publication.
                    let since = progress
                        .behind_since
                        .unwrap_or(current.published.max(progress.subscribed));
                    since.elapsed().as_secs_f64()
                };
                KindStatus {
                    kind: kind.name().to_owned(),
                    sent: progress.sent,
                    acked: progress.acked,
                    current: current.revision,
                    synced,
                    lag_seconds: lag,
                }
            })
            .collect();
        ClientView {
            id: self.id,
            identity: self.identity.clone(),
            namespace: self.namespace.clone(),
            peer: self.peer.map(|peer| peer.to_string()),
            connected_since: humantime::format_rfc3339_seconds(self.connected).to_string(),
            kinds,
        }
    }
}

/// One subscribed kind of one client, as `/debug/clients` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KindStatus {
    pub kind: String,
    /// Revision of the last response sent; `None` before the first.
    pub sent: Option<i64>,
    /// Revision the client last acknowledged (or already had).
    pub acked: Option<i64>,
    /// The kind's revision on this replica now.
    pub current: i64,
    /// The client acknowledged the current revision.
    pub synced: bool,
    /// Seconds since the oldest change the client has not acknowledged; 0 when synced.
    pub lag_seconds: f64,
}

/// One open stream, as `/debug/clients` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientView {
    pub id: u64,
    /// The authenticated identity (SPIFFE ID or name); `None` without authentication.
    pub identity: Option<String>,
    pub namespace: Option<String>,
    pub peer: Option<String>,
    /// RFC 3339.
    pub connected_since: String,
    pub kinds: Vec<KindStatus>,
}

/// Every open stream.
#[derive(Debug)]
pub struct Clients {
    next_id: AtomicU64,
    open: Mutex<BTreeMap<u64, Arc<Client>>>,
    /// Seconds from a change's publication to the ACK that covered it.
    ack_delay: Histogram,
}

impl Default for Clients {
    fn default() -> Self {
        Self {
            next_id: AtomicU64::new(1),
            open: Mutex::new(BTreeMap::new()),
            ack_delay: crate::metrics::latency_histogram(),
        }
    }
}

/// Keeps a stream's entry while the stream runs; dropping it removes the entry.
pub struct Registration {
    clients: Arc<Clients>,
    pub client: Arc<Client>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.clients.lock().remove(&self.client.id);
    }
}

impl Clients {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Client>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enters a new stream.
    pub fn open(
        self: &Arc<Self>,
        identity: Option<&crate::auth::Identity>,
        peer: Option<SocketAddr>,
    ) -> Registration {
        let client = Arc::new(Client {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            identity: identity.map(|i| i.spiffe_id.clone().unwrap_or_else(|| i.name.clone())),
            namespace: identity.map(|i| i.namespace.clone()),
            peer,
            endpoint: Arc::new(crate::auth::endpoint(identity, peer.map(|addr| addr.ip()))),
            connected: SystemTime::now(),
            kinds: Mutex::new(Subscribed::default()),
            ack_delay: self.ack_delay.clone(),
        });
        self.lock().insert(client.id, client.clone());
        Registration {
            clients: self.clone(),
            client,
        }
    }

    fn all(&self) -> Vec<Arc<Client>> {
        self.lock().values().cloned().collect()
    }

    /// The endpoints of the open streams subscribed to `kind` (read under the lock, looked at
    /// after it: opening and closing streams do not wait on a caller's checks).
    pub fn subscribers(&self, kind: Kind) -> Vec<Arc<Endpoint>> {
        self.all()
            .into_iter()
            .filter(|client| client.kinds().0.iter().any(|(k, _)| *k == kind))
            .map(|client| client.endpoint.clone())
            .collect()
    }

    /// Every open stream against the index's current revisions, oldest first.
    pub fn views(&self, index: &Index) -> Vec<ClientView> {
        self.all().iter().map(|client| client.view(index)).collect()
    }

    pub fn register_metrics(
        self: &Arc<Self>,
        index: Arc<Index>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        registry.register(
            "dds_ack_delay_seconds",
            "Seconds from a change's publication to the client's ACK of a state holding it",
            self.ack_delay.clone(),
        );
        registry.register_collector(Box::new(NotSynced {
            clients: self.clone(),
            index,
        }));
    }
}

/// `dds_streams_not_synced{kind}`, counted at scrape time.
struct NotSynced {
    clients: Arc<Clients>,
    index: Arc<Index>,
}

impl std::fmt::Debug for NotSynced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NotSynced")
    }
}

impl Collector for NotSynced {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let mut behind: BTreeMap<Kind, i64> = Kind::DISCOVERY.iter().map(|k| (*k, 0)).collect();
        let current: BTreeMap<Kind, i64> = Kind::DISCOVERY
            .iter()
            .map(|k| (*k, self.index.current(*k).revision))
            .collect();
        for client in self.clients.all() {
            for (kind, progress) in client.kinds().iter() {
                if progress.acked != current.get(kind).copied() {
                    *behind.entry(*kind).or_default() += 1;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "dds_streams_not_synced",
            "Open streams whose client has not acknowledged the current revision, by kind",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (kind, count) in behind {
            let gauge = ConstGauge::new(count);
            gauge.encode(family.encode_family(&kind.label())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Change;
    use std::time::Duration;

    use crate::index::test_value as any;

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_acking_lags_from_the_first_change_it_missed() {
        let index = Index::new(1);
        let clients = Arc::new(Clients::default());
        let entry = clients.open(None, None);
        let client = &entry.client;
        client.subscribed(Kind::TagRoute);
        let first = index.current(Kind::TagRoute);
        client.saw(Kind::TagRoute, first.revision, first.published);
        client.sent(Kind::TagRoute, first.revision);
        client.acked(Kind::TagRoute);
        let view = client.view(&index);
        assert_eq!(view.kinds[0].acked, Some(1));
        assert!(view.kinds[0].synced);

        tokio::time::advance(Duration::from_secs(10)).await;
        index.apply(
            Kind::TagRoute,
            [Change::Upsert("a/ns".into(), any(b"a"))],
            0,
        );
        let second = index.current(Kind::TagRoute);
        client.saw(Kind::TagRoute, second.revision, second.published);
        client.sent(Kind::TagRoute, second.revision);
        tokio::time::advance(Duration::from_secs(3)).await;
        // A third change while the second awaits its ACK.
        index.apply(
            Kind::TagRoute,
            [Change::Upsert("b/ns".into(), any(b"b"))],
            0,
        );
        let third = index.current(Kind::TagRoute);
        client.saw(Kind::TagRoute, third.revision, third.published);
        tokio::time::advance(Duration::from_secs(4)).await;

        let status = &client.view(&index).kinds[0];
        assert_eq!(
            (status.sent, status.acked, status.current, status.synced),
            (Some(second.revision), Some(1), third.revision, false)
        );
        assert!((status.lag_seconds - 7.0).abs() < 0.01, "{status:?}");

        // The ACK of the second: now behind only by the third, published 4 s ago.
        client.acked(Kind::TagRoute);
        let status = &client.view(&index).kinds[0];
        assert_eq!(status.acked, Some(second.revision));
        assert!((status.lag_seconds - 4.0).abs() < 0.01, "{status:?}");

        drop(entry);
        assert!(clients.views(&index).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_client_is_not_behind_by_the_age_of_the_state() {
        let index = Index::new(1);
        tokio::time::advance(Duration::from_secs(3600)).await;
        let clients = Arc::new(Clients::default());
        let entry = clients.open(None, None);
        entry.client.subscribed(Kind::DynamicConfig);
        let state = index.current(Kind::DynamicConfig);
        entry
            .client
            .saw(Kind::DynamicConfig, state.revision, state.published);
        tokio::time::advance(Duration::from_secs(2)).await;
        let status = &entry.client.view(&index).kinds[0];
        assert!(!status.synced);
        assert!((status.lag_seconds - 2.0).abs() < 0.01, "{status:?}");
    }
}
