//! A reviewer's attacks on the Redis Cluster store, kept as regression
//! tests. Tests named `attack_` each reproduced a finding (they failed on
//! the first version and pass since its fix); tests named `held_` are
//! attacks that found nothing.

use std::time::Duration;

use idem_core::{
    Claim, Completion, Fence, Key, Operation, RecordId, Scope, Settled, StaleCursor, Store,
    StoreErrorKind,
};
use idem_testkit::redis_cluster::RedisCluster;
use idem_testkit::{request, response, t0};

use super::*;
use crate::cluster_tests::{
    PASSWORD, USER, connect, failover_cluster, failover_store, prefix, shut_replica_out,
};

fn cluster() -> Option<&'static RedisCluster> {
    crate::cluster_tests::shared()
}

fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

fn id(scope: &str, op: &str, key: &str) -> RecordId {
    RecordId::new(
        Scope::from_raw(scope),
        Operation::from_raw(op),
        Key::new(key).expect("key"),
    )
}

/// A hashed scope, as the gateway makes them (no brace in it).
fn gateway_scope() -> String {
    Scope::from_credential(format!("Bearer attacker-{}", prefix()).as_bytes())
        .as_str()
        .to_owned()
}

// ---------------------------------------------------------------------
// Finding 1: a client-chosen Idempotency-Key breaks purge_expired on a
// cluster for good. The SCAN pattern `PREFIX:{*}:r:*` lets `*` run over
// the bucket's `}`: a key holding `}:r:` makes the record's `(scope, key)`
// index (a zset) and its fence (a string) match too; purge groups them by
// bucket (no id_of check) and purge.lua's HGET fails with WRONGTYPE, which
// aborted every purge while those keys lived. Fixed: purge takes only keys
// that `id_of` rebuilds exactly.
// ---------------------------------------------------------------------

#[test]
fn attack_a_client_key_holding_brace_r_breaks_purge_on_a_cluster() {
    let Some(cluster) = cluster() else { return };
    rt().block_on(async {
        let store = connect(&cluster.url(), &prefix()).await;
        // An ordinary expired record that purge should remove.
        let victim = id(&gateway_scope(), "POST /pay", "ordinary-key-0000001");
        let Claim::Acquired(l) = store.claim(&request(&victim, "{}", t0())).await.unwrap() else {
            panic!("victim not acquired")
        };
        let settled = store
            .complete(
                &victim,
                l.fence,
                Completion::completed(response(201, "v")),
                t0(),
            )
            .await
            .unwrap();
        assert_eq!(settled, Settled::Applied);

        // A client sends Idempotency-Key: aaaaaaaaaaaaaaaa}:r:x (printable
        // ASCII, 21 characters: a valid key).
        let hostile = id(&gateway_scope(), "POST /pay", "aaaaaaaaaaaaaaaa}:r:x");
        let claim = store.claim(&request(&hostile, "{}", t0())).await.unwrap();
        assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");

        let later = t0() + Duration::from_secs(7200);
        let purged = store.purge_expired(later, 1000).await;
        let _ = store.delete_all().await;
        // Correct: both expired records purged (2). Observed: Err(WRONGTYPE).
        assert_eq!(purged.expect("purge must not fail on a client's key"), 2);
    });
}

/// The same on one server holds (the pattern has no wildcard before
/// `:r:`): the regression is the cluster's.
#[test]
fn held_single_node_purge_ignores_the_same_key() {
    let Ok(url) = std::env::var("IDEM_TEST_REDIS_URL") else {
        return;
    };
    rt().block_on(async {
        let store = connect(&url, &prefix()).await;
        let hostile = id(&gateway_scope(), "POST /pay", "aaaaaaaaaaaaaaaa}:r:x");
        store.claim(&request(&hostile, "{}", t0())).await.unwrap();
        let later = t0() + Duration::from_secs(7200);
        let purged = store.purge_expired(later, 1000).await;
        let _ = store.delete_all().await;
        assert_eq!(purged.expect("single-node purge"), 1);
    });
}

