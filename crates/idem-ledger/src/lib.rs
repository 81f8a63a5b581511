//! A small ledger that shows idem's atomic mode: each transfer's rows, the
//! balance updates, and the completion of its idempotency record commit in
//! one transaction, so a crash can never leave a transfer without its
//! record (which a retry would execute again) or a record without its
//! transfer.
//!
//! - `POST /transfers` `{"from": "acct-1", "to": "acct-2", "amount": 100}`
//!   needs an `Idempotency-Key`; 201 with the transfer, or 422 for
//!   insufficient funds (a deterministic failure: stored and replayed).
//! - `GET /accounts/{id}`: the balance.
//! - `GET /total`: the sum of all balances (transfers conserve it).
//!
//! It runs on SQLite by default and on PostgreSQL when given a
//! `postgres://` URL. `idem demo` drives it under injected faults.
//!
//! The transfer is written once, here (`execute_transfer`: its checks, its
//! steps and its answers); each backend's module implements only the
//! transfer's few statements (`TransferStatements`: SQL text and driver
//! calls) and hands the transfer to its store's atomic mode.
//!
//! It is part of the product's demo, not a library to build on: `idem demo`
//! runs it (the `idem` binary, package `idem-cli`, depends on it, which is
//! why it is published), and it is the worked example of atomic mode that
//! the README points to. Its schema and error texts are the simplest that
//! make the point, and may change with the demo in any release.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idem_core::{
    Atomic, ClaimRequest, ClaimedAtomically, Completion, Fence, RecordId, StoreError,
    StoredResponse,
};
use idem_http::{IdempotencyContext, IdempotencyLayer, Problem, RouteRule, stored_to_response};
use serde::{Deserialize, Serialize};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod pg;
mod sqlite;

#[cfg(feature = "mysql")]
pub use mysql::MysqlLedger;
#[cfg(feature = "postgres")]
pub use pg::PostgresLedger;
pub use sqlite::SqliteLedger;

/// Set on responses of transfers that actually ran (committed or refused),
/// never on replays.
pub const EXECUTED: axum::http::HeaderName =
    axum::http::HeaderName::from_static("x-ledger-executed");

/// A transfer request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferRequest {
    /// Debited account.
    pub from: String,
    /// Credited account.
    pub to: String,
    /// Amount in cents; positive.
    pub amount: i64,
}

impl TransferRequest {
    /// Why the ledger refuses this transfer whatever the balances, if it
    /// does: checked by every path that reaches the ledger (HTTP, messages).
    pub fn invalid(&self) -> Option<&'static str> {
        (self.amount <= 0 || self.from == self.to)
            .then_some("amount must be positive and accounts distinct")
    }
}

/// A committed transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// Its id.
    pub id: i64,
    /// Debited account.
    pub from: String,
    /// Credited account.
    pub to: String,
    /// Amount in cents.
    pub amount: i64,
}

