//! The state machine of docs/contract.md, *Records and their state machine* as pure functions.
//!
//! Stores that load a record, decide, and save it inside one atomic section
//! (the memory store's shard lock, the SQLite writer's transaction) call
//! these, so the rules are written once.

use crate::record::{Fence, Record, Status, StoredResponse};
use crate::store::{Claim, ClaimRequest, Completion, Lease};
use crate::time::Timestamp;

/// A claim's outcome as a number, for stores that decide inside the backend
/// (the PostgreSQL claim function, the Redis claim script) and report back
/// one code per row of the state machine. Those scripts write these very
/// numbers; this is the one place they are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ClaimCode {
    /// Absent or expired: claimed, execute.
    Acquired = 0,
    /// Another executor's lease is live.
    InFlight = 1,
    /// Finished: replay the stored response.
    Replay = 2,
    /// A live record with another fingerprint.
    Mismatch = 3,
    /// An abandoned execution's lease ended: taken over, execute.
    TakenOver = 4,
}

impl ClaimCode {
    /// The code a backend reported; `None` for any other number.
    pub fn from_code(code: i64) -> Option<ClaimCode> {
        Some(match code {
            0 => ClaimCode::Acquired,
            1 => ClaimCode::InFlight,
            2 => ClaimCode::Replay,
            3 => ClaimCode::Mismatch,
            4 => ClaimCode::TakenOver,
            _ => return None,
        })
    }

    /// The number.
    pub const fn code(self) -> i64 {
        self as i64
    }
}

/// The outcome of a claim: the answer, and the record to write if any.
#[derive(Debug)]
pub struct ClaimStep {
    /// What the claimer is told.
    pub claim: Claim,
    /// The record to save (insert or overwrite), if the claim changes state.
    pub write: Option<Record>,
}

/// What a store that decides in the backend (the PostgreSQL function, the
/// MySQL procedure, the Redis script) answered to a claim: the outcome code
/// and the record's fence and times, which every such answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimAnswer {
    /// The outcome.
    pub code: ClaimCode,
    /// The record's fence (the new one when acquired).
    pub fence: Fence,
    /// When the record was created.
    pub created_at: Timestamp,
    /// The lease's end, where the record has one.
    pub lease_until: Option<Timestamp>,
    /// When the record expires.
    pub expires_at: Timestamp,
}

/// The parts of a finished record that a replay answer carries besides a
/// [`ClaimAnswer`].
#[derive(Debug)]
pub struct FinishedParts {
    /// `Completed` or `Failed`.
    pub status: Status,
    /// What the operation created, for reconciliation.
    pub resource_id: Option<String>,
    /// The response to replay (none when it was not stored).
    pub response: Option<StoredResponse>,
}

impl ClaimAnswer {
    /// The claim `req` is answered with. `finished` reads a replayed
    /// record's parts and is called for a replay only; an answer that
    /// acquires or is in flight without a lease end is `missing_lease`'s
    /// error (a corrupt answer).
    ///
    /// # Errors
    /// What `finished` or `missing_lease` return.
    pub fn into_claim<E>(
        self,
        req: &ClaimRequest,
        finished: impl FnOnce() -> Result<FinishedParts, E>,
        missing_lease: impl FnOnce() -> E,
    ) -> Result<Claim, E> {
        let expires_at = self.expires_at;
        Ok(match self.code {
            ClaimCode::Acquired | ClaimCode::TakenOver => Claim::Acquired(Lease {
                fence: self.fence,
                lease_until: self.lease_until.ok_or_else(missing_lease)?,
                expires_at,
                takeover: self.code == ClaimCode::TakenOver,
            }),
            ClaimCode::InFlight => Claim::InFlight {
                lease_until: self.lease_until.ok_or_else(missing_lease)?,
                expires_at,
            },
            ClaimCode::Replay => {
                let parts = finished()?;
                Claim::Replay(Box::new(Record {
                    id: req.id.clone(),
                    fingerprint: req.fingerprint,
                    status: parts.status,
                    response: parts.response,
                    resource_id: parts.resource_id,
                    created_at: self.created_at,
                    lease_until: self.lease_until,
                    fence: self.fence,
                    expires_at,
                }))
            }
            ClaimCode::Mismatch => Claim::Mismatch { expires_at },
        })
    }
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

/// Moves the lease of a record that [`may_finish`] accepted to
/// `lease_until`, never earlier than it was: the heartbeat of a long
/// execution, or of a completion still waiting for the store. An expired
/// record still takes its own executor's heartbeat, as it takes its
/// result: nobody else has claimed it.
///
/// The record's `expires_at` rises to at least `lease_until` (never
/// lower): a claim treats an expired record as absent, live lease or
/// not, so a record that expired under a running execution would let a
/// second execution start beside it.
pub fn extend_lease(record: &mut Record, lease_until: Timestamp) {
    record.lease_until = Some(
        record
            .lease_until
            .map_or(lease_until, |l| l.max(lease_until)),
    );
    record.expires_at = record.expires_at.max(lease_until);
}

/// Applies a completion to a record that [`may_finish`] accepted.
pub fn complete(record: &mut Record, completion: Completion) {
    record.status = completion.status();
    record.resource_id = completion.resource_id;
    record.response = Some(completion.response);
    record.lease_until = None;
}

#[cfg(test)]
mod tests {
    use super::ClaimCode;

    /// The PostgreSQL function and the Redis script write these numbers:
    /// they must never change.
    #[test]
    fn claim_codes_are_stable() {
        for (n, code) in [
            ClaimCode::Acquired,
            ClaimCode::InFlight,
            ClaimCode::Replay,
            ClaimCode::Mismatch,
            ClaimCode::TakenOver,
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(code.code(), n as i64);
            assert_eq!(ClaimCode::from_code(n as i64), Some(code));
        }
        assert_eq!(ClaimCode::from_code(5), None);
        assert_eq!(ClaimCode::from_code(-1), None);
    }
}
