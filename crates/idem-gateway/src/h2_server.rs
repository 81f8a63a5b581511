//! HTTP/2 on client connections: the bounds every connection is served
//! with ([`http2_bounds`]), and the bound on what its streams may leave
//! running ([`StreamSlots`]).
//!
//! hyper and h2 bound a connection's open streams, its header lists and
//! its windows, and close a connection whose client resets more streams
//! than it lets the server take up (h2's answer to CVE-2023-44487). What
//! they cannot bound is work that outlives a stream: the layer runs an
//! execution to its end when its client goes (hang-up safety), so a
//! client that sends a keyed request and resets its stream at once, in a
//! loop, would start executions without limit while never having more
//! than one stream open. [`StreamSlots`] counts those: a request on an
//! HTTP/2 connection takes one of the connection's slots (as many as it
//! may have streams) before it reaches the layer, and the slot travels
//! with the request into its execution ([`ExecutionSlot`]) and is given
//! back only when the execution's answer is done with. A stream reset
//! while it waits for a slot costs nothing more.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{BoxFuture, Either};
use http::{Request, Response, Version};
use idem_http::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Service, ServiceExt as _};

/// Sets `builder` (hyper's HTTP/2 server builder, or hyper-util's
/// automatic one's HTTP/2 half: the same methods) to the HTTP/2 bounds
/// of `limits` ([`ConnectionLimits`](crate::ConnectionLimits)).
macro_rules! http2_bounds {
    ($builder:expr, $limits:expr) => {{
        let h2 = &$limits.http2;
        $builder
            .timer(hyper_util::rt::TokioTimer::new())
            .max_concurrent_streams(h2.max_concurrent_streams)
            .max_header_list_size(h2.max_header_list_size)
            .initial_stream_window_size(h2.stream_window)
            .initial_connection_window_size(h2.connection_window)
            .keep_alive_interval(h2.keep_alive_interval)
            .keep_alive_timeout(h2.keep_alive_timeout)
            .max_pending_accept_reset_streams(h2.max_pending_resets)
            .max_local_error_reset_streams(h2.max_local_error_resets);
    }};
}
pub(crate) use http2_bounds;

/// One of an HTTP/2 connection's execution slots, held by a request from
/// before the layer sees it until its answer is done with (an execution
/// that outlives its stream holds it to its end). The proxy moves it
/// from the request onto the answer.
#[derive(Clone)]
pub(crate) struct ExecutionSlot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// A connection's front service with a slot taken for every HTTP/2
/// request (HTTP/1.1 requests on the same listener pass straight on).
#[derive(Clone)]
pub(crate) struct StreamSlots<S> {
    inner: S,
    slots: Arc<Semaphore>,
}

impl<S> StreamSlots<S> {
    /// `inner`, with `slots` executions at most for the connection.
    pub(crate) fn new(inner: S, slots: u32) -> StreamSlots<S> {
        StreamSlots {
            inner,
            slots: Arc::new(Semaphore::new(slots as usize)),
        }
    }
}

impl<S, B> Service<Request<B>> for StreamSlots<S>
where
    S: Service<Request<B>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response<Body>, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if req.version() != Version::HTTP_2 {
            return Either::Left(self.inner.call(req));
        }
        let inner = self.inner.clone();
        let slots = self.slots.clone();
        Either::Right(Box::pin(async move {
            // Never closed: the semaphore lives as long as this service.
            if let Ok(slot) = slots.acquire_owned().await {
                req.extensions_mut().insert(ExecutionSlot(Arc::new(slot)));
            }
            inner.oneshot(req).await
        }))
    }
}
