//! Claim+complete pairs per second through `PostgresStore` at 1, 16 and
//! 256 tasks. `bench/postgres.sh` runs it beside pgbench doing the same
//! statements, and prints the ratios.
//!
//! Needs `IDEM_TEST_POSTGRES_URL`; prints nothing without it.

use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PostgresStore;

fn main() {
    let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        eprintln!("skipped: IDEM_TEST_POSTGRES_URL is not set");
        return;
    };
    let secs: u64 = std::env::var("IDEM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let pool: usize = std::env::var("IDEM_BENCH_POOL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = Arc::new(
            PostgresStore::builder(&url)
                .schema("idem_bench")
                .pool_size(pool)
                .connect()
                .await
                .expect("connect"),
        );
        for tasks in [1, 16, 256] {
            let rate = idem_core::testkit::pairs_per_second(
                store.clone(),
                tasks,
                Duration::from_secs(secs),
            )
            .await;
            println!("store/{tasks} {rate:.0}");
        }
    });
}
