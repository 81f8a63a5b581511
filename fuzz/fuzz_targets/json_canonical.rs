//! JSON canonicalization and the fingerprint (version 2) of JSON bodies.
//!
//! The check lives in `fuzz/checks/json_canonical.rs`, which the crate's
//! `tests/fuzz_regressions.rs` also runs on every file in
//! `fuzz/regressions/json_canonical/`.
#![no_main]

#[path = "../checks/json_canonical.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
