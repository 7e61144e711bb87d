//! `--rules-dir`: manifests kept in a directory (for people who keep rules in git) are applied
//! at start and again whenever a file changes. Each file is parsed on its own; a file that fails
//! keeps its last good objects and is reported (log line, `/debug/rules`), so one broken edit
//! never removes the rules other files, or the file's earlier version, define. Objects from
//! files that are gone are deleted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, watch};

use super::rules::{Report, StandaloneRules};
use crate::index::catalog::Catalog;
use crate::shutdown::signalled;
use dubbo_cp_domain::rules::{Rule, parse_manifests};

/// Changes within this time are read as one (editors write files in several steps).
const SETTLE: Duration = Duration::from_millis(200);
/// How long after a failed apply (the store or the ensemble did not answer) it is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// Where a rules directory's objects go: the standalone store, or ZooKeeper's nodes.
pub trait DirRules: Send + Sync {
    /// Makes the objects that came from the directory exactly `rules`; with `keep_others`,
    /// deletes none of the others (a file failed to parse: its last good objects stay).
    /// Blocking: called off the async threads.
    fn replace_dir(&self, rules: &[Rule], keep_others: bool) -> Result<Report, String>;
}

impl DirRules for StandaloneRules {
    fn replace_dir(&self, rules: &[Rule], keep_others: bool) -> Result<Report, String> {
        StandaloneRules::replace_dir(self, rules, keep_others).map_err(|err| err.to_string())
    }
}

/// How often the directory was applied (the start included), as
/// `dubbo_cp_rules_dir_applies_total`: a count that grows without edits means the watcher
/// wakes on something that is not one.
#[derive(Debug, Default)]
pub struct DirStats {
    applies: AtomicU64,
}

impl DirStats {
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        crate::metrics::scraped_counter(
            registry,
            "rules_dir_applies",
            "Times the rules directory was read and applied (at start and after each change)",
            self,
            |stats| stats.applies.load(Ordering::Relaxed),
        );
    }
}

/// The objects of each file, as last parsed successfully.
#[derive(Default)]
pub struct DirState {
    good: BTreeMap<PathBuf, Vec<Rule>>,
    stats: Arc<DirStats>,
    /// The directory as it was when last read (taken before reading, so a change during a
    /// read is applied again).
    read: Fingerprint,
}

/// What one reading of the directory gave.
struct Reading {
    objects: Vec<Rule>,
    errors: BTreeMap<String, String>,
    /// The directory itself could not be read: apply nothing.
    unreadable: bool,
}

impl DirState {
    pub fn stats(&self) -> &Arc<DirStats> {
        &self.stats
    }

    /// Reads every manifest file of `dir`. A file that fails keeps its previous objects.
    fn reload(&mut self, dir: &Path) -> Reading {
        let mut errors = BTreeMap::new();
        let mut seen = BTreeMap::new();
        let files = match std::fs::read_dir(dir) {
            Ok(entries) => {
                let mut files: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| is_manifest(p))
                    .collect();
                files.sort();
                files
            }
            Err(err) => {
                errors.insert(dir.display().to_string(), format!("cannot read: {err}"));
                return Reading {
                    objects: Vec::new(),
                    errors,
                    unreadable: true,
                };
            }
        };
        for file in files {
            let parsed = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read: {e}"))
                .and_then(|text| parse_manifests(&text).map_err(|e| e.to_string()));
            match parsed {
                Ok(rules) => {
                    seen.insert(file.clone(), rules);
                }
                Err(error) => {
                    tracing::warn!(file = %file.display(), %error, "rules file not applied; its last good objects stay");
                    errors.insert(file.display().to_string(), error);
                    if let Some(previous) = self.good.get(&file) {
                        seen.insert(file.clone(), previous.clone());
                    }
                }
            }
        }
        self.good = seen;
        Reading {
            objects: self.all(),
            errors,
            unreadable: false,
        }
    }

    fn all(&self) -> Vec<Rule> {
        // Later files win when two define the same object.
        let mut by_key = BTreeMap::new();
        for rule in self.good.values().flatten() {
            by_key.insert(crate::index::catalog::key_of(rule), rule.clone());
        }
        by_key.into_values().collect()
    }
}

fn is_manifest(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
}

