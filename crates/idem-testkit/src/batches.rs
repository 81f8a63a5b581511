//! Checks for a store's group commit, one place for every store that
//! batches (PostgreSQL, MySQL): each call in a batch gets the answer it
//! would get alone, and a call that poisons its batch fails only itself.
//! The store's batch functions are called directly, with batches of the
//! check's choosing (its batcher forms its own from whatever arrives).

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, RecordId, Settled, Status, Store, StoreError,
    Timestamp,
};

use crate::fixtures::{LEASE, TTL, request, response, t0, unique_id};

/// A store's claim batch function.
pub type ClaimBatch<'s> =
    &'s dyn Fn(Vec<ClaimRequest>) -> BoxFuture<'static, Vec<Result<Claim, StoreError>>>;
/// A store's completion batch function: (record, fence as stored,
/// completion) per call.
pub type CompletionBatch<'s> = &'s dyn Fn(
    Vec<(RecordId, i64, Completion)>,
) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>>;
/// A store's release batch function: (record, fence as stored) per call.
pub type ReleaseBatch<'s> =
    &'s dyn Fn(Vec<(RecordId, i64)>) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>>;

/// `n` new records claimed, in progress: their ids and fences as stored.
async fn in_progress(store: &dyn Store, prefix: &str, n: usize) -> (Vec<RecordId>, Vec<i64>) {
    let ids: Vec<RecordId> = (0..n)
        .map(|i| unique_id(&format!("{prefix}-{i:010}")))
        .collect();
    let mut fences = Vec::new();
    for id in &ids {
        let Ok(Claim::Acquired(lease)) = store.claim(&request(id, "{}", t0())).await else {
            panic!("not acquired");
        };
        fences.push(lease.fence.to_i64().unwrap_or(i64::MAX - 2000));
    }
    (ids, fences)
}

/// A claim of `id` acquired and completed with `tag`, at `at`.
async fn finished(store: &dyn Store, id: &RecordId, body: &str, tag: &str, at: Timestamp) {
    let Ok(Claim::Acquired(lease)) = store.claim(&request(id, body, at)).await else {
        panic!("a fresh key was not acquired");
    };
    let done = Completion::completed(response(201, tag));
    assert_eq!(
        store.complete(id, lease.fence, done, at).await.ok(),
        Some(Settled::Applied)
    );
}

/// New keys (two of them sent twice), a key in flight, a finished key, a
/// finished key asked with another body, a key whose lease ran out and a
/// key whose record expired (asked with another body), in one batch in a
/// shuffled order: each call gets its own answer, each new key is
/// acquired by its first call only, and each acquired call gets a fence
/// of its own, the one stored.
pub async fn a_mixed_batch_answers_each_claim_as_alone(store: &dyn Store, batch: ClaimBatch<'_>) {
    let (new_a, new_b, new_c) = (
        unique_id("new-aaaa-0000001"),
        unique_id("new-bbbb-0000001"),
        unique_id("new-cccc-0000001"),
    );
    let flying = unique_id("flying-000000001");
    let done = unique_id("finished-0000001");
    let other = unique_id("mismatch-0000001");
    let lapsed = unique_id("lapsed-000000001");
    let expired = unique_id("expired-00000001");
    let now = t0() + TTL + LEASE;
    let second = std::time::Duration::from_secs(1);
    assert!(matches!(
        store.claim(&request(&flying, "{}", now - second)).await,
        Ok(Claim::Acquired(_))
    ));
    assert!(matches!(
        store
            .claim(&request(&lapsed, "{}", now - LEASE - second))
            .await,
        Ok(Claim::Acquired(_))
    ));
    finished(store, &done, "{}", "done", now - second).await;
    finished(store, &other, "{\"a\":1}", "other", now - second).await;
    finished(store, &expired, "{}", "expired", now - TTL - second).await;

    let calls: Vec<ClaimRequest> = vec![
        request(&new_b, "{}", now),
        request(&done, "{}", now),
        request(&new_a, "{}", now),
        request(&flying, "{}", now),
        request(&new_b, "{}", now),
        request(&other, "{\"a\":2}", now),
        request(&new_a, "{}", now),
        request(&expired, "{\"b\":1}", now),
        request(&new_c, "{}", now),
        request(&lapsed, "{}", now),
    ];
    let answers = batch(calls).await;
    let kinds: Vec<&str> = answers
        .iter()
        .map(|a| match a {
            Ok(Claim::Acquired(l)) if l.takeover => "taken over",
            Ok(Claim::Acquired(_)) => "acquired",
            Ok(Claim::InFlight { .. }) => "in flight",
            Ok(Claim::Replay(r)) if r.status == Status::Completed => "replay",
            Ok(Claim::Mismatch { .. }) => "mismatch",
            Ok(_) => "other",
            Err(_) => "error",
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "acquired",
            "replay",
            "acquired",
            "in flight",
            "in flight",
            "mismatch",
            "in flight",
            "acquired",
            "acquired",
            "taken over"
        ],
        "{answers:?}"
    );
    let Ok(Claim::Replay(r)) = &answers[1] else {
        unreachable!()
    };
    assert_eq!(r.response.as_ref(), Some(&response(201, "done")));
    let mut fences: Vec<u64> = answers
        .iter()
        .filter_map(|a| match a {
            Ok(Claim::Acquired(l)) => Some(l.fence.get()),
            _ => None,
        })
        .collect();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 5);
    // Each acquired answer is its own id's: its fence is the one stored.
    for (i, id) in [
        (0, &new_b),
        (2, &new_a),
        (7, &expired),
        (8, &new_c),
        (9, &lapsed),
    ] {
        let Ok(Claim::Acquired(lease)) = &answers[i] else {
            unreachable!()
        };
        let stored = store.get(id, now).await.ok().flatten().map(|r| r.fence);
        assert_eq!(stored, Some(lease.fence), "call {i}");
    }
}

