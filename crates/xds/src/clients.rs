//! The connected xDS clients as operators (and tests) see them: node, subscriptions, the
//! version each type acknowledged, the last rejection. One entry per open stream, removed when
//! it ends.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use envoy_types::pb::google::protobuf::Any;

mod views;
pub use views::{ClientPage, ClientView, ServerView, TypeView};

/// A response the client rejected.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Nack {
    /// The version it rejected.
    pub version: String,
    pub message: String,
    /// The response it rejected (the stream's count of responses): the resources sent in it
    /// are the rejected ones.
    #[serde(default)]
    pub nonce: u64,
}

/// A resource a client was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// Its own version (delta streams); on state-of-the-world streams, the version of the
    /// response that carried it for routes and load assignments (which are sent only when they
    /// change), else `None` (the type's). Behind a pointer: a stream holds one entry per
    /// resource, and every byte counts per stream; shared (`Arc`): the entries one response
    /// carries share one, and copying a map's leaf when an entry changes copies none.
    pub version: Option<Arc<str>>,
    /// Its encoding; `None` for what a reconnecting delta client said it holds, until it is
    /// seen in a snapshot at that version.
    pub resource: Option<Arc<Any>>,
    /// The response that carried it (0: none, a reconnecting client's claim).
    pub nonce: u64,
}

impl Held {
    pub(crate) fn sent(resource: Arc<Any>, version: Option<Arc<str>>, nonce: u64) -> Held {
        Held {
            version,
            resource: Some(resource),
            nonce,
        }
    }
}

/// Name -> what the client was sent. A persistent map, shared by the stream and its status:
/// cloning it costs a pointer, and a change copies only the path to it. Its names are shared
/// (`Arc`) so that the copy of a leaf, at every change of an entry in it, allocates no name
/// (at an endpoint change every stream holding the service changes one: the copies of names
/// and versions were 3-5 % of the server's CPU at 100,000 streams).
pub type HeldResources = imbl::OrdMap<Arc<str>, Held>;

/// One type of one client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeStatus {
    /// Names subscribed (not counting a wildcard).
    pub names: usize,
    pub wildcard: bool,
    /// The version last sent, and the last one acknowledged.
    pub sent: Option<String>,
    pub acked: Option<String>,
    pub nack: Option<Nack>,
    /// What it was last sent, each resource with the response that carried it.
    pub held: HeldResources,
    /// The newest response it acknowledged (0: none): resources sent in it or before are held.
    pub acked_nonce: u64,
    /// State of the world: the resources of the last acknowledged response, which a client
    /// keeps when it rejects a later one (delta streams: empty).
    pub accepted: HeldResources,
    /// Names subscribed to that do not exist (the client was told so).
    pub absent: imbl::OrdSet<String>,
    /// When the last response was sent, and its number on the stream (0: none).
    pub sent_at: Option<std::time::Instant>,
    pub sent_nonce: u64,
}

/// One client (one stream).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientStatus {
    pub node_id: String,
    pub namespace: String,
    /// The last published version the stream has taken in hand (pushed what it changed).
    pub seen: Option<String>,
    pub types: BTreeMap<&'static str, TypeStatus>,
    /// What the stream's server listeners enforce (an xDS-enabled server's stream).
    pub servers: Vec<ServerView>,
    /// `sotw` (state of the world) or `delta`.
    pub protocol: &'static str,
    /// The authenticated caller's namespace, when authentication is on.
    pub identity: Option<String>,
    pub connected: Option<std::time::SystemTime>,
    /// Per type, the first [`NAMES_SHOWN`] names subscribed to (`TypeStatus::names` counts all).
    pub subscribed: BTreeMap<&'static str, Vec<String>>,
}

/// Names of a type an operator's view lists per client; a client may subscribe to thousands.
pub const NAMES_SHOWN: usize = 20;

/// Names one log line names (the rest are counted), and the bytes of each it keeps.
const NAMES_LOGGED: usize = 5;
const NAME_BYTES_LOGGED: usize = 200;

