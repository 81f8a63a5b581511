//! A small payments service on axum, made idempotent with idem-http.
//!
//! `POST /payments` creates a payment. A client that does not know whether
//! its request went through (a timeout, a dropped connection) sends it
//! again with the same `Idempotency-Key` and gets the first answer back,
//! marked `Idempotent-Replayed: true`; the payment is made once. The same
//! key with another body is refused with 422, and a client that lost every
//! answer asks `GET /_idem/records/{key}` what became of its key.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = idem_sqlite::SqliteStore::open("payments.db")?;
//! let (app, handle) = axum_payments::app(store)?;
//! let stop = idem_http::maintenance::CancellationToken::new();
//! let _maintenance = axum_payments::maintenance(&handle).spawn(stop.clone());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! What it shows:
//!
//! - **The SQLite store** keeps the idempotency records, durably, so a
//!   retry after a restart still replays.
//! - **`route_layer`, not `layer`**: the layer wraps the payment routes
//!   only, so a POST to a mistyped path gets the router's 404 and leaves no
//!   record.
//! - **The `IdempotencyContext` extractor** (idem-http's `axum` feature):
//!   the handler learns the key it runs under, and keeps it with the
//!   payment.
//! - **Wait mode** on `POST /payments`: a duplicate that arrives while
//!   the first request still runs (a client that timed out and retried)
//!   waits up to 10 s for its answer and gets it as a replay, instead of
//!   a 409 to retry later (the default, `Concurrency::Conflict`).
//! - **A resource id**: the handler names the payment it made
//!   (`IdempotencyContext::set_resource_id`), and the read path gives it
//!   to a client that lost the answer.
//! - **The read path**, mounted after the layer so that the layer does not
//!   wrap it.
//! - **Maintenance** ([`maintenance`]): expired records purged, stale
//!   claims settled by their route's takeover policy, and the store
//!   watched for lost records; without it the SQLite file only grows.
//!
//! Payments live in memory here, to keep the example short; a real
//! service keeps them in its database. Records are scoped by the
//! `Authorization` header, which this example does not check: a real
//! service authenticates first. For the payment and its record committed
//! in one transaction (exactly once across crashes), see atomic mode in
//! the `idem-ledger` crate.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_core::{Concurrency, Policy, PolicyError, Store};
use idem_http::maintenance::Maintenance;
use idem_http::{IdempotencyContext, IdempotencyLayer, LayerHandle, Problem, RouteRule};
use serde::{Deserialize, Serialize};

/// What a client asks for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NewPayment {
    /// In the currency's smallest unit (cents); positive.
    pub amount: u64,
    /// An ISO 4217 code: three capital letters.
    pub currency: String,
    /// Who is paid.
    pub to: String,
}

/// A payment made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// `pay_` and a random UUID: never reused, not even after a restart
    /// (the records outlive this example's in-memory payments, and a
    /// replay's `Location` must never name another client's payment).
    pub id: String,
    /// As asked.
    pub amount: u64,
    /// As asked.
    pub currency: String,
    /// As asked.
    pub to: String,
}

/// The payments made, in memory (a real service keeps them in its
/// database, ideally in the store's atomic mode), with the key each was
/// made under, for reconciliation; keys are never shown.
#[derive(Debug, Default)]
struct Ledger {
    payments: Mutex<Vec<(Payment, String)>>,
}

/// How long a duplicate of a payment still running waits for its answer.
pub const PAYMENT_WAIT: Duration = Duration::from_secs(10);

/// The service over `store` (an `idem_sqlite::SqliteStore` in `main`),
/// and the layer's handle for maintenance and shutdown.
///
/// # Errors
/// The payment route's policy is invalid (it is not: a 10 s wait under
/// the default 24 h record lifetime).
pub fn app(store: impl Store) -> Result<(Router, LayerHandle), PolicyError> {
    // Wait mode: a duplicate in flight waits for the first answer and gets
    // it as a replay (409 if it takes longer than the limit).
    let payments = Policy::builder()
        .concurrency(Concurrency::Wait {
            limit: PAYMENT_WAIT,
        })
        .build()?;
    let layer = IdempotencyLayer::builder(store)
        .route(RouteRule::post("/payments").policy(payments))
        .build();
    let handle = layer.handle();
    let read_path = layer.read_path();
    let router = Router::new()
        .route("/payments", post(create_payment).get(list_payments))
        .route("/payments/{id}", get(get_payment))
        .with_state(Arc::new(Ledger::default()))
        // Only the routes above: unknown paths are the router's 404s.
        .route_layer(layer)
        // Added after the layer, so the layer does not wrap it.
        .route_service("/_idem/records/{key}", read_path);
    Ok((router, handle))
}

/// The layer's maintenance, to `spawn` next to the server: every minute,
/// expired records purged and stale claims (an executor that died
/// mid-request) settled by their route's takeover policy; and the store
/// watched, so that a store that lost records (restored from an old
/// backup, say) is noticed and no key executes twice in the loss window.
pub fn maintenance(handle: &LayerHandle) -> Maintenance {
    Maintenance::new(handle.store().clone())
        .reconcile(Arc::new(handle.takeover_reconciler()))
        .watch_store(handle.store_watch())
}

/// `POST /payments`: runs once per key; the layer answers every retry.
async fn create_payment(
    State(ledger): State<Arc<Ledger>>,
    ctx: IdempotencyContext,
    body: Result<Json<NewPayment>, JsonRejection>,
) -> Response {
    let new = match body {
        Ok(Json(new)) => new,
        Err(e) => return invalid(&e.body_text()),
    };
    if new.amount == 0 {
        return invalid("amount must be positive");
    }
    if new.currency.len() != 3 || !new.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return invalid("currency must be three capital letters (ISO 4217)");
    }
    let payment = {
        let mut payments = ledger
            .payments
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let payment = Payment {
            id: format!("pay_{}", uuid::Uuid::new_v4().simple()),
            amount: new.amount,
            currency: new.currency,
            to: new.to,
        };
        payments.push((payment.clone(), ctx.id().key.as_str().to_owned()));
        payment
    };
    // Kept with the record: `GET /_idem/records/{key}` names the payment.
    ctx.set_resource_id(&payment.id);
    let mut response = (StatusCode::CREATED, Json(&payment)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/payments/{}", payment.id)) {
        // Stored with the record, so a replay carries it too.
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// `GET /payments`: every payment, oldest first.
async fn list_payments(State(ledger): State<Arc<Ledger>>) -> Json<Vec<Payment>> {
    let payments = ledger
        .payments
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    Json(payments.iter().map(|(p, _)| p.clone()).collect())
}

/// `GET /payments/{id}`.
async fn get_payment(State(ledger): State<Arc<Ledger>>, Path(id): Path<String>) -> Response {
    let payments = ledger
        .payments
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match payments.iter().map(|(p, _)| p).find(|p| p.id == id) {
        Some(p) => Json(p).into_response(),
        None => problem(
            StatusCode::NOT_FOUND,
            "payment-not-found",
            "Payment not found",
            "No payment has this id.",
        ),
    }
}

/// 400: a request that can never succeed. The layer stores it as a
/// `failed` record and replays it, like a success.
fn invalid(detail: &str) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "invalid-payment",
        "Invalid payment",
        detail,
    )
}

/// An `application/problem+json` answer of this service's own, in the
/// shape idem's use.
fn problem(status: StatusCode, kind: &str, title: &'static str, detail: &str) -> Response {
    Problem::new(
        status,
        format!("urn:payments:problem:{kind}"),
        title,
        detail,
    )
    .into_response()
    .map(axum::body::Body::new)
}
