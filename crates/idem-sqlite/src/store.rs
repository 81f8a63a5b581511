//! The store: the writer thread's queue, the pool of read connections,
//! and the `Store` operations (writes sent to the writer, reads run on a
//! pooled connection).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Durability, DurabilityFinding, EpochMark, Fence,
    Key, Record, RecordId, Scope, Settled, StaleCursor, Store, StoreError, StoreErrorKind,
    Timestamp,
};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

use crate::error::sqlite_error;
use crate::row;
use crate::schema;
use crate::writer::Job;

/// The SQLite store. Clones share one file, one writer and one reader pool.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) jobs: Option<Sender<Job>>,
    /// Jobs sent and not yet taken by the writer.
    pub(crate) queued: Arc<AtomicUsize>,
    pub(crate) max_queue: usize,
    pub(crate) write_timeout: Duration,
    pub(crate) thread: Option<JoinHandle<()>>,
    pub(crate) readers: Mutex<Vec<Connection>>,
    pub(crate) max_readers: usize,
    pub(crate) path: PathBuf,
    /// The `synchronous` setting the writer was opened with.
    pub(crate) synchronous: crate::synchronous::Synchronous,
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

    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(self.submit(move |tx| Job::ExtendLease(id.clone(), fence, lease_until, tx)))
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

    /// One place, `store`: the epoch is a row of `idem_epoch` in the same
    /// file, advanced by the writer thread in its batch's transaction like
    /// every other write (so two stores on one file share it).
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        Box::pin(async move {
            let mark = self
                .submit(|tx| Job::Epoch(candidate.to_owned(), tx))
                .await?;
            Ok(vec![mark])
        })
    }

    /// One finding, `synchronous`, from the builder's setting
    /// (`SqliteStoreBuilder::synchronous`): `FULL` keeps records, `NORMAL`
    /// is risky (WAL mode), `OFF` loses them on an OS crash or power loss.
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        let s = self.inner.synchronous;
        Box::pin(async move {
            Ok(Durability::new(vec![DurabilityFinding::new(
                "synchronous",
                s.pragma(),
                s.verdict(),
            )]))
        })
    }
}
