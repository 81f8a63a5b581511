//! A property test: random operation sequences against a model.
//!
//! The model is the contract written as plainly as possible (a map and a
//! few `if`s), independent of [`transition`](idem_core::transition), so a
//! mistake in the shared rules is caught too. Time moves in random steps
//! around the lease and ttl, so takeovers and expiry happen often.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::fixtures::{response, t0, unique_id};
use idem_core::{
    Claim, ClaimRequest, Completion, Fence, Fingerprint, RecordId, Settled, Status, Store,
    StoredResponse, Timestamp,
};

const LEASE_MS: u64 = 1_000;
const TTL_MS: u64 = 5_000;
const KEYS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: usize,
        body: u8,
    },
    Complete {
        key: usize,
        fence_pick: usize,
        failed: bool,
    },
    Release {
        key: usize,
        fence_pick: usize,
    },
    /// A heartbeat that asks for the lease to end `ms` after now.
    ExtendLease {
        key: usize,
        fence_pick: usize,
        ms: u64,
    },
    Get {
        key: usize,
    },
    Advance {
        ms: u64,
    },
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 0..2u8).prop_map(|(key, body)| Op::Claim { key, body }),
        3 => (0..KEYS, 0..3usize, any::<bool>())
            .prop_map(|(key, fence_pick, failed)| Op::Complete { key, fence_pick, failed }),
        2 => (0..KEYS, 0..3usize).prop_map(|(key, fence_pick)| Op::Release { key, fence_pick }),
        2 => (0..KEYS, 0..3usize, prop_oneof![Just(0u64), 1..LEASE_MS * 2, Just(LEASE_MS)])
            .prop_map(|(key, fence_pick, ms)| Op::ExtendLease { key, fence_pick, ms }),
        2 => (0..KEYS).prop_map(|key| Op::Get { key }),
        3 => prop_oneof![Just(0u64), 1..LEASE_MS + 200, Just(LEASE_MS), Just(TTL_MS)]
            .prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Purge),
    ]
}

#[derive(Debug, Clone)]
struct ModelRecord {
    fingerprint: Fingerprint,
    status: Status,
    fence: Fence,
    lease_until: Timestamp,
    expires_at: Timestamp,
    response: Option<StoredResponse>,
}

#[derive(Default)]
struct Model {
    records: HashMap<usize, ModelRecord>,
    /// Every fence the store handed out, per key, newest last.
    fences: HashMap<usize, Vec<Fence>>,
}

fn fp(body: u8) -> Fingerprint {
    crate::fixtures::fingerprint(&format!("{{\"v\":{body}}}"))
}

/// Runs the property test with 64 cases of up to 40 operations.
pub fn model_check<S: Store, F: Fn() -> S>(rt: &tokio::runtime::Runtime, make: F) {
    model_check_with(rt, Config::with_cases(64), make);
}

/// As [`model_check`] with a proptest configuration of your own.
pub fn model_check_with<S: Store, F: Fn() -> S>(
    rt: &tokio::runtime::Runtime,
    config: Config,
    make: F,
) {
    let mut runner = TestRunner::new(config);
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        let store = make();
        rt.block_on(run_case(&store, &ops))
    });
    if let Err(e) = result {
        panic!("model check failed: {e}");
    }
}

