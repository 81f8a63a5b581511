//! The connections of one serving thread to the one upstream.
//!
//! The gateway talks to a single origin, and each serving thread has a
//! pool of its own (a connection's task runs on the thread that opened
//! it). So the pool is a stack of idle HTTP/1 connections, last in first
//! out, behind a lock that only its own thread takes: no pool key to hash
//! and compare, no waiters to wake, and no task spawned to return a
//! connection once it is ready again (hyper-util's general-purpose pool
//! did all three for every request; docs/benchmarks-history.md, "The
//! gateway's own upstream pool").
//!
//! What that pool did for safety, this one does too:
//! - A request is sent again only when hyper hands it back unsent (the
//!   connection closed before it was written) and the connection had
//!   served before: an idle connection the upstream closed. One that was
//!   written, even in part, is never sent twice.
//! - A connection idle for the idle timeout is not used again: a checkout
//!   passes over it, and a task of the thread's own closes it, so a
//!   thread that goes quiet does not hold it open either.
//!
//! And one thing it did not: a connection is used again only when its
//! last exchange is known to have been in step ([`out_of_step`]). An upstream
//! that answers before it has read a request's body (a 401 before
//! authentication, a 413, a validation error) and keeps the connection
//! may read that body as a request of its own, and its answer would then
//! be taken for the next caller's. So a connection whose answer came
//! before the request's body was handed over, whose answer to a request
//! with a body was not a success, whose status is not a final one (a 101
//! nobody asked for, a code outside 100-599), or whose answer carries no
//! body where the upstream might send one anyway (a HEAD's, a 204 or 304
//! that announces one) is closed once its answer is read
//! ([`out_of_step`]). Bytes that arrive unasked on an idle connection (a
//! second answer, or more than the answer's length) make hyper close it.
//!
//! Over HTTP/2 (`h2`, `h2c`, or `auto` when the upstream picks `h2`) the
//! thread has one multiplexed connection instead (`pool/h2.rs`): streams
//! are framed apart, so nothing of one exchange can be read as another's,
//! and the checks above are HTTP/1's alone.
//!
//! Not a general client: one origin, no proxies, and the caller writes
//! `Host` and the origin-form target (made absolute here for HTTP/2).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use idem_http::{Body, BoxError, boxed};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::settings::UpstreamProtocol;

/// Connections kept in a thread's pool, past which a returned one is
/// closed (a returned connection still finishing its exchange counts).
/// A thread with more requests in flight than this opens connections for
/// them as before, and closes the extra ones as they come back.
const MAX_IDLE: usize = 1024;

/// Connections closed because their exchange was not in step, by reason
/// ([`out_of_step`]).
pub(crate) const CLOSED: &str = "idem_upstream_connections_closed_total";

/// The `reason` label values of [`CLOSED`], as [`out_of_step`] names them.
pub(crate) const CLOSE_REASONS: [&str; 4] = [
    "not_final",
    "early_answer",
    "refused_with_body",
    "bodiless_answer",
];

/// The I/O the connector gives.
type UpstreamIo = hyper_rustls::MaybeHttpsStream<hyper_util::rt::TokioIo<tokio::net::TcpStream>>;

/// What sends on the thread's HTTP/2 connection (cheap to clone;
/// `pool/h2.rs`).
type SendRequest2 = hyper::client::conn::http2::SendRequest<Body>;

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum SendError {
    /// Nothing of it reached the upstream: no connection could be made,
    /// or a new one closed before the request was written.
    NotSent(BoxError),
    /// It was written, at least in part: the upstream may have acted.
    Failed(hyper::Error),
}

