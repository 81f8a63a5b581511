//! The connections of one serving thread to the one upstream.
//!
//! The gateway talks to a single origin, and each serving thread has a
//! pool of its own (a connection's task runs on the thread that opened
//! it). So the pool is a stack of idle HTTP/1 connections, last in first
//! out, behind a lock that only its own thread takes: no pool key to hash
//! and compare, no waiters to wake, and no task spawned to return a
//! connection once it is ready again (hyper-util's general-purpose pool
//! did all three for every request; BENCHMARKS.md, "The gateway's own
//! upstream pool").
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
//! Not a general client: one origin, HTTP/1 only, no proxies, and the
//! caller writes `Host` and the origin-form target.

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

/// Connections kept in a thread's pool, past which a returned one is
/// closed (a returned connection still finishing its exchange counts).
/// A thread with more requests in flight than this opens connections for
/// them as before, and closes the extra ones as they come back.
const MAX_IDLE: usize = 1024;

/// Connections closed because their exchange was not in step, by reason
/// ([`out_of_step`]).
pub(crate) const CLOSED: &str = "idem_upstream_connections_closed_total";

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
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Arc<Pool> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        // The connector must let the https scheme through to the TLS layer.
        connector.enforce_http(false);
        let connector = match tls {
            // Only https: a redirect-free proxy never changes scheme, and
            // an https upstream must never be reached in plain text.
            Some(tls) => HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_only()
                .enable_http1()
                .wrap_connector(connector),
            None => HttpsConnectorBuilder::new()
                .with_tls_config(plain_only())
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector),
        };
        Arc::new(Pool {
            connector,
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
                    Ok(connected) => (connected?, false),
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

    async fn connect(self: &Arc<Self>) -> Result<Conn, SendError> {
        self.start_reaping();
        let io = self
            .connector
            .clone()
            .oneshot(self.origin.clone())
            .await
            .map_err(SendError::NotSent)?;
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
        Ok(Conn {
            sender,
            task: task.abort_handle(),
        })
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

#[cfg(test)]
mod rule_tests {
    use http::{HeaderMap, HeaderValue, StatusCode, header};

    use super::{Sent, out_of_step};

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    /// Every rule, and what stays in step: a bodiless request's final
    /// answer, and a success to a body handed over whole.
    #[test]
    fn exchanges_out_of_step_are_named() {
        let none = HeaderMap::new();
        let mut length = HeaderMap::new();
        length.insert(header::CONTENT_LENGTH, HeaderValue::from_static("40"));
        let mut zero = HeaderMap::new();
        zero.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        let mut coded = HeaderMap::new();
        coded.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        // hyper reads no length for a 204 or 304, so repeated ones need
        // not agree: any of them other than 0 announces a body.
        let mut zero_then_five = zero.clone();
        zero_then_five.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        let get = Sent {
            body_handed: None,
            head: false,
        };
        let handed = Sent {
            body_handed: Some(true),
            ..get
        };
        let early = Sent {
            body_handed: Some(false),
            ..get
        };
        let head = Sent { head: true, ..get };
        let cases = [
            (200, &none, get, None),
            (404, &length, get, None),
            (500, &length, get, None),
            (201, &length, handed, None),
            (204, &none, handed, None),
            (204, &zero, get, None),
            (304, &none, get, None),
            (101, &none, get, Some("not_final")),
            (600, &length, get, Some("not_final")),
            (999, &length, handed, Some("not_final")),
            (200, &length, early, Some("early_answer")),
            (401, &length, early, Some("early_answer")),
            (401, &length, handed, Some("refused_with_body")),
            (302, &none, handed, Some("refused_with_body")),
            (503, &length, handed, Some("refused_with_body")),
            (200, &length, head, Some("bodiless_answer")),
            (204, &length, get, Some("bodiless_answer")),
            (304, &coded, get, Some("bodiless_answer")),
            (204, &zero_then_five, get, Some("bodiless_answer")),
        ];
        for (code, headers, sent, expected) in cases {
            assert_eq!(
                out_of_step(status(code), headers, sent),
                expected,
                "{code} {headers:?} body {:?} head {}",
                sent.body_handed,
                sent.head
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http::{HeaderValue, Request, StatusCode, Uri, header};
    use http_body_util::BodyExt as _;
    use idem_http::{Body, full};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{Semaphore, mpsc};

    use super::{Pool, SendError};

    /// What the hand-written upstream does after reading a request head.
    #[derive(Clone)]
    enum Then {
        /// Answers and keeps the connection.
        Answer,
        /// Answers, then closes the connection without saying so.
        AnswerAndClose,
        /// Closes the connection without answering.
        CloseUnanswered,
        /// Answers a connection's first request; closes it, unanswered,
        /// once it has read the second.
        AnswerOnceThenCloseUnanswered,
        /// Sends the answer's head, and its body once a permit is added.
        AnswerBodyWhenLetGo(Arc<Semaphore>),
    }

    /// An upstream on a raw socket that counts the connections it
    /// accepted and the request heads it read, and reports a
    /// connection's end on `closed` (its client closed it, or it closed
    /// it after answering).
    struct Upstream {
        origin: Uri,
        accepted: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
        closed: mpsc::UnboundedReceiver<()>,
    }

    async fn upstream(then: Then) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let (accepted, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (tell, closed) = mpsc::unbounded_channel();
        let (a, r) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                let (then, r, tell) = (then.clone(), r.clone(), tell.clone());
                tokio::spawn(async move {
                    serve(socket, then, r).await;
                    let _ = tell.send(());
                });
            }
        });
        Upstream {
            origin,
            accepted,
            requests,
            closed,
        }
    }

    /// Serves one connection until either side closes it.
    async fn serve(mut socket: TcpStream, then: Then, requests: Arc<AtomicUsize>) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let n = socket.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            // Requests here have no body: a head ends one.
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                let seen = requests.fetch_add(1, Ordering::SeqCst) + 1;
                let head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n";
                let written = match &then {
                    Then::CloseUnanswered => return,
                    Then::AnswerOnceThenCloseUnanswered if seen > 1 => return,
                    Then::AnswerBodyWhenLetGo(gate) => {
                        let head_sent = socket.write_all(head).await;
                        let Ok(permit) = gate.acquire().await else {
                            return;
                        };
                        permit.forget();
                        match head_sent {
                            Ok(()) => socket.write_all(b"ok").await,
                            Err(e) => Err(e),
                        }
                    }
                    _ => socket.write_all(&[&head[..], b"ok"].concat()).await,
                };
                if written.is_err() {
                    return;
                }
                if let Then::AnswerAndClose = then {
                    return;
                }
            }
        }
    }

    fn pool(up: &Upstream, idle_timeout: Duration) -> Arc<Pool> {
        Pool::new(
            up.origin.clone(),
            None,
            Duration::from_secs(5),
            idle_timeout,
        )
    }

    fn get() -> Request<Body> {
        let mut request = Request::new(full(""));
        *request.uri_mut() = Uri::from_static("/x");
        request
            .headers_mut()
            .insert(header::HOST, HeaderValue::from_static("up"));
        request
    }

    /// A deadline no test here reaches.
    fn later() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    async fn ok(pool: &Arc<Pool>) {
        let response = pool.send(get(), later()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }

    #[tokio::test]
    async fn one_connection_serves_requests_one_after_another() {
        let up = upstream(Then::Answer).await;
        let pool = pool(&up, Duration::from_secs(60));
        for _ in 0..5 {
            ok(&pool).await;
        }
        assert_eq!(up.requests.load(Ordering::SeqCst), 5);
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    /// Requests at once each get a connection; afterwards every one is
    /// idle and reused, and none is opened again.
    #[tokio::test]
    async fn concurrent_requests_open_connections_that_are_then_reused() {
        let up = upstream(Then::Answer).await;
        let pool = pool(&up, Duration::from_secs(60));
        let at_once = futures_util::future::join_all((0..8).map(|_| ok(&pool)));
        at_once.await;
        let opened = up.accepted.load(Ordering::SeqCst);
        assert!((1..=8).contains(&opened), "{opened}");
        for _ in 0..8 {
            ok(&pool).await;
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), opened);
        assert_eq!(up.requests.load(Ordering::SeqCst), 16);
    }

    /// An upstream that closes each connection after its answer: every
    /// request is answered, each reaches it once, and no closed
    /// connection is kept.
    #[tokio::test]
    async fn connections_the_upstream_closes_are_not_reused() {
        let mut up = upstream(Then::AnswerAndClose).await;
        let pool = pool(&up, Duration::from_secs(60));
        for n in 1..=5 {
            ok(&pool).await;
            assert_eq!(up.requests.load(Ordering::SeqCst), n);
            a_connection_ends(&mut up).await;
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 5);
    }

    /// A request the upstream read before the connection failed may have
    /// been acted on: it is reported, not sent again.
    #[tokio::test]
    async fn a_request_that_was_written_is_never_sent_again() {
        let up = upstream(Then::CloseUnanswered).await;
        let pool = pool(&up, Duration::from_secs(60));
        // Twice: the second on a fresh connection, as the first closed.
        for n in 1..=2 {
            match pool.send(get(), later()).await {
                Err(SendError::Failed(_)) => {}
                other => panic!("{:?}", other.map(|r| r.status())),
            }
            assert_eq!(up.requests.load(Ordering::SeqCst), n);
            assert_eq!(up.accepted.load(Ordering::SeqCst), n);
        }
    }

    /// The same on a connection that had served before, where an unsent
    /// request would be tried again: this one was written, so it is not.
    #[tokio::test]
    async fn a_request_written_on_a_reused_connection_is_never_sent_again() {
        let up = upstream(Then::AnswerOnceThenCloseUnanswered).await;
        let pool = pool(&up, Duration::from_secs(60));
        ok(&pool).await;
        match pool.send(get(), later()).await {
            Err(SendError::Failed(_)) => {}
            other => panic!("{:?}", other.map(|r| r.status())),
        }
        assert_eq!(up.requests.load(Ordering::SeqCst), 2);
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_upstream_that_is_not_listening_is_unreachable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let origin: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(listener);
        let pool = Pool::new(
            origin,
            None,
            Duration::from_secs(5),
            Duration::from_secs(60),
        );
        assert!(matches!(
            pool.send(get(), later()).await,
            Err(SendError::NotSent(_))
        ));
    }

    /// An upstream that takes the TCP connection but never finishes the
    /// TLS handshake (the connector's own timeout covers the TCP connect
    /// only) fails by the request's deadline as not sent: nothing of the
    /// request was written, so the gateway may release its key, where
    /// the request's timeout would have held it as of unknown outcome.
    #[tokio::test]
    async fn a_handshake_that_outlasts_the_deadline_is_not_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin: Uri = format!("https://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let (took, mut taken) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Holds what it accepts, silent, until the test ends.
            let (socket, _) = listener.accept().await.unwrap();
            let _ = took.send(());
            let _held = socket;
            std::future::pending::<()>().await;
        });
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let pool = Pool::new(
            origin,
            Some(tls),
            Duration::from_secs(60),
            Duration::from_secs(60),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        let sent = tokio::time::timeout(Duration::from_secs(30), pool.send(get(), deadline))
            .await
            .expect("the deadline ends the send");
        match sent {
            Err(SendError::NotSent(e)) => {
                assert!(e.to_string().contains("not ready within"), "{e}");
            }
            Err(SendError::Failed(e)) => panic!("reported as written: {e}"),
            Ok(r) => panic!("answered: {}", r.status()),
        }
        taken.recv().await.expect("the TCP connection was made");
    }

    /// A quiet pool closes its idle connections after the idle timeout:
    /// the upstream sees them end.
    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let mut up = upstream(Then::Answer).await;
        let pool = pool(&up, Duration::from_millis(200));
        ok(&pool).await;
        assert_eq!(pool.idle_count(), 1);
        a_connection_ends(&mut up).await;
        assert_eq!(pool.idle_count(), 0);
        // And the next request opens a new one.
        ok(&pool).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    }

    /// Waits for the upstream to see a connection end; fails after 20 s.
    async fn a_connection_ends(up: &mut Upstream) {
        let ended = tokio::time::timeout(Duration::from_secs(20), up.closed.recv()).await;
        assert!(matches!(ended, Ok(Some(()))), "no connection ended");
    }

    /// Connections found idle for the idle timeout at a checkout (the
    /// closing task has not come round to them yet) are not used: the
    /// upstream may be closing them at that moment. The newest ready one
    /// tells, and it and every older one go.
    #[tokio::test]
    async fn a_checkout_passes_over_connections_idle_too_long() {
        let mut up = upstream(Then::Answer).await;
        // The closing task runs every 2.5 s; the test takes milliseconds.
        let timeout = Duration::from_secs(10);
        let pool = pool(&up, timeout);
        futures_util::future::join(ok(&pool), ok(&pool)).await;
        ok(&pool).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.idle_count(), 2);
        for entry in pool.idle.lock().unwrap().iter_mut() {
            entry.since = entry.since.checked_sub(timeout).unwrap();
        }
        ok(&pool).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 3);
        a_connection_ends(&mut up).await;
        a_connection_ends(&mut up).await;
        assert_eq!(pool.idle_count(), 1);
    }

    /// An answer whose body comes after its head holds its connection
    /// until the body is dropped; read to its end, the connection is
    /// used again.
    #[tokio::test]
    async fn a_connection_goes_back_when_its_answer_is_read() {
        let gate = Arc::new(Semaphore::new(0));
        let up = upstream(Then::AnswerBodyWhenLetGo(gate.clone())).await;
        let pool = pool(&up, Duration::from_secs(60));
        for n in 1..=3 {
            let response = pool.send(get(), later()).await.unwrap();
            assert_eq!(pool.idle_count(), 0, "the connection is still in use");
            gate.add_permits(1);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
            assert_eq!(pool.idle_count(), 1);
            assert_eq!(up.requests.load(Ordering::SeqCst), n);
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    }

    /// A connection counts as idle from when its answer's head came, not
    /// from when its body was read: hyper reads a body only as fast as
    /// the client takes it, so the upstream may have gone quiet (and
    /// started its own keep-alive clock) long before the end is read.
    #[tokio::test]
    async fn a_connection_is_idle_from_its_answers_head() {
        let gate = Arc::new(Semaphore::new(0));
        let up = upstream(Then::AnswerBodyWhenLetGo(gate.clone())).await;
        let pool = pool(&up, Duration::from_secs(60));
        let response = pool.send(get(), later()).await.unwrap();
        let head_seen = tokio::time::Instant::now();
        gate.add_permits(1);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        let idle = pool.idle.lock().unwrap();
        assert_eq!(idle.len(), 1);
        assert!(idle[0].since <= head_seen, "idle from the body's end");
    }

    /// A connection that comes back idle for the idle timeout already
    /// (its answer's head came that long ago) is not kept, and one found
    /// idle that long at a checkout is dropped alone: the fresh ones
    /// returned before it stay in use.
    #[tokio::test]
    async fn a_connection_back_late_is_dropped_alone() {
        let up = upstream(Then::Answer).await;
        let timeout = Duration::from_secs(10);
        let pool = pool(&up, timeout);
        let long_ago = tokio::time::Instant::now().checked_sub(timeout).unwrap();
        let late = pool.connect().await.unwrap();
        pool.put(late, long_ago);
        assert_eq!(pool.idle_count(), 0, "kept though idle too long");

        futures_util::future::join(ok(&pool), ok(&pool)).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 3);
        assert_eq!(pool.idle_count(), 2);
        // The newest came back late: only it goes.
        pool.idle.lock().unwrap().last_mut().unwrap().since = long_ago;
        ok(&pool).await;
        assert_eq!(
            up.accepted.load(Ordering::SeqCst),
            3,
            "a fresh one was used"
        );
        assert_eq!(pool.idle_count(), 1);
    }

    /// A connection whose answer was dropped before its body came is not
    /// handed out while hyper is still finishing that answer: the next
    /// request, sent at once, gets a connection of its own and reaches
    /// the upstream once. (Were a checkout to offer it, hyper would
    /// refuse the request unsent and the pool would take the next
    /// connection: the readiness check saves that round.)
    #[tokio::test]
    async fn a_connection_whose_answer_was_dropped_unread_is_not_used_again() {
        let gate = Arc::new(Semaphore::new(0));
        let up = upstream(Then::AnswerBodyWhenLetGo(gate.clone())).await;
        let pool = pool(&up, Duration::from_secs(60));
        let response = pool.send(get(), later()).await.unwrap();
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
        drop(response);
        // Both bodies may be sent: the abandoned one, and the next's.
        gate.add_permits(2);
        let next = pool.send(get(), later()).await.unwrap();
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
        let body = next.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        assert_eq!(up.requests.load(Ordering::SeqCst), 2);
    }
}
