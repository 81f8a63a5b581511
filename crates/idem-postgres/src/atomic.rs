//! Atomic mode: the business mutation and the record's completion in one
//! PostgreSQL transaction.
//!
//! Only the path where the mutation succeeded and the completion was
//! applied commits. Every error after the transaction began (the record
//! lock, the completion's UPDATE failing after the mutation ran, a
//! statement timeout) returns before the commit; the dropped transaction
//! is rolled back (tokio-postgres sends the ROLLBACK before the connection
//! serves anything else), so a caller that gets an error never has its
//! mutation committed.

use idem_core::{
    Atomic, BoxFuture, Claim, ClaimRequest, ClaimedAtomically, Completion, Fence, Lease, RecordId,
    Settled, StoreError, Timestamp,
};

use crate::error::{pg_error, pool_error};
use crate::{PostgresStore, Transaction, complete_with};

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
        let mut client = self.inner.pool.get().await.map_err(pool_error)?;
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

    /// Claims `req` inside a transaction and, when the key is acquired,
    /// runs `mutation` and stores the returned [`Completion`] in the same
    /// transaction: one commit for the claim, the mutation and the
    /// completion, instead of a claim's commit and then
    /// [`complete_atomically`](Self::complete_atomically)'s.
    ///
    /// A concurrent claim of the same key (from this method or
    /// [`Store::claim`](idem_core::Store::claim)) waits on the record's row
    /// until this transaction ends, then sees the completed record (or, if
    /// this one rolled back, claims it itself): a key never runs twice, and
    /// nothing of a rolled-back attempt is visible. While the mutation runs
    /// the row is locked, so keep it short (the statement timeout bounds
    /// the wait of a duplicate).
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
        F: for<'t> FnOnce(&'t Transaction<'t>, Fence) -> BoxFuture<'t, Result<(T, Completion), E>>,
    {
        let mut client = self.inner.pool.get().await.map_err(pool_error)?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| pg_error("beginning an atomic transaction", e))?;
        let lease = match self.claim_in(&tx, req).await? {
            Claim::Acquired(lease) => lease,
            other => {
                let _ = tx.rollback().await;
                return Ok(ClaimedAtomically::NotAcquired(other));
            }
        };
        let Some(fence) = lease.fence.to_i64() else {
            let _ = tx.rollback().await;
            return Ok(ClaimedAtomically::Ran(Atomic::StaleFence));
        };
        let (value, completion) = match mutation(&tx, lease.fence).await {
            Ok(done) => done,
            Err(e) => {
                let _ = tx.rollback().await;
                return Ok(ClaimedAtomically::Ran(Atomic::Failed(e)));
            }
        };
        match complete_with(&tx, &self.inner.sql.complete, &req.id, fence, &completion).await? {
            Settled::Applied => {}
            Settled::StaleFence => {
                let _ = tx.rollback().await;
                return Ok(ClaimedAtomically::Ran(Atomic::StaleFence));
            }
        }
        tx.commit()
            .await
            .map_err(|e| pg_error("committing an atomic transaction", e))?;
        Ok(ClaimedAtomically::Ran(Atomic::Committed(value)))
    }
}

impl PostgresStore {
    /// Claims `req` inside `tx`. A key with no record (the common case: a
    /// new message) is claimed by a plain insert; a key with a record goes
    /// through `idem_claim`, which judges it as [`Store::claim`] does. Both
    /// are the state machine's "no record: acquire" row; the insert only
    /// skips the PL/pgSQL call and its lookup, which cost a PostgreSQL
    /// consumer a fifth of its throughput (BENCHMARKS.md, issue 14).
    ///
    /// [`Store::claim`]: idem_core::Store::claim
    async fn claim_in(
        &self,
        tx: &Transaction<'_>,
        req: &ClaimRequest,
    ) -> Result<Claim, StoreError> {
        let lease = crate::row::millis(req.lease);
        let ttl = crate::row::millis(req.ttl);
        let now = req.now.as_millis();
        let (scope, operation, key) = (
            req.id.scope.as_str(),
            req.id.operation.as_str(),
            req.id.key.as_str(),
        );
        let fingerprint = req.fingerprint.as_bytes();
        let insert = tx
            .prepare_cached(&self.inner.sql.claim_new)
            .await
            .map_err(|e| pg_error("preparing claim", e))?;
        let inserted = tx
            .query_opt(
                &insert,
                &[&scope, &operation, &key, &fingerprint, &now, &lease, &ttl],
            )
            .await
            .map_err(|e| pg_error("claiming", e))?;
        if let Some(row) = inserted {
            let read = |i| {
                row.try_get::<_, i64>(i)
                    .map_err(|e| pg_error("reading the claim", e))
            };
            return Ok(Claim::Acquired(Lease {
                fence: crate::row::fence_from(read(0)?)?,
                lease_until: Timestamp::from_millis(read(1)?),
                expires_at: Timestamp::from_millis(read(2)?),
                takeover: false,
            }));
        }
        let judge = tx
            .prepare_cached(&self.inner.sql.claim)
            .await
            .map_err(|e| pg_error("preparing claim", e))?;
        let row = tx
            .query_one(
                &judge,
                &[&scope, &operation, &key, &fingerprint, &now, &lease, &ttl],
            )
            .await
            .map_err(|e| pg_error("claiming", e))?;
        crate::row::claim_from_row(req, &row)
    }
}
