//! The serving thread's one multiplexed HTTP/2 connection to the
//! upstream (`h2`, `h2c`, or `auto` once the upstream picked `h2`).
//!
//! Requests share it as streams; a new one is made when it has closed
//! (a GOAWAY, a broken socket), under a lock so that the requests that
//! come meanwhile wait for it rather than each opening their own. As
//! over HTTP/1.1, a request is sent again only when hyper hands it back
//! unwritten from a connection that had served before; and a connection
//! not ready by the request's deadline fails it as not sent.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::uri::{Parts, PathAndQuery};
use http::{Request, Response, Uri, header};
use hyper::client::conn::http2;
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use idem_http::{Body, boxed};
use tokio::time::Instant;

use super::{CONNECT_TOO_SLOW, Pool, SendError, SendRequest2, UpstreamIo as Io};
use crate::settings::UpstreamProtocol;

/// How often the upstream connection is pinged while it has streams open:
/// five minutes, the least interval grpc-go and grpc-java servers accept
/// by default (they answer more frequent pings, or pings on an idle
/// connection, with GOAWAY `too_many_pings`).
const KEEP_ALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(300);
/// How long a ping may go unanswered before the connection is dropped.
const KEEP_ALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The upstream connection's receive window.
const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

impl Pool {
    /// Whether requests go over HTTP/2 now.
    pub(super) fn speaks_h2(&self) -> bool {
        match self.protocol {
            UpstreamProtocol::H2 | UpstreamProtocol::H2c => true,
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::Auto => self.picked_h2.load(Ordering::Relaxed),
        }
    }

    /// Whether `io` is a connection the upstream picked HTTP/2 for, with
    /// `auto` (with `h2` or `h2c` the HTTP/2 path makes every connection).
    pub(super) fn upstream_picked_h2(&self, io: &Io) -> bool {
        self.protocol == UpstreamProtocol::Auto && io.connected().is_negotiated_h2()
    }

    /// Makes `io` the thread's HTTP/2 connection (`auto`, the upstream
    /// picked `h2`): HTTP/2 from now on.
    pub(super) async fn adopt_h2(&self, io: Io) -> Result<(), SendError> {
        let sender = handshake(io).await?;
        self.picked_h2.store(true, Ordering::Relaxed);
        *self.h2.lock().await = Some(sender);
        Ok(())
    }

    /// Sends `request` as a stream of the thread's HTTP/2 connection, made
    /// first if there is none or it closed.
    pub(super) async fn send_h2(
        self: &Arc<Self>,
        request: Request<Body>,
        deadline: Instant,
    ) -> Result<Response<Body>, SendError> {
        let mut request = self.absolute(request);
        loop {
            let (mut sender, reused) = self.h2_sender(deadline).await?;
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(response.map(boxed)),
                Err(mut e) => match e.take_message() {
                    // The connection closed before the stream was opened:
                    // drop it and try a new one, once.
                    Some(unsent) if reused => {
                        self.forget_h2().await;
                        request = unsent;
                    }
                    Some(_) => return Err(SendError::NotSent(e.into_error().into())),
                    None => {
                        let error = e.into_error();
                        // A refused stream was not processed (RFC 9113
                        // section 8.7): as good as not sent.
                        if refused(&error) {
                            return Err(SendError::NotSent(error.into()));
                        }
                        return Err(SendError::Failed(error));
                    }
                },
            }
        }
    }

    /// The thread's HTTP/2 connection if it can take a stream, else a new
    /// one; whether it had served before.
    async fn h2_sender(&self, deadline: Instant) -> Result<(SendRequest2, bool), SendError> {
        let too_slow = || SendError::NotSent(CONNECT_TOO_SLOW.into());
        let mut slot = tokio::time::timeout_at(deadline, self.h2.lock())
            .await
            .map_err(|_| too_slow())?;
        if let Some(sender) = slot.as_ref().filter(|s| !s.is_closed()) {
            return Ok((sender.clone(), true));
        }
        let made = async {
            let io = self.connect_io().await?;
            let picked_h2 = io.connected().is_negotiated_h2();
            match self.protocol {
                UpstreamProtocol::Auto if !picked_h2 => {
                    // The upstream no longer picks HTTP/2: HTTP/1.1 for
                    // the requests after this one.
                    self.picked_h2.store(false, Ordering::Relaxed);
                    return Err(SendError::NotSent(
                        "the upstream picked HTTP/1.1 on a new connection".into(),
                    ));
                }
                // Over TLS, `h2` means the upstream agreed to HTTP/2: an
                // HTTP/2 preface sent to an HTTP/1.1 server is a request
                // of unknown outcome.
                UpstreamProtocol::H2 if !picked_h2 => {
                    return Err(SendError::NotSent(
                        "the upstream did not pick h2 by ALPN".into(),
                    ));
                }
                _ => {}
            }
            handshake(io).await
        };
        let sender = tokio::time::timeout_at(deadline, made)
            .await
            .map_err(|_| too_slow())??;
        *slot = Some(sender.clone());
        Ok((sender, false))
    }

    /// Forgets the thread's connection if it has closed (another may
    /// have taken its place already).
    async fn forget_h2(&self) {
        let mut slot = self.h2.lock().await;
        if slot.as_ref().is_some_and(SendRequest2::is_closed) {
            *slot = None;
        }
    }

    /// `request` with an absolute target (HTTP/2 carries the scheme and
    /// authority as pseudo-headers) and without `Host`, which
    /// `:authority` replaces (RFC 9113 section 8.3.1).
    fn absolute(&self, mut request: Request<Body>) -> Request<Body> {
        let mut parts = Parts::default();
        parts.scheme = self.origin.scheme().cloned();
        parts.authority = self.origin.authority().cloned();
        parts.path_and_query = Some(
            request
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        request.headers_mut().remove(header::HOST);
        request
    }
}

/// Whether `error` is a stream the upstream refused (`REFUSED_STREAM`).
fn refused(error: &hyper::Error) -> bool {
    let mut cause = std::error::Error::source(error);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<::h2::Error>() {
            return h2.reason() == Some(::h2::Reason::REFUSED_STREAM);
        }
        cause = c.source();
    }
    false
}

/// The HTTP/2 handshake over `io`, its connection's task spawned on the
/// thread's runtime. The connection is pinged while it has streams open,
/// so a half-open one (an upstream that went away without a word) is
/// found and replaced; its window is large, so that a few slow readers
/// among the clients do not hold every stream's answer back.
///
/// Boxed: the handshake's state is kilobytes, and every future that could
/// await it (HTTP/1.1's connect included, for `auto`) would carry that
/// much, copied on every request it serves (measured: 12,000 instructions
/// a request of `memcpy`, bench/gateway-instructions.sh).
fn handshake(io: Io) -> futures_util::future::BoxFuture<'static, Result<SendRequest2, SendError>> {
    Box::pin(handshaking(io))
}

async fn handshaking(io: Io) -> Result<SendRequest2, SendError> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(false)
        .initial_connection_window_size(CONNECTION_WINDOW);
    let (sender, connection) = builder
        .handshake(io)
        .await
        .map_err(|e| SendError::NotSent(e.into()))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
        }
    });
    Ok(sender)
}
