//! Route patterns from the config file, matched against request paths.
//!
//! The check lives in `fuzz/checks/route_pattern.rs`, which the crate's
//! `tests/fuzz_regressions.rs` also runs on every file in
//! `fuzz/regressions/route_pattern/`.
#![no_main]

#[path = "../checks/route_pattern.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
