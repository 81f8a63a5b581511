//! Claim+complete pairs per second: memory and SQLite stores at 1, 16 and
//! 256 concurrent tasks, beside a baseline measured in the same run: the
//! same SQL through one plain rusqlite connection in autocommit mode (each
//! claim its own transaction, each completion its own), `synchronous=FULL`.
//!
//! One criterion iteration is one pair per task, so criterion's elements/s
//! is pairs per second. `bench/store-ratios.sh` turns the results into the
//! ratios BENCHMARKS.md records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idem_core::{
    Claim, ClaimRequest, Completion, FieldSelection, Fingerprint, Key, MemoryStore, Operation,
    RecordId, Scope, Store, StoredResponse, Timestamp,
};
use idem_sqlite::SqliteStore;
use rusqlite::{Connection, OptionalExtension, params};

const TASKS: [usize; 3] = [1, 16, 256];

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

fn next_request(op: &Operation) -> ClaimRequest {
    let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    let key = Key::new(format!("bench-key-{n:012}")).expect("valid key");
    ClaimRequest {
        id: RecordId::new(Scope::anonymous(), op.clone(), key),
        fingerprint: Fingerprint::compute(op, None, &n.to_be_bytes(), &FieldSelection::Whole),
        now: Timestamp::now(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
    }
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: br#"{"id":"tr_1","status":"ok"}"#.to_vec(),
        trailers: Vec::new(),
    }
}

async fn pair<S: Store + ?Sized>(store: &S, op: &Operation) {
    let req = next_request(op);
    let Ok(Claim::Acquired(lease)) = store.claim(&req).await else {
        panic!("claim did not acquire");
    };
    let done = store
        .complete(
            &req.id,
            lease.fence,
            Completion::completed(response()),
            req.now,
        )
        .await;
    assert!(done.is_ok());
}

/// Runs `iters` pairs on each of `tasks` tasks at once; returns the time.
fn run_concurrent<S: Store>(
    rt: &tokio::runtime::Runtime,
    store: &Arc<S>,
    tasks: usize,
    iters: u64,
) -> Duration {
    rt.block_on(async {
        let op = Operation::new("POST", "/bench");
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (store, op) = (store.clone(), op.clone());
                tokio::spawn(async move {
                    for _ in 0..iters {
                        pair(&*store, &op).await;
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("bench task");
        }
        start.elapsed()
    })
}

/// The baseline: the store's SQL on one connection, one commit per
/// statement that writes, as an application without group commit would.
fn baseline_pair(conn: &Connection, n: u64) {
    let key = format!("base-key-{n:012}");
    let now = Timestamp::now().as_millis();
    conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
    let existing: Option<i64> = conn
        .prepare_cached(
            "SELECT fence FROM idem_records WHERE scope = ?1 AND operation = ?2 AND key = ?3",
        )
        .and_then(|mut s| {
            s.query_row(params!["anonymous", "POST /bench", key], |r| r.get(0))
                .optional()
        })
        .expect("select");
    assert!(existing.is_none());
    conn.prepare_cached(
        "INSERT OR REPLACE INTO idem_records (scope, operation, key, fingerprint, status, fence, \
         created_at, lease_until, expires_at) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut s| {
        s.execute(params![
            "anonymous",
            "POST /bench",
            key,
            [0u8; 32].as_slice(),
            n as i64,
            now,
            now + 30_000,
            now + 3_600_000
        ])
    })
    .expect("insert");
    conn.execute_batch("COMMIT").expect("commit");
    let r = response();
    conn.prepare_cached(
        "UPDATE idem_records SET status = 1, response_status = ?5, response_headers = ?6, \
         response_body = ?7, lease_until = NULL WHERE scope = ?1 AND operation = ?2 AND key = ?3 AND fence = ?4 AND status = 0",
    )
    .and_then(|mut s| s.execute(params!["anonymous", "POST /bench", key, n as i64, 201, r.encode_headers(), r.body]))
    .expect("update");
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut group = c.benchmark_group("claim_complete");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));

    // Baseline first: a store file opened by idem (same schema), written
    // through a plain connection.
    {
        let path = dir.path().join("baseline.db");
        drop(SqliteStore::open(&path).expect("create schema"));
        let conn = Connection::open(&path).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("wal");
        conn.pragma_update(None, "synchronous", "FULL")
            .expect("sync");
        group.throughput(Throughput::Elements(1));
        let mut n = 0u64;
        group.bench_function("sqlite_autocommit_baseline", |b| {
            b.iter(|| {
                n += 1;
                baseline_pair(&conn, n);
            })
        });
    }

    let sqlite = Arc::new(SqliteStore::open(dir.path().join("store.db")).expect("open"));
    let memory = Arc::new(MemoryStore::new());
    for tasks in TASKS {
        group.throughput(Throughput::Elements(tasks as u64));
        group.bench_with_input(BenchmarkId::new("sqlite", tasks), &tasks, |b, &t| {
            b.iter_custom(|iters| run_concurrent(&rt, &sqlite, t, iters))
        });
        group.bench_with_input(BenchmarkId::new("memory", tasks), &tasks, |b, &t| {
            b.iter_custom(|iters| run_concurrent(&rt, &memory, t, iters))
        });
    }
    group.finish();
}

criterion_group!(store_benches, benches);
criterion_main!(store_benches);
