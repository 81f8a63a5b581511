//! The operator's side of `idem` (issue 13): `--key-header`, `idem
//! check-config`, where `records get` takes its credential from, and the
//! exit codes of every command (0 success, 1 runtime failure, 2 usage or
//! configuration error, 3 not found).
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use support::{config, gateway, idem, upstream};

/// The child half: serves the counting upstream until killed.
#[test]
#[ignore = "child process of the gateway tests; run by them"]
fn upstream_child() {
    support::upstream_child_main();
}

fn key(tag: &str) -> String {
    format!("op-{tag}-{}-0000000", std::process::id())
}

/// Runs `idem` with `env` set and `stdin` written to its standard input;
/// returns (exit code, stdout, stderr).
fn idem_with(args: &[&str], env: &[(&str, &str)], stdin: &str) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args(args)
        .env_remove("IDEM_CONFIG")
        .env_remove("IDEM_CREDENTIAL")
        .env_remove("IDEM_KEY_HEADER")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // The child may exit without reading (a refused command): ignore EPIPE.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// --key-header

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_header_dedupes_and_reaches_the_upstream_unchanged() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &["--key-header", "X-Request-Key"]).await;
    let c = reqwest::Client::new();
    let k = key("xrk");
    // /echo answers with the headers the upstream received. The client
    // names the key header in Connection, trying to strip it upstream.
    let send = |idempotency_key: String| {
        c.post(format!("{}/echo", g.base))
            .header("x-request-key", &k)
            .header("idempotency-key", idempotency_key)
            .header("connection", "x-request-key")
            .header("content-type", "application/json")
            .body("{}")
            .send()
    };
    let first = send(key("ignored-1")).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert!(first.headers().get("idempotency-key-expires").is_some());
    let seen: serde_json::Value = first.json().await.unwrap();
    assert_eq!(
        seen["x-request-key"],
        k.as_str(),
        "the key reaches the upstream: {seen}"
    );
    assert_eq!(
        seen["idempotency-key"],
        key("ignored-1").as_str(),
        "Idempotency-Key is an ordinary header here, forwarded as sent: {seen}"
    );

    // Same X-Request-Key, another Idempotency-Key: still a replay of the
    // first answer.
    let again = send(key("ignored-2")).await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let replayed: serde_json::Value = again.json().await.unwrap();
    assert_eq!(replayed, seen);

    // Idempotency-Key alone is no key: 400, naming the header to send.
    let without = c
        .post(format!("{}/echo", g.base))
        .header("idempotency-key", key("alone"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(without.status(), 400);
    let problem: serde_json::Value = without.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:missing-key");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("X-Request-Key"),
        "{problem}"
    );
}

#[test]
fn a_key_header_that_cannot_carry_a_key_is_refused() {
    for (name, extra, says) in [
        ("not a header", &[][..], "not a header name"),
        ("Connection", &[][..], "hop-by-hop"),
        ("Keep-Alive", &[][..], "hop-by-hop"),
        ("Authorization", &[][..], "Authorization"),
        ("X-Forwarded-For", &[][..], "rewrites"),
        (
            "X-Tenant",
            &["--tenant-header", "x-tenant"][..],
            "tenant-header",
        ),
        ("X-User", &["--scope-header", "x-user"][..], "scope-header"),
    ] {
        for command in ["serve", "check-config"] {
            let mut args = vec![
                command,
                "--upstream",
                "http://127.0.0.1:1",
                "--store",
                "memory:",
                "--key-header",
                name,
            ];
            args.extend_from_slice(extra);
            let (code, out, err) = idem(&args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains("--key-header") && err.contains(says),
                "{args:?}: {err}"
            );
            assert!(out.is_empty(), "{args:?}: {out}");
        }
    }
    // From the environment and from the file, the same.
    let (code, _, err) = idem_with(
        &["check-config", "--upstream", "http://127.0.0.1:1"],
        &[("IDEM_KEY_HEADER", "upgrade")],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("hop-by-hop"), "{err}");
    let (_dir, file) = config("upstream = \"http://127.0.0.1:1\"\nkey_header = \"te\"\n");
    let (code, _, err) = idem(&["check-config", "--config", &file]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("hop-by-hop"), "{err}");
}

// check-config

