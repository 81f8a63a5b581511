//! `idem serve` against a hostile client: each test tries to break the
//! contract with one value a client, an upstream or a config file controls
//! (issue 10), through a real gateway process in front of a real upstream.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::{GZIP_HELLO, addr, config, executions, gateway, idem, raw, upstream};

/// The child half: serves the counting upstream until killed.
#[test]
#[ignore = "child process of the gateway tests; run by them"]
fn upstream_child() {
    support::upstream_child_main();
}

fn key(tag: &str) -> String {
    format!("hard-{tag}-{}-0000000", std::process::id())
}

async fn problem_type(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap();
    (status, body["type"].as_str().unwrap_or("").to_owned())
}

/// Items 1-3: the actual path, the query string and exact numbers are
/// bound by the fingerprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_query_and_large_integers_are_bound() {
    let (_up, up) = upstream();
    let (_dir, cfg) = config(
        r#"
[[route]]
method = "POST"
path = "/accounts/{id}/transfers"
"#,
    );
    let g = gateway(&up, "memory:", &["--config", &cfg]).await;
    let c = reqwest::Client::new();
    let send = |target: &str, k: &str, body: &str| {
        c.post(format!("{}{target}", g.base))
            .header("idempotency-key", k)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
    };

    let k = key("path");
    let first = send("/accounts/7/transfers", &k, r#"{"amount":5}"#)
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    for other in ["/accounts/8/transfers", "/accounts/7/transfers?to=mallory"] {
        let r = send(other, &k, r#"{"amount":5}"#).await.unwrap();
        assert_eq!(
            problem_type(r).await,
            (422, "urn:idem:problem:key-reused".into()),
            "{other}"
        );
    }
    let again = send("/accounts/7/transfers", &k, r#"{ "amount" : 5 }"#)
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(executions(&up, &k).await, 1);

    let kq = key("query");
    let r = send("/accounts/7/transfers?to=alice", &kq, "{}")
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = send("/accounts/7/transfers?to=mallory", &kq, "{}")
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(executions(&up, &kq).await, 1);

    let kn = key("bigint");
    let r = send(
        "/accounts/7/transfers",
        &kn,
        r#"{"amount":9007199254740993}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let r = send(
        "/accounts/7/transfers",
        &kn,
        r#"{"amount":9007199254740992}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        r.status(),
        422,
        "a different integer is a different request"
    );
    let r = send(
        "/accounts/7/transfers",
        &kn,
        r#"{"amount":9007199254740993.0}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        r.headers()["idempotent-replayed"],
        "true",
        "the same number written differently is the same request"
    );
    assert_eq!(executions(&up, &kn).await, 1);
}

/// Item 4 and the scope review items: a tenant header is raw bytes, never
/// optional; a stable principal header survives a token refresh;
/// `--require-scope` refuses anonymous callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_share_a_scope() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &["--tenant-header", "x-tenant"]).await;
    let c = reqwest::Client::new();
    let k = key("tenant");
    let send = |tenant: Option<&[u8]>| {
        let mut r = c
            .post(format!("{}/orders", g.base))
            .header("idempotency-key", &k)
            .body("{}");
        if let Some(t) = tenant {
            r = r.header(
                "x-tenant",
                reqwest::header::HeaderValue::from_bytes(t).unwrap(),
            );
        }
        r.send()
    };
    let cafe = send(Some("café".as_bytes())).await.unwrap();
    assert_eq!(cafe.status(), 201);
    let none = send(None).await.unwrap();
    assert_eq!(
        problem_type(none).await,
        (400, "urn:idem:problem:invalid-scope".into())
    );
    let caf = send(Some(b"caf")).await.unwrap();
    assert_eq!(caf.status(), 201);
    assert!(caf.headers().get("idempotent-replayed").is_none());
    let repeated = c
        .post(format!("{}/orders", g.base))
        .header("idempotency-key", &k)
        .header("x-tenant", "a")
        .header("x-tenant", "b")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(repeated.status(), 400);
    assert_eq!(
        executions(&up, &k).await,
        2,
        "café and caf each executed once"
    );
    drop(g);

    // A stable principal: the retry after a token refresh replays.
    let g = gateway(&up, "memory:", &["--scope-header", "x-user-id"]).await;
    let kp = key("principal");
    let mut seen = Vec::new();
    for token in ["Bearer old-token", "Bearer new-token"] {
        let r = c
            .post(format!("{}/orders", g.base))
            .header("idempotency-key", &kp)
            .header("authorization", token)
            .header("x-user-id", "user-42")
            .body("{}")
            .send()
            .await
            .unwrap();
        seen.push(r.headers().get("idempotent-replayed").is_some());
    }
    assert_eq!(seen, [false, true]);
    assert_eq!(executions(&up, &kp).await, 1);
    drop(g);

    // --require-scope: no credential, no execution.
    let g = gateway(&up, "memory:", &["--require-scope"]).await;
    let ka = key("anon");
    let r = c
        .post(format!("{}/orders", g.base))
        .header("idempotency-key", &ka)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem_type(r).await,
        (401, "urn:idem:problem:credential-required".into())
    );
    assert_eq!(executions(&up, &ka).await, 0);
}

