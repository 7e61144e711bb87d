//! The SQL of the store: the schema, loading, and the row writes the writer batches.

use super::*;

/// The rows of the `registrant` table `registrants` stands for.
pub(super) fn registrant_rows(
    registrants: &PendingRegistrants,
) -> impl Iterator<Item = (&MappingKey, &String, &String)> {
    registrants.iter().flat_map(|(key, pending)| {
        pending.iter().flat_map(move |(application, pods)| {
            pods.iter().map(move |pod| (key, application, pod))
        })
    })
}

/// Deletes `pairs` and written registrant records; with `revision`, also moves the stored
/// revision to it (a change clients see). Returns the rows the journal added to `mapping` and
/// the rows deleted from it.
pub(super) fn delete_pairs(
    conn: &mut Connection,
    pairs: &MappingDelta,
    registrants: &PendingRegistrants,
    revision: Option<i64>,
) -> rusqlite::Result<(usize, usize)> {
    let tx = conn.transaction()?;
    // A pair still in the journal is deleted from the keyed table once folded there.
    let folded = fold_journal(&tx)?;
    let mut deleted = 0;
    {
        let mut forget = tx.prepare_cached(
            "DELETE FROM registrant WHERE namespace = ?1 AND interface = ?2 AND application = ?3 AND pod = ?4",
        )?;
        for (key, application, pod) in registrant_rows(registrants) {
            forget.execute(params![key.namespace, key.interface, application, pod])?;
        }
        if let Some(revision) = revision {
            tx.execute(
                "UPDATE meta SET value = MAX(value, ?1) WHERE name = 'revision'",
                params![revision],
            )?;
        }
        let mut delete = tx.prepare_cached(
            "DELETE FROM mapping WHERE namespace = ?1 AND interface = ?2 AND application = ?3",
        )?;
        for (key, apps) in pairs.iter() {
            for app in apps {
                deleted += delete.execute(params![key.namespace, key.interface, app])?;
            }
        }
    }
    tx.commit()?;
    Ok((folded, deleted))
}

pub(super) fn prepare_schema(conn: &Connection) -> rusqlite::Result<()> {
    // WAL lets readers (an operator's sqlite3 shell) work beside the writer; FULL makes every
    // commit survive a power cut, not only a process crash.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // A fold sorts up to 131,072 journal rows (about 10 MiB). Past the page cache (2 MiB) SQLite
    // would spill the sort to a temporary file, and the StatefulSet's root filesystem is
    // read-only with no writable temporary directory: the fold, and so every start, would fail.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS mapping (
             namespace   TEXT NOT NULL,
             interface   TEXT NOT NULL,
             application TEXT NOT NULL,
             PRIMARY KEY (namespace, interface, application)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS object_name (
             namespace TEXT NOT NULL,
             interface TEXT NOT NULL,
             name      TEXT NOT NULL,
             PRIMARY KEY (namespace, interface),
             UNIQUE (namespace, name)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS registrant (
             namespace   TEXT NOT NULL,
             interface   TEXT NOT NULL,
             application TEXT NOT NULL,
             pod         TEXT NOT NULL,
             PRIMARY KEY (namespace, interface, application, pod)
         ) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS journal (
             seq         INTEGER PRIMARY KEY,
             namespace   TEXT NOT NULL,
             interface   TEXT NOT NULL,
             application TEXT,
             name        TEXT
         );
         CREATE TABLE IF NOT EXISTS meta (
             name  TEXT PRIMARY KEY,
             value INTEGER NOT NULL
         ) WITHOUT ROWID;
         INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 0);",
    )?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    Ok(())
}

/// Moves the revision past every earlier one, so clients never see it go backwards across a
/// restart, even when the state itself did not change.
pub(super) fn bump_revision(conn: &mut Connection) -> rusqlite::Result<i64> {
    conn.query_row(
        "UPDATE meta SET value = value + 1 WHERE name = 'revision' RETURNING value",
        [],
        |row| row.get(0),
    )
}

/// Registering pods committed and not yet written to their objects (Kubernetes mode).
pub(super) fn load_registrants(
    conn: &Connection,
) -> rusqlite::Result<DashMap<MappingKey, Pending>> {
    let pending: DashMap<MappingKey, Pending> = DashMap::new();
    let mut stmt = conn.prepare("SELECT namespace, interface, application, pod FROM registrant")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let key = MappingKey::new(row.get::<_, String>(0)?, row.get::<_, String>(1)?);
        let application: String = row.get(2)?;
        let pod: String = row.get(3)?;
        registrants::add_pending(
            pending.entry(key).or_default().value_mut(),
            &application,
            &pod,
        );
    }
    Ok(pending)
}

