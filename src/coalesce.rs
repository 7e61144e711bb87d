//! A connection whose writes are coalesced across the HTTP/2 connection task's polls.
//!
//! hyper's HTTP/2 connection task writes whatever frames are queued each time it is polled, and
//! a DATA frame over 256 bytes goes out in its own `writev`. When thousands of streams each send
//! one response (an xDS push), each stream's task wakes the connection task, which tokio runs
//! right after it: one system call per response, most of a push's kernel time on loopback.
//!
//! [`Coalesced`] keeps what is written in a buffer and really writes it on the first flush after
//! the connection task has read again, that is on its next poll. The first buffered write wakes
//! the task, which tokio then queues behind the tasks already ready (the streams still
//! answering), so one write carries what every stream of the connection queued meanwhile.
//! A flush before that returns at once: h2 flushes after each large frame. The buffer is
//! bounded: past [`LIMIT`] bytes it is written out first.
//!
//! Only for a connection h2 drives: it relies on h2 reading until `Pending` and then flushing
//! at every poll. A driver that writes, flushes and then waits to read would wait forever; so
//! would a client that waits for the server's SETTINGS before sending its preface (HTTP/2 has
//! the client speak first). Bytes held when a connection is dropped without being shut down
//! (the peer gone, a forced close after `max_connection_age_grace`) are lost with it, one poll
//! sooner than they would have been written.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes kept before they are written out regardless.
pub const LIMIT: usize = 64 * 1024;

/// Capacity kept once the buffer is written out; more is freed (an idle connection holds
/// little).
const KEPT: usize = 4 * 1024;

/// `io` with its writes held until the connection task's next poll (the module's doc says why).
pub struct Coalesced<IO> {
    io: IO,
    buf: Vec<u8>,
    /// Bytes of `buf` already written to `io`.
    written: usize,
    /// Reads that returned `Pending`: each ends one poll of the connection task.
    reads_ended: u64,
    /// `reads_ended` when `buf` took its first byte; `None` while it is empty.
    held_since: Option<u64>,
}