/// One serving thread's connections to the upstream.
pub(crate) struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// The HTTP version spoken (`auto`: as `picked_h2` says).
    protocol: UpstreamProtocol,
    /// The multiplexed HTTP/2 connection, once there is one; locked while
    /// it is made, so that requests that come meanwhile wait for it
    /// instead of each opening one.
    h2: tokio::sync::Mutex<Option<SendRequest2>>,
    /// With `auto`: whether the upstream picked `h2` by ALPN on the last
    /// connection made (before any, or for `http/1.1`: HTTP/1.1's pool).
    picked_h2: AtomicBool,
    /// The upstream's scheme and authority: where a connection goes.
    origin: Uri,
    /// Oldest first; taken from the end.
    idle: Mutex<Vec<Idle>>,
    idle_timeout: Duration,
    /// Set once the task that closes expired idle connections runs.
    reaping: AtomicBool,
}

/// One connection: what sends on it, and its task, ended when the
/// connection must not serve again.
struct Conn {
    sender: SendRequest<Body>,
    task: AbortHandle,
}

impl Conn {
    /// Closes the connection now: its task ends, and with it the socket.
    fn close(self) {
        self.task.abort();
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

impl Idle {
    /// Idle for `timeout` or longer at `now`: not to be used again.
    fn expired(&self, now: Instant, timeout: Duration) -> bool {
        now.duration_since(self.since) >= timeout
    }
}

/// Drops the closed and expired connections of `idle`.
fn drop_unusable(idle: &mut Vec<Idle>, now: Instant, timeout: Duration) {
    idle.retain(|e| !e.conn.sender.is_closed() && !e.expired(now, timeout));
}

/// Why a connection that was not ready by the request's deadline failed.
const CONNECT_TOO_SLOW: &str =
    "the connection to the upstream was not ready within the upstream timeout";

impl Pool {
    /// A pool of connections to `origin` (scheme and authority); `tls`
    /// is how an `https://` one is checked (`None` for `http://`).
    pub(crate) fn new(
        origin: Uri,
        tls: Option<rustls::ClientConfig>,
        protocol: UpstreamProtocol,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Arc<Pool> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        // The connector must let the https scheme through to the TLS layer.
        connector.enforce_http(false);
        let connector = match (tls, protocol) {
            // Only https: a redirect-free proxy never changes scheme, and
            // an https upstream must never be reached in plain text. The
            // ALPN list is the protocol's: `h2` alone, `http/1.1` alone,
            // or both for `auto`.
            (Some(tls), UpstreamProtocol::H2) => HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_only()
                .enable_http2()
                .wrap_connector(connector),
            (Some(tls), UpstreamProtocol::Auto) => HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_only()
                .enable_all_versions()
                .wrap_connector(connector),
            (Some(tls), UpstreamProtocol::Http1 | UpstreamProtocol::H2c) => {
                HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_only()
                    .enable_http1()
                    .wrap_connector(connector)
            }
            (None, _) => HttpsConnectorBuilder::new()
                .with_tls_config(plain_only())
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector),
        };
        Arc::new(Pool {
            connector,
            protocol,
            h2: tokio::sync::Mutex::new(None),
            picked_h2: AtomicBool::new(false),
            origin,
            idle: Mutex::new(Vec::new()),
            idle_timeout,
            reaping: AtomicBool::new(false),
        })
    }

    /// Sends `request` (origin-form, with its `Host`) on an idle
    /// connection, or a new one. The answer's connection goes back to the
    /// pool with the answer's head if hyper has read the whole answer by
    /// then, else when the answer's body is dropped.
    ///
    /// A new connection must be ready by `deadline` (the request's own):
    /// until then nothing of the request was written, so a connect, TLS
    /// or HTTP handshake that takes that long ends as
    /// [`SendError::NotSent`], not as a timeout of unknown outcome. (The
    /// connector's own timeout covers the TCP connect alone.)
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: Request<Body>,
        deadline: Instant,
    ) -> Result<Response<Body>, SendError> {
        if self.speaks_h2() {
            return self.send_h2(request, deadline).await;
        }
        self.send_h1(request, deadline).await
    }