pub(super) fn load_all(conn: &Connection) -> rusqlite::Result<SharedMappings> {
    let committed = SharedMappings::new();
    let mut stmt = conn.prepare("SELECT namespace, interface, application FROM mapping")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let key = MappingKey::new(row.get::<_, String>(0)?, row.get::<_, String>(1)?);
        committed.entry(key).or_default().insert(row.get(2)?);
    }
    Ok(committed)
}

/// The persisted object names; keys stored before names were persisted (schema 1) get theirs
/// now, in key order, and keep them from then on.
pub(super) fn load_names(
    conn: &mut Connection,
    committed: &SharedMappings,
) -> rusqlite::Result<Vec<(MappingKey, String)>> {
    let mut names: Vec<(MappingKey, String)> = Vec::new();
    {
        let mut stmt = conn.prepare("SELECT namespace, interface, name FROM object_name")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let key = MappingKey::new(row.get::<_, String>(0)?, row.get::<_, String>(1)?);
            names.push((key, row.get(2)?));
        }
    }
    let named: HashSet<&MappingKey> = names.iter().map(|(key, _)| key).collect();
    let mut unnamed: Vec<MappingKey> = committed
        .iter()
        .map(|entry| entry.key().clone())
        .filter(|key| !named.contains(key))
        .collect();
    if unnamed.is_empty() {
        return Ok(names);
    }
    unnamed.sort();
    let mut taken: HashMap<String, HashSet<String>> = HashMap::new();
    for (key, name) in &names {
        taken
            .entry(key.namespace.clone())
            .or_default()
            .insert(name.clone());
    }
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO object_name (namespace, interface, name) VALUES (?1, ?2, ?3)",
        )?;
        for key in unnamed {
            let taken = taken.entry(key.namespace.clone()).or_default();
            let Some(name) = candidate_names(&key.interface)
                .into_iter()
                .find(|name| !taken.contains(name))
            else {
                tracing::error!(%key, "no free object name; the mapping is not served");
                continue;
            };
            insert.execute(params![key.namespace, key.interface, name])?;
            taken.insert(name.clone());
            names.push((key, name));
        }
    }
    tx.commit()?;
    Ok(names)
}

/// Writes new pairs (and new keys' object names) to the journal in one transaction.
///
/// New pairs arrive in random key order, so inserting them into the keyed tables dirtied about
/// one page per pair per table in every commit: 9 KB written per pair, the disk busy and the
/// cores waiting on it. The journal is appended in arrival order (a few pages per commit);
/// [`fold_journal`] moves its rows into the keyed tables in key order, thousands at a time.
pub(super) fn write_pairs(
    conn: &mut Connection,
    pairs: &MappingDelta,
    registrants: &PendingRegistrants,
    names: &[(MappingKey, String)],
    revision: i64,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut record = tx.prepare_cached(
            "INSERT OR IGNORE INTO registrant (namespace, interface, application, pod) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (key, application, pod) in registrant_rows(registrants) {
            record.execute(params![key.namespace, key.interface, application, pod])?;
        }
        let mut journal = tx.prepare_cached(
            "INSERT INTO journal (namespace, interface, application, name) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (key, apps) in pairs.iter() {
            for app in apps {
                journal.execute(params![key.namespace, key.interface, app, None::<&str>])?;
            }
        }
        for (key, object_name) in names {
            journal.execute(params![
                key.namespace,
                key.interface,
                None::<&str>,
                object_name
            ])?;
        }
        // Cached like the inserts: parsing it again on every commit cost the writer more than
        // running it.
        tx.prepare_cached("UPDATE meta SET value = MAX(value, ?1) WHERE name = 'revision'")?
            .execute(params![revision])?;
    }
    tx.commit()
}

/// Moves every journal row into `mapping` and `object_name`, in key order, inside `tx`;
/// returns the pairs it added to `mapping` (a pair journaled twice, or already there, counts
/// once or not at all). `OR IGNORE`: a pair already there stays as it is, and a key keeps
/// the first name it was given (the writer never gives a key two, nor a name to two keys).
pub(super) fn fold_journal(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<usize> {
    let added = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO mapping (namespace, interface, application)
         SELECT namespace, interface, application FROM journal
         WHERE application IS NOT NULL ORDER BY namespace, interface, application",
        )?
        .execute([])?;
    tx.prepare_cached(
        "INSERT OR IGNORE INTO object_name (namespace, interface, name)
         SELECT namespace, interface, name FROM journal
         WHERE name IS NOT NULL ORDER BY namespace, interface",
    )?
    .execute([])?;
    tx.prepare_cached("DELETE FROM journal")?.execute([])?;
    Ok(added)
}

/// [`fold_journal`] in a transaction of its own.
pub(super) fn fold(conn: &mut Connection) -> rusqlite::Result<usize> {
    let tx = conn.transaction()?;
    let moved = fold_journal(&tx)?;
    tx.commit()?;
    Ok(moved)
}
