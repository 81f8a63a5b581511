//! The writer thread: one connection, one transaction per batch.
//!
//! Every write (claim, complete, release, lease extension, purge, the
//! epoch's advance) is a job sent to this thread. The thread takes the first job that arrives plus every job that
//! queued up behind it (up to `max_batch`), runs them all inside one
//! `BEGIN IMMEDIATE … COMMIT`, and answers each caller only after the commit
//! returned. With `synchronous=FULL` that commit is one fsync for the whole
//! batch instead of one per operation: group commit. Under load, batches
//! grow by themselves; with a single caller each batch holds one job and
//! latency is that of a plain transaction.
//!
//! One writer also makes every job atomic without locks: a claim's read and
//! write happen with nobody else writing in between.
//!
//! # Fences
//!
//! Fences come from the counter in `idem_counters`, which holds the highest
//! fence any writer of the file may have drawn. A writer reserves a block
//! of fences by raising it inside its write transaction, then draws new
//! keys' fences from the block without writing the counter again: most
//! commits leave the counter's page alone. A batch that claims first
//! checks whether another connection committed since the counter was last
//! read (`PRAGMA data_version`, inside the transaction, which excludes
//! every other writer), and if so reads it: if another writer reserved
//! since this one did, the rest of this one's block is given up and a new
//! one reserved above theirs. So two stores on one file (two processes)
//! never draw the same fence for work that commits, and fences grow in
//! commit order across them as within one. A claim over an existing record
//! (a takeover, a key claimed again after it expired) takes the block's
//! next fence when it is above the record's, as it is unless the counter
//! fell behind the records (a damaged file), and otherwise one above the
//! record, the counter and the block.
//!
//! A batch that fails forgets what is left of its block and the next one
//! starts above it, so this writer never draws a fence twice. The
//! reservation itself is in the batch's transaction, though: when that
//! transaction rolls back, another writer of the file may reserve the same
//! range, and draw a fence that only this batch's rolled-back work saw (an
//! atomic-mode mutation, say). Such a fence is void: nothing it guarded was
//! committed. A mutation must not hand its fence to anything outside the
//! transaction.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};

use idem_core::{
    Claim, ClaimRequest, Completion, EpochMark, Fence, Lease, RecordId, Settled, StoreError,
    StoreErrorKind, Timestamp, transition,
};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

use crate::error::sqlite_error;
use crate::row::{BY_ID, record_from_row};

/// Work for the writer thread, each with the channel its answer goes to.
pub(crate) enum Job {
    Claim(ClaimRequest, oneshot::Sender<Result<Claim, StoreError>>),
    Complete(
        RecordId,
        Fence,
        Completion,
        oneshot::Sender<Result<Settled, StoreError>>,
    ),
    Release(
        RecordId,
        Fence,
        oneshot::Sender<Result<Settled, StoreError>>,
    ),
    /// A lease heartbeat: the record, its fence and the new lease end.
    ExtendLease(
        RecordId,
        Fence,
        Timestamp,
        oneshot::Sender<Result<Settled, StoreError>>,
    ),
    Purge(Timestamp, usize, oneshot::Sender<Result<usize, StoreError>>),
    /// Advances the store's epoch, writing the candidate if it has none.
    Epoch(String, oneshot::Sender<Result<EpochMark, StoreError>>),
    /// Caller code to run inside the batch's transaction (atomic mode).
    Atomic(Box<dyn AtomicJob>),
    /// A claim and, when it acquires, caller code, under one savepoint:
    /// kept together or not at all (atomic mode in one commit).
    ClaimAtomic(ClaimRequest, Box<dyn ClaimedJob>),
}

/// The answer of an atomic-mode job, sent once the batch's outcome is known.
pub(crate) type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// Caller code that runs once its claim acquired the key.
pub(crate) trait ClaimedJob: Send {
    /// Runs with the key acquired under `fence`; returns whether its work
    /// (and so the claim) is kept, and its answer.
    fn run(self: Box<Self>, conn: &Connection, fence: Fence) -> (bool, Finish);
    /// The claim did not acquire: answers with it, nothing ran.
    fn not_acquired(self: Box<Self>, claim: Claim) -> Finish;
    /// Answers without running: the batch failed before reaching the job.
    fn refuse(self: Box<Self>, e: StoreError);
}

