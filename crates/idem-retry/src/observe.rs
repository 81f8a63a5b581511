//! What an attempt's result says, independent of the transport.

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use http::header::RETRY_AFTER;
use idem_core::header_names;

/// How an attempt ended, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Observed {
    /// The server answered with this status.
    Status(u16),
    /// The request never left: connection refused, DNS failure. Always safe
    /// to retry.
    NotSent,
    /// The request may have been sent and processed, but no answer came
    /// (timeout, connection lost). Retry only with the same key.
    Unknown,
    /// A failure retrying cannot help (a malformed request, a bad URL).
    Fatal,
}

/// What an attempt's result tells the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// How it ended.
    pub observed: Observed,
    /// The server's `Retry-After`, if any, as a delay from now.
    pub retry_after: Option<Duration>,
    /// The server's `Idempotency-Key-Expires`, if any.
    pub key_expires: Option<SystemTime>,
}

impl Observation {
    /// An observation with no headers.
    pub fn of(observed: Observed) -> Observation {
        Observation {
            observed,
            retry_after: None,
            key_expires: None,
        }
    }

    /// Reads status and headers of an HTTP response.
    pub fn from_response(status: u16, headers: &HeaderMap) -> Observation {
        Observation {
            observed: Observed::Status(status),
            retry_after: headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now())),
            key_expires: headers
                .get(header_names::IDEMPOTENCY_KEY_EXPIRES)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| httpdate::parse_http_date(v).ok()),
        }
    }
}

/// Parses `Retry-After` in either form: delay-seconds, or an HTTP-date
/// (a date in the past means now).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A successful transport result that carries an HTTP status.
pub trait ObserveResponse {
    /// Status and headers.
    fn observe(&self) -> Observation;
}

/// A transport error.
pub trait ObserveError {
    /// Whether the request was sent.
    fn observe(&self) -> Observation;
}

impl<B> ObserveResponse for http::Response<B> {
    fn observe(&self) -> Observation {
        Observation::from_response(self.status().as_u16(), self.headers())
    }
}

impl ObserveError for std::io::Error {
    fn observe(&self) -> Observation {
        use std::io::ErrorKind as K;
        Observation::of(match self.kind() {
            K::ConnectionRefused | K::AddrNotAvailable | K::NotFound => Observed::NotSent,
            K::InvalidInput => Observed::Fatal,
            _ => Observed::Unknown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_both_forms() {
        let now = httpdate::parse_http_date("Mon, 30 Nov 2026 10:00:00 GMT").unwrap();
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Mon, 30 Nov 2026 10:00:42 GMT", now),
            Some(Duration::from_secs(42))
        );
        assert_eq!(
            parse_retry_after("Mon, 30 Nov 2026 09:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }
}
