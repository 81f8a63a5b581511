//! The reqwest-middleware adapter.

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::engine::{Attempt, CallSpec, Retrier, RetryError, Transport};
use crate::observe::{Observation, ObserveError, ObserveResponse, Observed};
use crate::policy::RetryPolicy;

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
/// generated one; a header already set is read as the server reads it and
/// kept for every attempt. The key sent is in the response's extensions
/// as a [`SentKey`]. To keep a key across a restart of the client (so that
/// a retry after the restart is still the same intent), make it yourself,
/// store it with the intent, and set the header: a generated key is only
/// known once an answer came back. The key goes out as an RFC 8941 sf-string
/// (`Idempotency-Key: "…"`). A request whose body cannot be cloned (a
/// stream) is sent once, untouched.
///
/// # Errors
///
/// A transport error comes back as it is (`reqwest_middleware::Error::Reqwest`),
/// whether or not it was retried first. Failures the engine makes itself
/// are a [`RetryError`] in `reqwest_middleware::Error::Middleware`, found
/// with `downcast_ref::<RetryError>()`: [`RetryError::KeyExpired`] when
/// the key would expire before the next retry, [`RetryError::InvalidKey`]
/// when the request's `Idempotency-Key` is not a key (nothing is sent).
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

/// The `Idempotency-Key` a request was sent with (generated, or the one the
/// caller set), in the extensions of the response [`RetryMiddleware`]
/// returns: `response.extensions().get::<SentKey>()`. Absent for a request
/// sent without a key (a GET, a streamed body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentKey(pub std::sync::Arc<str>);

/// The attempts of one request, each sent through the rest of the chain.
struct ChainAttempts<'a> {
    /// The request as the caller built it; each attempt sends a clone.
    request: &'a Request,
    extensions: &'a mut Extensions,
    next: Next<'a>,
}

impl Transport for ChainAttempts<'_> {
    type Response = Response;
    type Error = reqwest_middleware::Error;

    async fn send(&mut self, attempt: Attempt) -> reqwest_middleware::Result<Response> {
        // Not reached: `handle` sends a request it cannot clone (a streamed
        // body) once, outside the loop, and `try_clone` answers the same
        // every time for the same request.
        let Some(mut request) = self.request.try_clone() else {
            return Err(reqwest_middleware::Error::middleware(NotCloneable));
        };
        attempt.set_headers(request.headers_mut());
        self.next.clone().run(request, self.extensions).await
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the request body cannot be cloned for another attempt")]
struct NotCloneable;

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if req.try_clone().is_none() {
            return next.run(req, extensions).await;
        }
        let spec = CallSpec::for_request(req.method(), req.headers())
            .map_err(|e| engine_failure(RetryError::InvalidKey(e)))?;
        let mut attempts = ChainAttempts {
            request: &req,
            extensions,
            next,
        };
        let (result, report) = self.retrier.run(spec, &mut attempts).await;
        let mut response = result.map_err(|e| match e.engine_made() {
            Ok(failure) => engine_failure(failure),
            Err(transport) => transport,
        })?;
        if let Some(key) = report.key {
            response.extensions_mut().insert(SentKey(key));
        }
        Ok(response)
    }
}

/// A failure of the engine's own, as callers downcast it.
fn engine_failure(failure: RetryError) -> reqwest_middleware::Error {
    reqwest_middleware::Error::middleware(failure)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a panic is a failed assertion

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, SystemTime};

    use axum::http::{HeaderMap, HeaderValue, StatusCode};
    use axum::routing::post;

    use super::*;
    use crate::backoff::Backoff;

    /// A server whose every POST is 503 with `Retry-After: 5` and a key
    /// that expires in 2 s; returns its URL and its request count.
    async fn unavailable_server() -> (String, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let app = axum::Router::new().route(
            "/",
            post(move || {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let mut headers = HeaderMap::new();
                    headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
                    let expires = SystemTime::now() + Duration::from_secs(2);
                    headers.insert(
                        idem_core::header_names::IDEMPOTENCY_KEY_EXPIRES,
                        HeaderValue::from_str(&httpdate::fmt_http_date(expires)).unwrap(),
                    );
                    (StatusCode::SERVICE_UNAVAILABLE, headers)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, hits)
    }

    fn client() -> reqwest_middleware::ClientWithMiddleware {
        let policy = RetryPolicy::builder()
            .no_budget()
            .backoff(Backoff::new(
                Duration::from_millis(1),
                Duration::from_millis(5),
            ))
            .build();
        reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(policy))
            .build()
    }

    /// The key a POST went out with, generated or given, is in the
    /// response's extensions, as the server saw it (without the sf-string
    /// quotes).
    #[tokio::test]
    async fn the_key_sent_is_in_the_response() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        let app = axum::Router::new().route(
            "/",
            post(move |headers: HeaderMap| {
                let log = log.clone();
                async move {
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    log.lock().unwrap().push(key.trim_matches('"').to_owned());
                    StatusCode::CREATED
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });

        let generated = client().post(&url).body("{}").send().await.unwrap();
        let SentKey(key) = generated.extensions().get::<SentKey>().unwrap().clone();
        assert_eq!(seen.lock().unwrap()[0], &*key);
        let mine = "my-own-intent-key-000001";
        let given = client()
            .post(&url)
            .header("idempotency-key", mine)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(
            given.extensions().get::<SentKey>(),
            Some(&SentKey(mine.into()))
        );
        assert_eq!(seen.lock().unwrap()[1], mine);
    }

    #[tokio::test]
    async fn a_streamed_body_is_sent_once() {
        let (url, hits) = unavailable_server().await;
        let body = futures_util::stream::once(async {
            Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{}"))
        });
        let resp = client()
            .post(&url)
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }
}
