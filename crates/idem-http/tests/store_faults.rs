//! The layer when its store fails: a completion the store does not take is
//! held, replayed to retries and stored once the store is back; a running
//! execution keeps its lease alive; a takeover of an abandoned claim does
//! what the route's takeover policy says.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{
    Claim, ClaimRequest, FieldSelection, Fingerprint, Key, MemoryStore, Operation, Policy,
    ReconcileReport, RecordId, Scope, Status, Store, StoreError, StoreErrorKind, Takeover,
    Timestamp, reconcile_once,
};
use idem_http::{IdempotencyContext, IdempotencyLayer, RouteRule};
use idem_testkit::{Fault, FaultyStore, StoreOp};
use tokio::sync::{Notify, mpsc};
use tower::{Layer, ServiceExt};

/// What the handler saw.
#[derive(Default)]
struct Seen {
    executions: AtomicUsize,
    takeover_headers: std::sync::Mutex<Vec<Option<String>>>,
    takeover_flags: std::sync::Mutex<Vec<bool>>,
    /// `/slow` waits for this.
    release: Notify,
}

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
            seen.takeover_headers.lock().unwrap().push(
                req.headers()
                    .get("idem-takeover")
                    .map(|v| v.to_str().unwrap().to_owned()),
            );
            let flag = req
                .extensions()
                .get::<IdempotencyContext>()
                .is_some_and(IdempotencyContext::is_takeover);
            seen.takeover_flags.lock().unwrap().push(flag);
            if req.uri().path() == "/slow" {
                seen.release.notified().await;
            }
            // A route whose operation refuses (a transient status).
            let status = if req.uri().path().ends_with("-503") {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::CREATED
            };
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(format!("{{\"payment\":{n}}}"))))
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    })
}

fn post(path: &str, key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn read(r: Response<idem_http::Body>) -> (StatusCode, Option<String>, String) {
    let status = r.status();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, replayed, String::from_utf8(body.to_vec()).unwrap())
}

fn id_of(path: &str, key: &str) -> RecordId {
    RecordId::new(
        Scope::anonymous(),
        Operation::new("POST", path),
        Key::new(key).unwrap(),
    )
}

fn unavailable() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "injected: completion lost")
}

/// A layer on `/pay` over a memory store behind a [`FaultyStore`], and what
/// a test looks at.
struct Rig<S> {
    /// The store behind the faults.
    memory: Arc<MemoryStore>,
    store: Arc<FaultyStore>,
    handle: idem_http::LayerHandle,
    seen: Arc<Seen>,
    svc: S,
}

/// A [`Rig`] whose faulty store asks `faults` about each call, with
/// `configure` applied to the layer's builder.
fn rig(
    faults: impl Fn(idem_testkit::Call) -> Fault + Send + Sync + 'static,
    configure: impl FnOnce(idem_http::IdempotencyLayerBuilder) -> idem_http::IdempotencyLayerBuilder,
) -> Rig<
    impl tower::Service<
        Request<Full<Bytes>>,
        Response = Response<idem_http::Body>,
        Error = Infallible,
        Future = impl Send,
    > + Clone,
> {
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::with_faults(memory.clone(), faults));
    let layer =
        configure(IdempotencyLayer::builder_shared(store.clone()).route(RouteRule::post("/pay")))
            .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    Rig {
        memory,
        store,
        handle,
        seen,
        svc,
    }
}

