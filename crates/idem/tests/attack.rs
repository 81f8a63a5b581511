//! Security review of the gateway: attacks by a hostile client (and a
//! hostile upstream) against a real `idem serve` process. Each test is
//! either a demonstrated break of docs/contract.md, *Records and their state machine* / *The HTTP contract* / *What the gateway trusts* (it fails
//! until the gap is fixed) or a guard on a property the attack did not
//! break.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use support::{addr, config, gateway, raw};

/// Required by `support` (its counting upstream is not used here).
#[test]
#[ignore = "child process of the gateway tests; unused by this file"]
fn upstream_child() {
    support::upstream_child_main();
}

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: HashMap<String, Vec<String>>,
    body: Vec<u8>,
}

#[derive(Default)]
struct Log {
    seen: Mutex<Vec<Seen>>,
}

impl Log {
    fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    /// How many requests reached the upstream with this Idempotency-Key.
    fn executions(&self, k: &str) -> usize {
        self.all()
            .iter()
            .filter(|s| {
                s.headers
                    .get("idempotency-key")
                    .is_some_and(|v| v == &[k.to_owned()])
            })
            .count()
    }
    /// Requests whose target contains `needle`.
    fn to(&self, needle: &str) -> Vec<Seen> {
        self.all()
            .into_iter()
            .filter(|s| s.target.contains(needle))
            .collect()
    }
}

/// Records every request, answers 201 with a small JSON body.
async fn record(State(log): State<Arc<Log>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let mut headers: HashMap<String, Vec<String>> = HashMap::new();
    for (n, v) in &parts.headers {
        headers
            .entry(n.as_str().to_owned())
            .or_default()
            .push(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    let n = {
        let mut seen = log.seen.lock().unwrap();
        seen.push(Seen {
            method: parts.method.to_string(),
            target: parts.uri.to_string(),
            headers,
            body: body.to_vec(),
        });
        seen.len()
    };
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!("{{\"n\":{n}}}"),
    )
        .into_response()
}

/// 64 MiB, streamed.
async fn huge() -> Response {
    let chunk = Bytes::from(vec![b'h'; 64 * 1024]);
    let stream =
        futures_util::stream::iter((0..1024).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    axum::body::Body::from_stream(stream).into_response()
}

/// An upstream on 127.0.0.1:0 in this process; returns its URL and log.
async fn upstream() -> (String, Arc<Log>) {
    let log = Arc::new(Log::default());
    let app = Router::new()
        .route("/huge", get(huge))
        .route(
            "/slow",
            post(|state: State<Arc<Log>>, req: Request| async move {
                tokio::time::sleep(Duration::from_millis(700)).await;
                record(state, req).await
            }),
        )
        .route(
            "/big",
            post(|State(log): State<Arc<Log>>, req: Request| async move {
                let _ = record(State(log), req).await;
                (StatusCode::CREATED, vec![b'b'; 4 << 20])
            }),
        )
        .route("/ignore", put(|| async { "ignored the body" }))
        .fallback(record)
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), log)
}

fn key(tag: &str) -> String {
    format!("atk-{tag}-{}-00000000", std::process::id())
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Was BROKEN before Connection could no longer name protected headers. A client lists end-to-end headers in `Connection`, and the
/// gateway strips them before forwarding: the upstream never receives the
/// `Idempotency-Key` (docs/contract.md, *Records and their state machine*: the gateway forwards it so the
/// upstream can deduplicate a retry after a held lease) nor the tenant
/// header the gateway scoped the record by (section 6b: nothing a client
/// sends may change what the upstream receives beyond what is bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cannot_strip_the_key_or_the_scope_from_the_upstream() {
    let (up, log) = upstream().await;
    let g = gateway(&up, "memory:", &["--tenant-header", "x-tenant"]).await;
    let k = key("connection");
    let answer = raw(
        &g.base,
        format!(
            "POST /conn-strip HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {k}\r\nX-Tenant: acme\r\n\
             Connection: close, idempotency-key, x-tenant\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .as_bytes(),
    );
    assert_eq!(status_of(&answer), 201, "{answer}");
    let seen = log.to("/conn-strip");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, b"{}");
    let h = &seen[0].headers;
    assert_eq!(
        h.get("idempotency-key"),
        Some(&vec![k.clone()]),
        "the upstream must get the key the record was claimed with: {h:?}"
    );
    assert_eq!(
        h.get("x-tenant"),
        Some(&vec!["acme".to_owned()]),
        "the upstream must get the tenant the record was scoped by: {h:?}"
    );
}

