//! The embedded default store of idem: one SQLite file, durable and fast.
//!
//! ```no_run
//! use idem_sqlite::SqliteStore;
//!
//! # fn main() -> Result<(), idem_core::StoreError> {
//! let store = SqliteStore::open("idem.db")?;
//! // `store` implements `idem_core::Store`; share it behind an `Arc`
//! // or clone it (clones share one writer).
//! # Ok(()) }
//! ```
//!
//! # Why one writer thread
//!
//! SQLite allows one writer at a time, and with `synchronous=FULL` every
//! commit waits for an fsync. A store that committed each claim on its own
//! would top out at the disk's fsync rate, a few hundred per second on
//! ordinary hardware. Here every write goes to one thread that runs all the
//! operations queued at that moment in one transaction (group commit), and
//! answers each caller only once that transaction is on disk. Durability is
//! the same as one commit per operation: a completed record is never
//! reported before it is durable. Speed comes from sharing the fsync, not
//! from weakening it. See BENCHMARKS.md for the figures.
//!
//! The commit's sync is SQLite's own call. On Linux that is `fsync`
//! unless SQLite was compiled with `HAVE_FDATASYNC`, which this workspace
//! sets (`.cargo/config.toml`). An application whose SQLite comes from
//! rusqlite's `bundled` feature can set it the same way
//! (`LIBSQLITE3_FLAGS="-DHAVE_FDATASYNC=1"`, added to any flags it already
//! sets): on Linux fdatasync is as durable for the WAL, the main file and
//! the directory, and skips writing the files' timestamps.
//!
//! Reads ([`Store::get`], [`Store::list_stale`], [`Store::find_by_key`]) use
//! their own connections (WAL lets readers run beside the writer) on tokio's
//! blocking pool, so they never wait behind a batch.
//!
//! # Layout
//!
//! One table, `idem_records`, its rows in the order they were written
//! (schema 5: a table with a rowid, so a batch's claims append to the same
//! few pages), found by a unique index on (scope, key, operation) (the
//! look-up by key whatever the operation searches its prefix), with an
//! index on `expires_at` (purge) and a partial index on the lease end of
//! in-progress records (the stale listing, schema 2); and `idem_counters`,
//! which holds the fence counter: the highest fence any writer may have
//! drawn (writers reserve blocks of it, so two processes on one file never
//! draw the same fence). Older files are migrated on open; schema 5
//! rebuilds the table once, keeping the application's triggers, indexes
//! and views on it, and the rows of its tables that reference the records
//! (it runs with foreign keys off, and fails, leaving the file as it was,
//! if SQLite cannot resolve a foreign key of such a table against the new
//! table). Stop every process using the file before an upgrade.
//!
//! An application table beside the records should not reference them by
//! foreign key: records expire and are purged, and an expired key's new
//! claim replaces its record. With `ON DELETE CASCADE` the application's
//! rows go with them; with `NO ACTION` the purge fails, and a claim that
//! replaces a record leaves the application's rows pointing at the new
//! record, another request's; with `RESTRICT` that claim fails too.
//! The rowid is not a record's identity: a replaced record gets a new one,
//! and `VACUUM` may renumber them.
//!
//! # Behavior
//!
//! - The file is created with its schema on first open, and marked as an
//!   idem store (`PRAGMA application_id`, `user_version`). Opening another
//!   kind of SQLite file, a file that is not SQLite, a read-only file, or a
//!   store with a newer schema fails with [`StoreErrorKind::Setup`] and a
//!   message naming the file and the reason.
//! - The store's methods must be called from inside a tokio runtime (reads
//!   use `spawn_blocking`).
//! - Dropping the last clone of a store lets the writer finish the queued
//!   work, then closes the file.
//! - Atomic mode: [`SqliteStore::complete_atomically`] commits a business
//!   mutation and the record's completion together.
//! - Busy and I/O failures are [`StoreErrorKind::Unavailable`]: the HTTP
//!   layer answers 503 and runs nothing.
//! - Atomic mode never commits part of a failed call: if anything after the
//!   mutation fails (the completion's UPDATE, the savepoint's release), the
//!   mutation is rolled back to its savepoint and the caller gets the error,
//!   while the other jobs of the batch commit.
//!
//! # Backpressure: a bounded queue and a write timeout
//!
//! A stalled disk stalls the writer, and must not let callers pile up
//! without bound. Two limits fail closed, with
//! [`StoreErrorKind::Unavailable`] (so the HTTP layer answers 503 and runs
//! nothing):
//!
//! - **Queue capacity** ([`SqliteStoreBuilder::max_queue`], default 10,000):
//!   write operations waiting for the writer (not yet in a batch). A call
//!   that finds the queue full fails at once and never reaches the writer.
//! - **Write timeout** ([`SqliteStoreBuilder::write_timeout`], default 5 s):
//!   how long a write call waits for the writer's answer. On expiry the
//!   caller gets `Unavailable`, but the job stays queued and **may still be
//!   applied later**. That is safe: a claim the caller never saw acquired
//!   stays in progress until its lease ends (retries get `InFlight`, then a
//!   takeover executes once); a late completion or release is what the
//!   caller asked for; a late atomic-mode call commits its mutation and its
//!   completion together, so a retry replays it.
//!
//! Write calls need a tokio runtime with its timer enabled. Reads are not
//! queued behind the writer and have no such limit.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, Record, RecordId, Scope, Settled,
    StaleCursor, Store, StoreError, StoreErrorKind, Timestamp,
};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

