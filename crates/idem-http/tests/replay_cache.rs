//! The replay cache under attack, over real HTTP: a copy kept in memory may
//! answer only what the store would answer with the same record. Each test
//! warms the cache (an execution, then one replay from the store), takes the
//! store down (`FaultyStore`), and sends variants: whatever the cache does
//! not answer reaches the store and gets 503, so a variant answered while
//! the store is down was answered from memory.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Concurrency, FieldSelection, Fingerprint, Key, MemoryStore, Operation, Policy, RecordId, Scope,
    Store,
};
use idem_http::RouteRule;
use idem_testkit::FaultyStore;
use reqwest::{Method, StatusCode};
use support::{App, key, spawn_app};

async fn problem_kind(resp: reqwest::Response) -> (StatusCode, String) {
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap();
    (status, body["type"].as_str().unwrap_or_default().to_owned())
}

/// One request: `method path` with `key`, a body and its media type, and
/// an optional `Authorization`.
#[derive(Clone)]
struct Req<'a> {
    method: Method,
    path: &'a str,
    key: &'a str,
    body: &'a str,
    media: &'a str,
    auth: Option<&'a str>,
}

impl Req<'_> {
    async fn send(&self, app: &App) -> reqwest::Response {
        let mut b = app
            .client
            .request(self.method.clone(), app.url(self.path))
            .header("idempotency-key", self.key)
            .header("content-type", self.media)
            .body(self.body.to_owned());
        if let Some(a) = self.auth {
            b = b.header("authorization", a);
        }
        b.send().await.unwrap()
    }
}

/// A replay from the store and one from memory must be the same bytes.
async fn assert_replay(resp: reqwest::Response, status: StatusCode, body: &str) {
    assert_eq!(resp.status(), status);
    assert_eq!(resp.headers()["idempotent-replayed"], "true");
    assert!(resp.headers().contains_key("idempotency-key-expires"));
    assert!(resp.headers().get("set-cookie").is_none());
    assert_eq!(resp.text().await.unwrap(), body);
}

/// Every part of a record's identity and of its fingerprint, varied one at
/// a time: another path under the same route pattern, another query,
/// another method on the same route, another media type, another body,
/// another caller, no caller, a key in another case. None is answered from
/// memory; each gets from the store what the store says. The same key
/// written as an sf-string (`"..."`) is the same key (docs/contract.md), so
/// it is a replay either way.
async fn variants_of_a_replayed_request_never_come_from_memory(store: Arc<dyn Store>) {
    let switch = Arc::new(FaultyStore::new(store));
    let app = spawn_app(switch.clone(), |b| {
        b.route(RouteRule::post("/status/{code}").method(Method::PUT))
    })
    .await;
    let k = key();
    let quoted = format!("\"{k}\"");
    let upper = k.to_uppercase();
    let first = Req {
        method: Method::POST,
        path: "/status/201?to=alice",
        key: &k,
        body: r#"{"amount":5}"#,
        media: "application/json",
        auth: Some("Bearer alice-token-0001"),
    };
    let resp = first.send(&app).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body = resp.text().await.unwrap();
    assert_replay(first.send(&app).await, StatusCode::CREATED, &body).await;
    assert_eq!(app.executions(), 1);

    switch.set_down(true);
    assert_replay(first.send(&app).await, StatusCode::CREATED, &body).await;
    let same_key_quoted = Req {
        key: &quoted,
        ..first.clone()
    };
    assert_replay(same_key_quoted.send(&app).await, StatusCode::CREATED, &body).await;

    let other_path = Req {
        path: "/status/200?to=alice",
        ..first.clone()
    };
    let other_query = Req {
        path: "/status/201?to=mallory",
        ..first.clone()
    };
    let no_query = Req {
        path: "/status/201",
        ..first.clone()
    };
    let other_media = Req {
        media: "text/plain",
        ..first.clone()
    };
    let other_body = Req {
        body: r#"{"amount":500}"#,
        ..first.clone()
    };
    let other_method = Req {
        method: Method::PUT,
        ..first.clone()
    };
    let other_caller = Req {
        auth: Some("Bearer mallory-token-01"),
        ..first.clone()
    };
    let anonymous = Req {
        auth: None,
        ..first.clone()
    };
    let other_case = Req {
        key: &upper,
        ..first.clone()
    };
    let refused = [
        ("another path", &other_path),
        ("another query", &other_query),
        ("no query", &no_query),
        ("another media type", &other_media),
        ("another body", &other_body),
    ];
    let others = [
        ("another method", &other_method),
        ("another caller", &other_caller),
        ("no caller", &anonymous),
        ("a key in another case", &other_case),
    ];
    for (what, req) in refused.iter().chain(&others) {
        let (status, kind) = problem_kind(req.send(&app).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "urn:idem:problem:store-unavailable"
            ),
            "{what} was answered without the store"
        );
    }
    assert_eq!(app.executions(), 1);

    // The store's own answers: the same key with other parameters is
    // refused; another operation, caller or key is another record.
    switch.set_down(false);
    for (what, req) in refused {
        let (status, kind) = problem_kind(req.send(&app).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                "urn:idem:problem:key-reused"
            ),
            "{what}"
        );
    }
    for (what, req) in others {
        let resp = req.send(&app).await;
        assert!(
            resp.headers().get("idempotent-replayed").is_none(),
            "{what} replayed another record"
        );
    }
    assert_eq!(
        app.executions(),
        1 + 3,
        "PUT is refused by the router (405)"
    );
    assert_replay(first.send(&app).await, StatusCode::CREATED, &body).await;
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
            per_store!($store: variants_of_a_replayed_request_never_come_from_memory);
        )*
    };
}

