//! The client half of idem: retries that cannot become a retry storm.
//!
//! A logical call gets one `Idempotency-Key` (a UUID v4 unless you give
//! one), sent unchanged on every attempt, so the server executes it once
//! however often it is retried. A generated or given key goes out as an
//! RFC 8941 sf-string, `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`,
//! as draft-ietf-httpapi-idempotency-key-header writes it (idem's server
//! reads that and the bare form as the same key); a key header the
//! request already carries goes out exactly as written. Each failure is classified (docs/contract.md,
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
//! let replayed = resp.headers().contains_key(idem_retry::header_names::IDEMPOTENT_REPLAYED);
//! println!("{} replayed={replayed}", resp.status());
//! # Ok(()) }
//! ```
//!
//! ## When a call fails
//!
//! A call that got an answer returns it, whatever its status: after the
//! last attempt, or when the retry budget or the deadline stopped it. A
//! transport failure (connection refused, timeout) comes back as reqwest
//! gave it, `reqwest_middleware::Error::Reqwest`, whether or not it was
//! retried first. Failures the engine makes itself are a [`RetryError`]
//! inside `reqwest_middleware::Error::Middleware`:
//!
//! ```no_run
//! # #[cfg(feature = "reqwest")]
//! # async fn run(client: reqwest_middleware::ClientWithMiddleware) {
//! use idem_retry::RetryError;
//!
//! match client.post("http://127.0.0.1:8080/transfers").body("{}").send().await {
//!     Ok(resp) => println!("answered {}", resp.status()),
//!     Err(reqwest_middleware::Error::Middleware(e)) => match e.downcast_ref::<RetryError>() {
//!         // The server forgets the key before the next retry could go:
//!         // retrying would execute the request again.
//!         Some(RetryError::KeyExpired { expires_at, attempts, .. }) => {
//!             println!("gave up after {attempts} attempts; key expired at {expires_at:?}")
//!         }
//!         // The request's Idempotency-Key is not a key; nothing was sent.
//!         Some(RetryError::InvalidKey(why)) => println!("not sent: {why}"),
//!         Some(other) => println!("{other}"),
//!         None => println!("another middleware failed: {e:#}"),
//!     },
//!     Err(e) => println!("transport: {e}"),
//! }
//! # }
//! ```
//!
//! `RetryError` without a type parameter is `RetryError<Infallible>`: the
//! engine's failures carry no transport error, so that is the type the
//! middleware puts in the `anyhow::Error`.
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
/// Why a key cannot be sent ([`RetryError::InvalidKey`]).
pub use idem_core::KeyError;
/// The header names of the contract, shared with the server crates.
pub use idem_core::header_names;
pub use observe::{Observation, ObserveError, ObserveResponse, Observed, parse_retry_after};
pub use policy::{RefreshHook, RetryPolicy, RetryPolicyBuilder};
#[cfg(feature = "reqwest")]
pub use reqwest_mw::{RetryMiddleware, SentKey};
#[cfg(feature = "tower")]
pub use tower_layer::{RetryLayer, RetryService};

/// The README's example, compiled by `cargo test --doc` (it uses reqwest).
#[cfg(all(doctest, feature = "reqwest"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The project README's Rust examples (the HTTP layer and the retry
/// client), compiled by `cargo test --doc -p idem-retry`: this crate's
/// tests have every crate they use.
#[cfg(all(doctest, feature = "reqwest"))]
#[doc = include_str!("../../../README.md")]
struct ProjectReadmeDoctests;
