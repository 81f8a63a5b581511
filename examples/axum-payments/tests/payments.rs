//! The example service in process, on 127.0.0.1:0 over a SQLite file: a
//! retry replays (in either key form), a changed body under the same key
//! is 422, one payment is made, and the read path tells the client what
//! became of its key.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use axum_payments::Payment;
use idem_http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use reqwest::StatusCode;
use serde_json::Value;

const TOKEN: &str = "Bearer client-a-0123456789";

/// The service over a fresh SQLite file; the directory lives as long as
/// the returned guard.
async fn start() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sqlite::SqliteStore::open(dir.path().join("payments.db")).unwrap();
    let (app, _handle) = axum_payments::app(store).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, dir)
}

fn pay(base: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{base}/payments"))
        .header(reqwest::header::AUTHORIZATION, TOKEN)
        .header(IDEMPOTENCY_KEY, key)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_owned())
}

async fn payments(base: &str) -> Vec<Payment> {
    reqwest::get(format!("{base}/payments"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_replays_and_a_changed_body_is_422() {
    let (base, _dir) = start().await;
    let key = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    let body = r#"{"amount":1250,"currency":"EUR","to":"acct_42"}"#;

    let first = pay(&base, key, body).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get(IDEMPOTENT_REPLAYED).is_none());
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let made: Payment = first.json().await.unwrap();
    assert!(
        made.id.starts_with("pay_") && made.id.len() > 20,
        "{}",
        made.id
    );
    assert_eq!(location, format!("/payments/{}", made.id));

    // The retry, bare and as the sf-string idem's client sends: the first
    // answer again, and no second payment. The JSON is compared by value:
    // key order and spacing do not make another request.
    let reordered = r#"{ "to": "acct_42", "currency": "EUR", "amount": 1250 }"#;
    for (form, body) in [(key.to_owned(), body), (format!("\"{key}\""), reordered)] {
        let again = pay(&base, &form, body).send().await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED, "{form}");
        assert_eq!(again.headers()[IDEMPOTENT_REPLAYED], "true", "{form}");
        assert_eq!(again.headers()["location"], location.as_str(), "{form}");
        assert_eq!(again.json::<Payment>().await.unwrap(), made, "{form}");
    }

    // Keys are never shown by the service's own endpoints.
    let listed = reqwest::get(format!("{base}/payments"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        listed.contains(&made.id) && !listed.contains(key),
        "{listed}"
    );

    // Another amount under the same key: refused, nothing runs.
    let changed = pay(
        &base,
        key,
        r#"{"amount":9999,"currency":"EUR","to":"acct_42"}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(changed.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem: Value = changed.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:key-reused");

    assert_eq!(payments(&base).await, std::slice::from_ref(&made));

    // The read path: the client's own record, found by key and credential.
    let record: Value = reqwest::Client::new()
        .get(format!("{base}/_idem/records/{key}"))
        .header(reqwest::header::AUTHORIZATION, TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["status"], "completed");
    assert_eq!(record["operation"], "POST /payments");
    assert_eq!(record["response"]["status"], 201);
    // Named by the handler (`IdempotencyContext::set_resource_id`).
    assert_eq!(record["resource_id"], made.id.as_str());
    let stored: Payment =
        serde_json::from_str(record["response"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(stored, made);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_required_and_mistyped_paths_leave_no_record() {
    let (base, _dir) = start().await;
    let body = r#"{"amount":100,"currency":"USD","to":"acct_7"}"#;
    let client = reqwest::Client::new();

    let keyless = client
        .post(format!("{base}/payments"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(keyless.status(), StatusCode::BAD_REQUEST);
    let problem: Value = keyless.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:missing-key");

    // route_layer: the router's 404, and the key stays unused.
    let key = "b1c4e0a2-6a53-4c8e-9a51-2f7f0c1d9e33";
    let typo = client
        .post(format!("{base}/paymnets"))
        .header(reqwest::header::AUTHORIZATION, TOKEN)
        .header(IDEMPOTENCY_KEY, key)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(typo.status(), StatusCode::NOT_FOUND);
    let unknown = client
        .get(format!("{base}/_idem/records/{key}"))
        .header(reqwest::header::AUTHORIZATION, TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let created = pay(&base, key, body).send().await.unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    assert!(created.headers().get(IDEMPOTENT_REPLAYED).is_none());
    assert_eq!(payments(&base).await.len(), 1);
}

/// Wait mode on `POST /payments`: duplicates sent at once, most of them
/// while the first is still in flight (its claim and its record each wait
/// for SQLite's fsync), all get the one payment's answer: 201, never 409,
/// and one payment. Without wait mode the duplicates in flight get 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_in_flight_wait_for_the_first_answer() {
    let (base, _dir) = start().await;
    let key = "wait-mode-00000000000001";
    let body = r#"{"amount":700,"currency":"EUR","to":"acct_wait"}"#;
    let sends: Vec<_> = (0..8)
        .map(|_| tokio::spawn(pay(&base, key, body).send()))
        .collect();
    let mut replays = 0;
    let mut first = None;
    for send in sends {
        let answer = send.await.unwrap().unwrap();
        assert_eq!(
            answer.status(),
            StatusCode::CREATED,
            "a duplicate was not made to wait"
        );
        replays += usize::from(answer.headers().contains_key(IDEMPOTENT_REPLAYED));
        let payment: Payment = answer.json().await.unwrap();
        assert_eq!(first.get_or_insert_with(|| payment.clone()), &payment);
    }
    assert_eq!(replays, 7);
    assert_eq!(payments(&base).await.len(), 1);
}

/// Every `RouteRule` of the service names one of its routes
/// (`LayerHandle::check_routes`, run by `main` at start-up).
#[tokio::test]
async fn every_rule_names_a_route() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sqlite::SqliteStore::open(dir.path().join("payments.db")).unwrap();
    let (app, handle) = axum_payments::app(store).unwrap();
    assert_eq!(handle.check_routes(&app).await, Vec::new());
}
