//! Standalone mode's rules: the truth for TagRoute, ConditionRoute, DynamicConfig and the auth
//! policies, in the same SQLite file as the mappings (its own connection: rule writes are rare,
//! admin-driven, and must not queue behind registrations). Every change is one transaction that
//! also moves the shared revision forward, so revisions never go backwards across restarts.
//!
//! Each row remembers where it came from (`api`: `dubbo-cp apply`; `dir`: `--rules-dir`), so
//! reloading the directory replaces its own objects and leaves applied ones alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::StoreError;
use super::db::DB_FILE;
use crate::index::Kind;
pub use crate::index::catalog::{RuleKey, describe, key_of};
use dubbo_cp_domain::rules::{Rule, RuleSpec};

/// How long a rule write waits for the mapping writer's transaction to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a stored rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `dubbo-cp apply` through the admin API.
    Api,
    /// A manifest file in `--rules-dir`.
    Dir,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Api => "api",
            Source::Dir => "dir",
        }
    }
}

/// What one write did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub created: Vec<String>,
    pub configured: Vec<String>,
    pub unchanged: Vec<String>,
    pub deleted: Vec<String>,
    #[serde(rename = "notFound")]
    pub not_found: Vec<String>,
}

/// A committed change, for the index: the new rule, or the key of a deleted one.
#[derive(Debug, Clone, PartialEq)]
pub enum RuleChange {
    Upsert(Rule),
    Delete(RuleKey),
}

pub struct RuleStore {
    conn: Mutex<Connection>,
}

