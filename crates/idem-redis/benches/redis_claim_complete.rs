//! Claim+complete pairs per second through `RedisStore` at 1, 16 and 256
//! tasks. `bench/redis.sh` runs it beside redis-benchmark sending the same
//! scripts, and prints the ratios. Needs `IDEM_TEST_REDIS_URL`.

use idem_redis::RedisStore;
use idem_testkit::store_bench::PairRateBench;

/// The benchmark's store: the `idem-bench` key prefix, deleted afterwards.
/// One multiplexed connection: no pool.
struct RedisBench;

impl PairRateBench for RedisBench {
    type Store = RedisStore;
    const URL_VAR: &'static str = "IDEM_TEST_REDIS_URL";
    const SERVER: &'static str = "Redis";

    async fn open(url: &str, _pool_size: usize) -> RedisStore {
        RedisStore::builder(url)
            .prefix("idem-bench")
            .connect()
            .await
            .expect("connect")
    }

    async fn clean_up(store: &RedisStore) {
        store.delete_all().await.expect("clean up");
    }
}

fn main() {
    RedisBench::run();
}
