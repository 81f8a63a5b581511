//! gRPC calls through the layer. A gRPC call is an HTTP/2 POST whose
//! media type is `application/grpc` (or `application/grpc+proto`, ...):
//! the key comes from the key header as metadata, the fingerprint covers
//! the method path and the framed message bytes as sent, and the answer
//! is stored with its trailers and replayed byte for byte. What differs
//! from plain HTTP is here:
//! - the status a gRPC answer settles its key by is its `grpc-status`,
//!   read from the trailers (or from the headers of a trailers-only
//!   answer) and mapped onto the HTTP status of the same meaning
//!   ([`http_status_of`]), which the route's policy then judges as for
//!   any answer: `UNAVAILABLE` (503) releases the key, `INVALID_ARGUMENT`
//!   (400) is kept and replayed;
//! - a compressed request message (the frame's compressed flag) is
//!   refused: the same message compressed again need not give the same
//!   bytes, so its fingerprint would not name the intent;
//! - idem's own refusals become trailers-only answers with a gRPC status
//!   ([`grpc_code_of`]), which every gRPC client reads; a problem+json
//!   body would reach a gRPC client as an unreadable message.
//!
//! Not here: anything of protobuf or of the call's shape (unary or
//! streaming): the layer sees framed bytes.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;

use crate::body::{Body, full};
use crate::problem::{PROBLEM_JSON, Problem};

/// A gRPC answer's status code (a trailer, or a header of a
/// trailers-only answer).
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// A gRPC answer's status message, percent-encoded.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// A gRPC answer's status details (a `google.rpc.Status`, base64).
pub const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");
/// The compression of a gRPC message.
pub const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// A gRPC call's deadline, as its client sets it; not passed on for a
/// keyed call, which runs to its end.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// The retry hint of gRPC's retry design (gRFC A6): milliseconds.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Fields stored with every answer, as header or trailer, besides the
/// route's: what a gRPC client needs to read a replayed answer.
pub const GRPC_STORED_FIELDS: [HeaderName; 4] = [
    GRPC_STATUS,
    GRPC_MESSAGE,
    GRPC_STATUS_DETAILS,
    GRPC_ENCODING,
];

/// gRPC's status codes, as the wire writes them.
pub mod code {
    /// Not an error.
    pub const OK: u32 = 0;
    /// The call was cancelled.
    pub const CANCELLED: u32 = 1;
    /// An error of no other kind.
    pub const UNKNOWN: u32 = 2;
    /// The client sent something invalid.
    pub const INVALID_ARGUMENT: u32 = 3;
    /// The deadline passed before the call finished.
    pub const DEADLINE_EXCEEDED: u32 = 4;
    /// Not found.
    pub const NOT_FOUND: u32 = 5;
    /// What the call would create exists.
    pub const ALREADY_EXISTS: u32 = 6;
    /// The caller may not do this.
    pub const PERMISSION_DENIED: u32 = 7;
    /// Out of a resource (a quota, a size).
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    /// The system is not in a state the call needs.
    pub const FAILED_PRECONDITION: u32 = 9;
    /// Aborted by a concurrency conflict; retry at a higher level.
    pub const ABORTED: u32 = 10;
    /// Past a valid range.
    pub const OUT_OF_RANGE: u32 = 11;
    /// Not implemented or not supported.
    pub const UNIMPLEMENTED: u32 = 12;
    /// An invariant broke.
    pub const INTERNAL: u32 = 13;
    /// Not available now; retrying may succeed.
    pub const UNAVAILABLE: u32 = 14;
    /// Data lost for good.
    pub const DATA_LOSS: u32 = 15;
    /// No valid credential.
    pub const UNAUTHENTICATED: u32 = 16;
}

/// Whether these request or answer headers are a gRPC call's: the media
/// type `application/grpc`, alone or with a `+` suffix.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let media = value.as_bytes().split(|b| *b == b';').next().unwrap_or(&[]);
    let media = media.trim_ascii();
    let base = b"application/grpc";
    media.len() >= base.len()
        && media[..base.len()].eq_ignore_ascii_case(base)
        && (media.len() == base.len() || media[base.len()] == b'+')
}

