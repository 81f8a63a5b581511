//! Forwarding to the upstream over the serving thread's [`Pool`].
//!
//! What the upstream receives is built here, not copied: hop-by-hop
//! headers go, `Host` is the upstream's, and the forwarding headers
//! (`Forwarded`, `X-Forwarded-For`, `-Host`, `-Proto`) are the gateway's own,
//! with every value it writes checked or quoted (RFC 7239), so a client
//! cannot add a forwarding element or a header. A client's own forwarding
//! headers are dropped unless `--trust-forwarded` says the gateway's only
//! client is a trusted proxy.
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
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{self, HeaderName};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use idem_http::{Body, BoxError, IdempotencyContext, OutcomeUnknown, UnverifiedEnd, boxed};
use std::future::Future as _;
use tokio::time::{Instant, Sleep};
use tower::Service;

use super::pool::{Pool, SendError};
use crate::config::GatewayConfig;

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
    /// The replay limit (`--max-response`): how much of a keyed answer
    /// the layer reads whole, under `timeout`.
    replay_limit: usize,
    /// How long the rest of an answer too large to store may go without
    /// a frame (`--body-timeout`).
    body_idle_timeout: Duration,
    trust_forwarded: bool,
    /// End-to-end headers a client may not remove by naming them in
    /// `Connection`: the key (under `--key-header`'s name) and the scope
    /// the record was claimed under.
    protected: Arc<[HeaderName]>,
}