    /// [`Pool::send`] over HTTP/1.1.
    async fn send_h1(
        self: &Arc<Self>,
        request: Request<Body>,
        deadline: Instant,
    ) -> Result<Response<Body>, SendError> {
        let head = request.method() == http::Method::HEAD;
        // A request with a body tells when its end was handed over; one
        // without has nothing an answer could come before.
        let (mut request, body_end) = if request.body().is_end_stream() {
            (request, None)
        } else {
            let handed = Arc::new(AtomicBool::new(false));
            let tracked = request.map(|body| boxed(Tracked::new(body, handed.clone())));
            (tracked, Some(handed))
        };
        loop {
            let (mut conn, reused) = match self.checkout() {
                Some(conn) => (conn, true),
                None => match tokio::time::timeout_at(deadline, self.connect()).await {
                    Ok(Ok(Some(conn))) => (conn, false),
                    // `auto`, and the upstream picked HTTP/2: nothing of
                    // the request was written.
                    Ok(Ok(None)) => return self.send_h2(request, deadline).await,
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(SendError::NotSent(CONNECT_TOO_SLOW.into())),
                },
            };
            match conn.sender.try_send_request(request).await {
                Ok(response) => {
                    let sent = Sent {
                        body_handed: body_end.as_ref().map(|h| h.load(Ordering::Acquire)),
                        head,
                    };
                    let out_of_step = out_of_step(response.status(), response.headers(), sent);
                    if let Some(reason) = out_of_step {
                        metrics::counter!(CLOSED, "reason" => reason).increment(1);
                    }
                    return Ok(self.returning(conn, response, out_of_step.is_none()));
                }
                Err(mut e) => match e.take_message() {
                    // An idle connection the upstream closed: try another.
                    // Each pass takes one connection out of the pool, and
                    // a new one ends the loop.
                    Some(unsent) if reused => request = unsent,
                    Some(_) => return Err(SendError::NotSent(e.into_error().into())),
                    None => return Err(SendError::Failed(e.into_error())),
                },
            }
        }
    }

