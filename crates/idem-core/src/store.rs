//! The `Store` trait: the atomic operations every backend provides.
//!
//! A store is a map from [`RecordId`] to [`Record`] whose operations follow
//! the state machine of docs/contract.md, *Records and their state machine*. Each operation must be atomic
//! in the backend (one transaction, one script, one locked section), and a
//! completion must be durable before the store answers: the HTTP layer sends
//! the response right after, and a record lost in a crash means a duplicate
//! execution on retry.
//!
//! Besides the map by id, every store keeps an index by (scope, key), so
//! that [`Store::find_by_key`] finds a client's records by the key alone,
//! whatever their operation (the reconciliation read path), without a scan.
//!
//! The decisions themselves (what a claim on a given record answers, whether
//! a fence may complete) live in [`transition`](crate::transition), so that a
//! store written in Rust only has to load and save records atomically.
//! Stores that decide inside the backend (SQL, Lua) must agree with it; the
//! conformance suite (the `idem-testkit` crate) checks that they do.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::durability::Durability;
use crate::epoch::EpochMark;
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Fence, Record, Status, StoredResponse};
use crate::scope::{RecordId, Scope};
use crate::time::Timestamp;

/// A boxed future, so that `Store` can be used as `dyn Store`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A request to claim a key.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The record to claim.
    pub id: RecordId,
    /// The parameters' fingerprint.
    pub fingerprint: Fingerprint,
    /// The caller's clock.
    pub now: Timestamp,
    /// How long the executor's lease runs.
    pub lease: Duration,
    /// How long the record counts.
    pub ttl: Duration,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller holds the key and must execute, then complete or release
    /// with the lease's fence.
    Acquired(Lease),
    /// Another executor holds a live lease on the same parameters.
    InFlight {
        /// When that lease runs out (a takeover becomes possible then).
        lease_until: Timestamp,
        /// When the record expires.
        expires_at: Timestamp,
    },
    /// The operation already finished: answer with the stored response.
    Replay(Box<Record>),
    /// A live record exists for different parameters: refuse (422).
    Mismatch {
        /// When the record expires.
        expires_at: Timestamp,
    },
}

/// The right to execute, held by the caller that got [`Claim::Acquired`].
///
/// Dropping a lease does nothing in the store: the record stays in progress
/// until its holder completes or releases it, or until the lease runs out
/// and another claim takes it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The fence to complete or release with.
    pub fence: Fence,
    /// Until when no one else may take over.
    pub lease_until: Timestamp,
    /// When the record expires.
    pub expires_at: Timestamp,
    /// Whether this claim took over an abandoned execution.
    pub takeover: bool,
}

/// The result an executor stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    status: Status,
    /// The response to replay.
    pub response: StoredResponse,
    /// The id of what the operation created, for reconciliation.
    pub resource_id: Option<String>,
}

impl Completion {
    /// A success: stored as `completed`.
    pub fn completed(response: StoredResponse) -> Completion {
        Completion {
            status: Status::Completed,
            response,
            resource_id: None,
        }
    }

    /// A deterministic failure: stored as `failed` and replayed.
    pub fn failed(response: StoredResponse) -> Completion {
        Completion {
            status: Status::Failed,
            response,
            resource_id: None,
        }
    }

    /// Adds the resource id.
    pub fn with_resource_id(mut self, id: impl Into<String>) -> Completion {
        self.resource_id = Some(id.into());
        self
    }

    /// `Completed` or `Failed`.
    pub fn status(&self) -> Status {
        self.status
    }
}

/// Whether a complete or release took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Settled {
    /// The record was updated.
    Applied,
    /// The fence is not the record's current one (taken over, released,
    /// expired and reclaimed, or already finished): nothing changed.
    StaleFence,
}

