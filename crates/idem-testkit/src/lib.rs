//! Test support for idem's own crates: the store conformance suite, the
//! atomic-mode conformance suite, the model check, crash and benchmark
//! helpers. `publish = false`; a dev-dependency only.
//!
//! It is not part of the idempotency contract and not an API for
//! applications: nothing here is semver-stable, every check panics to fail,
//! and no library crate of the workspace may depend on it outside
//! `[dev-dependencies]`. It lives apart from `idem-core` so that the core
//! stays free of tokio and proptest and of a test-only feature.
//!
//! # The store conformance suite
//!
//! One set of checks every [`Store`] must pass. A store crate runs all of
//! it with one macro line in a test module:
//!
//! ```ignore
//! idem_testkit::conformance_tests!(async { MyStore::connect(&url).await.unwrap() });
//! ```
//!
//! The expression is evaluated once per test and must give a store of its
//! own (a fresh file, schema or key prefix), so tests run in parallel and a
//! purge in one never sees another's records. Each check is also a public
//! function, for stores that want to call them one by one.
//!
//! The suite checks every transition of docs/contract.md, *Records and their state machine*, fencing,
//! takeover, expiry, bounded purge, the stale listing, the look-up by
//! (scope, key), a 64-task race on one key, and a
//! property test that runs random operation sequences against a simple
//! model of the contract and compares every answer.
//!
//! # The atomic-mode suite
//!
//! Stores whose atomic mode commits a business mutation together with the
//! record's completion (SQLite, PostgreSQL) implement
//! [`atomic::AtomicHarness`] and run [`atomic_conformance_tests!`], which
//! includes crash tests that SIGKILL a child process (see [`crash`]).
//!
//! # The rest
//!
//! - fixtures: [`t0`], [`unique_id`], [`request`], [`response`], [`LEASE`],
//!   [`TTL`];
//! - [`backend_url`]: a backend's URL from the environment, skipping
//!   outside CI when it is absent;
//! - [`IsolatedBackend`]: the server-backed store crates' harness, a fresh
//!   store in a namespace of its own per test, removed afterwards (see
//!   [`isolated`]);
//! - [`FaultyStore`]: a store in front of another that goes down, fails,
//!   delays or stalls chosen calls and counts them (see [`faulty`]);
//! - [`Guarded`] and [`CleanupOnDrop`]: a store together with the
//!   temporary directory or schema it lives in;
//! - [`print_pair_rates`]: the store benchmarks' main loop;
//! - [`private_redis`]: a `redis-server` of a test's own, to stop and
//!   restart.

#![allow(clippy::unwrap_used)] // test support: a panic is how a check fails

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{
    ClaimRequest, FieldSelection, Fingerprint, Key, Operation, RecordId, Scope, Store,
    StoredResponse, Timestamp,
};

pub mod atomic;
mod checks;
pub mod consumer;
pub mod crash;
pub mod faulty;
pub mod isolated;
mod model;
pub mod private_redis;
pub mod redis_cluster;
pub mod store_bench;
pub mod tls;

pub use checks::*;
pub use faulty::{Call, Fault, FaultyStore, StoreOp};
pub use isolated::IsolatedBackend;
pub use model::{model_check, model_check_with};

/// The lease the suite claims with.
pub const LEASE: Duration = Duration::from_secs(30);
/// The ttl the suite claims with.
pub const TTL: Duration = Duration::from_secs(3600);

/// A fixed starting time, so that tests read the same on every run.
pub fn t0() -> Timestamp {
    Timestamp::from_millis(1_800_000_000_000)
}

/// A record id in a scope no other test uses.
pub fn unique_id(key: &str) -> RecordId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let scope = Scope::from_raw(format!(
        "testkit-{}-{}-{n}",
        std::process::id(),
        Timestamp::now().as_millis()
    ));
    let key = Key::new(key).unwrap_or_else(|e| panic!("test key {key:?}: {e}"));
    RecordId::new(scope, Operation::new("POST", "/testkit"), key)
}

/// The fingerprint of a body under the suite's operation.
pub fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::compute(
        &Operation::new("POST", "/testkit"),
        Some("application/json"),
        body.as_bytes(),
        &FieldSelection::Whole,
    )
}