impl Proxy {
    /// A proxy to the configured upstream, with a connection pool of its
    /// own (one per serving thread).
    pub(crate) fn new(cfg: &GatewayConfig) -> Proxy {
        let upstream = Upstream::new(&cfg.upstream);
        // An upstream URL without an authority is never connected to.
        let origin = upstream.origin.clone().unwrap_or_default();
        Proxy(Arc::new(Forwarder {
            pool: Pool::new(
                origin,
                cfg.upstream_tls.clone(),
                cfg.upstream_timeout.min(Duration::from_secs(5)),
                cfg.upstream_idle_timeout,
            ),
            upstream,
            client_proto: if cfg.tls.is_some() { "https" } else { "http" },
            timeout: cfg.upstream_timeout,
            replay_limit: cfg.max_response,
            body_idle_timeout: cfg.body_timeout,
            trust_forwarded: cfg.trust_forwarded,
            protected: [
                cfg.key_header.clone(),
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::CONTENT_LENGTH,
                header::CONTENT_ENCODING,
            ]
            .into_iter()
            .chain(cfg.scope_headers.iter().cloned())
            .collect(),
        }))
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Forwarding headers a client could forge.
const FORWARDING: [HeaderName; 5] = [
    header::FORWARDED,
    X_FORWARDED_FOR,
    X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
    HeaderName::from_static("x-real-ip"),
];

/// The client at the other end of one connection, with the text the
/// forwarding headers give it, written once per connection rather than
/// once per request: the front service puts it in every request's
/// extensions.
#[derive(Clone, Debug)]
pub(crate) struct Peer(Arc<PeerText>);

#[derive(Debug)]
struct PeerText {
    /// The address as `X-Forwarded-For` lists it.
    address: HeaderValue,
    /// The address as an RFC 7239 node: IPv6 quoted and in brackets.
    node: String,
}

impl Peer {
    pub(crate) fn new(addr: SocketAddr) -> Peer {
        let ip = addr.ip();
        let text = ip.to_string();
        let node = if ip.is_ipv6() {
            format!("\"[{text}]\"")
        } else {
            text.clone()
        };
        // An address's text is digits, dots, colons and hex letters.
        let address = HeaderValue::try_from(text)
            .unwrap_or_else(|_| unreachable!("an IP address is a valid header value"));
        Peer(Arc::new(PeerText { address, node }))
    }
}

/// `uri`'s host, with its port unless the scheme's default (80 for http,
/// 443 for https and wss): the rule hyper-util's client writes `Host` by.
fn host_of(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let secure = matches!(uri.scheme_str(), Some("https" | "wss"));
    let value = match uri.port() {
        Some(port) if !matches!((port.as_u16(), secure), (443, true) | (80, false)) => {
            format!("{host}:{port}")
        }
        _ => host.to_owned(),
    };
    HeaderValue::try_from(value).ok()
}

/// The upstream's origin and path prefix, taken apart once.
struct Upstream {
    /// Its scheme and authority, where connections go; `None` for an
    /// upstream URL without an authority, which the configuration refuses
    /// (a target is then never built: 502).
    origin: Option<Uri>,
    /// The upstream URL's path without its trailing slashes: prefixed to
    /// every request's path.
    base: String,
    /// The `Host` every request to it carries: the URL's host, and its
    /// port unless that is the scheme's default (the rule hyper-util's
    /// client wrote it by, formatting it for each request).
    host: Option<HeaderValue>,
}

impl Upstream {
    fn new(upstream: &Uri) -> Upstream {
        let origin = upstream.authority().and_then(|authority| {
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(upstream.scheme().cloned().unwrap_or(Scheme::HTTP));
            parts.authority = Some(authority.clone());
            parts.path_and_query = Some(PathAndQuery::from_static("/"));
            Uri::from_parts(parts).ok()
        });
        Upstream {
            origin,
            base: upstream.path().trim_end_matches('/').to_owned(),
            host: host_of(upstream),
        }
    }

    /// Where a request for `uri` goes on the upstream's connection, in
    /// origin form (RFC 9112 section 3.2.1): the upstream's path prefix,
    /// then the request's path and query.
    fn target(&self, uri: &Uri) -> Option<Uri> {
        self.origin.as_ref()?;
        let path_and_query = match (self.base.is_empty(), uri.path_and_query()) {
            // No prefix: the request's own, already parsed.
            (true, Some(p)) => p.clone(),
            (_, rest) => {
                let rest = rest.map_or("/", PathAndQuery::as_str);
                let mut joined = String::with_capacity(self.base.len() + rest.len());
                joined.push_str(&self.base);
                joined.push_str(rest);
                PathAndQuery::try_from(joined).ok()?
            }
        };
        Some(Uri::from(path_and_query))
    }
}

/// `value` as an RFC 7230 quoted-string, or `None` if it holds a byte a
/// quoted-string cannot (controls other than tab).
fn quoted(value: &str) -> Option<String> {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() && c != '\t' => return None,
            c => out.push(c),
        }
    }
    out.push('"');
    Some(out)
}

/// Sets the gateway's forwarding headers for a request from `peer` whose
/// `Host` was `host`. A client's own are dropped first unless trusted,
/// also for a request whose peer is unknown (the front service always
/// names it), which then gets none of the gateway's.
fn set_forwarding(
    headers: &mut HeaderMap,
    peer: Option<&Peer>,
    host: Option<&str>,
    proto: &'static str,
    trust: bool,
) {
    if !trust {
        for name in &FORWARDING {
            headers.remove(name);
        }
    }
    let Some(Peer(peer)) = peer else {
        return;
    };
    // Only a Host that is a plain host[:port] is passed on (an authority
    // may hold commas and other sub-delimiters; a forwarded host may not).
    let host = host.filter(|h| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
            && h.parse::<Authority>().is_ok()
    });
    // A trusted proxy's list, on as many lines as it sent (one list, as
    // RFC 9110 reads repeated lines), then this client, on one line.
    // Every byte of it is kept: a client behind that proxy could
    // otherwise put one byte that is not visible ASCII in its own part of
    // a line and have the proxy's record of its address dropped with it.
    // Blank lines name nobody. Untrusted, the client's lines were removed
    // above.
    let mut list = Vec::new();
    for prev in headers.get_all(&X_FORWARDED_FOR) {
        let prev = prev.as_bytes().trim_ascii();
        if !prev.is_empty() {
            list.extend_from_slice(prev);
            list.extend_from_slice(b", ");
        }
    }
    let xff = if list.is_empty() {
        Some(peer.address.clone())
    } else {
        list.extend_from_slice(peer.address.as_bytes());
        HeaderValue::try_from(list).ok()
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !trust || !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if let Some(h) = host
        && (!trust || !headers.contains_key(&X_FORWARDED_HOST))
        && let Ok(v) = HeaderValue::from_str(h)
    {
        headers.insert(X_FORWARDED_HOST, v);
    }
    let quoted_host = host.and_then(quoted);
    let mut element = String::with_capacity(
        "for=;proto=;host=".len()
            + peer.node.len()
            + proto.len()
            + quoted_host.as_ref().map_or(0, String::len),
    );
    element.push_str("for=");
    element.push_str(&peer.node);
    element.push_str(";proto=");
    element.push_str(proto);
    if let Some(h) = quoted_host {
        element.push_str(";host=");
        element.push_str(&h);
    }
    if let Ok(v) = HeaderValue::try_from(element) {
        headers.append(header::FORWARDED, v);
    }
}