/// Lines about names that resolve to nothing, at most, per minute for the whole process: a
/// client that keeps asking for made-up names, or many clients of a deleted service, cannot fill
/// the log. The next line allowed says how many were left out.
const NOT_FOUND_LINES_PER_MINUTE: u64 = 20;

/// The minute (since the epoch) the budget is for, the lines taken in it, and lines left out.
static NOT_FOUND_MINUTE: AtomicU64 = AtomicU64::new(0);
static NOT_FOUND_LINES: AtomicU64 = AtomicU64::new(0);
static NOT_FOUND_SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Whether a line may be logged now; `Some(lines left out before it)` when it may.
fn not_found_budget() -> Option<u64> {
    let minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60);
    if NOT_FOUND_MINUTE.swap(minute, Ordering::Relaxed) != minute {
        NOT_FOUND_LINES.store(0, Ordering::Relaxed);
    }
    if NOT_FOUND_LINES.fetch_add(1, Ordering::Relaxed) < NOT_FOUND_LINES_PER_MINUTE {
        Some(NOT_FOUND_SUPPRESSED.swap(0, Ordering::Relaxed))
    } else {
        NOT_FOUND_SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// The names of `now` the client was not told of in `before` (its previous response): those it
/// is told do not exist for the first time.
pub(crate) fn newly_absent<'a>(
    before: Option<&'a imbl::OrdSet<String>>,
    now: &'a imbl::OrdSet<String>,
) -> impl Iterator<Item = &'a String> {
    now.iter()
        .filter(move |name| before.is_none_or(|before| !before.contains(*name)))
}

/// Says, when a client is first told so, that names it subscribed to resolve to nothing:
/// otherwise a typo in `xds:///NAME`, a missing registration or a bootstrap's wrong namespace
/// looks like a hang on the client (gRPC reports "does not exist" only after its timer). One
/// line per response at most [`NAMES_LOGGED`] names in it, within the process's budget;
/// `true` when a line was logged.
pub(crate) fn log_not_found<'a>(
    node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
    type_url: &str,
    names: impl Iterator<Item = &'a String>,
) -> bool {
    let mut shown: Vec<&str> = Vec::new();
    let mut more = 0usize;
    for name in names {
        if shown.len() < NAMES_LOGGED {
            let mut end = name.len().min(NAME_BYTES_LOGGED);
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            shown.push(&name[..end]);
        } else {
            more += 1;
        }
    }
    if shown.is_empty() {
        return false;
    }
    let Some(suppressed) = not_found_budget() else {
        return false;
    };
    // Debug-formatted: a name is the client's text, and must not make lines of its own.
    tracing::warn!(
        node = node.map_or("", |n| n.id.as_str()),
        r#type = crate::short_type(type_url),
        names = ?shown,
        more,
        suppressed_before = suppressed,
        "an xDS client subscribed to names that resolve to nothing; it is told they do not \
         exist (a typo, a missing registration or ServiceEntry, or the wrong namespace in its \
         bootstrap; `dubbo-cp status` lists them)"
    );
    true
}