/// Item 5: a client cannot add a `Forwarded` element or forge forwarding
/// headers; dot-segments never reach the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_cannot_be_injected() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &[]).await;
    let k = key("inject");
    let request = format!(
        "POST /echo HTTP/1.1\r\nHost: x\", for=6.6.6.6;a=\"\r\nIdempotency-Key: {k}\r\n\
         Forwarded: for=7.7.7.7\r\nX-Forwarded-Host: evil\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let answer = raw(&g.base, request.as_bytes());
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let seen: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| {
        panic!("no JSON from the upstream: {answer}");
    });
    let forwarded = seen["forwarded"].as_str().unwrap();
    assert_eq!(forwarded, "for=127.0.0.1;proto=http", "{seen}");
    assert!(seen.get("x-forwarded-host").is_none(), "{seen}");

    // A well-formed Host is passed on, quoted.
    let r = reqwest::Client::new()
        .post(format!("{}/echo", g.base))
        .header("idempotency-key", key("host"))
        .header("host", "shop.example:8443")
        .body("{}")
        .send()
        .await
        .unwrap();
    let seen: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        seen["forwarded"],
        "for=127.0.0.1;proto=http;host=\"shop.example:8443\""
    );
    assert_eq!(seen["x-forwarded-host"], "shop.example:8443");

    for path in ["/orders/../echo", "/orders/%2e%2e/echo", "/./orders"] {
        let kd = key("dots");
        let answer = raw(
            &g.base,
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {kd}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            )
            .as_bytes(),
        );
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("urn:idem:problem:invalid-path"), "{answer}");
        assert_eq!(executions(&up, &kd).await, 0);
    }
}

/// A CONNECT is refused (405, with `Allow`) and never reaches the
/// upstream (which counts every request it gets, whatever its method and
/// path, by key, or as "none" without one), in authority form or origin
/// form, with a key or without: the gateway forwards requests to one
/// service and opens no tunnels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_opens_no_tunnel() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &[]).await;
    for target in ["evil.example:443", "/echo"] {
        for keyed in [true, false] {
            let k = key("connect");
            let counted = if keyed { k.clone() } else { "none".to_owned() };
            let before = executions(&up, &counted).await;
            let key_line = if keyed {
                format!("Idempotency-Key: {k}\r\n")
            } else {
                String::new()
            };
            let request = format!(
                "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{key_line}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            );
            let answer = raw(&g.base, request.as_bytes());
            assert!(answer.starts_with("HTTP/1.1 405"), "{target}: {answer}");
            assert!(
                answer.contains("urn:idem:problem:method-not-allowed"),
                "{answer}"
            );
            assert!(
                answer
                    .to_ascii_lowercase()
                    .contains("\r\nallow: get, head, post, put, patch, delete, options, trace\r\n"),
                "{answer}"
            );
            assert_eq!(executions(&up, &counted).await, before, "{target} {keyed}");
        }
    }
    // The gateway still forwards, and the upstream counts a method and
    // path it has no route for, with a key and without.
    let k = key("after");
    let client = reqwest::Client::new();
    let r = client
        .delete(format!("{}/echo", g.base))
        .header("idempotency-key", &k)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(executions(&up, &k).await, 1);
    let before = executions(&up, "none").await;
    let r = client
        .put(format!("{}/nowhere", g.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(executions(&up, "none").await, before + 1);
}

/// Item 7: a per-route lease must outlast the upstream timeout, and a
/// stalled response body does not outlive it: the key stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_outlast_the_upstream_and_stalled_bodies_hold_the_key() {
    let (_dir, cfg) = config(
        r#"
[[route]]
method = "POST"
path = "/transfers"
lease = "5s"
"#,
    );
    let (code, _, err) = idem(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:1",
        "--config",
        &cfg,
        "--upstream-timeout",
        "10s",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("must be longer than --upstream-timeout"),
        "{err}"
    );

    let (_up, up) = upstream();
    let g = gateway(
        &up,
        "memory:",
        &["--upstream-timeout", "500ms", "--lease", "20s"],
    )
    .await;
    let c = reqwest::Client::new();
    let k = key("stall");
    let started = Instant::now();
    let r = c
        .post(format!("{}/stall", g.base))
        .header("idempotency-key", &k)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem_type(r).await,
        (500, "urn:idem:problem:outcome-unknown".into())
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let retry = c
        .post(format!("{}/stall", g.base))
        .header("idempotency-key", &k)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 409, "held until the lease ends");
    assert_eq!(executions(&up, &k).await, 1);

    // The gateway's own 504 (upstream too slow) holds the key too.
    let ks = key("slow504");
    let r = c
        .post(format!("{}/slow", g.base))
        .header("idempotency-key", &ks)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    let retry = c
        .post(format!("{}/slow", g.base))
        .header("idempotency-key", &ks)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 409, "a timed-out request may still commit");
    assert_eq!(executions(&up, &ks).await, 1);
    reqwest::get(format!("{up}/release")).await.unwrap();
}

