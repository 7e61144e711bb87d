//! The journal: new pairs are committed in arrival order and folded into the keyed tables later.
//! What matters is that a pair acknowledged from the journal is as durable as one in `mapping`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::mpsc;

use super::DB_FILE;
use crate::embedded::Store;
use crate::mapping::MappingKey;
use crate::{StoreError, StoreLimits, StoreWriter, StoredChange, test_registration};

/// Limits under which the writer never folds on its own during a test.
fn never_folding() -> StoreLimits {
    StoreLimits {
        fold_rows: usize::MAX,
        fold_idle: Duration::from_secs(3600),
        ..StoreLimits::default()
    }
}

fn open(dir: &Path, limits: StoreLimits) -> (Store, StoreWriter, mpsc::Receiver<StoredChange>) {
    let (tx, rx) = mpsc::channel(1024);
    let (store, writer) = Store::open(dir, limits, tx).unwrap();
    (store, writer, rx)
}

async fn close(writer: StoreWriter) {
    tokio::task::spawn_blocking(move || writer.shutdown())
        .await
        .unwrap();
}

/// (journal rows, mapping rows) as another reader of the database sees them.
fn rows(dir: &Path) -> (i64, i64) {
    let conn = Connection::open(dir.join(DB_FILE)).unwrap();
    let count = |table: &str| {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .unwrap()
    };
    (count("journal"), count("mapping"))
}

async fn wait_for_folds(store: &Store, folds: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.stats().journal_folds.load(Ordering::SeqCst) < folds {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer never folded"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn apps(store: &Store, interface: &str) -> Vec<String> {
    store
        .mappings()
        .get(&MappingKey::new("ns", interface))
        .map(|apps| apps.iter().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn acknowledged_pairs_in_the_journal_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer, _changes) = open(dir.path(), never_folding());
    store
        .register(test_registration("ns", "a", &["I1", "I2"]))
        .await
        .unwrap();
    store
        .register(test_registration("ns", "b", &["I1"]))
        .await
        .unwrap();
    // Two new keys: three pairs and two object names, all in the journal.
    assert_eq!(rows(dir.path()), (5, 0));

    // A crash: the files as they are now, without the writer's shutdown fold.
    let crashed = tempfile::tempdir().unwrap();
    for file in [DB_FILE, "dubbo-cp.db-wal"] {
        std::fs::copy(dir.path().join(file), crashed.path().join(file)).unwrap();
    }
    close(writer).await;

    let (reopened, writer, _changes) = open(crashed.path(), never_folding());
    assert_eq!(apps(&reopened, "I1"), ["a", "b"]);
    assert_eq!(apps(&reopened, "I2"), ["a"]);
    let name = reopened.object(&MappingKey::new("ns", "I1")).unwrap().name;
    assert_eq!(name, "i1");
    assert_eq!(rows(crashed.path()), (0, 3), "opening folds the journal");
    close(writer).await;
}

#[tokio::test]
async fn the_writer_folds_at_the_row_limit_when_idle_and_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let limits = StoreLimits {
        fold_rows: 4,
        ..never_folding()
    };
    let (store, writer, _changes) = open(dir.path(), limits);
    store
        .register(test_registration("ns", "a", &["I1"]))
        .await
        .unwrap();
    assert_eq!(rows(dir.path()), (2, 0));
    // 2 + 2 rows reach the limit.
    store
        .register(test_registration("ns", "a", &["I2"]))
        .await
        .unwrap();
    wait_for_folds(&store, 1).await;
    assert_eq!(rows(dir.path()), (0, 2));
    store
        .register(test_registration("ns", "b", &["I2"]))
        .await
        .unwrap();
    assert_eq!(rows(dir.path()), (1, 2));
    close(writer).await;
    assert_eq!(rows(dir.path()), (0, 3), "shutdown folds");

    let limits = StoreLimits {
        fold_idle: Duration::from_millis(20),
        ..never_folding()
    };
    let (store, writer, _changes) = open(dir.path(), limits);
    store
        .register(test_registration("ns", "c", &["I3"]))
        .await
        .unwrap();
    wait_for_folds(&store, 1).await;
    assert_eq!(rows(dir.path()), (0, 4));
    close(writer).await;
}

