//! The writer thread: takes every command queued since its last commit, applies them in one
//! transaction, commits (one fsync), then answers each caller and publishes the changes.

use super::*;

/// Most journal rows a fold under load waits for, however big the table: one fold is a
/// transaction every registration behind it waits for, and this many rows fold in well under a
/// second.
const FOLD_ROWS_CAP: usize = 131_072;

/// Journal rows at which a writer under load folds. A fold writes about one page per row for
/// rows scattered over a big table, so folds grow with the table (1/8 of it): each then writes
/// each page about once, amortized. Below `fold_rows` a burst is folded after it, when idle.
pub(super) fn fold_threshold(fold_rows: usize, table_rows: usize) -> usize {
    fold_rows.max((table_rows / 8).min(FOLD_ROWS_CAP))
}

pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) known: Known,
    pub(super) stats: Arc<StoreStats>,
    pub(super) changes: mpsc::Sender<StoredChange>,
    pub(super) limits: StoreLimits,
    /// Object names in use per namespace (standalone), so a new key never takes a used one.
    pub(super) taken: HashMap<String, HashSet<String>>,
    /// Keeps the data directory locked for as long as the writer runs.
    pub(super) _lock: File,
    pub(super) revision: i64,
    /// Rows committed to the journal and not yet folded.
    pub(super) journal_rows: usize,
    /// About how many pairs the keyed table holds (what folds added, less what was deleted).
    pub(super) table_rows: usize,
    /// Dropped when the thread ends, which tells the supervisor.
    pub(super) _exit: oneshot::Sender<()>,
}

pub(super) type Reply = oneshot::Sender<Result<RegisterOutcome, StoreError>>;

