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
    Atomic, BoxFuture, Claim, ClaimRequest, ClaimedAtomically, Completion, Fence, RecordId,
    Settled, StoreError,
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
        let claim_stmt = tx
            .prepare_cached(&self.inner.sql.claim)
            .await
            .map_err(|e| pg_error("preparing claim", e))?;
        let row = tx
            .query_one(
                &claim_stmt,
                &[
                    &req.id.scope.as_str(),
                    &req.id.operation.as_str(),
                    &req.id.key.as_str(),
                    &req.fingerprint.as_bytes(),
                    &req.now.as_millis(),
                    &crate::row::millis(req.lease),
                    &crate::row::millis(req.ttl),
                ],
            )
            .await
            .map_err(|e| pg_error("claiming", e))?;
        let lease = match crate::row::claim_from_row(req, &row)? {
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