/// Finding 1b (nit): a stray key under the prefix whose "bucket" parses
/// as a u16 but is not canonical (`{+5}`, `{05}`) is grouped with bucket
/// 5's index though it lives in another slot: CROSSSLOT, purge failed.
/// Fixed as finding 1.
#[test]
fn attack_a_non_canonical_bucket_key_breaks_purge_with_crossslot() {
    let Some(cluster) = cluster() else { return };
    rt().block_on(async {
        let p = prefix();
        let store = connect(&cluster.url(), &p).await;
        let mut conn = store.conn.get();
        let stray = format!("{p}:{{+5}}:r:1:a:1:b:c");
        let _: i64 = redis::cmd("HSET")
            .arg(&stray)
            .arg("ea")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let purged = store.purge_expired(t0(), 1000).await;
        let _ = store.delete_all().await;
        // Correct: the stray key is not one of ours and is ignored.
        assert!(purged.is_ok(), "{purged:?}");
    });
}

// ---------------------------------------------------------------------
// Finding 2: WAIT answered by a fresh connection. The cluster client
// retries a command whose connection dropped on a new connection; Redis
// counts WAIT per connection (the offset of *its* last write), so the
// retried WAIT on a connection that wrote nothing returns at once with
// every connected replica, whatever they acknowledged. The store then
// answered Acquired for a claim no replica had. Fixed: the script and the
// WAIT each go in a pipeline with the connection's identity (CLIENT ID and
// the server's run_id); when they differ, nothing counts as acknowledged.
// (CLIENT ID alone was not enough: the driver sent the retried WAIT to
// another node, where another connection had the same id.)
// ---------------------------------------------------------------------

#[test]
fn attack_wait_for_replicas_is_satisfied_by_a_reconnected_connection() {
    let Some(cluster) = failover_cluster() else {
        return;
    };
    rt().block_on(async {
        let store = failover_store(&cluster, &prefix(), true).await;
        let scope = gateway_scope();
        let control = id(&scope, "POST /control", "wait-attack-key-0001");
        let target = id(&scope, "POST /target", "wait-attack-key-0001");
        let (master, replicas) = cluster.master_of(&store.record_key(&target));
        assert_eq!(cluster.master_of(&store.record_key(&control)).0, master);
        let replica = replicas[0];

        // The replica stays connected but acknowledges nothing.
        cluster.signal(replica, "STOP");

        // Control: without a drop, the claim fails closed as documented.
        let e = store
            .claim(&request(&control, "{}", t0()))
            .await
            .expect_err("no replica acknowledges the control claim");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");

        // Attack: drop the store's connections to the master while its
        // WAIT blocks; the client retries WAIT on a new connection.
        let killer = {
            let port = master;
            let cli = move || {
                std::thread::sleep(Duration::from_millis(500));
                std::process::Command::new("redis-cli")
                    .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                    .args(["--user", USER, "--pass", PASSWORD])
                    .args(["CLIENT", "KILL", "TYPE", "normal"])
                    .output()
                    .expect("redis-cli")
            };
            std::thread::spawn(cli)
        };
        let started = std::time::Instant::now();
        let claim = store.claim(&request(&target, "{}", t0())).await;
        let took = started.elapsed();
        let killed = killer.join().unwrap();
        let info = cluster.cli(
            master,
            &["--user", USER, "--pass", PASSWORD, "INFO", "replication"],
        );
        cluster.signal(replica, "CONT");
        eprintln!(
            "kill: {} | claim after {took:?}: {claim:?}\n{info}",
            String::from_utf8_lossy(&killed.stdout).trim()
        );
        // The replica (stopped the whole time) never acknowledged the
        // claim, so the store may not answer Acquired: it fails closed
        // (Unavailable), or, when the driver sent the claim and its WAIT
        // again on a new connection, the repeat finds its own lease (in
        // flight, 409).
        match claim {
            Err(e) => assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}"),
            Ok(c) => assert!(
                matches!(c, Claim::InFlight { .. }),
                "the store answered a claim no replica acknowledged: {c:?}"
            ),
        }
    });
}

