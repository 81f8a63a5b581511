//! The `Idempotency` service and its response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::TryFutureExt;
use http::{Request, Response};
use tower::Service;

use crate::body::{Body, BoxError, boxed};
use crate::flow;
use crate::shared::Shared;

/// A service wrapped by [`IdempotencyLayer`](crate::IdempotencyLayer).
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> Idempotency<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Idempotency<S> {
        Idempotency { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The future of [`Idempotency`]'s responses.
///
/// Dropping it (a client that hangs up) does not cancel an execution that
/// holds a claim: the handler runs to completion in a task of its own and
/// its result is stored, so the client's retry replays it.
pub struct ResponseFuture<E> {
    inner: Handled<E>,
}

/// A request's answer, on its way.
type Handled<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<S, B, RB> Service<Request<B>> for Idempotency<S>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    S: Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone is not ready; keep the one that is for this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        // The inner call is boxed here, outside any async fn, so that its
        // future's `Send` is checked once for the concrete service.
        let call: flow::Call<S::Error> =
            Box::new(move |req| Box::pin(inner.call(req).map_ok(|r| r.map(boxed))));
        // A gRPC client reads a gRPC status, not a problem document:
        // idem's refusals to it become trailers-only answers.
        let grpc = crate::grpc::is_grpc(req.headers());
        // Boxed before it is awaited in another future, so that its `Send`
        // is checked here, once, as for a plain request.
        let handled: Handled<S::Error> =
            Box::pin(flow::handle(self.shared.clone(), call, req, grpc));
        let inner = if grpc { as_grpc(handled) } else { handled };
        ResponseFuture { inner }
    }
}

/// `handled`, with idem's own refusal turned into a gRPC status.
fn as_grpc<E: Send + 'static>(handled: Handled<E>) -> Handled<E> {
    Box::pin(async move {
        match handled.await {
            Ok(response) => Ok(crate::grpc::refusal_as_grpc(response).await),
            Err(e) => Err(e),
        }
    })
}
