//! The client example (`examples/payments-client`, a dev-dependency) run
//! against this service, twice on the same intent file, as a client
//! restarted after losing its answer would be: the first run pays (201),
//! the second gets the same answer back as a replay under the same key,
//! and one payment is made.
//!
//! The client's `run` is the whole of its binary but the printing, so it
//! is called in process: no second cargo build from inside a test.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use axum_payments::Payment;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_client_replays_its_intent_and_pays_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sqlite::SqliteStore::open(dir.path().join("payments.db")).unwrap();
    let (app, handle) = axum_payments::app(store).unwrap();
    let stop = idem_http::maintenance::CancellationToken::new();
    let maintenance = axum_payments::maintenance(&handle).spawn(stop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let intent = dir.path().join("intent.json");
    let args = |payment: &[&str]| {
        let mut args = vec![
            "--url".to_owned(),
            base.clone(),
            intent.to_string_lossy().into_owned(),
        ];
        args.extend(payment.iter().map(|s| (*s).to_owned()));
        args
    };

    let first = payments_client::run(args(&["1250", "EUR", "acct_42"]))
        .await
        .unwrap();
    assert_eq!(first.status, 201, "{first}");
    assert!(!first.replayed, "{first}");
    // The key was made and kept by the client, before the first try.
    let kept: payments_client::Intent =
        serde_json::from_slice(&std::fs::read(&intent).unwrap()).unwrap();
    assert_eq!(first.key.as_deref(), Some(kept.key.as_str()), "{first}");
    let made: Payment = serde_json::from_str(&first.body).unwrap();

    // Restarted on the same file (the payment read back from it).
    let second = payments_client::run(args(&[])).await.unwrap();
    assert_eq!(second.status, 201, "{second}");
    assert!(second.replayed, "{second}");
    assert_eq!(second.key, first.key);
    assert_eq!(serde_json::from_str::<Payment>(&second.body).unwrap(), made);

    // Executed once.
    let payments: Vec<Payment> = reqwest::get(format!("{base}/payments"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(payments, vec![made.clone()]);

    // The read path names the payment made under the key.
    let record: Value = reqwest::Client::new()
        .get(format!("{base}/_idem/records/{}", kept.key))
        .header(
            reqwest::header::AUTHORIZATION,
            payments_client::DEFAULT_TOKEN,
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(record["status"], "completed");
    assert_eq!(record["resource_id"], made.id.as_str());

    // Another payment on the same intent file is refused before sending.
    let other = payments_client::run(args(&["9999", "EUR", "acct_42"])).await;
    assert!(other.unwrap_err().to_string().contains("another payment"));

    stop.cancel();
    maintenance.await.unwrap();
}
