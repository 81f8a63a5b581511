//! Claim+complete pairs per second through `PostgresStore` at 1, 16 and
//! 256 tasks. `bench/postgres.sh` runs it beside pgbench doing the same
//! statements, and prints the ratios. Needs `IDEM_TEST_POSTGRES_URL`;
//! `IDEM_BENCH_POOL` sets the pool size (default 16).

use idem_postgres::PostgresStore;
use idem_testkit::store_bench::PairRateBench;

/// The benchmark's store: the `idem_bench` schema, which the script
/// empties and reads.
struct PostgresBench;

impl PairRateBench for PostgresBench {
    type Store = PostgresStore;
    const URL_VAR: &'static str = "IDEM_TEST_POSTGRES_URL";
    const SERVER: &'static str = "PostgreSQL";

    async fn open(url: &str, pool_size: usize) -> PostgresStore {
        PostgresStore::builder(url)
            .schema("idem_bench")
            .pool_size(pool_size)
            .connect()
            .await
            .expect("connect")
    }
}

fn main() {
    PostgresBench::run();
}
