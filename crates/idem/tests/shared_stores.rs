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

/// 512 new keys (`prefix`-...) through the gateway at `base`, in waves
/// of 64 at once on connections spread over its threads, each executed.
async fn new_keys_in_waves(client: &reqwest::Client, base: &str, prefix: &str) {
    for wave in 0..8 {
        let requests: Vec<_> = (0..64)
            .map(|i| {
                client
                    .post(format!("{base}/orders"))
                    .header("idempotency-key", format!("{prefix}-{wave}-{i}-000000"))
                    .body("{}")
                    .send()
            })
            .collect();
        for r in futures_util::future::join_all(requests).await {
            assert_eq!(r.unwrap().status(), 201);
        }
    }
}

/// The PostgreSQL connections named `application` open now, by psql.
fn connections_named(url: &str, application: &str) -> u64 {
    let out = std::process::Command::new("psql")
        .args([
            url,
            "-Atc",
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{application}'"
            ),
        ])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// A gateway holds about one pool of PostgreSQL connections (16) whatever
/// its threads: with two, each thread's instance has half the pool and
/// the main one the smallest share (4); with 24, more than can share the
/// pool, one instance (an instance per thread would hold at least a
/// connection each). 512 new keys, 64 at a time, on connections spread
/// over the threads, before the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_holds_about_one_pool_of_postgres_connections() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let (_up, up) = upstream();
    let client = reqwest::Client::new();
    for (threads, most) in [("2", 8 + 8 + 4), ("24", 16)] {
        let application = format!("idem-pool-{}-{threads}", std::process::id());
        let separator = if url.contains('?') { '&' } else { '?' };
        let store = format!("{url}{separator}application_name={application}");
        let g = gateway(&up, &store, &["--threads", threads]).await;
        new_keys_in_waves(&client, &g.base, &application).await;
        let open = connections_named(&url, &application);
        assert!(
            open >= 1,
            "{threads} threads: the gateway's connections are named"
        );
        assert!(
            open <= most,
            "{threads} threads: {open} connections, more than {most}"
        );
    }
}

/// `sql` run by the `mariadb` client as the user, host and port of
/// `url` (`mysql://USER@HOST:PORT/DB`, no password), its rows as text.
fn mariadb(url: &str, sql: &str) -> String {
    let rest = url.strip_prefix("mysql://").expect("a mysql:// URL");
    let (user, rest) = rest.split_once('@').unwrap_or(("root", rest));
    let address = rest.split('/').next().unwrap_or(rest);
    let (host, port) = address.split_once(':').unwrap_or((address, "3306"));
    let out = std::process::Command::new("mariadb")
        .args(["-h", host, "-P", port, "-u", user, "-N", "-e", sql])
        .output()
        .expect("the mariadb client runs");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A gateway holds about one pool of MySQL connections (16) whatever its
/// threads, as with PostgreSQL: with two, each thread's instance has half
/// the pool and the main one the smallest share (4); with 24, one
/// instance. Counted in the server's process list by a user of the test's
/// own, after 512 new keys, each round with 64 in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_holds_about_one_pool_of_mysql_connections() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_MYSQL_URL", "MySQL") else {
        return;
    };
    let user = format!("idem_pool_{}", std::process::id());
    let create = format!(
        "CREATE USER IF NOT EXISTS '{user}'@'%'; CREATE USER IF NOT EXISTS '{user}'@'localhost'; \
         GRANT ALL PRIVILEGES ON *.* TO '{user}'@'%'; GRANT ALL PRIVILEGES ON *.* TO '{user}'@'localhost'"
    );
    mariadb(&url, &create);
    struct DropUser(String, String);
    impl Drop for DropUser {
        fn drop(&mut self) {
            let (url, user) = (&self.0, &self.1);
            let _ = std::panic::catch_unwind(|| {
                mariadb(
                    url,
                    &format!("DROP USER IF EXISTS '{user}'@'%', '{user}'@'localhost'"),
                )
            });
        }
    }
    let _drop_user = DropUser(url.clone(), user.clone());
    let rest = url
        .strip_prefix("mysql://")
        .and_then(|r| r.split_once('@').map(|(_, r)| r).or(Some(r)))
        .expect("a mysql:// URL");
    let store = format!("mysql://{user}@{rest}");
    let (_up, up) = upstream();
    // The test's URL migrates the database first, so that its procedures'
    // definer is that user, not this test's (dropped at the end; a
    // procedure whose definer is gone fails every claim).
    drop(gateway(&up, &url, &[]).await);
    let client = reqwest::Client::new();
    for (threads, most) in [("2", 8 + 8 + 4), ("24", 16)] {
        let g = gateway(&up, &store, &["--threads", threads]).await;
        new_keys_in_waves(&client, &g.base, &format!("{user}-{threads}")).await;
        let open: u64 = mariadb(
            &url,
            &format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = '{user}'"),
        )
        .parse()
        .unwrap();
        assert!(
            open >= 1,
            "{threads} threads: the gateway's connections are its user's"
        );
        assert!(
            open <= most,
            "{threads} threads: {open} connections, more than {most}"
        );
        drop(g);
    }
}

