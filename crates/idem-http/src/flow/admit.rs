//! Admission: the key (present, single, well-formed), the scope, the
//! record it names, and the body, bounded in size and time. What is
//! refused here never reaches the store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, header, request::Parts};
use http_body_util::BodyExt;
use idem_core::{Key, RecordId};

use crate::body::{Body, BoxError};
use crate::key_header::IDEMPOTENCY_KEY;
use crate::rejection::Rejection;
use crate::rule::{KeyRequirement, RouteRule, ScopeError};
use crate::shared::Shared;

/// What admission makes of a request's key and scope.
pub(super) enum Admission {
    /// The record the request names.
    Keyed(RecordId),
    /// No key, and its rule makes one optional: it passes through.
    Pass,
    /// Its key or scope is refused, with this answer.
    Refused(Box<Response<Body>>),
}

/// The record a request under `rule` names, or why it has none.
pub(super) fn record_id(shared: &Shared, rule: &Arc<RouteRule>, parts: &Parts) -> Admission {
    match keyed_record_id(shared, rule, parts) {
        Ok(Some(id)) => Admission::Keyed(id),
        Ok(None) => Admission::Pass,
        Err(refused) => Admission::Refused(refused),
    }
}

fn keyed_record_id(
    shared: &Shared,
    rule: &Arc<RouteRule>,
    parts: &Parts,
) -> Result<Option<RecordId>, Box<Response<Body>>> {
    let refuse = |r: Rejection| Box::new(shared.reject(r));
    let mut values = parts.headers.get_all(&shared.settings.key_header).iter();
    let raw = match (values.next(), values.next()) {
        // A key under the standard name where another is configured: the
        // client (idem's own retry client, for one) believes it is
        // protected and will retry; passing it through unprotected could
        // execute it twice.
        (None, _)
            if shared.settings.key_header != IDEMPOTENCY_KEY
                && parts.headers.contains_key(IDEMPOTENCY_KEY) =>
        {
            return Err(refuse(Rejection::MissingKey));
        }
        (None, _) if rule.key == KeyRequirement::Optional => return Ok(None),
        (None, _) => return Err(refuse(Rejection::MissingKey)),
        (Some(_), Some(_)) => return Err(refuse(Rejection::RepeatedKey)),
        (Some(v), None) => v,
    };
    let key = parse_key(shared, raw, &parts.headers).map_err(refuse)?;
    let scope = match shared.settings.scope.scope_of(parts) {
        Ok(s) if shared.settings.require_scope && s == idem_core::Scope::anonymous() => {
            return Err(refuse(Rejection::Scope(ScopeError::CredentialRequired)));
        }
        Ok(s) => s,
        Err(e) => return Err(refuse(Rejection::Scope(e))),
    };
    let operation = shared
        .settings
        .operation(rule, &parts.method, parts.uri.path());
    Ok(Some(RecordId::new(scope, operation, key)))
}

fn parse_key(
    shared: &Shared,
    raw: &http::HeaderValue,
    headers: &HeaderMap,
) -> Result<Key, Rejection> {
    let text = raw.to_str().map_err(|_| {
        let at = raw
            .as_bytes()
            .iter()
            .position(|b| !b.is_ascii())
            .unwrap_or(0);
        Rejection::InvalidKey(idem_core::KeyError::InvalidCharacter {
            byte: raw.as_bytes().get(at).copied().unwrap_or(0),
            at,
        })
    })?;
    let credential = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split_once(' ').map_or(v, |(_, token)| token).trim());
    Key::parse(text, &shared.settings.key_policy, credential).map_err(Rejection::InvalidKey)
}

/// A rejection sent before the request body was read to its end: the
/// connection is closed after the answer, since what is left of the body
/// cannot be told apart from a next request.
pub(super) fn reject_and_close(shared: &Shared, r: Rejection) -> Response<Body> {
    let mut response = shared.reject(r);
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// How much of an over-limit body is read and thrown away so that the
/// client, still sending, reads the 413 instead of a connection reset
/// (closing a socket with unread data makes the kernel send RST).
pub(super) const DRAIN_LIMIT: u64 = 8 * 1024 * 1024;

/// How long that draining may take.
pub(super) const DRAIN_TIME: Duration = Duration::from_secs(5);

pub(super) async fn read_body<B>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, Rejection>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A client that asked for 100-continue has sent nothing yet: refuse
    // without reading, and it sends nothing.
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let too_large = Rejection::BodyTooLarge { limit };
    if declared.is_some_and(|n| n > limit as u64)
        && (expects_continue || declared.is_some_and(|n| n > limit as u64 + DRAIN_LIMIT))
    {
        return Err(too_large);
    }
    let mut body = std::pin::pin!(body);
    let mut buf = bytes::BytesMut::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(Into::into)?.into_data() else {
                continue;
            };
            if buf.len() + data.len() > limit {
                return Ok(false);
            }
            buf.extend_from_slice(&data);
        }
        Ok::<bool, BoxError>(true)
    };
    match tokio::time::timeout(timeout, read).await {
        Err(_) => return Err(Rejection::BodyTimeout),
        Ok(Err(_)) => return Err(Rejection::UnreadableBody),
        Ok(Ok(true)) => return Ok(buf.freeze()),
        Ok(Ok(false)) => {}
    }
    // Over the limit: drain a bounded amount, then refuse.
    let drain = async {
        let mut drained = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            drained += frame.data_ref().map_or(0, |d| d.len() as u64);
            if drained > DRAIN_LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME.min(timeout), drain).await;
    Err(too_large)
}
