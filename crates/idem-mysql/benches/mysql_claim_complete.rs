//! Claim+complete pairs per second through `MysqlStore` at 1, 16 and 256
//! tasks. `bench/mysql.sh` runs it beside mysqlslap doing the same
//! statements, and prints the ratios. Needs `IDEM_TEST_MYSQL_URL`;
//! `IDEM_BENCH_POOL` sets the pool size (default 16).

use std::sync::Arc;

use idem_mysql::MysqlStore;

fn main() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_MYSQL_URL", "MySQL") else {
        return;
    };
    let pool: usize = std::env::var("IDEM_BENCH_POOL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = MysqlStore::builder(&url)
            .database("idem_bench")
            .pool_size(pool)
            .connect()
            .await
            .expect("connect");
        idem_testkit::print_pair_rates(Arc::new(store)).await;
    });
}
