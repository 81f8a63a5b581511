//! The stall guard: a connection whose writes fail once they have made no
//! progress for a while.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// I/O whose writes fail (`TimedOut`) once they have made no progress for
/// a limit: without it, a client that never reads a large answer holds
/// its connection slot (and the upstream connection behind it) forever.
/// Reads pass through untouched.
///
/// [`TcpAcceptor`](crate::TcpAcceptor) puts one around every socket with
/// [`ConnectionLimits::stall_timeout`](crate::ConnectionLimits::stall_timeout);
/// a step of one's own that does not build on it can use it too. Under
/// TLS it is on the socket, so it also bounds the handshake's and the
/// `close_notify`'s writes.
#[derive(Debug)]
pub struct StallGuard<T> {
    io: T,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> StallGuard<T> {
    /// `io`, whose writes may make no progress for `limit`. Needs a
    /// Tokio runtime with time enabled once a write waits.
    pub fn new(io: T, limit: Duration) -> StallGuard<T> {
        StallGuard {
            io,
            limit,
            stalled: None,
        }
    }

    /// The guarded I/O, to look at.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The guarded I/O, to change (reading or writing through it
    /// bypasses the guard).
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// The guarded I/O, unguarded.
    pub fn into_inner(self) -> T {
        self.io
    }

    /// Maps a write's poll: progress clears the stall clock; `Pending`
    /// starts it, and fails the write once it runs out.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match poll {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let clock = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match clock.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallGuard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallGuard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, poll)
    }
}
