//! `idem serve` end to end: a real gateway process in front of a real
//! upstream process that counts executions per key.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::time::Duration;

use reqwest::StatusCode;
use support::{executions, exit_code, gateway, idem, upstream};

/// The child half: serves the counting upstream until killed.
#[test]
#[ignore = "child process of the gateway tests; run by them"]
fn upstream_child() {
    support::upstream_child_main();
}

/// Where `idem_with_credential` puts the credential.
enum Credential<'a> {
    Env(&'a str),
    Stdin(&'a str),
}

/// Runs `idem` with a credential in `IDEM_CREDENTIAL` or on standard
/// input; returns (exit code, stdout, stderr).
fn idem_with_credential(args: &[&str], credential: Credential<'_>) -> (i32, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args(args)
        .env_remove("IDEM_CONFIG")
        .env_remove("IDEM_CREDENTIAL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = match credential {
        Credential::Env(value) => {
            cmd.env("IDEM_CREDENTIAL", value);
            ""
        }
        Credential::Stdin(text) => text,
    };
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn key(tag: &str) -> String {
    format!("gw-{tag}-{}-0000000", std::process::id())
}

async fn problem(r: reqwest::Response, status: u16, kind: &str) {
    assert_eq!(r.status().as_u16(), status);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["type"], format!("urn:idem:problem:{kind}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_table_through_the_gateway() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &["--max-body", "1KiB"]).await;
    let c = reqwest::Client::new();
    let post = |path: &str, k: &str, body: &str| {
        c.post(format!("{}{path}", g.base))
            .header("idempotency-key", k)
            .header("content-type", "application/json")
            .body(body.to_owned())
    };

    // Missing, malformed and repeated keys: 400, nothing forwarded.
    problem(
        c.post(format!("{}/orders", g.base)).send().await.unwrap(),
        400,
        "missing-key",
    )
    .await;
    problem(
        post("/orders", "short", "{}").send().await.unwrap(),
        400,
        "invalid-key",
    )
    .await;
    problem(
        post("/orders", &key("rep"), "{}")
            .header("idempotency-key", key("rep2"))
            .send()
            .await
            .unwrap(),
        400,
        "repeated-key",
    )
    .await;
    assert_eq!(executions(&up, "short").await, 0);

    // Executed once, then replayed without reaching the upstream.
    let k = key("replay");
    let first = post("/orders", &k, r#"{"a":1,"b":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().contains_key("idempotency-key-expires"));
    let first_body = first.text().await.unwrap();
    let again = post("/orders", &k, r#"{"b":2, "a":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], "/orders/1");
    assert!(again.headers().get("set-cookie").is_none());
    assert_eq!(again.text().await.unwrap(), first_body);
    assert_eq!(
        executions(&up, &k).await,
        1,
        "replays do not reach the upstream"
    );

    // Mismatch: 422, not forwarded.
    problem(
        post("/orders", &k, r#"{"a":9}"#).send().await.unwrap(),
        422,
        "key-reused",
    )
    .await;
    assert_eq!(executions(&up, &k).await, 1);

    // Another tenant with the same key reaches the upstream.
    let other = post("/orders", &k, r#"{"a":1,"b":2}"#)
        .header("authorization", "Bearer other-tenant")
        .send()
        .await
        .unwrap();
    assert!(other.headers().get("idempotent-replayed").is_none());
    assert_eq!(executions(&up, &k).await, 2);

    // A body over the limit: 413.
    problem(
        post("/orders", &key("big"), &"x".repeat(4096))
            .send()
            .await
            .unwrap(),
        413,
        "body-too-large",
    )
    .await;

    // Upstream 503 releases the key (the retry is forwarded again); 404 is
    // kept and replayed.
    for (status, forwarded) in [(503u16, 2u64), (404, 1)] {
        let k = key(&format!("s{status}"));
        for _ in 0..2 {
            let r = post(&format!("/status/{status}"), &k, "{}")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), status);
        }
        assert_eq!(executions(&up, &k).await, forwarded, "status {status}");
    }

    // In flight: 409 with Retry-After.
    let ks = key("inflight");
    let slow = tokio::spawn(post("/slow", &ks, "{}").send());
    // The first is in the upstream once it counted itself.
    while executions(&up, &ks).await == 0 {
        tokio::task::yield_now().await;
    }
    let dup = post("/slow", &ks, "{}").send().await.unwrap();
    assert_eq!(dup.headers()["retry-after"], "1");
    problem(dup, 409, "in-flight").await;
    reqwest::get(format!("{up}/release")).await.unwrap();
    assert_eq!(slow.await.unwrap().unwrap().status(), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_rewrites_hop_by_hop_and_forwards_the_key() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &[]).await;
    let k = key("echo");
    let r = reqwest::Client::new()
        .post(format!("{}/echo", g.base))
        .header("idempotency-key", &k)
        .header("connection", "keep-alive, x-private")
        .header("x-private", "hop")
        .header("x-forwarded-for", "10.1.2.3")
        .body("{}")
        .send()
        .await
        .unwrap();
    let seen: serde_json::Value = r.json().await.unwrap();
    assert_eq!(seen["idempotency-key"], k.as_str());
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "a client's own forwarding headers are replaced"
    );
    assert!(
        seen["forwarded"]
            .as_str()
            .unwrap()
            .starts_with("for=127.0.0.1;proto=http")
    );
    assert!(
        seen.get("x-private").is_none(),
        "headers named in Connection are dropped"
    );
    assert_eq!(seen["host"], up.trim_start_matches("http://"));
}

/// The read path is `/_idem/records/{key}`, and everything under its
/// prefix is the gateway's: a path with more or fewer segments there (a
/// key's raw `/`) is refused with 400, never forwarded to the upstream
/// with the caller's credential; the prefix without its slash is an
/// ordinary path. The read path answers only GET and HEAD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_segment_under_the_read_path_is_a_record_read() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &[]).await;
    let c = reqwest::Client::new();
    for (path, gateways) in [
        ("/_idem/records/", true),
        ("/_idem/records", false),
        ("/_idem/records/a/b", true),
        ("/_idem/records/key-0001/", true),
    ] {
        let r = c
            .get(format!("{}{path}", g.base))
            .header("authorization", "Bearer reader")
            .send()
            .await
            .unwrap();
        let kind = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let by_gateway = kind.as_deref().unwrap_or("").contains("problem");
        assert_eq!(by_gateway, gateways, "{path}: {kind:?}");
        let expected = if gateways {
            StatusCode::BAD_REQUEST
        } else {
            // The upstream's own 404.
            StatusCode::NOT_FOUND
        };
        assert_eq!(r.status(), expected, "{path}");
    }
    // One segment: the gateway's read path (no such record).
    let r = c
        .get(format!("{}/_idem/records/key-0001-absent", g.base))
        .header("authorization", "Bearer reader")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("problem")
    );
    let r = c
        .post(format!("{}/_idem/records/key-0001-absent", g.base))
        .header("authorization", "Bearer reader")
        .header("idempotency-key", "key-0001-not-a-mutation")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers()["allow"], "GET, HEAD");
    let r = c
        .head(format!("{}/_idem/records/key-0001-absent", g.base))
        .header("authorization", "Bearer reader")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciliation_read_path_and_records_cli() {
    let (_up, up) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("gw.db").display());
    let g = gateway(&up, &store, &[]).await;
    let c = reqwest::Client::new();
    let k = key("read");
    c.post(format!("{}/orders", g.base))
        .header("idempotency-key", &k)
        .header("authorization", "Bearer reader")
        .body("{}")
        .send()
        .await
        .unwrap();
    let url = format!("{}/_idem/records/{k}?method=POST&path=/orders", g.base);
    let mine = c
        .get(&url)
        .header("authorization", "Bearer reader")
        .send()
        .await
        .unwrap();
    assert_eq!(mine.status(), 200);
    let view: serde_json::Value = mine.json().await.unwrap();
    assert_eq!(view["status"], "completed");
    assert_eq!(view["response"]["status"], 201);
    let theirs = c
        .get(&url)
        .header("authorization", "Bearer someone-else")
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 404, "another credential cannot read it");
    let by_key = c
        .get(format!("{}/_idem/records/{k}", g.base))
        .header("authorization", "Bearer reader")
        .send()
        .await
        .unwrap();
    assert_eq!(
        by_key.status(),
        200,
        "the key and the credential are enough"
    );
    let view: serde_json::Value = by_key.json().await.unwrap();
    assert_eq!(view["operation"], "POST /orders");
    let anonymous = c
        .get(format!("{}/_idem/records/{k}", g.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401, "no credential, no reads");

    drop(g); // SQLite: one writer at a time
    // The credential comes from the environment or standard input, never
    // from the arguments.
    let (code, out, err) = idem_with_credential(
        &["records", "get", &k, "--store", &store, "--path", "/orders"],
        Credential::Env("Bearer reader"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"completed\""), "{out}");
    // A method typed in lower case names the POST a client sent.
    let (code, out, err) = idem_with_credential(
        &[
            "records", "get", &k, "--store", &store, "--path", "/orders", "--method", "post",
        ],
        Credential::Env("Bearer reader"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"POST /orders\""), "{out}");
    // The key and the credential are enough for the CLI too.
    let (code, out, err) = idem_with_credential(
        &[
            "records",
            "get",
            &k,
            "--store",
            &store,
            "--credential-stdin",
        ],
        Credential::Stdin("Bearer reader\n"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"POST /orders\""), "{out}");
    let (code, _, err) = idem(&["records", "get", &k, "--store", &store, "--path", "/orders"]);
    assert_eq!(code, 3, "not found: {err}");
    assert!(err.contains("no live record"), "{err}");
    let (code, out, err) = idem(&["records", "purge", "--store", &store]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("purged 0"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_times_out_retries_into_409_then_the_stored_answer() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &[]).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let k = key("timeout");
    let send = || {
        impatient
            .post(format!("{}/slow", g.base))
            .header("idempotency-key", &k)
            .body("{}")
            .send()
    };
    assert!(send().await.unwrap_err().is_timeout());
    let r = send().await.unwrap();
    assert_eq!(r.status(), 409, "still running upstream");
    reqwest::get(format!("{up}/release")).await.unwrap();
    // The gateway finishes the forwarded request although its client left.
    let mut answer = None;
    for _ in 0..200 {
        let r = send().await.unwrap();
        if r.status() != 409 {
            answer = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let r = answer.expect("the stored answer");
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(r.text().await.unwrap(), "slow done");
    assert_eq!(executions(&up, &k).await, 1);
}

/// Every serving thread's connections are drained at SIGTERM, and the
/// executions they run finish before the threads end: eight requests on
/// eight connections over four threads, all in flight when the signal
/// comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_on_every_thread_and_exits_zero() {
    sigterm_drains_every_thread("memory:", "mem").await;
}

/// The same on PostgreSQL, whose instance per serving thread runs its
/// batches on that thread's runtime: every completion is stored before
/// the runtimes end (the records read back completed afterwards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_thread_and_stores_every_completion_on_postgres() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    sigterm_drains_every_thread_and_stores_every_completion(&url, "pg").await;
}

/// The same on MySQL, whose instance per serving thread (with a share of
/// the pool) runs its batches on that thread's runtime too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_thread_and_stores_every_completion_on_mysql() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_MYSQL_URL", "MySQL") else {
        return;
    };
    sigterm_drains_every_thread_and_stores_every_completion(&url, "my").await;
}

