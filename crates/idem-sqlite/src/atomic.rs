//! Atomic mode for SQLite: the caller's mutation runs on the writer thread,
//! inside the batch's transaction, under a savepoint.
//!
//! The savepoint is kept (released into the batch) only when the mutation
//! succeeded and the completion was applied. Every other path after the
//! savepoint was opened rolls back to it and releases it: a stale fence, a
//! failed or panicking mutation, and any error on the way, including a
//! completion that fails after the mutation ran (a constraint or trigger
//! refusing the UPDATE, an I/O error). So a caller that gets an error or a
//! non-committed outcome never has its mutation commit with the rest of the
//! batch, while the batch's other jobs commit as usual. If the savepoint
//! cannot be ended (SQLite already rolled the transaction back, or the
//! mutation ended the savepoint itself), the whole transaction is rolled
//! back and every job of the batch is answered with an error.

use std::panic::{AssertUnwindSafe, catch_unwind};

use idem_core::{
    Atomic, Claim, ClaimRequest, ClaimedAtomically, Completion, Fence, RecordId, Settled,
    StoreError, StoreErrorKind,
};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

use crate::error::sqlite_error;
use crate::store::SqliteStore;
use crate::writer::{AtomicJob, ClaimedJob, Finish, Job, complete_in};

type Answer<T, E> = oneshot::Sender<Result<Atomic<T, E>, StoreError>>;

struct Task<T, E, F> {
    id: RecordId,
    fence: Fence,
    mutation: F,
    answer: Answer<T, E>,
}

impl<T, E, F> AtomicJob for Task<T, E, F>
where
    T: Send + 'static,
    E: Send + 'static,
    F: FnOnce(&Connection) -> Result<(T, Completion), E> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn FnOnce(Result<(), StoreError>) + Send> {
        let Task {
            id,
            fence,
            mutation,
            answer,
        } = *self;
        let result = run_in_savepoint(conn, &id, fence, mutation);
        Box::new(move |batch| {
            let _ = answer.send(batch.and(result));
        })
    }

    fn refuse(self: Box<Self>, e: StoreError) {
        let _ = self.answer.send(Err(e));
    }
}

type ClaimAnswer<T, E> = oneshot::Sender<Result<ClaimedAtomically<T, E>, StoreError>>;

/// A claim's work for [`SqliteStore::claim_and_complete_atomically`].
struct ClaimTask<T, E, F> {
    id: RecordId,
    mutation: F,
    answer: ClaimAnswer<T, E>,
}

impl<T, E, F> ClaimedJob for ClaimTask<T, E, F>
where
    T: Send + 'static,
    E: Send + 'static,
    F: FnOnce(&Connection, Fence) -> Result<(T, Completion), E> + Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection, fence: Fence) -> (bool, Finish) {
        let ClaimTask {
            id,
            mutation,
            answer,
        } = *self;
        let result = run_in_savepoint(conn, &id, fence, |c| mutation(c, fence));
        let kept = matches!(result, Ok(Atomic::Committed(_)));
        let finish: Finish = Box::new(move |batch| {
            let _ = answer.send(batch.and(result.map(ClaimedAtomically::Ran)));
        });
        (kept, finish)
    }

    fn not_acquired(self: Box<Self>, claim: Claim) -> Finish {
        let answer = self.answer;
        Box::new(move |batch| {
            let _ = answer.send(batch.map(|()| ClaimedAtomically::NotAcquired(claim)));
        })
    }

    fn refuse(self: Box<Self>, e: StoreError) {
        let _ = self.answer.send(Err(e));
    }
}

/// Runs the fence check, the mutation and the completion under a savepoint.
/// Only a committed outcome keeps the savepoint's work: every other outcome
/// (stale fence, failed or panicking mutation, any SQLite error on the way,
/// including a completion that fails after the mutation ran) rolls back to
/// the savepoint, so nothing of this call commits with the batch.
fn run_in_savepoint<T, E>(
    conn: &Connection,
    id: &RecordId,
    fence: Fence,
    mutation: impl FnOnce(&Connection) -> Result<(T, Completion), E>,
) -> Result<Atomic<T, E>, StoreError> {
    let Some(sql_fence) = fence.to_i64() else {
        return Ok(Atomic::StaleFence);
    };
    conn.execute_batch("SAVEPOINT idem_atomic")
        .map_err(|e| sqlite_error("atomic mode", e))?;
    let result = in_savepoint(conn, id, fence, sql_fence, mutation);
    let end = if matches!(result, Ok(Atomic::Committed(_))) {
        conn.execute_batch("RELEASE idem_atomic")
    } else {
        conn.execute_batch("ROLLBACK TO idem_atomic; RELEASE idem_atomic")
    };
    match end {
        Ok(()) => result,
        Err(e) => {
            // The savepoint could not be ended as intended (SQLite already
            // rolled the transaction back, or the mutation ended the
            // savepoint itself). Its work must not commit while the caller
            // hears of an error: abandon the whole transaction. The writer
            // sees that and answers every job of the batch with an error.
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Err(result
                .err()
                .unwrap_or_else(|| sqlite_error("ending an atomic savepoint", e)))
        }
    }
}

