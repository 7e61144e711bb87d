//! `--rules-dir`: manifests kept in a directory (for people who keep rules in git) are applied
//! at start and again whenever a file changes. Each file is parsed on its own; a file that fails
//! keeps its last good objects and is reported (log line, `/debug/rules`), so one broken edit
//! never removes the rules other files, or the file's earlier version, define. Objects from
//! files that are gone are deleted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::rules::StandaloneRules;
use crate::rules::catalog::Catalog;
use crate::rules::{Rule, parse_manifests};
use crate::shutdown::signalled;

/// Changes within this time are read as one (editors write files in several steps).
const SETTLE: Duration = Duration::from_millis(200);

/// The objects of each file, as last parsed successfully.
#[derive(Default)]
pub struct DirState {
    good: BTreeMap<PathBuf, Vec<Rule>>,
}

/// What one reading of the directory gave.
struct Reading {
    objects: Vec<Rule>,
    errors: BTreeMap<String, String>,
    /// The directory itself could not be read: apply nothing.
    unreadable: bool,
}

impl DirState {
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
            by_key.insert(crate::rules::catalog::key_of(rule), rule.clone());
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

/// Reads `dir` and applies it (blocking: file reads and SQLite). While any file fails, stored
/// directory objects are not deleted: after a restart the failed file's last good objects are
/// known only to the store. The errors are reported once the apply is done.
pub fn apply_once(rules: &StandaloneRules, catalog: &Catalog, dir: &Path, state: &mut DirState) {
    let reading = state.reload(dir);
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
            Err(err) => tracing::error!(error = %err, "rules directory not applied"),
        }
    }
    catalog.set_file_errors(reading.errors);
}

/// Applies `dir` after every change until shutdown (the first apply is [`apply_once`] at start).
pub async fn run(
    rules: Arc<StandaloneRules>,
    catalog: Arc<Catalog>,
    dir: PathBuf,
    mut state: DirState,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use notify::Watcher;
    // One pending wake-up is enough: every reload reads the whole directory.
    let (wake, mut woken) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |_event: notify::Result<notify::Event>| {
        let _ = wake.try_send(());
    })?;
    watcher.watch(&dir, notify::RecursiveMode::NonRecursive)?;
    loop {
        tokio::select! {
            woke = woken.recv() => if woke.is_none() { return Ok(()) },
            () = signalled(&mut shutdown) => return Ok(()),
        }
        tokio::time::sleep(SETTLE).await;
        while woken.try_recv().is_ok() {}
        let (rules, catalog, dir_path) = (rules.clone(), catalog.clone(), dir.clone());
        state = tokio::task::spawn_blocking(move || {
            apply_once(&rules, &catalog, &dir_path, &mut state);
            state
        })
        .await?;
    }
}