/// A ledger failure that is not the client's fault.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The idempotency store or the database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL failed.
    #[cfg(feature = "postgres")]
    #[error("postgres: {0}")]
    Postgres(#[from] idem_postgres::PgError),
    /// MySQL or MariaDB failed.
    #[cfg(feature = "mysql")]
    #[error("mysql: {0}")]
    Mysql(#[from] idem_mysql::MysqlError),
}

/// What a transfer attempt led to.
#[derive(Debug)]
pub enum Outcome {
    /// Committed (or refused for funds) together with its record; answer
    /// with this response.
    Done(StoredResponse),
    /// The claim was lost to a takeover; nothing was written.
    LostLease,
}

/// The operations the HTTP side needs, on either database.
pub trait Ledger: Send + Sync + 'static {
    /// Creates `n` accounts `acct-0`..`acct-{n-1}` with `balance` each,
    /// unless they exist.
    fn seed(&self, n: usize, balance: i64) -> impl Future<Output = Result<(), LedgerError>> + Send;
    /// Runs a transfer atomically with the completion of record `id`,
    /// claimed under `fence` (by the HTTP layer, or by a message consumer).
    fn transfer(
        &self,
        id: &RecordId,
        fence: Fence,
        req: TransferRequest,
    ) -> impl Future<Output = Result<Outcome, LedgerError>> + Send;
    /// Claims `req` and, when the key is acquired, runs the transfer and
    /// completes the record, all in one transaction (one commit); answers
    /// the stored response's body on a commit.
    fn transfer_claiming(
        &self,
        req: &ClaimRequest,
        transfer: TransferRequest,
    ) -> impl Future<Output = Result<ClaimedAtomically<Vec<u8>, LedgerError>, StoreError>> + Send;
    /// The same transfer in a transaction of its own, with no idempotency
    /// record: what a consumer without idem does (the baseline of
    /// `bench/consumer.sh`). Returns whether it moved money.
    fn transfer_unrecorded(
        &self,
        key: &str,
        req: TransferRequest,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;
    /// An account's balance.
    fn balance(
        &self,
        account: &str,
    ) -> impl Future<Output = Result<Option<i64>, LedgerError>> + Send;
    /// The sum of all balances.
    fn total(&self) -> impl Future<Output = Result<i64, LedgerError>> + Send;
    /// How many transfers carry this idempotency key (1 at most, ever).
    fn transfers_with_key(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<i64, LedgerError>> + Send;
    /// How many transfers there are.
    fn transfer_count(&self) -> impl Future<Output = Result<i64, LedgerError>> + Send;
}

fn json_response(status: u16, body: &serde_json::Value, content_type: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), content_type.as_bytes().to_vec())],
        body: body.to_string().into_bytes(),
        trailers: Vec::new(),
    }
}

/// The response and record of a committed transfer.
pub(crate) fn committed(t: &Transfer) -> Completion {
    let mut r = json_response(201, &serde_json::json!(t), "application/json");
    r.headers.push((
        "location".into(),
        format!("/transfers/{}", t.id).into_bytes(),
    ));
    Completion::completed(r).with_resource_id(t.id.to_string())
}

/// The record of a transfer refused whatever the balances (a message that
/// skipped the HTTP check): deterministic, replayed.
fn refused_invalid(why: &str) -> Completion {
    Completion::failed(
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "urn:idem-ledger:problem:invalid-transfer",
            "Invalid transfer",
            why,
        )
        .to_stored(),
    )
}

/// The response and record of a refusal for funds: deterministic, replayed.
fn insufficient(balance: i64, req: &TransferRequest) -> Completion {
    Completion::failed(
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "urn:idem-ledger:problem:insufficient-funds",
            "Insufficient funds",
            format!(
                "{} holds {balance}; the transfer needs {}",
                req.from, req.amount
            ),
        )
        .to_stored(),
    )
}

/// What a transfer found when it locked its two accounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockedAccounts {
    /// The debited account's balance; `None` when there is no such account.
    pub(crate) debited_balance: Option<i64>,
    /// Whether both the debited and the credited account exist.
    pub(crate) both_exist: bool,
}

/// The statements of a transfer on one backend, run on its connection
/// inside the transaction that also completes the idempotency record.
/// A backend implements these and nothing else of the transfer: which
/// statements run, in what order, and what the ledger answers are
/// [`execute_transfer`]'s, written once for every backend.
pub(crate) trait TransferStatements {
    /// The driver's error.
    type Error;

    /// Reads the two accounts, locking their rows (in one fixed order, so
    /// that concurrent transfers between the same pair cannot deadlock)
    /// where the database locks rows.
    async fn lock_accounts(
        &mut self,
        debited: &str,
        credited: &str,
    ) -> Result<LockedAccounts, Self::Error>;

    /// Adds `amount` to `account`'s balance (a negative amount debits it).
    async fn add_to_balance(&mut self, account: &str, amount: i64) -> Result<(), Self::Error>;

    /// Inserts the row of transfer `req`, made under idempotency key
    /// `key`, and returns the row's id.
    async fn insert_transfer(
        &mut self,
        key: &str,
        req: &TransferRequest,
    ) -> Result<i64, Self::Error>;
}