/// Finding 3: a completion that WAIT refused, retried as idem-http's
/// `flow::complete` retries it (same fence), answered `StaleFence`, which
/// the flow treats as final (`Outcome::Executed`: the response leaves),
/// though no replica had the completion. Fixed: a repeated completion by
/// its own fence writes again and waits, so it fails closed as well.
#[test]
fn attack_retried_completion_after_a_refused_wait_is_lost_in_a_failover() {
    let Some(mut cluster) = failover_cluster() else {
        return;
    };
    let url = cluster.url_as(&format!("{USER}:{PASSWORD}@"));
    let p = prefix();
    let target = id(&gateway_scope(), "POST /pay", "completion-lost-0001");
    let master = rt().block_on(async {
        let store = failover_store(&cluster, &p, true).await;
        let Claim::Acquired(lease) = store.claim(&request(&target, "{}", t0())).await.unwrap()
        else {
            panic!("not acquired")
        };
        let (master, replicas) = cluster.master_of(&store.record_key(&target));
        // The replica falls behind (shut out).
        shut_replica_out(&cluster, master, replicas[0]);
        let done = Completion::completed(response(201, "first execution"));
        let e = store
            .complete(&target, lease.fence, done.clone(), t0())
            .await
            .expect_err("WAIT refuses: fail closed");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
        // idem-http's flow::complete retries with the same fence: the
        // repeat may not answer as if it were settled while no replica
        // has the completion.
        let retried = store.complete(&target, lease.fence, done, t0()).await;
        let e = retried.expect_err("the repeated completion fails closed too");
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
        master
    });
    cluster.kill(master);
    cluster.wait_ready(idem_testkit::redis_cluster::SETTLE_LIMIT);
    rt().block_on(async {
        // The promoted replica has no replica of its own now: read and
        // retry without WAIT (the cluster's state, not the client's).
        let store = connect(&url, &p).await;
        let record = store.get(&target, t0()).await.unwrap();
        eprintln!("after failover: {record:?}");
        let later = t0() + Duration::from_secs(60);
        let again = store.claim(&request(&target, "{}", later)).await.unwrap();
        let _ = store.delete_all().await;
        // No client was told the key was settled, so a takeover after
        // the lease (a second execution) breaks no promise; a replay
        // would mean the completion survived. Both are the contract.
        assert!(
            matches!(again, Claim::Replay(_) | Claim::Acquired(_)),
            "{again:?}"
        );
    });
}

// ---------------------------------------------------------------------
// Attacks that held up.
// ---------------------------------------------------------------------

