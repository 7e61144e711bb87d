//! Every long-lived task runs under one supervisor. A task that ends before shutdown was asked
//! for (returns, fails or panics) is a fault: the supervisor logs why, marks the process not
//! ready, starts the shutdown and remembers the failure, so the process exits non-zero and
//! Kubernetes restarts it instead of leaving a control plane that acks but never publishes.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::Readiness;

/// Named tasks and the shutdown signal they share.
pub struct Supervisor {
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    shutdown: watch::Sender<bool>,
    readiness: Readiness,
    failure: Arc<Mutex<Option<String>>>,
}

impl Supervisor {
    pub fn new(shutdown: watch::Sender<bool>, readiness: Readiness) -> Self {
        Self {
            tasks: Vec::new(),
            shutdown,
            readiness,
            failure: Arc::new(Mutex::new(None)),
        }
    }

    /// A receiver of the shutdown signal the supervised tasks share.
    pub fn shutdown_receiver(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Runs `task` under supervision.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let inner = tokio::spawn(task);
        let shutdown = self.shutdown.clone();
        let readiness = self.readiness.clone();
        let failure = self.failure.clone();
        let watcher = tokio::spawn(async move {
            let why = match inner.await {
                Ok(Ok(())) if *shutdown.borrow() => return,
                Ok(Ok(())) => "exited unexpectedly".to_owned(),
                Ok(Err(err)) => format!("failed: {err:#}"),
                Err(err) if err.is_panic() => format!("panicked: {err}"),
                Err(err) => format!("was cancelled: {err}"),
            };
            tracing::error!(
                task = name,
                "{name} {why}; stopping so the process is restarted"
            );
            readiness.set(false);
            failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| format!("{name} {why}"));
            shutdown.send_replace(true);
        });
        self.tasks.push((name, watcher));
    }

    /// Waits for the task called `name` to end; after `grace` it is abandoned with a warning.
    pub async fn finish(&mut self, name: &'static str, grace: Duration) {
        let Some(position) = self.tasks.iter().position(|(n, _)| *n == name) else {
            return;
        };
        let (_, handle) = self.tasks.swap_remove(position);
        let abort = handle.abort_handle();
        if tokio::time::timeout(grace, handle).await.is_err() {
            tracing::warn!(
                ?grace,
                "{name} did not finish within the shutdown grace period"
            );
            abort.abort();
        }
    }

    /// Waits for every remaining task, each within `grace`.
    pub async fn finish_all(&mut self, grace: Duration) {
        while let Some((name, _)) = self.tasks.first() {
            let name = *name;
            self.finish(name, grace).await;
        }
    }

    /// The first fault, if any task failed.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_dies_stops_everything_and_is_reported() {
        let (shutdown, mut rx) = watch::channel(false);
        let readiness = Readiness::default();
        readiness.set(true);
        let mut supervisor = Supervisor::new(shutdown, readiness.clone());
        let mut waiting = rx.clone();
        supervisor.spawn("steady", async move {
            crate::shutdown::signalled(&mut waiting).await;
            Ok(())
        });
        supervisor.spawn("fragile", async { anyhow::bail!("lost its input") });
        crate::shutdown::signalled(&mut rx).await;
        supervisor.finish_all(Duration::from_secs(5)).await;
        assert!(!readiness.is_ready());
        let failure = supervisor.failure().unwrap_or_default();
        assert!(
            failure.contains("fragile failed: lost its input"),
            "{failure}"
        );
    }

    #[tokio::test]
    async fn tasks_that_end_after_shutdown_are_not_faults() {
        let (shutdown, rx) = watch::channel(false);
        let mut supervisor = Supervisor::new(shutdown.clone(), Readiness::default());
        let mut waiting = rx.clone();
        supervisor.spawn("steady", async move {
            crate::shutdown::signalled(&mut waiting).await;
            Ok(())
        });
        shutdown.send_replace(true);
        supervisor.finish_all(Duration::from_secs(5)).await;
        assert_eq!(supervisor.failure(), None);
    }

    #[tokio::test]
    async fn a_panic_is_a_fault() {
        let (shutdown, _rx) = watch::channel(false);
        let mut supervisor = Supervisor::new(shutdown, Readiness::default());
        supervisor.spawn("panicky", async {
            let empty: Vec<u8> = Vec::new();
            let _ = empty[usize::from(empty.is_empty())];
            Ok(())
        });
        supervisor.finish_all(Duration::from_secs(5)).await;
        assert!(
            supervisor
                .failure()
                .unwrap_or_default()
                .contains("panicked")
        );
    }
}
