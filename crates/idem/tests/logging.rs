//! The binary's logs, from real processes: the format and filter flags,
//! `RUST_LOG`, what reaches stderr (never a raw key), and trace context
//! passing through the gateway.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::process::{Command, Stdio};

use support::{Proc, executions, idem, upstream, wait_ok};

/// The child half: serves the counting upstream until killed.
#[test]
#[ignore = "child process of the gateway tests; run by them"]
fn upstream_child() {
    support::upstream_child_main();
}

fn key(tag: &str) -> String {
    format!("log-{tag}-{}-0000000", std::process::id())
}

/// A running `idem serve` whose stderr goes to a file.
struct Logged {
    proc: Proc,
    base: String,
    stderr: tempfile::NamedTempFile,
}

/// Starts `idem serve` in front of `upstream` with `extra` flags and
/// `env`, without the caller's RUST_LOG or IDEM_LOG_FORMAT.
async fn logged_gateway(upstream: &str, extra: &[&str], env: &[(&str, &str)]) -> Logged {
    let (port, admin) = support::two_free_ports();
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--upstream", upstream, "--store", "memory:"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(extra)
        .env_remove("IDEM_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("IDEM_LOG_FORMAT")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .unwrap();
    let proc = Proc { child };
    wait_ok(&format!("http://127.0.0.1:{admin}/healthz")).await;
    Logged {
        proc,
        base: format!("http://127.0.0.1:{port}"),
        stderr,
    }
}

impl Logged {
    /// Stops the gateway with SIGTERM; returns everything it wrote to
    /// stderr.
    async fn stop(self) -> String {
        self.proc.terminate();
        let mut proc = self.proc;
        let status = tokio::task::spawn_blocking(move || proc.child.wait().unwrap())
            .await
            .unwrap();
        assert_eq!(status.code(), Some(0));
        std::fs::read_to_string(self.stderr.path()).unwrap()
    }
}

/// Each line of a JSON log as an object; fails on any other line.
fn json_lines(stderr: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    stderr
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(serde_json::Value::Object(event)) => event,
            _ => panic!("not a JSON object: {line}\n{stderr}"),
        })
        .collect()
}

fn has(events: &[serde_json::Map<String, serde_json::Value>], level: &str, message: &str) -> bool {
    events
        .iter()
        .any(|e| e["level"] == level && e["message"] == message)
}

async fn post(base: &str, path: &str, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap()
}

