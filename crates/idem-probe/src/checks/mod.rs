//! The checks, each named after the rule it tests (the idem contract and
//! the IETF draft "The Idempotency-Key HTTP Header Field"). Each sends its
//! own requests with fresh keys; the last two read the whole run.

mod advisory;
mod binding;
mod common;
mod concurrency;
mod failure;
mod replay;

pub(crate) use common::Finding;

use crate::report::Verdict;
use crate::runner::Probe;

/// Runs the check called `name`.
pub(crate) async fn run(name: &str, probe: &Probe) -> Finding {
    match name {
        "key-required" => replay::key_required(probe).await,
        "retry-replays-response" => replay::retry_replays_response(probe).await,
        "replay-marked" => replay::replay_marked(probe),
        "key-bound-to-body" => binding::key_bound_to_body(probe).await,
        "key-bound-to-path" => binding::key_bound_to_path(probe).await,
        "key-bound-to-query" => binding::key_bound_to_query(probe).await,
        "key-scoped-to-credential" => binding::key_scoped_to_credential(probe).await,
        "big-number-precision" => binding::big_number_precision(probe).await,
        "reformatted-json-not-executed-twice" => binding::reformatted_json(probe).await,
        "concurrent-duplicates-execute-once" => concurrency::execute_once(probe).await,
        "in-flight-duplicate-conflicts" => concurrency::in_flight(probe).await,
        "deterministic-failure-replayed" => failure::deterministic_replayed(probe).await,
        "transient-failure-not-stored" => failure::transient_not_stored(probe).await,
        "expiry-advertised" => advisory::expiry_advertised(probe),
        "problem-details" => advisory::problem_details(probe),
        _ => Finding::new(Verdict::NotApplicable, "unknown check"),
    }
}