/// A keyed answer's body under the gateway's clocks. Its first part, the
/// one the layer reads whole (up to the replay limit), must arrive by the
/// request's deadline; after it, and for an answer the layer never stores
/// (one that ends with its connection), the body may take as long as it
/// needs, so long as the upstream is never silent for
/// the idle timeout (counted from when a read finds nothing to take, so a
/// client that reads slowly costs the upstream nothing). No timer exists
/// until a read has to wait.
struct Deadline {
    inner: Body,
    /// The whole-answer deadline of the first part.
    deadline: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    /// Data bytes still to come before the first part is over.
    left_until_past_limit: usize,
    idle: Duration,
    /// Past the first part, and the idle timer runs for the present wait.
    waiting: bool,
}

impl Deadline {
    /// A keyed answer's body: its first `limit` bytes (and one more) by
    /// `deadline`, the rest under the idle timeout.
    fn whole_until(inner: Body, deadline: Instant, limit: usize, idle: Duration) -> Deadline {
        Deadline {
            inner,
            deadline,
            sleep: None,
            left_until_past_limit: limit.saturating_add(1),
            idle,
            waiting: false,
        }
    }

    /// A body under the idle timeout alone.
    fn idle(inner: Body, idle: Duration) -> Deadline {
        Deadline {
            inner,
            deadline: Instant::now(),
            sleep: None,
            left_until_past_limit: 0,
            idle,
            waiting: false,
        }
    }

    fn streaming(&self) -> bool {
        self.left_until_past_limit == 0
    }