/// Braces, colons and `r:` in scope, operation and key: every operation
/// works (no CROSSSLOT), `id_of` gives back the same id, and records of
/// look-alike ids stay apart.
#[test]
fn held_braces_and_colons_in_ids_stay_in_one_slot_and_apart() {
    let Some(cluster) = cluster() else { return };
    rt().block_on(async {
        let store = connect(&cluster.url(), &prefix()).await;
        let ids = [
            id("}{x}", "{op}", "{k}}:r:1:a"),
            id("a}", "}:r:", "{0}"),
            id("a", "}:r:x", "{"),
            id("a:1:b", "c", "d"),
            id("a", "1:b:1:c", "d"),
            id("{}", "{}", "{}"),
            id("", "", "}"),
        ];
        let keys = &store.keys;
        for (i, x) in ids.iter().enumerate() {
            let rk = keys.record(x);
            assert_eq!(keys.id_of(&rk).as_ref(), Some(x), "{rk}");
            let slot = |k: &str| cluster.cli(cluster.ports()[0], &["CLUSTER", "KEYSLOT", k]);
            for other in [
                keys.fence(x),
                keys.key_index(&x.scope, &x.key),
                keys.in_progress(&x.scope, &x.key),
            ] {
                assert_eq!(slot(&other), slot(&rk), "{other} vs {rk}");
            }
            let Claim::Acquired(l) = store
                .claim(&request(x, &format!("{{\"i\":{i}}}"), t0()))
                .await
                .unwrap()
            else {
                panic!("{x:?} not acquired")
            };
            let stale = store
                .list_stale(t0() + Duration::from_secs(60), None, 100)
                .await
                .unwrap();
            assert!(stale.iter().any(|r| &r.id == x), "{x:?} listed stale");
            let _: Settled = store
                .complete(
                    x,
                    l.fence,
                    Completion::completed(response(201, &format!("r{i}"))),
                    t0(),
                )
                .await
                .unwrap();
        }
        for (i, x) in ids.iter().enumerate() {
            let got = store.get(x, t0()).await.unwrap().expect("record");
            assert_eq!(got.response, Some(response(201, &format!("r{i}"))));
            let found = store.find_by_key(&x.scope, &x.key, t0(), 10).await.unwrap();
            assert!(
                found
                    .iter()
                    .all(|r| r.id.scope == x.scope && r.id.key == x.key)
            );
            assert!(found.iter().any(|r| &r.id == x));
            // Replay for the same parameters only.
            let again = store
                .claim(&request(x, &format!("{{\"i\":{i}}}"), t0()))
                .await
                .unwrap();
            assert!(matches!(again, Claim::Replay(_)), "{again:?}");
        }
        let _ = store.delete_all().await;
    });
}

/// The fence counter deleted while the record is in progress: the
/// takeover's fence still exceeds the old one (the record's own fence is
/// a floor), and the old executor is refused.
#[test]
fn held_takeover_after_fence_key_deleted() {
    let Some(cluster) = cluster() else { return };
    rt().block_on(async {
        let a = connect(&cluster.url(), &prefix()).await;
        let x = id(&gateway_scope(), "POST /t", "takeover-key-000001");
        let Claim::Acquired(first) = a.claim(&request(&x, "{}", t0())).await.unwrap() else {
            panic!()
        };
        let mut conn = a.conn.get();
        // Push the record's fence far ahead of the clock, then lose the
        // counter: only the record's own fence keeps the next one above.
        let big = first.fence.get() + 10_000_000_000;
        let _: i64 = redis::cmd("HSET")
            .arg(a.keys.record(&x))
            .arg("fence")
            .arg(big)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(a.keys.fence(&x))
            .query_async(&mut conn)
            .await
            .unwrap();
        let later = t0() + Duration::from_secs(120);
        let Claim::Acquired(second) = a.claim(&request(&x, "{}", later)).await.unwrap() else {
            panic!("takeover")
        };
        assert!(second.takeover);
        assert!(second.fence.get() > big, "{second:?} vs {big}");
        let stale = a
            .complete(
                &x,
                Fence::new(big),
                Completion::completed(response(200, "old")),
                later,
            )
            .await
            .unwrap();
        assert_eq!(stale, Settled::StaleFence);
        // Release and re-claim: above again.
        assert_eq!(
            a.release(&x, second.fence, later).await.unwrap(),
            Settled::Applied
        );
        let Claim::Acquired(third) = a.claim(&request(&x, "{}", later)).await.unwrap() else {
            panic!()
        };
        assert!(third.fence.get() > second.fence.get());
        let _ = a.delete_all().await;
    });
}

