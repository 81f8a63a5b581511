//! The state machine of DESIGN.md section 2 as pure functions.
//!
//! Stores that load a record, decide, and save it inside one atomic section
//! (the memory store's shard lock, the SQLite writer's transaction) call
//! these, so the rules are written once.

use crate::record::{Fence, Record, Status};
use crate::store::{Claim, ClaimRequest, Completion, Lease};

/// The outcome of a claim: the answer, and the record to write if any.
#[derive(Debug)]
pub struct ClaimStep {
    /// What the claimer is told.
    pub claim: Claim,
    /// The record to save (insert or overwrite), if the claim changes state.
    pub write: Option<Record>,
}

/// Decides a claim against the current record. `next_fence` is called only
/// when the claim acquires.
pub fn claim(
    existing: Option<&Record>,
    req: &ClaimRequest,
    next_fence: impl FnOnce() -> Fence,
) -> ClaimStep {
    let now = req.now;
    let mut takeover = false;
    if let Some(rec) = existing.filter(|r| r.is_live(now)) {
        if rec.fingerprint != req.fingerprint {
            return answer(Claim::Mismatch {
                expires_at: rec.expires_at,
            });
        }
        match rec.status {
            Status::Completed | Status::Failed => {
                return answer(Claim::Replay(Box::new(rec.clone())));
            }
            Status::InProgress if rec.lease_is_live(now) => {
                return answer(Claim::InFlight {
                    lease_until: rec.lease_until.unwrap_or(now),
                    expires_at: rec.expires_at,
                });
            }
            Status::InProgress => takeover = true,
        }
    }
    let fence = next_fence();
    let lease = Lease {
        fence,
        lease_until: now + req.lease,
        expires_at: now + req.ttl,
        takeover,
    };
    ClaimStep {
        claim: Claim::Acquired(lease),
        write: Some(Record {
            id: req.id.clone(),
            fingerprint: req.fingerprint,
            status: Status::InProgress,
            response: None,
            resource_id: None,
            created_at: now,
            lease_until: Some(lease.lease_until),
            fence,
            expires_at: lease.expires_at,
        }),
    }
}

fn answer(claim: Claim) -> ClaimStep {
    ClaimStep { claim, write: None }
}

/// Whether `fence` may finish (complete or release) `existing`: the record
/// must be in progress under that very fence. An expired record still
/// accepts its own executor's result, since nobody else has claimed it.
pub fn may_finish(existing: Option<&Record>, fence: Fence) -> bool {
    existing.is_some_and(|r| r.status == Status::InProgress && r.fence == fence)
}

/// Applies a completion to a record that [`may_finish`] accepted.
pub fn complete(record: &mut Record, completion: Completion) {
    record.status = completion.status();
    record.resource_id = completion.resource_id;
    record.response = Some(completion.response);
    record.lease_until = None;
}