/// The HTTP status of the same meaning as a gRPC status code: the table
/// of `google.rpc.Code`, but `ALREADY_EXISTS` (400, kept). An unknown
/// code reads as `UNKNOWN` (500).
pub fn http_status_of(grpc_code: u32) -> u16 {
    match grpc_code {
        code::OK => 200,
        code::CANCELLED => 499,
        // ALREADY_EXISTS is a final answer: 400, which the policy keeps,
        // not google.rpc.Code's 409, which it releases (a 409 is mostly
        // "in flight").
        code::INVALID_ARGUMENT
        | code::FAILED_PRECONDITION
        | code::OUT_OF_RANGE
        | code::ALREADY_EXISTS => 400,
        code::DEADLINE_EXCEEDED => 504,
        code::NOT_FOUND => 404,
        code::ABORTED => 409,
        code::PERMISSION_DENIED => 403,
        code::UNAUTHENTICATED => 401,
        code::RESOURCE_EXHAUSTED => 429,
        code::UNIMPLEMENTED => 501,
        code::UNAVAILABLE => 503,
        _ => 500,
    }
}

/// The status an answer settles its key by: its HTTP status, or for a
/// gRPC answer with HTTP 200 its `grpc-status` (trailer first, then
/// header), mapped by [`http_status_of`]. `None` for a gRPC answer
/// without a readable status: something on its way (an HTTP/1.1 hop) may
/// have dropped its trailers, so whether the call succeeded is unknown.
pub(crate) fn settling_status(
    status: StatusCode,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
) -> Option<u16> {
    if status != StatusCode::OK || !is_grpc(headers) {
        return Some(status.as_u16());
    }
    trailers
        .and_then(|t| t.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map(http_status_of)
}

/// Whether a gRPC request body holds a compressed message: a frame whose
/// flag byte is not 0. Frames are read as written (a flag, a 4-byte
/// length, the message); a body whose framing breaks off is left to the
/// service, which refuses it.
pub(crate) fn has_compressed_message(body: &[u8]) -> bool {
    let mut rest = body;
    while let Some((&flag, after)) = rest.split_first() {
        if flag != 0 {
            return true;
        }
        let Some(len) = after.get(..4) else {
            return false;
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        match after.get(4..).and_then(|m| m.get(len..)) {
            Some(next) => rest = next,
            None => return false,
        }
    }
    false
}

/// The gRPC status for one of idem's own problems, by its kind (the end
/// of `urn:idem:problem:<kind>`), else by its HTTP status. The table is
/// docs/contract.md's, *gRPC*.
pub fn grpc_code_of(kind: &str, status: StatusCode) -> u32 {
    match kind {
        "missing-key" | "repeated-key" | "invalid-key" | "invalid-scope" | "unreadable-body"
        | "invalid-path" | "invalid-method" | "invalid-operation" | "expectation-failed" => {
            code::INVALID_ARGUMENT
        }
        "key-reused" => code::FAILED_PRECONDITION,
        "in-flight" => code::ABORTED,
        "store-unavailable" | "store-lost-records" | "shutting-down" | "upstream-unreachable" => {
            code::UNAVAILABLE
        }
        "body-too-large" => code::RESOURCE_EXHAUSTED,
        "body-timeout" | "upstream-timeout" => code::DEADLINE_EXCEEDED,
        "credential-required" => code::UNAUTHENTICATED,
        "record-not-found" => code::NOT_FOUND,
        "method-not-allowed" | "unsupported-transfer-coding" | "compressed-message" => {
            code::UNIMPLEMENTED
        }
        "handler-failed" | "layer-missing" | "bad-upstream-url" => code::INTERNAL,
        "outcome-unknown" | "outcome-unresolved" | "upstream-failed" | "response-not-stored" => {
            code::UNKNOWN
        }
        _ => match status.as_u16() {
            400 => code::INVALID_ARGUMENT,
            401 => code::UNAUTHENTICATED,
            403 => code::PERMISSION_DENIED,
            404 => code::NOT_FOUND,
            409 => code::ABORTED,
            413 | 429 => code::RESOURCE_EXHAUSTED,
            422 => code::FAILED_PRECONDITION,
            502 | 503 => code::UNAVAILABLE,
            504 => code::DEADLINE_EXCEEDED,
            _ => code::UNKNOWN,
        },
    }
}

/// `grpc-message` text: bytes outside printable ASCII, and `%`, as
/// `%XX` (the gRPC over HTTP/2 protocol).
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A trailers-only gRPC answer for `problem`: HTTP 200, no body, the
/// status and message as headers that end the stream, and the retry
/// hint (`Retry-After` in milliseconds) where the problem gave one. The
/// problem's other headers (`Idempotency-Key-Expires`, say) are kept.
pub fn problem_as_grpc(problem: &Problem, mut headers: HeaderMap) -> Response<Body> {
    let kind = problem
        .type_uri()
        .strip_prefix("urn:idem:problem:")
        .unwrap_or("");
    let grpc = grpc_code_of(kind, problem.status());
    let retry_after = headers
        .remove(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .or(problem.retry_after().map(|d| d.as_secs().max(1)));
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS, HeaderValue::from(grpc));
    let message = format!("{}: {}", problem.title(), problem.detail());
    if let Ok(v) = HeaderValue::from_str(&percent_encoded(&message)) {
        headers.insert(GRPC_MESSAGE, v);
    }
    if let Some(secs) = retry_after {
        let ms = Duration::from_secs(secs).as_millis();
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms as u64));
    }
    let mut response = Response::new(full(Bytes::new()));
    *response.headers_mut() = headers;
    response
}