/// A unit of atomic-mode work for the writer.
pub(crate) trait AtomicJob: Send {
    /// Runs inside the batch's transaction; returns what to do with the
    /// batch's outcome once it is known.
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn FnOnce(Result<(), StoreError>) + Send>;
    /// Answers without running: the batch failed before reaching the job.
    fn refuse(self: Box<Self>, e: StoreError);
}

/// An answer held back until the batch commits.
enum Reply {
    Claim(
        oneshot::Sender<Result<Claim, StoreError>>,
        Result<Claim, StoreError>,
    ),
    Settled(
        oneshot::Sender<Result<Settled, StoreError>>,
        Result<Settled, StoreError>,
    ),
    Count(
        oneshot::Sender<Result<usize, StoreError>>,
        Result<usize, StoreError>,
    ),
    Epoch(
        oneshot::Sender<Result<EpochMark, StoreError>>,
        Result<EpochMark, StoreError>,
    ),
    Atomic(Box<dyn FnOnce(Result<(), StoreError>) + Send>),
    None,
}

impl Reply {
    /// Sends the answer; `batch` is the batch's own outcome, which replaces
    /// a successful answer when the commit failed.
    fn send(self, batch: &Result<(), StoreError>) {
        fn pick<T>(
            r: Result<T, StoreError>,
            batch: &Result<(), StoreError>,
        ) -> Result<T, StoreError> {
            match batch {
                Ok(()) => r,
                Err(e) => Err(StoreError::new(e.kind(), e.to_string())),
            }
        }
        // A caller that stopped waiting is no longer interested; the work
        // is committed all the same.
        match self {
            Reply::Claim(tx, r) => drop(tx.send(pick(r, batch))),
            Reply::Settled(tx, r) => drop(tx.send(pick(r, batch))),
            Reply::Count(tx, r) => drop(tx.send(pick(r, batch))),
            Reply::Epoch(tx, r) => drop(tx.send(pick(r, batch))),
            Reply::Atomic(finish) => finish(pick(Ok(()), batch)),
            Reply::None => {}
        }
    }
}

/// How many fences a writer reserves at a time.
const FENCE_BLOCK: i64 = 1024;

/// The fences this writer has reserved and not drawn: `(drawn, limit]`.
#[derive(Debug, Default)]
struct FenceBlock {
    drawn: i64,
    limit: i64,
}

impl FenceBlock {
    /// A block with nothing left, that ends at `fence`.
    fn used_up_at(fence: i64) -> FenceBlock {
        FenceBlock {
            drawn: fence,
            limit: fence,
        }
    }

    fn remaining(&self) -> i64 {
        self.limit - self.drawn
    }

    /// The fence a claim over a record fenced at `above` (0 for none)
    /// gets: the block's next one if the block has one above `above`, not
    /// yet drawn (a claim whose insert did not happen skips nothing), and
    /// otherwise [`Self::above_all`]'s, which is.
    fn next_above(&mut self, conn: &Connection, above: i64) -> rusqlite::Result<i64> {
        match self.drawn + 1 {
            next if next <= self.limit && next > above => Ok(next),
            _ => self.above_all(conn, above),
        }
    }

    /// Draws `fence`, which [`Self::next_above`] gave.
    fn draw(&mut self, fence: i64) {
        self.drawn = self.drawn.max(fence);
    }

    /// Gives up what is left: the batch failed, so the reservation may
    /// have been rolled back, and another writer may then reserve the very
    /// same range, up to the same limit (which is why equal limits alone
    /// do not prove the block is still this writer's).
    fn forget(&mut self) {
        self.drawn = self.limit;
    }

    /// A fence from [`fence_above_all`]; the block moves above it, so that
    /// no later draw repeats it, even when the transaction that raised the
    /// counter to it is rolled back.
    fn above_all(&mut self, conn: &Connection, above: i64) -> rusqlite::Result<i64> {
        // Above the block too: a savepoint may have rolled back the raise
        // of an earlier call, leaving the counter below what this writer
        // handed out.
        let fence = fence_above_all(conn, above.max(self.limit))?;
        *self = FenceBlock::used_up_at(fence);
        Ok(fence)
    }
}

