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
    Atomic, Claim, ClaimRequest, Completion, Fence, FieldSelection, Fingerprint, Operation, Policy,
    RecordId, Scope, Settled, Status, Store, StoreError, StoredResponse, Timestamp,
};

use crate::message::{KeySource, Message, MissingKey};

/// The status stored with an applied message's result.
pub const APPLIED: u16 = 200;
/// The status stored with a message the effect refused for good.
pub const REFUSED: u16 = 422;

/// The longest a message held by another consumer waits before it is
/// delivered again ([`ConsumeError::InFlight`]).
pub const IN_FLIGHT_RECHECK: Duration = Duration::from_secs(1);

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
            | ConsumeError::Store(_) => Action::Redeliver { after: None },
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
    })
}

/// The completion that records a permanent refusal with its reason.
pub fn refused(reason: Vec<u8>) -> Completion {
    Completion::failed(StoredResponse {
        status: REFUSED,
        headers: Vec::new(),
        body: reason,
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
        }
    }

    /// Sets the record lifetime and lease.
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Consumer {
        self.policy = policy;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The claim for `message`: `Ok(Ok(claimed))` when this consumer runs
    /// the effect, `Ok(Err(processed))` when the record is settled already.
    async fn claim(
        &self,
        message: &Message,
    ) -> Result<Result<Claimed, Processed>, ConsumeError<std::convert::Infallible>> {
        let key = self.key_source.key_of(message)?;
        let id = RecordId::new(self.scope.clone(), self.operation.clone(), key);
        let fingerprint = Fingerprint::compute(
            &self.operation,
            message.content_type.as_deref(),
            &message.payload,
            &FieldSelection::Whole,
        );
        let request = ClaimRequest {
            id,
            fingerprint,
            now: Timestamp::now(),
            lease: self.policy.lease(),
            ttl: self.policy.ttl(),
        };
        match self.store.claim(&request).await? {
            Claim::Acquired(lease) => Ok(Ok(Claimed {
                id: request.id,
                fence: lease.fence,
            })),
            Claim::Replay(record) => {
                let body = record.response.map(|r| r.body).unwrap_or_default();
                Ok(Err(match record.status {
                    Status::Failed => Processed::Refused(body),
                    _ => Processed::Duplicate(body),
                }))
            }
            Claim::InFlight { lease_until, .. } => Err(ConsumeError::InFlight { lease_until }),
            Claim::Mismatch { .. } => Err(ConsumeError::KeyReused),
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
        match self
            .store
            .complete(&claimed.id, claimed.fence, completion, Timestamp::now())
            .await?
        {
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
