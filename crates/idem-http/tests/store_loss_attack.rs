//! Regression tests for the attacks on the store watch (issue 36): each
//! test replays one attacker's scenario and checks the behaviour the docs
//! promise, which the code now keeps (the findings fixed in the store
//! watch, the claim gate, the held-completion rewrite and the read path).
//!
//! No test sleeps to let something happen: a call is held at a [`Door`]
//! until the test opens it, and a condition (a call made, an execution
//! begun, the window's end passed on the clock it is read by) is waited
//! for with a deadline.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{MemoryStore, Policy, StoreError, StoreErrorKind, Timestamp};
use idem_http::{IdempotencyLayer, RouteRule};
use idem_testkit::{Door, Fault, FaultyStore, StoreOp};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};

#[derive(Default)]
struct Seen {
    executions: AtomicUsize,
    running: AtomicUsize,
    max_running: AtomicUsize,
    release: Notify,
}

/// Counts executions and how many run at once; the first execution of
/// `/slow` runs until `release` is notified, any later one ends at once
/// (so that one that should not have run is counted, never hangs).
fn service(
    seen: Arc<Seen>,
) -> impl tower::Service<
    Request<idem_http::Body>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: Request<idem_http::Body>| {
        let seen = seen.clone();
        async move {
            let n = seen.executions.fetch_add(1, Ordering::SeqCst) + 1;
            let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
            seen.max_running.fetch_max(now, Ordering::SeqCst);
            if req.uri().path() == "/slow" && n == 1 {
                seen.release.notified().await;
            }
            seen.running.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::from(format!("{{\"payment\":{n}}}"))))
                    .unwrap(),
            )
        }
    })
}

fn post(path: &str, key: &str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

async fn read(r: Response<idem_http::Body>) -> (StatusCode, String) {
    let status = r.status();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn unavailable() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "injected: down")
}

/// What an epoch check meets when the store answers but the role lacks
/// rights on the epoch's table: a failure other than the store being down.
fn permission_denied() -> StoreError {
    StoreError::new(
        StoreErrorKind::Backend,
        "permission denied for table idem_epoch",
    )
}

fn policy(lease: Duration) -> Policy {
    Policy::builder().lease(lease).build().unwrap()
}

/// Waits until `cond` holds, looking again every millisecond (so that the
/// layer's tasks and timers run meanwhile); fails the test if it does not
/// hold within ten seconds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited ten seconds until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Sends new keys to `path` until one is answered `want`, and answers
/// that; fails the test if none is within ten seconds.
async fn answers_until<S>(svc: &S, path: &str, want: StatusCode, prefix: &str) -> String
where
    S: tower::Service<
            Request<Full<Bytes>>,
            Response = Response<idem_http::Body>,
            Error = Infallible,
        > + Clone,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for n in 0u64.. {
        let key = format!("{prefix}-{n:012}");
        let (status, body) = read(svc.clone().oneshot(post(path, &key)).await.unwrap()).await;
        if status == want {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {want} within ten seconds; the last answer: {status} {body}"
        );
        tokio::task::yield_now().await;
    }
    unreachable!()
}

/// (c)/(a) The retry of an intent still executing passes the gate before
/// the loss, and its claim reaches the emptied store after the watch has
/// noticed it (queued behind a reconnect, a slow pool): the store grants
/// it, and the layer gives it back (503) instead of executing it beside
/// the first execution.
#[tokio::test]
async fn a_claim_in_flight_when_the_loss_is_noticed_is_given_back() {
    let memory = Arc::new(MemoryStore::new());
    // The second claim (the retry's) waits at the door.
    let door = Door::new();
    let held = door.clone();
    let store = Arc::new(FaultyStore::with_faults(
        memory.clone(),
        move |call| match (call.op, call.nth) {
            (StoreOp::Claim, 1) => Fault::Hold(held.clone()),
            _ => Fault::Pass,
        },
    ));
    let p = policy(Duration::from_secs(30));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/slow").policy(p.clone()))
        .default_policy(p)
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().interval(Duration::from_secs(3600));
    watch.check_once().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = watch.clone().spawn(stop.clone());
    // The running watch's first check (at once) reads the epoch before the
    // loss, so that the check below is the one that notices it.
    until("the running watch's first check was answered", || {
        store.answered(StoreOp::AdvanceEpoch) == 2
    })
    .await;

    // The first request of the intent executes (and runs on).
    let first = tokio::spawn(svc.clone().oneshot(post("/slow", "intent-0000000000001")));
    until("the first request executes", || {
        seen.executions.load(Ordering::SeqCst) == 1
    })
    .await;
    // Its retry passes the gate; its claim is held on the way.
    let retry = tokio::spawn(svc.clone().oneshot(post("/slow", "intent-0000000000001")));
    door.arrived().await;
    // The store forgets; the watch notices and opens the window.
    memory.forget_everything();
    let losses = watch.check_once().await.unwrap();
    assert_eq!(losses.len(), 1, "the loss is noticed");
    // The retry's claim lands on the emptied store, after the window opened.
    door.open();
    let (status, body) = read(retry.await.unwrap().unwrap()).await;
    let executions = seen.executions.load(Ordering::SeqCst);
    let max_running = seen.max_running.load(Ordering::SeqCst);
    seen.release.notify_one();
    let _ = first.await;
    stop.cancel();
    running.await.unwrap();
    assert_eq!(
        (executions, max_running),
        (1, 1),
        "the retry executed beside the first execution after the loss window opened: {status} {body}"
    );
    assert_eq!(store.calls(StoreOp::Claim), 2, "the retry's claim was made");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("store-lost-records"), "{body}");
}

