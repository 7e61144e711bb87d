//! The protocol of one discovery stream.
//!
//! Per subscribed type it keeps a nonce counter, the nonce of the one response the client has
//! not acknowledged yet, and the revision it last sent. A request with an empty nonce
//! subscribes; one with the pending nonce acknowledges. While a response is unacknowledged,
//! changes only mark the type as behind; after the ACK the newest state goes out, so any number
//! of changes coalesce into one response and no state is ever sent twice. Wrong or stale nonces,
//! unknown and empty types are ignored and the stream stays open.

use crate::index::Labelled as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt, StreamMap};
use tonic::Status;

use super::DdsStats;
use super::clients::Client;
use super::encode::Encoder;
use super::wire::{EncodedData, ObserveResponse};
#[cfg(test)]
use crate::index::Change;
use crate::index::{Index, Kind, KindSnapshot};
use crate::pb::dds::ObserveRequest;
use dubbo_cp_domain::rules::scope::Endpoint;

/// What one stream knows about one subscribed type.
#[derive(Debug, Default)]
struct Subscription {
    /// Last nonce issued; nonces are "1", "2", ... per stream and type.
    nonce_seq: u64,
    /// The nonce of the response awaiting its ACK, if any.
    pending: Option<String>,
    /// Revision of the last response, so the same state is never sent twice.
    last_sent: Option<i64>,
    /// The last filtered view sent (auth policies): a new revision that leaves this client's
    /// view as it was is not sent.
    last_view: Option<EncodedData>,
}

/// Where a stream sends its responses, and how long a send may take.
struct Outbound<'a> {
    endpoint: &'a Endpoint,
    encoder: &'a Encoder,
    responses: mpsc::Sender<ObserveResponse>,
    send_timeout: Duration,
    stats: &'a DdsStats,
    /// This stream's entry in the propagation status.
    client: &'a Client,
}

impl Outbound<'_> {
    /// Sends `snapshot` unless the client already has that revision.
    async fn send_if_newer(
        &self,
        kind: Kind,
        subscription: &mut Subscription,
        snapshot: &KindSnapshot,
    ) -> Result<(), Status> {
        if subscription.last_sent == Some(snapshot.revision) {
            return Ok(());
        }
        let data = self.encoder.view_for(snapshot, self.endpoint);
        if snapshot.is_scoped()
            && subscription.last_sent.is_some()
            && subscription.last_view.as_ref() == Some(&data)
        {
            // Another client's policies changed; this client's view did not.
            subscription.last_sent = Some(snapshot.revision);
            self.client.unchanged(kind, snapshot.revision);
            return Ok(());
        }
        subscription.nonce_seq += 1;
        let nonce = subscription.nonce_seq.to_string();
        let response = ObserveResponse {
            nonce: nonce.clone(),
            r#type: kind.type_name().to_owned(),
            revision: snapshot.revision,
            data: data.clone(),
        };
        match tokio::time::timeout(self.send_timeout, self.responses.send(response)).await {
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{} response not accepted within {:?}; closing the stream",
                kind.name(),
                self.send_timeout
            ))),
            Ok(Err(_)) => Err(Status::cancelled("client went away")),
            Ok(Ok(())) => {
                subscription.pending = Some(nonce);
                subscription.last_sent = Some(snapshot.revision);
                self.client.sent(kind, snapshot.revision);
                // Kept only for filtered kinds: a shared full state must not stay alive per stream.
                subscription.last_view = snapshot.is_scoped().then_some(data);
                self.stats.pushes.fetch_add(1, Ordering::Relaxed);
                self.stats.pushes_by_kind.get_or_create(&kind.label()).inc();
                self.stats
                    .push_delay
                    .observe(snapshot.published.elapsed().as_secs_f64());
                Ok(())
            }
        }
    }
}

/// Who is at the other end of a stream: what auth policies filter by, and its entry in the
/// propagation status.
pub struct Caller<'a> {
    pub endpoint: Arc<Endpoint>,
    pub status: &'a Client,
}

/// What a stream serves: the index's states, in the discovery stream's encoding.
pub struct Served<'a> {
    pub index: Arc<Index>,
    pub encoder: &'a Encoder,
}

