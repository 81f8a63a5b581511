//! Turning handler responses into stored ones and back.

use std::cell::RefCell;

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use idem_core::{StoredResponse, Timestamp};

use crate::body::{Body, full_with_trailers};
use crate::grpc::GRPC_STORED_FIELDS;

/// `Idempotent-Replayed: true` marks a replayed response (Stripe's header).
pub const IDEMPOTENT_REPLAYED: HeaderName =
    HeaderName::from_static(idem_core::header_names::IDEMPOTENT_REPLAYED);

/// `Idempotency-Key-Expires: <HTTP-date>` on every response to a keyed
/// request: until then, a retry with the same key is answered from the
/// record; after it, the key is forgotten and a retry would execute again.
pub const IDEMPOTENCY_KEY_EXPIRES: HeaderName =
    HeaderName::from_static(idem_core::header_names::IDEMPOTENCY_KEY_EXPIRES);

/// Response headers stored for replay by default (docs/contract.md, *The HTTP contract*),
/// plus `Content-Encoding` and `Vary`: a compressed body replayed without
/// its encoding is bytes the client cannot read.
pub const DEFAULT_STORED_HEADERS: [HeaderName; 9] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::VARY,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::RETRY_AFTER,
];

/// Headers never stored, whatever a rule says.
fn never_stored(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "set-cookie"
            | "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    )
}

/// The part of a response kept for replay: its status, body, and the
/// headers and trailers on the allowlist (the defaults, gRPC's fields
/// and the route's `extra`).
pub(crate) fn to_stored(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    trailers: Option<&HeaderMap>,
    extra: &[HeaderName],
) -> StoredResponse {
    let keep = |name: &HeaderName| {
        !never_stored(name)
            && (DEFAULT_STORED_HEADERS.contains(name)
                || GRPC_STORED_FIELDS.contains(name)
                || extra.contains(name))
    };
    let kept = |fields: &HeaderMap| {
        fields
            .iter()
            .filter(|(n, _)| keep(n))
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect()
    };
    StoredResponse {
        status: status.as_u16(),
        headers: kept(headers),
        body: body.to_vec(),
        trailers: trailers.map(kept).unwrap_or_default(),
    }
}

/// Appends stored fields to `map`; fields that do not parse (they were
/// valid when stored, so only corruption does this) are skipped.
fn append_fields(map: &mut HeaderMap, fields: &[(String, Vec<u8>)]) {
    for (name, value) in fields {
        if let (Ok(n), Ok(v)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::from_bytes(value),
        ) {
            map.append(n, v);
        }
    }
}

/// Builds the HTTP response for a stored one. Headers that do not parse
/// (they were valid when stored, so only corruption does this) are skipped.
///
/// Stored trailers follow the body, as they came.
pub fn stored_to_response(stored: &StoredResponse) -> Response<Body> {
    let trailers = (!stored.trailers.is_empty()).then(|| {
        let mut map = HeaderMap::new();
        append_fields(&mut map, &stored.trailers);
        map
    });
    let mut response = Response::new(full_with_trailers(stored.body.clone(), trailers));
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    append_fields(response.headers_mut(), &stored.headers);
    response
}

/// The last instant an HTTP-date can name: the end of 9999-12-31T23:59:59Z
/// (the date names whole seconds, so the whole of that second).
const LAST_HTTP_DATE_MS: i64 = 253_402_300_799_999;

/// `t` as an HTTP-date (RFC 9110), or `None` past the year 9999, which the
/// format cannot write (the formatter would panic). Policies bound the ttl
/// far below that; only a corrupt record gets here.
pub fn http_date(t: Timestamp) -> Option<String> {
    (0..=LAST_HTTP_DATE_MS)
        .contains(&t.as_millis())
        .then(|| httpdate::fmt_http_date(t.to_system_time()))
}

/// Adds `Idempotency-Key-Expires`. The header names a second, and answers
/// that follow each other mostly name the same one: each thread keeps the
/// last value it wrote.
pub(crate) fn set_expires(headers: &mut HeaderMap, expires_at: Timestamp) {
    thread_local! {
        static LAST: RefCell<Option<(i64, HeaderValue)>> = const { RefCell::new(None) };
    }
    let second = expires_at.as_millis().div_euclid(1000);
    let value = LAST.with_borrow_mut(|last| match last {
        Some((s, v)) if *s == second => Some(v.clone()),
        _ => {
            let v = http_date(expires_at).and_then(|d| HeaderValue::from_str(&d).ok())?;
            *last = Some((second, v.clone()));
            Some(v)
        }
    });
    if let Some(v) = value {
        headers.insert(IDEMPOTENCY_KEY_EXPIRES, v);
    }
}