/// The transfer `req` under idempotency key `key`, on `statements`, and
/// the record it completes: refused when invalid or short of funds (both
/// deterministic, stored and replayed), otherwise the debit, the credit
/// and the transfer's row. The caller commits it together with the record.
pub(crate) async fn execute_transfer<S: TransferStatements>(
    mut statements: S,
    key: &str,
    req: &TransferRequest,
) -> Result<Completion, S::Error> {
    if let Some(why) = req.invalid() {
        return Ok(refused_invalid(why));
    }
    let accounts = statements.lock_accounts(&req.from, &req.to).await?;
    let funded = accounts.both_exist && accounts.debited_balance.is_some_and(|b| b >= req.amount);
    if !funded {
        return Ok(insufficient(accounts.debited_balance.unwrap_or(0), req));
    }
    // `req.amount` is positive (`invalid` refused it otherwise): negating
    // it cannot overflow.
    statements.add_to_balance(&req.from, -req.amount).await?;
    statements.add_to_balance(&req.to, req.amount).await?;
    let id = statements.insert_transfer(key, req).await?;
    Ok(committed(&Transfer {
        id,
        from: req.from.clone(),
        to: req.to.clone(),
        amount: req.amount,
    }))
}

/// A transfer's record, with the response [`Ledger::transfer`] answers.
pub(crate) fn with_response(completion: Completion) -> (StoredResponse, Completion) {
    (completion.response.clone(), completion)
}

/// A transfer's record, with the body [`Ledger::transfer_claiming`]
/// answers.
pub(crate) fn with_body(completion: Completion) -> (Vec<u8>, Completion) {
    (completion.response.body.clone(), completion)
}

/// Whether a transfer's record says it moved money, as
/// [`Ledger::transfer_unrecorded`] answers.
pub(crate) fn moved_money(completion: &Completion) -> bool {
    completion.status() == idem_core::Status::Completed
}

fn problem(status: StatusCode, title: &'static str, detail: &str) -> Response {
    Problem::new(status, "about:blank", title, detail)
        .into_response()
        .map(axum::body::Body::new)
}

async fn transfer<L: Ledger>(
    State(ledger): State<Arc<L>>,
    ctx: Option<Extension<IdempotencyContext>>,
    body: Result<Json<TransferRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(Extension(ctx)) = ctx else {
        return problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Not protected",
            "the idempotency layer is missing",
        );
    };
    let Ok(Json(req)) = body else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Invalid transfer",
            "expected {\"from\", \"to\", \"amount\"}",
        );
    };
    if let Some(why) = req.invalid() {
        return problem(StatusCode::BAD_REQUEST, "Invalid transfer", why);
    }
    match ledger.transfer(ctx.id(), ctx.fence(), req).await {
        Ok(Outcome::Done(stored)) => {
            ctx.mark_completed();
            let mut response = stored_to_response(&stored).map(axum::body::Body::new);
            // Not stored, so never on a replay: lets observers count real
            // executions.
            response
                .headers_mut()
                .insert(EXECUTED, axum::http::HeaderValue::from_static("1"));
            response
        }
        // Another executor took over: let the client retry and replay it.
        Ok(Outcome::LostLease) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Retry",
            "the transfer is being handled elsewhere",
        ),
        Err(e) => {
            tracing::error!(error = %e, "transfer failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Ledger unavailable",
                "the transfer was not made; retry with the same key",
            )
        }
    }
}

async fn balance<L: Ledger>(State(ledger): State<Arc<L>>, Path(id): Path<String>) -> Response {
    match ledger.balance(&id).await {
        Ok(Some(b)) => Json(serde_json::json!({ "id": id, "balance": b })).into_response(),
        Ok(None) => problem(StatusCode::NOT_FOUND, "No such account", &id),
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Ledger unavailable",
            &e.to_string(),
        ),
    }
}

async fn total<L: Ledger>(State(ledger): State<Arc<L>>) -> Response {
    match (ledger.total().await, ledger.transfer_count().await) {
        (Ok(total), Ok(transfers)) => {
            Json(serde_json::json!({ "total": total, "transfers": transfers })).into_response()
        }
        (Err(e), _) | (_, Err(e)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Ledger unavailable",
            &e.to_string(),
        ),
    }
}

/// The ledger's router behind `layer`. The layer should protect
/// `POST /transfers` (see [`transfer_rule`]).
pub fn router<L: Ledger>(ledger: Arc<L>, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route("/transfers", post(transfer::<L>))
        .route("/accounts/{id}", get(balance::<L>))
        .route("/total", get(total::<L>))
        .layer(layer)
        .with_state(ledger)
}

