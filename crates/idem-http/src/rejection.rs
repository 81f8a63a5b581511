//! Every answer the layer gives instead of the handler's, as
//! `application/problem+json` (RFC 9457).

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header};
use idem_core::KeyError;

use crate::body::{Body, full};
use crate::metrics::Outcome;
use crate::rule::ScopeError;

/// Why the layer answered instead of the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400: the route needs a key and the request has none.
    MissingKey,
    /// 400: more than one `Idempotency-Key` header.
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
}

impl Rejection {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::MissingKey
            | Rejection::RepeatedKey
            | Rejection::InvalidKey(_)
            | Rejection::UnreadableBody => StatusCode::BAD_REQUEST,
            Rejection::Scope(ScopeError::CredentialRequired) => StatusCode::UNAUTHORIZED,
            Rejection::Scope(_) => StatusCode::BAD_REQUEST,
            Rejection::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Rejection::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::InFlight { .. } => StatusCode::CONFLICT,
            Rejection::StoreUnavailable { .. } | Rejection::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Rejection::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::HandlerFailed | Rejection::OutcomeUnknown => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The problem type, a URN per kind of rejection.
    pub fn problem_type(&self) -> &'static str {
        match self {
            Rejection::MissingKey => "urn:idem:problem:missing-key",
            Rejection::RepeatedKey => "urn:idem:problem:repeated-key",
            Rejection::InvalidKey(_) => "urn:idem:problem:invalid-key",
            Rejection::Mismatch => "urn:idem:problem:key-reused",
            Rejection::InFlight { .. } => "urn:idem:problem:in-flight",
            Rejection::StoreUnavailable { .. } => "urn:idem:problem:store-unavailable",
            Rejection::BodyTooLarge { .. } => "urn:idem:problem:body-too-large",
            Rejection::UnreadableBody => "urn:idem:problem:unreadable-body",
            Rejection::BodyTimeout => "urn:idem:problem:body-timeout",
            Rejection::Scope(ScopeError::CredentialRequired) => {
                "urn:idem:problem:credential-required"
            }
            Rejection::Scope(_) => "urn:idem:problem:invalid-scope",
            Rejection::HandlerFailed => "urn:idem:problem:handler-failed",
            Rejection::ShuttingDown => "urn:idem:problem:shutting-down",
            Rejection::OutcomeUnknown => "urn:idem:problem:outcome-unknown",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Rejection::MissingKey => "Idempotency-Key required",
            Rejection::RepeatedKey => "More than one Idempotency-Key",
            Rejection::InvalidKey(_) => "Invalid Idempotency-Key",
            Rejection::Mismatch => "Idempotency-Key reused with different parameters",
            Rejection::InFlight { .. } => "Request with this Idempotency-Key in progress",
            Rejection::StoreUnavailable { .. } => "Idempotency store unavailable",
            Rejection::BodyTooLarge { .. } => "Request body too large",
            Rejection::UnreadableBody => "Request body could not be read",
            Rejection::BodyTimeout => "Request body too slow",
            Rejection::Scope(ScopeError::CredentialRequired) => "Credential required",
            Rejection::Scope(_) => "Caller could not be identified",
            Rejection::HandlerFailed => "Request failed",
            Rejection::ShuttingDown => "Server shutting down",
            Rejection::OutcomeUnknown => "Outcome unknown",
        }
    }

    fn detail(&self) -> String {
        match self {
            Rejection::MissingKey => {
                "This operation needs an Idempotency-Key header: one random value (a UUID) per intent, sent unchanged on every retry.".into()
            }
            Rejection::RepeatedKey => "Send exactly one Idempotency-Key header.".into(),
            Rejection::InvalidKey(e) => format!("{e}."),
            Rejection::Mismatch => {
                "This key was first used with a different request body; a key names one intent. Use a new key for a new request.".into()
            }
            Rejection::InFlight { .. } => {
                "The first request with this key has not finished. Retry after the time in Retry-After; you will get its result.".into()
            }
            Rejection::StoreUnavailable { .. } => {
                "The request was not executed. Retry with the same key after the time in Retry-After.".into()
            }
            Rejection::BodyTooLarge { limit } => format!("The body is over the limit of {limit} bytes."),
            Rejection::UnreadableBody => "The request body ended early or was malformed.".into(),
            Rejection::BodyTimeout => {
                "The request body did not arrive in time; nothing was executed. Retry with the same key.".into()
            }
            Rejection::Scope(e) => format!("{e}; nothing was executed."),
            Rejection::HandlerFailed => {
                "The request failed and was not recorded; retrying with the same key executes it again.".into()
            }
            Rejection::ShuttingDown => {
                "The server stopped before the request finished; retry with the same key.".into()
            }
            Rejection::OutcomeUnknown => {
                "Whether the request took effect is unknown. Its key stays held until the lease ends; retry with the same key (you will get 409 until then), or read the record.".into()
            }
        }
    }

    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Rejection::MissingKey => Outcome::MissingKey,
            Rejection::RepeatedKey | Rejection::InvalidKey(_) => Outcome::InvalidKey,
            Rejection::Mismatch => Outcome::Mismatch,
            Rejection::InFlight { .. } => Outcome::Conflict,
            Rejection::StoreUnavailable { .. } => Outcome::StoreUnavailable,
            Rejection::BodyTooLarge { .. }
            | Rejection::UnreadableBody
            | Rejection::BodyTimeout
            | Rejection::Scope(_) => Outcome::InvalidRequest,
            Rejection::HandlerFailed | Rejection::ShuttingDown => Outcome::Released,
            Rejection::OutcomeUnknown => Outcome::Held,
        }
    }

    /// The problem+json response.
    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        let body = serde_json::json!({
            "type": self.problem_type(),
            "title": self.title(),
            "status": status.as_u16(),
            "detail": self.detail(),
        });
        let mut response = Response::new(full(body.to_string()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Rejection::InFlight { retry_after } | Rejection::StoreUnavailable { retry_after } =
            self
        {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after.as_secs().max(1)),
            );
        }
        response
    }
}