/// A claim request at `now` with the suite's lease and ttl.
pub fn request(id: &RecordId, body: &str, now: Timestamp) -> ClaimRequest {
    ClaimRequest {
        id: id.clone(),
        fingerprint: fingerprint(body),
        now,
        lease: LEASE,
        ttl: TTL,
    }
}

/// A response with a header value that is not UTF-8 and a binary body, so
/// that stores prove they keep bytes as bytes.
pub fn response(status: u16, tag: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("x-tag".into(), tag.as_bytes().to_vec()),
            ("x-raw".into(), vec![0xff, 0x00, 0x7f]),
        ],
        body: [tag.as_bytes(), &[0u8, 0xfe]].concat(),
    }
}

/// Generates one `#[test]` per conformance check for the store that `$make`
/// (an `async` block) builds, each on a [`runtime`] of its own.
///
/// `conformance_tests!(optional async { ... })` takes a block that yields
/// `Option<Store>`: `None` means the backend is not there, and each test
/// returns at once (the block should print why).
#[macro_export]
macro_rules! conformance_tests {
    (optional $make:expr) => {
        $crate::conformance_tests!(@each $make;
            claim_absent_acquires,
            duplicate_claim_is_in_flight,
            other_fingerprint_is_a_mismatch_in_every_state,
            completed_is_replayed,
            failed_is_replayed,
            release_lets_the_next_claim_execute,
            lease_takeover_fences_out_the_old_executor,
            stale_fences_change_nothing,
            expired_records_execute_again,
            purge_deletes_only_expired_in_bounded_batches,
            stale_records_are_listed_in_pages,
            records_are_found_by_scope_and_key,
        );

        #[test]
        fn conformance_race_64_tasks_one_key() {
            let rt = $crate::runtime();
            rt.block_on(async {
                let Some(store) = $make.await else { return };
                $crate::race_one_key(::std::sync::Arc::new(store), 64).await;
            });
        }

        #[test]
        fn conformance_consumer_contract() {
            let rt = $crate::runtime();
            rt.block_on(async {
                let Some(store) = $make.await else { return };
                $crate::consumer::consumer_follows_the_record_contract(::std::sync::Arc::new(store))
                    .await;
            });
        }

        #[test]
        fn conformance_consumer_race_64_tasks_one_message() {
            let rt = $crate::runtime();
            rt.block_on(async {
                let Some(store) = $make.await else { return };
                let store: ::std::sync::Arc<dyn ::idem_core::Store> = ::std::sync::Arc::new(store);
                $crate::consumer::consumer_race_one_message(&[store], 64).await;
            });
        }

        #[test]
        fn conformance_model_check() {
            let rt = $crate::runtime();
            if rt.block_on($make).is_none() {
                return;
            }
            $crate::model_check(&rt, || {
                rt.block_on($make).expect("the backend went away during the model check")
            });
        }
    };
    (@each $make:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                let rt = $crate::runtime();
                rt.block_on(async {
                    let Some(store) = $make.await else { return };
                    $crate::$check(&store).await;
                });
            }
        )*
    };
    ($make:expr) => {
        $crate::conformance_tests!(optional async { Some($make.await) });
    };
}

/// A name no other test, run or process uses (for schemas, streams,
/// queues and scopes on servers that outlive a test run).
pub fn unique_name(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "idem_test_{tag}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// A multi-threaded runtime for the suite's tests.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}

/// A store together with whatever must live as long as it (a temporary
/// directory, a schema to drop). Dropped after the store.
pub struct Guarded<S> {
    store: S,
    _guard: Box<dyn Send + Sync>,
}

impl<S> std::fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guarded")
    }
}

