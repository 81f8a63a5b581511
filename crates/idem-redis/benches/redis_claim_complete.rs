//! Claim+complete pairs per second through `RedisStore` at 1, 16 and 256
//! tasks. `bench/redis.sh` runs it beside redis-benchmark sending the same
//! scripts, and prints the ratios. Needs `IDEM_TEST_REDIS_URL`.

use std::sync::Arc;

use idem_redis::RedisStore;

fn main() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = RedisStore::builder(&url)
            .prefix("idem-bench")
            .connect()
            .await
            .expect("connect");
        idem_testkit::print_pair_rates(Arc::new(store.clone())).await;
        store.delete_all().await.expect("clean up");
    });
}