impl RuleStore {
    /// Opens the rules of the database in `data_dir` (which [`super::Store::open`] created and
    /// locked). Returns the store and every rule in it; rows that no longer validate are
    /// logged and skipped, never deleted.
    pub fn open(data_dir: &Path) -> Result<(RuleStore, Vec<Rule>), StoreError> {
        let conn = Connection::open(data_dir.join(DB_FILE))?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS rule (
                 kind      TEXT NOT NULL,
                 namespace TEXT NOT NULL,
                 name      TEXT NOT NULL,
                 spec      TEXT NOT NULL,
                 source    TEXT NOT NULL,
                 created   INTEGER NOT NULL DEFAULT 0,
                 PRIMARY KEY (kind, namespace, name)
             ) WITHOUT ROWID;",
        )?;
        add_created_column(&conn)?;
        let mut rules = Vec::new();
        {
            let mut stmt = conn.prepare("SELECT kind, namespace, name, spec, created FROM rule")?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let (kind, namespace, name, spec): (String, String, String, String) =
                    (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
                let created: i64 = row.get(4)?;
                match parse_row(&kind, &spec) {
                    Ok(spec) => rules.push(Rule {
                        namespace,
                        name,
                        spec,
                        created: Some(created),
                    }),
                    Err(reason) => {
                        tracing::error!(%kind, %namespace, %name, %reason, "stored rule skipped")
                    }
                }
            }
        }
        Ok((
            RuleStore {
                conn: Mutex::new(conn),
            },
            rules,
        ))
    }

    /// Creates or replaces `rules` in one transaction (all or nothing). Returns what happened,
    /// the changes (empty when nothing changed) and the revision they were committed at.
    pub fn apply(
        &self,
        rules: &[Rule],
        source: Source,
    ) -> Result<(Report, Vec<RuleChange>, i64), StoreError> {
        self.write(rules, source, Deletions::Keys(&[]))
    }

    /// Deletes `keys` in one transaction.
    pub fn delete(&self, keys: &[RuleKey]) -> Result<(Report, Vec<RuleChange>, i64), StoreError> {
        self.write(&[], Source::Api, Deletions::Keys(keys))
    }

    /// Makes the objects from `--rules-dir` exactly `rules`, in one transaction: creates and
    /// replaces them, and deletes directory objects that are gone (unless `keep_others`, when a
    /// file failed to parse and its objects cannot be told apart). Objects applied through the
    /// API are untouched unless the directory names them too (then the directory's version wins).
    pub fn replace_dir(
        &self,
        rules: &[Rule],
        keep_others: bool,
    ) -> Result<(Report, Vec<RuleChange>, i64), StoreError> {
        let deletions = if keep_others {
            Deletions::Keys(&[])
        } else {
            Deletions::DirExcept
        };
        self.write(rules, Source::Dir, deletions)
    }

    /// One IMMEDIATE transaction (it takes the write lock first, so a registration committing
    /// meanwhile makes it wait, `busy_timeout`, rather than fail): upserts, then deletions.
    fn write(
        &self,
        rules: &[Rule],
        source: Source,
        deletions: Deletions<'_>,
    ) -> Result<(Report, Vec<RuleChange>, i64), StoreError> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut report = Report::default();
        let mut changes = Vec::new();
        // The newest `created` of the table, once read.
        let mut newest_created: Option<i64> = None;
        for rule in rules {
            let newest = newest_created;
            let key = key_of(rule);
            let spec = rule.spec.to_json().to_string();
            let stored: Option<(String, String, i64)> = tx
                .query_row(
                    "SELECT spec, source, created FROM rule \
                     WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
                    params![key.0.name(), key.1, key.2],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()?;
            // An object keeps the time it was first created through every update, as a
            // Kubernetes object keeps its creationTimestamp. A new one is created after every
            // other (a millisecond later at least): objects are ordered as they were created.
            let created = match &stored {
                Some((_, _, created)) => *created,
                None => {
                    // Read once per transaction (no index on the column), then counted on.
                    let newest = match newest {
                        Some(newest) => newest,
                        None => {
                            tx.query_row("SELECT COALESCE(MAX(created), 0) FROM rule", [], |row| {
                                row.get::<_, i64>(0)
                            })?
                        }
                    };
                    let created = now_millis().max(newest.saturating_add(1));
                    newest_created = Some(created);
                    created
                }
            };
            let stored_rule = Rule {
                created: Some(created),
                ..rule.clone()
            };
            match stored {
                Some((old, old_source, _)) if old == spec && old_source == source.name() => {
                    report.unchanged.push(describe(&key));
                    continue;
                }
                Some((old, _, _)) if old == spec => report.unchanged.push(describe(&key)),
                Some(_) => {
                    report.configured.push(describe(&key));
                    changes.push(RuleChange::Upsert(stored_rule));
                }
                None => {
                    report.created.push(describe(&key));
                    changes.push(RuleChange::Upsert(stored_rule));
                }
            }
            tx.execute(
                "INSERT INTO rule (kind, namespace, name, spec, source, created) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (kind, namespace, name) DO UPDATE SET spec = ?4, source = ?5",
                params![key.0.name(), key.1, key.2, spec, source.name(), created],
            )?;
        }
        let doomed: Vec<RuleKey> = match deletions {
            Deletions::Keys(keys) => keys.to_vec(),
            Deletions::DirExcept => {
                let wanted: std::collections::BTreeSet<RuleKey> =
                    rules.iter().map(key_of).collect();
                let mut stmt =
                    tx.prepare("SELECT kind, namespace, name FROM rule WHERE source = 'dir'")?;
                let rows = stmt.query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                })?;
                let mut doomed = Vec::new();
                for row in rows {
                    let (kind, namespace, name) = row?;
                    if let Some(kind) = Kind::from_name(&kind) {
                        let key = (kind, namespace, name);
                        if !wanted.contains(&key) {
                            doomed.push(key);
                        }
                    }
                }
                doomed
            }
        };
        for key in &doomed {
            let removed = tx.execute(
                "DELETE FROM rule WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
                params![key.0.name(), key.1, key.2],
            )?;
            if removed > 0 {
                report.deleted.push(describe(key));
                changes.push(RuleChange::Delete(key.clone()));
            } else {
                report.not_found.push(describe(key));
            }
        }
        let revision = bump(&tx)?;
        tx.commit()?;
        Ok((report, changes, revision))
    }
}