/// The replay of a finished record.
pub(crate) fn replay(stored: &StoredResponse, expires_at: Timestamp) -> Response<Body> {
    let mut response = stored_to_response(stored);
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    set_expires(response.headers_mut(), expires_at);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value kept from the last answer is used only within its second,
    /// and a date past what the format can write is still left out.
    #[test]
    fn the_expiry_header_names_its_own_second() {
        let expires = |ms: i64| {
            let mut h = HeaderMap::new();
            set_expires(&mut h, Timestamp::from_millis(ms));
            h.get(IDEMPOTENCY_KEY_EXPIRES).cloned()
        };
        let t = 1_800_000_000_000;
        let first = expires(t + 999);
        assert_eq!(first.as_ref().unwrap(), "Fri, 15 Jan 2027 08:00:00 GMT");
        assert_eq!(expires(t), first);
        assert_eq!(expires(t + 1_000).unwrap(), "Fri, 15 Jan 2027 08:00:01 GMT");
        assert_eq!(expires(t - 1).unwrap(), "Fri, 15 Jan 2027 07:59:59 GMT");
        assert_eq!(expires(LAST_HTTP_DATE_MS + 1_000), None);
        assert_eq!(expires(-1_000), None);
        assert_eq!(expires(t).unwrap(), "Fri, 15 Jan 2027 08:00:00 GMT");
    }

    #[test]
    fn only_allowlisted_headers_are_stored() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::LOCATION, HeaderValue::from_static("/t/1"));
        h.insert(
            header::SET_COOKIE,
            HeaderValue::from_static("session=secret"),
        );
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        h.insert("x-ledger-balance", HeaderValue::from_static("5"));
        let extra = [
            HeaderName::from_static("x-ledger-balance"),
            header::SET_COOKIE,
        ];
        let s = to_stored(StatusCode::CREATED, &h, b"{}", None, &extra);
        let names: Vec<_> = s.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "location", "x-ledger-balance"]);
        let r = replay(&s, Timestamp::from_millis(1_800_000_000_000));
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.headers()[IDEMPOTENT_REPLAYED], "true");
        assert_eq!(
            r.headers()[IDEMPOTENCY_KEY_EXPIRES],
            "Fri, 15 Jan 2027 08:00:00 GMT"
        );
        assert!(r.headers().get(header::SET_COOKIE).is_none());
    }

    /// gRPC's fields are kept as headers (a trailers-only answer) and as
    /// trailers; other trailers only when the route names them; and the
    /// replay sends the trailers after the body.
    #[tokio::test]
    async fn trailers_are_stored_on_the_allowlist_and_replayed_after_the_body() {
        use http_body_util::BodyExt as _;
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert("grpc-encoding", HeaderValue::from_static("identity"));
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t.insert("grpc-message", HeaderValue::from_static("ok%20then"));
        t.insert("x-cost", HeaderValue::from_static("3"));
        t.insert("x-secret", HeaderValue::from_static("s"));
        t.insert(header::SET_COOKIE, HeaderValue::from_static("a=b"));
        let extra = [HeaderName::from_static("x-cost"), header::SET_COOKIE];
        let s = to_stored(StatusCode::OK, &h, b"\0\0\0\0\x01z", Some(&t), &extra);
        let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&s.headers), ["content-type", "grpc-encoding"]);
        assert_eq!(
            names(&s.trailers),
            ["grpc-status", "grpc-message", "x-cost"]
        );
        let r = replay(&s, Timestamp::from_millis(1_800_000_000_000));
        let mut body = r.into_body();
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&data[..], b"\0\0\0\0\x01z");
        let trailers = body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_trailers()
            .unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["grpc-message"], "ok%20then");
        assert_eq!(trailers["x-cost"], "3");
        assert_eq!(trailers.len(), 3);
        assert!(body.frame().await.is_none());
        // No trailers stored: none replayed.
        let plain = to_stored(StatusCode::OK, &h, b"x", None, &extra);
        assert!(plain.trailers.is_empty());
        let collected = replay(&plain, Timestamp::from_millis(0))
            .into_body()
            .collect()
            .await
            .unwrap();
        assert!(collected.trailers().is_none());
    }

    #[test]
    fn expiry_past_the_year_9999_is_left_out_not_a_panic() {
        let mut h = HeaderMap::new();
        set_expires(&mut h, Timestamp::from_millis(i64::MAX));
        assert!(h.get(IDEMPOTENCY_KEY_EXPIRES).is_none());
        set_expires(&mut h, Timestamp::from_millis(LAST_HTTP_DATE_MS));
        assert_eq!(h[IDEMPOTENCY_KEY_EXPIRES], "Fri, 31 Dec 9999 23:59:59 GMT");
    }
}