/// [`sigterm_drains_every_thread`] on the store at `url`, and then every
/// key's record read back completed.
async fn sigterm_drains_every_thread_and_stores_every_completion(url: &str, tag: &str) {
    let keys = sigterm_drains_every_thread(url, tag).await;
    for k in &keys {
        let (code, out, err) = idem(&["records", "get", k, "--store", url]);
        assert_eq!(code, 0, "{k}: {err}");
        assert!(out.contains("\"completed\""), "{k}: {out}");
    }
}

/// Eight keyed requests in flight on four serving threads when SIGTERM
/// comes: each answers 201 and the gateway exits 0. Returns the keys.
async fn sigterm_drains_every_thread(store: &str, tag: &str) -> Vec<String> {
    let (_up, up) = upstream();
    let g = gateway(&up, store, &["--shutdown-grace", "20s", "--threads", "4"]).await;
    let serving = std::fs::read_dir(format!("/proc/{}/task", g.proc.child.id()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|name| name.starts_with("idem-serve-"))
        .count();
    assert_eq!(serving, 4, "one thread per --threads");
    let keys: Vec<String> = (0..8).map(|i| key(&format!("drain-{tag}-{i}"))).collect();
    let running: Vec<_> = keys
        .iter()
        .map(|k| {
            // A client each: a connection each.
            tokio::spawn(
                reqwest::Client::new()
                    .post(format!("{}/slow", g.base))
                    .header("idempotency-key", k)
                    .body("{}")
                    .send(),
            )
        })
        .collect();
    for k in &keys {
        while executions(&up, k).await == 0 {
            tokio::task::yield_now().await;
        }
    }
    g.proc.terminate();
    // The signal has arrived once no thread accepts any more.
    listener_closes(&g.base).await;
    for _ in &keys {
        reqwest::get(format!("{up}/release")).await.unwrap();
    }
    for r in running {
        assert_eq!(
            r.await.unwrap().unwrap().status(),
            201,
            "the in-flight request finished"
        );
    }
    assert_eq!(exit_code(g).await, Some(0));
    keys
}

/// The serving threads' open connections, from the admin listener's
/// `idem_gateway_connections{thread}`, by thread.
async fn connections_by_thread(g: &support::Gateway) -> Vec<u64> {
    let text = support::metrics_text(g).await;
    let mut by_thread: Vec<(usize, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("idem_gateway_connections{thread=\""))
        .map(|rest| {
            let (thread, value) = rest.split_once("\"} ").unwrap();
            (thread.parse().unwrap(), value.parse().unwrap())
        })
        .collect();
    by_thread.sort_unstable();
    by_thread.into_iter().map(|(_, n)| n).collect()
}

/// A burst of connections opened at once: every one is counted on one
/// thread's `idem_gateway_connections` (no thread more than two above
/// another), served there, and counted off when it closes. That a thread
/// which accepts them all hands them on is `spread.rs`'s unit test: here
/// the kernel may already have spread them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_counted_by_serving_thread() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &["--threads", "4"]).await;
    let addr = g.base.trim_start_matches("http://").to_owned();
    let connects = (0..16).map(|_| tokio::net::TcpStream::connect(addr.as_str()));
    let streams: Vec<_> = futures_util::future::join_all(connects)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // Counted once accepted and placed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let open = loop {
        let open = connections_by_thread(&g).await;
        if open.iter().sum::<u64>() == 16 {
            break open;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not all accepted: {open:?}"
        );
        // Polled, not waited on: the gauge changes when a thread acts.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(open.len(), 4, "a gauge per thread: {open:?}");
    let (most, fewest) = (open.iter().max().unwrap(), open.iter().min().unwrap());
    assert!(most - fewest <= 2, "connections spread: {open:?}");
    // And served where they were placed.
    let mut streams = streams;
    for s in &mut streams {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /count/spread HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
    }
    drop(streams);
    // Each closed connection's task ends once the gateway reads its end.
    while connections_by_thread(&g).await.iter().sum::<u64>() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "connections counted as open after they closed"
        );
        // Polled, not waited on: the gauge changes when a thread acts.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A keyed request whose body was still being read at SIGTERM starts its
