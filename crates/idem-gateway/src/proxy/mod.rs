//! Forwarding to the upstream over the serving thread's [`Pool`].
//!
//! What the upstream receives is built here, not copied: hop-by-hop
//! headers go, `Host` is the upstream's, and the forwarding headers
//! (`Forwarded`, `X-Forwarded-For`, `-Host`, `-Proto`) are the gateway's own,
//! with every value it writes checked or quoted (RFC 7239), so a client
//! cannot add a forwarding element or a header. A client's own forwarding
//! headers are dropped unless the settings say the gateway's only client
//! is a trusted proxy ([`forwarding`]).
//!
//! For a keyed request (one the idempotency layer executes) the whole
//! exchange, response body included up to the replay limit, runs under
//! the upstream timeout, and a failure after the request was sent is
//! marked [`OutcomeUnknown`]: the upstream may have committed, so the key
//! stays held until its lease ends. Past the replay limit the layer
//! streams the answer instead of storing it, and the rest of the body
//! runs under the body timeout between frames.
//!
//! What the client receives of an answer is framed from what is sent: a
//! `Content-Length` that came with a `Transfer-Encoding` is dropped (RFC
//! 9112 section 6.3), and an answer whose status is not a final one (a
//! 101 nobody asked for, a code outside 100-599) is not passed on at all
//! (502, and the key released).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::header::{self, HeaderName};
use http::{HeaderValue, Request, Response, StatusCode};
use idem_http::{Body, IdempotencyContext, IdempotencyLayer, OutcomeUnknown, UnverifiedEnd, boxed};
use tokio::time::Instant;
use tower::Service;

mod deadline;
mod forwarding;
mod framing;
#[cfg(test)]
mod tests;
mod upstream;

use deadline::Deadline;
pub(crate) use forwarding::Peer;
pub use forwarding::rewritten_on_the_way;
use forwarding::{rewrite_headers, strip_hop_by_hop};
pub(crate) use framing::transfer_codings;
use framing::{ends_at_close, unknown_coding, wants_trailers};
use upstream::Upstream;

use crate::h2_server::ExecutionSlot;
use crate::pool::{Pool, SendError};
use crate::settings::UpstreamSettings;

/// Forwards requests to one upstream. Cheap to clone (the service is
/// cloned for every request).
#[derive(Clone)]
pub(crate) struct Proxy(Arc<Forwarder>);

struct Forwarder {
    pool: Arc<Pool>,
    upstream: Upstream,
    /// `https` when the gateway's own listener speaks TLS, else `http`:
    /// what the forwarding headers say the client used.
    client_proto: &'static str,
    timeout: Duration,
    /// The layer's response limit: how much of a keyed answer the layer
    /// reads whole, under `timeout`.
    replay_limit: usize,
    /// How long the rest of an answer too large to store may go without
    /// a frame (`--body-timeout`).
    body_idle_timeout: Duration,
    trust_forwarded: bool,
    /// End-to-end headers a client may not remove by naming them in
    /// `Connection`: the key (under the layer's key header) and the scope
    /// the record was claimed under, among others.
    protected: Arc<[HeaderName]>,
}

/// What the proxy takes from the idempotency layer in front of it, so
/// that whoever embeds the gateway cannot set it apart from the layer.
pub(crate) struct LayerTerms {
    /// The layer's key header and scope headers: the upstream must get
    /// them as the client sent them.
    protected: Vec<HeaderName>,
    /// The layer's response limit.
    replay_limit: usize,
}

impl LayerTerms {
    pub(crate) fn of(layer: &IdempotencyLayer) -> LayerTerms {
        LayerTerms {
            protected: std::iter::once(layer.key_header())
                .chain(layer.scope_headers())
                .cloned()
                .collect(),
            replay_limit: layer.response_limit(),
        }
    }
}

