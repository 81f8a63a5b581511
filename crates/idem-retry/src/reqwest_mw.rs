//! The reqwest-middleware adapter.

use http::{Extensions, HeaderValue, header};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::engine::{CallSpec, Retrier, RetryError, Step};
use crate::observe::{Observation, ObserveError, ObserveResponse, Observed};
use crate::policy::RetryPolicy;

const KEY: &str = "idempotency-key";

impl ObserveResponse for Response {
    fn observe(&self) -> Observation {
        Observation::from_response(self.status().as_u16(), self.headers())
    }
}

impl ObserveError for reqwest::Error {
    fn observe(&self) -> Observation {
        Observation::of(if self.is_connect() {
            Observed::NotSent
        } else if self.is_builder() || self.is_redirect() {
            Observed::Fatal
        } else {
            Observed::Unknown
        })
    }
}

impl ObserveError for reqwest_middleware::Error {
    fn observe(&self) -> Observation {
        match self {
            reqwest_middleware::Error::Reqwest(e) => e.observe(),
            reqwest_middleware::Error::Middleware(_) => Observation::of(Observed::Fatal),
        }
    }
}

/// Retries reqwest requests under a [`RetryPolicy`].
///
/// POST and PATCH requests without an `Idempotency-Key` header get a
/// generated one; a header already set is kept and used on every attempt.
/// A request whose body cannot be cloned (a stream) is sent once.
/// When the key would expire before the next retry, the call fails with a
/// middleware error wrapping [`RetryError::KeyExpired`].
#[derive(Debug, Clone)]
pub struct RetryMiddleware {
    retrier: Retrier,
}

impl RetryMiddleware {
    /// A middleware with `policy`; its budget is shared by every request of
    /// the client it is added to.
    pub fn new(policy: RetryPolicy) -> RetryMiddleware {
        RetryMiddleware {
            retrier: Retrier::new(policy),
        }
    }

    /// A middleware sharing `retrier`'s policy and budget.
    pub fn from_retrier(retrier: Retrier) -> RetryMiddleware {
        RetryMiddleware { retrier }
    }
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Expired(RetryError<std::convert::Infallible>);

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let mut spec = CallSpec::for_method(req.method());
        if let Some(k) = req.headers().get(KEY).and_then(|v| v.to_str().ok()) {
            spec = spec.with_key(k);
        }
        if req.try_clone().is_none() {
            return next.run(req, extensions).await;
        }
        let mut call = self.retrier.start(spec);
        loop {
            let attempt = call.next_attempt();
            let Some(mut this) = req.try_clone() else {
                return next.run(req, extensions).await;
            };
            if let Some(key) = &attempt.key
                && let Ok(v) = HeaderValue::from_str(key)
            {
                this.headers_mut().insert(KEY, v);
            }
            if let Some(auth) = attempt.authorization {
                this.headers_mut().insert(header::AUTHORIZATION, auth);
            }
            let result = next.clone().run(this, extensions).await;
            let observation = match &result {
                Ok(r) => r.observe(),
                Err(e) => e.observe(),
            };
            match call.after(&observation).await {
                Step::Retry(delay) => {
                    drop(result);
                    tokio::time::sleep(delay).await;
                }
                Step::Stop(_) => return result,
                Step::KeyExpired(expires_at) => {
                    let attempts = call.finish(crate::Stop::KeyExpired).attempts;
                    return Err(reqwest_middleware::Error::middleware(Expired(
                        RetryError::KeyExpired {
                            expires_at,
                            attempts,
                        },
                    )));
                }
            }
        }
    }
}