/// execution after the layer's first wait for executions began; its
/// client then hangs up while the upstream works, so its connection is
/// closed and its thread drained. The gateway still waits for that execution before its threads
/// end (they run it): the record is completed, and a retry on the next
/// gateway replays it instead of meeting a claim left in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_that_starts_during_shutdown_is_finished() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_up, up) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("late.db").display());
    let log = tempfile::NamedTempFile::new().unwrap();
    let g = support::gateway_logging_to(
        &up,
        &store,
        &["--shutdown-grace", "20s"],
        log.reopen().unwrap().into(),
    )
    .await;
    let k = key("late");
    let mut conn = tokio::net::TcpStream::connect(support::addr(&g.base))
        .await
        .unwrap();
    let head = format!(
        "POST /slow HTTP/1.1\r\nhost: x\r\nidempotency-key: {k}\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // 100 Continue: the layer is reading the body.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("100 Continue") {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("100 Continue within 10 s")
            .unwrap();
        assert!(n > 0, "closed before 100 Continue");
        seen.extend_from_slice(&buf[..n]);
    }
    g.proc.terminate();
    listener_closes(&g.base).await;
    // The body: the claim, then the execution.
    conn.write_all(b"{}").await.unwrap();
    let began = tokio::time::Instant::now();
    while executions(&up, &k).await == 0 {
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "the late execution never reached the upstream"
        );
        tokio::task::yield_now().await;
    }
    // The client is gone: its connection closes, its thread is drained.
    drop(conn);
    // The gateway is now waiting for that execution (without the wait it
    // would end the thread's runtime, and the execution with it).
    let began = tokio::time::Instant::now();
    while !std::fs::read_to_string(log.path())
        .unwrap()
        .contains("waiting for executions that started while connections drained")
    {
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "the gateway did not wait for the late execution"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reqwest::get(format!("{up}/release")).await.unwrap();
    assert_eq!(exit_code(g).await, Some(0));

    let g = gateway(&up, &store, &[]).await;
    let retry = reqwest::Client::new()
        .post(format!("{}/slow", g.base))
        .header("idempotency-key", &k)
        .timeout(Duration::from_secs(10))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 201, "completed before the gateway exited");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(executions(&up, &k).await, 1);
}