/// list_stale over 1024 buckets: records with one lease end, spread over
/// many buckets, paged 3 at a time: each exactly once.
#[test]
fn held_list_stale_pages_across_buckets_without_skips_or_repeats() {
    let Some(cluster) = cluster() else { return };
    rt().block_on(async {
        let store = connect(&cluster.url(), &prefix()).await;
        let scope = gateway_scope();
        let mut want = std::collections::BTreeSet::new();
        for i in 0..40 {
            let x = id(&scope, "POST /s", &format!("stale-key-{i:08}"));
            store.claim(&request(&x, "{}", t0())).await.unwrap();
            want.insert(store.keys.record(&x));
        }
        // A second lease end for a few, to mix scores.
        for i in 0..10 {
            let x = id(&scope, "POST /s2", &format!("stale-key-{i:08}"));
            store
                .claim(&request(&x, "{}", t0() + Duration::from_millis(7)))
                .await
                .unwrap();
            want.insert(store.keys.record(&x));
        }
        let now = t0() + Duration::from_secs(120);
        let mut seen = Vec::new();
        let mut cursor: Option<StaleCursor> = None;
        loop {
            let page = store.list_stale(now, cursor.as_ref(), 3).await.unwrap();
            if page.is_empty() {
                break;
            }
            cursor = Some(StaleCursor::after(page.last().unwrap()));
            seen.extend(page.iter().map(|r| store.keys.record(&r.id)));
        }
        let _ = store.delete_all().await;
        let unique: std::collections::BTreeSet<_> = seen.iter().cloned().collect();
        assert_eq!(unique.len(), seen.len(), "repeats");
        assert_eq!(unique, want);
    });
}

/// URLs: no password in any message; no way to switch TLS checks off on
/// a cluster; odd forms refused.
#[test]
fn held_cluster_urls_neither_leak_nor_weaken_tls() {
    for url in [
        "rediss-cluster://u:s3cret@h1:7000#insecure",
        "rediss-cluster://u:s3cret@h1:7000/#insecure",
        "rediss-cluster://u:s3cret@h1:7000?wait_replicas=1#insecure",
        "rediss-cluster://u:s3cret@h1:7000?x=1#insecure",
        "rediss-cluster://u:s3cret@h1:7000,h2:7000#insecure",
        "rediss-cluster://u:s3cret#insecure@h1:7000",
        "rediss-cluster://u:s3cret@h1:7000/%23insecure",
        "rediss://u:s3cret@h1:7000?wait_replicas=1&x=1#insecure",
        "rediss://u:s3cret@h1:7000#insecure?wait_replicas=1",
        "rediss://u:s3cret@h1:7000/?wait_replicas=1#insecure",
        "redis-cluster://u:s3cret@h1:7000?wait_replicas=s3cret",
        "redis-cluster://u:s3cret@h1:7000?wait_timeout_ms=s3cret&wait_replicas=1",
        "redis-cluster://u:s3cret@h1:s3cret",
        "redis-cluster://u:s3cret@s3cret",
        "redis-cluster://u:s3cret@h1:7000/s3cret",
        "redis-cluster://u:s3cret@h1:7000,s3cret",
        "redis-cluster://u:s3cret@[::1:7000",
        "redis-cluster://u:s3c?ret@h1:7000",
        "redis-cluster://u:s3cret@h1:7000?protocol=resp3",
        "redis-cluster://u:s3cret@0.0.0.0:7000",
    ] {
        let checked = RedisStore::builder(url).check();
        let e = checked.expect_err(url);
        let shown = format!(
            "{e} {e:?} {:?}",
            std::error::Error::source(&e).map(|s| s.to_string())
        );
        assert_eq!(e.kind(), StoreErrorKind::Setup, "{url}");
        assert!(!shown.contains("s3cret"), "{url}: {shown}");
    }
}

/// Single-server key layout is unchanged (old records found).
#[test]
fn held_single_layout_keys_are_those_of_before() {
    let keys = crate::scripts::Keys::new("idem".into(), crate::scripts::Layout::Single);
    let x = id("s:1", "POST /a", "k}");
    assert_eq!(keys.record(&x), "idem:r:3:s:1:7:POST /a:k}");
    assert_eq!(keys.fence(&x), "idem:fence");
    assert_eq!(keys.in_progress(&x.scope, &x.key), "idem:in-progress");
    assert_eq!(keys.key_index(&x.scope, &x.key), "idem:k:3:s:1:k}");
    assert_eq!(keys.every_record(), "idem:r:*");
    assert_eq!(keys.id_of("idem:r:3:s:1:7:POST /a:k}"), Some(x));
}