impl ClientStatus {
    /// The status of a stream of `node` whose client is in `namespace`, with its types'.
    pub(crate) fn of(
        node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
        namespace: &str,
        seen: Option<u64>,
        types: impl Iterator<Item = (&'static str, TypeStatus)>,
    ) -> ClientStatus {
        ClientStatus {
            node_id: node.map_or("", |n| n.id.as_str()).to_owned(),
            namespace: namespace.to_owned(),
            seen: seen.map(|v| v.to_string()),
            types: types.collect(),
            ..ClientStatus::default()
        }
    }
}

/// A stream as operators see it, read from the stream's own state when they ask: the state is
/// not copied into [`Clients`] at every request and push (at 10,000 streams that copy was a
/// tenth of the server's time per push, and a second copy of every stream's status in memory).
pub(crate) trait Report: Send + Sync {
    fn status(&self) -> ClientStatus;
    /// Per type the first [`NAMES_SHOWN`] names subscribed to: asked for only for the clients
    /// an operator's page shows (a copy of names per stream is too much for every stream).
    fn subscribed(&self) -> BTreeMap<&'static str, Vec<String>>;
    /// Each server listener it was sent, as operators see it. `visit` runs under the stream's
    /// lock: it must not call back into the stream or [`Clients`].
    fn each_server(&self, visit: &mut dyn FnMut(&ServerView));
}

/// Every open stream's status, and a counter that moves on every change to wait on.
pub struct Clients {
    streams: Mutex<BTreeMap<u64, Arc<dyn Report>>>,
    /// Tasks in [`Clients::wait_for`]. Streams change two or three times a push each, and a
    /// notification nobody waits for was about 4 % of the server's CPU at 10,000 streams
    /// (a `watch` channel's lock and eight waiter lists, every time): they notify only when
    /// somebody waits.
    waiters: AtomicUsize,
    notify: tokio::sync::Notify,
    next_id: AtomicU64,
    /// Streams open now, and the most that may be.
    open: AtomicUsize,
    max_streams: usize,
    /// The version published now, to tell which streams are behind.
    published: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients")
            .field("open", &self.open_streams())
            .finish_non_exhaustive()
    }
}

impl Clients {
    pub fn new(max_streams: usize) -> Clients {
        Clients {
            streams: Mutex::new(BTreeMap::new()),
            waiters: AtomicUsize::new(0),
            notify: tokio::sync::Notify::new(),
            next_id: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            max_streams,
            published: None,
        }
    }

    /// Streams are told behind when they have not taken in hand the version `published`
    /// says is the last.
    pub fn following(mut self, published: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.published = Some(Box::new(published));
        self
    }

    /// A new stream's id, or `None` when `max_streams` are open; its entry appears with
    /// [`Clients::report`], and [`Clients::close`] must follow.
    pub(crate) fn open(&self) -> Option<u64> {
        let admitted = self
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| {
                (open < self.max_streams).then_some(open + 1)
            })
            .is_ok();
        admitted.then(|| self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Stream `id` is shown as `report` says, until [`Clients::close`].
    pub(crate) fn report(&self, id: u64, report: Arc<dyn Report>) {
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, report);
        self.changed();
    }

    /// A stream's state moved: whoever waits on the clients looks again.
    pub(crate) fn changed(&self) {
        // Called after the change, its lock released. A waiter counts itself before it takes
        // that lock to look: if it looked before the change, its count came first, and this
        // load sees it.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    pub(crate) fn close(&self, id: u64) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        self.changed();
    }

    /// Server listeners held by open streams for which `holds` is true (for the metrics of what
    /// servers were told to enforce).
    pub fn count_servers(&self, holds: fn(&ServerView) -> bool) -> i64 {
        let mut count = 0i64;
        for report in self.reports() {
            report.each_server(&mut |server| count += i64::from(holds(server)));
        }
        count
    }

    /// Counts, per policy of `counts` (`namespace/name`, each at 0), the server listeners open
    /// streams were sent that enforce it as written: the AuthenticationPolicy that decided their
    /// TLS mode (`authorization` false), or an AuthorizationPolicy their RBAC allows or denies by.
    /// A policy a server lists as not enforced as written is not counted for it.
    pub fn count_enforcing(&self, authorization: bool, counts: &mut BTreeMap<String, usize>) {
        if counts.is_empty() {
            return;
        }
        for report in self.reports() {
            report.each_server(&mut |server| {
                let policies: Vec<&String> = match authorization {
                    false => server.tls_policy.iter().collect(),
                    true => server.allow.iter().chain(&server.deny).collect(),
                };
                for policy in policies {
                    let partly = server.not_enforced.iter().any(|n| {
                        n.strip_prefix(policy.as_str())
                            .is_some_and(|rest| rest.starts_with(':'))
                    });
                    if let Some(count) = counts.get_mut(policy.as_str())
                        && !partly
                    {
                        *count += 1;
                    }
                }
            });
        }
    }

    /// Every open stream, by the order they opened.
    pub fn list(&self) -> Vec<ClientStatus> {
        self.reports()
            .iter()
            .map(|report| report.status())
            .collect()
    }