impl Settled {
    /// The answer of a fenced update that reports how many records it
    /// changed (rows, or a script's 0/1): one is applied, none is a stale
    /// fence.
    pub fn from_changed(changed: u64) -> Settled {
        if changed == 1 {
            Settled::Applied
        } else {
            Settled::StaleFence
        }
    }
}

/// What an atomic-mode completion did (SQL stores: the business mutation and
/// the record's completion in one transaction).
#[derive(Debug)]
#[must_use]
pub enum Atomic<T, E> {
    /// The mutation and the completion committed together.
    Committed(T),
    /// The mutation failed; its transaction was rolled back and the record
    /// is still in progress under the caller's fence. Release it (transient
    /// failure) or complete it as failed.
    Failed(E),
    /// The fence is no longer current (the lease was taken over, or the
    /// record finished): the mutation was not run and nothing was written.
    StaleFence,
}

impl<T, E> Atomic<T, E> {
    /// The same outcome with the mutation's error mapped by `f`.
    pub fn map_failed<F>(self, f: impl FnOnce(E) -> F) -> Atomic<T, F> {
        match self {
            Atomic::Committed(t) => Atomic::Committed(t),
            Atomic::Failed(e) => Atomic::Failed(f(e)),
            Atomic::StaleFence => Atomic::StaleFence,
        }
    }
}

/// What a claim made inside the mutation's own transaction led to (SQL
/// stores' `claim_and_complete_atomically`): the claim, the business
/// mutation and the record's completion commit together or not at all, in
/// one commit instead of two.
#[derive(Debug)]
#[must_use]
pub enum ClaimedAtomically<T, E> {
    /// The key was not acquired (a replay, a record in flight, a
    /// mismatch): the mutation did not run and nothing was written.
    NotAcquired(Claim),
    /// The key was acquired and the mutation ran: what the transaction
    /// did. On [`Atomic::Failed`] and [`Atomic::StaleFence`] nothing was
    /// written, the claim included (there is nothing to release).
    Ran(Atomic<T, E>),
}

impl<T, E> ClaimedAtomically<T, E> {
    /// The same outcome with the mutation's error mapped by `f`.
    pub fn map_failed<F>(self, f: impl FnOnce(E) -> F) -> ClaimedAtomically<T, F> {
        match self {
            ClaimedAtomically::NotAcquired(claim) => ClaimedAtomically::NotAcquired(claim),
            ClaimedAtomically::Ran(atomic) => ClaimedAtomically::Ran(atomic.map_failed(f)),
        }
    }
}

/// Where a page of [`Store::list_stale`] ended: the next page starts after
/// this record. Stores order stale records by `lease_until`, then by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleCursor {
    /// The last record's lease end.
    pub lease_until: Timestamp,
    /// The last record's id.
    pub id: RecordId,
}

impl StaleCursor {
    /// The cursor just after `record`.
    pub fn after(record: &Record) -> StaleCursor {
        StaleCursor {
            lease_until: record.lease_until.unwrap_or_default(),
            id: record.id.clone(),
        }
    }
}

