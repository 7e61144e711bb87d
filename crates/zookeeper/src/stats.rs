//! What ZooKeeper mode counts, and the state of the session and the watch that `/debug/sources`,
//! `dubbo-cp status` and the dashboard show.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::registry::Registry;

use crate::metrics::{scraped_counter, scraped_gauge};

/// Nodes reported unreadable at most (the oldest reports go first beyond it).
pub const MAX_REPORTED_NODES: usize = 1000;

/// A counter's name, help and how it is read.
type Counter = (&'static str, &'static str, fn(&ZkStats) -> u64);

/// Counters for `/metrics`, tests and benchmarks.
#[derive(Debug, Default)]
pub struct ZkStats {
    /// Mapping nodes created or set.
    pub writes: AtomicU64,
    /// Mapping writes that found every application already listed.
    pub unchanged: AtomicU64,
    /// Compare-and-swap tickets lost (the node changed or was created meanwhile).
    pub conflicts: AtomicU64,
    /// Mapping writes retried after an error (not a lost ticket).
    pub retries: AtomicU64,
    /// Rule nodes created, set or deleted through dubbo-cp.
    pub rule_writes: AtomicU64,
    /// Node events the watch received.
    pub watch_events: AtomicU64,
    /// Full re-lists (at each new session and after each reconnection).
    pub relists: AtomicU64,
    /// Sessions established.
    pub sessions: AtomicU64,
    /// Watches added again after a reconnection of a session that survived.
    pub rewatches: AtomicU64,
    state: Mutex<SourceState>,
}

/// What is known of the ensemble right now.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceState {
    /// The connect string (hosts and chroot).
    pub ensemble: String,
    /// `connecting`, `connected`, `disconnected`, `read-only`, `expired`.
    pub session: String,
    /// The session id in hex, while there is one.
    pub session_id: Option<String>,
    /// The timeout the ensemble granted, in milliseconds.
    pub session_timeout_ms: u64,
    /// Nodes the watch knows now (mappings, rules, providers, instances), after every batch.
    pub watched_nodes: usize,
    /// Unix seconds of the last complete re-list.
    pub last_sync: Option<u64>,
    /// The last error talking to the ensemble, with its unix second.
    pub last_error: Option<(u64, String)>,
    /// Nodes skipped because their content cannot be read, by path (the first 1,000 by path,
    /// each reason cut to 300 characters).
    pub unreadable: BTreeMap<String, String>,
}

/// Longest reason kept per unreadable node (a provider URL may be 64 KiB).
const MAX_REASON_CHARS: usize = 300;

/// `text` cut to [`MAX_REASON_CHARS`] characters.
pub(crate) fn short(text: &str) -> String {
    let mut chars = text.chars();
    let kept: String = chars.by_ref().take(MAX_REASON_CHARS).collect();
    if chars.next().is_some() {
        format!("{kept}... ({} bytes)", text.len())
    } else {
        kept
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ZkStats {
    pub fn new(ensemble: &str) -> Self {
        let stats = ZkStats::default();
        stats.update(|state| {
            state.ensemble = ensemble.to_owned();
            state.session = "connecting".to_owned();
        });
        stats
    }

    pub fn state(&self) -> SourceState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn update(&self, change: impl FnOnce(&mut SourceState)) {
        change(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub(crate) fn error(&self, error: impl std::fmt::Display) {
        let error = error.to_string();
        self.update(|state| state.last_error = Some((now(), error)));
    }

    pub(crate) fn session(&self, session: &str) {
        self.update(|state| {
            state.session = session.to_owned();
            if session == "expired" || session == "connecting" {
                state.session_id = None;
            }
        });
    }

    /// Whether the session is up (for readiness).
    pub fn connected(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        matches!(state.session.as_str(), "connected" | "read-only")
    }

    /// Unreadable nodes, counted without copying them.
    fn unreadable_nodes(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unreadable
            .len()
    }

    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn register_metrics(self: &std::sync::Arc<Self>, registry: &mut Registry) {
        let counters: [Counter; 9] = [
            ("zookeeper_writes", "Mapping nodes created or set", |s| {
                s.writes.load(Ordering::Relaxed)
            }),
            (
                "zookeeper_unchanged_writes",
                "Mapping writes that found every application already listed",
                |s| s.unchanged.load(Ordering::Relaxed),
            ),
            (
                "zookeeper_cas_conflicts",
                "Compare-and-swap tickets lost (the node changed or was created meanwhile)",
                |s| s.conflicts.load(Ordering::Relaxed),
            ),
            (
                "zookeeper_retries",
                "Mapping writes retried after an error",
                |s| s.retries.load(Ordering::Relaxed),
            ),
            (
                "zookeeper_rule_writes",
                "Rule nodes created, set or deleted through dubbo-cp",
                |s| s.rule_writes.load(Ordering::Relaxed),
            ),
            (
                "zookeeper_watch_events",
                "Node events the watch received",
                |s| s.watch_events.load(Ordering::Relaxed),
            ),
            ("zookeeper_relists", "Full re-lists of the ensemble", |s| {
                s.relists.load(Ordering::Relaxed)
            }),
            ("zookeeper_sessions", "Sessions established", |s| {
                s.sessions.load(Ordering::Relaxed)
            }),
            (
                "zookeeper_rewatches",
                "Persistent watches added again after a reconnection",
                |s| s.rewatches.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, read) in counters {
            scraped_counter(registry, name, help, self, read);
        }
        scraped_gauge(
            registry,
            "zookeeper_connected",
            "1 while the session with the ensemble is up",
            self,
            |s| i64::from(s.connected()),
        );
        scraped_gauge(
            registry,
            "zookeeper_unreadable_nodes",
            "Nodes skipped because their content cannot be read (see /debug/sources)",
            self,
            |s| s.unreadable_nodes() as i64,
        );
    }
}
