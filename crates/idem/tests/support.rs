//! Processes for the gateway tests: the `idem` binary, a counting upstream
//! (this test binary re-run as a child), and waiting until they listen.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    missing_debug_implementations,
    clippy::unwrap_used
)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;

/// A child process killed on drop.
pub struct Proc {
    pub child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Sends SIGTERM (through kill(1): the workspace forbids unsafe code).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// Gateway flags for records that expire within a second, swept every
/// 100 ms (timeouts shortened to fit under the lease).
pub const SHORT_LIVED: [&str; 10] = [
    "--ttl",
    "1s",
    "--lease",
    "800ms",
    "--upstream-timeout",
    "500ms",
    "--store-timeout",
    "200ms",
    "--sweep-interval",
    "100ms",
];

pub use idem_testkit::private_redis::free_port;

/// Two different free ports, for a listener and an admin listener.
pub fn two_free_ports() -> (u16, u16) {
    (free_port(), free_port())
}

/// Polls `url` until it answers 2xx, for up to 20 s.
pub async fn wait_ok(url: &str) {
    let client = reqwest::Client::new();
    for _ in 0..400 {
        if let Ok(r) = client.get(url).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never became ready");
}

/// A running `idem serve`.
pub struct Gateway {
    pub proc: Proc,
    pub base: String,
    pub admin: String,
}

/// Starts `idem serve` with `args` on free ports and waits for /healthz.
pub async fn gateway(upstream: &str, store: &str, extra: &[&str]) -> Gateway {
    gateway_logging_to(upstream, store, extra, Stdio::inherit()).await
}

/// [`gateway`], its stderr (the log) going to `stderr`.
pub async fn gateway_logging_to(
    upstream: &str,
    store: &str,
    extra: &[&str],
    stderr: Stdio,
) -> Gateway {
    gateway_with_env(upstream, store, extra, stderr, &[]).await
}

/// [`gateway_logging_to`], with `env` added to the gateway's environment.
///
/// A Redis store (`redis://`, `rediss://`, `redis-cluster://`...) gets
/// `--accept-volatile-store`: the Redis servers of the tests run without
/// `appendonly`, which `idem serve` refuses otherwise (tests/durability.rs
/// checks the refusal itself).
pub async fn gateway_with_env(
    upstream: &str,
    store: &str,
    extra: &[&str],
    stderr: Stdio,
    env: &[(&str, &str)],
) -> Gateway {
    let (port, admin) = two_free_ports();
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--upstream", upstream, "--store", store])
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
        ])
        .args(extra)
        .args(
            store
                .starts_with("redis")
                .then_some("--accept-volatile-store"),
        )
        .env_remove("IDEM_CONFIG")
        .env_remove("MIMALLOC_ALLOW_THP")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let g = Gateway {
        proc: Proc { child },
        base: format!("http://127.0.0.1:{port}"),
        admin: format!("http://127.0.0.1:{admin}"),
    };
    wait_ok(&format!("{}/healthz", g.admin)).await;
    g
}