/// The rule for `POST /transfers`: the key binds from, to and amount.
pub fn transfer_rule() -> RouteRule {
    RouteRule::post("/transfers")
        .fingerprint_fields(["/from", "/to", "/amount"])
        // Atomic mode: a transfer's record completes in the transaction
        // that moves the money, so a claim left in progress by a crash is a
        // transfer that never committed, and running it again is safe.
        .takeover(idem_core::Takeover::Reexecute)
}

/// A boxed error, as [`idem_core::Reconcile`] returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Recovery's rule for the ledger: a stale transfer whose row exists
/// happened, and is completed with the response it would have had; one
/// without a row did not, and is released so a retry makes it. (In atomic
/// mode a row never exists without its completed record, so stale records
/// are always released; a ledger that wrote rows outside the transaction
/// would need the first branch.)
pub(crate) fn resolve(
    record: &idem_core::Record,
    transfer: Option<Transfer>,
) -> Result<idem_core::Resolution, BoxError> {
    if record.id.operation.as_str() != "POST /transfers" {
        return Ok(idem_core::Resolution::Leave);
    }
    Ok(match transfer {
        Some(t) => idem_core::Resolution::Complete(committed(&t)),
        None => idem_core::Resolution::Release,
    })
}

/// Maps an atomic-mode result to an [`Outcome`].
pub(crate) fn outcome<E>(a: Atomic<StoredResponse, E>) -> Result<Outcome, E> {
    match a {
        Atomic::Committed(r) => Ok(Outcome::Done(r)),
        Atomic::Failed(e) => Err(e),
        Atomic::StaleFence => Ok(Outcome::LostLease),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test: a panic is a failed assertion
mod transfer_answers {
    //! What [`execute_transfer`](super::execute_transfer) answers on each
    //! backend, through the three ways in ([`Ledger::transfer`],
    //! [`Ledger::transfer_claiming`], [`Ledger::transfer_unrecorded`]):
    //! the same answers everywhere. Not the ledger under load
    //! (`tests/ledger.rs`) nor its recovery (`tests/recovery.rs`).

    use idem_core::{Atomic, Claim, ClaimedAtomically, Status, Store, Timestamp};
    use idem_testkit::{request, unique_id};

    use super::{Ledger, Outcome, TransferRequest};

    fn transfer(from: &str, to: &str, amount: i64) -> TransferRequest {
        TransferRequest {
            from: from.into(),
            to: to.into(),
            amount,
        }
    }

    /// The stored body of a transfer claimed and run under a new key.
    async fn claimed_body<L: Ledger>(
        ledger: &L,
        key: &str,
        req: TransferRequest,
    ) -> serde_json::Value {
        let claim = request(&unique_id(key), "{}", Timestamp::now());
        match ledger.transfer_claiming(&claim, req).await.unwrap() {
            ClaimedAtomically::Ran(Atomic::Committed(body)) => {
                serde_json::from_slice(&body).unwrap()
            }
            ClaimedAtomically::Ran(Atomic::Failed(e)) => panic!("{key}: {e}"),
            _ => panic!("{key}: not run"),
        }
    }

    fn assert_refused(body: &serde_json::Value, problem: &str, detail: &str) {
        assert_eq!(
            body["type"],
            format!("urn:idem-ledger:problem:{problem}"),
            "{body}"
        );
        assert_eq!(body["status"], 422, "{body}");
        assert_eq!(body["detail"], detail, "{body}");
    }

    async fn check<L: Ledger, S: Store>(ledger: &L, store: &S) {
        ledger.seed(3, 100).await.unwrap();
        let unrecorded = [
            (transfer("acct-0", "acct-1", 30), true),
            (transfer("acct-0", "acct-1", 71), false),
            (transfer("acct-0", "acct-1", 70), true),
            (transfer("acct-2", "nobody", 10), false),
            (transfer("nobody", "acct-2", 10), false),
            (transfer("acct-2", "acct-1", 0), false),
            (transfer("acct-2", "acct-2", 10), false),
        ];
        for (n, (req, moved)) in unrecorded.into_iter().enumerate() {
            let what = format!("{req:?}");
            let key = format!("unrecorded-{n}");
            assert_eq!(
                ledger.transfer_unrecorded(&key, req).await.unwrap(),
                moved,
                "{what}"
            );
            assert_eq!(
                ledger.transfers_with_key(&key).await.unwrap(),
                i64::from(moved),
                "{what}"
            );
        }
        for (account, balance) in [
            ("acct-0", Some(0)),
            ("acct-1", Some(200)),
            ("acct-2", Some(100)),
            ("nobody", None),
        ] {
            assert_eq!(ledger.balance(account).await.unwrap(), balance, "{account}");
        }

        let made = claimed_body(ledger, "claimed-made", transfer("acct-1", "acct-2", 50)).await;
        assert_eq!(
            (&made["from"], &made["to"], &made["amount"]),
            (&"acct-1".into(), &"acct-2".into(), &50.into()),
            "{made}"
        );
        assert!(made["id"].is_i64(), "{made}");
        assert_eq!(ledger.transfers_with_key("claimed-made").await.unwrap(), 1);
        let short = claimed_body(ledger, "claimed-short", transfer("acct-0", "acct-1", 1)).await;
        assert_refused(
            &short,
            "insufficient-funds",
            "acct-0 holds 0; the transfer needs 1",
        );
        let no_payer =
            claimed_body(ledger, "claimed-no-payer", transfer("nobody", "acct-1", 5)).await;
        assert_refused(
            &no_payer,
            "insufficient-funds",
            "nobody holds 0; the transfer needs 5",
        );
        let no_payee =
            claimed_body(ledger, "claimed-no-payee", transfer("acct-1", "nobody", 5)).await;
        assert_refused(
            &no_payee,
            "insufficient-funds",
            "acct-1 holds 150; the transfer needs 5",
        );
        let invalid =
            claimed_body(ledger, "claimed-invalid", transfer("acct-1", "acct-2", -5)).await;
        assert_refused(
            &invalid,
            "invalid-transfer",
            "amount must be positive and accounts distinct",
        );

        let id = unique_id("recorded");
        let Claim::Acquired(lease) = store
            .claim(&request(&id, "{}", Timestamp::now()))
            .await
            .unwrap()
        else {
            panic!("recorded: not acquired");
        };
        let Outcome::Done(answer) = ledger
            .transfer(&id, lease.fence, transfer("acct-2", "acct-0", 25))
            .await
            .unwrap()
        else {
            panic!("recorded: lost its lease");
        };
        assert_eq!(answer.status, 201);
        let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        let location = format!("/transfers/{}", body["id"]).into_bytes();
        assert!(
            answer
                .headers
                .iter()
                .any(|(name, value)| name == "location" && *value == location),
            "{:?}",
            answer.headers
        );
        let record = store.get(&id, Timestamp::now()).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Completed);
        assert_eq!(record.response.as_ref(), Some(&answer));

        assert_eq!(ledger.total().await.unwrap(), 300);
        assert_eq!(ledger.transfer_count().await.unwrap(), 4);
        assert_eq!(ledger.balance("acct-0").await.unwrap(), Some(25));
    }

    #[tokio::test]
    async fn on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = super::SqliteLedger::open(dir.path().join("ledger.db")).unwrap();
        check(&ledger, ledger.store()).await;
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn on_postgres() {
        let Some(url) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
            return;
        };
        let store = idem_postgres::PostgresStore::builder(url)
            .schema(idem_testkit::unique_name("ledger"))
            .connect()
            .await
            .unwrap();
        let ledger = super::PostgresLedger::new(store.clone()).await.unwrap();
        check(&ledger, &store).await;
        store.drop_schema().await.unwrap();
    }

    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn on_mysql() {
        let Some(url) = idem_testkit::backend_url("IDEM_TEST_MYSQL_URL", "MySQL") else {
            return;
        };
        let store = idem_mysql::MysqlStore::builder(url)
            .database(idem_testkit::unique_name("ledger"))
            .connect()
            .await
            .unwrap();
        let ledger = super::MysqlLedger::new(store.clone()).await.unwrap();
        check(&ledger, &store).await;
        store.drop_database().await.unwrap();
    }
}

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
