//! Recovery without any client retry: an executor killed with SIGKILL
//! leaves its record in progress, and the ledger's reconciler settles it
//! from the ledger's own state.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use idem_core::{
    Atomic, Claim, Completion, Key, Operation, RecordId, Scope, Status, Store, StoredResponse,
    reconcile_once,
};
use idem_ledger::{Ledger, SqliteLedger};
use idem_testkit::crash::{READY, run_until_ready_then_kill};
use idem_testkit::{LEASE, request, t0};

fn id(key: &str) -> RecordId {
    RecordId::new(
        Scope::anonymous(),
        Operation::new("POST", "/transfers"),
        Key::new(key).unwrap(),
    )
}

/// The child: claims a transfer and dies at the chosen point.
/// `row`: it wrote the transfer row outside the record's transaction (a
/// ledger without atomic mode) and dies before completing the record.
/// `none`: it dies inside the atomic transaction, before commit.
#[test]
#[ignore = "child process of the recovery tests; run by them"]
fn executor_child() {
    let path = std::env::var("LEDGER_PATH").unwrap();
    let mode = std::env::var("LEDGER_MODE").unwrap();
    let key = std::env::var("LEDGER_KEY").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ledger = SqliteLedger::open(&path).unwrap();
        let Claim::Acquired(lease) = ledger.store().claim(&request(&id(&key), "{}", t0())).await.unwrap() else {
            panic!("child could not claim")
        };
        if mode == "row" {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
            c.execute_batch("BEGIN; UPDATE accounts SET balance = balance - 10 WHERE id = 'acct-0'; UPDATE accounts SET balance = balance + 10 WHERE id = 'acct-1';").unwrap();
            c.execute("INSERT INTO transfers (idem_key, from_acct, to_acct, amount) VALUES (?1, 'acct-0', 'acct-1', 10)", [&key]).unwrap();
            c.execute_batch("COMMIT").unwrap();
            println!("{READY}");
            std::future::pending::<()>().await;
        }
        let k = key.clone();
        let out = ledger
            .store()
            .complete_atomically(&id(&key), lease.fence, move |c| {
                c.execute("INSERT INTO transfers (idem_key, from_acct, to_acct, amount) VALUES (?1, 'acct-0', 'acct-1', 10)", [&k])?;
                println!("{READY}");
                loop {
                    std::thread::park();
                }
                #[allow(unreachable_code)]
                Ok::<_, rusqlite::Error>(((), Completion::completed(StoredResponse::default())))
            })
            .await;
        let _: Result<Atomic<(), rusqlite::Error>, _> = out;
    });
}

async fn killed_executor(mode: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let ledger = SqliteLedger::open(&path).unwrap();
    ledger.seed(2, 1_000).await.unwrap();
    drop(ledger);
    let key = format!("recovery-{mode}-0000001");
    run_until_ready_then_kill(
        "executor_child",
        &[
            ("LEDGER_PATH", path.as_os_str()),
            ("LEDGER_MODE", mode.as_ref()),
            ("LEDGER_KEY", key.as_ref()),
        ],
    );
    (dir, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_that_happened_is_completed_from_the_ledger() {
    let (dir, key) = killed_executor("row").await;
    let ledger = SqliteLedger::open(dir.path().join("ledger.db")).unwrap();
    let store = ledger.store().clone();
    let rec = store.get(&id(&key), t0()).await.unwrap().unwrap();
    assert_eq!(
        rec.status,
        Status::InProgress,
        "the dead executor left its claim"
    );

    let report = reconcile_once(&store, &ledger, t0() + LEASE, 10)
        .await
        .unwrap();
    assert_eq!((report.completed, report.released), (1, 0));
    let rec = store.get(&id(&key), t0() + LEASE).await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Completed);
    let body: serde_json::Value = serde_json::from_slice(&rec.response.unwrap().body).unwrap();
    assert_eq!(body["amount"], 10);
    assert_eq!(rec.resource_id, Some(body["id"].to_string()));
    // A retry now replays; nothing runs twice.
    assert!(matches!(
        store
            .claim(&request(&id(&key), "{}", t0() + LEASE))
            .await
            .unwrap(),
        Claim::Replay(_)
    ));
    assert_eq!(ledger.transfers_with_key(&key).await.unwrap(), 1);
    assert_eq!(ledger.total().await.unwrap(), 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_that_did_not_happen_is_released() {
    let (dir, key) = killed_executor("none").await;
    let ledger = SqliteLedger::open(dir.path().join("ledger.db")).unwrap();
    let store = ledger.store().clone();
    assert_eq!(
        store.get(&id(&key), t0()).await.unwrap().unwrap().status,
        Status::InProgress
    );
    assert_eq!(
        ledger.transfers_with_key(&key).await.unwrap(),
        0,
        "the killed transaction left nothing"
    );

    let report = reconcile_once(&store, &ledger, t0() + LEASE, 10)
        .await
        .unwrap();
    assert_eq!((report.completed, report.released), (0, 1));
    assert_eq!(store.get(&id(&key), t0() + LEASE).await.unwrap(), None);
    // The retry executes it, once.
    assert!(matches!(
        store
            .claim(&request(&id(&key), "{}", t0() + LEASE))
            .await
            .unwrap(),
        Claim::Acquired(_)
    ));
}
