//! A layer configured with another key header (`key_header`), over real
//! HTTP: it deduplicates on that header alone, ignores `Idempotency-Key`,
//! and refuses a keyed route without it, naming the header it wants.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;

use http::HeaderName;
use idem_core::Store;
use reqwest::StatusCode;
use support::{App, key, spawn_app};

const HEADER: &str = "x-request-key";

async fn app(store: Arc<dyn Store>) -> App {
    spawn_app(store, |b| b.key_header(HeaderName::from_static(HEADER))).await
}

async fn problem(resp: reqwest::Response, status: StatusCode, kind: &str) -> serde_json::Value {
    assert_eq!(resp.status(), status);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["type"], format!("urn:idem:problem:{kind}"));
    body
}

fn post(app: &App, headers: &[(&str, &str)], body: &str) -> reqwest::RequestBuilder {
    let mut r = app
        .client
        .post(app.url("/orders"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        r = r.header(*name, *value);
    }
    r
}

async fn the_configured_header_is_the_key(store: Arc<dyn Store>) {
    let app = app(store).await;
    let k = key();
    let first = post(&app, &[(HEADER, &k)], r#"{"item":"book"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert!(
        first.headers().get("idempotency-key-expires").is_some(),
        "responses keep the contract's header names"
    );
    let body = first.text().await.unwrap();

    // The same key under the configured header: a replay, whatever
    // Idempotency-Key says (it is an ordinary header here).
    for other in [None, Some(key()), Some(key())] {
        let mut headers = vec![(HEADER, k.as_str())];
        if let Some(other) = &other {
            headers.push(("idempotency-key", other));
        }
        let again = post(&app, &headers, r#"{"item":"book"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::CREATED, "{other:?}");
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{other:?}");
        assert_eq!(again.text().await.unwrap(), body);
    }
    assert_eq!(app.executions(), 1);

    // A new key under the configured header executes once more.
    let fresh = post(&app, &[(HEADER, &key())], r#"{"item":"book"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(fresh.status(), StatusCode::CREATED);
    assert_eq!(app.executions(), 2);
}

async fn idempotency_key_alone_is_a_missing_key(store: Arc<dyn Store>) {
    let app = app(store).await;
    let k = key();
    for _ in 0..2 {
        let resp = post(&app, &[("idempotency-key", &k)], "{}")
            .send()
            .await
            .unwrap();
        let body = problem(resp, StatusCode::BAD_REQUEST, "missing-key").await;
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("X-Request-Key"), "{detail}");
    }
    let resp = post(&app, &[], "{}").send().await.unwrap();
    problem(resp, StatusCode::BAD_REQUEST, "missing-key").await;

    // Twice under the configured name: repeated.
    let resp = post(&app, &[(HEADER, &key()), (HEADER, &key())], "{}")
        .send()
        .await
        .unwrap();
    let body = problem(resp, StatusCode::BAD_REQUEST, "repeated-key").await;
    assert!(
        body["detail"].as_str().unwrap().contains("X-Request-Key"),
        "{body}"
    );
    // Malformed under the configured name: invalid, as with the default.
    let resp = post(&app, &[(HEADER, "short")], "{}").send().await.unwrap();
    problem(resp, StatusCode::BAD_REQUEST, "invalid-key").await;
    assert_eq!(app.executions(), 0);

    // Methods that pass through still do.
    let resp = app.client.get(app.url("/ping")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// On a route whose key is optional, a request that carries its key under
/// the standard name only is refused, not passed through unprotected: its
/// client believes it may retry it. Keyless requests still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_under_the_standard_name_is_never_passed_through_unprotected() {
    let app = spawn_app(Arc::new(idem_core::MemoryStore::new()), |b| {
        b.key_header(HeaderName::from_static(HEADER))
            .route(idem_http::RouteRule::post("/orders").key(idem_http::KeyRequirement::Optional))
    })
    .await;
    let k = key();
    for _ in 0..2 {
        let resp = post(&app, &[("idempotency-key", &k)], "{}")
            .send()
            .await
            .unwrap();
        let body = problem(resp, StatusCode::BAD_REQUEST, "missing-key").await;
        assert!(
            body["detail"].as_str().unwrap().contains("X-Request-Key"),
            "{body}"
        );
    }
    assert_eq!(app.executions(), 0);
    let resp = post(&app, &[], "{}").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = post(&app, &[(HEADER, &k)], "{}").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = post(&app, &[(HEADER, &k)], "{}").send().await.unwrap();
    assert_eq!(resp.headers()["idempotent-replayed"], "true");
    assert_eq!(app.executions(), 2);
}

macro_rules! per_store {
    ($($store:ident),*) => {
        $(
            mod $store {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn the_configured_header_is_the_key() {
                    let Some(store) = crate::support::$store().await else { return };
                    super::the_configured_header_is_the_key(store).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn idempotency_key_alone_is_a_missing_key() {
                    let Some(store) = crate::support::$store().await else { return };
                    super::idempotency_key_alone_is_a_missing_key(store).await;
                }
            }
        )*
    };
}

per_store!(memory, sqlite);
