//! The store fault suite (`idem_testkit::store_faults`, issue 36) on
//! Redis: freezes, resets and lost answers during the claim, the
//! completion and the purge, through a fault proxy to the test server; a
//! server that vanishes and comes back; a crash (SIGKILL) and restart of a
//! private `redis-server` with an fsynced append-only file under two
//! gateways' traffic, where every record survives; and one without
//! persistence, which comes back empty (what that does today is
//! documented by the test).
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::time::Duration;

use idem_redis::RedisStore;
use idem_testkit::IsolatedBackend;
use idem_testkit::restartable_redis::RestartableRedis;
use idem_testkit::store_crashes::{crash_under_traffic, restart_empty};

/// The test server, with a timeout shorter than the suite's deadline.
struct ShortTimeouts;

impl IsolatedBackend for ShortTimeouts {
    type Store = RedisStore;
    const URL_VAR: &'static str = "IDEM_TEST_REDIS_URL";
    const SERVER: &'static str = "Redis";
    const TAG: &'static str = "faults";

    async fn open(url: &str, name: &str) -> RedisStore {
        RedisStore::builder(url)
            .prefix(name)
            .timeout(Duration::from_millis(800))
            .connect()
            .await
            .expect("connect to redis")
    }

    async fn remove(store: RedisStore) {
        let _ = store.delete_all().await;
    }
}

idem_testkit::store_fault_tests!(ShortTimeouts);

/// A server that vanishes behind the store's open connection (a failover
/// to another machine, a proxy whose backend died) and a network that
/// heals for new connections: the store should work again.
///
/// A call that times out replaces the store's connection (the driver's
/// `ConnectionManager` would keep sending on the dead one: redis 1.8
/// retries a timeout on the same connection), so later calls go over a
/// new one.
#[test]
fn black_hole_then_heal() {
    let Some(url) = ShortTimeouts::url() else {
        return;
    };
    idem_testkit::runtime().block_on(idem_testkit::store_faults::black_hole_then_heal::<
        ShortTimeouts,
    >(&url));
}

#[test]
fn crash_and_restart_with_an_fsynced_aof_under_two_gateways() {
    let Some(server) = RestartableRedis::with_aof() else {
        return;
    };
    idem_testkit::runtime().block_on(crash_under_traffic::<ShortTimeouts, _>(server));
}

/// Retries of forgotten keys execute again, and the epoch says the store
/// was emptied.
#[test]
fn a_restart_without_persistence_forgets_and_the_epoch_says_so() {
    let Some(server) = RestartableRedis::in_memory() else {
        return;
    };
    idem_testkit::runtime().block_on(restart_empty::<ShortTimeouts, _>(server));
}

#[test]
fn the_epoch_survives_a_crash_with_an_fsynced_aof() {
    let Some(server) = RestartableRedis::with_aof() else {
        return;
    };
    idem_testkit::runtime().block_on(idem_testkit::store_crashes::epoch_survives_a_crash::<
        ShortTimeouts,
        _,
    >(server));
}
