//! Tests against Redis Clusters the tests start themselves: one of three
//! masters shared by the conformance suite and the races (each test under
//! a prefix of its own), and clusters with a replica per master for the
//! failover tests, which kill masters.

use std::sync::OnceLock;
use std::time::Duration;

use idem_core::{Claim, Completion, Fence, Operation, RecordId, Settled, Store, StoreErrorKind};
use idem_testkit::redis_cluster::RedisCluster;
use idem_testkit::{Guarded, IsolatedBackend, request, response, t0, unique_id};

use super::*;
use crate::tests::TestRedis;

pub(crate) fn shared() -> Option<&'static RedisCluster> {
    static CLUSTER: OnceLock<Option<RedisCluster>> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0)).as_ref()
}

/// A key prefix no other test uses.
pub(crate) fn prefix() -> String {
    idem_testkit::unique_name("cluster")
}

pub(crate) async fn connect(url: &str, prefix: &str) -> RedisStore {
    // Generous times: the machine runs a dozen servers and the other tests.
    RedisStore::builder(url)
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to the test cluster")
}

async fn fresh() -> Option<Guarded<RedisStore>> {
    let cluster = shared()?;
    Some(TestRedis::guarded(connect(&cluster.url(), &prefix()).await))
}

mod conformance {
    use super::*;

    idem_testkit::conformance_tests!(optional async { fresh().await });
}

fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

/// Two connections to the cluster (as two instances), 64 tasks, one key:
/// one winner.
#[test]
fn cross_instance_race_has_one_winner_on_a_cluster() {
    let Some(cluster) = shared() else { return };
    rt().block_on(async {
        let prefix = prefix();
        let a = std::sync::Arc::new(TestRedis::guarded(connect(&cluster.url(), &prefix).await));
        let b = std::sync::Arc::new(TestRedis::guarded(connect(&cluster.url(), &prefix).await));
        idem_testkit::race_one_key_across(&[a, b], 64).await;
    });
}

/// A record's keys (hash, fence, `(scope, key)` index, in-progress index)
/// share one slot, and the buckets spread records over every master.
#[test]
fn a_records_keys_share_a_slot_and_records_reach_every_master() {
    let Some(cluster) = shared() else { return };
    rt().block_on(async {
        let store = TestRedis::guarded(connect(&cluster.url(), &prefix()).await);
        let mut masters = std::collections::BTreeSet::new();
        for i in 0..64 {
            let id = unique_id(&format!("spread-{i}"));
            let keys = &store.store().keys;
            let slot = |k: &str| cluster.cli(cluster.ports()[0], &["CLUSTER", "KEYSLOT", k]);
            let record_slot = slot(&keys.record(&id));
            for other in [
                keys.fence(&id),
                keys.key_index(&id.scope, &id.key),
                keys.in_progress(&id.scope, &id.key),
            ] {
                assert_eq!(slot(&other), record_slot, "{other}");
            }
            let claim = store.claim(&request(&id, "{}", t0())).await.expect("claim");
            assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
            masters.insert(cluster.master_of(&keys.record(&id)).0);
        }
        assert_eq!(masters.len(), 3, "64 records reached {masters:?}");
    });
}