/// Item 8: half-sent headers and bodies are cut off, and connections are
/// capped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_and_connections_are_capped() {
    let (_up, up) = upstream();
    let g = gateway(
        &up,
        "memory:",
        &[
            "--header-timeout",
            "500ms",
            "--body-timeout",
            "500ms",
            "--max-connections",
            "64",
        ],
    )
    .await;
    // 50 connections that each send half a header: all closed by the
    // gateway (read returns EOF or an error) well before 20 s.
    let started = Instant::now();
    let mut conns: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(addr(&g.base)).unwrap();
            s.write_all(b"POST /orders HTTP/1.1\r\nHost: x\r\nX-Half: ")
                .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s
        })
        .collect();
    for s in &mut conns {
        // EOF (or a reset) ends the read; a read timeout would mean the
        // connection was still open after 20 s.
        let mut rest = Vec::new();
        if let Err(e) = s.read_to_end(&mut rest) {
            assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "still open after {:?}",
                started.elapsed()
            );
        }
    }
    assert!(started.elapsed() < Duration::from_secs(20));

    // A body that stalls: 408, nothing forwarded.
    let k = key("slowbody");
    let answer = raw(
        &g.base,
        format!("POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {k}\r\nContent-Length: 100\r\n\r\n{{\"a\":")
            .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("urn:idem:problem:body-timeout"), "{answer}");
    assert_eq!(executions(&up, &k).await, 0);
    drop(g);

    // A cap of 2: with two idle connections open, a third waits for a slot
    // and is served once one of them is gone.
    let g = gateway(
        &up,
        "memory:",
        &["--max-connections", "2", "--header-timeout", "60s"],
    )
    .await;
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(addr(&g.base)).unwrap())
        .collect();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    let url = format!("{}/count/none", g.base);
    assert!(
        c.get(&url).send().await.is_err(),
        "a third connection is not served while two are open"
    );
    drop(idle);
    let c = reqwest::Client::new();
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
}

/// A store URL that is refused never echoes its password, whichever
/// command refuses it and wherever the URL came from.
#[test]
fn refused_store_urls_never_print_their_password() {
    for url in [
        "mysql://u:s3cret-pw@h/db",
        "postgresql+x://u:s3cret-pw@h/db",
        "redis+x://h/db?password=s3cret-pw",
    ] {
        for args in [
            vec!["records", "stale", "--store", url],
            vec!["records", "purge", "--store", url],
            vec!["records", "get", "some-key-0123456789", "--store", url],
            vec!["demo", "--store", url],
            vec!["serve", "--upstream", "http://127.0.0.1:9", "--store", url],
        ] {
            let (code, out, err) = idem(&args);
            assert_ne!(code, 0, "{args:?} accepted {url}");
            assert!(err.contains("store"), "{args:?}: {err}");
            assert!(
                !err.contains("s3cret") && !out.contains("s3cret"),
                "{args:?} printed the password: {err}"
            );
        }
    }
}

