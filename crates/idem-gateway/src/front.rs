//! The gateway's own front service: the checks of what an upstream could
//! read otherwise than the layer does (ambiguous paths, a method that
//! differs from a standard one only in case, transfer codings other than
//! `chunked`, expectations other than `100-continue`), the read path at
//! `/_idem/records/{key}`, and everything else through the idempotency
//! layer to the upstream.
//!
//! Written by hand rather than with axum's `Router`: the gateway has one
//! route and a fallback, and the router's per-request work (matching,
//! boxing the request and response bodies again, cloning boxed services
//! for the middleware) was a measurable share of a passthrough request
//! (docs/benchmarks-history.md, "The gateway against an nginx proxy hop").

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body::Body as HttpBody;
use idem_http::{Body, BoxError, Idempotency, Problem, ReadPath, ResponseFuture};
use tower::Service;

use crate::proxy::{Peer, Proxy, transfer_codings};

/// Where the read path is mounted: `/_idem/records/{key}`, one segment.
const READ_PATH: &str = "/_idem/records/";

/// What every connection's front service shares: the protected upstream
/// and the read path. [`Front::for_peer`] makes one connection's service.
#[derive(Clone)]
pub(crate) struct Front {
    proxied: Idempotency<Proxy>,
    read_path: ReadPath,
    /// The methods the route rules name besides the standard ones
    /// (`PURGE`): a case variant of one is refused as of a standard one.
    rule_methods: Arc<[Method]>,
}

impl Front {
    pub(crate) fn new(
        proxied: Idempotency<Proxy>,
        read_path: ReadPath,
        rule_methods: Arc<[Method]>,
    ) -> Front {
        Front {
            proxied,
            read_path,
            rule_methods,
        }
    }

    /// The front service of a connection from `peer`.
    pub(crate) fn for_peer(&self, peer: SocketAddr) -> ConnectionService {
        ConnectionService {
            front: self.clone(),
            peer: Peer::new(peer),
        }
    }
}

/// The front service of one client connection. Its peer is always known:
/// the proxy's forwarding headers are written from it (and a client's own
/// are dropped), so there is no way to build one without it.
#[derive(Clone)]
pub(crate) struct ConnectionService {
    front: Front,
    peer: Peer,
}

type ReadFuture = <ReadPath as Service<Request<()>>>::Future;

/// Where a path stands with the read path: every path under its prefix
/// is the gateway's, never the upstream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadPathMatch {
    /// Not under the prefix.
    Elsewhere,
    /// The prefix and one non-empty segment: the key, percent-encoded
    /// where it holds `/` (and whatever else it likes).
    Key,
    /// Under the prefix, but not one segment: a key's raw `/`, or none.
    Malformed,
}

fn read_path_match(path: &str) -> ReadPathMatch {
    match path.strip_prefix(READ_PATH) {
        None => ReadPathMatch::Elsewhere,
        Some(key) if !key.is_empty() && !key.contains('/') => ReadPathMatch::Key,
        Some(_) => ReadPathMatch::Malformed,
    }
}

impl<B> Service<Request<B>> for ConnectionService
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
        let path = req.uri().path();
        let matched = read_path_match(path);
        let refused = match matched {
            ReadPathMatch::Key => None,
            ReadPathMatch::Malformed => Some(problem(
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid key",
                "The read path takes the key as one path segment: percent-encode a '/' in it as %2F.",
            )),
            ReadPathMatch::Elsewhere => ambiguous_path(path).map(|why| {
                problem(
                    StatusCode::BAD_REQUEST,
                    "invalid-path",
                    "Invalid path",
                    &format!("The path {why}; send the plain, resolved path."),
                )
            }),
        };
        let rule_methods = &self.front.rule_methods;
        let unreadable = || unreadable_request(req.method(), req.headers(), rule_methods);
        if let Some(refused) = refused.or_else(unreadable) {
            // A gRPC client reads a gRPC status, as the layer answers it.
            let answer = if idem_http::grpc::is_grpc(req.headers()) {
                idem_http::grpc::problem_as_grpc(&refused, HeaderMap::new())
            } else {
                refused.into_response()
            };
            return Either::Left(ready(Ok(answer)));
        }
        req.extensions_mut().insert(self.peer.clone());
        // The layer alone says that a request takes a key over (the
        // `announce` policy); a client's own `Idem-Takeover` never reaches
        // the upstream, keyed route or not.
        req.headers_mut().remove(idem_http::IDEM_TAKEOVER);
        if matched == ReadPathMatch::Key {
            return Either::Right(Either::Left(self.front.read_path.call(req)));
        }
        Either::Right(Either::Right(self.front.proxied.call(req)))
    }
}

fn problem(status: StatusCode, kind: &str, title: &'static str, detail: &str) -> Problem {
    Problem::idem(status, kind, title, detail)
}

