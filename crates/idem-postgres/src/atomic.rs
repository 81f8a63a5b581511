//! Atomic mode: the business mutation and the record's completion in one
//! PostgreSQL transaction.
//!
//! Only the path where the mutation succeeded and the completion was
//! applied commits. In two-commit mode ([`PostgresStore::complete_atomically`])
//! every error after the transaction began returns before the commit, and
//! the dropped `Transaction` is rolled back (tokio-postgres sends the
//! ROLLBACK before the connection serves anything else). In one-commit
//! mode ([`PostgresStore::claim_and_complete_atomically`]) the `COMMIT` is
//! pipelined behind the completion, and the server refuses to run it unless
//! that completion ran in the same transaction (see there). In both, an
//! error at the commit itself leaves the outcome unknown.

use deadpool_postgres::{Client, Transaction};
use idem_core::{
    Atomic, BoxFuture, Claim, ClaimRequest, ClaimedAtomically, Completion, Fence, Lease, RecordId,
    Settled, StoreError, Timestamp,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::error::{corrupt, pg_error, pool_error};
use crate::pooled::Pooled;
use crate::single::complete_with;
use crate::store::PostgresStore;

impl PostgresStore {
    /// Runs `mutation` inside a transaction that first locks the record
    /// (checking that `fence` is still current), then stores the returned
    /// [`Completion`] and commits both.
    ///
    /// While the transaction is open the record's row is locked: a claim
    /// that would take over the lease waits for the commit and then sees the
    /// completed record, so a takeover can never run beside a live atomic
    /// executor.
    ///
    /// Dropping the returned future before it finishes rolls the
    /// transaction back (tokio-postgres rolls back a dropped transaction),
    /// and so does a crash: then neither the mutation nor the completion
    /// happened, and the record waits for its lease to run out.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails (including at commit: then the
    /// outcome is unknown, and a retry after the lease finds out which).
    pub async fn complete_atomically<T, E, F>(
        &self,
        id: &RecordId,
        fence: Fence,
        mutation: F,
    ) -> Result<Atomic<T, E>, StoreError>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<(T, Completion), E>>,
    {
        let Some(fence) = fence.to_i64() else {
            return Ok(Atomic::StaleFence);
        };
        // Dropped mid-call, the connection leaves the pool (see
        // `crate::pooled`).
        let mut client = Pooled::get(&self.inner.pool).await?;
        let answer: Result<Atomic<T, E>, StoreError> = async {
            let tx = client
                .transaction()
                .await
                .map_err(|e| pg_error("beginning an atomic transaction", e))?;
            let lock = tx
                .prepare_cached(&self.inner.sql.lock)
                .await
                .map_err(|e| pg_error("preparing the record lock", e))?;
            let held = tx
                .query_opt(
                    &lock,
                    &[
                        &id.scope.as_str(),
                        &id.operation.as_str(),
                        &id.key.as_str(),
                        &fence,
                    ],
                )
                .await
                .map_err(|e| pg_error("locking the record", e))?;
            if held.is_none() {
                let _ = tx.rollback().await;
                return Ok(Atomic::StaleFence);
            }
            let (value, completion) = match mutation(&tx).await {
                Ok(done) => done,
                Err(e) => {
                    let _ = tx.rollback().await;
                    return Ok(Atomic::Failed(e));
                }
            };
            match complete_with(&tx, &self.inner.sql.complete, id, fence, &completion).await? {
                Settled::Applied => {}
                // Unreachable while we hold the row lock, but never commit a
                // mutation whose record we could not complete.
                Settled::StaleFence => {
                    let _ = tx.rollback().await;
                    return Ok(Atomic::StaleFence);
                }
            }
            tx.commit()
                .await
                .map_err(|e| pg_error("committing an atomic transaction", e))?;
            Ok(Atomic::Committed(value))
        }
        .await;
        client.answered(answer)
    }

    /// Claims `req` inside a transaction and, when the key is acquired,
    /// runs `mutation` and stores the returned [`Completion`] in the same
    /// transaction: one commit for the claim, the mutation and the
    /// completion, instead of a claim's commit and then
    /// [`complete_atomically`](Self::complete_atomically)'s.
    ///
    /// `mutation` gets the pooled connection, already inside the
    /// transaction: run its statements on it, and do not commit, roll
    /// back or open another transaction there. The transaction is begun
    /// in the same round trip as the claim of a new key, and the completion
    /// is sent with the `COMMIT`, so a new key's record adds no round trip
    /// to the mutation's own statements once the connection has prepared
    /// them (docs/benchmarks-history.md, message consumers); a key that
    /// has a record costs one more, to judge it.
    ///
    /// The pipelining is guarded in the server, not by the order of
    /// answers: the claim inserts only inside the transaction `BEGIN`
    /// opened (a `BEGIN` that failed leaves nothing behind), and the
    /// `COMMIT` is preceded, in the same query, by a check that this
    /// transaction's completion updated the record: a completion that
    /// failed, changed nothing, or was never sent (an error in the client
    /// before sending) makes that check fail, and the `COMMIT` does not
    /// run.
    ///
    /// A concurrent claim of the same key (from this method or
    /// [`Store::claim`](idem_core::Store::claim)) waits on the record's row
    /// until this transaction ends, then sees the completed record (or, if
    /// this one rolled back, claims it itself): a key never runs twice, and
    /// nothing of a rolled-back attempt is visible. While the mutation runs
    /// the row is locked, so keep it short (the statement timeout bounds
    /// the wait of a duplicate).
    ///
    /// Dropping the returned future before the `COMMIT` is sent (or a panic
    /// in the mutation) closes the connection instead of returning it to
    /// the pool, and the server rolls the transaction back; dropped after
    /// it was sent, the outcome is unknown, as for any commit.
    ///
    /// # Errors
    /// As [`complete_atomically`](Self::complete_atomically); a failure at
    /// commit leaves the outcome unknown, and a retry finds out which.
    pub async fn claim_and_complete_atomically<T, E, F>(
        &self,
        req: &ClaimRequest,
        mutation: F,
    ) -> Result<ClaimedAtomically<T, E>, StoreError>
    where
        F: for<'c> FnOnce(&'c Client, Fence) -> BoxFuture<'c, Result<(T, Completion), E>>,
    {
        let mut held = InTransaction(Some(self.inner.pool.get().await.map_err(pool_error)?));
        let Some(client) = held.0.as_ref() else {
            return Err(StoreError::new(
                idem_core::StoreErrorKind::Backend,
                "postgres store: the pooled connection went missing",
            ));
        };
        let claim = match self.begin_and_claim(client, req).await {
            Ok(claim) => claim,
            Err(e) => {
                held.roll_back().await;
                return Err(e);
            }
        };
        let lease = match claim {
            Claim::Acquired(lease) => lease,
            other => {
                held.roll_back().await;
                return Ok(ClaimedAtomically::NotAcquired(other));
            }
        };
        let Some(fence) = lease.fence.to_i64() else {
            held.roll_back().await;
            return Ok(ClaimedAtomically::Ran(Atomic::StaleFence));
        };
        let (value, completion) = match mutation(client, lease.fence).await {
            Ok(done) => done,
            Err(e) => {
                held.roll_back().await;
                return Ok(ClaimedAtomically::Ran(Atomic::Failed(e)));
            }
        };
        let complete = client
            .prepare_cached(&self.inner.sql.complete_or_fail)
            .await
            .map_err(|e| pg_error("preparing complete", e))?;
        let headers = completion.response.encode_headers();
        let status = completion.status().code() as i16;
        let response_status = i32::from(completion.response.status);
        let resource_id = completion.resource_id.as_deref();
        let params: [&(dyn ToSql + Sync); 9] = [
            &req.id.scope.as_str(),
            &req.id.operation.as_str(),
            &req.id.key.as_str(),
            &fence,
            &status,
            &resource_id,
            &response_status,
            &headers,
            &completion.response.body,
        ];
        // Pipelined: both are sent before either answer is read. The
        // completion marks the transaction with its fence; the COMMIT's
        // query first checks that mark, so it commits only after this
        // completion ran in this transaction.
        let commit = format!(
            "SELECT 1 / coalesce(current_setting('idem.completed', true) = '{fence}', false)::int; COMMIT"
        );
        let (completed, committed) = futures_util::future::join(
            client.query_one(&complete, &params),
            client.batch_execute(&commit),
        )
        .await;
        match (completed, committed) {
            (Ok(_), Ok(())) => {
                held.settle();
                Ok(ClaimedAtomically::Ran(Atomic::Committed(value)))
            }
            // The check refused the COMMIT: nothing was committed.
            (Err(e), _) if e.code() == Some(&SqlState::DIVISION_BY_ZERO) => {
                held.roll_back().await;
                Ok(ClaimedAtomically::Ran(Atomic::StaleFence))
            }
            (Err(e), _) => {
                held.roll_back().await;
                Err(pg_error("completing", e))
            }
            // The completion ran and the COMMIT failed: the outcome is
            // unknown (a lost connection) or a rollback (a deferred check).
            (Ok(_), Err(e)) => {
                held.roll_back().await;
                Err(pg_error("committing an atomic transaction", e))
            }
        }
    }

    /// Begins a transaction on `client` and claims `req` in it, in one
    /// round trip for a key with no record (see [`judge`](Self::judge)).
    /// The insert runs only inside the transaction `BEGIN` opened (the
    /// query marks it), so a `BEGIN` that failed leaves no claim behind.
    async fn begin_and_claim(
        &self,
        client: &Client,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        let insert = client
            .prepare_cached(&self.inner.sql.claim_new)
            .await
            .map_err(|e| pg_error("preparing claim", e))?;
        let (scope, operation, key, fingerprint, now, lease, ttl) = claim_params(req);
        // Pipelined: BEGIN is sent first, then the insert; both are sent
        // before either answer is read.
        let (begun, inserted) = futures_util::future::join(
            client.batch_execute("BEGIN; SET LOCAL idem.in_claim = 'on'"),
            client.query_opt(
                &insert,
                &[&scope, &operation, &key, &fingerprint, &now, &lease, &ttl],
            ),
        )
        .await;
        begun.map_err(|e| pg_error("beginning an atomic transaction", e))?;
        let inserted = inserted.map_err(|e| pg_error("claiming", e))?;
        match inserted {
            Some(row) => acquired_from_insert(&row),
            None => self.judge(client, req).await,
        }
    }
}

