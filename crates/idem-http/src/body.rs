//! The body type the layer hands to the inner service and returns.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

/// A boxed error, as tower and hyper use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The request and response body type of [`Idempotency`](crate::Idempotency):
/// any `http_body::Body` of `Bytes`, boxed. axum's `Router` accepts it as is.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Boxes any body of `Bytes`.
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}
