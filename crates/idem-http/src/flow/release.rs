//! Giving a claim back: its record deleted under its fence, so that the
//! next request with the key runs. A claim that never ran, or ran without
//! a result worth keeping, must not keep its key from a retry for a whole
//! lease because the store blinked: a release the store does not take at
//! once is owed, and retried in a task of the layer's until the store
//! takes it, the lease ends (the fence is stale then, and the record any
//! claim's to take over) or the layer shuts down.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{Fence, RecordId, Timestamp};

use super::execution::Claimed;

use crate::metrics::StoreOp;
use crate::shared::{Shared, store_call};

/// Attempts at a release before it is owed: a blip is ridden out in the
/// request.
pub(super) const RELEASE_ATTEMPTS: u32 = 3;

/// The most releases owed at once; past it a release that failed lapses
/// with its lease (logged). Each costs a task and a record id.
pub(crate) const MAX_OWED: usize = 100_000;

/// The longest wait between two attempts at an owed release.
const OWED_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Deletes the claim, so that the next request with the key runs again;
/// an announced takeover's claim is kept instead (see [`Claimed`]).
pub(super) async fn release(shared: &Arc<Shared>, id: &RecordId, claim: Claimed) {
    if claim.keep_claim {
        tracing::info!(key = %id.key.log_id(), "an announced takeover ended without a result; its claim is kept until its lease ends, so that the next attempt is announced too");
        return;
    }
    // A heartbeat may have moved the stored lease past the claim's first
    // one: the owed release runs at least one lease from now.
    let lease_ends = claim
        .lease
        .lease_until
        .max(Timestamp::now() + claim.lease_length);
    give_back(shared, id, claim.lease.fence, lease_ends, RELEASE_ATTEMPTS).await;
}

/// Releases the claim under `fence`, trying `attempts` times (50 ms, then
/// doubling, between them); past them the release is owed until
/// `lease_ends`.
pub(super) async fn give_back(
    shared: &Arc<Shared>,
    id: &RecordId,
    fence: Fence,
    lease_ends: Timestamp,
    attempts: u32,
) {
    for attempt in 1..=attempts {
        match try_release(shared, id, fence).await {
            Ok(()) => return,
            Err(e) if attempt < attempts => {
                tracing::warn!(key = %id.key.log_id(), error = %e, attempt, "release failed; retrying");
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            Err(e) => {
                tracing::warn!(key = %id.key.log_id(), error = %e, attempt, "release failed; owed, retried until the store takes it or the lease ends");
                owe(shared, id, fence, lease_ends);
            }
        }
    }
}

async fn try_release(
    shared: &Shared,
    id: &RecordId,
    fence: Fence,
) -> Result<(), idem_core::StoreError> {
    let now = Timestamp::now();
    store_call(
        shared,
        StoreOp::Release,
        shared.store.release(id, fence, now),
    )
    .await
    .map(|_| ())
}

/// Retries the release in a task of the layer's (so that a graceful
/// shutdown waits for it through its grace). A stale fence is an answer
/// too: the record is another claim's, or gone. Not once the layer is
/// shutting down (its tasks are no longer waited for).
fn owe(shared: &Arc<Shared>, id: &RecordId, fence: Fence, lease_ends: Timestamp) {
    if shared.tracker.is_closed() {
        tracing::warn!(key = %id.key.log_id(), "release failed while shutting down; the claim ends with its lease");
        return;
    }
    let owed = shared.owed_releases.fetch_add(1, Ordering::SeqCst);
    let slot = OwedSlot(shared.clone());
    if owed >= MAX_OWED {
        tracing::error!(key = %id.key.log_id(), "release failed and too many are owed already; the claim ends with its lease");
        return;
    }
    shared.meters.deferred_release();
    let (shared, id) = (shared.clone(), id.clone());
    shared.clone().tracker.spawn(async move {
        retry_owed(&shared, &id, fence, lease_ends).await;
        drop(slot);
    });
}

/// One owed release counted in `owed_releases`, for as long as it lives
/// (a task that panics or is aborted gives its slot back too).
struct OwedSlot(Arc<Shared>);

impl Drop for OwedSlot {
    fn drop(&mut self) {
        self.0.owed_releases.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn retry_owed(shared: &Shared, id: &RecordId, fence: Fence, lease_ends: Timestamp) {
    let mut backoff = Duration::from_millis(100);
    for attempt in 1u32.. {
        let shutting_down = tokio::select! {
            biased;
            () = shared.shutdown.cancelled() => true,
            () = tokio::time::sleep(backoff) => false,
        };
        if shutting_down {
            tracing::warn!(key = %id.key.log_id(), attempt, "shutting down with a release the store did not take; the claim ends with its lease");
            return;
        }
        if Timestamp::now() >= lease_ends {
            tracing::warn!(key = %id.key.log_id(), attempt, "an owed release outlived its lease; the claim is any request's to take over now");
            return;
        }
        match try_release(shared, id, fence).await {
            Ok(()) => {
                tracing::info!(key = %id.key.log_id(), attempt, "owed release taken by the store");
                // Waiters in wait mode learn at once that the key is free.
                shared.waiters.wake(id);
                return;
            }
            Err(e) => {
                tracing::debug!(key = %id.key.log_id(), error = %e, attempt, "owed release failed again");
                backoff = (backoff * 2).min(OWED_BACKOFF_MAX);
            }
        }
    }
}
