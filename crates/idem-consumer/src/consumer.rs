//! The entry point: claim a message's record, run its effect once, store
//! the result, and tell the adapter what to do with the delivery.
//!
//! Every step goes through [`Store`]'s claim, complete and release, the
//! same state machine the HTTP layer uses (`idem_core::transition`): a
//! message is one intent, its key names it, its payload's fingerprint binds
//! it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use idem_core::{
    Atomic, Claim, ClaimRequest, ClaimedAtomically, Completion, Fence, FieldSelection, Fingerprint,
    Operation, Policy, RecordId, Scope, Settled, Status, Store, StoreError, StoredResponse,
    Timestamp,
};

use crate::message::{KeySource, Message, MissingKey};

/// The status stored with an applied message's result.
pub const APPLIED: u16 = 200;
/// The status stored with a message the effect refused for good.
pub const REFUSED: u16 = 422;

/// The longest a message held by another consumer waits before it is
/// delivered again ([`ConsumeError::InFlight`], when the consumer does not
/// wait for the holder itself: [`Consumer::wait_in_flight`]).
pub const IN_FLIGHT_RECHECK: Duration = Duration::from_secs(1);

/// How long a message whose effect failed transiently, panicked, met a
/// store that is down or lost its lease waits before it is delivered
/// again: never at once, so a failing message does not loop hot through
/// the broker (and its delivery limit).
pub const REDELIVERY_DELAY: Duration = Duration::from_secs(1);

/// What to do with a delivery once it was processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Acknowledge: its effect is recorded (now or before).
    Ack,
    /// Let the broker deliver it again, after `after` if given (a claim
    /// held by another consumer, a transient failure, the store down).
    Redeliver {
        /// When a redelivery could succeed, if known.
        after: Option<Duration>,
    },
    /// Never apply it: no key, or its key reused with another payload.
    /// Dead-letter it where the broker can, or drop it.
    Reject,
}

/// A message whose record is settled: acknowledge it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// The effect ran now; its result.
    Applied(Vec<u8>),
    /// The effect ran before (a redelivery or a producer's duplicate); the
    /// stored result.
    Duplicate(Vec<u8>),
    /// The effect refused the message for good (now or before); the
    /// stored reason. Not run again.
    Refused(Vec<u8>),
}

impl Processed {
    /// What the adapter does: always [`Action::Ack`].
    pub fn action(&self) -> Action {
        Action::Ack
    }
}

/// How the effect failed (plain mode).
#[derive(Debug)]
pub enum Failure<E> {
    /// It may succeed later: the record is released and the message
    /// redelivered.
    Transient(E),
    /// It never will: the reason is stored, and every redelivery is
    /// acknowledged with it ([`Processed::Refused`]).
    Permanent(Vec<u8>),
}

