//! Fuzz findings kept as tests, for the parsers this crate owns: scope
//! derivation from request headers (`fuzz/fuzz_targets/scope.rs`) and route
//! patterns (`fuzz/fuzz_targets/route_pattern.rs`).
//!
//! Each fuzz target's check is one function in `fuzz/checks/`, compiled
//! here too: every file in `fuzz/regressions/<target>/` (an input that once
//! failed, as its exact bytes) and in `fuzz/corpus/<target>/` (the seeds)
//! goes through the very code `cargo fuzz` runs, so a crash found later is
//! kept by dropping its file into the target's `regressions/` directory.
//! No run of these two targets has found one yet.

#[path = "../../../fuzz/checks/inputs.rs"]
mod inputs;
#[path = "../../../fuzz/checks/route_pattern.rs"]
mod route_pattern;
#[path = "../../../fuzz/checks/scope.rs"]
mod scope;

#[test]
fn scope_regressions_pass_the_fuzz_check() {
    inputs::run_all("regressions", "scope", scope::check);
}

#[test]
fn scope_seeds_pass_the_fuzz_check() {
    assert!(inputs::run_all("corpus", "scope", scope::check) > 0);
}

#[test]
fn route_pattern_regressions_pass_the_fuzz_check() {
    inputs::run_all("regressions", "route_pattern", route_pattern::check);
}

#[test]
fn route_pattern_seeds_pass_the_fuzz_check() {
    assert!(inputs::run_all("corpus", "route_pattern", route_pattern::check) > 0);
}
