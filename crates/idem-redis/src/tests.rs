//! Tests against the Redis named by `IDEM_TEST_REDIS_URL`; each test uses a
//! key prefix of its own, deleted afterwards.

use std::time::Duration;

use idem_core::{Claim, Operation, RecordId, Settled, Store};
use idem_testkit::{IsolatedBackend, request, t0, unique_id};

use super::*;
use crate::connection::Connection;

/// The Redis at `IDEM_TEST_REDIS_URL`; each store under a key prefix of
/// its own.
pub(crate) struct TestRedis;

impl IsolatedBackend for TestRedis {
    type Store = RedisStore;
    const URL_VAR: &'static str = "IDEM_TEST_REDIS_URL";
    const SERVER: &'static str = "Redis";

    async fn open(url: &str, name: &str) -> RedisStore {
        RedisStore::builder(url)
            .prefix(name)
            .connect()
            .await
            .expect("connect to test redis")
    }

    async fn remove(store: RedisStore) {
        let _ = store.delete_all().await;
    }
}

mod conformance {
    use super::*;

    idem_testkit::conformance_tests!(optional TestRedis::fresh_if_configured());
}

fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

/// Two connections (as two instances), 64 tasks, one key: one winner.
#[test]
fn cross_instance_race_has_one_winner() {
    let Some(url) = TestRedis::url() else { return };
    rt().block_on(async {
        let a = TestRedis::fresh(&url).await;
        let b = RedisStore::builder(&url)
            .prefix(a.store().prefix())
            .connect()
            .await
            .unwrap();
        idem_testkit::race_one_key_across(
            &[
                std::sync::Arc::new(a.store().clone()),
                std::sync::Arc::new(b),
            ],
            64,
        )
        .await;
    });
}

/// After `SCRIPT FLUSH` the scripts are loaded again on first use.
#[test]
fn scripts_survive_a_flush() {
    let Some(url) = TestRedis::url() else { return };
    rt().block_on(async {
        let g = TestRedis::fresh(&url).await;
        let store = g.store();
        let id = unique_id("redis-flush-0001");
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        let mut conn = store.conn.get();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::InFlight { .. }
        ));
    });
}

use idem_testkit::private_redis::{PrivateRedis, free_port};

/// The store fails with `Unavailable` while Redis is down and works again
/// once it is back, without being rebuilt; the new server has no scripts,
/// so this also proves they are reloaded.
#[test]
fn store_recovers_after_redis_restarts() {
    if TestRedis::url().is_none() {
        return;
    }
    let port = free_port();
    let Some(server) = PrivateRedis::start(port) else {
        return;
    };
    server.wait_ready();
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap();
        let id = unique_id("redis-restart-01");
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));

        server.kill();
        let id2 = unique_id("redis-restart-02");
        let err = store.claim(&request(&id2, "{}", t0())).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        let err = store.get(&id2, t0()).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");

        let server = PrivateRedis::start(port).expect("restart redis-server");
        server.wait_ready();
        // The manager reconnects in the background; give it a bounded number
        // of attempts, each one a real operation.
        let mut recovered = None;
        for _ in 0..40 {
            match store.claim(&request(&id2, "{}", t0())).await {
                Ok(claim) => {
                    recovered = Some(claim);
                    break;
                }
                Err(e) => {
                    assert!(e.is_unavailable(), "{e:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        assert!(
            matches!(recovered, Some(Claim::Acquired(_))),
            "store did not recover: {recovered:?}"
        );
        drop(server);
    });
}

