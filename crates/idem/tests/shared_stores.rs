//! Two `idem serve` processes sharing one store, readiness, and the demo.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;

use support::{executions, gateway, idem, upstream};

#[test]
#[ignore = "child process of the gateway tests; run by them"]
fn upstream_child() {
    support::upstream_child_main();
}

/// 64 concurrent requests with one key, split across two gateways that
/// share `store`: the upstream executes once. Returns the key.
async fn two_gateways_one_execution(store: &str, tag: &str) -> String {
    let (_up, up) = upstream();
    // Several serving threads each (with Redis, a connection each).
    let a = gateway(&up, store, &["--threads", "3"]).await;
    let b = gateway(&up, store, &["--threads", "2"]).await;
    let key = format!("shared-{tag}-{}-000000", std::process::id());
    let client = reqwest::Client::new();
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let url = format!("{}/orders", if i % 2 == 0 { &a.base } else { &b.base });
            let (client, key, barrier) = (client.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                client
                    .post(url)
                    .header("idempotency-key", key)
                    .body("{}")
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "{statuses:?}"
    );
    assert_eq!(
        executions(&up, &key).await,
        1,
        "one upstream execution across both gateways"
    );
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_postgres_execute_once() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    two_gateways_one_execution(&url, "pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_redis_execute_once() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_REDIS_URL", "Redis") else {
        return;
    };
    two_gateways_one_execution(&url, "redis").await;
}

/// The cluster test starts its own three masters on free ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_a_redis_cluster_execute_once() {
    let Some(cluster) = idem_testkit::redis_cluster::RedisCluster::start(3, 0) else {
        return;
    };
    let key = two_gateways_one_execution(&cluster.url(), "redis-cluster").await;
    // The operator commands read the same cluster.
    let url = cluster.url();
    let (code, out, err) = idem(&["records", "get", &key, "--store", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"completed\""), "{out}");
    for args in [
        ["records", "stale", "--store", &url],
        ["records", "purge", "--store", &url],
    ] {
        let (code, _, err) = idem(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_mysql_execute_once() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_MYSQL_URL", "MySQL") else {
        return;
    };
    two_gateways_one_execution(&url, "mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_goes_unready_when_the_store_stops() {
    use idem_testkit::private_redis::{PrivateRedis, free_port};
    let Some(redis) = PrivateRedis::start(free_port()) else {
        return;
    };
    redis.wait_ready();
    let (_up, up) = upstream();
    let g = gateway(&up, &redis.url(), &[]).await;
    assert_eq!(
        reqwest::get(format!("{}/readyz", g.admin))
            .await
            .unwrap()
            .status(),
        200
    );
    redis.kill();
    let r = reqwest::get(format!("{}/readyz", g.admin)).await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        reqwest::get(format!("{}/healthz", g.admin))
            .await
            .unwrap()
            .status(),
        200,
        "the process is still up"
    );
    // And requests fail closed.
    let resp = reqwest::Client::new()
        .post(format!("{}/orders", g.base))
        .header("idempotency-key", "store-down-key-000001")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(executions(&up, "store-down-key-000001").await, 0);
}

#[test]
fn the_demo_holds_its_invariants() {
    let (code, out, err) = idem(&["demo", "--intents", "300", "--clients", "8"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("all invariants hold"), "{out}");
    assert!(
        out.contains("replayed") && out.contains("latency p50 / p99"),
        "{out}"
    );
    assert!(
        err.contains("progress:") || err.contains("intents"),
        "progress is shown: {err}"
    );
}

/// The demo's ledger on MySQL or MariaDB, in a database of its own that
/// the demo drops afterwards.
#[test]
fn the_demo_holds_its_invariants_on_mysql() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_MYSQL_URL", "MySQL") else {
        return;
    };
    let (code, out, err) = idem(&[
        "demo",
        "--intents",
        "300",
        "--clients",
        "8",
        "--store",
        &url,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("all invariants hold"), "{out}");
}

#[test]
fn demo_flags_are_checked() {
    let (code, _, err) = idem(&["demo", "--drop-rate", "1.5"]);
    assert_eq!(code, 2);
    assert!(err.contains("--drop-rate"), "{err}");
}
