//! `idem-ledger --store` reads its URL as every idem command does
//! (`idem_stores`): refused before anything starts, with a message that
//! never shows the password.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::process::Command;

fn refused(store: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_idem-ledger"))
        .args(["--listen", "127.0.0.1:0", "--store", store])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{store}: accepted");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn unknown_and_unsupported_stores_are_refused_without_their_password() {
    let unknown = refused("mongodb://app:s3cret@db/ledger");
    assert!(unknown.contains("unknown store"), "{unknown}");
    assert!(!unknown.contains("s3cret"), "{unknown}");

    // A store idem knows, but the ledger's accounts cannot live in it.
    let memory = refused("memory:");
    assert!(
        memory.contains("the ledger runs on sqlite:PATH"),
        "{memory}"
    );
    assert!(memory.ends_with("not memory:\n"), "{memory}");
    // Redis: not built into the ledger alone, or (in a workspace build
    // that turns idem-stores' redis feature on) not a ledger store.
    let redis = refused("redis://:s3cret@127.0.0.1:1");
    assert!(
        redis.contains("redis stores are not in this build")
            || redis.contains("the ledger runs on sqlite:PATH"),
        "{redis}"
    );
    assert!(!redis.contains("s3cret"), "{redis}");

    let bad_port = refused("postgres://app:s3cret@127.0.0.1:54x2/ledger");
    assert!(bad_port.starts_with("idem-ledger: --store:"), "{bad_port}");
    assert!(!bad_port.contains("s3cret"), "{bad_port}");
}
