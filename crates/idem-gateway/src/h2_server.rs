//! HTTP/2 on client connections: the bounds every connection is served
//! with ([`http2_bounds`]), the bound on what its streams may leave
//! running and on how long it may sit idle ([`StreamSlots`]), and how a
//! plain connection is found to speak h2c ([`sniff_h2c`]).
//!
//! hyper and h2 bound a connection's open streams, its header lists and
//! its windows, and close a connection whose client resets more streams
//! than it lets the server take up (h2's answer to CVE-2023-44487). What
//! they cannot bound is work that outlives a stream: the layer runs an
//! execution to its end when its client goes (hang-up safety), so a
//! client that sends a keyed request and resets its stream at once, in a
//! loop, would start executions without limit while never having more
//! than one stream open. [`StreamSlots`] counts those: a request on an
//! HTTP/2 connection takes one of the connection's slots (as many as it
//! may have streams) before it reaches the layer, and the slot travels
//! with the request into its execution ([`ExecutionSlot`]): the proxy
//! moves it onto the upstream's answer, and it is given back when the
//! layer has settled the record and the answer's head is sent (or, for a
//! reset stream, when the execution ends). An upstream exchange that
//! failed gives it back then. A stream reset while it waits for a slot
//! costs nothing more.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::{BoxFuture, Either};
use http::{Request, Response, Version};
use idem_http::{Body, boxed};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Service, ServiceExt as _};

/// Sets `builder` (hyper's HTTP/2 server builder, or hyper-util's
/// automatic one's HTTP/2 half: the same methods) to the HTTP/2 bounds
/// of `limits` ([`ConnectionLimits`](crate::ConnectionLimits)).
macro_rules! http2_bounds {
    ($builder:expr, $limits:expr) => {{
        let h2 = &$limits.http2;
        $builder
            .timer(hyper_util::rt::TokioTimer::new())
            .max_concurrent_streams(h2.max_concurrent_streams)
            .max_header_list_size(h2.max_header_list_size)
            .initial_stream_window_size(h2.stream_window)
            .initial_connection_window_size(h2.connection_window)
            .keep_alive_interval(h2.keep_alive_interval)
            .keep_alive_timeout(h2.keep_alive_timeout)
            .max_pending_accept_reset_streams(h2.max_pending_resets)
            .max_local_error_reset_streams(h2.max_local_error_resets);
    }};
}
pub(crate) use http2_bounds;

/// One of an HTTP/2 connection's execution slots, held by a request from
/// before the layer sees it until its answer is done with (an execution
/// that outlives its stream holds it to its end). The proxy moves it
/// from the request onto the answer.
#[derive(Clone)]
pub(crate) struct ExecutionSlot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// A connection's front service with a slot taken for every HTTP/2
/// request (HTTP/1.1 requests on the same listener pass straight on).
#[derive(Clone)]
pub(crate) struct StreamSlots<S> {
    inner: S,
    slots: Arc<Semaphore>,
    /// The connection's HTTP/2 requests whose answer is not sent yet.
    activity: Arc<Activity>,
}

impl<S> StreamSlots<S> {
    /// `inner`, with `slots` executions at most for the connection.
    pub(crate) fn new(inner: S, slots: u32) -> StreamSlots<S> {
        StreamSlots {
            inner,
            slots: Arc::new(Semaphore::new(slots as usize)),
            activity: Arc::new(Activity::default()),
        }
    }

    /// Resolves once the connection has had no request open, and none
    /// begun or ended, for `idle` (checked a few times within it): the
    /// caller then closes it gracefully (GOAWAY), so a request already on
    /// its way is still served or told it was not taken up.
    pub(crate) fn idle_for(&self, idle: Duration) -> impl Future<Output = ()> + use<S> {
        let activity = self.activity.clone();
        async move {
            let tick = (idle / 4).max(Duration::from_millis(10));
            loop {
                tokio::time::sleep(tick).await;
                if activity.quiet_for() >= Some(idle) {
                    return;
                }
            }
        }
    }
}