/// The body of [`run_in_savepoint`]; returns without touching the savepoint.
fn in_savepoint<T, E>(
    conn: &Connection,
    id: &RecordId,
    fence: Fence,
    sql_fence: i64,
    mutation: impl FnOnce(&Connection) -> Result<(T, Completion), E>,
) -> Result<Atomic<T, E>, StoreError> {
    let sql = |e| sqlite_error("atomic mode", e);
    let held = conn
        .prepare_cached(
            "SELECT 1 FROM idem_records WHERE scope = ?1 AND operation = ?2 AND key = ?3 \
             AND fence = ?4 AND status = 0",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    id.scope.as_str(),
                    id.operation.as_str(),
                    id.key.as_str(),
                    sql_fence
                ],
                |_| Ok(()),
            )
            .optional()
        })
        .map_err(sql)?;
    if held.is_none() {
        return Ok(Atomic::StaleFence);
    }
    // A panicking mutation must not take the writer thread down with it.
    let (value, completion) = match catch_unwind(AssertUnwindSafe(|| mutation(conn))) {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return Ok(Atomic::Failed(e)),
        Err(_) => {
            return Err(StoreError::new(
                StoreErrorKind::Backend,
                "sqlite store: the atomic mutation panicked; it was rolled back",
            ));
        }
    };
    Ok(
        match complete_in(conn, id, fence, &completion).map_err(sql)? {
            Settled::Applied => Atomic::Committed(value),
            Settled::StaleFence => Atomic::StaleFence,
        },
    )
}

impl SqliteStore {
    /// Runs `mutation` and the completion of the record in one transaction:
    /// both are on disk together, or neither is.
    ///
    /// The mutation runs on the store's writer thread, inside the group
    /// commit transaction, under a savepoint: it must be short SQL on the
    /// given connection (no network calls, no waiting), since every other
    /// write waits for it. It sees the record locked by construction (one
    /// writer), and is not run at all when `fence` is stale.
    ///
    /// Returns once the batch holding it has committed. If the process dies
    /// first, neither the mutation nor the completion happened, and a retry
    /// after the lease executes once. Dropping the returned future does not
    /// cancel the mutation once the writer has taken it.
    ///
    /// The connection is shared with the store's own statements: its
    /// `last_insert_rowid()` may be the rowid of idem's last record
    /// inserted (schema 5's records table has rowids) until the mutation's
    /// own insert happens (an insert that inserts nothing, or one into a
    /// `WITHOUT ROWID` or virtual table, leaves it there). Take the id from
    /// `INSERT ... RETURNING`, or read it right after an insert into a
    /// rowid table that did insert.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use idem_core::{Atomic, Claim, Completion, StoredResponse, Store};
    /// # async fn run(store: idem_sqlite::SqliteStore, req: idem_core::ClaimRequest) -> Result<(), idem_core::StoreError> {
    /// if let Claim::Acquired(lease) = store.claim(&req).await? {
    ///     let out = store
    ///         .complete_atomically(&req.id, lease.fence, |conn| {
    ///             conn.execute("INSERT INTO transfers (amount) VALUES (100)", [])?;
    ///             let id = conn.last_insert_rowid();
    ///             let response = StoredResponse { status: 201, headers: vec![], body: id.to_string().into_bytes(), ..Default::default() };
    ///             Ok::<_, rusqlite::Error>((id, Completion::completed(response).with_resource_id(id.to_string())))
    ///         })
    ///         .await?;
    ///     if let Atomic::Committed(id) = out {
    ///         println!("transfer {id} and its record committed together");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`StoreError`] when SQLite fails (for instance the completion itself
    /// fails after the mutation ran), when the batch could not commit, or
    /// when the mutation panicked. In every case nothing of this call is on
    /// disk: the mutation is rolled back. [`StoreErrorKind::Unavailable`]
    /// also when the writer's queue is full or its answer does not come
    /// within the write timeout; then the call may still be applied later,
    /// mutation and completion together (see the crate docs).
    pub async fn complete_atomically<T, E, F>(
        &self,
        id: &RecordId,
        fence: Fence,
        mutation: F,
    ) -> Result<Atomic<T, E>, StoreError>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Connection) -> Result<(T, Completion), E> + Send + 'static,
    {
        let id = id.clone();
        self.submit(move |answer| {
            Job::Atomic(Box::new(Task {
                id,
                fence,
                mutation,
                answer,
            }))
        })
        .await
    }

    /// Claims `req` and, when the key is acquired, runs `mutation` (given
    /// the claim's fence) and stores the returned [`Completion`], all in
    /// the writer's transaction under one savepoint: one commit for the
    /// claim, the mutation and the completion, instead of a claim's and
    /// then [`complete_atomically`](Self::complete_atomically)'s. An
    /// attempt that does not commit (the mutation failed or panicked)
    /// leaves nothing, the claim included: there is nothing to release.
    ///
    /// # Errors
    /// As [`complete_atomically`](Self::complete_atomically).
    pub async fn claim_and_complete_atomically<T, E, F>(
        &self,
        req: &ClaimRequest,
        mutation: F,
    ) -> Result<ClaimedAtomically<T, E>, StoreError>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Connection, Fence) -> Result<(T, Completion), E> + Send + 'static,
    {
        let req = req.clone();
        let id = req.id.clone();
        self.submit(move |answer| {
            Job::ClaimAtomic(
                req,
                Box::new(ClaimTask {
                    id,
                    mutation,
                    answer,
                }),
            )
        })
        .await
    }
}
