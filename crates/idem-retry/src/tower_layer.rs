//! The tower adapter, for hyper clients.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};

use crate::engine::{CallSpec, Retrier, RetryError};
use crate::observe::{Observation, ObserveError, Observed};
use crate::policy::RetryPolicy;

impl ObserveError for hyper_util::client::legacy::Error {
    fn observe(&self) -> Observation {
        Observation::of(if self.is_connect() {
            Observed::NotSent
        } else {
            Observed::Unknown
        })
    }
}

/// Wraps a client service in [`RetryService`].
#[derive(Debug, Clone)]
pub struct RetryLayer {
    retrier: Retrier,
}

impl RetryLayer {
    /// A layer with `policy`; services it makes share one budget.
    pub fn new(policy: RetryPolicy) -> RetryLayer {
        RetryLayer {
            retrier: Retrier::new(policy),
        }
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = RetryService<S>;

    fn layer(&self, inner: S) -> RetryService<S> {
        RetryService {
            inner,
            retrier: self.retrier.clone(),
        }
    }
}

/// Retries requests with buffered bodies (`Full<Bytes>`, which clones
/// cheaply) through the inner client. POST and PATCH without an
/// `Idempotency-Key` get a generated one; the key goes out as an
/// sf-string. An `Idempotency-Key` already on the request that is not a
/// key fails the call with [`RetryError::InvalidKey`], sending nothing.
#[derive(Debug, Clone)]
pub struct RetryService<S> {
    inner: S,
    retrier: Retrier,
}

impl<S> RetryService<S> {
    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped client, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the client.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<Full<Bytes>>> for RetryService<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: ObserveError + Send,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = RetryError<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, RetryError<S::Error>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each attempt waits for readiness of its own clone.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let inner = self.inner.clone();
        let retrier = self.retrier.clone();
        Box::pin(async move {
            let spec = CallSpec::for_request(req.method(), req.headers())
                .map_err(RetryError::InvalidKey)?;
            let (parts, body) = req.into_parts();
            retrier
                .call(spec, move |attempt| {
                    let mut r = Request::from_parts(parts.clone(), body.clone());
                    attempt.set_headers(r.headers_mut());
                    inner.clone().oneshot(r)
                })
                .await
        })
    }
}
