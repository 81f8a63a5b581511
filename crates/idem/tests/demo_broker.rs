//! `idem demo --broker`: the ledger fed through a real broker (NATS
//! JetStream, RabbitMQ) with duplicates published on purpose and the
//! consumer process killed with SIGKILL five times mid-stream (after an
//! effect committed and before its ack, and in the middle of a batch), on
//! SQLite and PostgreSQL in atomic mode. The demo checks every transfer
//! once, none lost, money conserved, nothing left unacknowledged, and
//! exits 0 only then; the test also reads its report.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::process::Command;

/// The brokers whose URLs are set (under `CI=true` both must be).
fn brokers() -> Vec<String> {
    [
        ("IDEM_TEST_NATS_URL", "NATS"),
        ("IDEM_TEST_AMQP_URL", "RabbitMQ"),
    ]
    .into_iter()
    .filter_map(|(var, what)| idem_testkit::backend_url(var, what))
    .collect()
}

/// Runs the demo; returns its exit code and report.
fn demo(broker: &str, store: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args([
        "demo",
        "--broker",
        broker,
        "--intents",
        "10000",
        "--kills",
        "5",
        "--seed",
        "7",
    ])
    .env("RUST_LOG", "warn");
    if let Some(store) = store {
        cmd.args(["--store", store]);
    }
    let out = cmd.output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.code().unwrap_or(-1), report)
}

fn check(broker: &str, store: Option<&str>) {
    let (code, report) = demo(broker, store);
    let what = format!("{broker} on {}", store.unwrap_or("SQLite"));
    assert_eq!(code, 0, "{what}:\n{report}");
    for line in [
        "consumer SIGKILLs       5",
        "applied twice           0",
        "unacknowledged at end   0",
        "OK: every message applied once, none lost, money conserved",
    ] {
        assert!(report.contains(line), "{what}: {line:?} in\n{report}");
    }
    // Duplicates were published, so idem (not the broker) deduplicated.
    let published = report
        .lines()
        .find(|l| l.contains("messages published"))
        .unwrap();
    assert!(!published.contains("(0 duplicates"), "{published}");
}

#[test]
fn every_message_applied_once_through_sigkills_on_sqlite() {
    for broker in brokers() {
        check(&broker, None);
    }
}

#[test]
fn every_message_applied_once_through_sigkills_on_postgres() {
    let Some(pg) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    for broker in brokers() {
        check(&broker, Some(&pg));
    }
}

/// `--bench` (bench/consumer.sh) runs each of its rows to the end on every
/// broker: a row that lost a message would never finish.
#[test]
fn the_consumer_bench_runs_every_row() {
    for broker in brokers() {
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["demo", "--broker", &broker, "--bench", "--intents", "200"])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{broker}: {report}");
        for row in [
            "own transaction, no idem",
            "idem atomic mode",
            "own transaction, batch together",
            "one commit, batch together",
        ] {
            assert!(report.contains(row), "{broker}: {row} in {report}");
        }
    }
}
