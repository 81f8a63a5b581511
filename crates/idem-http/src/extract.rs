//! [`IdempotencyContext`] as an axum extractor (the `axum` feature).
//!
//! A handler behind the layer takes `ctx: IdempotencyContext` (the claim
//! the layer holds for this request), or `Option<IdempotencyContext>` on a
//! route whose key is optional: the layer puts a context only in requests
//! it executes, so a request it passes through (no key on an optional
//! route, a method it does not cover) has none.

use std::convert::Infallible;
use std::fmt;

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use http::StatusCode;
use http::request::Parts;

use crate::context::IdempotencyContext;
use crate::problem::Problem;

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyContext {
    type Rejection = MissingIdempotencyContext;

    /// # Errors
    /// [`MissingIdempotencyContext`] (500) when the layer did not execute
    /// this request.
    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<IdempotencyContext, MissingIdempotencyContext> {
        match parts.extensions.get::<IdempotencyContext>() {
            Some(ctx) => Ok(ctx.clone()),
            None => {
                tracing::error!(
                    method = %parts.method,
                    path = parts.uri.path(),
                    "the handler takes IdempotencyContext, but the idempotency layer did not \
                     execute this request: add IdempotencyLayer to the route (Router::route_layer), \
                     or take Option<IdempotencyContext> where the key is optional"
                );
                Err(MissingIdempotencyContext)
            }
        }
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyContext {
    type Rejection = Infallible;

    /// `None` when the layer did not execute this request.
    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<IdempotencyContext>, Infallible> {
        Ok(parts.extensions.get::<IdempotencyContext>().cloned())
    }
}

/// The rejection of the [`IdempotencyContext`] extractor: the idempotency
/// layer did not execute this request, because it does not wrap the route
/// or let the request pass (no key on an optional route). A server bug,
/// not the client's: 500 `urn:idem:problem:layer-missing`, and the handler
/// does not run. The details go to the log (`tracing`, level error), not
/// to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MissingIdempotencyContext;

impl MissingIdempotencyContext {
    /// The problem document the client gets.
    pub fn problem(&self) -> Problem {
        Problem::idem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "layer-missing",
            "Idempotency layer missing",
            "The server is misconfigured: this operation needs the idempotency layer, which did not run for this request. Nothing was executed.",
        )
    }
}

impl fmt::Display for MissingIdempotencyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the idempotency layer did not execute this request")
    }
}

impl std::error::Error for MissingIdempotencyContext {}

impl axum_core::response::IntoResponse for MissingIdempotencyContext {
    fn into_response(self) -> axum_core::response::Response {
        self.problem()
            .into_response()
            .map(axum_core::body::Body::new)
    }
}
