//! docs/contract.md, *The HTTP contract* over real HTTP (a bound port, reqwest as the
//! client), for every store: memory and SQLite always, PostgreSQL and Redis
//! where their URLs are set.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{Concurrency, Policy, Store};
use idem_http::{KeyRequirement, RouteRule, ScopeSource};
use idem_testkit::FaultyStore;
use reqwest::StatusCode;
use support::{App, key, spawn_app};

async fn problem(resp: reqwest::Response, status: StatusCode, kind: &str) -> serde_json::Value {
    assert_eq!(resp.status(), status);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["type"], format!("urn:idem:problem:{kind}"));
    assert_eq!(body["status"], status.as_u16());
    assert!(body["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(body["detail"].as_str().is_some_and(|t| !t.is_empty()));
    body
}

async fn default_app(store: Arc<dyn Store>) -> App {
    spawn_app(store, |b| b).await
}

async fn missing_key_is_400(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    let resp = app
        .client
        .post(app.url("/orders"))
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(resp, StatusCode::BAD_REQUEST, "missing-key").await;
    // PATCH needs one too; GET passes through untouched.
    let resp = app.client.patch(app.url("/orders")).send().await.unwrap();
    problem(resp, StatusCode::BAD_REQUEST, "missing-key").await;
    let resp = app.client.get(app.url("/ping")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.unwrap(), "pong");
    assert_eq!(app.executions(), 0);
}

async fn bad_keys_are_400(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXNpZ25hdHVyZQ";
    let long = "k".repeat(256);
    for bad in [
        "\"unterminated-key-value",
        "short",
        long.as_str(),
        jwt,
        "two-keys-folded-1, two-keys-folded-2",
        "\"ok-key-0000000001\";p=1",
    ] {
        let resp = app.post("/orders", bad, "{}").send().await.unwrap();
        let body = problem(resp, StatusCode::BAD_REQUEST, "invalid-key").await;
        assert!(
            body["detail"].as_str().unwrap().contains("Idempotency-Key"),
            "{body}"
        );
    }
    // The credential as a key.
    let resp = app
        .post("/orders", "tok_live_1234567890abcdef", "{}")
        .header("authorization", "Bearer tok_live_1234567890abcdef")
        .send()
        .await
        .unwrap();
    problem(resp, StatusCode::BAD_REQUEST, "invalid-key").await;
    // Two headers.
    let resp = app
        .post("/orders", &key(), "{}")
        .header("idempotency-key", key())
        .send()
        .await
        .unwrap();
    problem(resp, StatusCode::BAD_REQUEST, "repeated-key").await;
    assert_eq!(app.executions(), 0);
}

async fn replay_returns_the_stored_response(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    let k = key();
    let first = app
        .post("/orders", &k, r#"{"item":"book"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert!(
        first.headers().get("set-cookie").is_some(),
        "the first response is the handler's own"
    );
    let expires = first.headers()["idempotency-key-expires"]
        .to_str()
        .unwrap()
        .to_owned();
    let expires_at = httpdate::parse_http_date(&expires).unwrap();
    let in_a_day = std::time::SystemTime::now() + Duration::from_secs(24 * 3600);
    assert!(
        expires_at <= in_a_day && expires_at + Duration::from_secs(60) >= in_a_day,
        "{expires}"
    );
    let location = first.headers()["location"].clone();
    let body = first.text().await.unwrap();

    let again = app
        .post("/orders", &format!("\"{k}\""), r#"{"item":"book"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], location);
    assert_eq!(again.headers()["content-type"], "application/json");
    assert_eq!(again.headers()["idempotency-key-expires"], expires.as_str());
    assert!(
        again.headers().get("set-cookie").is_none(),
        "Set-Cookie is never replayed"
    );
    assert_eq!(again.text().await.unwrap(), body);
    assert_eq!(app.executions(), 1);
}

async fn reordered_json_replays_and_changed_json_is_422(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    let k = key();
    let first = app
        .post("/orders", &k, r#"{"from":"a","to":"b","amount":100}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let reordered = app
        .post(
            "/orders",
            &k,
            "{ \"amount\": 100,\n \"to\": \"b\", \"from\": \"a\" }",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(reordered.headers()["idempotent-replayed"], "true");
    let changed = app
        .post("/orders", &k, r#"{"from":"a","to":"b","amount":101}"#)
        .send()
        .await
        .unwrap();
    assert!(changed.headers().get("idempotency-key-expires").is_some());
    problem(changed, StatusCode::UNPROCESSABLE_ENTITY, "key-reused").await;
    assert_eq!(app.executions(), 1);
}

async fn in_flight_is_409_with_retry_after(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    let k = key();
    let first = tokio::spawn(app.post("/gated", &k, "{}").send());
    app.probe.started.notified().await;
    let dup = app.post("/gated", &k, "{}").send().await.unwrap();
    assert_eq!(dup.headers()["retry-after"], "1");
    problem(dup, StatusCode::CONFLICT, "in-flight").await;
    app.probe.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    let after = app.post("/gated", &k, "{}").send().await.unwrap();
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    assert_eq!(app.executions(), 1);
}

async fn body_over_the_limit_is_413(store: Arc<dyn Store>) {
    let app = spawn_app(store, |b| b.body_limit(1024)).await;
    let resp = app
        .post("/orders", &key(), &"x".repeat(2048))
        .send()
        .await
        .unwrap();
    problem(resp, StatusCode::PAYLOAD_TOO_LARGE, "body-too-large").await;
    // Without a Content-Length (streamed) too.
    let stream = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(vec![b'x'; 2048])]);
    let resp = app
        .client
        .post(app.url("/orders"))
        .header("idempotency-key", key())
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    problem(resp, StatusCode::PAYLOAD_TOO_LARGE, "body-too-large").await;
    assert_eq!(app.executions(), 0);
}

async fn tenants_do_not_share_keys(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    let k = key();
    let a = app
        .post("/orders", &k, "{}")
        .header("authorization", "Bearer tenant-a-token")
        .send()
        .await
        .unwrap();
    let a_body = a.text().await.unwrap();
    let b = app
        .post("/orders", &k, "{}")
        .header("authorization", "Bearer tenant-b-token")
        .send()
        .await
        .unwrap();
    assert!(
        b.headers().get("idempotent-replayed").is_none(),
        "B executes its own request"
    );
    let b_body = b.text().await.unwrap();
    assert!(b_body.contains("tenant-b-token") && !b_body.contains("tenant-a-token"));
    // A different body under the same key is not a mismatch for B either.
    let b2 = app
        .post("/orders", &key(), "{}")
        .header("authorization", "Bearer tenant-b-token")
        .send()
        .await
        .unwrap();
    assert_eq!(b2.status(), StatusCode::CREATED);
    let a_again = app
        .post("/orders", &k, "{}")
        .header("authorization", "Bearer tenant-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(a_again.text().await.unwrap(), a_body);
    assert_eq!(app.executions(), 3);
}

async fn a_tenant_header_scopes_too(store: Arc<dyn Store>) {
    let app = spawn_app(store, |b| {
        b.scope(ScopeSource::Header("x-tenant".parse().unwrap()))
    })
    .await;
    let k = key();
    for tenant in ["acme", "globex"] {
        let r = app
            .post("/orders", &k, "{}")
            .header("x-tenant", tenant)
            .send()
            .await
            .unwrap();
        assert!(r.headers().get("idempotent-replayed").is_none());
    }
    let r = app
        .post("/orders", &k, "{}")
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(app.executions(), 2);
}

async fn deterministic_failures_replay_and_transient_ones_release(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    // A deterministic 4xx is stored and replayed.
    let k = key();
    for _ in 0..2 {
        let r = app.post("/status/422", &k, "{}").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    assert_eq!(app.executions(), 1);
    // 5xx, 408, 429: released, the retry executes again.
    for code in [503u16, 500, 408, 429] {
        let k = key();
        let before = app.executions();
        for _ in 0..2 {
            let r = app
                .post(&format!("/status/{code}"), &k, "{}")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), code);
            assert!(r.headers().get("idempotent-replayed").is_none());
        }
        assert_eq!(app.executions(), before + 2, "status {code} must release");
    }
    // A panic: 500 problem, released.
    let k = key();
    let before = app.executions();
    for _ in 0..2 {
        let r = app.post("/panic", &k, "{}").send().await.unwrap();
        problem(r, StatusCode::INTERNAL_SERVER_ERROR, "handler-failed").await;
    }
    assert_eq!(app.executions(), before + 2);
}

async fn sixty_four_duplicates_in_conflict_mode(store: Arc<dyn Store>) {
    let app = default_app(store).await;
    let k = key();
    let first = tokio::spawn(app.post("/gated", &k, "{}").send());
    app.probe.started.notified().await;
    let dups: Vec<_> = (0..63)
        .map(|_| tokio::spawn(app.post("/gated", &k, "{}").send()))
        .collect();
    for d in dups {
        assert_eq!(d.await.unwrap().unwrap().status(), StatusCode::CONFLICT);
    }
    app.probe.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(app.executions(), 1);
}

async fn sixty_four_duplicates_in_wait_mode(store: Arc<dyn Store>) {
    let policy = Policy::builder()
        .concurrency(Concurrency::Wait {
            limit: Duration::from_secs(20),
        })
        .build()
        .unwrap();
    let app = spawn_app(store, |b| b.route(RouteRule::post("/gated").policy(policy))).await;
    let k = key();
    let all: Vec<_> = (0..64)
        .map(|_| tokio::spawn(app.post("/gated", &k, "{}").send()))
        .collect();
    app.probe.started.notified().await;
    app.probe.gate.add_permits(1);
    let mut bodies = Vec::new();
    for r in all {
        let r = r.await.unwrap().unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        bodies.push(r.text().await.unwrap());
    }
    assert_eq!(app.executions(), 1);
    assert!(
        bodies.iter().all(|b| b == &bodies[0]),
        "64 identical bodies"
    );
}

async fn a_client_that_hangs_up_does_not_cancel_the_handler(store: Arc<dyn Store>) {
    let policy = Policy::builder()
        .concurrency(Concurrency::Wait {
            limit: Duration::from_secs(20),
        })
        .build()
        .unwrap();
    let app = spawn_app(store, |b| b.route(RouteRule::post("/gated").policy(policy))).await;
    let k = key();
    let impatient = tokio::spawn(app.post("/gated", &k, "{}").send());
    app.probe.started.notified().await;
    impatient.abort(); // the client hangs up mid-request
    assert!(impatient.await.unwrap_err().is_cancelled());
    app.probe.gate.add_permits(1);
    app.probe.finished.notified().await;
    let retry = app.post("/gated", &k, "{}").send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), "gated 1");
    assert_eq!(app.executions(), 1);
}

async fn optional_routes_pass_keyless_requests(store: Arc<dyn Store>) {
    let app = spawn_app(store, |b| {
        b.route(RouteRule::post("/orders").key(KeyRequirement::Optional))
    })
    .await;
    for _ in 0..2 {
        let r = app
            .client
            .post(app.url("/orders"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(r.headers().get("idempotency-key-expires").is_none());
    }
    assert_eq!(app.executions(), 2);
}

/// Replays after the first come from the replay cache, not the store (they
/// are answered while the store is down), and the cache never answers
/// anything the store would not: other parameters, another caller, another
/// key all go to the store.
async fn repeated_replays_come_from_memory_and_keep_the_contract(store: Arc<dyn Store>) {
    let switch = Arc::new(FaultyStore::new(store));
    let app = spawn_app(switch.clone(), |b| b).await;
    let k = key();
    let send = |body: &'static str, who: &'static str| {
        app.post("/orders", &k, body)
            .header("authorization", who)
            .send()
    };
    let first = send(r#"{"item":"book"}"#, "Bearer alice").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let body = first.text().await.unwrap();
    let again = send(r#"{"item":"book"}"#, "Bearer alice").await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");

    switch.set_down(true);
    for _ in 0..3 {
        let kept = send(r#"{"item":"book"}"#, "Bearer alice").await.unwrap();
        assert_eq!(kept.status(), StatusCode::CREATED);
        assert_eq!(kept.headers()["idempotent-replayed"], "true");
        assert!(kept.headers().contains_key("idempotency-key-expires"));
        assert_eq!(kept.text().await.unwrap(), body);
    }
    // Whatever the cache holds, these are the store's to answer.
    let other_body = send(r#"{"item":"lamp"}"#, "Bearer alice").await.unwrap();
    problem(
        other_body,
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
    )
    .await;
    let other_caller = send(r#"{"item":"book"}"#, "Bearer mallory").await.unwrap();
    problem(
        other_caller,
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
    )
    .await;
    let other_key = app
        .post("/orders", &key(), r#"{"item":"book"}"#)
        .header("authorization", "Bearer alice")
        .send()
        .await
        .unwrap();
    problem(
        other_key,
        StatusCode::SERVICE_UNAVAILABLE,
        "store-unavailable",
    )
    .await;

    switch.set_down(false);
    let other_body = send(r#"{"item":"lamp"}"#, "Bearer alice").await.unwrap();
    problem(other_body, StatusCode::UNPROCESSABLE_ENTITY, "key-reused").await;
    let other_caller = send(r#"{"item":"book"}"#, "Bearer mallory").await.unwrap();
    assert_eq!(other_caller.status(), StatusCode::CREATED);
    assert!(other_caller.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.executions(), 2, "alice once, mallory once");
}

/// With the cache off, a replay needs the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_replay_cache_every_replay_reads_the_store() {
    let switch = Arc::new(FaultyStore::new(Arc::new(idem_core::MemoryStore::new())));
    let app = spawn_app(switch.clone(), |b| b.replay_cache(0)).await;
    let k = key();
    for _ in 0..2 {
        let r = app.post("/orders", &k, "{}").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    switch.set_down(true);
    let r = app.post("/orders", &k, "{}").send().await.unwrap();
    problem(r, StatusCode::SERVICE_UNAVAILABLE, "store-unavailable").await;
}

macro_rules! per_store {
    ($store:ident: $($test:ident),* $(,)?) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let Some(store) = crate::support::$store().await else { return };
                    super::$test(store).await;
                }
            )*
        }
    };
}

macro_rules! every_store {
    ($($store:ident),*) => {
        $(
            per_store!($store:
                missing_key_is_400,
                bad_keys_are_400,
                replay_returns_the_stored_response,
                reordered_json_replays_and_changed_json_is_422,
                in_flight_is_409_with_retry_after,
                body_over_the_limit_is_413,
                tenants_do_not_share_keys,
                a_tenant_header_scopes_too,
                deterministic_failures_replay_and_transient_ones_release,
                sixty_four_duplicates_in_conflict_mode,
                sixty_four_duplicates_in_wait_mode,
                a_client_that_hangs_up_does_not_cancel_the_handler,
                optional_routes_pass_keyless_requests,
                repeated_replays_come_from_memory_and_keep_the_contract,
            );
        )*
    };
}

every_store!(memory, sqlite, postgres, redis);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_gives_503_and_runs_nothing() {
    let app = spawn_app(Arc::new(FaultyStore::unavailable()), |b| b).await;
    let resp = app.post("/orders", &key(), "{}").send().await.unwrap();
    assert_eq!(resp.headers()["retry-after"], "1");
    problem(resp, StatusCode::SERVICE_UNAVAILABLE, "store-unavailable").await;
    assert_eq!(app.probe.executions.load(Ordering::SeqCst), 0);
}

/// The live record of an anonymous `POST path` with `key`, if any.
async fn anonymous_record(
    store: &Arc<dyn Store>,
    path: &str,
    key: String,
) -> Option<idem_core::Record> {
    let id = idem_core::RecordId::new(
        idem_core::Scope::anonymous(),
        idem_core::Operation::new("POST", path),
        idem_core::Key::new(key).unwrap(),
    );
    store.get(&id, idem_core::Timestamp::now()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_running_handlers_and_releases_their_claims() {
    let store: Arc<dyn Store> = Arc::new(idem_core::MemoryStore::new());
    let app = spawn_app(store.clone(), |b| b).await;
    let k = key();
    let running = tokio::spawn(app.post("/gated", &k, "{}").send());
    app.probe.started.notified().await;
    app.handle.shutdown(Duration::ZERO).await;
    let resp = running.await.unwrap().unwrap();
    problem(resp, StatusCode::SERVICE_UNAVAILABLE, "shutting-down").await;
    assert_eq!(
        anonymous_record(&store, "/gated", k).await,
        None,
        "claim released"
    );
}

/// Past the grace, a request claimed after the cancellation never reaches
/// the handler, so its claim is released even where outcomes are held
/// (the gateway's mode): a retry on the next process executes it instead
/// of waiting out a lease for something that never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_the_cancellation_is_released_unrun_even_when_holding() {
    let store: Arc<dyn Store> = Arc::new(idem_core::MemoryStore::new());
    let app = spawn_app(store.clone(), |b| b.hold_unknown_outcomes(true)).await;
    let first = key();
    let running = tokio::spawn(app.post("/gated", &first, "{}").send());
    app.probe.started.notified().await;
    app.handle.shutdown(Duration::ZERO).await;
    let held = running.await.unwrap().unwrap();
    problem(held, StatusCode::SERVICE_UNAVAILABLE, "shutting-down").await;
    assert!(
        anonymous_record(&store, "/gated", first).await.is_some(),
        "the cancelled execution is held (the lookup finds records)"
    );
    let ran = app.probe.executions.load(Ordering::SeqCst);

    let late = key();
    let resp = app.post("/orders", &late, "{}").send().await.unwrap();
    problem(resp, StatusCode::SERVICE_UNAVAILABLE, "shutting-down").await;
    assert_eq!(
        app.probe.executions.load(Ordering::SeqCst),
        ran,
        "the late request never reached the handler"
    );
    assert_eq!(
        anonymous_record(&store, "/orders", late).await,
        None,
        "its claim released, not held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_handlers_finish_within_the_grace_period() {
    let app = spawn_app(Arc::new(idem_core::MemoryStore::new()), |b| b).await;
    let k = key();
    let running = tokio::spawn(app.post("/gated", &k, "{}").send());
    app.probe.started.notified().await;
    let shutdown = tokio::spawn({
        let handle = app.handle.clone();
        async move { handle.shutdown(Duration::from_secs(30)).await }
    });
    app.probe.gate.add_permits(1);
    shutdown.await.unwrap();
    assert_eq!(
        running.await.unwrap().unwrap().status(),
        StatusCode::CREATED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciliation_read_path_shows_the_callers_record() {
    let store: Arc<dyn Store> = Arc::new(idem_core::MemoryStore::new());
    let app = spawn_app(store.clone(), |b| b).await;
    let k = key();
    let created = app
        .post("/orders", &k, "{}")
        .header("authorization", "Bearer reader-token")
        .send()
        .await
        .unwrap();
    let body = created.text().await.unwrap();
    let id = |cred: &[u8]| {
        idem_core::RecordId::new(
            idem_core::Scope::from_credential(cred),
            idem_core::Operation::new("POST", "/orders"),
            idem_core::Key::new(k.clone()).unwrap(),
        )
    };
    let view = idem_http::lookup(&*store, &id(b"Bearer reader-token"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.status, "completed");
    assert_eq!(view.operation, "POST /orders");
    let response = view.response.unwrap();
    assert_eq!(response.status, 201);
    assert_eq!(response.body.as_deref(), Some(body.as_str()));
    assert!(response.headers.iter().all(|(n, _)| n != "set-cookie"));
    // Another credential sees nothing.
    assert_eq!(
        idem_http::lookup(&*store, &id(b"Bearer someone-else"))
            .await
            .unwrap(),
        None
    );
}

fn wait_policy(limit: Duration) -> Policy {
    Policy::builder()
        .concurrency(Concurrency::Wait { limit })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_past_its_limit_gets_409() {
    let app = spawn_app(Arc::new(idem_core::MemoryStore::new()), |b| {
        b.route(RouteRule::post("/gated").policy(wait_policy(Duration::from_millis(200))))
    })
    .await;
    let k = key();
    let first = tokio::spawn(app.post("/gated", &k, "{}").send());
    app.probe.started.notified().await;
    let dup = app.post("/gated", &k, "{}").send().await.unwrap();
    problem(dup, StatusCode::CONFLICT, "in-flight").await;
    app.probe.gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(app.executions(), 1);
}

/// Two instances (two layers, one shared store): a waiter on the other
/// instance is not notified, so it polls the store and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_another_instance_polls_and_replays() {
    let store: Arc<dyn Store> = Arc::new(idem_core::MemoryStore::new());
    let a = spawn_app(store.clone(), |b| b).await;
    let b = spawn_app(store, |b| {
        b.route(RouteRule::post("/gated").policy(wait_policy(Duration::from_secs(20))))
    })
    .await;
    let k = key();
    let first = tokio::spawn(a.post("/gated", &k, "{}").send());
    a.probe.started.notified().await;
    let waiter = tokio::spawn(b.post("/gated", &k, "{}").send());
    a.probe.gate.add_permits(1);
    let first = first.await.unwrap().unwrap();
    let first_body = first.text().await.unwrap();
    let waited = waiter.await.unwrap().unwrap();
    assert_eq!(waited.headers()["idempotent-replayed"], "true");
    assert_eq!(waited.text().await.unwrap(), first_body);
    assert_eq!(a.executions() + b.executions(), 1);
}