/// The methods RFC 9110 defines (and PATCH, RFC 5789).
const STANDARD_METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// The answer for a request the upstream could read otherwise than the
/// layer does, if it is one:
/// - a method that differs only in case from a standard one (`post`) or
///   from one a route rule names (`purge` for `PURGE`): methods are
///   case-sensitive, so the layer names its records apart and applies no
///   rule of the other's to it, while an upstream that reads methods
///   without regard to case would execute it as the other (400);
/// - a transfer coding other than a lone `chunked` (`gzip, chunked`):
///   hyper decodes the chunks alone, and the upstream would get coded
///   bytes with no header naming the coding (501, RFC 9112 section 6.1);
/// - an expectation other than `100-continue`, which the gateway cannot
///   meet (417, RFC 9110 section 10.1.1). `100-continue` itself is met by
///   the gateway, which then sends the body on at once without it.
fn unreadable_request(
    method: &Method,
    headers: &HeaderMap,
    rule_methods: &[Method],
) -> Option<Problem> {
    let sent = method.as_str();
    if let Some(standard) = STANDARD_METHODS
        .iter()
        .chain(rule_methods)
        .find(|m| m.as_str() != sent && m.as_str().eq_ignore_ascii_case(sent))
    {
        return Some(problem(
            StatusCode::BAD_REQUEST,
            "invalid-method",
            "Invalid method",
            &format!("Methods are case-sensitive: '{sent}' is not {standard}. Send {standard}."),
        ));
    }
    let mut codings = transfer_codings(headers);
    let first = codings.next();
    let only_chunked =
        first.is_none_or(|c| c.eq_ignore_ascii_case(b"chunked")) && codings.next().is_none();
    if !only_chunked {
        return Some(problem(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported-transfer-coding",
            "Transfer coding not supported",
            "The gateway takes request bodies framed by Content-Length or by chunked alone; send the body without other transfer codings (a Content-Encoding is passed on).",
        ));
    }
    let unmet = headers.get_all(header::EXPECT).iter().any(|v| {
        !v.as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"100-continue")
    });
    if unmet {
        return Some(problem(
            StatusCode::EXPECTATION_FAILED,
            "expectation-failed",
            "Expectation failed",
            "The gateway meets no expectation but 100-continue.",
        ));
    }
    None
}

/// Why a request path is refused, if it is: paths that an upstream might
/// resolve to another resource than the one the route rules and the
/// fingerprint saw: `.` and `..` segments (also `..;x`, as Tomcat reads
/// it), backslashes, and percent-encodings of unreserved characters, `/`,
/// `\` or malformed ones (RFC 3986 section 6.2.2 lets a server decode
/// `%61` to `a`). [`ConnectionService`] answers them with 400.
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
    use super::{ReadPathMatch, ambiguous_path, read_path_match, unreadable_request};
    use http::{HeaderMap, Method};

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

    /// The paths axum's `/_idem/records/{key}` matched are the read
    /// path's; every other path under its prefix is refused, never sent
    /// to the upstream (a key's raw `/` would have split it there).
    #[test]
    fn the_read_path_owns_its_prefix() {
        for p in [
            "/_idem/records/k",
            "/_idem/records/key-0001%20x",
            "/_idem/records/ab%2Fcd%2B%3D%3D",
        ] {
            assert_eq!(read_path_match(p), ReadPathMatch::Key, "{p}");
        }
        for p in [
            "/_idem/records/",
            "/_idem/records/a/b",
            "/_idem/records/a/",
            "/_idem/records//",
        ] {
            assert_eq!(read_path_match(p), ReadPathMatch::Malformed, "{p}");
        }
        for p in [
            "/_idem/records",
            "/_idem/recordsx/a",
            "/x/_idem/records/a",
            "",
        ] {
            assert_eq!(read_path_match(p), ReadPathMatch::Elsewhere, "{p}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    #[test]
    fn requests_an_upstream_could_read_otherwise_are_refused() {
        let method = |m: &str| Method::from_bytes(m.as_bytes()).unwrap();
        let rules = [method("PURGE")];
        let status = |m: &str, h: &[(&str, &str)]| {
            unreadable_request(&method(m), &headers(h), &rules).map(|p| p.status().as_u16())
        };
        for m in [
            "post", "Post", "pOST", "get", "patch", "Delete", "connect", "purge", "Purge",
        ] {
            assert_eq!(status(m, &[]), Some(400), "{m}");
        }
        for m in [
            "POST", "GET", "PATCH", "PURGE", "report", "REPORT", "posting",
        ] {
            assert_eq!(status(m, &[]), None, "{m}");
        }
        for te in [
            "gzip, chunked",
            "gzip,chunked",
            "identity",
            "chunked, chunked",
            "x",
        ] {
            assert_eq!(
                status("POST", &[("transfer-encoding", te)]),
                Some(501),
                "{te}"
            );
        }
        assert_eq!(
            status(
                "POST",
                &[
                    ("transfer-encoding", "gzip"),
                    ("transfer-encoding", "chunked")
                ]
            ),
            Some(501)
        );
        for te in ["chunked", "Chunked", " chunked "] {
            assert_eq!(status("POST", &[("transfer-encoding", te)]), None, "{te}");
        }
        assert_eq!(status("POST", &[("expect", "100-continue")]), None);
        assert_eq!(status("POST", &[("expect", "100-Continue ")]), None);
        assert_eq!(status("POST", &[("expect", "200-ok")]), Some(417));
        assert_eq!(
            status("POST", &[("expect", "100-continue"), ("expect", "x")]),
            Some(417)
        );
    }
}