/// The counter's value: the highest fence any writer may have drawn.
fn stored_fence(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT value FROM idem_counters WHERE name = 'fence'")?
        .query_row([], |r| r.get(0))
}

fn store_fence(conn: &Connection, value: i64) -> rusqlite::Result<()> {
    match conn
        .prepare_cached("UPDATE idem_counters SET value = ?1 WHERE name = 'fence'")?
        .execute([value])?
    {
        1 => Ok(()),
        n => Err(rusqlite::Error::StatementChangedRows(n)),
    }
}

/// A fence drawn from the counter as the record's type. Drawn fences are
/// positive; a negative one (a damaged counter) becomes 0, which no claim
/// holds.
fn drawn_fence(fence: i64) -> Fence {
    Fence::new(u64::try_from(fence).unwrap_or(0))
}

fn out_of_fences() -> rusqlite::Error {
    rusqlite::Error::IntegralValueOutOfRange(0, i64::MAX)
}

/// A fence above both the counter and `above`, which the counter then
/// holds: larger than any fence drawn so far by any writer of the file,
/// even on a file whose counter fell behind its records.
fn fence_above_all(conn: &Connection, above: i64) -> rusqlite::Result<i64> {
    let fence = stored_fence(conn)?
        .max(above)
        .checked_add(1)
        .ok_or_else(out_of_fences)?;
    store_fence(conn, fence)?;
    Ok(fence)
}

pub(crate) struct Writer {
    conn: Connection,
    fences: FenceBlock,
    /// `PRAGMA data_version` when the counter was last read: it changes
    /// when another connection commits, so while it does not, the counter
    /// is what this writer left it and need not be read again.
    counter_read_at: Option<i64>,
    max_batch: usize,
}

