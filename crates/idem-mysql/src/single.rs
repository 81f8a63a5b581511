//! The pool and one call at a time: what the store's batchers fall back
//! to (a call alone, or each call of a batch the server refused), and
//! what atomic mode and the batches share (the id check, the claim's
//! parameters, the completion statement).

use std::time::Duration;

use idem_core::{Claim, ClaimRequest, Completion, RecordId, Settled, StoreError, StoreErrorKind};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row};

use crate::error::{DeadlockRetries, my_error};
use crate::row;
use crate::schema::Statements;

/// What the store's clones and its batchers share: the pool, the
/// statements and the server's limits.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) wait: Duration,
    /// The server's `max_allowed_packet`: a completion must fit in it.
    pub(crate) max_packet: u64,
    pub(crate) database: String,
    pub(crate) sql: Statements,
}

fn millis(v: Duration) -> i64 {
    i64::try_from(v.as_millis()).unwrap_or(i64::MAX)
}

/// The longest scope, operation and key the columns hold (bytes).
const MAX_SCOPE: usize = 512;
const MAX_OPERATION: usize = 1024;
const MAX_KEY: usize = 255;

/// Refuses an id the columns cannot hold whole: never truncated into
/// another record's id, and a clear error instead of the server's.
pub(crate) fn check_id(id: &RecordId) -> Result<(), StoreError> {
    for (what, len, max) in [
        ("scope", id.scope.as_str().len(), MAX_SCOPE),
        ("operation", id.operation.as_str().len(), MAX_OPERATION),
        ("key", id.key.as_str().len(), MAX_KEY),
    ] {
        if len > max {
            return Err(StoreError::new(
                StoreErrorKind::Backend,
                format!(
                    "mysql store: the {what} is {len} bytes, longer than the {max} it can hold"
                ),
            ));
        }
    }
    Ok(())
}

/// The claim procedures' parameters, in their order.
pub(crate) fn claim_params(req: &ClaimRequest) -> (&str, &str, &str, &[u8], i64, i64, i64) {
    (
        req.id.scope.as_str(),
        req.id.operation.as_str(),
        req.id.key.as_str(),
        req.fingerprint.as_bytes(),
        req.now.as_millis(),
        millis(req.lease),
        millis(req.ttl),
    )
}

impl Inner {
    /// A pooled connection, within the connect timeout.
    pub(crate) async fn conn(&self) -> Result<Conn, StoreError> {
        match tokio::time::timeout(self.wait, self.pool.get_conn()).await {
            Ok(conn) => conn.map_err(|e| my_error("connecting", e)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "mysql store: no connection available",
            )),
        }
    }

    /// Refuses a completion the server would not take in one packet
    /// (`max_allowed_packet`): a clear error before the effect's record is
    /// attempted, instead of a broken connection. Keep the gateway's
    /// `--max-response` below it.
    pub(crate) fn check_fits(&self, completion: &Completion) -> Result<(), StoreError> {
        let size = completion.response.body.len()
            + completion.response.encode_headers().len()
            + completion.resource_id.as_ref().map_or(0, String::len)
            + 4096;
        if size as u64 > self.max_packet {
            return Err(StoreError::new(
                StoreErrorKind::Backend,
                format!(
                    "mysql store: a completion of {size} bytes does not fit the server's max_allowed_packet ({})",
                    self.max_packet
                ),
            ));
        }
        Ok(())
    }

    /// How long a call the batchers run may take before it is dropped
    /// mid-flight, its connection with it: calls run in the batchers'
    /// tasks, which no caller's deadline cuts off, and a server that stops
    /// answering without a word would otherwise hold them (and their
    /// connections) until TCP gives up, minutes later.
    pub(crate) fn call_bound(&self) -> Duration {
        self.wait * 2
    }

    /// `call` within [`call_bound`](Self::call_bound); past it, dropped
    /// with its connection, and the outcome is unknown (`Unavailable`).
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.call_bound(), call).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("mysql store: {what}: no answer in time"),
            )),
        }
    }

    /// One claim in a transaction of its own (the claim procedure's).
    pub(crate) async fn claim_one(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        check_id(&req.id)?;
        self.bounded("claiming", async {
            let mut conn = self.conn().await?;
            let params = claim_params(req);
            let mut retries = DeadlockRetries::default();
            let row: Option<Row> = loop {
                let answer = conn.exec_first(&self.sql.claim, params).await;
                if !retries.again(&answer) {
                    break answer.map_err(|e| my_error("claiming", e))?;
                }
            };
            row::claim_from_row(req, row.as_ref())
        })
        .await
    }

    /// One completion, autocommitted.
    pub(crate) async fn complete_one(
        &self,
        id: &RecordId,
        fence: i64,
        completion: &Completion,
    ) -> Result<Settled, StoreError> {
        self.bounded("completing", async {
            let mut conn = self.conn().await?;
            complete_with(&mut conn, &self.sql.complete, id, fence, completion).await
        })
        .await
    }

    /// One release, autocommitted.
    pub(crate) async fn release_one(
        &self,
        id: &RecordId,
        fence: i64,
    ) -> Result<Settled, StoreError> {
        self.bounded("releasing", async {
            let mut conn = self.conn().await?;
            conn.exec_drop(
                &self.sql.release,
                (
                    id.scope.as_str(),
                    id.operation.as_str(),
                    id.key.as_str(),
                    fence,
                ),
            )
            .await
            .map_err(|e| my_error("releasing", e))?;
            Ok(Settled::from_changed(conn.affected_rows()))
        })
        .await
    }
}

/// The completion statement, on a pooled connection ([`Store::complete`])
/// or inside an atomic-mode transaction.
pub(crate) async fn complete_with<Q: Queryable + AffectedRows>(
    conn: &mut Q,
    sql: &str,
    id: &RecordId,
    fence: i64,
    c: &Completion,
) -> Result<Settled, StoreError> {
    conn.exec_drop(
        sql,
        (
            c.status().code(),
            c.resource_id.as_deref(),
            i32::from(c.response.status),
            c.response.encode_headers(),
            c.response.body.as_slice(),
            id.scope.as_str(),
            id.operation.as_str(),
            id.key.as_str(),
            fence,
        ),
    )
    .await
    .map_err(|e| my_error("completing", e))?;
    Ok(Settled::from_changed(conn.changed()))
}

/// How many rows the last statement changed, on a connection or inside a
/// transaction.
pub(crate) trait AffectedRows {
    fn changed(&self) -> u64;
}

impl AffectedRows for Conn {
    fn changed(&self) -> u64 {
        self.affected_rows()
    }
}
