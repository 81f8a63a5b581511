//! What every reachable state must have (`always`), and what some state
//! must reach (`sometimes`, so that a passing check is not a vacuous one).

use idem_core::Status;
use stateright::{Model, Property};

use crate::state::State;

/// Every property the checker evaluates, for any model over [`State`] (the
/// protocol model's; generic so that this module does not name it).
pub(crate) fn all<M: Model<State = State>>() -> Vec<Property<M>> {
    vec![
        Property::always(NO_DOUBLE_EXECUTION, |_: &M, s: &State| {
            s.ghost.duplicates == 0
        }),
        Property::always(NO_OVERLAP, |_: &M, s: &State| {
            s.gateways.iter().filter(|g| g.executing.is_some()).count() <= 1
        }),
        Property::always(FENCED, |_: &M, s: &State| s.ghost.misfenced == 0),
        Property::always(REPLAY_FOLLOWS_EFFECT, |_: &M, s: &State| {
            !s.ghost.replayed || s.ghost.effects >= 1
        }),
        Property::sometimes(COMPLETED, |_: &M, s: &State| {
            s.store
                .record
                .as_ref()
                .is_some_and(|r| r.0.status == Status::Completed)
        }),
        Property::sometimes(REPLAYED, |_: &M, s: &State| s.ghost.replayed),
        Property::sometimes(TAKEN_OVER, |_: &M, s: &State| s.ghost.took_over),
        Property::sometimes(LATE_COMPLETION_FENCED_OUT, |_: &M, s: &State| {
            s.ghost.late_completion_refused
        }),
    ]
}

/// `always`: no effect happens while an earlier effect's record is live
/// (by its ttl). With a ttl past the horizon: at most one effect.
pub const NO_DOUBLE_EXECUTION: &str = "no key executes twice";
/// `always`: at most one execution is in progress at a time.
pub const NO_OVERLAP: &str = "no execution beside live work";
/// `always`: the store never applies a finish or heartbeat for a claim
/// other than the record's current one.
pub const FENCED: &str = "a stale claim never settles";
/// `always`: a replay answers an effect that happened.
pub const REPLAY_FOLLOWS_EFFECT: &str = "a replay follows an effect";
/// `sometimes`: the record completes (the model is not vacuous).
pub const COMPLETED: &str = "the operation completes";
/// `sometimes`: a client gets a replay.
pub const REPLAYED: &str = "a retry is replayed";
/// `sometimes`: a claim takes over an abandoned one.
pub const TAKEN_OVER: &str = "a claim is taken over";
/// `sometimes`: a held takeover makes the store refuse the late
/// completion of the only effect (safe; the answer is lost and the key
/// stays held for an operator).
pub const LATE_COMPLETION_FENCED_OUT: &str = "a late completion is fenced out";