every_store!(memory, sqlite, postgres, redis);

fn memory() -> Arc<FaultyStore> {
    Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())))
}

/// A `failed` record (a deterministic 4xx) and a record whose response was
/// too large to store (`response-not-stored`) replay from memory exactly as
/// from the store; a transient failure (5xx) leaves no record, so nothing
/// is kept and its retry needs the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_unstored_records_replay_from_memory_as_stored() {
    let switch = memory();
    let app = spawn_app(switch.clone(), |b| b.response_limit(32)).await;

    let failed = key();
    let first = app.post("/status/404", &failed, "{}").send().await.unwrap();
    assert_eq!(first.status(), StatusCode::NOT_FOUND);
    let stored = first.text().await.unwrap();
    let from_store = app.post("/status/404", &failed, "{}").send().await.unwrap();
    assert_replay(from_store, StatusCode::NOT_FOUND, &stored).await;

    let large = key();
    let first = app.post("/orders", &large, "{}").send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.text().await.unwrap().len() > 32);
    let from_store = app.post("/orders", &large, "{}").send().await.unwrap();
    assert_eq!(
        from_store.headers()["content-type"],
        "application/problem+json"
    );
    let placeholder = from_store.text().await.unwrap();
    assert!(placeholder.contains("urn:idem:problem:response-not-stored"));

    let transient = key();
    for _ in 0..2 {
        let r = app
            .post("/status/503", &transient, "{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(app.executions(), 4);

    switch.set_down(true);
    let r = app.post("/status/404", &failed, "{}").send().await.unwrap();
    assert_replay(r, StatusCode::NOT_FOUND, &stored).await;
    let r = app.post("/orders", &large, "{}").send().await.unwrap();
    assert_replay(r, StatusCode::CREATED, &placeholder).await;
    let r = app
        .post("/status/503", &transient, "{}")
        .send()
        .await
        .unwrap();
    let (status, kind) = problem_kind(r).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(kind, "urn:idem:problem:store-unavailable");
    assert_eq!(app.executions(), 4);
}

/// An in-progress record is never kept: a duplicate while the first runs
/// is the store's to answer (409, or 503 while the store is down), in
/// conflict mode and in wait mode; once the first has finished and been
/// replayed, the copy answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_records_are_never_answered_from_memory() {
    for wait in [false, true] {
        let switch = memory();
        let app = spawn_app(switch.clone(), |b| {
            if wait {
                b.default_policy(
                    Policy::builder()
                        .concurrency(Concurrency::Wait {
                            limit: Duration::from_secs(10),
                        })
                        .build()
                        .unwrap(),
                )
            } else {
                b
            }
        })
        .await;
        let k = key();
        let running = tokio::spawn(app.post("/gated", &k, "{}").send());
        app.probe.started.notified().await;
        if !wait {
            let dup = app.post("/gated", &k, "{}").send().await.unwrap();
            assert_eq!(dup.status(), StatusCode::CONFLICT);
        }
        switch.set_down(true);
        let dup = app.post("/gated", &k, "{}").send().await.unwrap();
        let (status, kind) = problem_kind(dup).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "wait mode: {wait}");
        assert_eq!(kind, "urn:idem:problem:store-unavailable");
        switch.set_down(false);

        // In wait mode this duplicate waits for the first and replays it.
        let waiting = tokio::spawn(app.post("/gated", &k, "{}").send());
        app.probe.gate.add_permits(1);
        let first = running.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let body = first.text().await.unwrap();
        let second = waiting.await.unwrap().unwrap();
        if wait {
            assert_replay(second, StatusCode::CREATED, &body).await;
        } else {
            // Sent before or after the first finished: 409 or a replay.
            assert!(matches!(
                second.status(),
                StatusCode::CONFLICT | StatusCode::CREATED
            ));
            let r = app.post("/gated", &k, "{}").send().await.unwrap();
            assert_replay(r, StatusCode::CREATED, &body).await;
        }
        switch.set_down(true);
        let r = app.post("/gated", &k, "{}").send().await.unwrap();
        assert_replay(r, StatusCode::CREATED, &body).await;
        assert_eq!(app.executions(), 1);
    }
}

