//! Forwarding to the upstream over a pooled hyper client.
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
//! exchange, response body included, runs under the upstream timeout, and
//! a failure after the request was sent is marked [`OutcomeUnknown`]: the
//! upstream may have committed, so the key stays held until its lease ends.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_http::{Body, BoxError, IdempotencyContext, OutcomeUnknown, boxed};
use std::future::Future as _;
use tokio::time::{Instant, Sleep};
use tower::Service;

/// Forwards requests to one upstream. Cheap to clone (the service is
/// cloned for every request).
#[derive(Clone)]
pub(crate) struct Proxy(Arc<Forwarder>);

struct Forwarder {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    upstream: Uri,
    /// `https` when the gateway's own listener speaks TLS, else `http`:
    /// what the forwarding headers say the client used.
    client_proto: &'static str,
    timeout: Duration,
    trust_forwarded: bool,
    /// End-to-end headers a client may not remove by naming them in
    /// `Connection`: the key (under `--key-header`'s name) and the scope
    /// the record was claimed under.
    protected: Arc<[HeaderName]>,
}

impl Proxy {
    /// A proxy to `upstream`; `tls` is how an `https://` upstream is
    /// checked (`None` for `http://`).
    pub(crate) fn new(
        upstream: Uri,
        tls: Option<rustls::ClientConfig>,
        client_tls: bool,
        timeout: Duration,
        trust_forwarded: bool,
        key_header: &HeaderName,
        scope_headers: &[HeaderName],
    ) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
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
        Proxy(Arc::new(Forwarder {
            client: Client::builder(TokioExecutor::new())
                // Without a timer the idle timeout is never checked, and a
                // quiet thread's idle connections would stay open.
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .build(connector),
            upstream,
            client_proto: if client_tls { "https" } else { "http" },
            timeout,
            trust_forwarded,
            protected: [
                key_header.clone(),
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::CONTENT_LENGTH,
                header::CONTENT_ENCODING,
            ]
            .into_iter()
            .chain(scope_headers.iter().cloned())
            .collect(),
        }))
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

/// Forwarding headers a client could forge.
const FORWARDING: [&str; 5] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
];

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
    peer: Option<std::net::IpAddr>,
    host: Option<&str>,
    proto: &'static str,
    trust: bool,
) {
    if !trust {
        for name in FORWARDING {
            headers.remove(name);
        }
    }
    let Some(peer) = peer else {
        return;
    };
    // Only a Host that is a plain host[:port] is passed on (an authority
    // may hold commas and other sub-delimiters; a forwarded host may not).
    let host = host.filter(|h| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
            && h.parse::<http::uri::Authority>().is_ok()
    });
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {peer}"),
        None => peer.to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
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
    if let Some(h) = host.and_then(quoted) {
        element.push_str(";host=");
        element.push_str(&h);
    }
    if let Ok(v) = HeaderValue::from_str(&element) {
        headers.append(header::FORWARDED, v);
    }
}

/// A response body that fails once `deadline` passes.
struct Deadline {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if self.sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(
                "upstream response body passed its deadline".into()
            )));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
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
    fn target(&self, uri: &Uri) -> Option<Uri> {
        let base = self.upstream.path().trim_end_matches('/');
        let rest = uri.path_and_query().map_or("/", |p| p.as_str());
        Uri::builder()
            .scheme(self.upstream.scheme_str().unwrap_or("http"))
            .authority(self.upstream.authority()?.as_str())
            .path_and_query(format!("{base}{rest}"))
            .build()
            .ok()
    }

    async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let Some(target) = self.target(&parts.uri) else {
            return problem(
                StatusCode::BAD_GATEWAY,
                "bad-upstream-url",
                "Bad upstream URL",
                "the request could not be mapped onto the upstream",
            );
        };
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        let keyed = parts.extensions.get::<IdempotencyContext>().is_some();
        let original_host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        strip_hop_by_hop(&mut parts.headers, &self.protected);
        set_forwarding(
            &mut parts.headers,
            peer,
            original_host.as_deref(),
            self.client_proto,
            self.trust_forwarded,
        );
        parts.headers.remove(header::HOST);
        parts.uri = target;
        let request = Request::from_parts(parts, body);
        let deadline = Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, self.client.request(request)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers, &[]);
                let body = if keyed {
                    // The layer reads a keyed answer whole before storing
                    // it: a stalled body must not outlive the lease.
                    boxed(Deadline {
                        inner: boxed(body),
                        sleep: Box::pin(tokio::time::sleep_until(deadline)),
                    })
                } else {
                    boxed(body)
                };
                Response::from_parts(parts, body)
            }
            Ok(Err(e)) if e.is_connect() => {
                tracing::warn!(error = %chain(&e), "upstream unreachable");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unreachable",
                    "Upstream unreachable",
                    "The service behind the gateway could not be reached; the request was not forwarded. Retry with the same key.",
                )
            }
            Ok(Err(e)) => {
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
    use super::{FORWARDING, HOP_BY_HOP};

    /// `--key-header` refuses every header this proxy strips or rewrites:
    /// a key there would not reach the upstream as the client sent it.
    #[test]
    fn the_key_header_is_never_one_the_proxy_strips_or_rewrites() {
        let hop_by_hop = HOP_BY_HOP;
        let stripped = hop_by_hop.iter().map(|h| h.as_str());
        for name in stripped.chain(FORWARDING).chain(["host"]) {
            assert!(
                crate::config::key_header(Some(name.to_owned()), &[]).is_err(),
                "{name}"
            );
        }
    }
}