impl Proxy {
    /// A proxy to `upstream`, behind a layer of `terms`, with a connection
    /// pool of its own (one per serving thread). `client_proto` is what
    /// the forwarding headers say the client used: `https` when the
    /// gateway's listener speaks TLS.
    pub(crate) fn new(
        upstream: &UpstreamSettings,
        terms: &LayerTerms,
        client_proto: &'static str,
    ) -> Proxy {
        let settings = upstream;
        let upstream = Upstream::new(&settings.url);
        // An upstream URL without an authority is never connected to.
        let origin = upstream.origin.clone().unwrap_or_default();
        let mut protected = vec![
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::CONTENT_LENGTH,
            header::CONTENT_ENCODING,
        ];
        for name in terms.protected.iter().chain(&settings.protected_headers) {
            if !protected.contains(name) {
                protected.push(name.clone());
            }
        }
        Proxy(Arc::new(Forwarder {
            pool: Pool::new(
                origin,
                settings.tls.clone(),
                settings.protocol,
                settings.timeout.min(Duration::from_secs(5)),
                settings.idle_timeout,
            ),
            upstream,
            client_proto,
            timeout: settings.timeout,
            replay_limit: terms.replay_limit,
            body_idle_timeout: settings.body_timeout,
            trust_forwarded: settings.trust_forwarded,
            protected: protected.into(),
        }))
    }
}

/// Marks a gateway answer whose upstream outcome is unknown.
fn unknown(mut response: Response<Body>) -> Response<Body> {
    response.extensions_mut().insert(OutcomeUnknown);
    response
}

/// An error and its causes, for the log: the client's own message alone
/// ("client error (Connect)") does not say what failed.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn problem(status: StatusCode, kind: &str, title: &'static str, detail: &str) -> Response<Body> {
    idem_http::Problem::idem(status, kind, title, detail).into_response()
}

