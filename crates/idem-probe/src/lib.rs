//! idem-probe checks an HTTP API's `Idempotency-Key` behaviour from the
//! outside, as a client sees it: point it at a staging endpoint that
//! performs a mutation, and it sends a small, bounded number of requests
//! with fresh random keys and reports, rule by rule, whether retries are
//! replayed, whether keys are bound to the request and the tenant,
//! whether concurrent duplicates execute once, and how failures are kept.
//!
//! What it is not: a load test, a fuzzer, or proof. Each verdict is drawn
//! from the few requests it sent; where nothing it can see tells a replay
//! from a second execution (no `--id-pointer`, `Location` or effect
//! count), it says "could not tell" rather than guess. It performs real
//! mutations: run it against a staging API, never production.
//!
//! The library is the engine of `idem probe` (the `idem-cli` package);
//! another tool can embed it and read the [`Report`].
#![doc = include_str!("../README.md")]
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod budget;
mod catalog;
mod checks;
mod client;
mod detect;
mod error;
mod report;
mod runner;
mod session;
mod target;

pub use catalog::{CHECKS, CheckInfo};
pub use detect::{Answer, Detection, Outcome};
pub use error::{Error, ErrorKind};
pub use report::{CheckResult, Exchange, Report, Verdict};
pub use runner::{MAX_CONCURRENCY, Options, Probe};
pub use target::{
    Header, Redactor, Target, parse_body, parse_credential, parse_header, parse_pointer,
    parse_query, parse_url,
};