impl Writer {
    pub(crate) fn new(conn: Connection, max_batch: usize) -> Result<Writer, StoreError> {
        // The counter must be there; the first batch that claims reads it
        // again, inside its transaction.
        stored_fence(&conn).map_err(|e| sqlite_error("reading the fence counter", e))?;
        // The writer's own dozen statements, and room for those of
        // atomic-mode mutations, which share the cache.
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Writer {
            conn,
            fences: FenceBlock::default(),
            counter_read_at: None,
            max_batch: max_batch.max(1),
        })
    }

    /// Makes sure the block holds a fence for each of `claims`, all above
    /// any fence another writer drew: runs first in a transaction that
    /// claims. The block is extended in place while this writer is the
    /// last to have reserved, and replaced by one above the counter when
    /// another writer reserved since.
    fn reserve_fences(&mut self, claims: usize) -> rusqlite::Result<()> {
        let need = i64::try_from(claims).unwrap_or(i64::MAX);
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?;
        if self.counter_read_at != Some(version) {
            let counter = stored_fence(&self.conn)?;
            if counter != self.fences.limit {
                // Another writer reserved since (the counter is above), or
                // this writer's last raise was rolled back (below): start
                // above both, so that no fence is drawn twice, not even one
                // that only rolled-back work saw.
                self.fences = FenceBlock::used_up_at(counter.max(self.fences.limit));
            }
            self.counter_read_at = Some(version);
        }
        if self.fences.remaining() >= need {
            return Ok(());
        }
        // Saturating: near the end of the range a claim with no fence left
        // fails on its own (`fence_above_all`), not the whole batch.
        let limit = self.fences.limit.saturating_add(need.max(FENCE_BLOCK));
        store_fence(&self.conn, limit)?;
        self.fences.limit = limit;
        Ok(())
    }

    /// Runs until every sender is gone, then finishes the queued work.
    /// `queued` counts the jobs sent and not yet taken (the store bounds
    /// it); each job taken into a batch is taken off it.
    pub(crate) fn run(mut self, rx: Receiver<Job>, queued: &AtomicUsize) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Ok(first) = rx.recv() {
            queued.fetch_sub(1, Ordering::AcqRel);
            batch.push(first);
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(job) => {
                        queued.fetch_sub(1, Ordering::AcqRel);
                        batch.push(job);
                    }
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            self.run_batch(&mut batch);
        }
    }

    fn run_batch(&mut self, jobs: &mut Vec<Job>) {
        let mut replies = Vec::with_capacity(jobs.len());
        let claims = jobs
            .iter()
            .filter(|j| matches!(j, Job::Claim(..) | Job::ClaimAtomic(..)))
            .count();
        let begun = self
            .conn
            .prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .map_err(|e| sqlite_error("beginning a transaction", e))
            .and_then(|_| match claims {
                // Completions, releases, extensions and purges draw no
                // fence.
                0 => Ok(()),
                n => self
                    .reserve_fences(n)
                    .map_err(|e| sqlite_error("reserving fences", e)),
            });
        let outcome = match begun {
            Err(e) => Err(e),
            Ok(()) => {
                let mut aborted = None;
                for job in jobs.drain(..) {
                    replies.push(self.run_job(job));
                    // Some errors (I/O, disk full) make SQLite roll back the
                    // whole transaction. Then nothing of this batch is
                    // written, so every job in it must be told so.
                    if self.conn.is_autocommit() {
                        aborted = Some(StoreError::new(
                            StoreErrorKind::Unavailable,
                            "sqlite store: the transaction was rolled back by the database",
                        ));
                        break;
                    }
                }
                match aborted {
                    Some(e) => Err(e),
                    None => self.commit(),
                }
            }
        };
        if outcome.is_err() {
            self.fences.forget();
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
        }
        for job in jobs.drain(..) {
            // Jobs never started because the batch aborted early.
            replies.push(self.refuse(job));
        }
        for reply in replies {
            reply.send(&outcome);
        }
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]))
            .map(drop)
            .map_err(|e| sqlite_error("committing", e))
    }

    fn refuse(&self, job: Job) -> Reply {
        let e = || StoreError::new(StoreErrorKind::Unavailable, "sqlite store: batch aborted");
        match job {
            Job::Claim(_, tx) => Reply::Claim(tx, Err(e())),
            Job::Complete(_, _, _, tx) | Job::Release(_, _, tx) | Job::ExtendLease(_, _, _, tx) => {
                Reply::Settled(tx, Err(e()))
            }
            Job::Purge(_, _, tx) => Reply::Count(tx, Err(e())),
            Job::Epoch(_, tx) => Reply::Epoch(tx, Err(e())),
            Job::Atomic(job) => {
                job.refuse(e());
                Reply::None
            }
            Job::ClaimAtomic(_, job) => {
                job.refuse(e());
                Reply::None
            }
        }
    }

    fn run_job(&mut self, job: Job) -> Reply {
        match job {
            Job::Claim(req, tx) => {
                let r = self.claim(&req).map_err(|e| sqlite_error("claiming", e));
                Reply::Claim(tx, r)
            }
            Job::Complete(id, fence, completion, tx) => {
                let r = self
                    .complete(&id, fence, completion)
                    .map_err(|e| sqlite_error("completing", e));
                Reply::Settled(tx, r)
            }
            Job::Release(id, fence, tx) => {
                let r = self
                    .release(&id, fence)
                    .map_err(|e| sqlite_error("releasing", e));
                Reply::Settled(tx, r)
            }
            Job::ExtendLease(id, fence, lease_until, tx) => {
                let r = self
                    .extend_lease(&id, fence, lease_until)
                    .map_err(|e| sqlite_error("extending a lease", e));
                Reply::Settled(tx, r)
            }
            Job::Purge(now, limit, tx) => {
                let r = self
                    .purge(now, limit)
                    .map_err(|e| sqlite_error("purging", e));
                Reply::Count(tx, r)
            }
            Job::Epoch(candidate, tx) => {
                let r = crate::epoch::advance(&self.conn, &candidate)
                    .map_err(|e| sqlite_error("advancing the epoch", e));
                Reply::Epoch(tx, r)
            }
            Job::Atomic(job) => Reply::Atomic(job.run(&self.conn)),
            Job::ClaimAtomic(req, job) => self.claim_atomic(&req, job),
        }
    }

    /// The claim and the caller's work under one savepoint: a claim whose
    /// work is not kept (it failed, panicked, met a stale fence) is rolled
    /// back with it, so nothing of the attempt commits.
    fn claim_atomic(&mut self, req: &ClaimRequest, job: Box<dyn ClaimedJob>) -> Reply {
        if let Err(e) = self.conn.execute_batch("SAVEPOINT idem_claimed") {
            job.refuse(sqlite_error("atomic mode", e));
            return Reply::None;
        }
        let (kept, finish) = match self.claim(req) {
            Ok(Claim::Acquired(lease)) => job.run(&self.conn, lease.fence),
            Ok(other) => (false, job.not_acquired(other)),
            Err(e) => {
                job.refuse(sqlite_error("claiming", e));
                (false, Box::new(|_| {}) as Finish)
            }
        };
        // The job may have ended the whole transaction (an error SQLite
        // rolls back on its own): the batch sees that and fails.
        if !self.conn.is_autocommit() {
            let end = if kept {
                "RELEASE idem_claimed"
            } else {
                "ROLLBACK TO idem_claimed; RELEASE idem_claimed"
            };
            if self.conn.execute_batch(end).is_err() && !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
        }
        Reply::Atomic(finish)
    }

    fn claim(&mut self, req: &ClaimRequest) -> rusqlite::Result<Claim> {
        // Fast path, the common case: the key is new. Insert if absent,
        // with the block's next fence, drawn only if the insert happened.
        // (The batch reserved one for each claim, and a claim draws at most
        // one; should the block be empty all the same, the fence above the
        // counter serves.)
        let fence = self.fences.next_above(&self.conn, 0)?;
        let lease_until = req.now + req.lease;
        let expires_at = req.now + req.ttl;
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO idem_records (scope, operation, key, fingerprint, status, fence, \
                 created_at, lease_until, expires_at) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?7, ?8) \
                 ON CONFLICT (scope, operation, key) DO NOTHING",
            )?
            .execute(params![
                req.id.scope.as_str(),
                req.id.operation.as_str(),
                req.id.key.as_str(),
                req.fingerprint.as_bytes(),
                fence,
                req.now.as_millis(),
                lease_until.as_millis(),
                expires_at.as_millis(),
            ])?;
        if inserted == 1 {
            self.fences.draw(fence);
            return Ok(Claim::Acquired(Lease {
                fence: drawn_fence(fence),
                lease_until,
                expires_at,
                takeover: false,
            }));
        }

        // The key exists: load it and let the state machine decide.
        let existing = self
            .conn
            .prepare_cached(BY_ID)?
            .query_row(
                params![
                    req.id.scope.as_str(),
                    req.id.operation.as_str(),
                    req.id.key.as_str()
                ],
                |row| record_from_row(&req.id, row),
            )
            .optional()?;
        // A new fence must be above the record's: the block's next one is,
        // unless the counter fell behind the records (a damaged file).
        let above = existing
            .as_ref()
            .map_or(0, |r| r.fence.to_i64().unwrap_or(i64::MAX));
        let (conn, fences) = (&self.conn, &mut self.fences);
        let mut failed = None;
        let step = transition::claim(existing.as_ref(), req, || {
            match fences.next_above(conn, above) {
                Ok(f) => {
                    fences.draw(f);
                    drawn_fence(f)
                }
                Err(e) => {
                    failed = Some(e);
                    Fence::new(0)
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some(rec) = step.write {
            self.conn
                .prepare_cached(
                    "INSERT OR REPLACE INTO idem_records (scope, operation, key, fingerprint, status, fence, \
                     created_at, lease_until, expires_at, resource_id, response_status, response_headers, \
                     response_body) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL, NULL, NULL, NULL)",
                )?
                .execute(params![
                    rec.id.scope.as_str(),
                    rec.id.operation.as_str(),
                    rec.id.key.as_str(),
                    rec.fingerprint.as_bytes(),
                    rec.status.code(),
                    rec.fence.to_i64().unwrap_or(i64::MAX),
                    rec.created_at.as_millis(),
                    rec.lease_until.map(Timestamp::as_millis),
                    rec.expires_at.as_millis(),
                ])?;
        }
        Ok(step.claim)
    }

    fn complete(
        &mut self,
        id: &RecordId,
        fence: Fence,
        c: Completion,
    ) -> rusqlite::Result<Settled> {
        complete_in(&self.conn, id, fence, &c)
    }

    fn release(&mut self, id: &RecordId, fence: Fence) -> rusqlite::Result<Settled> {
        let Some(fence) = fence.to_i64() else {
            return Ok(Settled::StaleFence);
        };
        let n = self.conn.prepare_cached(RELEASE)?.execute(params![
            id.scope.as_str(),
            id.operation.as_str(),
            id.key.as_str(),
            fence
        ])?;
        Ok(Settled::from_changed(n as u64))
    }

    fn extend_lease(
        &mut self,
        id: &RecordId,
        fence: Fence,
        lease_until: Timestamp,
    ) -> rusqlite::Result<Settled> {
        let Some(fence) = fence.to_i64() else {
            return Ok(Settled::StaleFence);
        };
        // SQLite counts every row the `WHERE` matched, moved or not.
        let n = self.conn.prepare_cached(EXTEND)?.execute(params![
            id.scope.as_str(),
            id.operation.as_str(),
            id.key.as_str(),
            fence,
            lease_until.as_millis(),
        ])?;
        Ok(Settled::from_changed(n as u64))
    }

    fn purge(&mut self, now: Timestamp, limit: usize) -> rusqlite::Result<usize> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.conn
            .prepare_cached(PURGE)?
            .execute(params![now.as_millis(), limit])
    }
}

/// Deletes the in-progress record `(?1, ?2, ?3)` held under fence `?4`.
pub(crate) const RELEASE: &str = "DELETE FROM idem_records \
     WHERE scope = ?1 AND operation = ?2 AND key = ?3 AND fence = ?4 AND status = 0";

/// Moves the lease of the in-progress record `(?1, ?2, ?3)` held under
/// fence `?4` to `?5`, never earlier (`max` of two values is `NULL` if
/// either is, hence the `coalesce`, though an in-progress record always
/// has a lease), and raises its `expires_at` to at least `?5` in the same
/// statement, so the record outlives its lease.
pub(crate) const EXTEND: &str = "UPDATE idem_records \
     SET lease_until = max(coalesce(lease_until, ?5), ?5), \
         expires_at = max(expires_at, ?5) \
     WHERE scope = ?1 AND operation = ?2 AND key = ?3 AND fence = ?4 AND status = 0";

/// Deletes up to `?2` records expired at `?1`, found through the expiry
/// index and deleted by rowid.
pub(crate) const PURGE: &str = "DELETE FROM idem_records WHERE rowid IN \
     (SELECT rowid FROM idem_records WHERE expires_at <= ?1 LIMIT ?2)";

/// Completes the in-progress record `(?1, ?2, ?3)` held under fence `?4`.
pub(crate) const COMPLETE: &str = "UPDATE idem_records SET status = ?5, resource_id = ?6, \
     response_status = ?7, response_headers = ?8, response_body = ?9, lease_until = NULL \
     WHERE scope = ?1 AND operation = ?2 AND key = ?3 AND fence = ?4 AND status = 0";

/// Completes a record inside whatever transaction `conn` is in: the writer's
/// own jobs and atomic-mode jobs share it.
pub(crate) fn complete_in(
    conn: &Connection,
    id: &RecordId,
    fence: Fence,
    c: &Completion,
) -> rusqlite::Result<Settled> {
    let Some(fence) = fence.to_i64() else {
        return Ok(Settled::StaleFence);
    };
    let n = conn.prepare_cached(COMPLETE)?.execute(params![
        id.scope.as_str(),
        id.operation.as_str(),
        id.key.as_str(),
        fence,
        c.status().code(),
        c.resource_id.as_deref(),
        i64::from(c.response.status),
        c.response.encode_headers(),
        &c.response.body,
    ])?;
    Ok(Settled::from_changed(n as u64))
}