/// The gateway's `/metrics` text, from its admin listener.
pub async fn metrics_text(g: &Gateway) -> String {
    reqwest::get(format!("{}/metrics", g.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Waits for a gateway to exit (after [`Proc::terminate`], say); its exit
/// code.
pub async fn exit_code(mut g: Gateway) -> Option<i32> {
    tokio::task::spawn_blocking(move || g.proc.child.wait().unwrap().code())
        .await
        .unwrap()
}

/// `host:port` of a base URL.
pub fn addr(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// Writes a gateway config file; returns its directory (keep it alive)
/// and its path.
pub fn config(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.toml");
    std::fs::write(&path, text).unwrap();
    let p = path.display().to_string();
    (dir, p)
}

/// Sends raw bytes on a new connection and reads until the gateway closes
/// it (or 20 s pass).
pub fn raw(base: &str, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr(base)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs `idem` with `args` to completion; returns (exit code, stdout, stderr).
pub fn idem(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts the counting upstream as a child process; returns it and its URL.
pub fn upstream() -> (Proc, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "upstream_child",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IDEM_UPSTREAM_CHILD", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines.next().expect("upstream exited").unwrap();
        // libtest may print "test upstream_child ... " before it.
        if let Some((_, addr)) = line.split_once("UPSTREAM-LISTENING ") {
            break addr.trim().to_owned();
        }
    };
    // Keep draining its stdout so it never blocks.
    std::thread::spawn(move || for _ in lines {});
    (Proc { child }, format!("http://{addr}"))
}

struct Counts {
    per_key: Mutex<HashMap<String, u64>>,
    gate: tokio::sync::Semaphore,
    /// Transfers made, the last one's number being its resource id.
    transfers: std::sync::atomic::AtomicU64,
}

impl Default for Counts {
    fn default() -> Counts {
        Counts {
            per_key: Mutex::default(),
            gate: tokio::sync::Semaphore::new(0),
            transfers: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

fn count(state: &Counts, headers: &HeaderMap) -> u64 {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    let mut map = state.per_key.lock().unwrap();
    // A takeover the gateway announced, counted as `takeover-KEY`.
    if let Some(of) = headers.get("idem-takeover").and_then(|v| v.to_str().ok()) {
        *map.entry(format!("takeover-{of}")).or_default() += 1;
    }
    let n = map.entry(key).or_default();
    *n += 1;
    *n
}

fn header_map(headers: &HeaderMap) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (k, v) in headers {
        m.insert(
            k.to_string(),
            serde_json::Value::String(v.to_str().unwrap_or("").to_owned()),
        );
    }
    serde_json::Value::Object(m)
}

/// "hello" compressed with gzip.
pub const GZIP_HELLO: [u8; 25] = [
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xff, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0x07,
    0x00, 0x86, 0xa6, 0x10, 0x36, 0x05, 0x00, 0x00, 0x00,
];

/// The upstream's app: counts executions per Idempotency-Key.
pub fn upstream_app() -> Router {
    let state = Arc::new(Counts::default());
    Router::new()
        .route(
            "/orders",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap, body: String| async move {
                let n = count(&s, &headers);
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                (
                    StatusCode::CREATED,
                    [("set-cookie", "session=upstream"), ("location", "/orders/1")],
                    Json(serde_json::json!({ "execution": n, "auth": auth, "body": body })),
                )
            }),
        )
        .route(
            "/echo",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap| async move {
                count(&s, &headers);
                Json(header_map(&headers))
            }),
        )
        .route(
            "/status/{code}",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap, Path(code): Path<u16>| async move {
                count(&s, &headers);
                StatusCode::from_u16(code).unwrap()
            }),
        )
        .route(
            "/slow",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap| async move {
                count(&s, &headers);
                s.gate.acquire().await.unwrap().forget();
                (StatusCode::CREATED, "slow done")
            }),
        )
        .route(
            "/release",
            get(|State(s): State<Arc<Counts>>| async move {
                s.gate.add_permits(1);
                "released"
            }),
        )
        .route(
            "/accounts/{id}/transfers",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap, Path(id): Path<String>, uri: axum::http::Uri, body: String| async move {
                let n = count(&s, &headers);
                let transfer = s.transfers.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                (
                    StatusCode::CREATED,
                    Json(serde_json::json!({ "id": transfer, "execution": n, "account": id, "query": uri.query(), "body": body })),
                )
            }),
        )
        .route(
            "/big/{n}",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap, Path(n): Path<usize>| async move {
                count(&s, &headers);
                (StatusCode::CREATED, "b".repeat(n))
            }),
        )
        .route(
            "/gzip",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap| async move {
                count(&s, &headers);
                (
                    StatusCode::OK,
                    [("content-encoding", "gzip"), ("vary", "accept-encoding"), ("content-type", "text/plain")],
                    GZIP_HELLO.to_vec(),
                )
            }),
        )
        .route(
            "/stall",
            post(|State(s): State<Arc<Counts>>, headers: HeaderMap| async move {
                count(&s, &headers);
                // Headers and a first chunk, then nothing, ever.
                let first = futures_util::stream::once(async {
                    Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"partial"))
                });
                let body = first.chain(futures_util::stream::pending());
                (StatusCode::CREATED, axum::body::Body::from_stream(body))
            }),
        )
        .route(
            "/count/{key}",
            get(|State(s): State<Arc<Counts>>, Path(key): Path<String>| async move {
                s.per_key.lock().unwrap().get(&key).copied().unwrap_or(0).to_string()
            }),
        )
        // Any other method or path is counted too (and answered as axum
        // would), so a test can tell that a request reached the upstream.
        .fallback(|State(s): State<Arc<Counts>>, headers: HeaderMap| async move {
            count(&s, &headers);
            StatusCode::NOT_FOUND
        })
        .method_not_allowed_fallback(|State(s): State<Arc<Counts>>, headers: HeaderMap| async move {
            count(&s, &headers);
            StatusCode::METHOD_NOT_ALLOWED
        })
        .with_state(state)
}

/// How often the upstream executed `key`.
pub async fn executions(upstream: &str, key: &str) -> u64 {
    reqwest::get(format!("{upstream}/count/{key}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .parse()
        .unwrap()
}

/// The body of each test binary's `upstream_child`: serves the counting
/// upstream and prints its address.
pub fn upstream_child_main() {
    assert!(
        std::env::var_os("IDEM_UPSTREAM_CHILD").is_some(),
        "run by the gateway tests"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("UPSTREAM-LISTENING {}", listener.local_addr().unwrap());
        axum::serve(listener, upstream_app()).await.unwrap();
    });
}