/// A claim on its way when another call meets the store down is given
/// back (the store may have come back empty), and the store fails that
/// release too: the release is owed and retried until the store takes it,
/// so that the intent's retry executes once the store is back and checked,
/// rather than meeting 409 until the lease (an hour here) ends. What
/// `idem demo --store-faults` once met as an intent unanswered after a
/// store restart.
#[tokio::test]
async fn a_give_back_the_store_fails_is_owed_until_it_takes_it() {
    let memory = Arc::new(MemoryStore::new());
    let door = Door::new();
    let held = door.clone();
    let store = Arc::new(FaultyStore::with_faults(
        memory.clone(),
        move |call| match (call.op, call.nth) {
            (StoreOp::Claim, 0) => Fault::Hold(held.clone()),
            (StoreOp::Claim, 1) | (StoreOp::Release, 0) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
    ));
    let p = policy(Duration::from_secs(3600));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .default_policy(p)
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().interval(Duration::from_secs(3600));
    watch.check_once().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = watch.clone().spawn(stop.clone());
    until("the running watch's first check was answered", || {
        store.answered(StoreOp::AdvanceEpoch) == 2
    })
    .await;

    let key = "given-back-000000001";
    let first = tokio::spawn(svc.clone().oneshot(post("/pay", key)));
    door.arrived().await;
    // Another request meets the store down while the first claim is held.
    let (status, body) = read(
        svc.clone()
            .oneshot(post("/pay", "met-the-store-down-1"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    door.open();
    let (status, body) = read(first.await.unwrap().unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(seen.executions.load(Ordering::SeqCst), 0);

    // The intent's retry: refused until the owed release is taken and the
    // store checked, then executed, once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = read(svc.clone().oneshot(post("/pay", key)).await.unwrap()).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the retry still refused after ten seconds: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(seen.executions.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.calls(StoreOp::Release),
        2,
        "given back at the second try"
    );
    stop.cancel();
    running.await.unwrap();
}

/// A takeover of an abandoned claim (the crash window) granted while
/// another call meets the store down is refused (503) but never given
/// back: deleted, its record would let the next retry claim the key
/// afresh and run beside an attempt that may have acted, undoing the
/// route's `hold`. The takeover's claim stays until its lease ends.
#[tokio::test]
async fn a_takeover_granted_across_a_store_blip_is_kept_not_given_back() {
    let memory = Arc::new(MemoryStore::new());
    let key = "abandoned-000000001";
    let op = idem_core::Operation::new("POST", "/pay");
    let id = idem_core::RecordId::new(
        idem_core::Scope::anonymous(),
        op.clone(),
        idem_core::Key::new(key).unwrap(),
    );
    // An executor claimed the key an hour ago and died: its lease is over.
    let abandoned = idem_core::ClaimRequest {
        id: id.clone(),
        fingerprint: idem_core::Fingerprint::compute_request(
            &op,
            "/pay",
            Some("application/json"),
            b"{}",
            &idem_core::FieldSelection::Whole,
        ),
        now: Timestamp::now() - Duration::from_secs(3600),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(86_400),
    };
    assert!(matches!(
        idem_core::Store::claim(&*memory, &abandoned).await.unwrap(),
        idem_core::Claim::Acquired(_)
    ));
    let door = Door::new();
    let held = door.clone();
    let store = Arc::new(FaultyStore::with_faults(
        memory.clone(),
        move |call| match (call.op, call.nth) {
            (StoreOp::Claim, 0) => Fault::Hold(held.clone()),
            (StoreOp::Claim, 1) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
    ));
    let layer = IdempotencyLayer::builder_shared(store.clone()).build();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));

    let retry = tokio::spawn(svc.clone().oneshot(post("/pay", key)));
    door.arrived().await;
    let (status, _) = read(
        svc.clone()
            .oneshot(post("/pay", "met-the-store-down-2"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    door.open();
    let (status, body) = read(retry.await.unwrap().unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(seen.executions.load(Ordering::SeqCst), 0);
    assert_eq!(
        store.calls(StoreOp::Release),
        0,
        "the takeover was given back"
    );
    let record = idem_core::Store::get(&*memory, &id, Timestamp::now())
        .await
        .unwrap()
        .expect("the crash window's record is gone");
    assert_eq!(record.status, idem_core::Status::InProgress);
}

/// (a)/(h) An execution that began before the loss runs on past the
/// window (its heartbeat carried it past its lease, and losing the lease
/// does not stop it); a retry of its key sent after the window has passed
/// is refused (503 `store-lost-records`), not executed beside it, for as
/// long as that execution runs.
#[tokio::test]
async fn an_execution_that_began_before_the_loss_keeps_claims_refused_past_the_window() {
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::new(memory.clone()));
    let p = policy(Duration::from_millis(300));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/slow").policy(p.clone()))
        .default_policy(p)
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().interval(Duration::from_secs(3600));
    watch.check_once().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = watch.clone().spawn(stop.clone());
    until("the running watch's first check was answered", || {
        store.answered(StoreOp::AdvanceEpoch) == 2
    })
    .await;

    let first = tokio::spawn(svc.clone().oneshot(post("/slow", "intent-0000000000002")));
    until("the first request executes", || {
        seen.executions.load(Ordering::SeqCst) == 1
    })
    .await;
    memory.forget_everything();
    assert_eq!(watch.check_once().await.unwrap().len(), 1);
    let noticed = Timestamp::now();
    assert_eq!(watch.window_length(), Duration::from_millis(300));
    // The window passes (on the system clock it is kept by); the first
    // execution still runs.
    let closed = (noticed + watch.window_length()).as_millis();
    until("the loss window has passed", || {
        Timestamp::now().as_millis() > closed
    })
    .await;
    let (status, body) = read(
        svc.clone()
            .oneshot(post("/slow", "intent-0000000000002"))
            .await
            .unwrap(),
    )
    .await;
    let executions = seen.executions.load(Ordering::SeqCst);
    let max_running = seen.max_running.load(Ordering::SeqCst);
    seen.release.notify_one();
    let _ = first.await;
    assert_eq!(
        (executions, max_running),
        (1, 1),
        "a retry after the window executed beside the execution that began before the loss: {status} {body}"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("store-lost-records"), "{body}");
    // Once that execution has ended, keys execute again.
    answers_until(&svc, "/pay", StatusCode::CREATED, "after-the-first").await;
    stop.cancel();
    running.await.unwrap();
}

/// (c) Two checks of one watch (clones share what they saw) overlap, the
/// first one's answer coming back after the second check began: the
/// second waits for the first, the counters are compared in order, and a
/// store that lost nothing is reported as having lost nothing (a new key
/// then executes).
#[tokio::test]
async fn overlapping_checks_of_one_watch_report_no_loss() {
    let memory = Arc::new(MemoryStore::new());
    // The answer to the first of the two checks waits at the door.
    let door = Door::new();
    let held = door.clone();
    let store = Arc::new(FaultyStore::with_faults(memory, move |call| {
        match (call.op, call.nth) {
            (StoreOp::AdvanceEpoch, 1) => Fault::HoldAnswer(held.clone()),
            _ => Fault::Pass,
        }
    }));
    let p = policy(Duration::from_secs(30));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/pay").policy(p.clone()))
        .default_policy(p)
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch();
    watch.check_once().await.unwrap();
    let (a, b) = (watch.clone(), watch.clone());
    let (ra, rb) = tokio::join!(a.check_once(), async {
        // The first check's answer is on its way back when the second
        // begins.
        door.arrived().await;
        let mut second = std::pin::pin!(b.check_once());
        // The second goes as far as it can without the first's answer
        // (one poll: the memory store answers at once).
        let mut early = tokio::select! {
            biased;
            r = &mut second => Some(r),
            () = std::future::ready(()) => None,
        };
        if early.is_none() && store.calls(StoreOp::AdvanceEpoch) > 2 {
            // It reached the store without waiting for the first: its
            // answer is read first.
            early = Some((&mut second).await);
        }
        door.open();
        match early {
            Some(r) => r,
            None => second.await,
        }
    });
    let (status, body) = read(
        svc.oneshot(post("/pay", "after-the-checks-001"))
            .await
            .unwrap(),
    )
    .await;
    assert!(
        ra.as_ref().unwrap().is_empty() && rb.as_ref().unwrap().is_empty(),
        "nothing was lost, yet: {ra:?} {rb:?}; a new key then gets {status} {body}"
    );
    assert_eq!(store.answered(StoreOp::AdvanceEpoch), 3, "both checks ran");
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// (a)/(h) A request meets the store down, and the store comes back
/// having forgotten a completed record; while the check that follows has
/// not answered (held at the door), claims wait (503 `store-unavailable`)
/// and a read of the forgotten record answers 503 `store-unavailable` too,
/// not 404 "no record".
#[tokio::test]
async fn a_read_while_claims_await_the_check_answers_unavailable_not_not_found() {
    let down = Arc::new(AtomicBool::new(false));
    let is_down = down.clone();
    let memory = Arc::new(MemoryStore::new());
    // Every check after the first waits at the door (a store just back,
    // under load), until the test opens it.
    let door = Door::new();
    let held = door.clone();
    let store = Arc::new(FaultyStore::with_faults(
        memory.clone(),
        move |call| match call.op {
            StoreOp::AdvanceEpoch if call.nth > 0 => Fault::Hold(held.clone()),
            StoreOp::Claim if is_down.load(Ordering::SeqCst) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
    ));
    let p = policy(Duration::from_secs(30));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/pay").policy(p.clone()))
        .default_policy(p)
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().interval(Duration::from_secs(3600));
    watch.check_once().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = watch.spawn(stop.clone());
    assert!(
        !handle.awaiting_store_check(),
        "nothing met the store down yet"
    );
    let (status, _) = read(
        svc.clone()
            .oneshot(post("/pay", "done-before-loss-01"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    down.store(true, Ordering::SeqCst);
    let (status, _) = read(
        svc.clone()
            .oneshot(post("/pay", "met-the-store-down"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    memory.forget_everything();
    down.store(false, Ordering::SeqCst);
    // Claims are gated (awaiting the check)...
    let (status, body) = read(
        svc.clone()
            .oneshot(post("/pay", "while-awaiting-001"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        handle.awaiting_store_check(),
        "the handle says what gates them"
    );
    // ...and so is a read of the forgotten record.
    let r = layer
        .read_path()
        .anonymous_reads(true)
        .oneshot(
            Request::get("/_idem/records/done-before-loss-01")
                .body(idem_http::Body::default())
                .unwrap(),
        )
        .await
        .unwrap();
    let (read_status, read_body) = read(r).await;
    let answered = store.answered(StoreOp::AdvanceEpoch);
    door.open();
    stop.cancel();
    running.await.unwrap();
    assert_eq!(answered, 1, "no check answered after the first");
    assert_eq!(
        read_status,
        StatusCode::SERVICE_UNAVAILABLE,
        "while claims await the check, a read says: {read_body}"
    );
    assert!(read_body.contains("store-unavailable"), "{read_body}");
}

/// (a) A completion is held in memory (the store was down when it
/// finished), and the store comes back having forgotten its record: the
/// held completion's retry writes the record again, so that once it has
/// left memory and the window has passed, a retry of its key replays the
/// result instead of executing again.
#[tokio::test]
async fn a_held_completion_forgotten_by_the_store_is_written_again_and_replayed() {
    let down = Arc::new(AtomicBool::new(false));
    let is_down = down.clone();
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::with_faults(
        memory.clone(),
        move |call| match call.op {
            StoreOp::Complete if is_down.load(Ordering::SeqCst) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
    ));
    let p = policy(Duration::from_millis(300));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/pay").policy(p.clone()))
        .default_policy(p)
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().interval(Duration::from_secs(3600));
    watch.check_once().await.unwrap();
    down.store(true, Ordering::SeqCst);
    let (status, first_body) = read(
        svc.clone()
            .oneshot(post("/pay", "held-intent-000001"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(handle.pending_completions(), 1, "held in memory");
    memory.forget_everything();
    down.store(false, Ordering::SeqCst);
    assert_eq!(watch.check_once().await.unwrap().len(), 1);
    // The held completion's retry meets the emptied store and settles (it
    // leaves memory, written again or not); then the window passes.
    until("the held completion has left memory", || {
        handle.pending_completions() == 0
    })
    .await;
    answers_until(&svc, "/pay", StatusCode::CREATED, "after-the-window").await;
    let executions = seen.executions.load(Ordering::SeqCst);
    let (status, body) = read(
        svc.clone()
            .oneshot(post("/pay", "held-intent-000001"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        seen.executions.load(Ordering::SeqCst),
        executions,
        "the key executed again although its result was held here: {status} {body}"
    );
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, first_body.as_str()),
        "the retry replays the held result"
    );
}

/// (b)/(f) A window asked for a very long time (`Duration::MAX`) is
/// capped at the longest lease a policy allows: a claim after a loss is
/// refused with a `Retry-After` of that length, not ~292 million years.
#[tokio::test]
async fn a_huge_window_is_capped_at_the_longest_lease() {
    let memory = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::builder_shared(memory.clone())
        .route(RouteRule::post("/pay"))
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().window(Duration::MAX);
    assert_eq!(watch.window_length(), idem_http::store_watch::MAX_WINDOW);
    watch.check_once().await.unwrap();
    memory.forget_everything();
    watch.check_once().await.unwrap();
    let r = svc
        .oneshot(post("/pay", "after-the-loss-0001"))
        .await
        .unwrap();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    assert!(
        retry_after.as_deref().is_some_and(|s| s.len() < 10),
        "Retry-After: {retry_after:?}"
    );
}

/// (b) A check that fails for a reason other than the store being down (a
/// Backend error: the role lacks rights on the new idem_epoch table, a
/// corrupt counter, MySQL's "affected n rows", a cluster master with no
/// epoch tag) keeps failing every interval while the store answers
/// claims: it gates nothing, and a new key sent just after each failed
/// check executes.
#[tokio::test]
async fn a_check_failing_other_than_unavailable_does_not_refuse_claims() {
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::with_faults(memory, |call| match call.op {
        StoreOp::AdvanceEpoch if call.nth > 0 => Fault::Fail(permission_denied()),
        _ => Fault::Pass,
    }));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/pay"))
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().interval(Duration::from_millis(50));
    watch.check_once().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = watch.spawn(stop.clone());
    let mut answers = Vec::new();
    for n in 0..5 {
        // One more check has failed (the store's failure is answered at
        // once, and the check handles it in the same step).
        let checks = store.calls(StoreOp::AdvanceEpoch);
        until("the running watch's next check has failed", || {
            store.calls(StoreOp::AdvanceEpoch) > checks
        })
        .await;
        let key = format!("a-new-intent-{n:06}");
        let (status, body) = read(svc.clone().oneshot(post("/pay", &key)).await.unwrap()).await;
        answers.push((status, body.contains("store-unavailable")));
    }
    let checks = store.calls(StoreOp::AdvanceEpoch);
    stop.cancel();
    running.await.unwrap();
    assert!(checks >= 6, "the checks kept failing: {checks}");
    assert_eq!(
        seen.executions.load(Ordering::SeqCst),
        5,
        "claims the store would grant were refused: {answers:?} (claims reached the store {} times)",
        store.calls(StoreOp::Claim)
    );
}

/// (b) A request meets the store down, and from then on every check fails
/// for another reason (the store answers, but the role lacks rights on
/// idem_epoch): the first such check settles the suspicion, and new keys
/// execute again. Before, nothing settled it, and one request that met
/// the store down refused every new claim until a restart.
#[tokio::test]
async fn a_check_failing_other_than_unavailable_settles_a_suspicion() {
    let down = Arc::new(AtomicBool::new(false));
    let is_down = down.clone();
    let store = Arc::new(FaultyStore::with_faults(
        Arc::new(MemoryStore::new()),
        move |call| match call.op {
            StoreOp::Claim if is_down.load(Ordering::SeqCst) => Fault::Fail(unavailable()),
            StoreOp::AdvanceEpoch if call.nth > 0 => Fault::Fail(permission_denied()),
            _ => Fault::Pass,
        },
    ));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/pay"))
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let watch = handle.store_watch().interval(Duration::from_millis(50));
    watch.check_once().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = watch.spawn(stop.clone());
    until("the watch runs", || store.calls(StoreOp::AdvanceEpoch) > 1).await;

    down.store(true, Ordering::SeqCst);
    let (status, _) = read(
        svc.clone()
            .oneshot(post("/pay", "met-the-store-down"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    down.store(false, Ordering::SeqCst);
    until("a failing check settles the suspicion", || {
        !handle.awaiting_store_check()
    })
    .await;
    let (status, body) = read(
        svc.clone()
            .oneshot(post("/pay", "after-the-suspicion"))
            .await
            .unwrap(),
    )
    .await;
    stop.cancel();
    running.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(seen.executions.load(Ordering::SeqCst), 1);
}