    /// The open streams' reports, taken out of the map's lock: each is then read under its own
    /// stream's lock, which its stream holds while it answers.
    fn reports(&self) -> Vec<Arc<dyn Report>> {
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// The version published now, which a stream that is not behind has taken in hand.
    pub fn current(&self) -> Option<u64> {
        self.published.as_ref().map(|published| published())
    }

    /// Every open stream as `/debug/xds` and `dubbo-cp status` show it, names included.
    pub fn views(&self) -> Vec<ClientView> {
        let current = self.current();
        self.reports()
            .iter()
            .map(|report| {
                let mut status = report.status();
                status.subscribed = report.subscribed();
                ClientView::of(status, current)
            })
            .collect()
    }

    /// The streams `keep` keeps of those `in_scope` takes, from the `offset`-th, at most
    /// `limit`, with the counts an operator's page shows. The names subscribed to are read for
    /// the page's streams alone.
    pub fn page(
        &self,
        in_scope: impl Fn(&ClientView) -> bool,
        keep: impl Fn(&ClientView) -> bool,
        offset: usize,
        limit: usize,
    ) -> ClientPage {
        let current = self.current();
        let mut page = ClientPage {
            current,
            ..ClientPage::default()
        };
        for report in self.reports() {
            let view = ClientView::of(report.status(), current);
            if !in_scope(&view) {
                continue;
            }
            page.total += 1;
            page.stale += usize::from(!view.stale.is_empty());
            if !keep(&view) {
                continue;
            }
            page.matched += 1;
            if page.matched > offset && page.clients.len() < limit {
                // The view counted, with its names added: a second read could disagree with
                // the counts and the filter.
                let mut view = view;
                let mut names = report.subscribed();
                for t in &mut view.types {
                    let type_url = crate::type_url_of(&t.r#type);
                    t.subscribed = type_url.and_then(|u| names.remove(u)).unwrap_or_default();
                }
                page.clients.push(view);
            }
        }
        page
    }

    /// Waits until `done` holds for the list of clients.
    pub async fn wait_for(&self, mut done: impl FnMut(&[ClientStatus]) -> bool) {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiters);
        loop {
            // Registered before the look, so a change after it wakes this wait.
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if done(&self.list()) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(types: Vec<(&'static str, TypeStatus)>, seen: Option<&str>) -> ClientStatus {
        ClientStatus {
            node_id: "n".into(),
            namespace: "shop".into(),
            seen: seen.map(str::to_owned),
            types: types.into_iter().collect(),
            protocol: "delta",
            subscribed: [(crate::CLUSTER, vec!["a".to_owned()])].into(),
            ..ClientStatus::default()
        }
    }

    fn status(sent: &str, acked: Option<&str>, nack: Option<&str>) -> TypeStatus {
        TypeStatus {
            names: 1,
            sent_at: Some(std::time::Instant::now()),
            sent_nonce: 2,
            acked_nonce: if acked == Some(sent) { 2 } else { 1 },
            sent: Some(sent.into()),
            acked: acked.map(str::to_owned),
            nack: nack.map(|message| Nack {
                version: sent.into(),
                message: message.into(),
                nonce: 1,
            }),
            ..TypeStatus::default()
        }
    }

    #[test]
    fn a_name_is_newly_absent_once_and_the_log_has_a_budget() {
        let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        let first: imbl::OrdSet<String> = set(&["a", "b"]);
        let again: Vec<&String> = newly_absent(Some(&first), &first).collect();
        assert!(again.is_empty(), "told before: not again");
        let news: Vec<&String> = newly_absent(None, &first).collect();
        assert_eq!(news, ["a", "b"], "the first response");
        let more: imbl::OrdSet<String> = set(&["a", "c"]);
        let news: Vec<&String> = newly_absent(Some(&first), &more).collect();
        assert_eq!(news, ["c"]);
        // Other tests may have taken some of this minute's budget: never more than it. Measured
        // again when a minute turned over in between (the budget is per minute).
        let minute = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() / 60)
        };
        loop {
            let started = minute();
            let allowed = (0..NOT_FOUND_LINES_PER_MINUTE + 5)
                .filter(|_| not_found_budget().is_some())
                .count();
            let spent = not_found_budget().is_none();
            // A long name is cut; the call says whether it logged (here the budget is spent).
            let long = "x".repeat(10_000);
            let logged = log_not_found(None, crate::LISTENER, [&long].into_iter());
            if minute() != started {
                continue;
            }
            assert!(allowed as u64 <= NOT_FOUND_LINES_PER_MINUTE, "{allowed}");
            assert!(spent && !logged, "spent");
            break;
        }
    }

    #[test]
    fn a_client_is_stale_for_a_rejection_an_unacknowledged_response_or_a_version_behind() {
        let steady = ClientView::of(
            client(
                vec![(crate::CLUSTER, status("4", Some("4"), None))],
                Some("4"),
            ),
            Some(4),
        );
        assert!(steady.stale.is_empty(), "{steady:?}");
        assert_eq!(steady.types[0].lag_seconds, None, "in step");
        assert_eq!(steady.protocol, "delta");
        assert_eq!(steady.types[0].subscribed, ["a"]);

        let view = ClientView::of(
            client(
                vec![
                    (
                        crate::CLUSTER,
                        status("4", Some("3"), Some("no such cluster")),
                    ),
                    (crate::ENDPOINT, status("4", Some("3"), None)),
                ],
                Some("3"),
            ),
            Some(4),
        );
        assert!(
            view.types.iter().all(|t| t.lag_seconds.is_some()),
            "a rejected and an unacknowledged response lag: {view:?}"
        );
        assert_eq!(
            view.stale,
            [
                "cluster NACKed version 4: no such cluster",
                "endpoint version 4 sent, not acknowledged",
                "behind: version 3 taken in hand, 4 published",
            ],
        );
        // A client that subscribed to nothing yet is not behind.
        let idle = ClientView::of(client(vec![], Some("1")), Some(4));
        assert!(idle.stale.is_empty(), "{idle:?}");
    }

    /// A stream that was sent these server listeners.
    struct Servers(Vec<ServerView>);

    impl Report for Servers {
        fn status(&self) -> ClientStatus {
            ClientStatus::default()
        }
        fn subscribed(&self) -> BTreeMap<&'static str, Vec<String>> {
            BTreeMap::new()
        }
        fn each_server(&self, visit: &mut dyn FnMut(&ServerView)) {
            self.0.iter().for_each(visit);
        }
    }

    fn server(tls_policy: Option<&str>, allow: &[&str], not_enforced: &[&str]) -> ServerView {
        ServerView {
            address: "10.0.0.1:7070".into(),
            service: None,
            namespace: "shop".into(),
            tls: "STRICT".into(),
            tls_policy: tls_policy.map(Into::into),
            deny: vec![],
            allow: allow.iter().map(|p| (*p).to_owned()).collect(),
            not_enforced: not_enforced.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    #[test]
    fn servers_enforcing_a_policy_are_counted_by_kind_and_only_as_written() {
        let clients = Clients::new(10);
        clients.report(
            1,
            Arc::new(Servers(vec![
                // `shop/x` names an AuthenticationPolicy and an AuthorizationPolicy alike.
                server(Some("shop/x"), &["shop/x"], &[]),
                server(
                    Some("shop/y"),
                    &[],
                    &["shop/y: PERMISSIVE is served as plaintext"],
                ),
                server(Some("shop/yy"), &[], &["shop/y: another server's note"]),
            ])),
        );
        let counts = |authorization: bool| {
            let mut counts: BTreeMap<String, usize> = ["shop/x", "shop/y", "shop/yy", "shop/z"]
                .into_iter()
                .map(|p| (p.to_owned(), 0))
                .collect();
            clients.count_enforcing(authorization, &mut counts);
            counts
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            counts(false),
            [("shop/x".to_owned(), 1), ("shop/yy".to_owned(), 1)]
        );
        assert_eq!(counts(true), [("shop/x".to_owned(), 1)]);
    }
}