/// Was BROKEN before the stall guard. Slowloris by not reading: a client asks for a large answer
/// and never reads it. Every timeout the gateway has (header, body,
/// upstream) is 1 s or less here, yet the connection, its slot under
/// `--max-connections` and the upstream connection behind it are held for
/// as long as the client likes, so `max-connections` such clients shut
/// everyone else out (section 6b: connections and read time are bounded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_cannot_hold_a_connection_slot() {
    let (up, log) = upstream().await;
    let g = gateway(
        &up,
        "memory:",
        &[
            "--max-connections",
            "1",
            "--header-timeout",
            "500ms",
            "--body-timeout",
            "500ms",
            "--upstream-timeout",
            "1s",
            "--store-timeout",
            "500ms",
            "--lease",
            "2s",
        ],
    )
    .await;
    let mut hog = TcpStream::connect(addr(&g.base)).unwrap();
    hog.write_all(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // The answer has started: the hog holds the only slot, and now stops
    // reading.
    let mut first = [0u8; 64];
    hog.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));

    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let started = Instant::now();
    let r = c.get(format!("{}/after-the-hog", g.base)).send().await;
    assert!(
        r.is_ok(),
        "a second client was not served for {:?} while a client that never reads held the only slot",
        started.elapsed()
    );
    assert_eq!(log.to("/after-the-hog").len(), 1);
    drop(hog);
}

/// Was BROKEN before paths were checked for encodings. The dot-segment filter and the route rules look at the path as
/// written; an upstream that normalises it (RFC 3986 6.2.2: `%61` is `a`;
/// Tomcat's `..;`; WHATWG URL parsers' `\`; IIS's `%5c`) resolves these
/// targets to `/accounts/7`, whose rule requires a key. They reach the
/// upstream without one, under no rule at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_and_dotted_paths_cannot_slip_past_a_route_rule() {
    let (up, log) = upstream().await;
    let (_dir, cfg) = config(
        r#"
[[route]]
method = "PUT"
path = "/accounts/{id}"
"#,
    );
    let g = gateway(&up, "memory:", &["--config", &cfg]).await;
    let put = |target: &str| {
        raw(
            &g.base,
            format!("PUT {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}")
                .as_bytes(),
        )
    };
    let plain = put("/accounts/7");
    assert_eq!(status_of(&plain), 400, "the rule needs a key: {plain}");
    let mut slipped = Vec::new();
    for target in [
        "/%61ccounts/7",
        "/x/..;/accounts/7",
        "/x/..\\accounts/7",
        "/x/..%5caccounts/7",
    ] {
        let answer = put(target);
        if status_of(&answer) != 400 {
            slipped.push((target, status_of(&answer)));
        }
    }
    let reached: Vec<String> = log.all().into_iter().map(|s| s.target).collect();
    assert!(
        slipped.is_empty() && reached.is_empty(),
        "forwarded without a key: {slipped:?}; the upstream saw {reached:?}"
    );
}

/// Held: a passthrough body that trickles (or a chunked one that never
/// ends) is cut off at the upstream timeout, and the slot is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_passthrough_bodies_end_at_the_upstream_timeout() {
    let (up, log) = upstream().await;
    let g = gateway(
        &up,
        "memory:",
        &[
            "--max-connections",
            "1",
            "--header-timeout",
            "500ms",
            "--upstream-timeout",
            "1s",
            "--store-timeout",
            "500ms",
            "--lease",
            "2s",
        ],
    )
    .await;
    for head in [
        &b"PUT /trickle HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"[..],
        &b"PUT /trickle HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"[..],
        &b"PUT /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n"[..],
    ] {
        let mut s = TcpStream::connect(addr(&g.base)).unwrap();
        s.write_all(head).unwrap();
        let started = Instant::now();
        // One byte (or chunk) every 200 ms until the gateway gives up.
        while s.write_all(b"1\r\na\r\n").is_ok() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(started.elapsed() < Duration::from_secs(10), "still open");
        let c = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        assert!(c.get(format!("{}/next", g.base)).send().await.is_ok());
    }
    assert_eq!(log.to("/next").len(), 3);
}