/// The store refuses the first eight completions (longer than the two
/// seconds an answer waits for its completion): the client still gets its
/// answer, a retry is replayed from the held answer (and another body
/// under the key is 422), nothing runs twice, and the completion is stored
/// once the store takes it.
#[tokio::test(start_paused = true)]
async fn a_completion_the_store_refuses_is_held_replayed_and_stored_later() {
    let Rig {
        memory,
        store,
        handle,
        seen,
        svc,
    } = rig(
        |call| match (call.op, call.nth) {
            (StoreOp::Complete, 0..=7) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
        |b| b,
    );
    let key = "held-completion-000001";

    let (status, replayed, first) = read(
        svc.clone()
            .oneshot(post("/pay", key, "{\"a\":1}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(replayed, None);
    assert_eq!(first, "{\"payment\":1}");
    // The completion failed: the record is still in progress in the store.
    let record = memory
        .get(&id_of("/pay", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(handle.pending_completions(), 1);

    // A retry meanwhile: the held answer, marked as a replay.
    let (status, replayed, again) = read(
        svc.clone()
            .oneshot(post("/pay", key, "{\"a\":1}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(again, first);
    // Another body under the key: refused, not run.
    let (status, _, body) = read(
        svc.clone()
            .oneshot(post("/pay", key, "{\"a\":2}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(seen.executions.load(Ordering::SeqCst), 1);

    // The shutdown waits for the held completion's retries (paused time
    // runs their backoff at once): the ninth attempt is stored.
    handle.shutdown(Duration::from_secs(60)).await;
    assert_eq!(handle.pending_completions(), 0);
    assert_eq!(store.calls(StoreOp::Complete), 9);
    let record = memory
        .get(&id_of("/pay", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.response.unwrap().body, first.as_bytes());
}

/// The store fails the release of a transient answer's claim in the
/// request (three tries) and twice more: the release is owed and retried
/// in the background until the store takes it, so that the intent's retry
/// runs again at once rather than meeting 409 until the lease (30 s) ends.
#[tokio::test(start_paused = true)]
async fn a_release_the_store_fails_is_owed_until_it_takes_it() {
    let Rig {
        memory,
        store,
        handle,
        seen,
        svc,
    } = rig(
        |call| match (call.op, call.nth) {
            (StoreOp::Release, 0..=4) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
        |b| b,
    );
    let key = "owed-release-0000001";
    let id = id_of("/pay-503", key);

    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/pay-503", key, "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        store.calls(StoreOp::Release),
        3,
        "three tries in the request"
    );
    assert!(
        memory.get(&id, Timestamp::now()).await.unwrap().is_some(),
        "the claim is still in the store when the answer leaves"
    );
    // Paused time runs the owed release's backoff as soon as nothing else
    // can run; well within the lease it is taken.
    let started = tokio::time::Instant::now();
    while memory.get(&id, Timestamp::now()).await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the owed release was not taken within the lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.calls(StoreOp::Release), 6, "taken at its third retry");
    assert_eq!(handle.executions(), 0, "the owed release's task ended");

    // The retry runs again (its answer is transient again).
    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/pay-503", key, "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(seen.executions.load(Ordering::SeqCst), 2);
}

/// Over the held-answer budget the answer is held as its status and a
/// `response-not-stored` problem: the retry learns the request ran, and it
/// is that placeholder the store gets.
#[tokio::test(start_paused = true)]
async fn over_the_budget_an_answer_is_held_as_a_placeholder() {
    let Rig {
        memory,
        handle,
        seen,
        svc,
        ..
    } = rig(
        |call| match (call.op, call.nth) {
            (StoreOp::Complete, 0..=4) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
        |b| b.pending_completion_budget(0),
    );
    let key = "held-completion-000002";

    let (status, _, first) =
        read(svc.clone().oneshot(post("/pay", key, "{}")).await.unwrap()).await;
    assert_eq!(
        (status, first.as_str()),
        (StatusCode::CREATED, "{\"payment\":1}")
    );
    let (status, replayed, body) =
        read(svc.clone().oneshot(post("/pay", key, "{}")).await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(replayed.as_deref(), Some("true"));
    assert!(body.contains("response-not-stored"), "{body}");
    assert!(
        body.contains("memory for answers awaiting the store was full"),
        "{body}"
    );
    assert_eq!(seen.executions.load(Ordering::SeqCst), 1);

    handle.shutdown(Duration::from_secs(60)).await;
    let record = memory
        .get(&id_of("/pay", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.response.unwrap().status, 201);
}

/// A store that never takes the completion: the shutdown gives up after
/// its grace and one more attempt, and the key stays in progress (the
/// crash window's policy decides after the lease), never released.
#[tokio::test(start_paused = true)]
async fn a_completion_never_taken_leaves_the_key_in_progress_at_shutdown() {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::with_faults(
        memory.clone(),
        |call| match call.op {
            StoreOp::Complete | StoreOp::ExtendLease => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
    ));
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/pay"))
        .build();
    let handle = layer.handle();
    let svc = layer.layer(service(Arc::default()));
    let key = "held-completion-000003";
    let (status, _, _) = read(svc.clone().oneshot(post("/pay", key, "{}")).await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);

    handle.shutdown(Duration::from_secs(3)).await;
    assert_eq!(handle.pending_completions(), 0);
    // The first attempt, the retries through the grace, and the last one.
    assert!(
        store.calls(StoreOp::Complete) >= 4,
        "{}",
        store.calls(StoreOp::Complete)
    );
    assert_eq!(store.calls(StoreOp::Release), 0);
    let record = memory
        .get(&id_of("/pay", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::InProgress);
}

/// A running execution renews its lease: with a 300 ms lease, a duplicate
/// sent after three heartbeats (over 900 ms) meets 409, not a takeover,
/// and the first's answer is stored.
#[tokio::test]
async fn a_long_execution_keeps_its_lease_alive() {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (beats, mut beat) = mpsc::unbounded_channel();
    let store = Arc::new(FaultyStore::with_faults(memory.clone(), move |call| {
        if call.op == StoreOp::ExtendLease {
            let _ = beats.send(());
        }
        Fault::Pass
    }));
    let policy = Policy::builder()
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/slow").policy(policy))
        .store_timeout(Duration::from_millis(100))
        .build();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let key = "heartbeat-key-0000001";

    let first = tokio::spawn(svc.clone().oneshot(post("/slow", key, "{}")));
    for _ in 0..3 {
        beat.recv().await.unwrap();
    }
    let claimed = memory
        .get(&id_of("/slow", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert!(claimed.lease_is_live(Timestamp::now()));
    let (status, _, body) =
        read(svc.clone().oneshot(post("/slow", key, "{}")).await.unwrap()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(seen.executions.load(Ordering::SeqCst), 1);

    seen.release.notify_one();
    let (status, _, _) = read(first.await.unwrap().unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    let record = memory
        .get(&id_of("/slow", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
}

/// A claim left in progress by an executor that died, its lease over:
/// claimed directly in the store a minute ago with a one-second lease.
async fn abandoned(store: &dyn Store, path: &str, key: &str, body: &[u8]) {
    let operation = Operation::new("POST", path);
    let req = ClaimRequest {
        id: id_of(path, key),
        fingerprint: Fingerprint::compute_request(
            &operation,
            path,
            Some("application/json"),
            body,
            &FieldSelection::Whole,
        ),
        now: Timestamp::now() - Duration::from_secs(60),
        lease: Duration::from_secs(1),
        ttl: Duration::from_secs(3600),
    };
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Acquired(_)
    ));
}

fn layer_with(store: Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::builder_shared(store)
        .route(RouteRule::post("/held"))
        .route(RouteRule::post("/announced").takeover(Takeover::Announce))
        .route(RouteRule::post("/again").takeover(Takeover::Reexecute))
        .route(RouteRule::post("/announced-503").takeover(Takeover::Announce))
        .build()
}

/// The three takeover policies on an abandoned claim: `hold` (the default)
/// runs nothing and answers `outcome-unresolved`; `announce` runs it with
/// `Idem-Takeover: <key>` and the context's flag; `reexecute` runs it as
/// new. A client's own `Idem-Takeover` never reaches the handler.
#[tokio::test]
async fn a_takeover_does_what_its_route_says() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let seen = Arc::new(Seen::default());
    let svc = layer_with(store.clone()).layer(service(seen.clone()));
    for path in ["/held", "/announced", "/again"] {
        abandoned(&*store, path, "takeover-key-00000001", b"{}").await;
    }

    let (status, _, body) = read(
        svc.clone()
            .oneshot(post("/held", "takeover-key-00000001", "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("outcome-unresolved"), "{body}");
    assert!(body.contains("/_idem/records/"), "{body}");
    assert_eq!(seen.executions.load(Ordering::SeqCst), 0);
    let held = store
        .get(&id_of("/held", "takeover-key-00000001"), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        held.status,
        Status::InProgress,
        "the claim is kept, not released"
    );

    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/announced", "takeover-key-00000001", "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/again", "takeover-key-00000001", "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // A fresh key on the announcing route, with a forged header.
    let mut forged = post("/announced", "takeover-key-00000002", "{}");
    forged
        .headers_mut()
        .insert("idem-takeover", "takeover-key-00000002".parse().unwrap());
    let (status, _, _) = read(svc.clone().oneshot(forged).await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);

    assert_eq!(
        *seen.takeover_headers.lock().unwrap(),
        [Some("takeover-key-00000001".to_owned()), None, None]
    );
    assert_eq!(*seen.takeover_flags.lock().unwrap(), [true, false, false]);
}

/// The reconciler a gateway runs follows the policy: a stale record is
/// released only where the route re-executes, and left where it holds or
/// announces.
#[tokio::test]
async fn the_takeover_reconciler_releases_only_where_the_route_reexecutes() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let layer = layer_with(store.clone());
    for path in ["/held", "/announced", "/again", "/unlisted"] {
        abandoned(&*store, path, "stale-record-key-0001", b"{}").await;
    }
    let report = reconcile_once(
        &*store,
        &layer.handle().takeover_reconciler(),
        Timestamp::now(),
        10,
    )
    .await
    .unwrap();
    assert_eq!(
        report,
        ReconcileReport {
            released: 1,
            left: 3,
            ..ReconcileReport::default()
        }
    );
    let gone = store
        .get(&id_of("/again", "stale-record-key-0001"), Timestamp::now())
        .await
        .unwrap();
    assert!(gone.is_none());
    for path in ["/held", "/announced", "/unlisted"] {
        let kept = store
            .get(&id_of(path, "stale-record-key-0001"), Timestamp::now())
            .await
            .unwrap();
        assert!(kept.is_some(), "{path}");
    }
}

/// An announced takeover that ends without a result (here the operation
/// answers 503, a transient status that would release the key) keeps its
/// claim: released, the next claim would be a fresh one, and the operation
/// would run unannounced beside the earlier attempt that may have acted.
#[tokio::test]
async fn an_announced_takeover_without_a_result_keeps_its_claim() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let seen = Arc::new(Seen::default());
    let svc = layer_with(store.clone()).layer(service(seen.clone()));
    let key = "takeover-key-00000503";
    abandoned(&*store, "/announced-503", key, b"{}").await;
    let before = store
        .get(&id_of("/announced-503", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();

    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/announced-503", key, "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        *seen.takeover_headers.lock().unwrap(),
        [Some(key.to_owned())]
    );
    let after = store
        .get(&id_of("/announced-503", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.status, Status::InProgress, "kept, not released");
    assert!(after.fence > before.fence, "held by the takeover's claim");

    // A fresh key on the same route is released as usual.
    let fresh = "takeover-key-00000504";
    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/announced-503", fresh, "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        store
            .get(&id_of("/announced-503", fresh), Timestamp::now())
            .await
            .unwrap()
            .is_none()
    );
}

/// A completion the store refuses outright (not unavailable: too large
/// for the backend, say) would be refused for ever: its placeholder is held
/// and stored at once, not the whole answer retried for the record's life.
#[tokio::test(start_paused = true)]
async fn a_completion_the_store_refuses_outright_is_held_as_its_placeholder() {
    let Rig {
        memory,
        handle,
        svc,
        ..
    } = rig(
        |call| match (call.op, call.nth) {
            (StoreOp::Complete, 0..=4) => Fault::Fail(StoreError::new(
                StoreErrorKind::Backend,
                "injected: packet too large",
            )),
            _ => Fault::Pass,
        },
        |b| b,
    );
    let key = "refused-completion-0001";
    let (status, _, _) = read(svc.clone().oneshot(post("/pay", key, "{}")).await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, replayed, body) =
        read(svc.clone().oneshot(post("/pay", key, "{}")).await.unwrap()).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (StatusCode::CREATED, Some("true"))
    );
    assert!(body.contains("response-not-stored"), "{body}");
    handle.shutdown(Duration::from_secs(60)).await;
    let record = memory
        .get(&id_of("/pay", key), Timestamp::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Completed);
    let stored = String::from_utf8(record.response.unwrap().body).unwrap();
    assert!(stored.contains("response-not-stored"), "{stored}");
}

/// A client's own `Idem-Takeover` never reaches the handler, on a route
/// the layer passes through too.
#[tokio::test]
async fn a_forged_takeover_header_is_removed_from_passed_requests() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let seen = Arc::new(Seen::default());
    let svc = layer_with(store).layer(service(seen.clone()));
    let forged = Request::get("/anything")
        .header("idem-takeover", "someone-elses-key-0001")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, _) = read(svc.oneshot(forged).await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(*seen.takeover_headers.lock().unwrap(), [None]);
}

/// Polls `svc` with a new key on `/pay` until its answer is what `want`
/// accepts, for up
/// to ten seconds: what a watch running in the background did shows in the
/// answers.
async fn answers_until<S>(
    svc: &S,
    want: impl Fn(StatusCode, &str) -> bool,
    prefix: &str,
) -> (StatusCode, String)
where
    S: tower::Service<
            Request<Full<Bytes>>,
            Response = Response<idem_http::Body>,
            Error = Infallible,
        > + Clone,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for n in 0.. {
        let key = format!("{prefix}-{n:012}");
        let (status, _, body) =
            read(svc.clone().oneshot(post("/pay", &key, "{}")).await.unwrap()).await;
        if want(status, &body) || tokio::time::Instant::now() > deadline {
            return (status, body);
        }
        tokio::task::yield_now().await;
    }
    unreachable!()
}

/// The store forgets everything (a Redis restarted without persistence)
/// while the layer serves: the watch, woken by the failed claim that met
/// the store down, checks at once (its interval is an hour) while claims
/// wait for it (503 `store-unavailable`); then new claims are refused with
/// `store-lost-records` and `Retry-After` for the loss window (the route's
/// lease), and a read of a key the store forgot answers the same, not "no
/// record". Nothing executes until the window has passed; then keys
/// execute again.
#[tokio::test]
async fn a_store_that_forgot_refuses_new_claims_for_the_loss_window() {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let is_down = down.clone();
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::with_faults(
        memory.clone(),
        move |call| match call.op {
            StoreOp::Claim if is_down.load(Ordering::SeqCst) => Fault::Fail(unavailable()),
            _ => Fault::Pass,
        },
    ));
    let short = Policy::builder()
        .lease(Duration::from_millis(700))
        .build()
        .unwrap();
    let layer = IdempotencyLayer::builder_shared(store)
        .route(RouteRule::post("/pay").policy(short.clone()))
        .default_policy(short)
        .build();
    let handle = layer.handle();
    let seen = Arc::new(Seen::default());
    let svc = layer.layer(service(seen.clone()));
    let stop = tokio_util::sync::CancellationToken::new();
    let watch = handle.store_watch().interval(Duration::from_secs(3600));
    assert_eq!(watch.window_length(), Duration::from_millis(700));
    // The first check (run before the loop waits) learns the epoch.
    watch.check_once().await.unwrap();
    let running = watch.spawn(stop.clone());

    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/pay", "before-the-loss-0001", "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);

    // The store goes down and comes back empty.
    down.store(true, Ordering::SeqCst);
    let (status, _, _) = read(
        svc.clone()
            .oneshot(post("/pay", "while-it-is-down-01", "{}"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    memory.forget_everything();
    down.store(false, Ordering::SeqCst);

    let executions = seen.executions.load(Ordering::SeqCst);
    let (status, body) = answers_until(
        &svc,
        |_, body| body.contains("store-lost-records"),
        "in-the-window",
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("store-lost-records"), "{body}");
    let r = svc
        .clone()
        .oneshot(post("/pay", "in-the-window-header", "{}"))
        .await
        .unwrap();
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after <= 1, "the window is the lease: {retry_after}");
    let read = Request::get("/_idem/records/before-the-loss-0001")
        .body(idem_http::Body::default())
        .unwrap();
    let r = layer
        .read_path()
        .anonymous_reads(true)
        .oneshot(read)
        .await
        .unwrap();
    let (status, _, body) = self::read(r).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("store-lost-records"), "{body}");
    assert_eq!(
        seen.executions.load(Ordering::SeqCst),
        executions,
        "nothing ran in the window"
    );

    // After the window, new keys execute again.
    let (status, body) = answers_until(
        &svc,
        |status, _| status == StatusCode::CREATED,
        "after-the-window",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    stop.cancel();
    running.await.unwrap();
}
