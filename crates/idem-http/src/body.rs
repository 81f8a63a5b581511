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

/// A body holding `bytes`, then `trailers` if there are any: a stored
/// answer's, replayed as it came (gRPC's status is a trailer).
pub fn full_with_trailers(bytes: impl Into<Bytes>, trailers: Option<http::HeaderMap>) -> Body {
    match trailers {
        None => full(bytes),
        Some(trailers) => WithTrailers {
            data: Some(bytes.into()).filter(|b| !b.is_empty()),
            trailers: Some(trailers),
        }
        .boxed_unsync(),
    }
}

/// Data in one frame, then trailers.
struct WithTrailers {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let frame = match self.data.take() {
            Some(data) => Some(http_body::Frame::data(data)),
            None => self.trailers.take().map(http_body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