/// What a write deletes besides its upserts.
enum Deletions<'a> {
    Keys(&'a [RuleKey]),
    /// Every directory object not among the upserts.
    DirExcept,
}

/// Milliseconds since the Unix epoch, now.
fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Adds `created` to a rule table written before it existed: its rows count as created at 0,
/// before anything created since.
fn add_created_column(conn: &Connection) -> Result<(), StoreError> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('rule')")?;
    let columns = stmt
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<String>, _>>()?;
    if !columns.iter().any(|c| c == "created") {
        conn.execute_batch("ALTER TABLE rule ADD COLUMN created INTEGER NOT NULL DEFAULT 0;")?;
    }
    Ok(())
}

fn parse_row(kind: &str, spec: &str) -> Result<RuleSpec, String> {
    let kind = Kind::from_name(kind).ok_or_else(|| format!("unknown kind {kind:?}"))?;
    let value: serde_json::Value = serde_json::from_str(spec).map_err(|e| e.to_string())?;
    RuleSpec::parse(kind, &value).map_err(|e| e.to_string())
}

/// Moves the shared revision forward inside the transaction; the change is published at it.
fn bump(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<i64> {
    tx.query_row(
        "UPDATE meta SET value = value + 1 WHERE name = 'revision' RETURNING value",
        [],
        |row| row.get(0),
    )
}

/// Why a rule write was refused.
#[derive(Debug, thiserror::Error)]
pub enum RuleWriteError {
    /// The manifests do not parse or validate; nothing was stored.
    #[error(transparent)]
    Invalid(#[from] dubbo_cp_domain::rules::ManifestError),
    #[error("the rule store failed: {0}")]
    Storage(#[from] StoreError),
}

/// Standalone rules end to end: manifests in, one transaction, then the index and the catalog.
pub struct StandaloneRules {
    /// Held from a write's commit through its publication, so a later commit is never
    /// published before an earlier one (the index would end on the older version).
    writing: Mutex<()>,
    store: RuleStore,
    index: std::sync::Arc<crate::index::Index>,
    catalog: std::sync::Arc<crate::index::catalog::Catalog>,
    root_namespace: String,
}

impl StandaloneRules {
    /// Serves `rules` (as [`RuleStore::open`] read them) at `revision`.
    pub fn new(
        store: RuleStore,
        rules: Vec<Rule>,
        index: std::sync::Arc<crate::index::Index>,
        catalog: std::sync::Arc<crate::index::catalog::Catalog>,
        root_namespace: String,
        revision: i64,
    ) -> Self {
        let this = Self {
            writing: Mutex::new(()),
            store,
            index,
            catalog,
            root_namespace,
        };
        let changes: Vec<RuleChange> = rules.into_iter().map(RuleChange::Upsert).collect();
        this.publish(changes, revision);
        this
    }

    /// `dubbo-cp apply`: every document validated first, then all stored in one transaction.
    pub fn apply(&self, manifests: &str) -> Result<Report, RuleWriteError> {
        let rules = dubbo_cp_domain::rules::parse_manifests(manifests)?;
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (report, changes, revision) = self.store.apply(&rules, Source::Api)?;
        self.publish(changes, revision);
        Ok(report)
    }

    /// `--rules-dir`: makes the directory's objects exactly `rules` (already validated).
    pub fn replace_dir(&self, rules: &[Rule], keep_others: bool) -> Result<Report, RuleWriteError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (report, changes, revision) = self.store.replace_dir(rules, keep_others)?;
        self.publish(changes, revision);
        Ok(report)
    }

    /// `dubbo-cp delete -f`: the objects the manifests name.
    pub fn delete_manifests(&self, manifests: &str) -> Result<Report, RuleWriteError> {
        let keys: Vec<RuleKey> = dubbo_cp_domain::rules::parse_manifests(manifests)?
            .iter()
            .map(key_of)
            .collect();
        self.delete(&keys)
    }

    pub fn delete(&self, keys: &[RuleKey]) -> Result<Report, RuleWriteError> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (report, changes, revision) = self.store.delete(keys)?;
        self.publish(changes, revision);
        Ok(report)
    }

    fn publish(&self, changes: Vec<RuleChange>, revision: i64) {
        let mut by_kind: BTreeMap<Kind, Vec<crate::index::Change>> = BTreeMap::new();
        for change in changes {
            match change {
                RuleChange::Upsert(rule) => {
                    by_kind.entry(rule.kind()).or_default().push(
                        crate::index::catalog::change_for(&rule, &self.root_namespace),
                    );
                    self.catalog.upsert(rule);
                }
                RuleChange::Delete(key) => {
                    by_kind
                        .entry(key.0)
                        .or_default()
                        .push(crate::index::catalog::delete_for(&key));
                    self.catalog.remove(&key);
                }
            }
        }
        for (kind, changes) in by_kind {
            self.index.apply(kind, changes, revision);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(namespace: &str, name: &str) -> Rule {
        let manifest = format!(
            "apiVersion: dubbo.apache.org/v1alpha1\nkind: ServiceEntry\n\
             metadata: {{name: {name}, namespace: {namespace}}}\n\
             spec: {{hosts: [api.payments.internal], ports: [{{number: 50051, name: grpc}}]}}\n"
        );
        let mut rules =
            dubbo_cp_domain::rules::parse_manifests(&manifest).unwrap_or_else(|e| panic!("{e}"));
        rules.remove(0)
    }

    #[test]
    fn rules_keep_when_they_were_created_and_a_table_from_before_gets_the_column() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        {
            // A table as it was before `created`, with one row.
            let conn = Connection::open(dir.path().join(DB_FILE)).unwrap_or_else(|e| panic!("{e}"));
            conn.execute_batch(
                "CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                 INSERT INTO meta VALUES ('revision', 1);
                 CREATE TABLE rule (kind TEXT NOT NULL, namespace TEXT NOT NULL,
                     name TEXT NOT NULL, spec TEXT NOT NULL, source TEXT NOT NULL,
                     PRIMARY KEY (kind, namespace, name)) WITHOUT ROWID;",
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let old = entry("shop", "old");
            conn.execute(
                "INSERT INTO rule VALUES ('ServiceEntry', 'shop', 'old', ?1, 'api')",
                params![old.spec.to_json().to_string()],
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        let (store, rules) = RuleStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            rules[0].created,
            Some(0),
            "older than anything created since"
        );
        let created = |changes: &[RuleChange]| match changes {
            [RuleChange::Upsert(rule)] => rule.created.unwrap_or_default(),
            other => panic!("{other:?}"),
        };
        let (_, first, _) = store
            .apply(&[entry("shop", "a")], Source::Api)
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, second, _) = store
            .apply(&[entry("shop", "b")], Source::Api)
            .unwrap_or_else(|e| panic!("{e}"));
        // Ordered as created, even within one millisecond.
        assert!(created(&first) > 0 && created(&second) > created(&first));
        // An update keeps the time of creation.
        let mut changed = entry("shop", "a");
        if let RuleSpec::ServiceEntry(spec) = &mut changed.spec {
            spec.hosts.push("payments".into());
        }
        let (_, updated, _) = store
            .apply(&[changed], Source::Api)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(created(&updated), created(&first));
        drop(store);
        let (_, rules) = RuleStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let by_name: BTreeMap<String, Option<i64>> =
            rules.into_iter().map(|r| (r.name, r.created)).collect();
        assert_eq!(by_name["a"], Some(created(&first)));
        assert_eq!(by_name["b"], Some(created(&second)));
    }
}
