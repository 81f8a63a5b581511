//! What the layer tells the handler about the claim it holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    completed: Arc<AtomicBool>,
}

impl IdempotencyContext {
    pub(crate) fn new(id: RecordId, fence: Fence, expires_at: Timestamp) -> IdempotencyContext {
        IdempotencyContext {
            id,
            fence,
            expires_at,
            completed: Arc::new(AtomicBool::new(false)),
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

    /// Tells the layer the handler completed the record in its own
    /// transaction (atomic mode).
    pub fn mark_completed(&self) {
        self.completed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_completed(&self) -> bool {
        self.completed.load(Ordering::SeqCst)
    }
}
