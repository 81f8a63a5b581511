//! Every answer the layer gives instead of the handler's, as
//! `application/problem+json` (RFC 9457).

use std::time::Duration;

use http::{HeaderName, Response, StatusCode};
use idem_core::KeyError;

use crate::body::Body;
use crate::key_header::IDEMPOTENCY_KEY;
use crate::metrics::Outcome;
use crate::problem::Problem;
use crate::rule::ScopeError;

/// Why the layer answered instead of the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400: the route needs a key and the request has none.
    MissingKey,
    /// 400: more than one key header (`Idempotency-Key` unless the layer
    /// names another).
    RepeatedKey,
    /// 400: the key is malformed, too short or long, or secret-shaped.
    InvalidKey(KeyError),
    /// 422: the key was first used with different parameters.
    Mismatch,
    /// 409: the first request with this key is still running.
    InFlight {
        /// Sent as `Retry-After`.
        retry_after: Duration,
    },
    /// 503: the record store did not answer; nothing was executed.
    StoreUnavailable {
        /// Sent as `Retry-After`.
        retry_after: Duration,
    },
    /// 503: the store lost records (emptied, replaced or rolled back) and
    /// new claims are refused until the loss window closes; nothing was
    /// executed.
    StoreLostRecords {
        /// Sent as `Retry-After`: when the window closes.
        retry_after: Duration,
    },
    /// 413: the body is over the limit.
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// 400: the body could not be read.
    UnreadableBody,
    /// 408: the body did not arrive within the layer's body deadline.
    BodyTimeout,
    /// 400 (401 for a missing credential): the scope could not be derived.
    Scope(ScopeError),
    /// 500: the handler panicked or its response body failed; the claim
    /// was released, so a retry executes again.
    HandlerFailed,
    /// 503: the server is shutting down.
    ShuttingDown,
    /// 500: whether the request took effect is unknown (its response failed
    /// half-way, or the server stopped while it ran); the claim is held
    /// until its lease ends, so a retry meets 409 until then.
    OutcomeUnknown,
    /// 500: an earlier request with this key may have taken effect (its
    /// executor stopped before recording the outcome), and the route's
    /// takeover policy is to hold: it is not executed again until an
    /// operator resolves the record or it expires.
    OutcomeUnresolved,
    /// A gRPC request whose message is compressed: its bytes as sent do
    /// not name the message, so it cannot be fingerprinted (501; gRPC
    /// `UNIMPLEMENTED`).
    CompressedMessage,
}

impl Rejection {
    /// The problem document: the one table of statuses, types, titles and
    /// details. A missing or repeated key is described with the standard
    /// `Idempotency-Key` header; a layer configured with another header
    /// names that one.
    pub fn problem(&self) -> Problem {
        self.problem_naming(&IDEMPOTENCY_KEY)
    }