#[test]
fn check_config_prints_the_effective_settings() {
    let (_dir, file) = config(
        r#"
upstream = "http://127.0.0.1:3000"
store = "postgres://idem:s3cret-pw@db.internal/idem"
ttl = "2h"
upstream_idle_timeout = "4s"
[[route]]
method = "POST"
path = "/accounts/{id}/transfers"
fingerprint_fields = ["/amount"]
"#,
    );
    // A flag wins over the file, the environment is read too.
    let (code, out, err) = idem_with(
        &["check-config", "--config", &file, "--lease", "45s"],
        &[("IDEM_KEY_HEADER", "X-Request-Key"), ("IDEM_WAIT", "5s")],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "{err}");
    for line in [
        "upstream = \"http://127.0.0.1:3000/\"",
        "store = \"postgres://idem:***@db.internal/idem\"",
        "key_header = \"x-request-key\"",
        "ttl = \"2h\"",
        "lease = \"45s\"",
        "wait = \"5s\"",
        "max_body = \"1MiB\"",
        "upstream_idle_timeout = \"4s\"",
        "upstream_timeout = \"25s\"",
        "store_migration_lock_wait = \"1s\"",
        "listen = \"127.0.0.1:8080\"",
        "[[route]]",
        "path = \"/accounts/{id}/transfers\"",
        "fingerprint_fields = [\"/amount\"]",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "{line:?} missing in:\n{out}"
        );
    }
    assert!(!out.contains("s3cret"), "{out}");

    // The output is itself a config file giving the same settings.
    let (_dir2, again) = config(&out.replace("***", "pw"));
    let (code, out2, err) = idem(&["check-config", "--config", &again]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out2, out);

    // Nothing was opened: a store and an upstream nobody could reach pass.
    let (code, _, err) = idem(&[
        "check-config",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "postgres://postgres@127.0.0.1:1/none",
        "--listen",
        "203.0.113.1:80",
    ]);
    assert_eq!(code, 0, "{err}");
}