impl Writer {
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut batch: Vec<(Registration, Reply)> = Vec::with_capacity(self.limits.max_batch);
        let mut stopping = false;
        // Only a timer, so an idle writer can fold what a burst left in the journal.
        let timer = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build();
        if let Err(err) = &timer {
            // Folds then happen at the row limit, on shutdown and at the next start only.
            tracing::warn!(error = %err, "no timer for the store writer; the journal is not folded when idle");
        }
        while !stopping {
            let received = match &timer {
                Ok(timer) if self.journal_rows > 0 => timer.block_on(async {
                    tokio::time::timeout(self.limits.fold_idle, rx.recv()).await
                }),
                _ => Ok(rx.blocking_recv()),
            };
            let Ok(received) = received else {
                self.fold();
                continue;
            };
            let Some(first) = received else {
                break;
            };
            let mut next = Some(first);
            while let Some(command) = next.take() {
                match command {
                    Command::Register {
                        registration,
                        bytes,
                        reply,
                    } => {
                        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
                        self.stats.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
                        batch.push((registration, reply));
                    }
                    Command::Complete(pairs, registrants) => {
                        // Registrations queued before it are committed first, so a pair
                        // registered again meanwhile is not lost by the removal.
                        self.commit(&mut batch);
                        self.remove(&pairs, &registrants);
                    }
                    Command::Unregister {
                        namespace,
                        application,
                        interfaces,
                        reply,
                    } => {
                        self.commit(&mut batch);
                        let removed =
                            self.unregister(&namespace, &application, interfaces.as_ref());
                        let _ = reply.send(removed);
                    }
                    Command::Shutdown => stopping = true,
                }
                if !stopping && batch.len() < self.limits.max_batch {
                    next = rx.try_recv().ok();
                }
            }
            self.commit(&mut batch);
            if self.journal_rows >= fold_threshold(self.limits.fold_rows, self.table_rows) {
                self.fold();
            }
        }
        self.fold();
    }

    /// Moves the journal into the keyed tables. On failure the rows stay in the journal, which
    /// is as durable, and the next fold (or the next start) tries again.
    pub(super) fn fold(&mut self) {
        if self.journal_rows == 0 {
            return;
        }
        match fold(&mut self.conn) {
            Ok(added) => {
                self.table_rows += added;
                self.journal_rows = 0;
                self.stats.journal_folds.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %err, rows = self.journal_rows, "cannot fold the store's journal");
            }
        }
    }

    /// Deletes an application's pairs in one transaction with a new revision, then publishes the
    /// keys it left (the publisher reads what each key holds now).
    pub(super) fn unregister(
        &mut self,
        namespace: &str,
        application: &str,
        interfaces: Option<&BTreeSet<String>>,
    ) -> Result<MappingDelta, StoreError> {
        let mut removed = MappingDelta::default();
        for entry in self.known.committed.iter() {
            let key = entry.key();
            if key.namespace == namespace
                && interfaces.is_none_or(|wanted| wanted.contains(&key.interface))
                && entry.value().contains(application)
            {
                removed.add(key.clone(), application.to_owned());
            }
        }
        if removed.is_empty() {
            return Ok(removed);
        }
        let none = PendingRegistrants::new();
        let (folded, deleted) =
            match delete_pairs(&mut self.conn, &removed, &none, Some(self.revision + 1)) {
                Ok(counts) => counts,
                Err(err) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(StoreError::CommitFailed(Arc::new(err)));
                }
            };
        self.table_rows = (self.table_rows + folded).saturating_sub(deleted);
        self.journal_rows = 0;
        self.revision += 1;
        self.stats
            .pairs_removed
            .fetch_add(removed.pairs() as u64, Ordering::Relaxed);
        self.forget(&removed);
        let change = StoredChange {
            delta: removed.clone(),
            revision: self.revision,
        };
        if self.changes.blocking_send(change).is_err() {
            tracing::warn!("change feed closed; stored changes are no longer published");
        }
        Ok(removed)
    }

    pub(super) fn remove(&mut self, pairs: &MappingDelta, registrants: &PendingRegistrants) {
        // A pod recorded while the write was in flight keeps its pair pending, so the writer
        // (now, or after a restart) writes it too.
        let mut done = MappingDelta::default();
        for (key, apps) in pairs.iter() {
            let pending = self.known.registrants.get(key);
            let written = registrants.get(key);
            for app in apps {
                let unwritten = pending
                    .as_ref()
                    .and_then(|p| p.get(app))
                    .is_some_and(|pods| {
                        let written = written.and_then(|w| w.get(app));
                        pods.iter()
                            .any(|pod| written.is_none_or(|w| !w.contains(pod)))
                    });
                if !unwritten {
                    done.add(key.clone(), app.clone());
                }
            }
        }
        let (folded, deleted) = match delete_pairs(&mut self.conn, &done, registrants, None) {
            Ok(counts) => counts,
            Err(err) => {
                // They stay in the outbox and are written again (a no-op upsert) after a restart.
                tracing::warn!(error = %err, "cannot remove written pairs from the outbox");
                return;
            }
        };
        self.table_rows = (self.table_rows + folded).saturating_sub(deleted);
        self.journal_rows = 0;
        self.forget(&done);
        for (key, written) in registrants {
            if let Some(mut pending) = self.known.registrants.get_mut(key) {
                for (application, pods) in written {
                    if let Some(left) = pending.get_mut(application) {
                        left.retain(|pod| !pods.contains(pod));
                        if left.is_empty() {
                            pending.remove(application);
                        }
                    }
                }
            }
            self.known
                .registrants
                .remove_if(key, |_, pending| pending.is_empty());
        }
    }

    /// Drops removed pairs from the in-memory mirror.
    pub(super) fn forget(&self, pairs: &MappingDelta) {
        for (key, apps) in pairs.iter() {
            if let Some(mut stored) = self.known.committed.get_mut(key) {
                stored.retain(|app| !apps.contains(app));
            }
            self.known
                .committed
                .remove_if(key, |_, stored| stored.is_empty());
        }
    }

    /// A name for a new key (standalone): its first candidate no other key of the namespace
    /// holds. Deterministic given the order keys arrive in, and persisted, so it never changes.
    pub(super) fn assign_name(&mut self, key: &MappingKey) -> String {
        let taken = self.taken.entry(key.namespace.clone()).or_default();
        let candidates = candidate_names(&key.interface);
        let name = candidates
            .iter()
            .find(|name| !taken.contains(*name))
            .cloned()
            .unwrap_or_else(|| {
                // All three taken: only possible for a crafted 64-bit hash collision.
                let last = candidates.last().cloned().unwrap_or_default();
                (2..)
                    .map(|n| format!("{last}-{n}"))
                    .find(|name| !taken.contains(name))
                    .unwrap_or(last)
            });
        taken.insert(name.clone());
        name
    }

    /// Writes the new pairs of a batch in one transaction and answers every caller in it.
    pub(super) fn commit(&mut self, batch: &mut Vec<(Registration, Reply)>) {
        if batch.is_empty() {
            return;
        }
        let mut new_pairs = MappingDelta::default();
        let mut new_registrants = PendingRegistrants::new();
        let mut outcomes: Vec<Result<usize, StoreError>> = Vec::with_capacity(batch.len());
        let limit = self.limits.max_applications_per_key;
        let tracks_pods = matches!(self.known.role, Role::Outbox { .. });
        for (registration, _) in batch.iter() {
            let application = &registration.application;
            let pod = registration.pod.as_deref().unwrap_or(PODLESS);
            // Keys where the pair, or the pod's record of it, is new.
            let fresh: Vec<MappingKey> = registration
                .keys()
                .filter(|key| {
                    !self.known.holds(key, registration)
                        && !(new_pairs.contains(key, application)
                            && (!tracks_pods
                                || registrants::is_pending(
                                    new_registrants.get(key),
                                    application,
                                    pod,
                                )))
                })
                .collect();
            let full = fresh.iter().find(|key| {
                let new_application =
                    !self.known.contains(key, application) && !new_pairs.contains(key, application);
                let pending = new_pairs.applications(key).map_or(0, BTreeSet::len);
                new_application && self.known.applications_of(key) + pending >= limit
            });
            if let Some(key) = full {
                outcomes.push(Err(StoreError::TooManyApplications {
                    key: key.clone(),
                    limit,
                }));
                continue;
            }
            outcomes.push(Ok(fresh.len()));
            for key in fresh {
                if tracks_pods {
                    // While a key cannot be written (parked), pods keep arriving: past what one
                    // record holds, the application is pinned instead of growing the table.
                    let waiting = self
                        .known
                        .registrants
                        .get(&key)
                        .and_then(|p| p.get(application).map(BTreeSet::len))
                        .unwrap_or(0)
                        + new_registrants
                            .get(&key)
                            .and_then(|p| p.get(application).map(BTreeSet::len))
                            .unwrap_or(0);
                    let pod = if waiting >= registrants::MAX_PODS_PER_APPLICATION {
                        PODLESS
                    } else {
                        pod
                    };
                    registrants::add_pending(
                        new_registrants.entry(key.clone()).or_default(),
                        application,
                        pod,
                    );
                }
                new_pairs.add(key, application.clone());
            }
        }

        if new_pairs.is_empty() {
            self.answer(batch, outcomes);
            return;
        }

        let new_names: Vec<(MappingKey, String)> = match self.known.role {
            Role::Store => new_pairs
                .iter()
                .map(|(key, _)| key.clone())
                .filter(|key| !self.known.names.contains_key(key))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|key| {
                    let name = self.assign_name(&key);
                    (key, name)
                })
                .collect(),
            Role::Outbox { .. } => Vec::new(),
        };
        let started = std::time::Instant::now();
        let written = write_pairs(
            &mut self.conn,
            &new_pairs,
            &new_registrants,
            &new_names,
            self.revision + 1,
        );
        self.stats
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        match written {
            Ok(()) => {
                self.journal_rows += new_pairs.pairs() + new_names.len();
                self.revision += 1;
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .pairs_written
                    .fetch_add(new_pairs.pairs() as u64, Ordering::Relaxed);
                for (key, name) in new_names {
                    self.known.names.insert(key, name);
                }
                for (key, apps) in new_pairs.iter() {
                    self.known
                        .committed
                        .entry(key.clone())
                        .or_default()
                        .extend(apps.iter().cloned());
                }
                for (key, pending) in new_registrants {
                    let mut known = self.known.registrants.entry(key).or_default();
                    for (application, pods) in pending {
                        known.entry(application).or_default().extend(pods);
                    }
                }
                self.answer(batch, outcomes);
                let change = StoredChange {
                    delta: new_pairs,
                    revision: self.revision,
                };
                if self.changes.blocking_send(change).is_err() {
                    tracing::warn!("change feed closed; stored changes are no longer published");
                }
            }
            Err(err) => {
                // Names chosen for this batch were not persisted: give them back.
                for (key, name) in &new_names {
                    if let Some(taken) = self.taken.get_mut(&key.namespace) {
                        taken.remove(name);
                    }
                }
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %err, registrations = batch.len(), "commit failed");
                let source = Arc::new(err);
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::CommitFailed(source.clone())));
                }
            }
        }
    }

    pub(super) fn answer(
        &self,
        batch: &mut Vec<(Registration, Reply)>,
        outcomes: Vec<Result<usize, StoreError>>,
    ) {
        for ((_, reply), outcome) in batch.drain(..).zip(outcomes) {
            let outcome = outcome.map(|added| {
                if added == 0 {
                    self.stats.already_stored.fetch_add(1, Ordering::Relaxed);
                    RegisterOutcome::AlreadyStored
                } else {
                    RegisterOutcome::Stored { added }
                }
            });
            // A caller that gave up waiting is still stored; nothing to tell it.
            let _ = reply.send(outcome);
        }
    }
}
