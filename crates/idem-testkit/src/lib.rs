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
//! takeover, the lease extension (heartbeat), expiry, bounded purge, the
//! stale listing, the look-up by (scope, key), a 64-task race on one key,
//! and a property test that runs random operation sequences against a
//! simple model of the contract and compares every answer.
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
//!
//! # The store fault harness (issue 36)
//!
//! What a store's tests use to break it from outside (README.md has the
//! details): [`fault_proxy`], a TCP proxy between a store and its server
//! that delays, freezes, holds or drops answers, black-holes or resets
//! connections; private servers that crash and restart
//! ([`private_postgres`], [`private_mariadb`], [`restartable_redis`], on
//! [`private_server`]); [`tmpfs`], a filesystem that fills up or turns
//! read-only; [`fault_caller`], a caller that uses the `Store` trait as
//! idem-http does; and the generated tests ([`store_faults`],
//! [`store_crashes`]) whose every run checks that no key executes twice,
//! no acknowledged completion is lost and no call outlives its deadline.

#![allow(clippy::unwrap_used)] // test support: a panic is how a check fails

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{Store, Timestamp};

pub mod atomic;
mod backend;
pub mod batches;
mod checks;
pub mod consumer;
pub mod crash;
pub mod epoch;
pub mod fault_caller;
pub mod fault_proxy;
pub mod faulty;
mod fixtures;
mod guard;
pub mod isolated;
mod lease;
mod model;
pub mod private_mariadb;
pub mod private_postgres;
pub mod private_redis;
pub mod private_server;
pub mod redis_cluster;
pub mod restartable_redis;
pub mod store_bench;
pub mod store_crashes;
pub mod store_faults;
pub mod tls;
pub mod tmpfs;

pub use backend::{backend_url, unique_name};
pub use checks::*;
pub use faulty::{Call, Door, Fault, FaultyStore, StoreOp};
pub use fixtures::{LEASE, TTL, fingerprint, request, response, t0, unique_id};
pub use guard::{CleanupOnDrop, Guarded};
pub use isolated::IsolatedBackend;
pub use lease::*;
pub use model::{model_check, model_check_with};

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
            extend_lease_holds_off_a_takeover,
            extend_lease_never_moves_a_lease_back,
            extend_lease_with_a_stale_fence_changes_nothing,
            extend_lease_on_a_finished_record_changes_nothing,
            extend_lease_on_no_record_changes_nothing,
            extend_lease_on_an_expired_record_under_its_fence_applies,
            extend_lease_keeps_the_record_alive_past_its_ttl,
            epoch_is_written_once_and_advances,
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

/// A multi-threaded runtime for the suite's tests.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
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
