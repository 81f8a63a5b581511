//! The store fault suite's crash scenarios (issue 36): a private server
//! ([`PrivateServer`]) killed and restarted under two gateways' traffic,
//! and one that comes back empty. The invariants are those of
//! [`store_faults`](crate::store_faults).
//!
//! ```ignore
//! let Some(server) = PrivatePostgres::start() else { return };
//! idem_testkit::runtime().block_on(crash_under_traffic::<ShortTimeouts, _>(server));
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{RecordId, Status, Store};

use crate::IsolatedBackend;
use crate::backend::unique_name;
use crate::fault_caller::{Caller, Ledger, Outcome};
use crate::fixtures::{LEASE, request, t0, unique_id};
use crate::private_server::PrivateServer;
use crate::store_faults::{DEADLINE, RECOVERY, replayed};

/// Keys requested by both gateways, several tasks each, while `server`
/// crashes and restarts. Every key executes exactly once (a claim whose
/// answer the crash lost is taken over after its lease, by the one
/// execution it gets); every completion acknowledged before the crash is
/// replayed after the restart; requests fail within their deadline
/// while the server is down.
///
/// For durable servers only (PostgreSQL, MariaDB, Redis with an fsynced
/// append-only file).
pub async fn crash_under_traffic<B: IsolatedBackend, P: PrivateServer>(mut server: P) {
    const KEYS: usize = 48;
    const TASKS: usize = 3;
    let url = server.url();
    let name = unique_name("crash");
    let ledger = Arc::new(Ledger::default());
    let a = Arc::new(Caller::new(
        "a",
        B::open(&url, &name).await,
        DEADLINE,
        ledger.clone(),
    ));
    let b = Arc::new(Caller::new(
        "b",
        B::open(&url, &name).await,
        DEADLINE,
        ledger.clone(),
    ));
    let before: Vec<RecordId> = (0..8)
        .map(|i| unique_id(&format!("crash-before-{i:04}")))
        .collect();
    for id in &before {
        let out = a.request(&request(id, "{}", t0())).await;
        assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
    }

    let keys: Arc<Vec<RecordId>> = Arc::new(
        (0..KEYS)
            .map(|i| unique_id(&format!("crash-traffic-{i:04}")))
            .collect(),
    );
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        for (n, caller) in [(0, &a), (1, &b)] {
            let (caller, keys) = (caller.clone(), keys.clone());
            let offset = (t * 2 + n) * KEYS / (TASKS * 2);
            tasks.push(tokio::spawn(async move {
                let mut refused = 0;
                for i in 0..KEYS {
                    refused += drive(&caller, &keys[(i + offset) % KEYS]).await;
                }
                refused
            }));
        }
    }
    ledger.wait_executions(before.len() + KEYS / 4).await;
    server = tokio::task::spawn_blocking(move || {
        server.crash();
        server
    })
    .await
    .unwrap();
    let acknowledged = ledger.acknowledged();
    assert!(
        acknowledged.len() < before.len() + KEYS,
        "the traffic was over before the crash"
    );
    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }

    // Everything acknowledged before the crash survived it.
    for id in &acknowledged {
        let out = b.request(&request(id, "{}", t0())).await;
        assert_eq!(
            Some(replayed("after the restart", out)),
            ledger.stored(id),
            "a completion acknowledged before the crash"
        );
    }
    // Claims whose answer the crash lost: in flight until their lease
    // ends, then taken over once. No executor is left running now.
    let late = t0() + LEASE + Duration::from_secs(1);
    let mut taken_over = 0;
    for id in keys.iter() {
        match a.request(&request(id, "{}", late)).await {
            Outcome::Replayed(_) => {}
            Outcome::Executed { takeover: true, .. } => taken_over += 1,
            out => panic!("{out:?}"),
        }
    }
    ledger.assert_none_twice();
    for id in keys.iter().chain(&before) {
        assert_eq!(ledger.executions(id), 1, "{}", id.key.as_str());
        let out = b.request(&request(id, "{}", late)).await;
        assert_eq!(Some(replayed("at the end", out)), ledger.stored(id));
    }
    eprintln!(
        "crash under traffic: {} completions acknowledged before the crash, all replayed after it; \
         {refused} requests refused while the server was away; {taken_over} claims whose answer \
         the crash lost, taken over once after their lease",
        acknowledged.len()
    );
    drop(server);
}