/// A heartbeat past the record's expiry raises the Redis TTLs of the
/// record and its (scope, key) index with it (never lowers them), so Redis
/// does not drop a record whose execution still runs.
#[test]
fn extend_lease_raises_the_redis_ttls() {
    let Some(url) = TestRedis::url() else { return };
    rt().block_on(async {
        let g = TestRedis::fresh(&url).await;
        let store = g.store();
        let id = unique_id("redis-extend-ttl");
        let conn = store.conn.get();
        let pexpiretime = |mut conn: Connection, key: String| async move {
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            at
        };
        let (record, index) = (
            store.record_key(&id),
            store.key_index_key(&id.scope, &id.key),
        );
        let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap() else {
            panic!("claim");
        };
        let new_end = lease.expires_at + Duration::from_secs(600);
        assert_eq!(
            store
                .extend_lease(&id, lease.fence, new_end, t0())
                .await
                .unwrap(),
            Settled::Applied
        );
        let want = (new_end + EXPIRY_MARGIN).as_millis();
        assert_eq!(pexpiretime(conn.clone(), record.clone()).await, want);
        assert_eq!(pexpiretime(conn.clone(), index.clone()).await, want);
        // An earlier end lowers nothing.
        assert_eq!(
            store
                .extend_lease(&id, lease.fence, lease.expires_at, t0())
                .await
                .unwrap(),
            Settled::Applied
        );
        assert_eq!(pexpiretime(conn.clone(), record).await, want);
        assert_eq!(pexpiretime(conn.clone(), index).await, want);
    });
}