/// Held: scopes on the read path and on replays. A caller reads its own
/// record (a needlessly percent-encoded key is refused), and no other credential
/// (case, repetition, emptiness, obs-text), no missing credential, and no
/// shifting of bytes between a tenant and a principal header reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_never_cross_callers() {
    let (up, log) = upstream().await;
    let g = gateway(&up, "memory:", &[]).await;
    let c = reqwest::Client::new();
    let k = key("alice");
    let r = c
        .post(format!("{}/orders", g.base))
        .header("idempotency-key", &k)
        .header("authorization", "Bearer alice-token")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let encoded: String = k.bytes().map(|b| format!("%{b:02X}")).collect();
    let read = |path: String, auth: Vec<&'static [u8]>| {
        let mut req = c.get(format!("{}/_idem/records/{path}", g.base));
        for a in auth {
            req = req.header(
                "authorization",
                reqwest::header::HeaderValue::from_bytes(a).unwrap(),
            );
        }
        req.send()
    };
    assert_eq!(
        read(k.clone(), vec![b"Bearer alice-token"])
            .await
            .unwrap()
            .status(),
        200
    );
    // The read path's key segment takes any percent-encoding (a base64
    // key's `/` must be sent as %2F): a key spelled with needless ones
    // finds its owner's record, and still only its owner's.
    assert_eq!(
        read(encoded.clone(), vec![b"Bearer alice-token"])
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        read(encoded.clone(), vec![b"Bearer mallory"])
            .await
            .unwrap()
            .status(),
        404
    );
    for auth in [
        vec![&b"bearer alice-token"[..]],
        vec![&b"Bearer alice-token\xff"[..]],
        vec![&b"Bearer alice-token"[..], &b"Bearer alice-token"[..]],
        vec![&b""[..]],
        vec![],
    ] {
        let s = read(k.clone(), auth.clone()).await.unwrap().status();
        assert!(matches!(s.as_u16(), 400 | 401 | 404), "{auth:?}: {s}");
    }
    // A replay needs the same credential too.
    let r = c
        .post(format!("{}/orders", g.base))
        .header("idempotency-key", &k)
        .header("authorization", "Bearer mallory")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("idempotent-replayed").is_none());
    assert_eq!(log.executions(&k), 2);
    drop(g);

    // Tenant and principal are framed: bytes cannot move between them.
    let g = gateway(
        &up,
        "memory:",
        &["--tenant-header", "x-tenant", "--scope-header", "x-user"],
    )
    .await;
    let kt = key("framing");
    for (t, u) in [("ab", "c"), ("a", "bc")] {
        let r = c
            .post(format!("{}/orders", g.base))
            .header("idempotency-key", &kt)
            .header("x-tenant", t)
            .header("x-user", u)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        assert!(r.headers().get("idempotent-replayed").is_none(), "{t}/{u}");
    }
    assert_eq!(log.executions(&kt), 2);
}

/// Held: no second upstream execution for one key from concurrent waiters,
/// a client that hangs up mid-forward, or one that hangs up in the middle
/// of an answer over `--max-response`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_ups_and_waiters_never_execute_twice() {
    let (up, log) = upstream().await;
    let g = gateway(&up, "memory:", &["--wait", "5s", "--max-response", "1KiB"]).await;
    let c = reqwest::Client::new();

    let k = key("waiters");
    let sends = (0..16).map(|_| {
        c.post(format!("{}/slow", g.base))
            .header("idempotency-key", &k)
            .body("{}")
            .send()
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut fresh = 0;
    for a in answers {
        let a = a.unwrap();
        assert_eq!(a.status(), 201);
        if a.headers().get("idempotent-replayed").is_none() {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(log.executions(&k), 1);

    let kh = key("hangup");
    {
        let mut s = TcpStream::connect(addr(&g.base)).unwrap();
        s.write_all(
            format!("POST /slow HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {kh}\r\nContent-Length: 2\r\n\r\n{{}}")
                .as_bytes(),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = c
        .post(format!("{}/slow", g.base))
        .header("idempotency-key", &kh)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(log.executions(&kh), 1);

    let kb = key("bighangup");
    {
        let mut s = TcpStream::connect(addr(&g.base)).unwrap();
        s.write_all(
            format!("POST /big HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {kb}\r\nContent-Length: 2\r\n\r\n{{}}")
                .as_bytes(),
        )
        .unwrap();
        let mut first = [0u8; 64];
        let _ = s.read(&mut first).unwrap();
        assert!(first.starts_with(b"HTTP/1.1 201"));
    }
    let r = c
        .post(format!("{}/big", g.base))
        .header("idempotency-key", &kb)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["type"], "urn:idem:problem:response-not-stored");
    assert_eq!(log.executions(&kb), 1);
}

/// Held: an absolute-form target cannot redirect the request to another
/// host, and a `Host` that is not an authority is not passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_targets_reach_only_the_upstream() {
    let (up, log) = upstream().await;
    let g = gateway(&up, "memory:", &[]).await;
    let k = key("absolute");
    let answer = raw(
        &g.base,
        format!(
            "POST http://169.254.169.254/abs?q=1 HTTP/1.1\r\nHost: a b\r\nIdempotency-Key: {k}\r\n\
             X-Real-IP: 6.6.6.6\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        )
        .as_bytes(),
    );
    assert_eq!(status_of(&answer), 201, "{answer}");
    let seen = log.to("/abs");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].target.as_str()),
        ("POST", "/abs?q=1")
    );
    let h = &seen[0].headers;
    assert_eq!(h["host"], vec![addr(&up)]);
    assert!(
        h.get("x-real-ip").is_none() && h.get("x-forwarded-host").is_none(),
        "{h:?}"
    );
}
