//! Claim+complete pairs per second through `RedisStore` at 1, 16 and 256
//! tasks. `bench/redis.sh` runs it beside redis-benchmark sending the same
//! scripts, and prints the ratios. Needs `IDEM_TEST_REDIS_URL`.

use std::sync::Arc;
use std::time::Duration;

use idem_redis::RedisStore;

fn main() {
    let Ok(url) = std::env::var("IDEM_TEST_REDIS_URL") else {
        eprintln!("skipped: IDEM_TEST_REDIS_URL is not set");
        return;
    };
    let secs: u64 = std::env::var("IDEM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = Arc::new(
            RedisStore::builder(&url)
                .prefix("idem-bench")
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
        store.delete_all().await.expect("clean up");
    });
}