/// A completion writes the lease end empty in the hash (one `HSET`, no
/// `HDEL`), and a record finished by the previous script, whose lease
/// field is missing, reads the same through every path: instances of
/// both versions share a prefix during an upgrade.
#[test]
fn a_finished_lease_reads_alike_empty_or_missing() {
    let Some(url) = TestRedis::url() else { return };
    rt().block_on(async {
        let g = TestRedis::fresh(&url).await;
        let store = g.store();
        let mut conn = store.conn.get();
        let mut finished = Vec::new();
        for (name, drop_field) in [("redis-lu-empty-01", false), ("redis-lu-gone-001", true)] {
            let id = unique_id(name);
            let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap()
            else {
                panic!("claim");
            };
            let done = idem_core::Completion::completed(idem_testkit::response(201, "lu"))
                .with_resource_id("r-1");
            assert_eq!(
                store.complete(&id, lease.fence, done, t0()).await.unwrap(),
                Settled::Applied
            );
            let lu: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(store.record_key(&id))
                .arg("lu")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(lu, Some(Vec::new()), "the lease end is written empty");
            if drop_field {
                // As the previous completion script left it.
                let _: i64 = redis::cmd("HDEL")
                    .arg(store.record_key(&id))
                    .arg("lu")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
            let read = store.get(&id, t0()).await.unwrap().expect("the record");
            let found = store
                .find_by_key(&id.scope, &id.key, t0(), 10)
                .await
                .unwrap();
            let Claim::Replay(replayed) = store.claim(&request(&id, "{}", t0())).await.unwrap()
            else {
                panic!("a replay");
            };
            assert_eq!(read.lease_until, None);
            assert_eq!(found, vec![read.clone()]);
            assert_eq!(*replayed, read);
            // A heartbeat of the finished record changes nothing.
            assert_eq!(
                store
                    .extend_lease(&id, lease.fence, t0() + Duration::from_secs(60), t0())
                    .await
                    .unwrap(),
                Settled::StaleFence
            );
            assert_eq!(store.get(&id, t0()).await.unwrap(), Some(read.clone()));
            finished.push(read);
        }
        // The two records differ only in what identifies them.
        let [a, b] = &finished[..] else {
            panic!("two records");
        };
        assert_eq!(
            (
                a.status,
                &a.response,
                &a.resource_id,
                a.lease_until,
                a.expires_at
            ),
            (
                b.status,
                &b.response,
                &b.resource_id,
                b.lease_until,
                b.expires_at
            )
        );
    });
}

/// The (scope, key) index: written by the claim with a TTL at least the
/// record's expiry, left behind by release, cleaned by the look-up.
#[test]
fn the_key_index_is_cleaned_by_look_ups() {
    let Some(url) = TestRedis::url() else { return };
    rt().block_on(async {
        let g = TestRedis::fresh(&url).await;
        let store = g.store();
        let id = unique_id("redis-key-index1");
        let index = store.key_index_key(&id.scope, &id.key);
        let mut conn = store.conn.get();
        let members = |mut conn: Connection, index: String| async move {
            let n: i64 = redis::cmd("ZCARD")
                .arg(&index)
                .query_async(&mut conn)
                .await
                .unwrap();
            n
        };

        let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap() else {
            panic!("claim");
        };
        assert_eq!(members(conn.clone(), index.clone()).await, 1);
        let expiry: i64 = redis::cmd("PEXPIRETIME")
            .arg(&index)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(expiry, (lease.expires_at + EXPIRY_MARGIN).as_millis());
        // The record itself outlives its expiry by the margin too, so a
        // Redis clock that runs ahead never drops a live record.
        let record_expiry: i64 = redis::cmd("PEXPIRETIME")
            .arg(store.record_key(&id))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            record_expiry,
            (lease.expires_at + EXPIRY_MARGIN).as_millis()
        );
        // A record that expires later pushes the index's TTL out; one that
        // expires sooner does not pull it in.
        let later = RecordId::new(
            id.scope.clone(),
            Operation::new("PUT", "/x"),
            id.key.clone(),
        );
        let mut req = request(&later, "{}", t0());
        req.ttl *= 2;
        assert!(matches!(
            store.claim(&req).await.unwrap(),
            Claim::Acquired(_)
        ));
        let sooner = RecordId::new(
            id.scope.clone(),
            Operation::new("PATCH", "/y"),
            id.key.clone(),
        );
        let mut req = request(&sooner, "{}", t0());
        req.ttl /= 2;
        assert!(matches!(
            store.claim(&req).await.unwrap(),
            Claim::Acquired(_)
        ));
        let expiry: i64 = redis::cmd("PEXPIRETIME")
            .arg(&index)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            expiry,
            (t0() + idem_testkit::TTL * 2 + EXPIRY_MARGIN).as_millis()
        );
        assert_eq!(members(conn.clone(), index.clone()).await, 3);

        assert_eq!(
            store.release(&id, lease.fence, t0()).await.unwrap(),
            Settled::Applied
        );
        assert_eq!(
            members(conn.clone(), index.clone()).await,
            3,
            "release leaves it"
        );
        let found = store
            .find_by_key(&id.scope, &id.key, t0(), 10)
            .await
            .unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(
            members(conn.clone(), index.clone()).await,
            2,
            "the look-up removes it"
        );
        // Past the shorter ttl, the expired record's member goes too.
        let at = t0() + idem_testkit::TTL / 2;
        let found = store.find_by_key(&id.scope, &id.key, at, 10).await.unwrap();
        assert_eq!(found.iter().map(|r| &r.id).collect::<Vec<_>>(), [&later]);
        assert_eq!(members(conn.clone(), index.clone()).await, 1);
    });
}

/// `wait_for_replicas` on one server without replicas: a claim that takes
/// the key is written but never acknowledged, so it fails closed; the
/// record is there (in flight for a claim without the wait), and a claim
/// that finds it in flight answers without waiting.
#[test]
fn a_wait_for_replicas_no_server_has_fails_closed() {
    let Some(url) = TestRedis::url() else { return };
    rt().block_on(async {
        let plain = TestRedis::fresh(&url).await;
        let waiting = RedisStore::builder(&url)
            .prefix(plain.store().prefix())
            .wait_for_replicas(1, Duration::from_millis(100))
            .connect()
            .await
            .expect("connect");
        let id = unique_id("wait-no-replica");
        let e = waiting
            .claim(&request(&id, "{}", t0()))
            .await
            .expect_err("no replica acknowledges");
        assert_eq!(e.kind(), idem_core::StoreErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("0 of the 1 replicas"), "{e}");
        let again = waiting.claim(&request(&id, "{}", t0())).await.unwrap();
        assert!(matches!(again, Claim::InFlight { .. }), "{again:?}");
        let record = plain.get(&id, t0()).await.unwrap().expect("written");
        assert_eq!(record.status, idem_core::Status::InProgress);

        // A replay answers with a completion the waiting store did not
        // write: it writes again and waits, so it fails closed too.
        let done = idem_core::Completion::completed(idem_testkit::response(201, "done"));
        assert_eq!(
            plain
                .complete(&id, record.fence, done.clone(), t0())
                .await
                .unwrap(),
            Settled::Applied
        );
        let e = waiting
            .claim(&request(&id, "{}", t0()))
            .await
            .expect_err("a replay no replica acknowledges");
        assert_eq!(e.kind(), idem_core::StoreErrorKind::Unavailable, "{e}");
        // So does a repeated completion by its own fence.
        let e = waiting
            .complete(&id, record.fence, done, t0())
            .await
            .expect_err("a repeated completion no replica acknowledges");
        assert_eq!(e.kind(), idem_core::StoreErrorKind::Unavailable, "{e}");
        assert!(matches!(
            plain.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Replay(_)
        ));
    });
}