/// A connection's HTTP/2 requests: how many are open, and when one last
/// began or ended.
#[derive(Default)]
struct Activity {
    open: AtomicUsize,
    /// Milliseconds since `since` at the last beginning or end.
    last_ms: AtomicU64,
    since: std::sync::OnceLock<tokio::time::Instant>,
}

impl Activity {
    fn now_ms(&self) -> u64 {
        let since = *self.since.get_or_init(tokio::time::Instant::now);
        u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// How long nothing has been open or begun or ended; `None` while a
    /// request is open.
    fn quiet_for(&self) -> Option<Duration> {
        if self.open.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let quiet = self
            .now_ms()
            .saturating_sub(self.last_ms.load(Ordering::Relaxed));
        Some(Duration::from_millis(quiet))
    }
}

/// One open HTTP/2 request of a connection, counted from its call until
/// its answer's body is done with (or the call dropped: a reset).
struct OpenStream(Arc<Activity>);

impl OpenStream {
    fn new(activity: &Arc<Activity>) -> OpenStream {
        activity.open.fetch_add(1, Ordering::Relaxed);
        activity.touch();
        OpenStream(activity.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.touch();
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body that keeps its request counted as open.
struct Streaming {
    body: Body,
    _open: OpenStream,
}

impl http_body::Body for Streaming {
    type Data = bytes::Bytes;
    type Error = idem_http::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl<S, B> Service<Request<B>> for StreamSlots<S>
where
    S: Service<Request<B>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response<Body>, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if req.version() != Version::HTTP_2 {
            return Either::Left(self.inner.call(req));
        }
        let inner = self.inner.clone();
        let slots = self.slots.clone();
        let open = OpenStream::new(&self.activity);
        Either::Right(Box::pin(async move {
            // Never closed: the semaphore lives as long as this service.
            if let Ok(slot) = slots.acquire_owned().await {
                req.extensions_mut().insert(ExecutionSlot(Arc::new(slot)));
            }
            let response = inner.oneshot(req).await;
            // The stream stays open while its answer's body is sent.
            Ok(response
                .unwrap_or_else(|never| match never {})
                .map(|body| boxed(Streaming { body, _open: open })))
        }))
    }
}

/// HTTP/2's connection preface (RFC 9113 section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads a plain connection's first bytes, within `within` (as an
/// HTTP/1.1 request's headers must come within the header timeout), until
/// they either are HTTP/2's preface (h2c with prior knowledge: `true`) or
/// differ from it (`false`). What was read comes back with the I/O, to be
/// read again by the server chosen ([`Prefixed`]). An error for a
/// connection that sent nothing in time (or failed).
pub(crate) async fn sniff_h2c<T: AsyncRead + Unpin>(
    mut io: T,
    within: Duration,
) -> std::io::Result<(bool, Prefixed<T>)> {
    use tokio::io::AsyncReadExt as _;
    let mut got = Vec::with_capacity(PREFACE.len());
    let read = async {
        loop {
            let mut buf = [0u8; PREFACE.len()];
            let n = io.read(&mut buf[..PREFACE.len() - got.len()]).await?;
            got.extend_from_slice(&buf[..n]);
            if n == 0 || got[..] != PREFACE[..got.len()] {
                return Ok::<_, std::io::Error>(false);
            }
            if got.len() == PREFACE.len() {
                return Ok(true);
            }
        }
    };
    let h2 = tokio::time::timeout(within, read).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no request within the header timeout",
        )
    })??;
    Ok((
        h2,
        Prefixed {
            prefix: bytes::Bytes::from(got),
            inner: io,
        },
    ))
}

/// A connection's I/O with the bytes [`sniff_h2c`] read put back in
/// front: read first, then the I/O itself.
pub(crate) struct Prefixed<T> {
    prefix: bytes::Bytes,
    inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
