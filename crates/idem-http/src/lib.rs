//! The server half of idem: a tower [`Layer`](tower::Layer) that gives any
//! hyper or axum service the idempotency contract of docs/contract.md, *The HTTP contract*.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idem_core::MemoryStore;
//! use idem_http::{IdempotencyLayer, RouteRule};
//!
//! # async fn run() {
//! let layer = IdempotencyLayer::builder(MemoryStore::new())
//!     .route(RouteRule::post("/transfers").fingerprint_fields(["/from", "/to", "/amount"]))
//!     .build();
//! let app = Router::new()
//!     .route("/transfers", post(|| async { "done" }))
//!     // `route_layer`, not `layer`: see "With axum" below.
//!     .route_layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # }
//! ```
//!
//! # What a request goes through
//!
//! 1. **Route.** The first [`RouteRule`] matching the method and path
//!    decides; POST and PATCH on other paths get the default rule (key
//!    required, literal path as operation); anything else passes through.
//! 2. **Key.** One `Idempotency-Key` header, an sf-string or bare value,
//!    passing [`idem_core::KeyPolicy`]. Missing, repeated or invalid: 400.
//! 3. **Scope.** From `Authorization` by default ([`ScopeSource`]): two
//!    credentials using one key have two records, and neither sees the other's.
//!    A scope header that is missing, repeated or empty is a 400, never a
//!    shared scope; `require_scope` refuses callers without a credential.
//! 4. **Body.** Read up to the limit (413 beyond) within the body deadline
//!    (408 beyond) and fingerprinted with the method, the route, the actual
//!    path and query, and the media type (JSON compared by value, numbers
//!    exactly).
//! 5. **Claim.** The store decides, within the store deadline: a different
//!    fingerprint is 422; a finished record is replayed with
//!    `Idempotent-Replayed: true`; an in-flight one is 409 with
//!    `Retry-After`, or in wait mode the request waits for it; a store
//!    failure or a missed deadline is 503 and nothing runs.
//! 6. **Execute.** The handler runs in a task of its own, so a client that
//!    hangs up does not cancel it. 2xx/3xx are stored as `completed`,
//!    deterministic 4xx as `failed`; 5xx, 408, 409, 425, 429, a panic or a
//!    failing body release the claim so a retry executes again. A response
//!    marked [`OutcomeUnknown`] keeps the claim until its lease ends. A
//!    response over the response limit reaches the client whole, and the
//!    record keeps a `response-not-stored` problem instead of its body.
//!
//! Every response to a keyed request carries `Idempotency-Key-Expires`.
//! Every error is `application/problem+json` ([`Problem`], [`Rejection`]).
//!
//! # With axum
//!
//! Add the layer with [`Router::route_layer`](https://docs.rs/axum/0.8/axum/struct.Router.html#method.route_layer),
//! after the routes it protects. `Router::layer` also wraps the fallback,
//! so a POST to a path that has no route would be handled as a protected
//! one: without a key it gets 400 instead of 404, and with a key it is
//! claimed and its 404 stored as a `failed` record, replayed for the key's
//! lifetime (24 h by default) even after the route is deployed, at the
//! cost of a store write for every path a client probes. Under
//! `route_layer` such a request gets the router's 404 and leaves no
//! record. Routes added after it (the read path below) are not wrapped.
//!
//! With the `axum` feature, [`IdempotencyContext`] is an extractor: a
//! handler takes `ctx: IdempotencyContext` (the claim the layer holds for
//! this request), or `Option<IdempotencyContext>` on a route whose key is
//! optional. Without the layer the extractor answers 500
//! ([`MissingIdempotencyContext`], `urn:idem:problem:layer-missing`) and
//! the handler does not run. A complete service, with the SQLite store
//! and the read path: `examples/axum-payments` in the repository.
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::post};
//! use idem_http::{IdempotencyContext, IdempotencyLayer};
//!
//! async fn create_payment(ctx: IdempotencyContext, body: String) -> String {
//!     // The record this request executes under; a retry never gets here.
//!     format!("payment for key {} ({} bytes)", ctx.id().key.as_str(), body.len())
//! }
//!
//! let layer = IdempotencyLayer::new(idem_core::MemoryStore::new());
//! let read_path = layer.read_path();
//! let app: Router = Router::new()
//!     .route("/payments", post(create_payment))
//!     .route_layer(layer)
//!     .route_service("/_idem/records/{key}", read_path);
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! # Reading a record
//!
//! [`IdempotencyLayer::read_path`] is a service answering
//! `GET /_idem/records/{key}` with the caller's own record (scoped as the
//! layer scopes requests): a client that timed out can learn what became of
//! its key with only the key and its credential.
//!
//! # Atomic mode
//!
//! With a SQL store the handler can commit its mutation and the record in
//! one transaction: it reads [`IdempotencyContext`] from the request
//! extensions (or takes it as an extractor, with the `axum` feature),
//! calls the store's `complete_atomically`, then
//! [`IdempotencyContext::mark_completed`]. See the `idem-ledger` crate (`crates/idem-ledger`).
//!
//! # Shutdown
//!
//! [`LayerHandle::shutdown`] lets running handlers finish for a grace
//! period and then cancels the rest, releasing their claims: only shutdown
//! cancels a handler.

mod body;
mod context;
#[cfg(feature = "axum")]
mod extract;
mod flow;
pub mod grpc;
mod key_header;
mod layer;
pub mod maintenance;
pub mod metrics;
mod pending;
mod problem;
mod read_path;
mod rejection;
mod replay;
mod replay_cache;
#[cfg(feature = "axum")]
mod route_check;
mod rule;
mod service;
mod shared;
pub mod store_watch;
mod wait;

pub use body::{Body, BoxError, boxed, full, full_with_trailers};
pub use context::IdempotencyContext;
#[cfg(feature = "axum")]
pub use extract::MissingIdempotencyContext;
pub use flow::{OutcomeUnknown, UnverifiedEnd};
pub use key_header::{IDEM_TAKEOVER, IDEMPOTENCY_KEY};
pub use layer::{DEFAULT_REPLAY_CACHE, IdempotencyLayer, IdempotencyLayerBuilder, LayerHandle};
pub use problem::{PROBLEM_JSON, Problem};
pub use read_path::{ReadPath, RecordView, ResponseView, lookup};
pub use rejection::Rejection;
pub use replay::{
    DEFAULT_STORED_HEADERS, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENT_REPLAYED, http_date,
    stored_to_response,
};
#[cfg(feature = "axum")]
pub use route_check::{RouteFinding, RouteProblem};
pub use rule::{
    KeyRequirement, MAX_SCOPE_HEADER_LEN, PathPattern, RouteRule, ScopeError, ScopeFn, ScopeSource,
};
pub use service::{Idempotency, ResponseFuture};

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