/// The most of a problem+json body read to turn it into a gRPC status.
const PROBLEM_LIMIT: u64 = 64 * 1024;

/// `response` to a gRPC request, with idem's own refusal (a problem+json
/// answer of type `urn:idem:problem:*`, live or replayed) turned into a
/// trailers-only gRPC answer; any other answer as it is.
pub async fn refusal_as_grpc(response: Response<Body>) -> Response<Body> {
    let problem_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(PROBLEM_JSON.as_bytes()));
    let small = response
        .body()
        .size_hint()
        .upper()
        .is_some_and(|n| n <= PROBLEM_LIMIT);
    if !problem_json || !small {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return problem_as_grpc(
            &Problem::idem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "handler-failed",
                "Request failed",
                "The answer could not be read.",
            ),
            parts.headers,
        );
    };
    let bytes = collected.to_bytes();
    match Problem::from_json(parts.status, &bytes) {
        Some(problem) if problem.type_uri().starts_with("urn:idem:problem:") => {
            problem_as_grpc(&problem, parts.headers)
        }
        _ => Response::from_parts(parts, full(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_media_types_are_told_apart() {
        let h = |ct: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            is_grpc(&m)
        };
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+json",
            "application/grpc; charset=x",
        ] {
            assert!(h(yes), "{yes}");
        }
        for no in [
            "application/grpcx",
            "application/grpc-web",
            "application/json",
            "text/grpc",
            "",
        ] {
            assert!(!h(no), "{no}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn a_grpc_answer_settles_by_its_grpc_status() {
        let grpc = |extra: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            m.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            for (n, v) in extra {
                m.insert(*n, HeaderValue::from_static(v));
            }
            m
        };
        let trailers = |s: &'static str| grpc(&[("grpc-status", s)]);
        let ok = StatusCode::OK;
        let settle = |h: &HeaderMap, t: Option<&HeaderMap>| settling_status(ok, h, t);
        assert_eq!(settle(&grpc(&[]), Some(&trailers("0"))), Some(200));
        assert_eq!(settle(&grpc(&[]), Some(&trailers("14"))), Some(503));
        assert_eq!(settle(&grpc(&[]), Some(&trailers("3"))), Some(400));
        assert_eq!(settle(&grpc(&[]), Some(&trailers("10"))), Some(409));
        // Trailers-only: the status is a header. ALREADY_EXISTS is kept.
        assert_eq!(settle(&grpc(&[("grpc-status", "6")]), None), Some(400));
        // An unknown code is UNKNOWN.
        assert_eq!(settle(&grpc(&[]), Some(&trailers("99"))), Some(500));
        // No status, or one that does not parse: unknown.
        assert_eq!(settle(&grpc(&[]), None), None);
        assert_eq!(settle(&grpc(&[]), Some(&trailers("x"))), None);
        // Not gRPC, or not HTTP 200: the HTTP status.
        let mut plain = HeaderMap::new();
        plain.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        assert_eq!(settle(&plain, None), Some(200));
        assert_eq!(
            settling_status(StatusCode::BAD_GATEWAY, &grpc(&[]), Some(&trailers("0"))),
            Some(502)
        );
    }

    #[test]
    fn compressed_frames_are_found_in_any_position() {
        let frame = |flag: u8, msg: &[u8]| {
            let mut f = vec![flag];
            f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            f.extend_from_slice(msg);
            f
        };
        assert!(!has_compressed_message(&[]));
        assert!(!has_compressed_message(&frame(0, b"abc")));
        assert!(has_compressed_message(&frame(1, b"abc")));
        let mut two = frame(0, b"abc");
        two.extend(frame(1, b"d"));
        assert!(has_compressed_message(&two));
        // A length past the end: left to the service.
        assert!(!has_compressed_message(&[0, 0, 0, 0, 9, 1]));
        assert!(!has_compressed_message(&[0, 0]));
        // A huge length does not overflow.
        assert!(!has_compressed_message(&[0, 0xff, 0xff, 0xff, 0xff]));
    }

    #[tokio::test]
    async fn idem_refusals_become_trailers_only_answers() {
        let problem = Problem::idem(StatusCode::CONFLICT, "in-flight", "Busy", "100% later\n")
            .with_retry_after(Duration::from_secs(2));
        let mut response = problem.into_response();
        response
            .headers_mut()
            .insert("idempotency-key-expires", HeaderValue::from_static("x"));
        let grpc = refusal_as_grpc(response).await;
        assert_eq!(grpc.status(), StatusCode::OK);
        let h = grpc.headers();
        assert_eq!(h[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(h[GRPC_STATUS], "10");
        assert_eq!(h[GRPC_MESSAGE], "Busy: 100%25 later%0A");
        assert_eq!(h[GRPC_RETRY_PUSHBACK_MS], "2000");
        assert_eq!(h["idempotency-key-expires"], "x");
        assert!(h.get(header::RETRY_AFTER).is_none());
        assert!(grpc.body().is_end_stream());
        // Someone else's problem, or any other answer, passes as it is.
        let theirs = Problem::new(StatusCode::NOT_FOUND, "about:blank", "Nope", "x");
        let passed = refusal_as_grpc(theirs.into_response()).await;
        assert_eq!(passed.status(), StatusCode::NOT_FOUND);
        let body = passed.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"{"));
    }

    #[test]
    fn every_idem_problem_kind_has_a_deliberate_code() {
        use StatusCode as S;
        for (kind, status, want) in [
            ("invalid-key", S::BAD_REQUEST, code::INVALID_ARGUMENT),
            ("missing-key", S::BAD_REQUEST, code::INVALID_ARGUMENT),
            (
                "key-reused",
                S::UNPROCESSABLE_ENTITY,
                code::FAILED_PRECONDITION,
            ),
            ("in-flight", S::CONFLICT, code::ABORTED),
            (
                "store-unavailable",
                S::SERVICE_UNAVAILABLE,
                code::UNAVAILABLE,
            ),
            (
                "upstream-timeout",
                S::GATEWAY_TIMEOUT,
                code::DEADLINE_EXCEEDED,
            ),
            ("upstream-failed", S::BAD_GATEWAY, code::UNKNOWN),
            (
                "compressed-message",
                S::NOT_IMPLEMENTED,
                code::UNIMPLEMENTED,
            ),
            ("made-up", S::TOO_MANY_REQUESTS, code::RESOURCE_EXHAUSTED),
            ("made-up", S::IM_A_TEAPOT, code::UNKNOWN),
        ] {
            assert_eq!(grpc_code_of(kind, status), want, "{kind}");
        }
    }
}