/// Requests `id` until it is answered (executed here, or replayed), or
/// until it stays in flight (another gateway's claim whose answer a crash
/// lost) while the store answers. Answers how many times the store
/// refused.
async fn drive<S: idem_core::Store>(caller: &Caller<S>, id: &RecordId) -> usize {
    let req = request(id, "{}", t0());
    let start = Instant::now();
    let (mut in_flight, mut refused) = (0, 0);
    loop {
        match caller.request(&req).await {
            Outcome::Executed { .. } | Outcome::Replayed(_) => return refused,
            Outcome::InFlight => {
                in_flight += 1;
                if in_flight > 40 {
                    return refused;
                }
            }
            Outcome::Refused(_) => {
                refused += 1;
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the store never came back"
                );
            }
        }
        // Backoff between retries.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Completed records, then `server` crashes and restarts empty (Redis
/// without persistence). The store forgot: a retry of each completed key
/// acquires it afresh (not a takeover) and executes it a second time,
/// which no store can prevent; what idem does is notice. The store's
/// epoch, advanced before the crash, is written again after it, and an
/// [`EpochWatch`](idem_core::EpochWatch) reports every place emptied (the
/// layer then refuses claims for its loss window: idem-http's tests).
pub async fn restart_empty<B: IsolatedBackend, P: PrivateServer>(mut server: P) {
    let url = server.url();
    let name = unique_name("amnesia");
    let ledger = Arc::new(Ledger::default());
    let a = Caller::new("a", B::open(&url, &name).await, DEADLINE, ledger.clone());
    let ids: Vec<RecordId> = (0..4)
        .map(|i| unique_id(&format!("amnesia-{i:04}")))
        .collect();
    for id in &ids {
        let out = a.request(&request(id, "{}", t0())).await;
        assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
    }
    let mut watch = idem_core::EpochWatch::new();
    for candidate in ["before-1", "before-2"] {
        let marks = a.store().advance_epoch(candidate).await.unwrap();
        assert!(watch.observe(&marks).is_empty(), "{marks:?}");
    }
    server = tokio::task::spawn_blocking(move || {
        server.crash();
        server.restart();
        server
    })
    .await
    .unwrap();
    let start = Instant::now();
    for id in &ids {
        let out = loop {
            match a.request(&request(id, "{}", t0())).await {
                Outcome::Refused(e) => assert!(start.elapsed() < RECOVERY, "{e}"),
                out => break out,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            matches!(
                out,
                Outcome::Executed {
                    takeover: false,
                    ..
                }
            ),
            "after a restart empty: {out:?}"
        );
        assert_eq!(ledger.executions(id), 2, "a forgotten record runs again");
        let record = a.get(id, t0()).await.unwrap().unwrap();
        assert_eq!(record.status, Status::Completed);
    }
    let marks = a.store().advance_epoch("after").await.unwrap();
    let losses = watch.observe(&marks);
    assert!(!losses.is_empty(), "the loss is noticed: {marks:?}");
    assert!(
        losses
            .iter()
            .all(|l| l.cause == idem_core::LossCause::Emptied),
        "{losses:?}"
    );
    drop(server);
}

/// The epoch through a crash and restart of a durable `server`: while it
/// is down an advance fails as `Unavailable`; after the restart the same
/// epoch goes on from the counter last read (the server keeps what it
/// acknowledged), so an [`EpochWatch`](idem_core::EpochWatch) sees no loss.
pub async fn epoch_survives_a_crash<B: IsolatedBackend, P: PrivateServer>(mut server: P) {
    let url = server.url();
    let store = B::open(&url, &unique_name("epoch")).await;
    let mut watch = idem_core::EpochWatch::new();
    for candidate in ["before-1", "before-2", "before-3"] {
        let marks = store.advance_epoch(candidate).await.unwrap();
        assert!(watch.observe(&marks).is_empty(), "{marks:?}");
    }
    server = tokio::task::spawn_blocking(move || {
        server.crash();
        server
    })
    .await
    .unwrap();
    let down = store.advance_epoch("while-down").await.unwrap_err();
    assert!(down.is_unavailable(), "{down:?}");
    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    // A pool may hand out a connection the crash closed: such a call
    // fails, and a later one opens a new connection.
    let mut tries = 0;
    let marks = loop {
        match store.advance_epoch("after").await {
            Ok(marks) => break marks,
            Err(e) if e.is_unavailable() && tries < 8 => tries += 1,
            Err(e) => panic!("after the restart: {e:?}"),
        }
    };
    assert!(!marks.is_empty());
    for mark in &marks {
        assert_eq!(
            (mark.epoch.as_str(), mark.created),
            ("before-1", false),
            "{marks:?}"
        );
        assert!(mark.counter >= 4, "{marks:?}");
    }
    assert!(watch.observe(&marks).is_empty(), "{marks:?}");
    B::remove(store).await;
    drop(server);
}