/// A PostgreSQL crash under a gateway whose serving threads each have
/// their own instance: while the server is down a keyed request fails
/// closed (503, nothing runs); once it is back (and the store watch has
/// checked it), every thread's pool recovers, and the retry of that key
/// runs once and then replays. The
/// server is the test's own (crashed with `pg_ctl -m immediate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_crash_fails_closed_on_every_thread_and_the_retry_runs_once() {
    use idem_testkit::private_postgres::PrivatePostgres;
    use idem_testkit::private_server::PrivateServer;
    let Some(mut server) = PrivatePostgres::start() else {
        return;
    };
    let (_up, up) = upstream();
    let g = gateway(&up, &server.url(), &["--threads", "2"]).await;
    // A client each: connections spread over both threads.
    let post = |key: String| {
        reqwest::Client::new()
            .post(format!("{}/orders", g.base))
            .header("idempotency-key", key)
            .body("{}")
            .send()
    };
    let keys: Vec<String> = (0..8)
        .map(|i| format!("pg-crash-{}-{i}-000000", std::process::id()))
        .collect();
    for k in &keys[..4] {
        assert_eq!(post(k.clone()).await.unwrap().status(), 201);
    }
    server.crash();
    for k in &keys[4..] {
        assert_eq!(post(k.clone()).await.unwrap().status(), 503, "fails closed");
        assert_eq!(executions(&up, k).await, 0, "nothing ran for {k}");
    }
    server.restart();
    // Each retry on a new connection. Until the gateway's store watch has
    // checked the restarted server (it checks every second), and while a
    // pooled connection the crash broke is replaced, retries are refused
    // (503) without running; then one runs. Bounded by a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for k in &keys[4..] {
        let mut statuses = Vec::new();
        loop {
            let status = post(k.clone()).await.unwrap().status().as_u16();
            statuses.push(status);
            if status == 201 || std::time::Instant::now() > deadline {
                break;
            }
            tokio::task::yield_now().await;
        }
        let tail = &statuses[statuses.len().saturating_sub(5)..];
        assert_eq!(
            statuses.last(),
            Some(&201),
            "{k}: {} tries, the last {tail:?}",
            statuses.len()
        );
        assert!(
            statuses.iter().all(|s| *s == 201 || *s == 503),
            "{k}: a try that was neither refused nor run"
        );
        assert_eq!(executions(&up, k).await, 1, "{k} ran once");
    }
    // Every key, from before the crash and after, replays its one answer.
    for k in &keys {
        let r = post(k.clone()).await.unwrap();
        assert_eq!(r.status(), 201, "{k}");
        assert_eq!(r.headers()["idempotent-replayed"], "true", "{k}");
        assert_eq!(executions(&up, k).await, 1, "{k}");
    }
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

