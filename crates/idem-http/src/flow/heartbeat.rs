//! The lease heartbeat: while an execution runs (the handler, then the
//! reading of its answer), its claim's lease is moved a full lease ahead
//! every third of a lease, so that however short the lease, another
//! request (here or in another instance) never takes the key over beside
//! live work. An execution shorter than a third of its lease costs no store
//! call, only a timer.

use std::future::Future;
use std::pin::pin;

use idem_core::{RecordId, Settled, Timestamp};

use super::execution::Claimed;
use crate::metrics::StoreOp;
use crate::shared::{Shared, store_call};

/// Runs `work` to its end, renewing `claim`'s lease meanwhile.
pub(super) async fn beating<F: Future>(
    shared: &Shared,
    id: &RecordId,
    claim: Claimed,
    work: F,
) -> F::Output {
    let mut work = pin!(work);
    let beats = pin!(beat(shared, id, claim));
    tokio::select! {
        biased;
        out = &mut work => out,
        never = beats => match never {},
    }
}

/// Renews the lease every third of it, for ever (until dropped). A beat
/// the store fails is tried again at the next one; a stale fence means the
/// claim is gone (taken over after a stall longer than the lease, or
/// released by an operator): counted and logged once, then no more beats.
async fn beat(shared: &Shared, id: &RecordId, claim: Claimed) -> std::convert::Infallible {
    let every = (claim.lease_length / 3).max(std::time::Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        let now = Timestamp::now();
        let renewed =
            shared
                .store
                .extend_lease(id, claim.lease.fence, now + claim.lease_length, now);
        match store_call(shared, StoreOp::ExtendLease, renewed).await {
            Ok(Settled::Applied) => {}
            Ok(Settled::StaleFence) => {
                shared.meters.lease_lost();
                tracing::warn!(key = %id.key.log_id(), "the claim was lost while its execution ran (its lease ended during a stall, and the key was taken over or released)");
                return std::future::pending().await;
            }
            Err(e) => {
                tracing::warn!(key = %id.key.log_id(), error = %e, "lease heartbeat failed; trying again at the next beat");
            }
        }
    }
}