/// Reads `dir` and applies it (blocking: file reads, SQLite or ZooKeeper). While any file
/// fails, stored directory objects are not deleted: after a restart the failed file's last good
/// objects are known only to the store. The errors are reported once the apply is done.
/// Returns false when the objects could not be stored (the caller tries again).
pub fn apply_once(
    rules: &dyn DirRules,
    catalog: &Catalog,
    dir: &Path,
    state: &mut DirState,
) -> bool {
    state.stats.applies.fetch_add(1, Ordering::Relaxed);
    state.read = fingerprint(dir);
    let reading = state.reload(dir);
    let mut stored = true;
    if !reading.unreadable {
        let keep_others = !reading.errors.is_empty();
        match rules.replace_dir(&reading.objects, keep_others) {
            Ok(report) => tracing::info!(
                created = report.created.len(),
                configured = report.configured.len(),
                deleted = report.deleted.len(),
                dir = %dir.display(),
                "rules directory applied"
            ),
            Err(error) => {
                tracing::error!(%error, retry_in = ?RETRY, "rules directory not applied");
                stored = false;
            }
        }
    }
    catalog.set_file_errors(reading.errors);
    stored
}

/// Refuses a rules directory that is not one, naming the path (at start, before any port
/// is bound, so the process exits instead of serving without its rules).
pub fn check_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => anyhow::bail!(
            "rules directory {} is not a directory (--rules-dir / rules.dir names a directory of manifests)",
            dir.display()
        ),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "rules directory {} does not exist (create it, or fix --rules-dir / rules.dir)",
            dir.display()
        ),
        Err(err) => anyhow::bail!("cannot read rules directory {}: {err}", dir.display()),
    }
}

/// Whether a watcher event says a file of the directory may have changed. Reads (open,
/// close-without-write), which the control plane's own reloads cause, do not: reacting to
/// them re-applied the directory every settle period forever.
fn is_change(event: &notify::Event) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode};
    match event.kind {
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Any | EventKind::Other => false,
    }
}

/// What decides a reload: each manifest file's name, size and modification time. Unchanged
/// (an event that changed nothing, such as an access-time update), nothing is applied.
type Fingerprint = Vec<(PathBuf, u64, Option<std::time::SystemTime>)>;

fn fingerprint(dir: &Path) -> Fingerprint {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| is_manifest(path))
        .map(|path| {
            let meta = std::fs::metadata(&path).ok();
            let size = meta.as_ref().map_or(0, |m| m.len());
            let modified = meta.and_then(|m| m.modified().ok());
            (path, size, modified)
        })
        .collect();
    files.sort();
    files
}

/// Watches `dir` for changes; the receiver wakes (at most one pending wake-up: every reload
/// reads the whole directory). Called at start, so a watch that cannot be set up stops it.
pub fn watch(dir: &Path) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    use notify::Watcher;
    let (wake, woken) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| is_change(&event)) {
            let _ = wake.try_send(());
        }
    })
    .with_context(|| format!("cannot watch rules directory {}", dir.display()))?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .with_context(|| format!("cannot watch rules directory {}", dir.display()))?;
    Ok((watcher, woken))
}

/// Applies `dir` after every change until shutdown (the first apply is [`apply_once`] at start,
/// after [`watch`], so no change between the two is missed).
/// `stored` says whether that first apply stored the objects; until one does, it is tried
/// again every few seconds.
pub async fn run(
    rules: Arc<dyn DirRules>,
    catalog: Arc<Catalog>,
    dir: PathBuf,
    mut state: DirState,
    (_watcher, mut woken): (notify::RecommendedWatcher, mpsc::Receiver<()>),
    mut stored: bool,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    loop {
        let retry = async {
            if stored {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(RETRY).await;
        };
        tokio::select! {
            woke = woken.recv() => if woke.is_none() { return Ok(()) },
            () = retry => {}
            () = signalled(&mut shutdown) => return Ok(()),
        }
        tokio::time::sleep(SETTLE).await;
        while woken.try_recv().is_ok() {}
        if stored && fingerprint(&dir) == state.read {
            continue;
        }
        let (rules, catalog, dir_path) = (rules.clone(), catalog.clone(), dir.clone());
        (state, stored) = tokio::task::spawn_blocking(move || {
            let stored = apply_once(rules.as_ref(), &catalog, &dir_path, &mut state);
            (state, stored)
        })
        .await?;
    }
}
