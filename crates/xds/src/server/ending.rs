//! What the client of one stream reads: its queued responses, then the status its loop ended
//! with.

use std::pin::Pin;

use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::Queued;

/// What the client reads: the queued responses, then the status the loop ended with. The status
/// is not queued with them: a queue full of responses the client has not read yet must not
/// lose it (the stream would end OK, and its client not know to reconnect), nor hold the loop,
/// and with it the shutdown, until there is room.
pub(super) struct Ending<T> {
    queue: mpsc::Receiver<Queued<T>>,
    end: Option<oneshot::Receiver<Status>>,
}

pub(super) fn responses<T>(
    queue: mpsc::Receiver<Queued<T>>,
    end: oneshot::Receiver<Status>,
) -> Ending<T> {
    Ending {
        queue,
        end: Some(end),
    }
}

impl<T> tokio_stream::Stream for Ending<T> {
    type Item = Result<T, Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::{Poll, ready};
        if let Some(queued) = ready!(self.queue.poll_recv(cx)) {
            return Poll::Ready(Some(*queued));
        }
        // The loop has returned (its sender is gone) and everything it queued was read.
        let Some(end) = self.end.as_mut() else {
            return Poll::Ready(None);
        };
        let ended = ready!(Pin::new(end).poll(cx));
        self.end = None;
        // No status sent: the loop ended OK.
        Poll::Ready(ended.ok().map(Err))
    }
}