    /// The problem document, with `key_header` as the header a missing or
    /// repeated key belongs in. Titles stay the same whatever the header
    /// (RFC 9457: one title per problem type; "Idempotency-Key" there
    /// names the concept); only the details, which tell the client what
    /// to send, name the header.
    pub(crate) fn problem_naming(&self, key_header: &HeaderName) -> Problem {
        use StatusCode as S;
        let p = |status, kind: &str, title: &'static str, detail: String| {
            Problem::idem(status, kind, title, detail)
        };
        match self {
            Rejection::MissingKey => p(
                S::BAD_REQUEST,
                "missing-key",
                "Idempotency-Key required",
                format!(
                    "This operation needs the {} header: one random value (a UUID) per intent, sent unchanged on every retry.",
                    display_name(key_header)
                ),
            ),
            Rejection::RepeatedKey => p(
                S::BAD_REQUEST,
                "repeated-key",
                "More than one Idempotency-Key",
                format!("Send exactly one {} header.", display_name(key_header)),
            ),
            Rejection::InvalidKey(e) => p(
                S::BAD_REQUEST,
                "invalid-key",
                "Invalid Idempotency-Key",
                format!("{e}."),
            ),
            Rejection::Mismatch => p(
                S::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency-Key reused with different parameters",
                "This key was first used with a different request (path, query or body); a key names one intent. Use a new key for a new request.".into(),
            ),
            Rejection::InFlight { retry_after } => p(
                S::CONFLICT,
                "in-flight",
                "Request with this Idempotency-Key in progress",
                "The first request with this key has not finished. Retry after the time in Retry-After; you will get its result.".into(),
            )
            .with_retry_after(*retry_after),
            Rejection::StoreUnavailable { retry_after } => p(
                S::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "The request was not executed. Retry with the same key after the time in Retry-After.".into(),
            )
            .with_retry_after(*retry_after),
            Rejection::StoreLostRecords { retry_after } => p(
                S::SERVICE_UNAVAILABLE,
                "store-lost-records",
                "Idempotency store lost records",
                "The idempotency store lost records it had acknowledged (it was emptied, replaced or rolled back), so requests already running elsewhere may not be known to it. The request was not executed. Retry with the same key after the time in Retry-After.".into(),
            )
            .with_retry_after(*retry_after),
            Rejection::BodyTooLarge { limit } => p(
                S::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("The body is over the limit of {limit} bytes."),
            ),
            Rejection::UnreadableBody => p(
                S::BAD_REQUEST,
                "unreadable-body",
                "Request body could not be read",
                "The request body ended early or was malformed.".into(),
            ),
            Rejection::BodyTimeout => p(
                S::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body too slow",
                "The request body did not arrive in time; nothing was executed. Retry with the same key.".into(),
            ),
            Rejection::Scope(ScopeError::CredentialRequired) => p(
                S::UNAUTHORIZED,
                "credential-required",
                "Credential required",
                format!("{}; nothing was executed.", ScopeError::CredentialRequired),
            ),
            Rejection::Scope(e) => p(
                S::BAD_REQUEST,
                "invalid-scope",
                "Caller could not be identified",
                format!("{e}; nothing was executed."),
            ),
            Rejection::HandlerFailed => p(
                S::INTERNAL_SERVER_ERROR,
                "handler-failed",
                "Request failed",
                "The request failed and was not recorded; retrying with the same key executes it again.".into(),
            ),
            Rejection::ShuttingDown => p(
                S::SERVICE_UNAVAILABLE,
                "shutting-down",
                "Server shutting down",
                "The server stopped before the request finished; retry with the same key.".into(),
            ),
            Rejection::OutcomeUnknown => p(
                S::INTERNAL_SERVER_ERROR,
                "outcome-unknown",
                "Outcome unknown",
                "Whether the request took effect is unknown. Its key stays held until the lease ends; retry with the same key (you will get 409 until then), or read the record.".into(),
            ),
            Rejection::CompressedMessage => p(
                S::NOT_IMPLEMENTED,
                "compressed-message",
                "Compressed message",
                "A keyed gRPC call's message must be sent uncompressed (grpc-encoding identity): the same message compressed again need not give the same bytes, so its fingerprint would not name the request. Nothing was executed.".into(),
            ),
            Rejection::OutcomeUnresolved => p(
                S::INTERNAL_SERVER_ERROR,
                "outcome-unresolved",
                "Outcome unresolved",
                "An earlier request with this key may have taken effect: the server running it stopped before recording its outcome. It is not executed again until an operator resolves it or the key expires. Read GET /_idem/records/{key} for its state; do not send the request again under a new key unless you know the first did not take effect.".into(),
            ),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.problem().status()
    }

    /// The problem type, a URN per kind of rejection.
    pub fn problem_type(&self) -> String {
        self.problem().type_uri().to_owned()
    }

    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Rejection::MissingKey => Outcome::MissingKey,
            Rejection::RepeatedKey | Rejection::InvalidKey(_) => Outcome::InvalidKey,
            Rejection::Mismatch => Outcome::Mismatch,
            Rejection::InFlight { .. } => Outcome::Conflict,
            Rejection::StoreUnavailable { .. } | Rejection::StoreLostRecords { .. } => {
                Outcome::StoreUnavailable
            }
            Rejection::BodyTooLarge { .. }
            | Rejection::UnreadableBody
            | Rejection::BodyTimeout
            | Rejection::Scope(_)
            | Rejection::CompressedMessage => Outcome::InvalidRequest,
            Rejection::HandlerFailed | Rejection::ShuttingDown => Outcome::Released,
            Rejection::OutcomeUnknown | Rejection::OutcomeUnresolved => Outcome::Held,
        }
    }

    /// The problem+json response.
    pub fn into_response(self) -> Response<Body> {
        self.problem().into_response()
    }
}

/// A header name as documents write it: `x-request-key` as
/// `X-Request-Key`, `idempotency-key` as `Idempotency-Key` (header names
/// are case-insensitive; `HeaderName` keeps them in lower case).
fn display_name(name: &HeaderName) -> String {
    name.as_str()
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_header_problems_name_the_configured_header() {
        let detail = |r: Rejection, h: &'static str| {
            r.problem_naming(&HeaderName::from_static(h))
                .detail()
                .to_owned()
        };
        assert!(
            detail(Rejection::MissingKey, "x-request-key").contains("the X-Request-Key header")
        );
        assert!(
            detail(Rejection::RepeatedKey, "x-request-key").contains("one X-Request-Key header")
        );
        assert!(
            Rejection::MissingKey
                .problem()
                .detail()
                .contains("the Idempotency-Key header")
        );
        assert_eq!(
            Rejection::MissingKey
                .problem_naming(&HeaderName::from_static("x-request-key"))
                .title(),
            Rejection::MissingKey.problem().title(),
            "one title per problem type"
        );
        assert_eq!(display_name(&HeaderName::from_static("a--b-")), "A--B-");
    }
}
