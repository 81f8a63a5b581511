//! The claim+complete benchmark of the server-backed store crates
//! (PostgreSQL, MySQL, Redis), written once: each crate's
//! `benches/*_claim_complete.rs` says how to open its store and runs
//! [`PairRateBench::run`] as its whole `main`.
//!
//! It prints [`print_pair_rates`]'s lines (`store/N RATE`), which
//! `bench/postgres.sh`, `bench/mysql.sh`, `bench/redis.sh` and
//! `bench/redis-cluster.sh` set beside the backend's own client. It reads
//! `IDEM_BENCH_SECS` (through [`print_pair_rates`]) and `IDEM_BENCH_POOL`.
//!
//! It is not for the SQLite crate's criterion benchmark, which measures a
//! plain-connection baseline in the same run, nor for the HTTP benchmarks.

use std::future::Future;
use std::sync::Arc;

use idem_core::Store;

use crate::{backend_url, print_pair_rates};

/// The pool size a benchmark opens its store with when `IDEM_BENCH_POOL`
/// does not say.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// A store crate's claim+complete benchmark: which server it needs and how
/// to open its store there.
pub trait PairRateBench {
    /// The store it measures.
    type Store: Store;

    /// The environment variable holding the server's URL
    /// (`IDEM_TEST_POSTGRES_URL`).
    const URL_VAR: &'static str;

    /// The server's name in the message that says why the benchmark skips
    /// (`PostgreSQL`).
    const SERVER: &'static str;

    /// Opens the store at `url` with `pool_size` connections (where the
    /// store has a pool). Panics if it cannot: a benchmark has no other
    /// way to fail.
    fn open(url: &str, pool_size: usize) -> impl Future<Output = Self::Store>;

    /// Removes what the run wrote, when the scripts do not (by default,
    /// nothing).
    fn clean_up(_store: &Self::Store) -> impl Future<Output = ()> {
        async {}
    }

    /// The benchmark's `main`: opens the store at the configured server
    /// (skipping, after saying why, when there is none; see
    /// [`backend_url`]) with `IDEM_BENCH_POOL` connections (default
    /// [`DEFAULT_POOL_SIZE`]), prints its pair rates at 1, 16 and 256
    /// tasks, then cleans up.
    fn run() {
        let Some(url) = backend_url(Self::URL_VAR, Self::SERVER) else {
            return;
        };
        let pool_size = std::env::var("IDEM_BENCH_POOL")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(DEFAULT_POOL_SIZE);
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let store = Arc::new(Self::open(&url, pool_size).await);
            print_pair_rates(store.clone()).await;
            Self::clean_up(&store).await;
        });
    }
}
