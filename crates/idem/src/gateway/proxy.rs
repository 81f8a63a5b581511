//! Forwarding to the upstream over a pooled hyper client.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use futures_util::future::BoxFuture;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_http::{Body, boxed, full};
use tower::Service;

/// Forwards requests to one upstream.
#[derive(Clone)]
pub(crate) struct Proxy {
    client: Client<HttpConnector, Body>,
    upstream: Uri,
    timeout: Duration,
}

impl Proxy {
    pub(crate) fn new(upstream: Uri, timeout: Duration) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
        Proxy {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .build(connector),
            upstream,
            timeout,
        }
    }
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

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(listed.iter()) {
        headers.remove(name);
    }
}

fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": format!("urn:idem:problem:{kind}"), "title": title, "status": status.as_u16(), "detail": detail,
    });
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

impl Proxy {
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

    async fn forward(self, req: Request<Body>) -> Response<Body> {
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
        let original_host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        strip_hop_by_hop(&mut parts.headers);
        if let Some(ip) = peer {
            let xff = match parts
                .headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
            {
                Some(prev) => format!("{prev}, {ip}"),
                None => ip.to_string(),
            };
            if let Ok(v) = HeaderValue::from_str(&xff) {
                parts.headers.insert("x-forwarded-for", v);
            }
            let node = if ip.is_ipv6() {
                format!("\"[{ip}]\"")
            } else {
                ip.to_string()
            };
            let mut fwd = format!("for={node};proto=http");
            if let Some(h) = &original_host {
                fwd.push_str(&format!(";host=\"{h}\""));
            }
            if let Ok(v) = HeaderValue::from_str(&fwd) {
                parts.headers.append(header::FORWARDED, v);
            }
        }
        parts.headers.remove(header::HOST);
        parts.uri = target;
        let request = Request::from_parts(parts, body);
        match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, boxed(body))
            }
            Ok(Err(e)) if e.is_connect() => {
                tracing::warn!(error = %e, "upstream unreachable");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unreachable",
                    "Upstream unreachable",
                    "The service behind the gateway could not be reached; the request was not forwarded. Retry with the same key.",
                )
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "upstream failed");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-failed",
                    "Upstream failed",
                    "The connection to the service behind the gateway failed; its result is unknown. Retry with the same key.",
                )
            }
            Err(_) => problem(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timed out",
                "The service behind the gateway did not answer in time; its result is unknown. Retry with the same key.",
            ),
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
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}
