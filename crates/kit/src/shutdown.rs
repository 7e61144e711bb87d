//! The one shutdown signal every long-running part listens to: a `watch` that turns `true`.

use tokio::sync::watch;

/// Resolves once shutdown has begun (or its sender is gone, which means the same).
pub async fn signalled(rx: &mut watch::Receiver<bool>) {
    // Drop the `Ref` here, before any caller awaits again: it is not `Send`.
    let _ = rx.wait_for(|stop| *stop).await;
}
