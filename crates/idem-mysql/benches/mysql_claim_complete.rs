//! Claim+complete pairs per second through `MysqlStore` at 1, 16 and 256
//! tasks. `bench/mysql.sh` runs it beside mysqlslap doing the same
//! statements, and prints the ratios. Needs `IDEM_TEST_MYSQL_URL`;
//! `IDEM_BENCH_POOL` sets the pool size (default 16).

use idem_mysql::MysqlStore;
use idem_testkit::store_bench::PairRateBench;

/// The benchmark's store: the `idem_bench` database, which the script
/// drops before and after.
struct MysqlBench;

impl PairRateBench for MysqlBench {
    type Store = MysqlStore;
    const URL_VAR: &'static str = "IDEM_TEST_MYSQL_URL";
    const SERVER: &'static str = "MySQL";

    async fn open(url: &str, pool_size: usize) -> MysqlStore {
        MysqlStore::builder(url)
            .database("idem_bench")
            .pool_size(pool_size)
            .connect()
            .await
            .expect("connect")
    }
}

fn main() {
    MysqlBench::run();
}
