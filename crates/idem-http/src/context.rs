//! What the layer tells the handler about the claim it holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use idem_core::{Fence, RecordId, Timestamp};

/// Put in the request's extensions for every request the layer executes.
///
/// In atomic mode the handler completes the record itself, inside its own
/// transaction (`SqliteStore::complete_atomically`,
/// `PostgresStore::complete_atomically`), with [`IdempotencyContext::id`]
/// and [`IdempotencyContext::fence`], and then calls
/// [`IdempotencyContext::mark_completed`] so the layer does not complete it
/// again. The response the handler returns must be the one it stored.
#[derive(Debug, Clone)]
pub struct IdempotencyContext {
    id: RecordId,
    fence: Fence,
    expires_at: Timestamp,
    takeover: bool,
    completed: Arc<AtomicBool>,
    /// What the operation created, as the handler names it.
    resource_id: Arc<Mutex<Option<String>>>,
}

impl IdempotencyContext {
    pub(crate) fn new(
        id: RecordId,
        fence: Fence,
        expires_at: Timestamp,
        takeover: bool,
    ) -> IdempotencyContext {
        IdempotencyContext {
            id,
            fence,
            expires_at,
            takeover,
            completed: Arc::new(AtomicBool::new(false)),
            resource_id: Arc::default(),
        }
    }

    /// The record being executed.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The claim's fence.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// When the record expires.
    pub fn expires_at(&self) -> Timestamp {
        self.expires_at
    }

    /// Whether this execution took the key over from an earlier one whose
    /// outcome is unknown (its executor stopped before recording it), under
    /// the [`Takeover::Announce`](idem_core::Takeover::Announce) policy: the
    /// operation may have happened already. A handler that keeps its keys
    /// in its own state should look there before acting again. Also sent
    /// to the handler as the `Idem-Takeover` request header, whose value is
    /// the key.
    pub fn is_takeover(&self) -> bool {
        self.takeover
    }

    /// Names what the operation created (a payment id, say): the layer
    /// stores it with the record, and the read path
    /// (`GET /_idem/records/{key}`) and a `response-not-stored` answer give
    /// it to a client that lost the answer. The last call wins. In atomic
    /// mode, pass it to the store's `Completion` instead.
    pub fn set_resource_id(&self, id: impl Into<String>) {
        *self
            .resource_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id.into());
    }

    /// What [`set_resource_id`](Self::set_resource_id) named, if anything.
    pub(crate) fn resource_id(&self) -> Option<String> {
        self.resource_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Tells the layer the handler completed the record in its own
    /// transaction (atomic mode).
    pub fn mark_completed(&self) {
        self.completed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_completed(&self) -> bool {
        self.completed.load(Ordering::SeqCst)
    }
}
