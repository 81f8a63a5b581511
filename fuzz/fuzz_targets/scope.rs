//! Scope derivation from request headers, as the layer does it.
//!
//! The check lives in `fuzz/checks/scope.rs`, which the crate's
//! `tests/fuzz_regressions.rs` also runs on every file in
//! `fuzz/regressions/scope/`.
#![no_main]

#[path = "../checks/scope.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
