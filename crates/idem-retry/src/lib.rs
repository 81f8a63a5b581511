//! The client half of idem: retries that cannot become a retry storm.
//!
//! A logical call gets one `Idempotency-Key` (a UUID v4 unless you give
//! one), sent unchanged on every attempt, so the server executes it once
//! however often it is retried. Each failure is classified (docs/contract.md,
//! *Retries*): a request that was never sent is always retried; one that
//! may have reached the server only if it is repeatable (it has a key, or
//! an idempotent method such as GET or PUT), and then for an unknown
//! outcome, 409, 408, 425, 429 and 5xx, with backoff, honouring
//! `Retry-After`; 4xx never (401/403 once after a credential refresh).
//! Delays are exponential with
//! full jitter; retries are spent from a budget shared by the whole client;
//! and no retry is sent after the key's `Idempotency-Key-Expires`.
//!
//! # With reqwest
//!
//! ```no_run
//! # #[cfg(feature = "reqwest")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_retry::{RetryMiddleware, RetryPolicy};
//!
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(RetryPolicy::default()))
//!     .build();
//! // POSTs get a generated Idempotency-Key unless they carry one.
//! let resp = client
//!     .post("http://127.0.0.1:8080/transfers")
//!     .header("content-type", "application/json")
//!     .body(r#"{"from":"a","to":"b","amount":100}"#)
//!     .send()
//!     .await?;
//! println!("{} replayed={}", resp.status(), resp.headers().contains_key("idempotent-replayed"));
//! # Ok(()) }
//! ```
//!
//! # With tower (hyper clients)
//!
//! ```no_run
//! # #[cfg(feature = "tower")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use idem_retry::{RetryLayer, RetryPolicy};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! let hyper = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let mut client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(RetryPolicy::default()))
//!     .service(hyper);
//! let req = http::Request::post("http://127.0.0.1:8080/transfers")
//!     .body(Full::new(Bytes::from_static(b"{}")))?;
//! let resp = client.ready().await?.call(req).await?;
//! println!("{}", resp.status());
//! # Ok(()) }
//! ```
//!
//! # Any transport
//!
//! [`Retrier::call`] takes a closure that makes one attempt with the
//! [`Attempt`] it is given; implement [`ObserveResponse`] and
//! [`ObserveError`] for your transport's types.

mod backoff;
mod budget;
mod classify;
mod engine;
mod observe;
mod policy;
#[cfg(feature = "reqwest")]
mod reqwest_mw;
#[cfg(feature = "tower")]
mod tower_layer;

pub use backoff::{Backoff, Jitter};
pub use budget::RetryBudget;
pub use classify::{CallKind, Classify, Decision, DefaultClassifier, Reason};
pub use engine::{
    Attempt, CallReport, CallSpec, CallState, KeyMode, Retrier, RetryError, Step, Stop, names,
};
pub use observe::{Observation, ObserveError, ObserveResponse, Observed, parse_retry_after};
pub use policy::{RefreshHook, RetryPolicy, RetryPolicyBuilder};
#[cfg(feature = "reqwest")]
pub use reqwest_mw::RetryMiddleware;
#[cfg(feature = "tower")]
pub use tower_layer::{RetryLayer, RetryService};