impl<S: Store> Guarded<S> {
    /// Keeps `guard` alive for as long as `store`.
    pub fn new(store: S, guard: impl Send + Sync + 'static) -> Guarded<S> {
        Guarded {
            store,
            _guard: Box::new(guard),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: Store> Store for Guarded<S> {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Claim, idem_core::StoreError>> {
        self.store.claim(req)
    }
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: idem_core::Fence,
        completion: idem_core::Completion,
        now: Timestamp,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Settled, idem_core::StoreError>> {
        self.store.complete(id, fence, completion, now)
    }
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: idem_core::Fence,
        now: Timestamp,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Settled, idem_core::StoreError>> {
        self.store.release(id, fence, now)
    }
    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> idem_core::BoxFuture<'a, Result<Option<idem_core::Record>, idem_core::StoreError>> {
        self.store.get(id, now)
    }
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> idem_core::BoxFuture<'_, Result<usize, idem_core::StoreError>> {
        self.store.purge_expired(now, limit)
    }
    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a idem_core::StaleCursor>,
        limit: usize,
    ) -> idem_core::BoxFuture<'a, Result<Vec<idem_core::Record>, idem_core::StoreError>> {
        self.store.list_stale(now, after, limit)
    }
    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> idem_core::BoxFuture<'a, Result<Vec<idem_core::Record>, idem_core::StoreError>> {
        self.store.find_by_key(scope, key, now, limit)
    }
}

/// Sustained claim+complete pairs per second on `store` from `tasks`
/// concurrent tasks, each pair on a new key, for `duration` after a short
/// warm-up. For the store benchmarks under `bench/`.
pub async fn pairs_per_second<S: Store>(
    store: std::sync::Arc<S>,
    tasks: usize,
    duration: Duration,
) -> f64 {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, stop, counting, done) =
                (store.clone(), stop.clone(), counting.clone(), done.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = unique_id(&format!("load-{t:05}-{n:010}"));
                    let req = request(&id, "{}", Timestamp::now());
                    let Ok(idem_core::Claim::Acquired(lease)) = store.claim(&req).await else {
                        panic!("load: claim did not acquire");
                    };
                    let c = idem_core::Completion::completed(response(201, "load"));
                    let settled = store.complete(&id, lease.fence, c, req.now).await;
                    assert!(
                        matches!(settled, Ok(idem_core::Settled::Applied)),
                        "load: complete failed"
                    );
                    if counting.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    counting.store(true, Ordering::Relaxed);
    let start = std::time::Instant::now();
    tokio::time::sleep(duration).await;
    let pairs = done.load(Ordering::Relaxed);
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.await;
    }
    pairs as f64 / elapsed.as_secs_f64()
}

/// The URL of a test backend from the environment variable `var`.
///
/// Absent or empty: `None`, after printing why the tests skip, so that
/// `cargo test` passes on a machine with only Rust. Under CI (`CI` set)
/// an absent URL panics instead: CI may not skip.
pub fn backend_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{var} must be set under CI: the {what} tests may not skip there")
        }
        _ => {
            eprintln!("skipped: {var} is not set (no {what} to test against)");
            None
        }
    }
}

type CleanupFn = Box<dyn FnOnce() -> idem_core::BoxFuture<'static, ()> + Send>;

/// Runs an async clean-up (drop a schema, delete a key prefix) when
/// dropped, on a runtime of its own: the test's runtime may be gone by then.
/// Errors in the clean-up are ignored; it is best effort.
pub struct CleanupOnDrop(std::sync::Mutex<Option<CleanupFn>>);

impl std::fmt::Debug for CleanupOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CleanupOnDrop")
    }
}

impl CleanupOnDrop {
    /// Will run `cleanup()` to completion on drop.
    pub fn new<F, Fut>(cleanup: F) -> CleanupOnDrop
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        CleanupOnDrop(std::sync::Mutex::new(Some(Box::new(move || {
            Box::pin(cleanup()) as idem_core::BoxFuture<'static, ()>
        }))))
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        let taken = self
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(cleanup) = taken {
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(cleanup());
                }
            })
            .join();
        }
    }
}

/// The store benchmarks' main loop: pairs per second at 1, 16 and 256
/// tasks, one line each (`store/N RATE`), `IDEM_BENCH_SECS` seconds per
/// figure (default 5).
pub async fn print_pair_rates<S: Store>(store: std::sync::Arc<S>) {
    let secs: u64 = std::env::var("IDEM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    for tasks in [1, 16, 256] {
        let rate = pairs_per_second(store.clone(), tasks, Duration::from_secs(secs)).await;
        println!("store/{tasks} {rate:.0}");
    }
}