/// The store operations. Every method is atomic in the backend.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Claim, ClaimRequest, Completion, Fingerprint, FieldSelection, Key,
///     MemoryStore, Operation, RecordId, Scope, Store, StoredResponse, Timestamp};
///
/// # tokio_test_block_on(async {
/// let store = MemoryStore::new();
/// let op = Operation::new("POST", "/transfers");
/// let req = ClaimRequest {
///     id: RecordId::new(Scope::anonymous(), op.clone(), Key::new("k-0001-0002-0003").unwrap()),
///     fingerprint: Fingerprint::compute(&op, None, b"amount=5", &FieldSelection::Whole),
///     now: Timestamp::now(),
///     lease: Duration::from_secs(30),
///     ttl: Duration::from_secs(86_400),
/// };
/// let Claim::Acquired(lease) = store.claim(&req).await.unwrap() else { panic!() };
/// let response = StoredResponse { status: 201, headers: vec![], body: b"ok".to_vec(), ..Default::default() };
/// let _ = store.complete(&req.id, lease.fence, Completion::completed(response), req.now).await.unwrap();
/// assert!(matches!(store.claim(&req).await.unwrap(), Claim::Replay(_)));
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Claims a key (docs/contract.md, *Records and their state machine*, the `claim` rows).
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer; the caller must not
    /// execute (fail closed).
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>>;

    /// Stores the result of the execution holding `fence`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer. A stale fence is not an
    /// error: it answers [`Settled::StaleFence`].
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>>;

    /// Deletes the claim held by `fence`, so the next claim executes again.
    ///
    /// # Errors
    /// As [`Store::complete`].
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>>;

    /// Moves the lease of the execution holding `fence` to `lease_until`
    /// (never earlier than it is), while the record is in progress under
    /// that fence: the heartbeat that keeps a long execution, or a
    /// completion waiting for the store, from being taken over. A stale
    /// fence (taken over, finished, released) changes nothing and answers
    /// [`Settled::StaleFence`]; the executor has lost its claim. A record
    /// whose lease (or even whose life) has ended still takes its own
    /// executor's heartbeat, as it takes its result: nobody else has
    /// claimed it. An extension to an earlier time answers
    /// [`Settled::Applied`] and leaves the lease where it was.
    ///
    /// The record's `expires_at` rises with the lease, atomically, to at
    /// least `lease_until` (never lower): the record lives at least as
    /// long as its lease, so neither a claim (which treats an expired
    /// record as absent) nor [`Store::purge_expired`] can start a second
    /// execution beside one still heartbeating.
    ///
    /// # Errors
    /// As [`Store::complete`].
    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>>;

    /// Reads a live record; `None` if absent or expired at `now`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer.
    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>>;

    /// Deletes up to `limit` records expired at `now`; answers how many.
    /// Call it again until it answers less than `limit`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer.
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>>;

    /// Up to `limit` stale records: in progress, lease ended at `now`, not
    /// expired. Their executors may have died; recovery decides what became
    /// of them. Ordered by `lease_until`, then by id in the store's own
    /// order; pass the last one's [`StaleCursor`] as `after` for the next
    /// page.
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer.
    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>>;

    /// Up to `limit` live records (not expired at `now`) of `scope` with
    /// `key`, whatever their operation, newest first: ordered by
    /// (`created_at`, operation) descending, operations compared as bytes.
    ///
    /// This is the reconciliation read path: a client that timed out knows
    /// its key and its credential (hence its scope), not the operation the
    /// server derived. Records of other scopes are never returned. Stores
    /// answer from an index on (scope, key), never from a scan of every
    /// record.
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer.
    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>>;

    /// Reads the backend's durability settings and judges them: can the
    /// store keep the records of completed intents through a crash or a
    /// restart? The gateway calls this once at start-up.
    ///
    /// The default answers [`Durability::unknown`] (no findings), so a
    /// wrapper or a store without the check need not implement it. A
    /// setting the backend refuses to show is a finding with the value
    /// `unknown` and a [`Verdict::Risky`](crate::Verdict::Risky), not an
    /// error.
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer at all.
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        Box::pin(async { Ok(Durability::unknown()) })
    }

    /// Advances the store's epoch (see [`EpochWatch`](crate::EpochWatch))
    /// at every place that can lose data on its own, one atomic step per
    /// place: where the place has no epoch, writes `candidate` with the
    /// counter at 1 (`created`); otherwise adds one to its counter. Answers
    /// every place's [`EpochMark`], or an error: never some places only.
    ///
    /// The epoch is not a record: no purge, stale listing or key lookup
    /// ever touches it, and it never expires.
    ///
    /// The default answers no marks: the store cannot tell that it forgot,
    /// and nothing is watched.
    ///
    /// # Errors
    /// [`StoreError`] when the backend cannot answer.
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        let _ = candidate;
        Box::pin(async { Ok(Vec::new()) })
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        (**self).claim(req)
    }
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        (**self).complete(id, fence, completion, now)
    }
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        (**self).release(id, fence, now)
    }
    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        (**self).extend_lease(id, fence, lease_until, now)
    }
    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        (**self).get(id, now)
    }
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        (**self).purge_expired(now, limit)
    }
    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        (**self).list_stale(now, after, limit)
    }
    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        (**self).find_by_key(scope, key, now, limit)
    }
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        (**self).durability()
    }
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        (**self).advance_epoch(candidate)
    }
}

