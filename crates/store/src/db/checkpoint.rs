//! WAL checkpoints on their own thread. SQLite's automatic checkpoint runs inside the commit
//! that crosses its threshold, so that commit (and every registration waiting on it) also pays
//! for copying the WAL into the database file and syncing it. Here the writer's WAL hook only
//! signals; a second connection runs a PASSIVE checkpoint, which never blocks the writer, and
//! the writer's commits stay one WAL append and one sync each. Durability is unchanged: a
//! commit is durable once its WAL frames are synced, checkpointed or not.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use rusqlite::Connection;

use crate::StoreError;

/// WAL pages after which a checkpoint is asked for: SQLite's own default threshold.
pub(super) const CHECKPOINT_PAGES: i32 = 1000;

/// The checkpoint thread; dropping it (after the writer's connection, which holds the hook's
/// sender) lets the thread finish its checkpoint and waits for it.
pub(super) struct Checkpointer {
    signal: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Hooks `writer`'s commits and starts the thread over its own connection to `db_file`.
    pub(super) fn start(
        writer: &mut Connection,
        db_file: &Path,
    ) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(db_file)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // One pending request is enough: a checkpoint copies everything committed before it.
        let (signal, requests) = sync_channel::<()>(1);
        let hook_signal = signal.clone();
        // Replaces SQLite's automatic checkpoint on this connection (the hook is where it lives).
        writer.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: i32| {
            if pages >= CHECKPOINT_PAGES {
                // Full: one is already pending. Disconnected: the thread is gone (shutdown).
                let _ = hook_signal.try_send(());
            }
            Ok(())
        }))?;
        let thread = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || run(conn, requests))
            .map_err(|source| StoreError::DataDir {
                path: db_file.to_path_buf(),
                source,
            })?;
        Ok(Checkpointer {
            signal: Some(signal),
            thread: Some(thread),
        })
    }
}

fn run(conn: Connection, requests: Receiver<()>) {
    // Ends when the writer's hook and this handle are both gone.
    while requests.recv().is_ok() {
        if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            // The WAL keeps growing until a later checkpoint succeeds; commits are unaffected.
            tracing::warn!(error = %err, "WAL checkpoint failed; will retry on the next commit");
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.signal.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("store checkpoint thread panicked");
        }
    }
}