/// `--store-migration-lock-wait`: shown and read back for the stores
/// that migrate a schema on a server, refused out of its bounds and for
/// any other store.
#[test]
fn the_migration_lock_wait_is_for_server_schemas_and_bounded() {
    let pg = "postgres://postgres@127.0.0.1:1/none";
    let my = "mysql://root@127.0.0.1:1/none";
    for store in [pg, my] {
        let (code, out, err) = idem_with(
            &[
                "check-config",
                "--upstream",
                "http://127.0.0.1:1",
                "--store",
                store,
            ],
            &[("IDEM_STORE_MIGRATION_LOCK_WAIT", "250ms")],
            "",
        );
        assert_eq!(code, 0, "{err}");
        assert!(
            out.lines()
                .any(|l| l == "store_migration_lock_wait = \"250ms\""),
            "{out}"
        );
        let (_dir, again) = config(&out);
        let (code, out2, err) = idem(&["check-config", "--config", &again]);
        assert_eq!((code, out2), (0, out), "{err}");
    }
    let (code, out, err) = idem(&[
        "check-config",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "memory:",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("store_migration_lock_wait"), "{out}");
    for (store, wait, says) in [
        (pg, "0s", "--store-migration-lock-wait must be between"),
        (my, "9ms", "--store-migration-lock-wait must be between"),
        (pg, "61s", "--store-migration-lock-wait must be between"),
        (pg, "-1s", "store-migration-lock-wait"),
        (pg, "1 s; DROP", "store-migration-lock-wait"),
        (
            "memory:",
            "1s",
            "--store-migration-lock-wait is for a PostgreSQL or MySQL store; --store is memory:",
        ),
        (
            "sqlite:x.db",
            "1s",
            "--store-migration-lock-wait is for a PostgreSQL or MySQL store",
        ),
        (
            "redis://127.0.0.1:1",
            "1s",
            "--store-migration-lock-wait is for a PostgreSQL or MySQL store",
        ),
    ] {
        let flag = format!("--store-migration-lock-wait={wait}");
        let (code, _, err) = idem(&[
            "serve",
            "--upstream",
            "http://127.0.0.1:1",
            "--store",
            store,
            &flag,
        ]);
        assert_eq!(code, 2, "{store} {wait}: {err}");
        assert!(err.contains(says), "{store} {wait}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn check_config_reports_every_independent_problem_once() {
    let (_dir, file) = config(
        r#"
upstream = "http://127.0.0.1:3000"
ttl = "5y"
max_body = "1GiB"
[[route]]
method = "POST"
path = "/transfers"
key = "sometimes"
[[route]]
methods = ["connect"]
path = "/tunnel"
"#,
    );
    let (code, out, err) = idem(&["check-config", "--config", &file]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    let lines: Vec<&str> = err.trim().lines().collect();
    assert_eq!(lines.len(), 4, "{err}");
    // The gateway refuses CONNECT itself: a rule could only store that.
    assert!(
        lines[3].contains("[[route]] #2 (/tunnel)") && lines[3].contains("CONNECT"),
        "{err}"
    );
    assert!(lines[0].contains("--ttl"), "{err}");
    assert!(lines[1].contains("--max-body"), "{err}");
    assert!(
        lines[2].contains("[[route]] #1 (/transfers)") && lines[2].contains("key"),
        "{err}"
    );
    assert!(lines.iter().all(|l| l.starts_with("idem: ")), "{err}");

    // serve refuses to start with the same lines.
    let (code, _, serve_err) = idem(&["serve", "--config", &file, "--store", "memory:"]);
    assert_eq!(code, 2);
    assert_eq!(serve_err, err);

    // A problem that follows from another is not reported again: a bad
    // --upstream-timeout is not also compared with the lease, and a route
    // inheriting a refused --ttl does not repeat it.
    let (_dir, file) = config(
        "upstream = \"http://127.0.0.1:3000\"\nttl = \"400d\"\nupstream_timeout = \"2h\"\n\
         [[route]]\nmethod = \"POST\"\npath = \"/a\"\n",
    );
    let (code, _, err) = idem(&["check-config", "--config", &file]);
    assert_eq!(code, 2);
    assert_eq!(err.trim().lines().count(), 2, "{err}");

    // A file that does not parse is one line, whatever toml says.
    let (_dir, file) = config("upstream = \"http://127.0.0.1:3000\"\nttl = \n");
    let (code, _, err) = idem(&["check-config", "--config", &file]);
    assert_eq!(code, 2);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("line 2"), "{err}");
}

// records get: the credential

#[test]
fn a_credential_in_the_arguments_is_refused() {
    for args in [
        &[
            "records",
            "get",
            "some-key-0123456789",
            "--store",
            "memory:",
            "--credential",
            "Bearer s3cret",
        ][..],
        &[
            "records",
            "get",
            "some-key-0123456789",
            "--store",
            "memory:",
            "--credential=Bearer s3cret",
        ][..],
        &[
            "records",
            "get",
            "some-key-0123456789",
            "--store",
            "memory:",
            "--credential",
        ][..],
    ] {
        let (code, out, err) = idem(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("IDEM_CREDENTIAL") && err.contains("--credential-stdin"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("s3cret") && !out.contains("s3cret"), "{err}");
    }
    // Typed unquoted, the credential's second word is an argument nothing
    // takes: clap refuses it, and the error line must not show it.
    for args in [
        &[
            "records",
            "get",
            "some-key-0123456789",
            "--store",
            "memory:",
            "--credential",
            "Bearer",
            "s3cret",
        ][..],
        &["records", "get", "some-key-0123456789", "s3cret"][..],
        &["records", "stale", "--store", "memory:", "--token=s3cret"][..],
    ] {
        let (code, out, err) = idem(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(!err.contains("s3cret") && !out.contains("s3cret"), "{err}");
    }
    // A mistyped flag is still named, so the operator can fix it.
    let (code, _, err) = idem(&["records", "stale", "--stor", "memory:"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("'--stor'"), "{err}");
    // Whatever kind of refusal quotes it (a value for a flag that takes
    // none, an invalid or unvalidated value, an unknown subcommand), a
    // typed value never reaches the error line, nor do its control
    // characters; the flag is still named.
    let get = [
        "records",
        "get",
        "some-key-0123456789",
        "--store",
        "memory:",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            [&get[..], &["--credential-stdin=Bearer s3cret"]].concat(),
            "--credential-stdin",
        ),
        (
            [&get[..], &["--credential-stdin=s3cret"]].concat(),
            "--credential-stdin",
        ),
        (
            [&get[..], &["--credential-stdin=\x1b[31ms3cret"]].concat(),
            "--credential-stdin",
        ),
        (vec!["serve", "--require-scope=s3cret"], "--require-scope"),
        (vec!["records", "Bearer", "s3cret"], "subcommand"),
        (vec!["s3cret"], "subcommand"),
        (
            vec![
                "--log-format",
                "s3cret",
                "records",
                "stale",
                "--store",
                "memory:",
            ],
            "--log-format",
        ),
        (
            vec![
                "records", "stale", "--store", "memory:", "--limit", "s3cret",
            ],
            "--limit",
        ),
        (
            vec!["serve", "--max-connections=s3cret"],
            "--max-connections",
        ),
        (vec!["demo", "--clients", "s3cret"], "--clients"),
    ];
    for (args, names) in &cases {
        let (code, out, err) = idem(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
        assert!(
            !err.contains("s3cret") && !out.contains("s3cret"),
            "{args:?}: {err}"
        );
        assert!(
            !err.trim_end().chars().any(char::is_control),
            "{args:?}: {err:?}"
        );
    }
    // clap lists missing arguments after its first line: they are named.
    let (code, _, err) = idem(&["records", "get", "--credential-stdin"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--store") || err.contains("<KEY>"), "{err}");
}

/// Help shows which variable a flag reads, never the value it holds.
#[test]
fn help_never_shows_a_password_from_the_environment() {
    let env = [
        ("IDEM_STORE", "postgres://u:s3cret-pw@h/db"),
        ("IDEM_UPSTREAM", "http://svc:s3cret-pw@h:1"),
    ];
    for args in [
        &["serve", "--help"][..],
        &["check-config", "--help"][..],
        &["records", "get", "--help"][..],
        &["records", "stale", "--help"][..],
        &["records", "purge", "--help"][..],
    ] {
        let (code, out, err) = idem_with(args, &env, "");
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains("IDEM_STORE"), "{args:?}: {out}");
        assert!(!out.contains("s3cret"), "{args:?}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_get_takes_the_credential_from_the_environment_or_stdin() {
    let (_up, up) = upstream();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("gw.db").display());
    let g = gateway(&up, &store, &[]).await;
    let k = key("cred");
    let r = reqwest::Client::new()
        .post(format!("{}/orders", g.base))
        .header("idempotency-key", &k)
        .header("authorization", "Bearer owner")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    drop(g); // SQLite: one writer at a time

    let get = ["records", "get", k.as_str(), "--store", store.as_str()];
    let (code, out, err) = idem_with(&get, &[("IDEM_CREDENTIAL", "Bearer owner")], "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"POST /orders\""), "{out}");

    let mut from_stdin = get.to_vec();
    from_stdin.push("--credential-stdin");
    for line in ["Bearer owner\n", "Bearer owner\r\n", "Bearer owner"] {
        let (code, out, err) = idem_with(&from_stdin, &[], line);
        assert_eq!(code, 0, "{line:?}: {err}");
        assert!(out.contains("\"completed\""), "{out}");
    }
    // Another credential's scope holds no such record.
    let (code, _, err) = idem_with(&from_stdin, &[], "Bearer someone-else\n");
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = idem_with(&get, &[("IDEM_CREDENTIAL", "Bearer someone-else")], "");
    assert_eq!(code, 3, "{err}");

    // Two sources of a scope, or an empty one, are refused.
    let (code, _, err) = idem_with(
        &from_stdin,
        &[("IDEM_CREDENTIAL", "Bearer owner")],
        "Bearer owner\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("one way"), "{err}");
    let mut with_tenant = get.to_vec();
    with_tenant.extend(["--tenant", "t1"]);
    let (code, _, err) = idem_with(&with_tenant, &[("IDEM_CREDENTIAL", "Bearer owner")], "");
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = idem_with(&from_stdin, &[], "\n");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("empty"), "{err}");
}

// Exit codes

#[test]
fn exit_codes_follow_one_table() {
    // 2: usage and configuration errors.
    let (code, _, err) = idem(&["serve", "--store", "memory:"]);
    assert_eq!(code, 2, "no upstream: {err}");
    let long = "k".repeat(300);
    let (code, _, err) = idem(&["records", "get", &long, "--store", "memory:"]);
    assert_eq!(code, 2, "invalid key: {err}");
    let (code, _, err) = idem(&[
        "records",
        "purge",
        "--store",
        "memory:",
        "--older-than",
        "soon",
    ]);
    assert_eq!(code, 2, "bad duration: {err}");
    let (code, _, err) = idem(&["records", "stale", "--store", "mongodb://h/db"]);
    assert_eq!(code, 2, "unknown store: {err}");
    let (code, _, err) = idem(&["demo", "--clients", "0"]);
    assert_eq!(code, 2, "demo flags: {err}");
    let (code, _, err) = idem(&["no-such-command"]);
    assert_eq!(code, 2, "{err}");

    // 3: records get finds nothing.
    let (code, out, err) = idem(&[
        "records",
        "get",
        "absent-key-0123456789",
        "--store",
        "memory:",
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(out.is_empty() && err.contains("no live record"), "{err}");
    let (code, _, err) = idem(&[
        "records",
        "get",
        "absent-key-0123456789",
        "--store",
        "memory:",
        "--path",
        "/orders",
    ]);
    assert_eq!(code, 3, "{err}");

    // 1: runtime failures: a store that cannot be reached, a port in use.
    let unreachable = "postgres://postgres@127.0.0.1:1/none";
    for args in [
        &["records", "stale", "--store", unreachable][..],
        &[
            "records",
            "get",
            "some-key-0123456789",
            "--store",
            unreachable,
        ][..],
        &["records", "purge", "--store", unreachable][..],
        &[
            "serve",
            "--upstream",
            "http://127.0.0.1:1",
            "--store",
            unreachable,
        ][..],
    ] {
        let (code, _, err) = idem(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("cannot reach store"), "{args:?}: {err}");
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = listener.local_addr().unwrap().to_string();
    let admin = format!("127.0.0.1:{}", support::free_port());
    let (code, _, err) = idem(&[
        "serve",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "memory:",
        "--listen",
        &taken,
        "--admin-listen",
        &admin,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot listen"), "{err}");

    // 0: check-config of a valid configuration.
    let (code, _, err) = idem(&["check-config", "--upstream", "http://127.0.0.1:1"]);
    assert_eq!(code, 0, "{err}");
}

/// Passwords in store and upstream URLs never reach the output, whatever
/// odd place they sit in; an upstream with user information is refused.
#[test]
fn passwords_in_urls_never_reach_the_output() {
    for store in [
        "postgres://u:s3?cret@h/db",
        "postgres://u:s3/cret@h/db",
        "postgres://h/db?%70assword=s3cret",
        "redis://s3cret@h:6379",
    ] {
        let (code, out, err) = idem(&[
            "check-config",
            "--upstream",
            "http://127.0.0.1:1",
            "--store",
            store,
        ]);
        assert_eq!(code, 0, "{store}: {err}");
        assert!(
            !out.contains("s3cret") && !err.contains("s3cret"),
            "{store}: {out}{err}"
        );
    }
    let (code, out, err) = idem(&["records", "stale", "--store", "host=h password=s3cret"]);
    assert_eq!(code, 2, "{err}");
    assert!(!out.contains("s3cret") && !err.contains("s3cret"), "{err}");
    for upstream in [
        "http://svc:s3cret@h/",
        "http://svc:s3cret@h:99999999/",
        "https://svc:s3cret@h/",
    ] {
        let (code, out, err) = idem(&["check-config", "--upstream", upstream]);
        assert_eq!(code, 2, "{upstream}: {err}");
        assert!(err.contains("--upstream"), "{upstream}: {err}");
        assert!(
            !out.contains("s3cret") && !err.contains("s3cret"),
            "{upstream}: {err}"
        );
    }
}

/// A store URL its driver cannot read is a configuration error found by
/// `check-config` (exit 2), not a runtime failure found at start.
#[test]
fn store_urls_are_checked_as_their_driver_reads_them() {
    for store in [
        "postgres://u:s3cret@h:54x2/db",
        "redis://:s3cret@h:notaport",
    ] {
        let (code, out, err) = idem(&[
            "check-config",
            "--upstream",
            "http://127.0.0.1:1",
            "--store",
            store,
        ]);
        assert_eq!(code, 2, "{store}: {out}{err}");
        assert!(err.contains("store"), "{store}: {err}");
        assert!(
            !out.contains("s3cret") && !err.contains("s3cret"),
            "{store}: {err}"
        );
    }
}

/// `records` never creates a store: a mistyped SQLite path is a usage
/// error, not "no such record"; a set but empty credential is refused
/// rather than read as the anonymous scope.
#[test]
fn records_never_mistake_a_typo_for_an_empty_answer() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo.db");
    let store = format!("sqlite:{}", typo.display());
    for args in [
        vec![
            "records",
            "get",
            "some-key-0123456789",
            "--store",
            store.as_str(),
        ],
        vec!["records", "stale", "--store", store.as_str()],
        vec!["records", "purge", "--store", store.as_str()],
    ] {
        let (code, _, err) = idem(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("no SQLite store"), "{err}");
        assert!(!typo.exists(), "{args:?} created the file");
    }
    let (code, _, err) = idem_with(
        &[
            "records",
            "get",
            "some-key-0123456789",
            "--store",
            "memory:",
        ],
        &[("IDEM_CREDENTIAL", "")],
        "",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("empty"), "{err}");
}
