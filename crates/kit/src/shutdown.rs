//! The one shutdown signal every long-running part listens to: a `watch` that turns `true`.

use tokio::sync::watch;

/// Resolves once shutdown has begun (or its sender is gone, which means the same).
pub async fn signalled(rx: &mut watch::Receiver<bool>) {
    // Drop the `Ref` here, before any caller awaits again: it is not `Send`.
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Waits for SIGTERM or Ctrl-C (the process is asked to stop), logging which came.
pub async fn terminated() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        result = tokio::signal::ctrl_c() => {
            result?;
            tracing::info!("interrupt received");
        }
    }
    Ok(())
}