impl<IO> Coalesced<IO> {
    pub fn new(io: IO) -> Self {
        Self {
            io,
            buf: Vec::new(),
            written: 0,
            reads_ended: 0,
            held_since: None,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// Bytes held, not yet written to the connection.
    pub fn held(&self) -> usize {
        self.buf.len() - self.written
    }
}

impl<IO: AsyncWrite + Unpin> Coalesced<IO> {
    /// Writes out everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.written = 0;
        self.held_since = None;
        if self.buf.capacity() > KEPT {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Poll::Ready(Ok(()))
    }

    /// Makes room for `len` more bytes, writing out what is held if the buffer would pass
    /// [`LIMIT`]. Its length counts, not only what is held: bytes a partial write sent stay at
    /// its front until it is written out whole.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<()>> {
        if self.buf.len() + len > LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    fn hold(&mut self, cx: &mut Context<'_>) {
        if self.held_since.is_none() {
            self.held_since = Some(self.reads_ended);
            // Polled again after the tasks ready now: the next poll writes this out.
            cx.waker().wake_by_ref();
        }
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for Coalesced<IO>
{
    type ConnectInfo = IO::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Coalesced<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if read.is_pending() {
            this.reads_ended += 1;
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Coalesced<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_room(cx, data.len()))?;
        if data.len() > LIMIT {
            return Pin::new(&mut this.io).poll_write(cx, data);
        }
        this.buf.extend_from_slice(data);
        this.hold(cx);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len: usize = slices.iter().map(|slice| slice.len()).sum();
        ready!(this.poll_room(cx, len))?;
        if len > LIMIT {
            return Pin::new(&mut this.io).poll_write_vectored(cx, slices);
        }
        for slice in slices {
            this.buf.extend_from_slice(slice);
        }
        this.hold(cx);
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        // Every slice is copied into the buffer: h2 then hands large frames over without
        // copying them into its own.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.held_since == Some(this.reads_ended) {
            // Still the poll that buffered it: the wake in `hold` brings the next one.
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// An inner connection that records each write and never has anything to read.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        /// Bytes it takes per write; `None`: all.
        take: Option<usize>,
        /// Writes refused with `Pending` before it takes any.
        busy: usize,
        /// Refuses every other write with `Pending`, as a socket a slow reader fills.
        slow: bool,
        refused: bool,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            if this.busy > 0 {
                this.busy -= 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if this.slow {
                this.refused = !this.refused;
                if this.refused {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
            let n = this.take.map_or(data.len(), |take| take.min(data.len()));
            this.writes.push(data[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);
    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn context() -> (Arc<Wakes>, std::task::Waker) {
        let wakes = Arc::new(Wakes::default());
        (wakes.clone(), wakes.into())
    }

    /// One poll of a connection task: read until `Pending`, then write `frames` flushing after
    /// each, as h2 does.
    fn poll_once(conn: &mut Coalesced<Recorder>, cx: &mut Context<'_>, frames: &[&[u8]]) {
        let mut space = [0u8; 16];
        let mut read = ReadBuf::new(&mut space);
        assert!(Pin::new(&mut *conn).poll_read(cx, &mut read).is_pending());
        for frame in frames {
            // Header and payload in two slices, as h2 writes a large DATA frame; a write may
            // take part of them.
            let mut rest = *frame;
            while !rest.is_empty() {
                let slices = [io::IoSlice::new(&rest[..1]), io::IoSlice::new(&rest[1..])];
                match Pin::new(&mut *conn).poll_write_vectored(cx, &slices) {
                    Poll::Ready(Ok(n)) if n > 0 => rest = &rest[n..],
                    other => panic!("write refused: {other:?}"),
                }
            }
            assert!(matches!(
                Pin::new(&mut *conn).poll_flush(cx),
                Poll::Ready(Ok(()))
            ));
        }
        // h2's last flush of the poll.
        let _ = Pin::new(&mut *conn).poll_flush(cx);
    }

    #[test]
    fn frames_of_one_poll_go_out_in_one_write_on_the_next() {
        let (wakes, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut conn = Coalesced::new(Recorder::default());
        poll_once(&mut conn, &mut cx, &[b"first", b"second", b"third"]);
        assert!(conn.get_ref().writes.is_empty(), "held until the next poll");
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "one wake brings that poll"
        );
        poll_once(&mut conn, &mut cx, &[]);
        assert_eq!(conn.get_ref().writes, vec![b"firstsecondthird".to_vec()]);
        assert_eq!(conn.held(), 0);
    }

    #[test]
    fn writes_past_the_limit_go_out_at_once_in_order() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut conn = Coalesced::new(Recorder::default());
        let big = vec![7u8; LIMIT - 10];
        poll_once(&mut conn, &mut cx, &[&big, b"0123456789ab"]);
        // The second frame would pass the limit: the first went out before it was taken.
        assert!(
            conn.get_ref().writes == vec![big.clone()],
            "only the first frame"
        );
        assert_eq!(conn.held(), 12);
        let huge = vec![9u8; LIMIT + 1];
        let written = Pin::new(&mut conn).poll_write(&mut cx, &huge);
        assert!(matches!(written, Poll::Ready(Ok(n)) if n == LIMIT + 1));
        let writes = &conn.get_ref().writes;
        assert_eq!(writes[1], b"0123456789ab".to_vec(), "held bytes before it");
        assert!(writes[2] == huge, "passed through, not held");
        assert_eq!(conn.held(), 0);
    }

    #[test]
    fn a_slow_connection_bounds_the_buffer_whatever_it_has_sent() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        // Takes 1 KiB per write and refuses every other: each write-out stops part way.
        let mut conn = Coalesced::new(Recorder {
            take: Some(1024),
            slow: true,
            ..Recorder::default()
        });
        let frame = vec![1u8; 1000];
        let mut taken = 0;
        while taken < 500 * 3 {
            let mut space = [0u8; 1];
            let _ = Pin::new(&mut conn).poll_read(&mut cx, &mut ReadBuf::new(&mut space));
            let _ = Pin::new(&mut conn).poll_flush(&mut cx);
            // h2 writes while the connection takes them; a refusal ends this poll.
            while taken < 500 * 3 {
                match Pin::new(&mut conn).poll_write(&mut cx, &frame) {
                    Poll::Ready(Ok(n)) => {
                        assert_eq!(n, frame.len());
                        taken += 1;
                    }
                    Poll::Ready(Err(err)) => panic!("{err}"),
                    Poll::Pending => break,
                }
            }
            assert!(conn.buf.len() <= LIMIT, "{} bytes buffered", conn.buf.len());
        }
        while Pin::new(&mut conn).poll_shutdown(&mut cx).is_pending() {}
        assert_eq!(conn.get_ref().writes.concat().len(), 500 * 3 * 1000);
    }

    #[test]
    fn a_busy_connection_keeps_every_byte_for_later() {
        let (_, waker) = context();
        let mut cx = Context::from_waker(&waker);
        let mut conn = Coalesced::new(Recorder {
            take: Some(3),
            busy: 1,
            ..Recorder::default()
        });
        poll_once(&mut conn, &mut cx, &[b"abcdefgh"]);
        // Still the poll that held it: nothing written yet.
        assert!(Pin::new(&mut conn).poll_flush(&mut cx).is_ready());
        assert!(conn.get_ref().writes.is_empty());
        // The next poll's flush meets a busy connection; the shutdown, partial writes.
        let mut space = [0u8; 1];
        let _ = Pin::new(&mut conn).poll_read(&mut cx, &mut ReadBuf::new(&mut space));
        assert!(Pin::new(&mut conn).poll_flush(&mut cx).is_pending());
        assert!(matches!(
            Pin::new(&mut conn).poll_shutdown(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(conn.get_ref().writes.concat(), b"abcdefgh".to_vec());
        assert_eq!(conn.held(), 0);
    }
}
