//! Atomic mode: the business mutation and the record's completion in one
//! MySQL transaction.
//!
//! Only the path where the mutation succeeded and the completion was
//! applied commits. Every other path returns before the commit, and the
//! transaction is rolled back: explicitly, or by mysql_async when a
//! dropped transaction's connection is next used or goes back to the pool,
//! or by the server when the connection dies with the process.

use idem_core::{
    Atomic, BoxFuture, Claim, ClaimRequest, ClaimedAtomically, Completion, Fence, RecordId,
    Settled, StoreError, StoreErrorKind,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Row, Transaction, TxOpts};

use crate::error::{DeadlockRetries, my_error};
use crate::row;
use crate::single::AffectedRows;
use crate::store::MysqlStore;

/// The mutation's transaction: it owns its pooled connection.
pub type MysqlTransaction = Transaction<'static>;

impl MysqlStore {
    async fn begin(&self) -> Result<MysqlTransaction, StoreError> {
        match tokio::time::timeout(
            self.inner.wait,
            self.inner.pool.start_transaction(TxOpts::default()),
        )
        .await
        {
            Ok(tx) => tx.map_err(|e| my_error("beginning an atomic transaction", e)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "mysql store: no connection available",
            )),
        }
    }

    /// Runs `mutation` inside a transaction that first locks the record
    /// (checking that `fence` is still current), then stores the returned
    /// [`Completion`] and commits both.
    ///
    /// While the transaction is open the record's row is locked: a claim
    /// that would take over the lease waits for the commit and then sees
    /// the completed record. If the process dies before the commit, neither
    /// the mutation nor the completion happened, and the record waits for
    /// its lease to run out.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails (including at commit: then
    /// the outcome is unknown, and a retry after the lease finds out which).
    pub async fn complete_atomically<T, E, F>(
        &self,
        id: &RecordId,
        fence: Fence,
        mutation: F,
    ) -> Result<Atomic<T, E>, StoreError>
    where
        F: for<'t> FnOnce(&'t mut MysqlTransaction) -> BoxFuture<'t, Result<(T, Completion), E>>,
    {
        let Some(fence) = fence.to_i64() else {
            return Ok(Atomic::StaleFence);
        };
        crate::single::check_id(id)?;
        let mut tx = self.begin().await?;
        let held: Option<i64> = tx
            .exec_first(
                &self.inner.sql.lock,
                (
                    id.scope.as_str(),
                    id.operation.as_str(),
                    id.key.as_str(),
                    fence,
                ),
            )
            .await
            .map_err(|e| my_error("locking the record", e))?;
        if held.is_none() {
            let _ = tx.rollback().await;
            return Ok(Atomic::StaleFence);
        }
        self.finish(tx, id, fence, mutation)
            .await
            .map(|done| match done {
                ClaimedAtomically::Ran(atomic) => atomic,
                ClaimedAtomically::NotAcquired(_) => Atomic::StaleFence,
            })
    }

    /// Claims `req` inside a transaction and, when the key is acquired,
    /// runs `mutation` and stores the returned [`Completion`] in the same
    /// transaction: one commit for the claim, the mutation and the
    /// completion. A concurrent claim of the same key waits on the record's
    /// row until this transaction ends, then sees the completed record (or
    /// claims it itself if this one rolled back). A claim chosen as a
    /// deadlock victim (several claims of one new key at once) is run again
    /// in a new transaction, before the mutation ever ran.
    ///
    /// # Errors
    /// As [`complete_atomically`](Self::complete_atomically).
    pub async fn claim_and_complete_atomically<T, E, F>(
        &self,
        req: &ClaimRequest,
        mutation: F,
    ) -> Result<ClaimedAtomically<T, E>, StoreError>
    where
        F: for<'t> FnOnce(
            &'t mut MysqlTransaction,
            Fence,
        ) -> BoxFuture<'t, Result<(T, Completion), E>>,
    {
        crate::single::check_id(&req.id)?;
        let params = crate::single::claim_params(req);
        let mut retries = DeadlockRetries::default();
        let (tx, claim) = loop {
            let mut tx = self.begin().await?;
            let answer: Result<Option<Row>, _> =
                tx.exec_first(&self.inner.sql.claim_in_tx, params).await;
            // A deadlock rolled the whole transaction back: nothing ran.
            if retries.again(&answer) {
                continue;
            }
            let row = answer.map_err(|e| my_error("claiming", e))?;
            break (tx, row::claim_from_row(req, row.as_ref())?);
        };
        let lease = match claim {
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
        self.finish(tx, &req.id, fence, |tx| mutation(tx, lease.fence))
            .await
    }

    /// Runs the mutation in `tx`, then the completion, then commits; rolls
    /// back on every other path.
    async fn finish<T, E, F>(
        &self,
        mut tx: MysqlTransaction,
        id: &RecordId,
        fence: i64,
        mutation: F,
    ) -> Result<ClaimedAtomically<T, E>, StoreError>
    where
        F: for<'t> FnOnce(&'t mut MysqlTransaction) -> BoxFuture<'t, Result<(T, Completion), E>>,
    {
        let (value, completion) = match mutation(&mut tx).await {
            Ok(done) => done,
            Err(e) => {
                let _ = tx.rollback().await;
                return Ok(ClaimedAtomically::Ran(Atomic::Failed(e)));
            }
        };
        if let Err(e) = self.inner.check_fits(&completion) {
            let _ = tx.rollback().await;
            return Err(e);
        }
        match crate::single::complete_with(
            &mut tx,
            &self.inner.sql.complete,
            id,
            fence,
            &completion,
        )
        .await?
        {
            Settled::Applied => {}
            // Unreachable while we hold the row lock, but never commit a
            // mutation whose record we could not complete.
            Settled::StaleFence => {
                let _ = tx.rollback().await;
                return Ok(ClaimedAtomically::Ran(Atomic::StaleFence));
            }
        }
        tx.commit()
            .await
            .map_err(|e| my_error("committing an atomic transaction", e))?;
        Ok(ClaimedAtomically::Ran(Atomic::Committed(value)))
    }
}

impl AffectedRows for MysqlTransaction {
    fn changed(&self) -> u64 {
        self.affected_rows()
    }
}