/// A Redis without `appendonly` forgets records on a restart: `idem serve`
/// refuses it (exit 2, naming the setting and the flag) and starts with
/// `--accept-volatile-store`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_redis_without_appendonly_unless_accepted() {
    use idem_testkit::private_redis::{PrivateRedis, free_port};
    let Some(redis) = PrivateRedis::start(free_port()) else {
        return;
    };
    redis.wait_ready();
    let (_up, up) = upstream();
    let url = redis.url();
    let (code, _, err) = idem(&[
        "serve",
        "--upstream",
        &up,
        "--store",
        &url,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("appendonly = no"), "{err}");
    assert!(err.contains("--accept-volatile-store"), "{err}");
    // support::gateway passes --accept-volatile-store for Redis stores.
    let g = gateway(&up, &url, &[]).await;
    assert_eq!(
        reqwest::get(format!("{}/readyz", g.admin))
            .await
            .unwrap()
            .status(),
        200
    );
}

/// The epoch's counter in a Redis on `port` (`None` before the first
/// check wrote it), read with `redis-cli`.
fn epoch_counter(port: u16) -> Option<u64> {
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let keys = cli(&["--scan", "--pattern", "*epoch"]);
    let key = keys.lines().next()?;
    cli(&["HGET", key, "counter"]).trim().parse().ok()
}

/// A Redis without persistence restarted under traffic comes back empty:
/// the gateway's watch notices (the epoch was written again), new keys are
/// refused with 503 `store-lost-records` for the loss window and nothing is
/// forwarded meanwhile, the loss is counted by cause, and after the window
/// keys execute again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_is_noticed_and_new_claims_wait_out_the_window() {
    use idem_testkit::private_server::PrivateServer;
    use idem_testkit::restartable_redis::RestartableRedis;
    let Some(mut redis) = RestartableRedis::in_memory() else {
        return;
    };
    let port: u16 = redis.url().rsplit(':').next().unwrap().parse().unwrap();
    let (_up, up) = upstream();
    let g = gateway(&up, &redis.url(), &support::SHORT_LIVED).await;
    let c = reqwest::Client::new();
    let tag = std::process::id();
    let post = |k: &str| {
        c.post(format!("{}/orders", g.base))
            .header("idempotency-key", k.to_owned())
            .body("{}")
            .send()
    };
    let first = format!("before-the-loss-{tag}-0001");
    assert_eq!(post(&first).await.unwrap().status(), 201);
    // The watch has read the epoch at least once after writing it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while epoch_counter(port).is_none_or(|n| n < 2) {
        assert!(
            std::time::Instant::now() < deadline,
            "the epoch was never advanced"
        );
        tokio::task::yield_now().await;
    }

    redis.crash();
    redis.restart();

    let mut refused = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let key = format!("in-the-window-{tag}-{:04}", refused.len());
        let r = post(&key).await.unwrap();
        let status = r.status();
        let body = r.text().await.unwrap();
        if status == 201 {
            panic!("a claim ran before the loss was noticed: {key}");
        }
        assert_eq!(status, 503, "{body}");
        refused.push(key);
        if body.contains("store-lost-records") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never noticed: {body}"
        );
    }
    for key in &refused {
        assert_eq!(executions(&up, key).await, 0, "{key} was forwarded");
    }
    let scrape = support::metrics_text(&g).await;
    assert!(
        scrape.contains("idem_store_losses_total{cause=\"emptied\"} 1"),
        "{scrape}"
    );
    // After the window (the lease, 800 ms), keys execute again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for n in 0.. {
        let key = format!("after-the-window-{tag}-{n:04}");
        if post(&key).await.unwrap().status() == 201 {
            assert_eq!(executions(&up, &key).await, 1);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the window never closed"
        );
    }
}

