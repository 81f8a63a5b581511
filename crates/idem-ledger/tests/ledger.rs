//! The ledger under 32 concurrent clients sending duplicated transfers:
//! money is conserved and every key has at most one transfer row.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::collections::HashMap;
use std::sync::Arc;

use idem_http::IdempotencyLayer;
#[cfg(feature = "postgres")]
use idem_ledger::PostgresLedger;
use idem_ledger::{Ledger, SqliteLedger, router, transfer_rule};
use reqwest::StatusCode;

const ACCOUNTS: usize = 8;
const START: i64 = 1_000;

async fn serve<L: Ledger>(ledger: Arc<L>, store: impl idem_core::Store) -> String {
    ledger.seed(ACCOUNTS, START).await.unwrap();
    let layer = IdempotencyLayer::builder(store)
        .route(transfer_rule())
        .build();
    let app = router(ledger, layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Sends one attempt; retries 409 (in flight) and 503 until an answer.
async fn send(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    body: &serde_json::Value,
) -> (StatusCode, String, bool) {
    for _ in 0..2_000 {
        let r = client
            .post(format!("{base}/transfers"))
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        if status == StatusCode::CONFLICT || status == StatusCode::SERVICE_UNAVAILABLE {
            tokio::task::yield_now().await;
            continue;
        }
        let replayed = r.headers().contains_key("idempotent-replayed");
        return (status, r.text().await.unwrap(), replayed);
    }
    panic!("{key}: no answer after 2000 attempts");
}

async fn run<L: Ledger>(ledger: Arc<L>, store: impl idem_core::Store) {
    let base = serve(ledger.clone(), store).await;
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..32)
        .map(|c| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for i in 0..10 {
                    let key = format!("ledger-client-{c:02}-intent-{i:03}");
                    let body = serde_json::json!({
                        "from": format!("acct-{}", (c + i) % ACCOUNTS),
                        "to": format!("acct-{}", (c + i + 1) % ACCOUNTS),
                        // Some transfers are too large: refused, and replayed.
                        "amount": if i % 4 == 3 { 5_000 } else { 1 + (c * 7 + i) as i64 % 90 },
                    });
                    // The same intent twice at once, then once more.
                    let (a, b) = tokio::join!(
                        send(&client, &base, &key, &body),
                        send(&client, &base, &key, &body)
                    );
                    let c3 = send(&client, &base, &key, &body).await;
                    assert_eq!(a.0, b.0, "{key}");
                    assert_eq!(a.1, b.1, "{key}: duplicates see the same body");
                    assert_eq!(a.1, c3.1, "{key}: the retry replays");
                    assert!(c3.2, "{key}: the third send is a replay");
                    answers.push((key, a.0));
                }
                answers
            })
        })
        .collect();
    let mut statuses: HashMap<String, StatusCode> = HashMap::new();
    for t in tasks {
        statuses.extend(t.await.unwrap());
    }
    assert_eq!(
        ledger.total().await.unwrap(),
        ACCOUNTS as i64 * START,
        "money is conserved"
    );
    let mut created = 0;
    for (key, status) in &statuses {
        let rows = ledger.transfers_with_key(key).await.unwrap();
        match *status {
            StatusCode::CREATED => {
                assert_eq!(rows, 1, "{key}: one transfer row");
                created += 1;
            }
            StatusCode::UNPROCESSABLE_ENTITY => assert_eq!(rows, 0, "{key}: refused, no row"),
            other => panic!("{key}: unexpected {other}"),
        }
    }
    assert_eq!(ledger.transfer_count().await.unwrap(), created);
    assert!(
        created > 0 && created < statuses.len() as i64,
        "both outcomes happened"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_ledger_under_duplicated_concurrent_transfers() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = SqliteLedger::open(dir.path().join("ledger.db")).unwrap();
    let store = ledger.store().clone();
    run(Arc::new(ledger), store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_ledger_under_duplicated_concurrent_transfers() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let schema = format!("idem_ledger_{}", std::process::id());
    let store = idem_postgres::PostgresStore::builder(url)
        .schema(schema)
        .pool_size(16)
        .connect()
        .await
        .unwrap();
    let ledger = Arc::new(PostgresLedger::new(store.clone()).await.unwrap());
    run(ledger, store.clone()).await;
    store.drop_schema().await.unwrap();
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_ledger_under_duplicated_concurrent_transfers() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_MYSQL_URL", "MySQL") else {
        return;
    };
    let database = format!("idem_ledger_{}", std::process::id());
    let store = idem_mysql::MysqlStore::builder(url)
        .database(database)
        .pool_size(16)
        .connect()
        .await
        .unwrap();
    let ledger = Arc::new(idem_ledger::MysqlLedger::new(store.clone()).await.unwrap());
    run(ledger, store.clone()).await;
    store.drop_database().await.unwrap();
}
