//! The bounded checks CI runs (`Config::safe()` size): the safe settings
//! keep every key to one execution in every reachable state, and each
//! unsafe one has a counterexample, printed (`cargo test -p idem-model --
//! --nocapture`). The deeper run is `bench/model.sh`; its state counts are
//! in docs/decisions.md, *The protocol model (issue 36)*.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use idem_model::{
    COMPLETED, Config, LATE_COMPLETION_FENCED_OUT, REPLAYED, Scenario, TAKEN_OVER, check, find,
    scenarios,
};

fn scenario(name: &str) -> Scenario {
    scenarios(Config::safe())
        .into_iter()
        .find(|s| s.name.starts_with(name))
        .unwrap_or_else(|| panic!("no scenario {name:?}"))
}

/// Checks a safe scenario exhaustively: every `always` property it
/// promises holds. Answers the number of distinct states.
fn holds(name: &str) -> usize {
    let s = scenario(name);
    assert!(s.breaks.is_none(), "{name} is not a safe scenario");
    let checked = check(s.config, 1);
    println!(
        "{}: {} unique states, {} generated, depth {}, {:?}",
        s.name, checked.unique_states, checked.states, checked.max_depth, checked.elapsed
    );
    assert!(checked.exhaustive);
    for property in s.holds {
        if let Some(trace) = checked.counterexample(property) {
            panic!("{}: {property:?} broken:\n{trace}", s.name);
        }
    }
    checked.unique_states
}

/// Finds the shortest counterexample of an unsafe scenario, prints it and
/// answers it.
fn breaks(name: &str) -> String {
    let s = scenario(name);
    let property = s.breaks.unwrap();
    let checked = find(s.config, property, 1);
    let trace = checked
        .counterexample(property)
        .unwrap_or_else(|| panic!("{}: no counterexample to {property:?}", s.name));
    println!("{}: counterexample to {property:?}:\n{trace}", s.name);
    trace
}

/// The distinct states of the default policy's check at CI size. A change
/// here means the protocol (idem-core's transitions) or the model
/// changed: check that the change is meant, then update this number and
/// the table in docs/decisions.md, *The protocol model (issue 36)*.
const DEFAULT_POLICY_STATES: usize = 44_846;

#[test]
fn the_default_policy_never_executes_a_key_twice() {
    let s = scenario("hold (the default)");
    let checked = check(s.config, 1);
    println!(
        "{}: {} unique states, {} generated, depth {}, {:?}",
        s.name, checked.unique_states, checked.states, checked.max_depth, checked.elapsed
    );
    assert!(checked.exhaustive);
    for property in s.holds {
        if let Some(trace) = checked.counterexample(property) {
            panic!("{property:?} broken:\n{trace}");
        }
    }
    // Not vacuous: keys complete, retries replay, claims are taken over,
    // and a held takeover fences out a late completion.
    for property in [COMPLETED, REPLAYED, TAKEN_OVER, LATE_COMPLETION_FENCED_OUT] {
        assert!(checked.example(property).is_some(), "never: {property}");
    }
    let shortest = find(s.config, LATE_COMPLETION_FENCED_OUT, 1);
    println!(
        "{LATE_COMPLETION_FENCED_OUT}:\n{}",
        shortest.example(LATE_COMPLETION_FENCED_OUT).unwrap()
    );
    assert_eq!(checked.unique_states, DEFAULT_POLICY_STATES);
}

#[test]
fn hold_is_safe_without_heartbeat_or_pending_retry() {
    holds("hold without heartbeat");
}

#[test]
fn reexecute_is_safe_without_crashes_or_long_stalls() {
    holds("reexecute: short stalls");
}

#[test]
fn reexecute_after_a_crash_executes_twice() {
    let trace = breaks("reexecute: a gateway crash");
    assert!(trace.contains("crashes"), "{trace}");
}

#[test]
fn reexecute_after_a_stall_past_the_lease_executes_twice() {
    breaks("reexecute: a stall past the lease");
}

#[test]
fn reexecute_without_the_pending_retry_executes_twice() {
    let trace = breaks("reexecute: no pending retry");
    assert!(trace.contains("complete fails"), "{trace}");
}

#[test]
fn reexecute_without_the_heartbeat_executes_twice() {
    breaks("reexecute: no heartbeat");
}

/// An announced takeover that fails transiently keeps its claim (before,
/// it released it, and the next claim ran unannounced: executed twice).
#[test]
fn announce_after_a_crash_and_a_transient_failure_is_safe() {
    holds("announce: a crash");
}

#[test]
fn announce_after_a_stall_past_the_lease_executes_twice() {
    breaks("announce: a stall past the lease");
}

#[test]
fn a_store_that_loses_the_record_executes_twice() {
    let trace = breaks("hold: the store loses the record");
    assert!(trace.contains("the store forgets"), "{trace}");
}

#[test]
fn a_store_that_comes_back_empty_reuses_a_fence() {
    breaks("hold: the store comes back empty");
}

#[test]
fn an_execution_that_outlives_its_ttl_is_not_run_beside() {
    // Before the heartbeat raised the record's expiry with its lease, a
    // fresh claim on the expired record ran beside the live execution.
    holds("hold: an execution outlives its ttl");
}

/// Every scenario, the ones added later included, has its verdict: the
/// safe ones hold everywhere, the unsafe ones have a counterexample.
#[test]
fn every_scenario_has_its_verdict() {
    for s in scenarios(Config::safe()) {
        match s.breaks {
            None => {
                holds(s.name);
            }
            Some(_) => {
                breaks(s.name);
            }
        }
    }
}