    /// The timer for a read that found nothing: the first part's deadline,
    /// or the idle timeout from the start of this wait.
    fn arm(&mut self) -> Pin<&mut Sleep> {
        let until = if self.streaming() {
            if self.waiting {
                None
            } else {
                self.waiting = true;
                Some(Instant::now() + self.idle)
            }
        } else {
            Some(self.deadline).filter(|_| self.sleep.is_none())
        };
        match (&mut self.sleep, until) {
            (Some(sleep), Some(until)) => sleep.as_mut().reset(until),
            (None, until) => {
                let until = until.unwrap_or(self.deadline);
                self.sleep = Some(Box::pin(tokio::time::sleep_until(until)));
            }
            (Some(_), None) => {}
        }
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut(),
            None => unreachable!("armed just above"),
        }
    }
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            let len = frame.data_ref().map_or(0, Bytes::len);
            self.left_until_past_limit = self.left_until_past_limit.saturating_sub(len);
            self.waiting = false;
            return polled;
        }
        if polled.is_pending() && self.arm().poll(cx).is_ready() {
            let why = if self.streaming() {
                "upstream response body was silent for the body timeout"
            } else {
                "upstream response body passed its deadline"
            };
            return Poll::Ready(Some(Err(why.into())));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Marks a gateway answer whose upstream outcome is unknown.
fn unknown(mut response: Response<Body>) -> Response<Body> {
    response.extensions_mut().insert(OutcomeUnknown);
    response
}

/// Headers that belong to one connection and are never forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers and those `Connection` names, except the
/// `protected` ones.
fn strip_hop_by_hop(headers: &mut HeaderMap, protected: &[HeaderName]) {
    // Most requests and answers carry none (those with `Connection`,
    // even `keep-alive` alone, take the long way): one pass over their
    // names instead of a removal each.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        // Hop-by-hop names go below in any case.
        .filter(|n| {
            !HOP_BY_HOP
                .iter()
                .any(|h| n.eq_ignore_ascii_case(h.as_str()))
        })
        .filter_map(|n| HeaderName::try_from(n).ok())
        .filter(|n| !protected.contains(n))
        .collect();
    for name in HOP_BY_HOP.iter().chain(listed.iter()) {
        headers.remove(name);
    }
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

/// What the upstream gets of the headers of a request from `peer`: no
/// hop-by-hop headers (but the `protected` ones), the gateway's
/// forwarding headers, and the upstream's own `Host` (the client's is
/// forwarded), last. The client's Host is removed last: removing a header
/// moves the last one into its place, so the order the upstream sees is
/// what it always was.
fn rewrite_headers(
    headers: &mut HeaderMap,
    peer: Option<&Peer>,
    upstream_host: Option<&HeaderValue>,
    protected: &[HeaderName],
    proto: &'static str,
    trust: bool,
) {
    let original_host = headers.get(header::HOST).cloned();
    strip_hop_by_hop(headers, protected);
    // The gateway answered the client's `100-continue` itself (hyper does,
    // as the body is read) and sends the body at once.
    headers.remove(header::EXPECT);
    set_forwarding(
        headers,
        peer,
        original_host.as_ref().and_then(|h| h.to_str().ok()),
        proto,
        trust,
    );
    headers.remove(header::HOST);
    if let Some(host) = upstream_host {
        headers.insert(header::HOST, host.clone());
    }
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
        rewrite_headers(
            &mut parts.headers,
            parts.extensions.get::<Peer>(),
            self.upstream.host.as_ref(),
            &self.protected,
            self.client_proto,
            self.trust_forwarded,
        );
        parts.uri = target;
        let request = Request::from_parts(parts, body);
        let deadline = Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, self.pool.send(request, deadline)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
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
                let unverified_end = ends_at_close(&parts.headers)
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
                    // timer per answer cost 2-4 us of about 20 (BENCHMARKS.md,
                    // issue 34). The pool's answer is boxed already.
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

/// Whether an answer with these headers ends when the upstream closes
/// the connection (RFC 9112 section 6.3): a transfer coding other than a
/// final `chunked`, or neither a coding nor a length. A cut there reads
/// the same as the end.
fn ends_at_close(headers: &HeaderMap) -> bool {
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter().peekable();
    if codings.peek().is_none() {
        return !headers.contains_key(header::CONTENT_LENGTH);
    }
    let last = codings
        .last()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .map(str::trim);
    !last.is_some_and(|c| c.eq_ignore_ascii_case("chunked"))
}

/// The transfer codings a message's `Transfer-Encoding` lines list, in
/// order, each trimmed; empty list elements left out (RFC 9110 section
/// 5.6.1).
pub(crate) fn transfer_codings(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
}

/// A transfer coding of an answer other than `chunked` (which hyper
/// decodes) and `identity` (which codes nothing), if it has one.
fn unknown_coding(headers: &HeaderMap) -> Option<String> {
    transfer_codings(headers)
        .find(|c| !c.eq_ignore_ascii_case(b"chunked") && !c.eq_ignore_ascii_case(b"identity"))
        .map(|c| String::from_utf8_lossy(c).into_owned())
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

#[cfg(test)]
mod tests {
    use super::{
        FORWARDING, HOP_BY_HOP, Peer, Upstream, rewrite_headers, set_forwarding, strip_hop_by_hop,
    };
    use http::header::{self, HeaderName};
    use http::{HeaderMap, HeaderValue, Uri};
    use proptest::prelude::*;
    use std::net::{IpAddr, SocketAddr};

    /// `--key-header` refuses every header this proxy strips or rewrites:
    /// a key there would not reach the upstream as the client sent it.
    #[test]
    fn the_key_header_is_never_one_the_proxy_strips_or_rewrites() {
        let hop_by_hop = HOP_BY_HOP;
        let stripped = hop_by_hop.iter().map(|h| h.as_str());
        for name in stripped
            .chain(FORWARDING.iter().map(HeaderName::as_str))
            .chain(["host"])
        {
            assert!(
                crate::config::key_header(Some(name.to_owned()), &[]).is_err(),
                "{name}"
            );
        }
    }

    // The oracles below are the forwarding code as it was before the
    // upstream's parts and the peer's text were prepared once (formatted
    // and parsed per request); what the upstream receives must not change.

    fn target_per_request(upstream: &Uri, uri: &Uri) -> Option<Uri> {
        let base = upstream.path().trim_end_matches('/');
        let rest = uri.path_and_query().map_or("/", |p| p.as_str());
        Uri::builder()
            .scheme(upstream.scheme_str().unwrap_or("http"))
            .authority(upstream.authority()?.as_str())
            .path_and_query(format!("{base}{rest}"))
            .build()
            .ok()
    }

    fn forwarding_per_request(
        headers: &mut HeaderMap,
        peer: Option<IpAddr>,
        host: Option<&str>,
        proto: &'static str,
        trust: bool,
    ) {
        if !trust {
            for name in [
                "forwarded",
                "x-forwarded-for",
                "x-forwarded-host",
                "x-forwarded-proto",
                "x-real-ip",
            ] {
                headers.remove(name);
            }
        }
        let Some(peer) = peer else {
            return;
        };
        let host = host.filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
                && h.parse::<http::uri::Authority>().is_ok()
        });
        // Not as it was: the code before kept only the first of a
        // trusted proxy's X-Forwarded-For lines, and only if it was
        // visible ASCII; every non-blank line is kept now, bytes as sent.
        let lines: Vec<&[u8]> = headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.as_bytes().trim_ascii())
            .filter(|v| !v.is_empty())
            .collect();
        let xff = if lines.is_empty() {
            peer.to_string().into_bytes()
        } else {
            [lines.join(&b", "[..]), format!(", {peer}").into_bytes()].concat()
        };
        if let Ok(v) = HeaderValue::from_bytes(&xff) {
            headers.insert("x-forwarded-for", v);
        }
        if !trust || !headers.contains_key("x-forwarded-proto") {
            headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
        }
        if let Some(h) = host
            && (!trust || !headers.contains_key("x-forwarded-host"))
            && let Ok(v) = HeaderValue::from_str(h)
        {
            headers.insert("x-forwarded-host", v);
        }
        let node = if peer.is_ipv6() {
            format!("\"[{peer}]\"")
        } else {
            peer.to_string()
        };
        let mut element = format!("for={node};proto={proto}");
        if let Some(h) = host.and_then(super::quoted) {
            element.push_str(";host=");
            element.push_str(&h);
        }
        if let Ok(v) = HeaderValue::from_str(&element) {
            headers.append(header::FORWARDED, v);
        }
    }

    fn strip_per_request(headers: &mut HeaderMap, protected: &[HeaderName]) {
        let listed: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|n| HeaderName::try_from(n.trim()).ok())
            .filter(|n| !protected.contains(n))
            .collect();
        for name in HOP_BY_HOP.iter().chain(listed.iter()) {
            headers.remove(name);
        }
    }

    /// Every (name, value) pair in order, values as bytes: equal maps
    /// print equal.
    fn pairs(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
        headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    /// The headers a generated request carries (values a header cannot
    /// hold left out), and the protected names: the key's and
    /// `Content-Type`, or none.
    fn request_headers(
        headers: &[(&'static str, &'static str)],
        protect: bool,
    ) -> (HeaderMap, Vec<HeaderName>) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            if let Ok(v) = HeaderValue::from_bytes(value.as_bytes()) {
                map.append(*name, v);
            }
        }
        let protected = if protect {
            vec![
                HeaderName::from_static("idempotency-key"),
                header::CONTENT_TYPE,
            ]
        } else {
            Vec::new()
        };
        (map, protected)
    }

    fn upstream_url() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["http", "https"]),
            prop::sample::select(vec!["up:8080", "10.0.0.1", "[::1]:9", "Svc.Local"]),
            prop::sample::select(vec!["", "/", "/api", "/api/", "/a/b//", "/%20x"]),
        )
            .prop_map(|(s, a, p)| format!("{s}://{a}{p}"))
    }

    /// A request target as hyper hands it over: origin form, absolute
    /// form (with or without a path), asterisk and authority form, with
    /// path and query bytes a `Uri` may or may not accept.
    fn request_target() -> impl Strategy<Value = String> {
        let path = "(/[-a-zA-Z0-9._~%!$&'()*+,;=:@{}|^`\"]{0,6}){0,4}/?";
        let query = prop::option::of("[-a-zA-Z0-9._~%!$&'()*+,;=:@/?{}|^#]{0,10}");
        let built = (
            path,
            query,
            prop::sample::select(vec!["", "http://client.example", "https://h:1", "HTTP://X"]),
        )
            .prop_map(|(p, q, abs)| {
                let p = if p.is_empty() && abs.is_empty() {
                    "/".to_owned()
                } else {
                    p
                };
                match q {
                    Some(q) => format!("{abs}{p}?{q}"),
                    None => format!("{abs}{p}"),
                }
            });
        prop_oneof![
            4 => built,
            1 => prop::sample::select(vec![
                "*", "h:1", "client.example:443", "/a#frag", "/?", "/a?b#c", "http://h",
            ]).prop_map(str::to_owned),
        ]
    }

    proptest! {
        #[test]
        fn the_target_is_what_formatting_it_per_request_gave(
            upstream in upstream_url(),
            target in request_target(),
        ) {
            let upstream: Uri = upstream.parse().unwrap();
            let Ok(uri) = target.parse::<Uri>() else {
                return Ok(());
            };
            // The old client wrote the absolute target in origin form
            // on the wire: its path and query, as a URI of those alone
            // displays them (hyper writes the request line with
            // `Display`, which shows an empty path as `/`).
            let now = Upstream::new(&upstream).target(&uri);
            let before = target_per_request(&upstream, &uri)
                .and_then(|b| b.path_and_query().cloned());
            prop_assert_eq!(
                now.as_ref().and_then(Uri::path_and_query).map(|p| p.as_str().to_owned()),
                before.as_ref().map(|p| p.as_str().to_owned())
            );
            prop_assert_eq!(
                now.as_ref().map(ToString::to_string),
                before.map(|p| Uri::from(p).to_string())
            );
            prop_assert!(now.is_none_or(|t| t.scheme().is_none() && t.authority().is_none()));
        }

        /// The whole rewrite, header order included: Host, the
        /// hop-by-hop headers, the forwarding headers, then Host gone.
        #[test]
        fn request_headers_are_rewritten_as_formatting_them_per_request_did(
            peer in prop::option::of(prop::sample::select(vec![
                "127.0.0.1:5000", "10.1.2.3:1", "[::1]:80", "[2001:db8::7]:443",
                "[::ffff:10.0.0.1]:9", "0.0.0.0:0",
            ])),
            proto in prop::sample::select(vec!["http", "https"]),
            trust in any::<bool>(),
            protect in any::<bool>(),
            headers in prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "host", "connection", "keep-alive", "te", "upgrade",
                        "x-forwarded-for", "forwarded", "x-forwarded-host",
                        "x-forwarded-proto", "x-real-ip", "idempotency-key",
                        "content-type", "x-private", "user-agent",
                    ]),
                    prop::sample::select(vec![
                        "api.example:8443", "h", "[::1]:80", "a,b", "x\"y", "h h", "",
                        "10.9.9.9", "1.1.1.1, 2.2.2.2", "a\tb", "caf\u{e9}",
                        "host", "x-forwarded-for", "TE", "Transfer-Encoding\t,x-private",
                        "keep-alive", "close, Upgrade", "idempotency-key, content-type",
                        "for=1.2.3.4", "https",
                    ]),
                ),
                0..10,
            ),
        ) {
            let peer: Option<SocketAddr> = peer.map(|p| p.parse().unwrap());
            let (mut map, protected) = request_headers(&headers, protect);
            let mut before = map.clone();
            let upstream_host = HeaderValue::from_static("up:8080");
            rewrite_headers(
                &mut map,
                peer.map(Peer::new).as_ref(),
                Some(&upstream_host),
                &protected,
                proto,
                trust,
            );
            let host = before
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned);
            strip_per_request(&mut before, &protected);
            forwarding_per_request(
                &mut before,
                peer.map(|p| p.ip()),
                host.as_deref(),
                proto,
                trust,
            );
            before.remove(header::HOST);
            // What hyper-util's client then added, a request having none.
            before.entry(header::HOST).or_insert(upstream_host);
            prop_assert_eq!(pairs(&map), pairs(&before));
        }

        #[test]
        fn hop_by_hop_stripping_is_what_it_was(
            headers in prop::collection::vec(
                (prop::sample::select(vec![
                    "connection", "keep-alive", "te", "trailer", "transfer-encoding",
                    "upgrade", "proxy-authorization", "x-private", "close", "content-type",
                    "idempotency-key", "x-other",
                ]), prop::sample::select(vec![
                    "keep-alive", "close", "x-private", "Keep-Alive, X-Private",
                    " upgrade ,te", "idempotency-key", "content-type, x-other", "",
                    ",,", "bad name", "caf\u{e9}",
                ])),
                0..8,
            ),
            protect in any::<bool>(),
        ) {
            let (mut map, protected) = request_headers(&headers, protect);
            let mut before = map.clone();
            strip_hop_by_hop(&mut map, &protected);
            strip_per_request(&mut before, &protected);
            prop_assert_eq!(pairs(&map), pairs(&before));
        }
    }

    /// hyper-util 0.1.21's `set_host` with its `get_non_default_port`,
    /// as it wrote Host from every request's URI: the oracle of
    /// [`super::host_of`].
    fn host_per_request(uri: &Uri) -> Option<String> {
        let hostname = uri.host()?;
        let secure = uri
            .scheme_str()
            .map(|s| matches!(s, "wss" | "https"))
            .unwrap_or_default();
        let port = match (uri.port().map(|p| p.as_u16()), secure) {
            (Some(443), true) | (Some(80), false) => None,
            _ => uri.port(),
        };
        Some(match port {
            Some(port) => format!("{hostname}:{port}"),
            None => hostname.to_owned(),
        })
    }

    proptest! {
        #[test]
        fn the_upstream_host_is_what_the_client_library_wrote(
            scheme in prop::sample::select(vec!["http", "https", "HTTP", "HttpS"]),
            host in prop::sample::select(vec![
                "up", "Up.Example", "10.0.0.1", "[::1]", "[2001:DB8::7]", "a-b.c_d",
            ]),
            port in prop::option::of(prop::sample::select(vec![
                "80", "443", "8080", "08080", "0", "65535", "",
            ])),
            path in prop::sample::select(vec!["", "/", "/api/"]),
        ) {
            let url = match port {
                Some(p) => format!("{scheme}://{host}:{p}{path}"),
                None => format!("{scheme}://{host}{path}"),
            };
            let Ok(uri) = url.parse::<Uri>() else {
                return Ok(());
            };
            let now = Upstream::new(&uri).host;
            prop_assert_eq!(
                now.as_ref().map(|h| h.as_bytes().to_vec()),
                host_per_request(&uri).map(String::into_bytes),
                "{}", url
            );
        }
    }

    /// The Host the upstream gets is what hyper-util's client wrote from
    /// the request's URI (`set_host`): the port unless the scheme's default.
    #[test]
    fn the_upstream_host_is_the_client_librarys() {
        for (url, host) in [
            ("http://up:8080/api", "up:8080"),
            ("http://up:80", "up"),
            ("http://up", "up"),
            ("http://up:443", "up:443"),
            ("https://up:443/", "up"),
            ("https://up:80", "up:80"),
            ("https://up", "up"),
            ("http://[::1]:9", "[::1]:9"),
            ("http://[::1]:80", "[::1]"),
            ("http://Up.Example:08080", "Up.Example:8080"),
        ] {
            let upstream = Upstream::new(&url.parse().unwrap());
            assert_eq!(
                upstream.host.as_ref().map(HeaderValue::as_bytes),
                Some(host.as_bytes()),
                "{url}"
            );
        }
    }

    #[test]
    fn an_upstream_without_an_authority_has_no_target() {
        let upstream = Uri::from_static("/only/a/path");
        let uri = Uri::from_static("/x");
        assert!(Upstream::new(&upstream).target(&uri).is_none());
        assert!(target_per_request(&upstream, &uri).is_none());
    }

    #[test]
    fn the_peer_is_written_as_each_header_names_it() {
        let mut headers = HeaderMap::new();
        let peer = Peer::new("[2001:db8::7]:443".parse().unwrap());
        set_forwarding(&mut headers, Some(&peer), Some("api:1"), "https", false);
        assert_eq!(headers["x-forwarded-for"], "2001:db8::7");
        assert_eq!(
            headers[header::FORWARDED],
            "for=\"[2001:db8::7]\";proto=https;host=\"api:1\""
        );
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.9"));
        let peer = Peer::new("127.0.0.1:9".parse().unwrap());
        set_forwarding(&mut headers, Some(&peer), None, "http", true);
        assert_eq!(headers["x-forwarded-for"], "10.0.0.9, 127.0.0.1");
        assert_eq!(headers[header::FORWARDED], "for=127.0.0.1;proto=http");
    }

    /// A trusted proxy that sends its list on several lines loses none of
    /// them (the first alone used to be kept, and only if it was visible
    /// ASCII), blank lines aside; an untrusted client's lines are all
    /// dropped.
    #[test]
    fn every_x_forwarded_for_line_of_a_trusted_proxy_is_kept() {
        let peer = Peer::new("127.0.0.1:9".parse().unwrap());
        let client_lines = || {
            let mut headers = HeaderMap::new();
            for line in ["10.0.0.1, 10.0.0.2", " ", "10.0.0.3", "caf\u{e9}, 10.0.0.4"] {
                headers.append(
                    "x-forwarded-for",
                    HeaderValue::from_bytes(line.as_bytes()).unwrap(),
                );
            }
            headers
        };
        let mut trusted = client_lines();
        set_forwarding(&mut trusted, Some(&peer), None, "http", true);
        let lines: Vec<_> = trusted.get_all("x-forwarded-for").iter().collect();
        assert_eq!(
            lines,
            ["10.0.0.1, 10.0.0.2, 10.0.0.3, caf\u{e9}, 10.0.0.4, 127.0.0.1".as_bytes()]
        );
        let mut untrusted = client_lines();
        set_forwarding(&mut untrusted, Some(&peer), None, "http", false);
        let lines: Vec<_> = untrusted.get_all("x-forwarded-for").iter().collect();
        assert_eq!(lines, ["127.0.0.1"]);
    }
}