/// With the replica wait on, a server that refuses a command the wait
/// needs (here `INFO`, by ACL) is refused at connect time, not after a
/// claim was written.
#[test]
fn a_server_that_refuses_the_waits_commands_is_refused_at_connect() {
    use idem_testkit::private_redis::{PrivateRedis, free_port};
    if TestRedis::url().is_none() {
        return;
    }
    let Some(server) = PrivateRedis::start(free_port()) else {
        return;
    };
    server.wait_ready();
    let port = server
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let acl = std::process::Command::new("redis-cli")
        .args(["-p", &port, "ACL", "SETUSER", "limited", "on", ">pw"])
        .args(["~*", "&*", "+@all", "-info"])
        .output()
        .expect("redis-cli");
    assert!(acl.status.success());
    let limited = server.url().replacen("redis://", "redis://limited:pw@", 1);
    rt().block_on(async {
        let e = RedisStore::builder(&limited)
            .wait_for_replicas(1, Duration::from_millis(100))
            .connect()
            .await
            .expect_err("INFO is refused");
        assert_eq!(e.kind(), idem_core::StoreErrorKind::Setup, "{e}");
        assert!(e.to_string().contains("replica wait"), "{e}");
        RedisStore::builder(&limited)
            .connect()
            .await
            .expect("without the wait, INFO is not needed");
    });
}

/// The test Redis runs with `--appendonly no`: the report says it loses
/// records.
#[test]
fn durability_reports_appendonly_no_as_losing_records() {
    use idem_testkit::private_redis::{PrivateRedis, free_port};
    let Some(redis) = PrivateRedis::start(free_port()) else {
        return;
    };
    redis.wait_ready();
    rt().block_on(async {
        let store = RedisStore::builder(redis.url()).connect().await.unwrap();
        let report = store.durability().await.unwrap();
        let settings: Vec<&str> = report.findings.iter().map(|f| f.setting.as_str()).collect();
        assert_eq!(settings, ["appendonly", "appendfsync", "maxmemory-policy"]);
        assert_eq!(report.findings[0].value, "no");
        assert!(report.findings[0].verdict.loses());
        assert!(report.loses_records());
    });
}