/// Runs one stream until the client ends it, a send times out, or shutdown begins.
pub async fn run<S>(
    mut requests: S,
    Served { index, encoder }: Served<'_>,
    caller: Caller<'_>,
    responses: mpsc::Sender<ObserveResponse>,
    send_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
    stats: &DdsStats,
) -> Result<(), Status>
where
    S: Stream<Item = Result<ObserveRequest, Status>> + Unpin,
{
    let client = caller.status;
    let out = Outbound {
        endpoint: &caller.endpoint,
        encoder,
        responses,
        send_timeout,
        stats,
        client,
    };
    let mut subscriptions: HashMap<Kind, Subscription> = HashMap::new();
    // Yields a type's current state when inserted, then each newer state.
    let mut changes: StreamMap<Kind, WatchStream<Arc<KindSnapshot>>> = StreamMap::new();

    loop {
        tokio::select! {
            biased;
            () = crate::shutdown::signalled(&mut shutdown) => {
                return Err(Status::unavailable("control plane shutting down; reconnect"));
            }
            request = requests.next() => match request {
                None => return Ok(()),
                // A malformed or oversized request, or a reset: the status says which, and
                // reaches the client if it is still there.
                Some(Err(status)) => return Err(status),
                Some(Ok(request)) => {
                    let Some(kind) = Kind::from_type_name(&request.r#type) else {
                        tracing::debug!(r#type = %request.r#type, "ignoring unknown type");
                        continue;
                    };
                    if request.nonce.is_empty() {
                        if let std::collections::hash_map::Entry::Vacant(entry) = subscriptions.entry(kind) {
                            entry.insert(Subscription::default());
                            client.subscribed(kind);
                            changes.insert(kind, WatchStream::new(index.subscribe(kind)));
                        }
                        continue;
                    }
                    match subscriptions.get_mut(&kind) {
                        Some(subscription) if subscription.pending.as_deref() == Some(request.nonce.as_str()) => {
                            subscription.pending = None;
                            client.acked(kind);
                            let current = index.current(kind);
                            client.saw(kind, current.revision, current.published);
                            if index.is_kind_loaded(kind) {
                                out.send_if_newer(kind, subscription, &current).await?;
                            }
                        }
                        _ => {
                            stats.stale_nonces.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(kind = kind.name(), nonce = %request.nonce, "ignoring stale or unknown nonce");
                        }
                    }
                }
            },
            Some((kind, snapshot)) = changes.next(), if !changes.is_empty() => {
                if let Some(subscription) = subscriptions.get_mut(&kind) {
                    client.saw(kind, snapshot.revision, snapshot.published);
                    // Behind an unacknowledged response the change waits for the ACK; before
                    // the kind's initial state is in, nothing is sent (never an empty or
                    // partial state): the load wakes this stream.
                    if subscription.pending.is_none() && index.is_kind_loaded(kind) {
                        out.send_if_newer(kind, subscription, &snapshot).await?;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::wrappers::ReceiverStream;

    const SNP: &str = "dubbo.apache.org/v1alpha1/ServiceNameMapping";
    const TAG: &str = "dubbo.apache.org/v1alpha1/TagRoute";

    struct Harness {
        index: Arc<Index>,
        requests: mpsc::Sender<Result<ObserveRequest, Status>>,
        responses: mpsc::Receiver<ObserveResponse>,
        shutdown: watch::Sender<bool>,
        task: tokio::task::JoinHandle<Result<(), Status>>,
        stats: Arc<DdsStats>,
    }

    fn start(capacity: usize) -> Harness {
        let index = Arc::new(Index::new(1));
        index.mark_all_loaded();
        let (requests, requests_rx) = mpsc::channel(16);
        let (responses_tx, responses) = mpsc::channel(capacity);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let stats = Arc::new(DdsStats::default());
        let clients = Arc::new(super::super::clients::Clients::default());
        let task = tokio::spawn({
            let index = index.clone();
            let stats = stats.clone();
            async move {
                let entry = clients.open(None, None);
                run(
                    ReceiverStream::new(requests_rx),
                    Served {
                        index,
                        encoder: &Encoder::default(),
                    },
                    Caller {
                        endpoint: Arc::new(Endpoint::default()),
                        status: &entry.client,
                    },
                    responses_tx,
                    Duration::from_secs(5),
                    shutdown_rx,
                    &stats,
                )
                .await
            }
        });
        Harness {
            index,
            requests,
            responses,
            shutdown,
            task,
            stats,
        }
    }

    fn object(key: &str, value: &[u8]) -> (String, crate::index::Resource) {
        (key.to_string(), crate::index::test_value(value))
    }

    impl Harness {
        async fn send(&self, nonce: &str, r#type: &str) {
            let request = ObserveRequest {
                nonce: nonce.into(),
                r#type: r#type.into(),
            };
            assert!(self.requests.send(Ok(request)).await.is_ok());
        }

        async fn recv(&mut self) -> ObserveResponse {
            match tokio::time::timeout(Duration::from_secs(1), self.responses.recv()).await {
                Ok(Some(response)) => response,
                other => panic!("no response: {other:?}"),
            }
        }

        /// Lets the stream task run, then checks nothing was sent.
        async fn expect_silence(&mut self) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(self.responses.try_recv().is_err(), "unexpected response");
        }

        fn change(&self, key: &str, value: &[u8]) {
            let (key, any) = object(key, value);
            assert!(
                self.index
                    .apply(Kind::ServiceNameMapping, [Change::Upsert(key, any)], 0)
            );
        }
    }

    fn keys(response: &ObserveResponse) -> Vec<Vec<u8>> {
        response
            .data
            .decode()
            .unwrap_or_default()
            .into_iter()
            .map(|any| {
                crate::objects::decode_mapping(&any)
                    .ok()
                    .and_then(|m| m.spec)
                    .map(|spec| spec.interface_name.into_bytes())
                    .unwrap_or_default()
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn subscribe_gets_the_current_state_even_when_empty() {
        let mut h = start(4);
        h.send("", SNP).await;
        let first = h.recv().await;
        assert_eq!(
            (first.nonce.as_str(), first.r#type.as_str(), first.revision),
            ("1", SNP, 1)
        );
        assert!(keys(&first).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn changes_wait_for_the_ack_and_coalesce_into_the_newest_state() {
        let mut h = start(4);
        h.change("a/ns", b"a1");
        h.send("", SNP).await;
        let first = h.recv().await;
        assert_eq!(keys(&first), vec![b"a1".to_vec()]);

        h.change("b/ns", b"b1");
        h.change("a/ns", b"a2");
        h.change("c/ns", b"c1");
        h.expect_silence().await;

        h.send(&first.nonce, SNP).await;
        let second = h.recv().await;
        assert_eq!(second.nonce, "2");
        assert!(second.revision > first.revision);
        assert_eq!(
            keys(&second),
            vec![b"a2".to_vec(), b"b1".to_vec(), b"c1".to_vec()]
        );
        // Nothing changed since: the ACK of the newest state sends nothing.
        h.send(&second.nonce, SNP).await;
        h.expect_silence().await;
        // A change after that ACK goes out at once.
        h.change("d/ns", b"d1");
        let third = h.recv().await;
        assert_eq!(third.nonce, "3");
        assert_eq!(keys(&third).len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_and_stale_nonces_are_ignored_without_wedging() {
        let mut h = start(4);
        h.send("", SNP).await;
        let first = h.recv().await;
        h.change("a/ns", b"a1");
        h.send("999", SNP).await;
        h.send("not-a-nonce", SNP).await;
        h.expect_silence().await;
        h.send(&first.nonce, SNP).await;
        let second = h.recv().await;
        assert_eq!(keys(&second), vec![b"a1".to_vec()]);
        // The old nonce again: stale, ignored, nothing duplicated.
        h.send(&first.nonce, SNP).await;
        h.expect_silence().await;
        assert_eq!(h.stats.stale_nonces.load(Ordering::Relaxed), 3);
        // A repeated subscribe does not resend the same state either.
        h.send("", SNP).await;
        h.expect_silence().await;
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_and_empty_types_are_ignored_and_a_nonce_first_does_not_subscribe() {
        let mut h = start(4);
        h.send("", "").await;
        h.send("", "dubbo.apache.org/v1alpha1/NoSuchKind").await;
        h.send("1", SNP).await;
        h.change("a/ns", b"a1");
        h.expect_silence().await;
        h.send("", SNP).await;
        let first = h.recv().await;
        assert_eq!(first.nonce, "1");
        assert!(!h.task.is_finished(), "stream closed");
    }

    #[tokio::test(start_paused = true)]
    async fn types_are_independent_with_their_own_nonces() {
        let mut h = start(4);
        h.send("", SNP).await;
        let snp = h.recv().await;
        h.send("", TAG).await;
        let tag = h.recv().await;
        assert_eq!((snp.r#type.as_str(), snp.nonce.as_str()), (SNP, "1"));
        assert_eq!((tag.r#type.as_str(), tag.nonce.as_str()), (TAG, "1"));
        h.send(&snp.nonce, SNP).await;
        h.send(&tag.nonce, TAG).await;
        // A mapping change reaches the mapping subscription only.
        h.change("a/ns", b"a1");
        let next = h.recv().await;
        assert_eq!((next.r#type.as_str(), next.nonce.as_str()), (SNP, "2"));
        h.expect_silence().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_not_taken_within_the_send_timeout_ends_the_stream() {
        // Room for one response, and nobody reads it.
        let h = start(1);
        h.send("", SNP).await;
        h.send("", TAG).await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        let result = h.task.await.unwrap();
        assert_eq!(
            result.err().map(|s| s.code()),
            Some(tonic::Code::DeadlineExceeded)
        );
        drop(h.responses);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_the_stream_with_unavailable() {
        let h = start(4);
        h.send("", SNP).await;
        h.shutdown.send_replace(true);
        let result = h.task.await.unwrap();
        assert_eq!(
            result.err().map(|s| s.code()),
            Some(tonic::Code::Unavailable)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn client_closing_ends_the_stream_cleanly() {
        let h = start(4);
        drop(h.requests);
        let result = h.task.await.unwrap();
        assert!(result.is_ok());
    }
}
