//! `Key::parse` with the default policy, with and without a credential.
//!
//! The check lives in `fuzz/checks/key.rs`, which the crate's
//! `tests/fuzz_regressions.rs` also runs on every file in
//! `fuzz/regressions/key/`.
#![no_main]

#[path = "../checks/key.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
