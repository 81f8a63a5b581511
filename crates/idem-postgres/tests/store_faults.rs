//! The store fault suite (`idem_testkit::store_faults`, issue 36) on
//! PostgreSQL: freezes, resets and lost answers during the claim, the
//! completion and the purge, through a fault proxy to the test server; a
//! server that vanishes and comes back; and a crash (`pg_ctl -m
//! immediate`) and restart of a private server under two gateways'
//! traffic, where every record survives.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::time::Duration;

use idem_postgres::PostgresStore;
use idem_testkit::IsolatedBackend;
use idem_testkit::private_postgres::PrivatePostgres;

/// The test server, with timeouts shorter than the suite's deadline.
struct ShortTimeouts;

impl IsolatedBackend for ShortTimeouts {
    type Store = PostgresStore;
    const URL_VAR: &'static str = "IDEM_TEST_POSTGRES_URL";
    const SERVER: &'static str = "PostgreSQL";
    const TAG: &'static str = "faults";

    async fn open(url: &str, name: &str) -> PostgresStore {
        PostgresStore::builder(url)
            .schema(name)
            .pool_size(4)
            .connect_timeout(Duration::from_millis(800))
            .statement_timeout(Duration::from_millis(800))
            .connect()
            .await
            .expect("connect to postgres")
    }

    async fn remove(store: PostgresStore) {
        let _ = store.drop_schema().await;
    }
}

idem_testkit::store_fault_tests!(ShortTimeouts);

/// A server that vanishes behind the pool's open connections (a failover
/// to another machine, a proxy whose backend died) and a network that
/// heals for new connections: the store should work again.
///
/// A call that the caller's deadline cut off takes its connection out of
/// the pool (deadpool's `Fast` recycling would hand it out again: it is
/// dead, not closed), so later calls open new ones.
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
fn crash_and_restart_under_two_gateways() {
    let Some(server) = PrivatePostgres::start() else {
        return;
    };
    idem_testkit::runtime().block_on(idem_testkit::store_crashes::crash_under_traffic::<
        ShortTimeouts,
        _,
    >(server));
}

/// The epoch through a crash and restart of a private server: no loss
/// seen (`idem_testkit::store_crashes::epoch_survives_a_crash`).
#[test]
fn the_epoch_survives_a_crash_and_a_down_server_is_unavailable() {
    let Some(server) = PrivatePostgres::start() else {
        return;
    };
    idem_testkit::runtime().block_on(idem_testkit::store_crashes::epoch_survives_a_crash::<
        ShortTimeouts,
        _,
    >(server));
}