    /// The newest idle connection that can take a request now. Closed
    /// ones, and ones idle for the idle timeout (the upstream may be
    /// closing them), are dropped on the way; one still finishing its
    /// last exchange is left for later. Each is judged on its own: the
    /// stack is in the order connections came back, and a connection
    /// that came back late (a long download) may have been idle longest.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            if idle[i].conn.sender.is_closed() || idle[i].expired(now, self.idle_timeout) {
                idle.remove(i);
            } else if idle[i].conn.sender.is_ready() {
                return Some(idle.remove(i).conn);
            }
        }
        None
    }

    /// A new HTTP/1.1 connection; `None` when the upstream picked HTTP/2
    /// for it instead (`auto`): it is then the thread's HTTP/2 one.
    async fn connect(self: &Arc<Self>) -> Result<Option<Conn>, SendError> {
        self.start_reaping();
        let io = self.connect_io().await?;
        if self.upstream_picked_h2(&io) {
            self.adopt_h2(io).await?;
            return Ok(None);
        }
        let (mut sender, connection) = http1::handshake(io)
            .await
            .map_err(|e| SendError::NotSent(e.into()))?;
        let task = tokio::spawn(async move {
            let ended = connection.await;
            if let Err(e) = &ended {
                tracing::debug!(error = %e, "upstream connection ended");
            }
            ended
        });
        if let Err(closed) = sender.ready().await {
            // The connection ended before it took a request: its task
            // has the reason.
            let cause = match task.await {
                Ok(Err(e)) => e,
                _ => closed,
            };
            return Err(SendError::NotSent(cause.into()));
        }
        Ok(Some(Conn {
            sender,
            task: task.abort_handle(),
        }))
    }

    /// A new connection to the upstream, TLS (and ALPN) done, before any
    /// HTTP: what HTTP/1.1's pool and the HTTP/2 connection are made over.
    async fn connect_io(&self) -> Result<UpstreamIo, SendError> {
        self.connector
            .clone()
            .oneshot(self.origin.clone())
            .await
            .map_err(SendError::NotSent)
    }

    /// `response` with its connection: back in the pool now if the
    /// exchange is over (the whole answer was read with its head), else
    /// when its body is dropped; closed instead, then, if the exchange
    /// was not `in_step`.
    fn returning(
        self: &Arc<Self>,
        conn: Conn,
        response: Response<Incoming>,
        in_step: bool,
    ) -> Response<Body> {
        let head_at = Instant::now();
        if conn.sender.is_ready() {
            self.settle(conn, head_at, in_step);
            return response.map(boxed);
        }
        response.map(|body| {
            boxed(Returning {
                body: Some(body),
                home: Some((conn, self.clone())),
                head_at,
                in_step,
            })
        })
    }

    /// Once an exchange is over: keeps its connection if it was in step,
    /// else closes it.
    fn settle(&self, conn: Conn, since: Instant, in_step: bool) {
        if in_step {
            self.put(conn, since);
        } else {
            conn.close();
        }
    }

    /// Keeps `conn`, idle since `since` (when its last answer's head
    /// came), unless it is closed or already idle for the idle timeout.
    fn put(&self, conn: Conn, since: Instant) {
        let entry = Idle { conn, since };
        if entry.conn.sender.is_closed() || entry.expired(Instant::now(), self.idle_timeout) {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() >= MAX_IDLE {
            drop_unusable(&mut idle, Instant::now(), self.idle_timeout);
        }
        if idle.len() < MAX_IDLE {
            idle.push(entry);
        }
    }

    /// Starts, once, the task that closes connections idle longer than
    /// the timeout, on the calling thread's runtime (the pool's own). It
    /// ends with the pool.
    fn start_reaping(self: &Arc<Self>) {
        if self.reaping.swap(true, Ordering::Relaxed) {
            return;
        }
        let pool = Arc::downgrade(self);
        let every = (self.idle_timeout / 4).max(Duration::from_millis(10));
        tokio::spawn(reap(pool, every));
    }

    /// Drops closed connections and those idle for the timeout or longer.
    fn close_expired(&self, now: Instant) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        drop_unusable(&mut idle, now, self.idle_timeout);
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The TLS configuration of an `http://` upstream's connector, which never
/// uses it (the upstream URL is fixed at start): no roots, so an https
/// connection through it could not succeed.
fn plain_only() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        })
        .unwrap_or_else(|_| unreachable!("ring supports the default protocol versions"))
}

/// What the pool knows of a request when its answer's head comes.
#[derive(Clone, Copy)]
struct Sent {
    /// `None`: no body; else whether its end had been handed to hyper.
    body_handed: Option<bool>,
    /// A HEAD: its answer announces a body it does not carry.
    head: bool,
}

/// Why an exchange was not in step, if it was not: its connection may
/// serve again once the answer is read only if this is `None`. Each
/// reason is a label of `idem_upstream_connections_closed_total`.
///
/// Not in step, and closed:
/// - `not_final`: a status that is not a final one: a 101 to a request
///   that asked for no upgrade (the gateway forwards no `Upgrade`), or a
///   code outside 100-599 (RFC 9110 section 15);
/// - `early_answer`: an answer that came before the request's body was
///   handed over: the upstream answered without reading it, and may read
///   it yet, as a request of its own;
/// - `refused_with_body`: any answer but a success to a request with a
///   body: a refusal or a redirect is what a service sends without
///   reading the body (RFC 9112 section 9.6 lets it close; many keep the
///   connection and then read the body as the next request). Nothing on
///   the wire tells the two apart, and a new connection is cheap beside an
///   answer handed to the wrong caller;
/// - `bodiless_answer`: an answer to a HEAD, or a 204 or 304 that
///   announces a body (a coding, or a length other than 0): hyper reads
///   no body there, and body bytes the upstream sends anyway, after the
///   next request was written, would be read as that request's answer.
fn out_of_step(status: StatusCode, headers: &http::HeaderMap, sent: Sent) -> Option<&'static str> {
    if !(200..=599).contains(&status.as_u16()) {
        return Some("not_final");
    }
    match sent.body_handed {
        Some(false) => return Some("early_answer"),
        Some(true) if !status.is_success() => return Some("refused_with_body"),
        _ => {}
    }
    let announces_body = || {
        headers.contains_key(http::header::TRANSFER_ENCODING)
            || headers
                .get_all(http::header::CONTENT_LENGTH)
                .iter()
                .any(|v| v.as_bytes().trim_ascii() != b"0")
    };
    let bodiless = matches!(status.as_u16(), 204 | 304);
    if sent.head || (bodiless && announces_body()) {
        return Some("bodiless_answer");
    }
    None
}