impl Forwarder {
    async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        if parts.method == http::Method::CONNECT {
            // A tunnel is not a request to the service: its bytes would
            // pass unread by the layer, and the upstream's connection
            // would be given over to one client.
            let mut refused = problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "The gateway does not open tunnels (CONNECT).",
            );
            // Every other method is forwarded.
            refused.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE"),
            );
            return refused;
        }
        let Some(target) = self.upstream.target(&parts.uri) else {
            return problem(
                StatusCode::BAD_GATEWAY,
                "bad-upstream-url",
                "Bad upstream URL",
                "the request could not be mapped onto the upstream",
            );
        };
        let keyed = parts.extensions.get::<IdempotencyContext>().is_some();
        let head = parts.method == http::Method::HEAD;
        // An HTTP/2 request's stream slot goes with its answer (see
        // `h2_server.rs`), not with the request hyper drops once written.
        let slot = parts.extensions.remove::<ExecutionSlot>();
        // An HTTP/2 client names the host in the target, not in `Host`:
        // the forwarding headers are written from it as from `Host`.
        if !parts.headers.contains_key(header::HOST)
            && let Some(authority) = parts.uri.authority()
            && let Ok(host) = HeaderValue::from_str(authority.as_str())
        {
            parts.headers.insert(header::HOST, host);
        }
        // `TE: trailers` says the client reads trailers (gRPC needs it
        // sent on); every other transfer coding is the hop's.
        let takes_trailers = wants_trailers(&parts.headers);
        rewrite_headers(
            &mut parts.headers,
            parts.extensions.get::<Peer>(),
            self.upstream.host.as_ref(),
            &self.protected,
            self.client_proto,
            self.trust_forwarded,
        );
        if takes_trailers {
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
        parts.uri = target;
        let request = Request::from_parts(parts, body);
        let deadline = Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, self.pool.send(request, deadline)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                if let Some(slot) = slot {
                    parts.extensions.insert(slot);
                }
                if !(200..=599).contains(&parts.status.as_u16()) {
                    // The pool closes its connection (a 101 ended it).
                    return invalid_status(parts.status);
                }
                if let Some(coding) = unknown_coding(&parts.headers) {
                    // The body arrives coded, and nothing the client can
                    // read names the coding; the upstream did answer, so
                    // a keyed request's outcome is not known to its
                    // client: the key stays held.
                    let refused = unreadable_coding(&coding);
                    return if keyed { unknown(refused) } else { refused };
                }
                // An HTTP/2 answer ends with its stream's END_STREAM flag,
                // never with its connection.
                let unverified_end = parts.version < http::Version::HTTP_2
                    && ends_at_close(&parts.headers)
                    && !head
                    && !matches!(parts.status.as_u16(), 204 | 304);
                // RFC 9112 section 6.3: a length that came with a transfer
                // coding is not the body's; hyper decoded the body by the
                // coding, and the client's framing is computed from it.
                if parts.headers.contains_key(header::TRANSFER_ENCODING) {
                    parts.headers.remove(header::CONTENT_LENGTH);
                }
                strip_hop_by_hop(&mut parts.headers, &[]);
                let body = match (keyed, unverified_end) {
                    // The layer reads a keyed answer whole (up to the
                    // replay limit) before storing it: a stalled body
                    // must not outlive the lease.
                    (true, false) => boxed(Deadline::whole_until(
                        body,
                        deadline,
                        self.replay_limit,
                        self.body_idle_timeout,
                    )),
                    (true, true) => {
                        // Its end cannot be told from a cut: the layer
                        // passes it on and does not store it.
                        parts.extensions.insert(UnverifiedEnd);
                        boxed(Deadline::idle(body, self.body_idle_timeout))
                    }
                    // A passthrough answer has no clock of its own: a
                    // timer per answer cost 2-4 us of about 20
                    // (docs/benchmarks-history.md, issue 34). The pool's
                    // answer is boxed already.
                    (false, _) => body,
                };
                Response::from_parts(parts, body)
            }
            Ok(Err(SendError::NotSent(e))) => {
                tracing::warn!(error = %chain(&*e), "upstream unreachable");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unreachable",
                    "Upstream unreachable",
                    "The service behind the gateway could not be reached; the request was not forwarded. Retry with the same key.",
                )
            }
            Ok(Err(SendError::Failed(e))) => {
                tracing::warn!(error = %chain(&e), "upstream failed");
                unknown(problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-failed",
                    "Upstream failed",
                    "The connection to the service behind the gateway failed after the request was sent; its result is unknown. The key stays held until its lease ends: retry with the same key (409 until then).",
                ))
            }
            Err(_) => unknown(problem(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timed out",
                "The service behind the gateway did not answer in time; its result is unknown. The key stays held until its lease ends: retry with the same key (409 until then).",
            )),
        }
    }
}

/// The answer for an upstream answer coded in a way the gateway cannot
/// pass on.
fn unreadable_coding(coding: &str) -> Response<Body> {
    tracing::warn!(
        coding,
        "upstream answered with a transfer coding other than chunked"
    );
    problem(
        StatusCode::BAD_GATEWAY,
        "upstream-failed",
        "Upstream failed",
        "The service behind the gateway framed its answer with a transfer coding other than chunked, which the gateway cannot pass on; its answer was not passed on. Retry with the same key (409 until the key's lease ends).",
    )
}

/// The answer for an upstream status that is not a final one: nothing of
/// it is passed on, and the layer settles the key as for any 502 (by
/// default released, as for a 5xx: RFC 9110 section 15 reads an unknown
/// class as a server error).
fn invalid_status(status: StatusCode) -> Response<Body> {
    tracing::warn!(
        status = status.as_u16(),
        "upstream answered with a status that is not a final one"
    );
    problem(
        StatusCode::BAD_GATEWAY,
        "upstream-failed",
        "Upstream failed",
        &format!(
            "The service behind the gateway answered with status {}, which is not a final HTTP status; the answer was not passed on. Retry with the same key.",
            status.as_u16()
        ),
    )
}

impl Service<Request<Body>> for Proxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let forwarder = self.0.clone();
        Box::pin(async move { Ok(forwarder.forward(req).await) })
    }
}
