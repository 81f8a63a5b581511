//! The gateway's own front service: the ambiguous-path check, the read
//! path at `/_idem/records/{key}`, and everything else through the
//! idempotency layer to the upstream.
//!
//! Written by hand rather than with axum's `Router`: the gateway has one
//! route and a fallback, and the router's per-request work (matching,
//! boxing the request and response bodies again, cloning boxed services
//! for the middleware) was a measurable share of a passthrough request
//! (BENCHMARKS.md, "The gateway against an nginx proxy hop").

use std::convert::Infallible;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::{Request, Response, StatusCode};
use http_body::Body as HttpBody;
use idem_http::{Body, BoxError, Idempotency, ReadPath, ResponseFuture};
use tower::Service;

use super::proxy::{Peer, Proxy};

/// Where the read path is mounted: `/_idem/records/{key}`, one segment.
const READ_PATH: &str = "/_idem/records/";

/// What every connection's front service shares: the protected upstream
/// and the read path. [`Front::for_peer`] makes one connection's service.
#[derive(Clone)]
pub(crate) struct Front {
    proxied: Idempotency<Proxy>,
    read_path: ReadPath,
}

impl Front {
    pub(crate) fn new(proxied: Idempotency<Proxy>, read_path: ReadPath) -> Front {
        Front { proxied, read_path }
    }

    /// The front service of a connection from `peer`.
    pub(crate) fn for_peer(&self, peer: SocketAddr) -> Gateway {
        Gateway {
            front: self.clone(),
            peer: Peer::new(peer),
        }
    }
}

/// The front service of one client connection. Its peer is always known:
/// the proxy's forwarding headers are written from it (and a client's own
/// are dropped), so there is no way to build one without it.
#[derive(Clone)]
pub(crate) struct Gateway {
    front: Front,
    peer: Peer,
}

type ReadFuture = <ReadPath as Service<Request<()>>>::Future;

/// Whether `path` is the read path's: the prefix and one non-empty
/// segment, as axum's `{key}` matched it.
fn is_read_path(path: &str) -> bool {
    path.strip_prefix(READ_PATH)
        .is_some_and(|key| !key.is_empty() && !key.contains('/'))
}

impl<B> Service<Request<B>> for Gateway
where
    B: HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<
        Ready<Result<Response<Body>, Infallible>>,
        Either<ReadFuture, ResponseFuture<Infallible>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The read path is always ready; the protected upstream is asked
        // (a request that turns out to be the read path's, or refused,
        // leaves it ready and unused, which tower allows).
        <Idempotency<Proxy> as Service<Request<B>>>::poll_ready(&mut self.front.proxied, cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(why) = ambiguous_path(req.uri().path()) {
            let refused = idem_http::Problem::idem(
                StatusCode::BAD_REQUEST,
                "invalid-path",
                "Invalid path",
                format!("The path {why}; send the plain, resolved path."),
            )
            .into_response();
            return Either::Left(ready(Ok(refused)));
        }
        req.extensions_mut().insert(self.peer.clone());
        if is_read_path(req.uri().path()) {
            return Either::Right(Either::Left(self.front.read_path.call(req)));
        }
        Either::Right(Either::Right(self.front.proxied.call(req)))
    }
}

/// Why a request path is refused, if it is: paths that an upstream might
/// resolve to another resource than the one the route rules and the
/// fingerprint saw: `.` and `..` segments (also `..;x`, as Tomcat reads
/// it), backslashes, and percent-encodings of unreserved characters, `/`,
/// `\` or malformed ones (RFC 3986 section 6.2.2 lets a server decode
/// `%61` to `a`). [`Gateway`] answers them with 400.
fn ambiguous_path(path: &str) -> Option<&'static str> {
    if path.contains('\\') {
        return Some("has a backslash");
    }
    let bytes = path.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b != b'%' {
            continue;
        }
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        let Some(decoded) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) else {
            return Some("has a malformed percent-encoding");
        };
        if decoded.is_ascii_alphanumeric() || b"-._~/\\".contains(&decoded) {
            return Some(
                "percent-encodes a character that needs no encoding, a slash or a backslash",
            );
        }
    }
    let dots = path.split('/').any(|segment| {
        let bare = segment.split(';').next().unwrap_or(segment);
        bare == "." || bare == ".."
    });
    dots.then_some("has a '.' or '..' segment")
}

#[cfg(test)]
mod tests {
    use super::{ambiguous_path, is_read_path};

    #[test]
    fn paths_an_upstream_could_resolve_elsewhere_are_found() {
        for p in [
            "/a/../b",
            "/a/./b",
            "/..",
            "/a/%2e%2E/b",
            "/a/%2e",
            "/a/.%2e/",
            "/x/..;/accounts/7",
            "/x/..\\accounts/7",
            "/x/..%5caccounts/7",
            "/%61ccounts/7",
            "/accounts/7%2ftransfers",
            "/a%7e",
            "/a%",
            "/a%zz",
        ] {
            assert!(ambiguous_path(p).is_some(), "{p}");
        }
        for p in [
            "/a/b",
            "/a/.b",
            "/a/..b/",
            "/",
            "/a%20b",
            "/caf%C3%A9",
            "/q;v=1",
            "/a/b/",
        ] {
            assert_eq!(ambiguous_path(p), None, "{p}");
        }
    }

    /// The paths axum's `/_idem/records/{key}` matched, and no others
    /// (those go to the upstream, as they did).
    #[test]
    fn the_read_path_is_its_prefix_and_one_segment() {
        for p in ["/_idem/records/k", "/_idem/records/key-0001%20x"] {
            assert!(is_read_path(p), "{p}");
        }
        for p in [
            "/_idem/records/",
            "/_idem/records",
            "/_idem/records/a/b",
            "/_idem/records/a/",
            "/_idem/recordsx/a",
            "/x/_idem/records/a",
            "",
        ] {
            assert!(!is_read_path(p), "{p}");
        }
    }
}