/// A pooled connection inside a transaction begun without
/// tokio-postgres's `Transaction` (so that `BEGIN` can share a round trip
/// with the claim). Unless settled, dropping it takes the connection out
/// of the pool and closes it, and the server rolls the transaction back:
/// a connection is never handed to another caller inside a transaction.
struct InTransaction(Option<Client>);

impl InTransaction {
    /// The transaction ended (committed or rolled back): the connection
    /// goes back to the pool.
    fn settle(&mut self) {
        drop(self.0.take());
    }

    /// Rolls back, then settles; a failed rollback leaves the connection to
    /// be closed on drop.
    async fn roll_back(&mut self) {
        let Some(client) = self.0.as_ref() else {
            return;
        };
        if client.batch_execute("ROLLBACK").await.is_ok() {
            self.settle();
        }
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// The claim's parameters, in the order of the claim statements.
fn claim_params(req: &ClaimRequest) -> (&str, &str, &str, &[u8], i64, i64, i64) {
    (
        req.id.scope.as_str(),
        req.id.operation.as_str(),
        req.id.key.as_str(),
        req.fingerprint.as_bytes(),
        req.now.as_millis(),
        crate::row::millis(req.lease),
        crate::row::millis(req.ttl),
    )
}

/// The lease of a claim made by the plain insert (`RETURNING fence,
/// lease_until, expires_at`).
fn acquired_from_insert(row: &tokio_postgres::Row) -> Result<Claim, StoreError> {
    let read = |i| {
        row.try_get::<_, i64>(i)
            .map_err(|e| pg_error("reading the claim", e))
    };
    Ok(Claim::Acquired(Lease {
        fence: idem_core::decode::fence(read(0)?).map_err(corrupt)?,
        lease_until: Timestamp::from_millis(read(1)?),
        expires_at: Timestamp::from_millis(read(2)?),
        takeover: false,
    }))
}

impl PostgresStore {
    /// Judges a claim of a key that has a record, through `idem_claim`, as
    /// [`Store::claim`] does. [`begin_and_claim`](Self::begin_and_claim)
    /// claims a key with no record (the common case: a new message) by a
    /// plain insert and comes here only when the insert found a row; both
    /// are the state machine's "no record: acquire" for a new key. The
    /// insert skips the PL/pgSQL call and its lookup
    /// (docs/benchmarks-history.md, message consumers).
    ///
    /// [`Store::claim`]: idem_core::Store::claim
    async fn judge(&self, client: &Client, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let (scope, operation, key, fingerprint, now, lease, ttl) = claim_params(req);
        let judge = client
            .prepare_cached(&self.inner.sql.claim)
            .await
            .map_err(|e| pg_error("preparing claim", e))?;
        let row = client
            .query_one(
                &judge,
                &[&scope, &operation, &key, &fingerprint, &now, &lease, &ttl],
            )
            .await
            .map_err(|e| pg_error("claiming", e))?;
        crate::row::claim_from_row(req, &row)
    }
}