/// The epoch (`idem_core::EpochWatch`) on one server: one place, `store`,
/// at `PREFIX:epoch`, with no TTL. A private Redis without persistence,
/// restarted, has lost it: the next advance writes it again and the watch
/// reports the store emptied. While the server is down an advance is
/// `Unavailable`.
#[test]
fn a_restart_without_persistence_is_seen_as_an_emptied_store() {
    use idem_core::{EpochMark, EpochWatch, LossCause};
    use idem_testkit::private_server::PrivateServer;
    use idem_testkit::restartable_redis::RestartableRedis;
    if TestRedis::url().is_none() {
        return;
    }
    let Some(server) = RestartableRedis::in_memory() else {
        return;
    };
    rt().block_on(async {
        let store = RedisStore::builder(server.url())
            .prefix("epoch-test")
            .timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap();
        let mut watch = EpochWatch::new();
        let marks = store.advance_epoch("before").await.unwrap();
        assert_eq!(marks, [EpochMark::new("store", "before", 1, true)]);
        assert!(watch.observe(&marks).is_empty());
        let marks = store.advance_epoch("ignored").await.unwrap();
        assert_eq!(marks, [EpochMark::new("store", "before", 2, false)]);
        assert!(watch.observe(&marks).is_empty());
        let mut conn = store.conn.get();
        let ttl: i64 = redis::cmd("PTTL")
            .arg("epoch-test:epoch")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(ttl, -1, "the epoch never expires");

        let mut server = tokio::task::spawn_blocking(move || {
            let mut server = server;
            server.crash();
            server
        })
        .await
        .unwrap();
        let e = store.advance_epoch("while-down").await.unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        server = tokio::task::spawn_blocking(move || {
            server.restart();
            server
        })
        .await
        .unwrap();

        // The store reconnects by itself: poll, with a deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let marks = loop {
            match store.advance_epoch("after").await {
                Ok(marks) => break marks,
                Err(e) => {
                    assert!(e.is_unavailable(), "{e:?}");
                    assert!(std::time::Instant::now() < deadline, "no reconnect: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(marks, [EpochMark::new("store", "after", 1, true)]);
        let losses = watch.observe(&marks);
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].place, "store");
        assert_eq!(losses[0].cause, LossCause::Emptied);
        // The new epoch is remembered: its next advance is no loss.
        let marks = store.advance_epoch("again").await.unwrap();
        assert_eq!(marks, [EpochMark::new("store", "after", 2, false)]);
        assert!(watch.observe(&marks).is_empty());
        drop(server);
    });
}

/// A counter set back (as a failover to a replica that had not received
/// the last advances would leave it) is a rollback; another epoch in its
/// place (a restored backup of another store) is a replacement.
#[test]
fn an_epoch_counter_set_back_is_seen_as_a_rollback() {
    use idem_core::{EpochWatch, LossCause};
    let Some(url) = TestRedis::url() else { return };
    rt().block_on(async {
        let g = TestRedis::fresh(&url).await;
        let store = g.store();
        let key = store.keys.epoch();
        assert_eq!(key, format!("{}:epoch", store.prefix()));
        let mut watch = EpochWatch::new();
        for _ in 0..3 {
            let marks = store.advance_epoch("mine").await.unwrap();
            assert!(watch.observe(&marks).is_empty(), "{marks:?}");
        }
        let mut conn = store.conn.get();
        let hset = |field: &'static str, value: &'static str| {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move {
                let _: i64 = redis::cmd("HSET")
                    .arg(&key)
                    .arg(field)
                    .arg(value)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        };
        hset("counter", "1").await;
        let marks = store.advance_epoch("mine").await.unwrap();
        assert_eq!((marks[0].counter, marks[0].created), (2, false));
        let losses = watch.observe(&marks);
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].cause, LossCause::RolledBack { seen: 3, read: 2 });
        // Advancing again from there is fine.
        assert!(
            watch
                .observe(&store.advance_epoch("mine").await.unwrap())
                .is_empty()
        );

        hset("epoch", "someone-else").await;
        let losses = watch.observe(&store.advance_epoch("mine").await.unwrap());
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].cause, LossCause::Replaced);

        // Not a record: no record pattern, index or look-up reaches it.
        let mut scan = conn.scan(store.keys.every_record()).await.unwrap();
        while let Some(page) = scan.next_page(&mut conn).await.unwrap() {
            assert!(!page.contains(&key), "{page:?}");
        }
        assert_eq!(store.keys.id_of(&key), None);
        let far = t0() + Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(store.purge_expired(far, 1000).await.unwrap(), 0);
        assert!(store.list_stale(far, None, 1000).await.unwrap().is_empty());
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 1);
    });
}