/// Waits (at most 15 s) until the gateway at `base` refuses connections:
/// every serving thread has stopped accepting.
async fn listener_closes(base: &str) {
    let began = tokio::time::Instant::now();
    while tokio::net::TcpStream::connect(support::addr(base))
        .await
        .is_ok()
    {
        assert!(
            began.elapsed() < Duration::from_secs(15),
            "the listener stayed open"
        );
        tokio::task::yield_now().await;
    }
}

#[test]
fn start_up_errors_are_one_line_and_non_zero() {
    let (code, _, err) = idem(&["serve", "--upstream", "http://127.0.0.1:1", "--bogus"]);
    assert_eq!(code, 2);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--bogus"), "{err}");

    let (code, _, err) = idem(&["serve"]);
    assert_ne!(code, 0);
    assert!(err.contains("--upstream"), "{err}");

    let (code, _, err) = idem(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "postgres://nobody@127.0.0.1:1/x",
    ]);
    // A store that cannot be reached is a runtime failure (1), not a
    // configuration error (2): the exit-code table of issue 13.
    assert_eq!(code, 1);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach store"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "upstream = \"http://127.0.0.1:1\"\nttl = \"10s\"\nlease = \"30s\"\n",
    )
    .unwrap();
    let (code, _, err) = idem(&["serve", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("ttl") && err.contains("lease"), "{err}");

    let (code, _, err) = idem(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "memory:",
        "--ttl",
        "60s",
        "--wait",
        "90s",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("wait limit"), "{err}");

    std::fs::write(&cfg, "upstream = \"http://127.0.0.1:1\"\nretries = 3\n").unwrap();
    let (code, _, err) = idem(&["serve", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("invalid config file") && err.contains("retries"),
        "{err}"
    );

    let (code, _, err) = idem(&["serve", "--upstream", "ftp://x", "--store", "memory:"]);
    assert_eq!(code, 2);
    assert!(err.contains("http://"), "{err}");

    let (code, _, err) = idem(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "memory:",
        "--upstream-timeout",
        "40s",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--lease"), "{err}");
}

#[test]
fn serve_help_explains_the_key_policy() {
    let (code, out, _) = idem(&["serve", "--help"]);
    assert_eq!(code, 0);
    for needle in [
        "Idempotency-Key policy",
        "POST and PATCH",
        "Idempotency-Key-Expires",
        "--ttl",
        "409",
        "422",
        "exactly once",
    ] {
        assert!(
            out.to_lowercase().contains(&needle.to_lowercase()),
            "help lacks {needle:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_on_the_admin_listener() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &[]).await;
    let k = key("metrics");
    let c = reqwest::Client::new();
    for _ in 0..2 {
        c.post(format!("{}/orders", g.base))
            .header("idempotency-key", &k)
            .body("{}")
            .send()
            .await
            .unwrap();
    }
    assert_eq!(
        reqwest::get(format!("{}/readyz", g.admin))
            .await
            .unwrap()
            .status(),
        200
    );
    let text = support::metrics_text(&g).await;
    assert!(
        text.contains("idem_requests_total{outcome=\"executed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("idem_requests_total{outcome=\"replayed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("idem_store_duration_seconds_bucket{op=\"claim\",le=\"0.001\"}"),
        "histograms have buckets: {text}"
    );
    assert!(!text.contains(&k), "no key in metrics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_purges_expired_records() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &support::SHORT_LIVED).await;
    let c = reqwest::Client::new();
    for i in 0..3 {
        let r = c
            .post(format!("{}/orders", g.base))
            .header("idempotency-key", key(&format!("sweep{i}")))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    // The records expire after 1 s; the sweeper then deletes them.
    let mut purged = 0;
    for _ in 0..100 {
        let text = support::metrics_text(&g).await;
        purged = text
            .lines()
            .find_map(|l| l.strip_prefix("idem_records_purged_total "))
            .map_or(0, |v| v.trim().parse().unwrap());
        if purged >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(purged, 3);
    // And the keys are free again: the same key executes anew.
    let r = c
        .post(format!("{}/orders", g.base))
        .header("idempotency-key", key("sweep0"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("idempotent-replayed").is_none());
}

/// A gateway killed mid-request leaves a stale claim; `idem records stale`
/// lists it, and under `--takeover reexecute` another gateway on the same
/// store releases it after the lease, so the client's retry is forwarded
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_gateways_claims_are_listed_and_released() {
    let (_up, up) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("recover.db").display());
    let timing = [
        "--lease",
        "1s",
        "--upstream-timeout",
        "700ms",
        "--store-timeout",
        "200ms",
        "--sweep-interval",
        "100ms",
        "--takeover",
        "reexecute",
    ];
    let mut a = gateway(&up, &store, &timing).await;
    let k = key("dead");
    let c = reqwest::Client::new();
    let lost = tokio::spawn(
        c.post(format!("{}/slow", a.base))
            .header("idempotency-key", &k)
            .body("{}")
            .send(),
    );
    while executions(&up, &k).await == 0 {
        tokio::task::yield_now().await;
    }
    a.proc.child.kill().unwrap(); // SIGKILL: no release, no completion
    a.proc.child.wait().unwrap();
    assert!(lost.await.unwrap().is_err());

    // Once the lease is over, the claim is stale.
    let mut listed = String::new();
    for _ in 0..100 {
        let (code, out, err) = idem(&["records", "stale", "--store", &store]);
        assert_eq!(code, 0, "{err}");
        if out.contains("1 stale records") {
            listed = out;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed.contains("POST /slow"), "{listed}");

    let b = gateway(&up, &store, &timing).await;
    let mut released = false;
    for _ in 0..100 {
        let text = support::metrics_text(&b).await;
        if text.contains("idem_reconciled_total{action=\"released\"} 1") {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(released, "the second gateway released the stale claim");
    let (_, out, _) = idem(&["records", "stale", "--store", &store]);
    assert!(out.contains("0 stale records"), "{out}");
    // The retry is forwarded again (the upstream sees the same key).
    reqwest::get(format!("{up}/release")).await.unwrap();
    let retry = tokio::spawn(
        c.post(format!("{}/slow", b.base))
            .header("idempotency-key", &k)
            .body("{}")
            .send(),
    );
    while executions(&up, &k).await < 2 {
        tokio::task::yield_now().await;
    }
    reqwest::get(format!("{up}/release")).await.unwrap();
    assert_eq!(retry.await.unwrap().unwrap().status(), 201);
}

/// `--upstream-idle-timeout` reaches the gateway's upstream pool: a
/// connection left idle is closed once it passes (the default, 60 s,
/// would outlast the test's wait), and the next request opens another
/// and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_close_at_the_configured_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = format!("http://{}", listener.local_addr().unwrap());
    // The upstream answers every request on a connection, then reports
    // the connection's end.
    let (ended, mut ends) = tokio::sync::mpsc::unbounded_channel();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let ended = ended.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while let Ok(n @ 1..) = socket.read(&mut chunk).await {
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if socket.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
                let _ = ended.send(());
            });
        }
    });
    let g = gateway(&up, "memory:", &["--upstream-idle-timeout", "300ms"]).await;
    let get = || async {
        let r = reqwest::get(format!("{}/x", g.base)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.text().await.unwrap(), "ok");
    };
    get().await;
    let answered = std::time::Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(20), ends.recv()).await;
    assert!(
        matches!(closed, Ok(Some(()))),
        "the idle connection was not closed"
    );
    // Not at once: the connection was kept for the timeout.
    let idle = answered.elapsed();
    assert!(idle >= Duration::from_millis(250), "closed after {idle:?}");
    get().await;
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// The kernel's word on whether process `pid` may get transparent huge
/// pages: the `THP_enabled` line of `/proc/PID/status` (Linux 5.0 on).
#[cfg(target_os = "linux")]
fn thp_enabled(pid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim() != "0")
}

/// The gateway turns transparent huge pages off for itself (their first
/// touch zeroes 2 MiB while a request waits), and an operator who sets
/// mimalloc's own switch gets what it says.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transparent_huge_pages_are_off_unless_the_operator_allows_them() {
    use std::process::Stdio;
    // This test's own process is the control: the switch is per process
    // and inherited, so a test run with huge pages already off (or on a
    // kernel before 5.0, which does not show the line) cannot tell.
    if thp_enabled(std::process::id()) != Some(true) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: this process has no transparent huge pages to turn off"
        );
        eprintln!("skipped: this process has no transparent huge pages to turn off");
        return;
    }
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &[]).await;
    assert_eq!(thp_enabled(g.proc.child.id()), Some(false));
    let allowed = support::gateway_with_env(
        &up,
        "memory:",
        &[],
        Stdio::inherit(),
        &[("MIMALLOC_ALLOW_THP", "1")],
    )
    .await;
    assert_eq!(thp_enabled(allowed.proc.child.id()), Some(true));
}

/// Kills a gateway (SIGKILL) while the upstream runs `key`'s request on
/// `/slow`, then starts another on the same store with the same flags;
/// returns it once the first request has been forwarded and lost.
async fn killed_mid_request(up: &str, store: &str, flags: &[&str], k: &str) -> support::Gateway {
    let mut a = gateway(up, store, flags).await;
    let c = reqwest::Client::new();
    let lost = tokio::spawn(
        c.post(format!("{}/slow", a.base))
            .header("idempotency-key", k)
            .body("{}")
            .send(),
    );
    while executions(up, k).await == 0 {
        tokio::task::yield_now().await;
    }
    a.proc.child.kill().unwrap(); // SIGKILL: no completion, no release
    a.proc.child.wait().unwrap();
    assert!(lost.await.unwrap().is_err());
    gateway(up, store, flags).await
}

/// Retries `key` on `/slow` as a client honouring 409 would, until the
/// answer is something else; returns it.
async fn retry_past_409(g: &support::Gateway, k: &str) -> (u16, String) {
    let c = reqwest::Client::new();
    for _ in 0..200 {
        let r = c
            .post(format!("{}/slow", g.base))
            .header("idempotency-key", k)
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        if status != 409 {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("still 409 after 10 s");
}

const CRASH_TIMING: [&str; 8] = [
    "--lease",
    "2s",
    "--upstream-timeout",
    "700ms",
    "--store-timeout",
    "200ms",
    "--sweep-interval",
    "100ms",
];

/// The crash window under the default policy, `hold`: after a gateway dies
/// between forwarding and completing, the retry past the lease is not
/// forwarded again but answered `outcome-unresolved`, and so is the next
/// one, until `idem records release` (refused while the lease is live);
/// then the retry is forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_request_is_held_until_an_operator_releases_it() {
    let (_up, up) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("hold.db").display());
    let k = key("held");
    let b = killed_mid_request(&up, &store, &CRASH_TIMING, &k).await;
    let release = [
        "records", "release", &k, "--store", &store, "--path", "/slow",
    ];
    let (code, _, err) = idem(&release);
    assert_eq!(code, 2, "refused while the lease is live: {err}");
    assert!(err.contains("lease is live"), "{err}");

    for _ in 0..2 {
        let (status, body) = retry_past_409(&b, &k).await;
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("outcome-unresolved"), "{body}");
        assert_eq!(executions(&up, &k).await, 1, "not forwarded again");
    }
    // The operator knows the first did not happen, and releases it: with
    // --force, since the last retry's takeover holds a lease of its own.
    let mut forced = release.to_vec();
    forced.push("--force");
    let (code, out, err) = idem(&forced);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("released POST /slow"), "{out}");
    reqwest::get(format!("{up}/release")).await.unwrap();
    reqwest::get(format!("{up}/release")).await.unwrap();
    let (status, body) = retry_past_409(&b, &k).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(executions(&up, &k).await, 2);
    assert_eq!(executions(&up, &format!("takeover-{k}")).await, 0);
}

/// The crash window under `--takeover announce`: the retry past the lease
/// is forwarded again with `Idem-Takeover: <key>`, so an upstream that
/// keeps its keys can refuse the duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_request_is_forwarded_again_with_the_takeover_announced() {
    let (_up, up) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("announce.db").display());
    let mut flags = CRASH_TIMING.to_vec();
    flags.extend(["--takeover", "announce"]);
    let k = key("announced");
    let b = killed_mid_request(&up, &store, &flags, &k).await;
    reqwest::get(format!("{up}/release")).await.unwrap();
    reqwest::get(format!("{up}/release")).await.unwrap();
    let (status, body) = retry_past_409(&b, &k).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(executions(&up, &k).await, 2);
    assert_eq!(executions(&up, &format!("takeover-{k}")).await, 1);
    // A client cannot announce a takeover itself.
    let forged = key("forged");
    let r = reqwest::Client::new()
        .post(format!("{}/echo", b.base))
        .header("idempotency-key", &forged)
        .header("idem-takeover", &forged)
        .body("{}")
        .send()
        .await
        .unwrap();
    let seen: serde_json::Value = r.json().await.unwrap();
    assert!(seen.get("idem-takeover").is_none(), "{seen}");
}