mod atomic;
mod builder;
mod error;
mod row;
mod schema;
mod writer;

pub use builder::{SqliteStoreBuilder, Synchronous};
use error::sqlite_error;
use writer::Job;

/// The SQLite store. Clones share one file, one writer and one reader pool.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    jobs: Option<Sender<Job>>,
    /// Jobs sent and not yet taken by the writer.
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    write_timeout: Duration,
    thread: Option<JoinHandle<()>>,
    readers: Mutex<Vec<Connection>>,
    max_readers: usize,
    path: PathBuf,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the writer once the queue is done.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

fn writer_gone() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "sqlite store: the writer thread has stopped",
    )
}

impl SqliteStore {
    /// Opens (or creates) a store at `path` with the default options.
    ///
    /// # Errors
    /// As [`SqliteStoreBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::builder(path).open()
    }

    /// Options for opening a store at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder::new(path.as_ref())
    }

    /// The file this store keeps its records in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Sends a job to the writer thread and waits for its answer, within
    /// the queue's bound and the write timeout.
    pub(crate) async fn submit<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Job,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let (tx, rx) = oneshot::channel();
        let jobs = inner.jobs.as_ref().ok_or_else(writer_gone)?;
        // Fail closed when the writer falls behind (a stalled disk): refuse
        // at once rather than let callers pile up without bound.
        if inner.queued.fetch_add(1, Ordering::AcqRel) >= inner.max_queue {
            inner.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "sqlite store: the writer queue is full ({} operations waiting)",
                    inner.max_queue
                ),
            ));
        }
        if jobs.send(make(tx)).is_err() {
            inner.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(writer_gone());
        }
        match tokio::time::timeout(inner.write_timeout, rx).await {
            Ok(answer) => answer.map_err(|_| writer_gone())?,
            // The job stays queued and may still be applied: see the crate
            // docs for why that is safe.
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "sqlite store: no answer from the writer within {:?}; \
                     the operation may still be applied",
                    inner.write_timeout
                ),
            )),
        }
    }

    /// Runs `f` on a read connection from the pool, off the async threads.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = inner
                .readers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            let conn = match pooled {
                Some(c) => c,
                None => schema::open_reader(&inner.path)?,
            };
            let result = f(&conn);
            let mut pool = inner
                .readers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if pool.len() < inner.max_readers {
                pool.push(conn);
            }
            result
        })
        .await
        .map_err(|e| {
            StoreError::new(StoreErrorKind::Backend, "sqlite store: read task failed")
                .with_source(e)
        })?
    }
}

impl Store for SqliteStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(self.submit(|tx| Job::Claim(req.clone(), tx)))
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(self.submit(move |tx| Job::Complete(id.clone(), fence, completion, tx)))
    }

    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(self.submit(move |tx| Job::Release(id.clone(), fence, tx)))
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        let id = id.clone();
        Box::pin(self.read(move |conn| {
            let rec = conn
                .prepare_cached(row::BY_ID)
                .and_then(|mut s| {
                    s.query_row(
                        params![id.scope.as_str(), id.operation.as_str(), id.key.as_str()],
                        |r| row::record_from_row(&id, r),
                    )
                    .optional()
                })
                .map_err(|e| sqlite_error("reading a record", e))?;
            Ok(rec.filter(|r| r.is_live(now)))
        }))
    }

    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(self.submit(move |tx| Job::Purge(now, limit, tx)))
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        let after = after.cloned();
        Box::pin(self.read(move |conn| {
            let (lease, scope, op, key) = match &after {
                Some(c) => (
                    c.lease_until.as_millis(),
                    c.id.scope.as_str().to_owned(),
                    c.id.operation.as_str().to_owned(),
                    c.id.key.as_str().to_owned(),
                ),
                None => (i64::MIN, String::new(), String::new(), String::new()),
            };
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let sql = format!(
                "SELECT {}, scope, operation, key FROM idem_records INDEXED BY idem_records_stale \
                 WHERE status = 0 AND lease_until <= ?1 AND expires_at > ?1 \
                 AND (lease_until, scope, operation, key) > (?2, ?3, ?4, ?5) \
                 ORDER BY lease_until, scope, operation, key LIMIT ?6",
                row::COLUMNS
            );
            let mut stmt = conn
                .prepare_cached(&sql)
                .map_err(|e| sqlite_error("listing stale records", e))?;
            let rows = stmt
                .query_map(
                    params![now.as_millis(), lease, scope, op, key, limit],
                    row::record_with_id_from_row,
                )
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(|e| sqlite_error("listing stale records", e))?;
            Ok(rows)
        }))
    }

    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        let (scope, key) = (scope.clone(), key.clone());
        Box::pin(self.read(move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut stmt = conn
                .prepare_cached(row::BY_KEY)
                .map_err(|e| sqlite_error("finding records by key", e))?;
            let rows = stmt
                .query_map(
                    params![scope.as_str(), key.as_str(), now.as_millis(), limit],
                    |r| row::record_with_operation_from_row(&scope, &key, r),
                )
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(|e| sqlite_error("finding records by key", e))?;
            Ok(rows)
        }))
    }
}

#[cfg(test)]
mod tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