/// The number that follows `label` at the start of a line of the demo's
/// report (`None` if no such line or no number there).
fn reported(out: &str, label: &str) -> Option<u64> {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// `idem demo --store-faults` with `extra` flags: the layer's store frozen
/// (at a quarter of the intents) and then closed and reopened (at 60%),
/// both on the drive's progress, so both fall inside the run; the
/// invariants hold as without the faults, and the store's epoch shows no
/// loss.
fn the_demo_through_store_faults(extra: &[&str]) {
    let mut args = vec![
        "demo",
        "--store-faults",
        "--intents",
        "300",
        "--clients",
        "8",
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = idem(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("all invariants hold"), "{out}");
    assert!(out.contains("\nstore faults:\n"), "{out}");
    for phase in ["freeze", "restart (closed, reopened)"] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(phase))
            .unwrap_or_else(|| panic!("no {phase} line: {out}"));
        assert!(line.contains(" s, from "), "{phase} did not happen: {out}");
    }
    let delayed = reported(&out, "calls delayed").unwrap_or_else(|| panic!("{out}"));
    assert!(delayed > 0, "the freeze delayed no call: {out}");
    let failed = reported(&out, "calls failed (unavailable)").unwrap_or_else(|| panic!("{out}"));
    assert!(failed > 0, "the restart failed no call: {out}");
    assert!(out.contains("no loss noticed"), "{out}");
    assert!(out.contains("[ ok ] store kept its records"), "{out}");
}

#[test]
fn the_demo_holds_its_invariants_through_store_faults() {
    the_demo_through_store_faults(&[]);
}

/// The same on PostgreSQL: the restart opens a new pool on the demo's
/// schema.
#[test]
fn the_demo_holds_its_invariants_through_store_faults_on_postgres() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    the_demo_through_store_faults(&["--store", &url]);
}

/// `--store-migration-lock-wait` reaches the PostgreSQL migration, with an
/// instance per serving thread (2 threads) and without (5): while a
/// session holds the records table (a transaction that read it), a start
/// whose migration needs the table's lock gives up after three waits of
/// the flag's length, and the next start, once the session ends,
/// migrates and serves. In a database of its own, dropped afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_migration_waits_for_a_lock_gives_up_after_the_flags_waits() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    let connect = |url: String| async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    };
    let admin = connect(url.clone()).await;
    let database = format!("idem_lock_wait_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let _dropped = DropDatabase {
        url: url.clone(),
        name: database.clone(),
    };
    let (head, _) = url.rsplit_once('/').unwrap();
    let store = format!("{head}/{database}");
    let (_up, up) = upstream();
    // The first start creates the schema.
    drop(gateway(&up, &store, &[]).await);
    for threads in ["2", "5"] {
        let session = connect(store.clone()).await;
        // Schema 6 again: its migration takes the table's lock.
        session
            .batch_execute("DELETE FROM idem.idem_migrations WHERE version = 6")
            .await
            .unwrap();
        session
            .batch_execute("BEGIN; SELECT count(*) FROM idem.idem_records;")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let args: Vec<String> = [
            "serve",
            "--upstream",
            &up,
            "--store",
            &store,
            "--threads",
            threads,
            "--store-migration-lock-wait",
            "200ms",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        let (code, _, err) = tokio::task::spawn_blocking(move || {
            idem(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .unwrap();
        assert_ne!(code, 0, "{threads} threads: {err}");
        assert!(
            err.contains("3 waits of 200 ms"),
            "{threads} threads: {err}"
        );
        // Three waits, and pauses of 100 and 200 ms.
        assert!(
            started.elapsed() >= std::time::Duration::from_millis(900),
            "{threads} threads: gave up after {:?}",
            started.elapsed()
        );
        let version: i32 = session
            .query_one("SELECT max(version) FROM idem.idem_migrations", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, 5, "nothing of migration 6 recorded");
        session.batch_execute("COMMIT").await.unwrap();
        let g = gateway(&up, &store, &["--threads", threads]).await;
        let version: i32 = session
            .query_one("SELECT max(version) FROM idem.idem_migrations", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, 6);
        drop(g);
    }
}

/// Drops a test's database when the test ends, passed or failed (by
/// `psql`, as a destructor cannot wait for the async client).
struct DropDatabase {
    url: String,
    name: String,
}

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .arg(&self.url)
            .arg("-qc")
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .status();
    }
}
