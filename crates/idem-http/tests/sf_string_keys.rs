//! The two forms of an `Idempotency-Key`, over real HTTP: the RFC 8941
//! sf-string the IETF draft writes (`"…"`, what idem's retry client sends)
//! and the bare token many clients send name the same key, so a client
//! that switches form between attempts replays instead of executing twice.
//! Malformed sf-strings are the usual 400 `invalid-key`, and the server
//! keeps serving.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;

use http::HeaderValue;
use idem_core::Store;
use idem_http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use reqwest::StatusCode;
use support::{App, key, spawn_app};

/// The sf-string of a key without `"` or `\`.
fn quoted(key: &str) -> String {
    format!("\"{key}\"")
}

async fn created(resp: reqwest::Response, replayed: bool) -> String {
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(
        resp.headers()
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v == "true"),
        replayed
    );
    resp.text().await.unwrap()
}

async fn a_client_that_switches_form_replays(store: Arc<dyn Store>) {
    let app = spawn_app(store, |b| b).await;
    let body = r#"{"amount":100}"#;

    // Bare first, then the sf-string, then bare again.
    let k = key();
    let first = created(app.post("/orders", &k, body).send().await.unwrap(), false).await;
    for form in [quoted(&k), k.clone()] {
        let again = app.post("/orders", &form, body).send().await.unwrap();
        assert_eq!(created(again, true).await, first, "{form}");
    }
    assert_eq!(app.executions(), 1);

    // The sf-string first, then bare.
    let k = key();
    let first = created(
        app.post("/orders", &quoted(&k), body).send().await.unwrap(),
        false,
    )
    .await;
    let again = app.post("/orders", &k, body).send().await.unwrap();
    assert_eq!(created(again, true).await, first);
    assert_eq!(app.executions(), 2);

    // One record: other parameters under the other form are a mismatch.
    let changed = app
        .post("/orders", &quoted(&k), r#"{"amount":999}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // Escapes are part of the form, not of the key: a key holding `"` and
    // `\` (which only the sf-string can carry) replays under its escapes.
    let escaped = format!(r#""order \"7\" \\ {}""#, key());
    let first = created(
        app.post("/orders", &escaped, body).send().await.unwrap(),
        false,
    )
    .await;
    let again = app.post("/orders", &escaped, body).send().await.unwrap();
    assert_eq!(created(again, true).await, first);
    assert_eq!(app.executions(), 3);
}

macro_rules! per_store {
    ($($store:ident),* $(,)?) => {
        $(
            mod $store {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_client_that_switches_form_replays() {
                    let Some(store) = crate::support::$store().await else { return };
                    super::a_client_that_switches_form_replays(store).await;
                }
            }
        )*
    };
}

per_store!(memory, sqlite, postgres, redis);

/// Posts `raw` as the key; expects the 400 `invalid-key` problem.
async fn refused(app: &App, raw: &[u8]) {
    let shown = String::from_utf8_lossy(raw).into_owned();
    let resp = app
        .client
        .post(app.url("/orders"))
        .header(IDEMPOTENCY_KEY, HeaderValue::from_bytes(raw).unwrap())
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{shown}");
    assert_eq!(
        resp.headers()["content-type"],
        "application/problem+json",
        "{shown}"
    );
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "urn:idem:problem:invalid-key", "{shown}");
    assert_eq!(body["status"], 400, "{shown}");
    assert!(
        body["detail"].as_str().unwrap().contains("Idempotency-Key"),
        "{shown}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_sf_strings_are_400_and_nothing_runs() {
    let app = spawn_app(Arc::new(idem_core::MemoryStore::new()), |b| b).await;
    let k = key();
    let malformed: Vec<Vec<u8>> = vec![
        // Unterminated.
        format!("\"{k}").into_bytes(),
        format!("\"{k}\\\"").into_bytes(),
        b"\"".to_vec(),
        // An escape other than \" and \\.
        format!("\"{k}\\n\"").into_bytes(),
        format!("\"\\{k}\"").into_bytes(),
        // Outside printable ASCII: a tab, bytes beyond ASCII.
        format!("\"{k}\tx\"").into_bytes(),
        [b"\"".as_slice(), k.as_bytes(), b"\xe9\""].concat(),
        [b"\"".as_slice(), k.as_bytes(), "\u{2013}\"".as_bytes()].concat(),
        // Anything after the closing quote.
        format!("\"{k}\"x").into_bytes(),
        format!("\"{k}\" x").into_bytes(),
        format!("\"{k}\";p=1").into_bytes(),
        format!("\"{k}\"\"").into_bytes(),
        format!("\"{k}\", \"{k}\"").into_bytes(),
    ];
    for raw in &malformed {
        refused(&app, raw).await;
    }
    assert_eq!(app.executions(), 0);

    // The server lives on, and the well-formed forms work.
    let resp = app.post("/orders", &quoted(&k), "{}").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(app.executions(), 1);
}