/// A record written under fingerprint version 1 (before the target was
/// bound) replays through the store's legacy comparison; its copy never
/// answers a request the legacy comparison would refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_records_replay_right_with_the_cache_on() {
    let inner = Arc::new(MemoryStore::new());
    let op = Operation::new("POST", "/orders");
    let body = br#"{"amount":5}"#;
    let k = key();
    let id = RecordId::new(Scope::anonymous(), op.clone(), Key::new(k.clone()).unwrap());
    let v1 = Fingerprint::compute_v1(&op, Some("application/json"), body, &FieldSelection::Whole);
    support::complete_as_an_old_release(&*inner, &id, v1).await;
    let switch = Arc::new(FaultyStore::new(inner));
    let app = spawn_app(switch.clone(), |b| b).await;
    for _ in 0..3 {
        let r = app
            .post("/orders", &k, r#"{ "amount": 5 }"#)
            .send()
            .await
            .unwrap();
        assert_replay(r, StatusCode::CREATED, "from the old release").await;
    }
    let r = app
        .post("/orders", &k, r#"{"amount":6}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    switch.set_down(true);
    let r = app
        .post("/orders", &k, r#"{"amount":6}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.executions(), 0);
}

/// Hits from memory are counted in `idem_replay_cache_hits_total`, a
/// counter without labels (never a key or a scope), and as `replayed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_are_counted_without_labels() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let app = spawn_app(memory(), |b| b).await;
    let k = key();
    for _ in 0..4 {
        let r = app
            .post("/orders", &k, "{}")
            .header("authorization", "Bearer alice-token-0001")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let mut hits = 0;
    for (ck, _unit, _desc, value) in snapshotter.snapshot().into_vec() {
        let key = ck.key();
        for label in key.labels() {
            assert!(!label.value().contains(&k), "a key leaked into a label");
        }
        if key.name() == idem_http::metrics::REPLAY_CACHE_HITS {
            assert_eq!(key.labels().count(), 0);
            if let DebugValue::Counter(n) = value {
                hits += n;
            }
        }
    }
    // Other tests of this binary may add theirs.
    assert!(hits >= 2, "{hits}");
}