/// Fences of one record grow across release and takeover, and stay above
/// every earlier one after its fence counter is gone (expired with the
/// record): the counter starts again from the server's clock.
#[test]
fn a_records_fences_keep_growing_without_a_global_counter() {
    let Some(cluster) = shared() else { return };
    rt().block_on(async {
        let store = TestRedis::guarded(connect(&cluster.url(), &prefix()).await);
        let id = unique_id("fences");
        let mut last = 0;
        for round in 0..3 {
            let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap()
            else {
                panic!("round {round}: not acquired");
            };
            assert!(
                lease.fence.get() > last,
                "round {round}: {lease:?} after {last}"
            );
            last = lease.fence.get();
            let settled = store.release(&id, lease.fence, t0()).await.unwrap();
            assert_eq!(settled, Settled::Applied, "round {round}");
            if round == 1 {
                // As if the counter had expired with the record.
                let mut conn = store.store().conn.get();
                let _: i64 = redis::cmd("DEL")
                    .arg(store.store().keys.fence(&id))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
        // A stale fence changes nothing.
        let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap() else {
            panic!("not acquired");
        };
        let stale = Fence::new(last);
        let done = Completion::completed(response(201, "stale"));
        assert_eq!(
            store.complete(&id, stale, done, t0()).await.unwrap(),
            Settled::StaleFence
        );
        let done = Completion::completed(response(201, "mine"));
        assert!(store.complete(&id, lease.fence, done, t0()).await.unwrap() == Settled::Applied);
    });
}

#[test]
fn cluster_urls_are_read_without_showing_them() {
    for (url, wanted) in [
        ("redis-cluster://127.0.0.1:7000", None),
        (
            "redis-cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001/",
            None,
        ),
        (
            "redis-cluster://h1:7000?wait_replicas=1&wait_timeout_ms=300",
            None,
        ),
        ("redis-cluster://h1:7000/0", None),
        ("redis-cluster://", Some("HOST:PORT")),
        ("redis-cluster://h1:7000,,h2:7001", Some("HOST:PORT")),
        ("redis-cluster://h1", Some("HOST:PORT")),
        ("redis-cluster://u:s3cret@h1:7000/2", Some("database 0")),
        (
            "redis-cluster://u:s3cret@h1:7000?protocol=resp3",
            Some("no options"),
        ),
        (
            "redis-cluster://u:s3cret@h1:7000#insecure",
            Some("no options"),
        ),
        ("redis-cluster://u:s3cret@h1:notaport", Some("invalid URL")),
        (
            "redis://h1:6379?wait_replicas=x",
            Some("number of replicas"),
        ),
        (
            "redis://h1:6379?wait_timeout_ms=100",
            Some("without wait_replicas"),
        ),
        (
            "redis://h1:6379?wait_replicas=1&wait_timeout_ms=2000",
            Some("shorter"),
        ),
        (
            "redis://h1:6379?wait_replicas=1&wait_timeout_ms=0",
            Some("above zero"),
        ),
    ] {
        let checked = RedisStore::builder(url).check();
        match wanted {
            None => assert!(checked.is_ok(), "{url}: {checked:?}"),
            Some(part) => {
                let e = checked.expect_err(url);
                assert_eq!(e.kind(), StoreErrorKind::Setup, "{url}");
                assert!(e.to_string().contains(part), "{url}: {e}");
                assert!(!e.to_string().contains("s3cret"), "{url}: {e}");
            }
        }
    }
    let braces = RedisStore::builder("redis-cluster://h1:7000")
        .prefix("idem{x}")
        .check()
        .expect_err("a brace in a cluster prefix");
    assert!(braces.to_string().contains("'{'"), "{braces}");
    assert!(
        RedisStore::builder("redis://h1:6379")
            .prefix("idem{x}")
            .check()
            .is_ok(),
        "one server has no slots to split"
    );
}

/// A password shared by the cluster's nodes for the failover tests, whose
/// store connects as its own user so that a master's default user can be
/// shut out (which keeps its replica from reconnecting).
pub(crate) const USER: &str = "idem";
pub(crate) const PASSWORD: &str = "failover-test";

/// Three masters with a replica each, and a user for the store on every
/// node.
pub(crate) fn failover_cluster() -> Option<RedisCluster> {
    let cluster = RedisCluster::start(3, 1)?;
    cluster.on_every_node(&[
        "ACL",
        "SETUSER",
        USER,
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "&*",
        "+@all",
    ]);
    Some(cluster)
}

pub(crate) async fn failover_store(cluster: &RedisCluster, prefix: &str, wait: bool) -> RedisStore {
    let url = cluster.url_as(&format!("{USER}:{PASSWORD}@"));
    // Generous times: the machine runs a dozen servers and the other tests.
    let builder = RedisStore::builder(url)
        .prefix(prefix)
        .timeout(Duration::from_secs(5));
    let builder = if wait {
        builder.wait_for_replicas(1, Duration::from_millis(1500))
    } else {
        builder
    };
    builder
        .connect()
        .await
        .expect("connect to the failover cluster")
}

/// Cuts `replica` off `master` for good: the master refuses its default
/// user (which the replica logs in as), then drops its replication link.
/// The master still serves the store's user.
pub(crate) fn shut_replica_out(cluster: &RedisCluster, master: u16, replica: u16) {
    let as_store = |args: &[&str]| {
        let mut all = vec!["--user", USER, "--pass", PASSWORD];
        all.extend_from_slice(args);
        cluster.cli(master, &all)
    };
    as_store(&["ACL", "SETUSER", "default", "off"]);
    as_store(&["CLIENT", "KILL", "TYPE", "replica"]);
    cluster.wait_for(Duration::from_secs(10), "the replica's link down", |c| {
        c.cli(replica, &["INFO", "replication"])
            .contains("master_link_status:down")
    });
}

/// Kills the master on `port` and waits until its replica serves its slots.
fn fail_over(cluster: &mut RedisCluster, port: u16) {
    cluster.kill(port);
    cluster.wait_ready(idem_testkit::redis_cluster::SETTLE_LIMIT);
}

/// With `wait_for_replicas`, every write the store acknowledged is on a
/// replica: kill the master that holds them, and its replica, now master,
/// answers with every record as it was.
#[test]
fn acknowledged_writes_survive_a_failover_with_wait() {
    let Some(mut cluster) = failover_cluster() else {
        return;
    };
    let prefix = prefix();
    let ids: Vec<_> = (0..40).map(|i| unique_id(&format!("kept-{i}"))).collect();
    let victim = rt().block_on(async {
        let store = failover_store(&cluster, &prefix, true).await;
        for (i, id) in ids.iter().enumerate() {
            let Claim::Acquired(lease) = store.claim(&request(id, "{}", t0())).await.unwrap()
            else {
                panic!("{id:?} not acquired");
            };
            // Every other record is left in progress.
            if i % 2 == 0 {
                let done = Completion::completed(response(201, &format!("done-{i}")));
                assert!(
                    store.complete(id, lease.fence, done, t0()).await.unwrap() == Settled::Applied
                );
            }
        }
        cluster.master_of(&store.record_key(&ids[0])).0
    });
    fail_over(&mut cluster, victim);
    rt().block_on(async {
        let store = failover_store(&cluster, &prefix, true).await;
        for (i, id) in ids.iter().enumerate() {
            let record = store
                .get(id, t0())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("record {i} lost"));
            if i % 2 == 0 {
                assert_eq!(
                    record.response,
                    Some(response(201, &format!("done-{i}"))),
                    "record {i}"
                );
            } else {
                assert_eq!(record.status, idem_core::Status::InProgress, "record {i}");
            }
        }
        let _ = store.delete_all().await;
    });
}

/// Without a replica's acknowledgement the store still answers (the loss
/// window of asynchronous replication): cut a master's replica off, claim
/// a key there, kill the master, and the promoted replica never saw the
/// claim, so the key executes again. With `wait_for_replicas` the same
/// claim fails closed instead of being acknowledged.
#[test]
fn without_wait_an_acknowledged_claim_is_lost_in_a_failover() {
    let Some(mut cluster) = failover_cluster() else {
        return;
    };
    let prefix = prefix();
    let lost = unique_id("lost");
    let refused = RecordId::new(
        lost.scope.clone(),
        Operation::from_raw("POST /other"),
        lost.key.clone(),
    );
    let master = rt().block_on(async {
        let store = failover_store(&cluster, &prefix, false).await;
        let waiting = failover_store(&cluster, &prefix, true).await;
        let (master, replicas) = cluster.master_of(&store.record_key(&lost));
        assert_eq!(
            cluster.master_of(&store.record_key(&refused)).0,
            master,
            "one (scope, key): one bucket"
        );
        shut_replica_out(&cluster, master, replicas[0]);

        let claim = store.claim(&request(&lost, "{}", t0())).await.unwrap();
        assert!(
            matches!(claim, Claim::Acquired(_)),
            "acknowledged: {claim:?}"
        );
        let e = waiting
            .claim(&request(&refused, "{}", t0()))
            .await
            .expect_err("no replica acknowledges");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("replicas"), "{e}");
        master
    });
    fail_over(&mut cluster, master);
    rt().block_on(async {
        let store = failover_store(&cluster, &prefix, false).await;
        assert!(
            store.get(&lost, t0()).await.unwrap().is_none(),
            "the claim the master acknowledged is gone with it"
        );
        let again = store.claim(&request(&lost, "{}", t0())).await.unwrap();
        assert!(
            matches!(again, Claim::Acquired(_)),
            "so the key executes again: {again:?}"
        );
        let _ = store.delete_all().await;
    });
}