/// `--log-format json --log-level debug`: one JSON object per line, the
/// settings at start-up, one debug event per keyed request (executed, then
/// replayed), and the key only as its hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_name_each_request_by_its_key_hash() {
    let (_up, up) = upstream();
    let g = logged_gateway(&up, &["--log-format", "json", "--log-level", "debug"], &[]).await;
    let k = key("json");
    assert_eq!(post(&g.base, "/orders", &k).await.status(), 201);
    let replay = post(&g.base, "/orders", &k).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let stderr = g.stop().await;

    let events = json_lines(&stderr);
    for e in &events {
        assert!(
            e["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{e:?}"
        );
        let level = e["level"].as_str().unwrap();
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level),
            "{e:?}"
        );
        assert!(e["target"].as_str().is_some(), "{e:?}");
        assert!(e["message"].as_str().is_some(), "{e:?}");
    }
    let settings = events
        .iter()
        .find(|e| e["message"] == "forwarding requests")
        .expect("the settings at start-up");
    assert_eq!(settings["level"], "INFO");
    assert_eq!(settings["target"], "idem::serve");
    assert_eq!(settings["store"], "memory:");
    assert_eq!(settings["lease"], "30s");
    assert_eq!(settings["routes"], 0);

    let hash = idem_core::Key::new(k.as_str()).unwrap().log_id();
    let finished: Vec<_> = events
        .iter()
        .filter(|e| e["message"] == "request finished")
        .collect();
    let seen: Vec<(&str, &str, u64, &str)> = finished
        .iter()
        .map(|e| {
            (
                e["operation"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
                e["status"].as_u64().unwrap(),
                e["key"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("POST /orders", "executed", 201, hash.as_str()),
            ("POST /orders", "replayed", 201, hash.as_str()),
        ]
    );
    for e in &finished {
        assert_eq!(e["level"], "DEBUG");
        assert!(e["duration_ms"].as_f64().is_some(), "{e:?}");
    }
    assert!(has(&events, "INFO", "shutting down"), "{stderr}");
    assert!(has(&events, "INFO", "stopped"), "{stderr}");
    assert!(!stderr.contains(&k), "the raw key was logged:\n{stderr}");
}

/// A client that hangs up while the upstream works does not stop the
/// execution, nor its one debug event: the request's end is logged with the
/// outcome and status it was recorded under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_hung_up_is_still_logged() {
    use std::io::Write as _;
    let (_up, up) = upstream();
    let g = logged_gateway(&up, &["--log-format", "json", "--log-level", "debug"], &[]).await;
    let k = key("hangup");
    let addr = g.base.trim_start_matches("http://").to_owned();
    let mut client = std::net::TcpStream::connect(&addr).unwrap();
    client
        .write_all(
            format!(
                "POST /slow HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {k}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
            )
            .as_bytes(),
        )
        .unwrap();
    // The upstream holds the request until released; hang up while it does.
    while executions(&up, &k).await == 0 {
        tokio::task::yield_now().await;
    }
    drop(client);
    reqwest::get(format!("{up}/release")).await.unwrap();
    // The execution ends on its own and is recorded: a retry replays it.
    let replay = loop {
        let r = post(&g.base, "/slow", &k).await;
        if r.status() != 409 {
            break r;
        }
    };
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let stderr = g.stop().await;

    let hash = idem_core::Key::new(k.as_str()).unwrap().log_id();
    let events = json_lines(&stderr);
    let mut ends: Vec<(&str, u64)> = events
        .iter()
        .filter(|e| e["message"] == "request finished" && e["key"] == hash.as_str())
        .filter(|e| e["outcome"] != "conflict")
        .map(|e| {
            (
                e["outcome"].as_str().unwrap(),
                e["status"].as_u64().unwrap(),
            )
        })
        .collect();
    // Each event once, in any order: the execution stores its record
    // before it logs its end, so the retry's replay may be logged first
    // (the two are written by different threads).
    ends.sort_unstable();
    assert_eq!(ends, [("executed", 201), ("replayed", 201)], "{stderr}");
}

/// `RUST_LOG` sets the filter without `--log-level`; `--log-level` wins
/// over it; without either, `info`. A warning reaches the log in each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_sets_the_filter_and_the_flag_wins() {
    // Nothing listens there: the proxy warns "upstream unreachable".
    let unreachable = "http://127.0.0.1:1";
    let json = ["--log-format", "json"];
    let run = |extra: Vec<&'static str>, env: Vec<(&'static str, &'static str)>| async move {
        let g = logged_gateway(unreachable, &extra, &env).await;
        assert_eq!(post(&g.base, "/orders", &key("filter")).await.status(), 502);
        json_lines(&g.stop().await)
    };

    let events = run(json.to_vec(), vec![("RUST_LOG", "warn")]).await;
    assert!(has(&events, "WARN", "upstream unreachable"), "{events:?}");
    assert!(
        events
            .iter()
            .all(|e| e["level"] == "WARN" || e["level"] == "ERROR"),
        "RUST_LOG=warn: {events:?}"
    );

    let mut debug = json.to_vec();
    debug.extend(["--log-level", "debug"]);
    let events = run(debug, vec![("RUST_LOG", "warn")]).await;
    assert!(has(&events, "INFO", "forwarding requests"), "{events:?}");
    assert!(has(&events, "DEBUG", "request finished"), "{events:?}");
    assert!(has(&events, "WARN", "upstream unreachable"), "{events:?}");

    // The format from the environment; the filter by default.
    let events = run(vec![], vec![("IDEM_LOG_FORMAT", "json")]).await;
    assert!(has(&events, "INFO", "forwarding requests"), "{events:?}");
    assert!(has(&events, "WARN", "upstream unreachable"), "{events:?}");
    assert!(events.iter().all(|e| e["level"] != "DEBUG"), "{events:?}");
}

/// The text format: one line per event, with level, target and message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_are_one_line_per_event() {
    let g = logged_gateway(
        "http://127.0.0.1:1",
        &["--log-level", "idem_http=debug,info"],
        &[],
    )
    .await;
    let k = key("text");
    assert_eq!(post(&g.base, "/orders", &k).await.status(), 502);
    let stderr = g.stop().await;
    let line = |needle: &str| {
        stderr
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{stderr}"))
            .to_owned()
    };
    assert!(line("forwarding requests").contains(" INFO idem::serve: "));
    assert!(line("upstream unreachable").contains(" WARN idem_gateway::proxy: "));
    let finished = line("request finished");
    assert!(finished.contains("DEBUG idem_http::flow: "), "{finished}");
    assert!(
        finished.contains("outcome=released status=502"),
        "{finished}"
    );
    assert!(!stderr.contains(&k), "the raw key was logged:\n{stderr}");
}