/// `poisoned` (a claim the server refuses: a value it cannot store; its
/// operation must sort after `POST /testkit`) in a batch with two good
/// ones of its scope, which run before it: the batch is rolled back and
/// sent again a call at a time, and only the poisoned call fails. Had
/// the good calls' first run been kept, their second would find them in
/// flight, or wait on their locks.
pub async fn a_poisoned_claim_fails_only_itself(batch: ClaimBatch<'_>, poisoned: &RecordId) {
    let of_its_scope = |key: &str| {
        let key = idem_core::Key::new(key).unwrap_or_else(|e| panic!("{e}"));
        RecordId::new(
            poisoned.scope.clone(),
            idem_core::Operation::new("POST", "/testkit"),
            key,
        )
    };
    let good = of_its_scope("good-0000000001");
    let also = of_its_scope("good-0000000002");
    let calls = vec![
        request(&good, "{}", t0()),
        request(poisoned, "{}", t0()),
        request(&also, "{}", t0()),
    ];
    assert!(
        poisoned.operation.as_str() > good.operation.as_str(),
        "the poisoned call must run after the good ones"
    );
    let answers = batch(calls).await;
    assert!(
        matches!(answers[0], Ok(Claim::Acquired(_))),
        "{:?}",
        answers[0]
    );
    assert!(answers[1].is_err(), "{:?}", answers[1]);
    assert!(
        matches!(answers[2], Ok(Claim::Acquired(_))),
        "{:?}",
        answers[2]
    );
}

/// Completions and releases in batches: a call whose fence holds its
/// record applies, one whose fence is stale (or whose record another call
/// of the batch settled first) does not, each as alone.
pub async fn batched_completions_and_releases_apply_only_under_their_fence(
    store: &dyn Store,
    complete: CompletionBatch<'_>,
    release: ReleaseBatch<'_>,
) {
    let (ids, fences) = in_progress(store, "settle", 4).await;
    let done = |tag: &str| Completion::completed(response(201, tag));
    let completions = vec![
        (ids[0].clone(), fences[0], done("zero")),
        (ids[1].clone(), fences[1] + 1000, done("stale")),
        (ids[0].clone(), fences[0], done("again")),
    ];
    // The first applies; a stale fence, and a second completion under a
    // fence the first already used up, do not.
    let applied_then_stale = [
        Some(Settled::Applied),
        Some(Settled::StaleFence),
        Some(Settled::StaleFence),
    ];
    let settled = |answers: Vec<Result<Settled, StoreError>>| -> Vec<Option<Settled>> {
        answers.into_iter().map(Result::ok).collect()
    };
    assert_eq!(settled(complete(completions).await), applied_then_stale);
    let record = store.get(&ids[0], t0()).await.ok().flatten();
    assert_eq!(record.and_then(|r| r.response), Some(response(201, "zero")));

    let releases = vec![
        (ids[2].clone(), fences[2]),
        (ids[3].clone(), fences[3] + 1000),
        (ids[0].clone(), fences[0]),
    ];
    assert_eq!(settled(release(releases).await), applied_then_stale);
    assert!(matches!(store.get(&ids[2], t0()).await, Ok(None)));
    assert!(matches!(store.get(&ids[3], t0()).await, Ok(Some(_))));
    assert!(matches!(
        store.get(&ids[0], t0()).await,
        Ok(Some(r)) if r.status == Status::Completed
    ));
}

/// Completions in one batch that carry another call's fence: record
/// `a`'s completion under `b`'s fence, and `c`'s under `a`'s before its
/// own. Each record takes only the answer sent with its own id and
/// fence, whatever fences the other calls carry; `a` stays in progress,
/// and no call is answered with another's outcome.
pub async fn a_borrowed_fence_in_a_batch_takes_no_other_answer(
    store: &dyn Store,
    complete: CompletionBatch<'_>,
) {
    let (mut ids, _) = in_progress(store, "borrowed-fence", 3).await;
    // `a` before `b` in id order (as bytes, as the batch sends them), so
    // that `a`'s call is the first to carry `b`'s fence.
    ids.sort_by(|x, y| {
        (x.scope.as_str(), x.operation.as_str(), x.key.as_str()).cmp(&(
            y.scope.as_str(),
            y.operation.as_str(),
            y.key.as_str(),
        ))
    });
    let mut fences = Vec::new();
    for id in &ids {
        let record = store.get(id, t0()).await.ok().flatten().expect("a record");
        fences.push(record.fence.to_i64().unwrap_or(i64::MAX - 2000));
    }
    let (a, b, c) = (&ids[0], &ids[1], &ids[2]);
    let done = |tag: &str| Completion::completed(response(201, tag));
    let calls = vec![
        (b.clone(), fences[1], done("b-own")),
        (a.clone(), fences[1], done("a-under-b")),
        (c.clone(), fences[0], done("c-under-a")),
        (c.clone(), fences[2], done("c-own")),
    ];
    let answers: Vec<Option<Settled>> = complete(calls).await.into_iter().map(Result::ok).collect();
    assert_eq!(
        answers,
        [
            Some(Settled::Applied),
            Some(Settled::StaleFence),
            Some(Settled::StaleFence),
            Some(Settled::Applied),
        ]
    );
    let mut now = Vec::new();
    for id in [a, b, c] {
        now.push(store.get(id, t0()).await.ok().flatten().expect("a record"));
    }
    assert_eq!(now[0].status, Status::InProgress);
    assert_eq!(now[0].response, None);
    assert_eq!(now[1].response, Some(response(201, "b-own")));
    assert_eq!(now[2].response, Some(response(201, "c-own")));
}