/// Why a message was not settled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError<E> {
    /// No key could be taken from the message.
    #[error("no idempotency key: {0}")]
    NoKey(#[from] MissingKey),
    /// The key was used before with another payload.
    #[error("the key was used before with another payload")]
    KeyReused,
    /// Another consumer holds the claim and is running the effect.
    #[error("another consumer is processing this message")]
    InFlight {
        /// When its lease ends.
        lease_until: Timestamp,
    },
    /// The effect failed transiently; the record was released.
    #[error("the effect failed; the message will be redelivered")]
    Effect(E),
    /// The effect panicked; the record was released.
    #[error("the effect panicked; the message will be redelivered")]
    Panicked,
    /// Atomic mode: the lease ran out and another consumer took the claim
    /// over before this one committed; nothing of this one was written.
    #[error("the claim was taken over; nothing was written")]
    LostLease,
    /// The store failed (fail closed: the effect did not run, or, in plain
    /// mode after it ran, its record stays in progress until its lease
    /// ends).
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl<E> ConsumeError<E> {
    /// What the adapter does with the delivery.
    pub fn action(&self) -> Action {
        match self {
            ConsumeError::NoKey(_) | ConsumeError::KeyReused => Action::Reject,
            // The holder usually finishes in milliseconds; if it died, its
            // lease must run out first. Look again soon, never later than
            // the lease's end.
            ConsumeError::InFlight { lease_until } => Action::Redeliver {
                after: Some(
                    lease_until
                        .saturating_since(Timestamp::now())
                        .min(IN_FLIGHT_RECHECK),
                ),
            },
            ConsumeError::Effect(_)
            | ConsumeError::Panicked
            | ConsumeError::LostLease
            | ConsumeError::Store(_) => Action::Redeliver {
                after: Some(REDELIVERY_DELAY),
            },
        }
    }
}

/// The claim a consumer holds while the effect runs: what an atomic-mode
/// effect needs to complete the record in its own transaction.
#[derive(Debug, Clone)]
pub struct Claimed {
    id: RecordId,
    fence: Fence,
}

impl Claimed {
    /// The record.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The claim's fence, which the store checks when it completes.
    pub fn fence(&self) -> Fence {
        self.fence
    }
}

/// The completion that records `result` as an applied message's result.
pub fn applied(result: Vec<u8>) -> Completion {
    Completion::completed(StoredResponse {
        status: APPLIED,
        headers: Vec::new(),
        body: result,
        trailers: Vec::new(),
    })
}

/// The completion that records a permanent refusal with its reason.
pub fn refused(reason: Vec<u8>) -> Completion {
    Completion::failed(StoredResponse {
        status: REFUSED,
        headers: Vec::new(),
        body: reason,
        trailers: Vec::new(),
    })
}

/// Processes the messages of one subscription (stream, queue, handler):
/// each message's record is `(scope, operation, key)`.
///
/// Cheap to clone.
#[derive(Clone)]
pub struct Consumer {
    store: Arc<dyn Store>,
    scope: Scope,
    operation: Operation,
    key_source: KeySource,
    policy: Policy,
    wait_in_flight: Duration,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("operation", &self.operation)
            .field("key_source", &self.key_source)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer whose records are named by `operation` (for instance the
    /// handler's name, `apply-transfer`) in `scope`, keyed as `key_source`
    /// says, with the default [`Policy`] (24 h records, 30 s leases).
    ///
    /// The lease must outlast the effect: a consumer whose effect runs past
    /// its lease can be overtaken by a redelivery to another consumer (in
    /// atomic mode its commit is then refused by the fence).
    pub fn new(
        store: Arc<dyn Store>,
        scope: Scope,
        operation: &str,
        key_source: KeySource,
    ) -> Consumer {
        Consumer {
            store,
            scope,
            operation: Operation::new("CONSUME", operation),
            key_source,
            policy: Policy::default(),
            wait_in_flight: Policy::default().lease(),
        }
    }

    /// How long a message whose record another consumer holds waits here
    /// for that consumer to finish (or for its lease to end, then this one
    /// takes over) before [`ConsumeError::InFlight`] sends it back to the
    /// broker. Default: the lease, so a redelivery racing its own
    /// processing is settled in process, without using up the broker's
    /// delivery limit. Zero answers `InFlight` at once.
    #[must_use]
    pub fn wait_in_flight(mut self, wait: Duration) -> Consumer {
        self.wait_in_flight = wait;
        self
    }

    /// Sets the record lifetime and lease (and the in-flight wait to the
    /// new lease).
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Consumer {
        self.wait_in_flight = policy.lease();
        self.policy = policy;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The claim request for `message`: its record and its payload's
    /// fingerprint, under this consumer's policy.
    fn request(&self, message: &Message) -> Result<ClaimRequest, MissingKey> {
        let key = self.key_source.key_of(message)?;
        Ok(ClaimRequest {
            id: RecordId::new(self.scope.clone(), self.operation.clone(), key),
            fingerprint: Fingerprint::compute(
                &self.operation,
                message.content_type.as_deref(),
                &message.payload,
                &FieldSelection::Whole,
            ),
            now: Timestamp::now(),
            lease: self.policy.lease(),
            ttl: self.policy.ttl(),
        })
    }

    /// The claim for `message`: `Ok(Ok(claimed))` when this consumer runs
    /// the effect, `Ok(Err(processed))` when the record is settled already.
    async fn claim(
        &self,
        message: &Message,
    ) -> Result<Result<Claimed, Processed>, ConsumeError<std::convert::Infallible>> {
        let mut request = self.request(message)?;
        let mut waiting = InFlightWait::new(self.wait_in_flight);
        loop {
            match self.store.claim(&request).await? {
                Claim::Acquired(lease) => {
                    return Ok(Ok(Claimed {
                        id: request.id,
                        fence: lease.fence,
                    }));
                }
                Claim::InFlight { lease_until, .. } if waiting.more(lease_until).await => {
                    request.now = Timestamp::now();
                }
                other => return not_acquired(other).map(Err),
            }
        }
    }

    /// Plain mode: runs `effect` once for the message's intent and stores
    /// its result, which every redelivery and duplicate then gets.
    ///
    /// The effect's own writes and the record are not one transaction: if
    /// the process dies after the effect and before the record is
    /// completed, a redelivery after the lease runs the effect again. Use
    /// [`process_atomically`](Self::process_atomically) when the effect
    /// writes to the store's database.
    ///
    /// # Errors
    /// [`ConsumeError`]; its [`action`](ConsumeError::action) says what to
    /// do with the delivery.
    pub async fn process<F, Fut, E>(
        &self,
        message: &Message,
        effect: F,
    ) -> Result<Processed, ConsumeError<E>>
    where
        F: FnOnce(&Claimed) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, Failure<E>>>,
    {
        let claimed = match self.claim(message).await.map_err(widen)? {
            Ok(claimed) => claimed,
            Err(settled) => return Ok(settled),
        };
        let ran = AssertUnwindSafe(effect(&claimed)).catch_unwind().await;
        let (completion, processed) = match ran {
            Ok(Ok(result)) => (applied(result.clone()), Processed::Applied(result)),
            Ok(Err(Failure::Permanent(reason))) => {
                (refused(reason.clone()), Processed::Refused(reason))
            }
            Ok(Err(Failure::Transient(e))) => {
                self.release(&claimed).await;
                return Err(ConsumeError::Effect(e));
            }
            Err(_panic) => {
                tracing::error!(key = %claimed.id.key.log_id(), "the effect panicked; claim released");
                self.release(&claimed).await;
                return Err(ConsumeError::Panicked);
            }
        };
        match self.complete_while_leased(&claimed, completion).await? {
            Settled::Applied => Ok(processed),
            // The lease ran out and another consumer took over: it runs
            // the effect too (plain mode cannot prevent that; atomic mode
            // can).
            Settled::StaleFence => Err(ConsumeError::LostLease),
        }
    }

    /// Atomic mode: `commit` runs the effect and completes the record in
    /// one transaction of the store's database, with the store's own
    /// `complete_atomically` (SQLite, PostgreSQL), the claim's id and
    /// fence, and [`applied`] (or [`refused`]) as the completion. A crash
    /// before the commit leaves neither, and the redelivery runs the effect
    /// once; after it, the redelivery is acknowledged with the stored
    /// result.
    ///
    /// `commit` answers what the store's `complete_atomically` answered:
    /// `Committed(result)` is [`Processed::Applied`]; `Failed(e)` releases
    /// the claim ([`ConsumeError::Effect`], redeliver); `StaleFence` is
    /// [`ConsumeError::LostLease`].
    ///
    /// # Errors
    /// [`ConsumeError`]; its [`action`](ConsumeError::action) says what to
    /// do with the delivery.
    pub async fn process_atomically<F, Fut, E>(
        &self,
        message: &Message,
        commit: F,
    ) -> Result<Processed, ConsumeError<E>>
    where
        F: FnOnce(Claimed) -> Fut,
        Fut: Future<Output = Result<Atomic<Vec<u8>, E>, StoreError>>,
    {
        let claimed = match self.claim(message).await.map_err(widen)? {
            Ok(claimed) => claimed,
            Err(settled) => return Ok(settled),
        };
        let ran = AssertUnwindSafe(commit(claimed.clone()))
            .catch_unwind()
            .await;
        match ran {
            Ok(Ok(Atomic::Committed(result))) => Ok(Processed::Applied(result)),
            Ok(Ok(Atomic::Failed(e))) => {
                self.release(&claimed).await;
                Err(ConsumeError::Effect(e))
            }
            Ok(Ok(Atomic::StaleFence)) => Err(ConsumeError::LostLease),
            // Nothing committed: the transaction rolled back. The claim
            // stays until its lease ends (a commit may be unknown).
            Ok(Err(e)) => Err(ConsumeError::Store(e)),
            Err(_panic) => {
                tracing::error!(key = %claimed.id.key.log_id(), "the atomic effect panicked; claim released");
                self.release(&claimed).await;
                Err(ConsumeError::Panicked)
            }
        }
    }

    /// Atomic mode in one commit: `run` claims the request and, when the
    /// key is acquired, runs the effect and completes the record in the
    /// same transaction, with the store's `claim_and_complete_atomically`
    /// (PostgreSQL, SQLite) and [`applied`] (or [`refused`]) as the
    /// completion. Half the commits of
    /// [`process_atomically`](Self::process_atomically) for a consumer that
    /// takes one message at a time; a duplicate arriving meanwhile waits
    /// for the transaction and then acknowledges the stored result.
    ///
    /// # Errors
    /// [`ConsumeError`]; its [`action`](ConsumeError::action) says what to
    /// do with the delivery. A failed effect wrote nothing, the claim
    /// included, so it is redelivered without a release.
    pub async fn process_in_one_transaction<F, Fut, E>(
        &self,
        message: &Message,
        mut run: F,
    ) -> Result<Processed, ConsumeError<E>>
    where
        F: FnMut(ClaimRequest) -> Fut,
        Fut: Future<Output = Result<ClaimedAtomically<Vec<u8>, E>, StoreError>>,
    {
        let mut request = self.request(message)?;
        let mut waiting = InFlightWait::new(self.wait_in_flight);
        let ran = loop {
            let ran = AssertUnwindSafe(run(request.clone())).catch_unwind().await;
            if let Ok(Ok(ClaimedAtomically::NotAcquired(Claim::InFlight { lease_until, .. }))) =
                &ran
                && waiting.more(*lease_until).await
            {
                request.now = Timestamp::now();
                continue;
            }
            break ran;
        };
        match ran {
            Ok(Ok(ClaimedAtomically::Ran(Atomic::Committed(result)))) => {
                Ok(Processed::Applied(result))
            }
            Ok(Ok(ClaimedAtomically::Ran(Atomic::Failed(e)))) => Err(ConsumeError::Effect(e)),
            Ok(Ok(ClaimedAtomically::Ran(Atomic::StaleFence))) => Err(ConsumeError::LostLease),
            Ok(Ok(ClaimedAtomically::NotAcquired(claim))) => not_acquired(claim).map_err(widen),
            Ok(Err(e)) => Err(ConsumeError::Store(e)),
            // The transaction was dropped with the panic: nothing written.
            Err(_panic) => Err(ConsumeError::Panicked),
        }
    }

    /// Stores the completion of an effect that ran, retrying a store
    /// failure while the lease lasts: until the record is completed, a
    /// redelivery after the lease would run the effect again.
    async fn complete_while_leased(
        &self,
        claimed: &Claimed,
        completion: Completion,
    ) -> Result<Settled, StoreError> {
        let deadline = std::time::Instant::now() + self.policy.lease();
        let mut pause = Duration::from_millis(50);
        loop {
            match self
                .store
                .complete(
                    &claimed.id,
                    claimed.fence,
                    completion.clone(),
                    Timestamp::now(),
                )
                .await
            {
                Ok(settled) => return Ok(settled),
                Err(e) if std::time::Instant::now() + pause < deadline => {
                    tracing::warn!(key = %claimed.id.key.log_id(), error = %e, "completion failed; retrying while the lease lasts");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases a claim whose effect did not happen, so a redelivery runs
    /// it. A failed release leaves the claim to its lease.
    async fn release(&self, claimed: &Claimed) {
        if let Err(e) = self
            .store
            .release(&claimed.id, claimed.fence, Timestamp::now())
            .await
        {
            tracing::warn!(key = %claimed.id.key.log_id(), error = %e, "release failed; the claim stays until its lease ends");
        }
    }
}

/// Waiting for another consumer's claim to finish, up to a limit.
struct InFlightWait {
    until: std::time::Instant,
    pause: Duration,
}

impl InFlightWait {
    fn new(limit: Duration) -> InFlightWait {
        InFlightWait {
            until: std::time::Instant::now() + limit,
            pause: Duration::from_millis(20),
        }
    }

    /// Sleeps before the next look at a record held until `lease_until`;
    /// `false` when the wait is over (then the caller answers in flight).
    async fn more(&mut self, lease_until: Timestamp) -> bool {
        let now = std::time::Instant::now();
        if now >= self.until {
            return false;
        }
        // Never past the holder's lease end (then the claim takes over),
        // nor past this wait's limit.
        let to_lease_end =
            lease_until.saturating_since(Timestamp::now()) + Duration::from_millis(5);
        let nap = self.pause.min(to_lease_end).min(self.until - now);
        tokio::time::sleep(nap).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(500));
        true
    }
}

/// A settled record's answer, or why there is none yet.
fn not_acquired(claim: Claim) -> Result<Processed, ConsumeError<std::convert::Infallible>> {
    match claim {
        Claim::Replay(record) => {
            let body = record.response.map(|r| r.body).unwrap_or_default();
            Ok(match record.status {
                Status::Failed => Processed::Refused(body),
                _ => Processed::Duplicate(body),
            })
        }
        Claim::InFlight { lease_until, .. } => Err(ConsumeError::InFlight { lease_until }),
        Claim::Mismatch { .. } => Err(ConsumeError::KeyReused),
        // Not a settled record: the caller's store answered out of turn.
        Claim::Acquired(_) => Err(ConsumeError::Store(StoreError::new(
            idem_core::StoreErrorKind::Backend,
            "the store acquired a claim it was not asked to run",
        ))),
    }
}

/// The claim's errors carry no effect error yet.
fn widen<E>(e: ConsumeError<std::convert::Infallible>) -> ConsumeError<E> {
    match e {
        ConsumeError::NoKey(m) => ConsumeError::NoKey(m),
        ConsumeError::KeyReused => ConsumeError::KeyReused,
        ConsumeError::InFlight { lease_until } => ConsumeError::InFlight { lease_until },
        ConsumeError::LostLease => ConsumeError::LostLease,
        ConsumeError::Panicked => ConsumeError::Panicked,
        ConsumeError::Store(s) => ConsumeError::Store(s),
        ConsumeError::Effect(never) => match never {},
    }
}