/// What went wrong in a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend did not answer (down, unreachable, timed out, pool
    /// exhausted). Transient: the HTTP layer answers 503 with `Retry-After`.
    Unavailable,
    /// A stored value could not be decoded.
    Corrupt,
    /// The store could not be opened or set up (bad path, not a store,
    /// read-only, newer schema).
    Setup,
    /// Anything else the backend reported.
    Backend,
}

/// A store failure. The caller must not execute without a claim.
pub struct StoreError {
    inner: Box<Inner>,
}

struct Inner {
    kind: StoreErrorKind,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl StoreError {
    /// A call that did not answer within its deadline: [`StoreErrorKind::Unavailable`],
    /// naming `what` (`claim`, `a purge batch`).
    pub fn timed_out(what: &str) -> StoreError {
        StoreError::new(
            StoreErrorKind::Unavailable,
            format!("{what} took longer than its deadline"),
        )
    }

    /// A new error of `kind`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
        StoreError {
            inner: Box::new(Inner {
                kind,
                message: message.into(),
                source: None,
            }),
        }
    }

    /// Attaches the underlying error. Its text is part of this error's
    /// message (see the `Display` impl); [`StoreError::cause`] gives the
    /// error itself.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> StoreError {
        self.inner.source = Some(Box::new(source));
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.inner.kind
    }

    /// Whether the backend was unreachable (503 material).
    pub fn is_unavailable(&self) -> bool {
        self.inner.kind == StoreErrorKind::Unavailable
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreError")
            .field("kind", &self.inner.kind)
            .field("message", &self.inner.message)
            .field("source", &self.inner.source)
            .finish()
    }
}

/// Shows the message and, after a colon, the underlying error: a store
/// error is logged with `%e` in many places, and each of them should show
/// why the store failed. So that a reporter walking the chain (`anyhow`'s
/// `{:#}`) does not print the cause twice, [`source`](StdError::source)
/// returns `None`; [`StoreError::cause`] gives the underlying error.
impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.message)?;
        if let Some(source) = &self.inner.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for StoreError {}

impl StoreError {
    /// The underlying error, if one was attached (its text is already in
    /// this error's message).
    pub fn cause(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.inner.source.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its causes, joined the way a reporter walking the
    /// chain joins them (`anyhow`'s `{:#}`, the `idem` binary's `main`).
    fn chain(e: &(dyn StdError + 'static)) -> String {
        let mut parts = vec![e.to_string()];
        let mut next = e.source();
        while let Some(cause) = next {
            parts.push(cause.to_string());
            next = cause.source();
        }
        parts.join(": ")
    }

    #[test]
    fn a_chain_shows_the_source_once() {
        let e = StoreError::new(StoreErrorKind::Unavailable, "test store: claim")
            .with_source(std::io::Error::other("connection refused"));
        assert_eq!(e.to_string(), "test store: claim: connection refused");
        assert!(e.cause().is_some());
        let shown = chain(&e);
        assert_eq!(shown, "test store: claim: connection refused");
        assert_eq!(shown.matches("connection refused").count(), 1, "{shown}");
    }

    #[test]
    fn an_error_without_source_is_its_message() {
        let e = StoreError::new(StoreErrorKind::Corrupt, "test store: bad status 9");
        assert!(e.cause().is_none());
        assert_eq!(chain(&e), "test store: bad status 9");
    }
}