#[tokio::test]
async fn unregistering_a_pair_still_in_the_journal_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer, _changes) = open(dir.path(), never_folding());
    store
        .register(test_registration("ns", "a", &["I1", "I2"]))
        .await
        .unwrap();
    store
        .register(test_registration("ns", "b", &["I1"]))
        .await
        .unwrap();
    let removed = store
        .unregister("ns", "a", Some(BTreeSet::from(["I1".to_string()])))
        .await
        .unwrap();
    assert_eq!(removed, ["I1"]);
    assert_eq!(rows(dir.path()), (0, 2));
    close(writer).await;

    let (reopened, writer, _changes) = open(dir.path(), never_folding());
    assert_eq!(apps(&reopened, "I1"), ["b"]);
    assert_eq!(apps(&reopened, "I2"), ["a"]);
    close(writer).await;
}

#[tokio::test]
async fn a_database_from_a_newer_dubbo_cp_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (store, writer, _changes) = open(dir.path(), never_folding());
    store
        .register(test_registration("ns", "a", &["I1"]))
        .await
        .unwrap();
    close(writer).await;
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    conn.pragma_update(None, "user_version", super::SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);

    let (tx, _rx) = mpsc::channel(1);
    match Store::open(dir.path(), never_folding(), tx) {
        Err(err @ StoreError::NewerSchema { .. }) => {
            let message = err.to_string();
            assert!(
                message.contains(&format!("{}", super::SCHEMA_VERSION + 1)),
                "{message}"
            );
        }
        Err(other) => panic!("expected NewerSchema, got {other}"),
        Ok(_) => panic!("a newer database was opened"),
    }
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(
        version,
        super::SCHEMA_VERSION + 1,
        "the version was rewritten"
    );
}

#[tokio::test]
async fn folds_grow_with_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let limits = StoreLimits {
        fold_rows: 1,
        ..never_folding()
    };
    let (store, writer, _changes) = open(dir.path(), limits);
    for i in 0..64 {
        store
            .register(test_registration("ns", &format!("app-{i}"), &["I1"]))
            .await
            .unwrap();
    }
    // With a fixed limit of one row every commit would fold (64 folds); 1/8 of the table
    // waits longer as the table grows.
    let folds = store.stats().journal_folds.load(Ordering::SeqCst);
    assert!((10..50).contains(&folds), "{folds} folds for 64 pairs");
    let (journal, mapping) = rows(dir.path());
    assert!(
        journal <= 8,
        "{journal} rows wait, more than 1/8 of {mapping}"
    );
    assert_eq!(journal + mapping, 64);
    close(writer).await;
}

#[test]
fn a_writer_under_load_folds_at_the_row_limit_an_eighth_of_the_table_or_the_cap() {
    use super::writer::fold_threshold;
    let rows = StoreLimits::default().fold_rows;
    // A small table: a burst below the row limit waits for the idle fold.
    assert_eq!(fold_threshold(rows, 0), rows);
    assert_eq!(fold_threshold(rows, 8 * rows), rows);
    // A big one: an eighth of it, so each fold writes each page about once.
    assert_eq!(fold_threshold(rows, 8 * rows + 800), rows + 100);
    // A huge one: capped, so one fold stays short.
    assert_eq!(fold_threshold(rows, 100_000_000), 131_072);
    // A test's never-folding limit stays never.
    assert_eq!(fold_threshold(usize::MAX, 100_000_000), usize::MAX);
}

#[tokio::test]
async fn a_fold_bigger_than_the_page_cache_sorts_in_memory() {
    // The writer's connection keeps temporary data (the fold's sort) in memory: the deployed
    // container has no writable temporary directory.
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    super::sql::prepare_schema(&conn).unwrap();
    let temp_store: i64 = conn
        .pragma_query_value(None, "temp_store", |row| row.get(0))
        .unwrap();
    assert_eq!(temp_store, 2, "temp_store = MEMORY");
    // And a fold of 40,000 rows (past the 2 MiB page cache) goes through it.
    conn.execute_batch("BEGIN").unwrap();
    {
        let mut insert = conn
            .prepare(
                "INSERT INTO journal (namespace, interface, application) VALUES ('ns', ?1, ?2)",
            )
            .unwrap();
        for i in 0..40_000 {
            insert
                .execute(rusqlite::params![
                    format!("org.example.Service{}", i % 1000),
                    format!("application-{i:08}")
                ])
                .unwrap();
        }
    }
    conn.execute_batch("COMMIT").unwrap();
    let mut conn = conn;
    assert_eq!(super::sql::fold(&mut conn).unwrap(), 40_000);
    assert_eq!(rows(dir.path()), (0, 40_000));
}
