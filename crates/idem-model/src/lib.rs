//! A model of idem's protocol for one key (claim, execute, complete,
//! release, takeover, fencing, expiry, the lease heartbeat and the
//! pending-completion retry) with gateway crashes, store stalls and store
//! amnesia as actions, checked exhaustively with
//! [Stateright](https://docs.rs/stateright) (issue 36, item 5).
//!
//! ```
//! use idem_model::{Config, NO_DOUBLE_EXECUTION, check};
//!
//! // The shipped policy (`hold`, heartbeat, pending retry) under crashes
//! // and stalls longer than the lease, on a short clock.
//! let checked = check(Config { horizon: 3, ..Config::safe() }, 1);
//! assert!(checked.counterexample(NO_DOUBLE_EXECUTION).is_none());
//! assert!(checked.unique_states > 100);
//! ```
//!
//! # What it is for
//!
//! To show, for every interleaving within its bounds, that no key executes
//! twice under the safe settings, and to find the shortest run that
//! executes a key twice under the unsafe ones. The store's decisions are
//! idem-core's own functions ([`idem_core::transition::claim`],
//! [`may_finish`](idem_core::transition::may_finish),
//! [`extend_lease`](idem_core::transition::extend_lease),
//! [`complete`](idem_core::transition::complete)) applied to idem-core's
//! [`Record`](idem_core::Record): a change to the state machine changes
//! the model, and a field added to `Record` fails to compile here until
//! the model hashes it. The executor's side (claim, then execute with a
//! heartbeat, then complete, held and retried when the store fails) is
//! written here after `idem-http`'s `flow/` and `pending.rs`, and has to
//! be kept in step with them by hand.
//!
//! # What it is not for
//!
//! It does not test a store: the backends that decide in SQL or Lua are
//! held to the same state machine by the conformance suite
//! (`idem-testkit`), not by this model. It has no real time: leases,
//! ttls and backoff are whole ticks, and a heartbeat is assumed to land
//! before its lease ends unless the store stalls for longer than a lease
//! ([`Stalls`]), so it cannot find a lease too short for the heartbeat's
//! own timing. It models one key with one set of parameters (no
//! mismatches) and assumes that an operation which fails transiently
//! (5xx) did not act. Under `announce`, the upstream is the weakest one
//! the contract allows: it refuses an announced takeover whose effect
//! already happened and runs every other request (an upstream that
//! deduplicates every request by its key makes every policy safe, and
//! needs no announcement). It is not published and nothing links it.
//!
//! # The model
//!
//! The state is the store (the record and the fence counter), each
//! gateway's request in progress and held completion, the clock, and
//! ghost variables only the model sees: how many effects happened, who
//! holds the record's current claim. The actions are in [`Action`]; the
//! properties are [`NO_DOUBLE_EXECUTION`], [`NO_OVERLAP`], [`FENCED`] and
//! [`REPLAY_FOLLOWS_EFFECT`] (`always`), and [`COMPLETED`], [`REPLAYED`],
//! [`TAKEN_OVER`] and [`LATE_COMPLETION_FENCED_OUT`] (`sometimes`, so that
//! a passing check is not a vacuous one). `tests/protocol.rs` runs the
//! bounded checks in CI and `bench/model.sh` the deeper ones; the state
//! counts and the counterexamples are in docs/decisions.md, *The protocol
//! model (issue 36)*.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path};

mod action;
mod config;
mod model;
mod properties;
mod scenario;
mod state;
mod trace;

pub use action::Action;
pub use config::{Amnesia, Config, Faults, Stalls};
pub use model::ProtocolModel;
pub use properties::{
    COMPLETED, FENCED, LATE_COMPLETION_FENCED_OUT, NO_DOUBLE_EXECUTION, NO_OVERLAP,
    REPLAY_FOLLOWS_EFFECT, REPLAYED, TAKEN_OVER,
};
pub use scenario::{Scenario, scenarios};
pub use state::{Claimant, Execution, Gateway, Ghost, Held, State, Store, StoredRecord};
pub use trace::trace;

/// What a check explored and found.
#[derive(Debug)]
pub struct Checked {
    /// Distinct states reached.
    pub unique_states: usize,
    /// States generated, repeats included.
    pub states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// Whether every reachable state was explored (false when [`find`]
    /// stopped at what it looked for).
    pub exhaustive: bool,
    discoveries: HashMap<&'static str, Path<State, Action>>,
}

impl Checked {
    /// The shortest path that breaks the `always` property `name`, as a
    /// [`trace`]; `None` if the check found none.
    pub fn counterexample(&self, name: &str) -> Option<String> {
        self.discoveries.get(name).map(trace)
    }

    /// A path that reaches the `sometimes` property `name`, as a
    /// [`trace`]; `None` if the check reached none.
    pub fn example(&self, name: &str) -> Option<String> {
        self.counterexample(name)
    }

    /// The names of the properties with a discovery (a counterexample to
    /// an `always`, an example of a `sometimes`).
    pub fn discovered(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.discoveries.keys().copied().collect();
        names.sort_unstable();
        names
    }
}

/// One breadth-first search of `config`, down to `depth` states from the
/// initial one if given, stopping at the first discovery of `stop_at` if
/// given.
fn run(
    config: Config,
    threads: usize,
    stop_at: Option<&'static str>,
    depth: Option<usize>,
) -> Checked {
    let started = Instant::now();
    // A name no property has: the search never stops early.
    let until = stop_at.unwrap_or("(exhaustive)");
    let mut builder = ProtocolModel::new(config)
        .checker()
        .threads(threads.max(1))
        .finish_when(HasDiscoveries::AnyOf([until].into_iter().collect()));
    if let Some(depth) = depth {
        builder = builder.target_max_depth(depth);
    }
    let checker = builder.spawn_bfs().join();
    let discoveries = checker.discoveries();
    Checked {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed: started.elapsed(),
        // No state was cut off at the depth bound, and no discovery
        // stopped the search.
        exhaustive: depth.is_none_or(|d| checker.max_depth() < d)
            && !discoveries.contains_key(until),
        discoveries,
    }
}

/// Explores every state of `config` breadth first (on `threads` threads),
/// whatever it finds.
pub fn check(config: Config, threads: usize) -> Checked {
    run(config, threads, None, None)
}

/// Looks for a discovery of `property` in `config`, breadth first with a
/// depth bound raised one step at a time, so that the path found is a
/// shortest one (Stateright's search keeps the last discovery of a block
/// of states, not the first). Stops at the first depth that has one, or
/// once the whole state space has been explored without one.
pub fn find(config: Config, property: &'static str, threads: usize) -> Checked {
    let started = Instant::now();
    for depth in 2.. {
        let mut checked = run(config, threads, Some(property), Some(depth));
        if checked.discoveries.contains_key(property) || checked.exhaustive {
            checked.elapsed = started.elapsed();
            return checked;
        }
    }
    unreachable!("the state space is finite")
}