/// `rediss-cluster://`: a cluster that speaks only TLS, its certificate
/// from a CA made here. With that CA the store works (the client follows
/// the slots to every master over TLS); with another CA it is refused.
#[test]
fn a_tls_cluster_checks_every_nodes_certificate() {
    use idem_testkit::redis_cluster::ClusterTls;
    use idem_testkit::tls::{TestCa, write};
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new("idem cluster test CA");
    let issued = ca.issue(&["127.0.0.1", "localhost"]);
    let tls = ClusterTls {
        cert: write(dir.path(), "node.pem", &issued.cert_pem),
        key: write(dir.path(), "node.key", &issued.key_pem),
        ca: write(dir.path(), "ca.pem", &ca.cert_pem()),
    };
    let Some(cluster) = RedisCluster::start_tls(3, 0, &tls) else {
        return;
    };
    assert!(cluster.url().starts_with("rediss-cluster://"));
    let _ = rustls::crypto::ring::default_provider().install_default();
    rt().block_on(async {
        let store = RedisStore::builder(cluster.url())
            .prefix(prefix())
            .ca_pem(ca.cert_pem())
            .connect()
            .await
            .expect("connect over TLS");
        let store = TestRedis::guarded(store);
        let mut masters = std::collections::BTreeSet::new();
        for i in 0..32 {
            let id = unique_id(&format!("tls-{i}"));
            let claim = store.claim(&request(&id, "{}", t0())).await.unwrap();
            assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
            masters.insert(cluster.master_of(&store.store().record_key(&id)).0);
        }
        assert_eq!(masters.len(), 3, "every master reached over TLS");

        crate::tls_tests::a_stranger_ca_is_refused(&cluster.url()).await;
        let plain = RedisStore::builder(cluster.url().replacen("rediss-", "redis-", 1))
            .timeout(Duration::from_secs(2))
            .connect()
            .await;
        assert!(plain.is_err(), "no plain-text way in");
    });
}