/// A warning of the library (idem-http's "outcome unknown" when the
/// upstream times out) reaches the log at the default level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_warnings_reach_the_log() {
    let (_up, up) = upstream();
    let g = logged_gateway(
        &up,
        &["--log-format", "json", "--upstream-timeout", "200ms"],
        &[],
    )
    .await;
    let k = key("unknown");
    assert_eq!(post(&g.base, "/slow", &k).await.status(), 504);
    reqwest::get(format!("{up}/release")).await.unwrap();
    let stderr = g.stop().await;
    let events = json_lines(&stderr);
    let warning = events
        .iter()
        .find(|e| e["message"] == "outcome unknown; the claim is held until its lease ends")
        .unwrap_or_else(|| panic!("no warning in:\n{stderr}"));
    assert_eq!(warning["level"], "WARN");
    assert_eq!(warning["target"], "idem_http::flow::execute");
    let hash = idem_core::Key::new(k.as_str()).unwrap().log_id();
    assert_eq!(warning["key"], hash.as_str());
    assert!(!stderr.contains(&k), "the raw key was logged:\n{stderr}");
}

/// Bad logging flags are usage errors: one line, exit 2. Logs never
/// reach stdout, which stays the command's output.
#[test]
fn bad_log_settings_are_usage_errors() {
    for args in [
        &[
            "records",
            "stale",
            "--store",
            "memory:",
            "--log-format",
            "xml",
        ][..],
        &[
            "records",
            "stale",
            "--store",
            "memory:",
            "--log-level",
            "inf",
        ][..],
        &[
            "--log-level",
            "idem=loud",
            "records",
            "stale",
            "--store",
            "memory:",
        ][..],
        &[
            "serve",
            "--upstream",
            "http://127.0.0.1:1",
            "--log-level",
            "",
        ][..],
    ] {
        let (code, out, err) = idem(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("--log-"), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    // RUST_LOG is shared with other tools: any EnvFilter syntax is taken
    // (a bare word is a target), but a directive that does not parse is not.
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["records", "stale", "--store", "memory:"])
        .env_remove("IDEM_LOG_FORMAT")
        .env("RUST_LOG", "myapp")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "RUST_LOG=myapp");
    for (var, value) in [("RUST_LOG", "idem=loud"), ("IDEM_LOG_FORMAT", "yaml")] {
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["records", "stale", "--store", "memory:"])
            .env_remove("RUST_LOG")
            .env_remove("IDEM_LOG_FORMAT")
            .env(var, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{var}: {err}");
    }
    // Debug logging on: stdout still holds only the command's output.
    let (code, out, err) = idem(&[
        "records",
        "stale",
        "--store",
        "memory:",
        "--log-level",
        "trace",
        "--log-format",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0 stale records"), "{out}");
    assert!(!out.contains("timestamp"), "a log line on stdout: {out}");
    json_lines(&err);
}

/// A command that fails writes its error lines in the log's format: with
/// `--log-format json`, each is a JSON object like the log's own, and a
/// filter of `off` does not swallow the reason the command failed.
#[test]
fn error_lines_follow_the_log_format() {
    let bad = [
        "check-config",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "memory:",
        "--ttl",
        "3000000d",
        "--listen",
        "nowhere",
    ];
    for level in ["info", "off"] {
        let mut args = bad.to_vec();
        args.extend(["--log-format", "json", "--log-level", level]);
        let (code, out, err) = idem(&args);
        assert_eq!(code, 2, "{level}: {err}");
        assert!(out.is_empty(), "{out}");
        let events = json_lines(&err);
        assert_eq!(events.len(), 2, "one object per problem: {err}");
        for e in &events {
            assert_eq!(e["level"], "ERROR", "{err}");
            assert_eq!(e["target"], "idem", "{err}");
            assert!(
                e["timestamp"].as_str().is_some_and(|t| t.len() > 10),
                "{err}"
            );
        }
        assert!(
            events
                .iter()
                .any(|e| e["message"].as_str().unwrap().contains("ttl")),
            "{err}"
        );
    }
    // A bad --log-level under json: the format is known, so the line is
    // JSON too.
    let (code, _, err) = idem(&[
        "--log-format",
        "json",
        "--log-level",
        "loud",
        "records",
        "stale",
        "--store",
        "memory:",
    ]);
    assert_eq!(code, 2, "{err}");
    let events = json_lines(&err);
    assert_eq!(events.len(), 1, "{err}");
    assert!(
        events[0]["message"]
            .as_str()
            .unwrap()
            .contains("--log-level"),
        "{err}"
    );
    // As text: the same problems, one `idem:` line each.
    let (code, _, err) = idem(&bad);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("idem: ")).count(),
        2,
        "{err}"
    );
}

/// W3C trace context from the client reaches the upstream unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_passes_through_unchanged() {
    let (_up, up) = upstream();
    let g = logged_gateway(&up, &[], &[]).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    let seen: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/echo", g.base))
        .header("idempotency-key", key("trace"))
        .header("traceparent", traceparent)
        .header("tracestate", tracestate)
        .body("{}")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["traceparent"], traceparent, "{seen}");
    assert_eq!(seen["tracestate"], tracestate, "{seen}");
    g.stop().await;
}