async fn run_case<S: Store>(store: &S, ops: &[Op]) -> Result<(), TestCaseError> {
    let ids: Vec<RecordId> = (0..KEYS)
        .map(|k| unique_id(&format!("model-key-{k:06}")))
        .collect();
    let mut model = Model::default();
    let mut now = t0();
    let mut last_fence = Fence::new(0);
    let live = |r: &ModelRecord, now| now < r.expires_at;

    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance { ms } => now = now + Duration::from_millis(ms),
            Op::Claim { key, body } => {
                let req = ClaimRequest {
                    id: ids[key].clone(),
                    fingerprint: fp(body),
                    now,
                    lease: Duration::from_millis(LEASE_MS),
                    ttl: Duration::from_millis(TTL_MS),
                };
                let got = store.claim(&req).await.map_err(|e| fail(step, op, e))?;
                let existing = model.records.get(&key).filter(|r| live(r, now)).cloned();
                match (existing, got) {
                    (Some(r), Claim::Mismatch { expires_at }) if r.fingerprint != fp(body) => {
                        prop_assert_eq!(expires_at, r.expires_at);
                    }
                    (Some(r), Claim::Replay(rec))
                        if r.fingerprint == fp(body) && r.status != Status::InProgress =>
                    {
                        prop_assert_eq!(rec.status, r.status);
                        prop_assert_eq!(&rec.response, &r.response);
                        prop_assert_eq!(rec.fence, r.fence);
                    }
                    (Some(r), Claim::InFlight { lease_until, .. })
                        if r.fingerprint == fp(body)
                            && r.status == Status::InProgress
                            && now < r.lease_until =>
                    {
                        prop_assert_eq!(lease_until, r.lease_until);
                    }
                    (existing, Claim::Acquired(lease))
                        if existing.as_ref().is_none_or(|r| {
                            r.fingerprint == fp(body)
                                && r.status == Status::InProgress
                                && now >= r.lease_until
                        }) =>
                    {
                        prop_assert_eq!(
                            lease.takeover,
                            existing.is_some(),
                            "takeover flag at step {}",
                            step
                        );
                        prop_assert!(lease.fence > last_fence, "fences must grow");
                        last_fence = lease.fence;
                        model.fences.entry(key).or_default().push(lease.fence);
                        model.records.insert(
                            key,
                            ModelRecord {
                                fingerprint: fp(body),
                                status: Status::InProgress,
                                fence: lease.fence,
                                lease_until: lease.lease_until,
                                expires_at: lease.expires_at,
                                response: None,
                            },
                        );
                        prop_assert_eq!(lease.lease_until, now + Duration::from_millis(LEASE_MS));
                        prop_assert_eq!(lease.expires_at, now + Duration::from_millis(TTL_MS));
                    }
                    (existing, got) => {
                        return Err(TestCaseError::fail(format!(
                            "step {step} {op:?}: model had {existing:?}, store answered {got:?}"
                        )));
                    }
                }
            }
            Op::Complete {
                key,
                fence_pick,
                failed,
            } => {
                let fence = pick_fence(&model, key, fence_pick);
                let resp = response(if failed { 409 } else { 200 }, &format!("s{step}"));
                let c = if failed {
                    Completion::failed(resp.clone())
                } else {
                    Completion::completed(resp.clone())
                };
                let got = store
                    .complete(&ids[key], fence, c, now)
                    .await
                    .map_err(|e| fail(step, op, e))?;
                let rec = model.records.get_mut(&key);
                let allowed = rec
                    .as_ref()
                    .is_some_and(|r| r.status == Status::InProgress && r.fence == fence);
                prop_assert_eq!(
                    got,
                    if allowed {
                        Settled::Applied
                    } else {
                        Settled::StaleFence
                    },
                    "step {} {:?}",
                    step,
                    op
                );
                if let (true, Some(r)) = (allowed, rec) {
                    r.status = if failed {
                        Status::Failed
                    } else {
                        Status::Completed
                    };
                    r.response = Some(resp);
                }
            }
            Op::Release { key, fence_pick } => {
                let fence = pick_fence(&model, key, fence_pick);
                let got = store
                    .release(&ids[key], fence, now)
                    .await
                    .map_err(|e| fail(step, op, e))?;
                let allowed = model
                    .records
                    .get(&key)
                    .is_some_and(|r| r.status == Status::InProgress && r.fence == fence);
                prop_assert_eq!(
                    got,
                    if allowed {
                        Settled::Applied
                    } else {
                        Settled::StaleFence
                    },
                    "step {} {:?}",
                    step,
                    op
                );
                if allowed {
                    model.records.remove(&key);
                }
            }
            Op::ExtendLease {
                key,
                fence_pick,
                ms,
            } => {
                let fence = pick_fence(&model, key, fence_pick);
                let until = now + Duration::from_millis(ms);
                let got = store
                    .extend_lease(&ids[key], fence, until, now)
                    .await
                    .map_err(|e| fail(step, op, e))?;
                // Expired or not: only another claim ends a fence's hold.
                let rec = model
                    .records
                    .get_mut(&key)
                    .filter(|r| r.status == Status::InProgress && r.fence == fence);
                prop_assert_eq!(
                    got,
                    if rec.is_some() {
                        Settled::Applied
                    } else {
                        Settled::StaleFence
                    },
                    "step {} {:?}",
                    step,
                    op
                );
                // The record then lives at least as long as its lease.
                if let Some(r) = rec {
                    r.lease_until = r.lease_until.max(until);
                    r.expires_at = r.expires_at.max(until);
                }
            }
            Op::Get { key } => {
                let got = store
                    .get(&ids[key], now)
                    .await
                    .map_err(|e| fail(step, op, e))?;
                let want = model.records.get(&key).filter(|r| live(r, now));
                match (want, got) {
                    (None, None) => {}
                    (Some(w), Some(g)) => {
                        prop_assert_eq!(g.status, w.status);
                        prop_assert_eq!(g.fence, w.fence);
                        prop_assert_eq!(g.fingerprint, w.fingerprint);
                        prop_assert_eq!(&g.response, &w.response);
                        prop_assert_eq!(g.expires_at, w.expires_at);
                        let lease = (w.status == Status::InProgress).then_some(w.lease_until);
                        prop_assert_eq!(g.lease_until, lease, "lease at step {}", step);
                    }
                    (w, g) => {
                        return Err(TestCaseError::fail(format!(
                            "step {step} get: model {w:?}, store {g:?}"
                        )));
                    }
                }
            }
            Op::Purge => {
                let got = store
                    .purge_expired(now, 1_000)
                    .await
                    .map_err(|e| fail(step, op, e))?;
                let before = model.records.len();
                model.records.retain(|_, r| live(r, now));
                prop_assert_eq!(
                    got,
                    before - model.records.len(),
                    "purged count at step {}",
                    step
                );
            }
        }
    }
    Ok(())
}

/// 0 picks the newest fence handed out for the key, 1 the one before, and
/// 2 a fence no one ever held.
fn pick_fence(model: &Model, key: usize, pick: usize) -> Fence {
    let history = model.fences.get(&key).map(Vec::as_slice).unwrap_or(&[]);
    match pick {
        0 | 1 => history
            .len()
            .checked_sub(pick + 1)
            .map_or(Fence::new(u64::MAX - 1), |i| history[i]),
        _ => Fence::new(u64::MAX - 3),
    }
}

fn fail(step: usize, op: &Op, e: idem_core::StoreError) -> TestCaseError {
    TestCaseError::fail(format!("step {step} {op:?}: store error {e}"))
}