/// The slot ranges a cluster place names (`slots 0-5460`, or
/// `slots 0-99,200-300`).
fn ranges_of(place: &str) -> Vec<(u16, u16)> {
    let ranges = place
        .strip_prefix("slots ")
        .expect("a place named by slots");
    ranges
        .split(',')
        .map(|r| {
            let (a, b) = r.split_once('-').expect("START-END");
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

/// Each place's epoch key, checked to lie (by the cluster's own
/// `CLUSTER KEYSLOT`) in the slots the place names, and the port of the
/// master that holds it.
fn epoch_keys(
    cluster: &RedisCluster,
    store: &RedisStore,
    marks: &[idem_core::EpochMark],
) -> Vec<(String, u16)> {
    marks
        .iter()
        .map(|mark| {
            let ranges = ranges_of(&mark.place);
            let key = store.keys.shard_epoch(&ranges).unwrap();
            assert!(key.starts_with(&format!("{}:{{", store.prefix())), "{key}");
            let slot: u16 = cluster
                .cli(cluster.ports()[0], &["CLUSTER", "KEYSLOT", &key])
                .trim()
                .parse()
                .unwrap();
            assert!(
                ranges.iter().any(|(a, b)| *a <= slot && slot <= *b),
                "{key} in slot {slot}, not in {}",
                mark.place
            );
            assert_eq!(crate::epoch::key_slot(key.as_bytes()), slot, "{key}");
            let master = cluster.master_of(&key).0;
            (key, master)
        })
        .collect()
}

/// The epoch on a cluster: one place per master, named by its slots, its
/// key on that master; flushing one master (a restart without persistence
/// of that shard alone) is seen as that place emptied, and only that one.
/// A cluster of its own: the flush would empty other tests' records.
#[test]
fn each_master_keeps_an_epoch_and_a_flushed_one_is_seen_emptied() {
    use idem_core::{EpochWatch, LossCause};
    let Some(cluster) = RedisCluster::start(3, 0) else {
        return;
    };
    rt().block_on(async {
        let store = connect(&cluster.url(), &prefix()).await;
        let mut watch = EpochWatch::new();
        let marks = store.advance_epoch("first").await.unwrap();
        assert!(watch.observe(&marks).is_empty());
        assert_eq!(marks.len(), 3, "{marks:?}");
        let mut slots: Vec<(u16, u16)> = marks.iter().flat_map(|m| ranges_of(&m.place)).collect();
        slots.sort_unstable();
        let served: u32 = slots.iter().map(|(a, b)| u32::from(b - a) + 1).sum();
        assert_eq!(served, 16384, "the places cover every slot: {slots:?}");
        let keys = epoch_keys(&cluster, &store, &marks);
        let masters: std::collections::BTreeSet<u16> = keys.iter().map(|(_, m)| *m).collect();
        assert_eq!(masters.len(), 3, "one place per master: {keys:?}");
        for ((key, master), mark) in keys.iter().zip(&marks) {
            assert_eq!((mark.epoch.as_str(), mark.counter), ("first", 1));
            let counter = cluster.cli(*master, &["HGET", key, "counter"]);
            assert_eq!(counter.trim(), "1", "{key} on {master}");
            let ttl = cluster.cli(*master, &["PTTL", key]);
            assert_eq!(ttl.trim(), "-1", "{key} never expires");
        }
        let marks = store.advance_epoch("second").await.unwrap();
        assert!(watch.observe(&marks).is_empty());

        // Not a record: a purge far past every expiry leaves it alone.
        let far = t0() + Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(store.purge_expired(far, 1000).await.unwrap(), 0);
        assert!(store.list_stale(far, None, 1000).await.unwrap().is_empty());

        let (flushed_key, victim) = keys[1].clone();
        let flushed_place = marks
            .iter()
            .find(|m| store.keys.shard_epoch(&ranges_of(&m.place)) == Some(flushed_key.clone()))
            .unwrap()
            .place
            .clone();
        cluster.cli(victim, &["FLUSHALL"]);
        let marks = store.advance_epoch("third").await.unwrap();
        assert_eq!(marks.len(), 3, "{marks:?}");
        for mark in &marks {
            if mark.place == flushed_place {
                assert_eq!(
                    (mark.epoch.as_str(), mark.counter, mark.created),
                    ("third", 1, true)
                );
            } else {
                assert_eq!(
                    (mark.epoch.as_str(), mark.counter, mark.created),
                    ("first", 3, false)
                );
            }
        }
        let losses = watch.observe(&marks);
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].place, flushed_place);
        assert_eq!(losses[0].cause, LossCause::Emptied);
        assert!(
            watch
                .observe(&store.advance_epoch("fourth").await.unwrap())
                .is_empty()
        );
    });
}

/// A failover to a replica that missed the last advances: the place keeps
/// its name (named by its slots, not its node), and its counter is lower
/// than the one last read, a rollback. The replica is cut off after the
/// first advance (acknowledged by it, through the replica wait), and the
/// waiting store's advance then fails as a whole: never some places only.
#[test]
fn a_failover_to_a_lagging_replica_is_seen_as_a_rollback() {
    use idem_core::{EpochWatch, LossCause};
    let Some(mut cluster) = failover_cluster() else {
        return;
    };
    let prefix = prefix();
    let mut watch = EpochWatch::new();
    let (victim, place) = rt().block_on(async {
        let waiting = failover_store(&cluster, &prefix, true).await;
        let plain = failover_store(&cluster, &prefix, false).await;
        let marks = waiting.advance_epoch("first").await.unwrap();
        assert_eq!(marks.len(), 3, "{marks:?}");
        assert!(watch.observe(&marks).is_empty());
        let (key, master) = epoch_keys(&cluster, &plain, &marks).swap_remove(0);
        let place = marks[0].place.clone();
        let (_, replicas) = cluster.master_of(&key);
        shut_replica_out(&cluster, master, replicas[0]);

        let marks = plain.advance_epoch("second").await.unwrap();
        assert!(watch.observe(&marks).is_empty());
        let e = waiting
            .advance_epoch("third")
            .await
            .expect_err("a place no replica acknowledges");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
        (master, place)
    });
    fail_over(&mut cluster, victim);
    rt().block_on(async {
        let store = failover_store(&cluster, &prefix, false).await;
        let marks = store.advance_epoch("fourth").await.unwrap();
        assert_eq!(marks.len(), 3, "{marks:?}");
        assert!(
            marks.iter().any(|m| m.place == place),
            "{place} kept its name: {marks:?}"
        );
        let losses = watch.observe(&marks);
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].place, place);
        assert_eq!(losses[0].cause, LossCause::RolledBack { seen: 2, read: 2 });
        let _ = store.delete_all().await;
    });
}
