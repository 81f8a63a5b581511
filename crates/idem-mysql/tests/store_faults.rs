//! The store fault suite (`idem_testkit::store_faults`, issue 36) on
//! MySQL/MariaDB: freezes, resets and lost answers during the claim, the
//! completion and the purge, through a fault proxy to the test server; a
//! server that vanishes and comes back; and a crash (SIGKILL) and restart
//! of a private `mariadbd` under two gateways' traffic, where every record
//! survives.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::time::Duration;

use idem_mysql::MysqlStore;
use idem_testkit::IsolatedBackend;
use idem_testkit::private_mariadb::PrivateMariadb;

/// The test server, with timeouts shorter than the suite's deadline.
struct ShortTimeouts;

impl IsolatedBackend for ShortTimeouts {
    type Store = MysqlStore;
    const URL_VAR: &'static str = "IDEM_TEST_MYSQL_URL";
    const SERVER: &'static str = "MySQL";
    const TAG: &'static str = "faults";

    async fn open(url: &str, name: &str) -> MysqlStore {
        // The driver moves a connection to 127.0.0.1 onto the server's
        // Unix socket unless told not to, which would go round the proxy.
        let sep = if url.contains('?') { '&' } else { '?' };
        MysqlStore::builder(format!("{url}{sep}prefer_socket=false"))
            .database(name)
            // One connection: the driver hands a used connection back to
            // the pool in the background, and a call that came meanwhile
            // would open a new one, whose handshake a fault then stops
            // before the request is even sent. With one, every call runs
            // on the connection the suite warmed up, so a request under
            // test always reaches the server.
            .pool_size(1)
            .connect_timeout(Duration::from_millis(800))
            .lock_wait_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect to mysql")
    }

    async fn remove(store: MysqlStore) {
        let _ = store.drop_database().await;
    }
}

idem_testkit::store_fault_tests!(ShortTimeouts);

/// A server that vanishes behind the pool's open connection (a failover
/// to another machine, a proxy whose backend died) and a network that
/// heals for new connections: the store works again.
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
    let Some(server) = PrivateMariadb::start() else {
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
    let Some(server) = PrivateMariadb::start() else {
        return;
    };
    idem_testkit::runtime().block_on(idem_testkit::store_crashes::epoch_survives_a_crash::<
        ShortTimeouts,
        _,
    >(server));
}