/// The most of a request body handed to hyper at a time. hyper takes a
/// frame whole and writes it as the socket allows, so a body handed over
/// as one frame (every keyed body is) would count as handed over long
/// before it is written; in pieces of this size, the end is handed over
/// only once all but hyper's own write buffer (a few pieces) has been
/// written. Keyed bodies are mostly smaller: one piece, as before.
const PIECE: usize = 64 * 1024;

/// A request body that says when its end has been handed to hyper (after
/// the frame that leaves it at its end, or when it reports its end),
/// handing data over in pieces of at most [`PIECE`] bytes.
struct Tracked {
    inner: Body,
    /// The rest of a data frame larger than a piece.
    rest: Option<Bytes>,
    handed: Arc<AtomicBool>,
}

impl Tracked {
    fn new(inner: Body, handed: Arc<AtomicBool>) -> Tracked {
        Tracked {
            inner,
            rest: None,
            handed,
        }
    }

    /// The next piece of `data`, keeping what is left of it.
    fn piece(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > PIECE {
            let piece = data.split_to(PIECE);
            self.rest = Some(data);
            piece
        } else {
            data
        }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = match this.rest.take() {
            Some(rest) => Poll::Ready(Some(Ok(http_body::Frame::data(this.piece(rest))))),
            None => match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => Poll::Ready(Some(Ok(http_body::Frame::data(this.piece(data))))),
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                },
                other => other,
            },
        };
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.rest.is_none() && this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            this.handed.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let end = self.rest.is_none() && self.inner.is_end_stream();
        if end {
            self.handed.store(true, Ordering::Release);
        }
        end
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let rest = self.rest.as_ref().map_or(0, |r| r.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

async fn reap(pool: Weak<Pool>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        pool.close_expired(Instant::now());
    }
}

/// An answer's body that gives its connection back to the pool when it
/// is dropped, read to its end or not. Whether the connection can take
/// another request is hyper's to say, and a checkout takes only one that
/// hyper says is ready: one whose answer was abandoned is ready only once
/// hyper has read the rest of that answer, and is closed otherwise.
struct Returning {
    body: Option<Incoming>,
    home: Option<(Conn, Arc<Pool>)>,
    /// When the answer's head came: the connection counts as idle from
    /// then. The upstream went quiet at some time after it, once it had
    /// written the body, and hyper reads the body only as fast as its
    /// reader takes it (a slow client may drain a large answer seconds
    /// after the upstream finished and started its own keep-alive
    /// clock), so no later time is known to be safe. An answer that took
    /// longer than the idle timeout costs its connection.
    head_at: Instant,
    /// Whether the exchange was in step: if not, the connection is
    /// closed when the body is dropped ([`out_of_step`]).
    in_step: bool,
}

impl Drop for Returning {
    fn drop(&mut self) {
        drop(self.body.take());
        if let Some((conn, pool)) = self.home.take() {
            pool.settle(conn, self.head_at, self.in_step);
        }
    }
}

impl http_body::Body for Returning {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        match self.body.as_mut() {
            Some(body) => std::pin::Pin::new(body).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), Incoming::size_hint)
    }
}

mod h2;
#[cfg(test)]
mod tests;