/// Item 9: durations and sizes past their bounds are refused at start-up,
/// with a message and exit code 2.
#[test]
fn out_of_range_settings_are_refused() {
    for (args, says) in [
        (&["--ttl", "3000000d"][..], "ttl"),
        (&["--ttl", "400d"][..], "ttl"),
        (&["--lease", "2d", "--ttl", "3d"][..], "lease"),
        (&["--wait", "1h"][..], "wait"),
        (
            &["--upstream-timeout", "2h", "--lease", "3h"][..],
            "upstream-timeout",
        ),
        (&["--max-body", "1000MiB"][..], "max-body"),
        (&["--max-response", "300MiB"][..], "max-response"),
        (&["--header-timeout", "0s"][..], "header-timeout"),
        (&["--max-connections", "0"][..], "max-connections"),
        (&["--threads", "0"][..], "threads"),
        (&["--threads", "257"][..], "threads"),
        (&["--store-timeout", "1h"][..], "store-timeout"),
        (&["--sweep-interval", "1ms"][..], "sweep-interval"),
        (
            &["--upstream-idle-timeout", "0s"][..],
            "upstream-idle-timeout",
        ),
        (
            &["--upstream-idle-timeout", "2h"][..],
            "upstream-idle-timeout",
        ),
    ] {
        let mut full = vec![
            "serve",
            "--upstream",
            "http://127.0.0.1:1",
            "--store",
            "memory:",
        ];
        full.extend_from_slice(args);
        let (code, _, err) = idem(&full);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// Item 10: a client that sends a whole over-limit body before reading
/// gets the 413, not a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_body_sent_whole_still_reads_413() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &["--max-body", "1MiB"]).await;
    let body = vec![b'x'; 2 << 20];
    for i in 0..10 {
        let k = key(&format!("big{i}"));
        let mut s = TcpStream::connect(addr(&g.base)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!(
            "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {k}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&body).unwrap();
        let mut out = Vec::new();
        let read = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with("HTTP/1.1 413"),
            "attempt {i}: {read:?} {text}"
        );
        assert_eq!(executions(&up, &k).await, 0);
    }
}

/// Item 11 is in gateway.rs (`the_reconciliation_read_path_and_records_cli`).
/// Review items: a response over the replay limit reaches the client whole
/// and is never executed again; `Content-Encoding` and `Vary` replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_encoded_responses_replay_safely() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &["--max-response", "1KiB"]).await;
    let c = reqwest::Client::new();
    let k = key("big-response");
    let send = |path: &str, k: &str| {
        c.post(format!("{}{path}", g.base))
            .header("idempotency-key", k)
            .header("authorization", "Bearer reader")
            .body("{}")
            .send()
    };
    let first = send("/big/100000", &k).await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(first.bytes().await.unwrap().len(), 100_000);
    let retry = send("/big/100000", &k).await.unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = retry.json().await.unwrap();
    assert_eq!(body["type"], "urn:idem:problem:response-not-stored");
    assert!(body["detail"].as_str().unwrap().contains("/_idem/records/"));
    assert_eq!(executions(&up, &k).await, 1);
    let record = c
        .get(format!("{}/_idem/records/{k}", g.base))
        .header("authorization", "Bearer reader")
        .send()
        .await
        .unwrap();
    assert_eq!(record.status(), 200);

    let kg = key("gzip");
    let first = send("/gzip", &kg).await.unwrap();
    assert_eq!(first.bytes().await.unwrap().as_ref(), GZIP_HELLO);
    let again = send("/gzip", &kg).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["content-encoding"], "gzip");
    assert_eq!(again.headers()["vary"], "accept-encoding");
    assert_eq!(again.bytes().await.unwrap().as_ref(), GZIP_HELLO);
}

/// Review item: a request still running when the shutdown grace ends may
/// still commit upstream, so its key is held, not released: the next
/// gateway on the same store answers the retry with 409 and does not
/// forward it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_request_holds_the_key() {
    let (_up, up) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("held.db").display());
    let g = gateway(&up, &store, &["--shutdown-grace", "0s"]).await;
    let k = key("shutdown");
    let c = reqwest::Client::new();
    let running = tokio::spawn(
        c.post(format!("{}/slow", g.base))
            .header("idempotency-key", &k)
            .body("{}")
            .send(),
    );
    while executions(&up, &k).await == 0 {
        tokio::task::yield_now().await;
    }
    g.proc.terminate();
    assert_eq!(support::exit_code(g).await, Some(0));
    // The client got 503 (shutting down) or lost its connection.
    if let Ok(r) = running.await.unwrap() {
        assert_eq!(r.status(), 503);
    }

    let g = gateway(&up, &store, &[]).await;
    // Bounded: a retry that were forwarded would block in /slow.
    let retry = c
        .post(format!("{}/slow", g.base))
        .header("idempotency-key", &k)
        .timeout(Duration::from_secs(10))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 409, "held until the lease ends");
    assert_eq!(executions(&up, &k).await, 1);
    reqwest::get(format!("{up}/release")).await.unwrap();
}
