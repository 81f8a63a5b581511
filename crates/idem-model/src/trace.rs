//! A path the checker found, as a short trace a person reads: one line per
//! step, the clock in ticks, the record after the step and the effects so
//! far.

use std::fmt::Write as _;

use idem_core::Timestamp;
use stateright::Path;

use crate::action::Action;
use crate::config::TICK_MS;
use crate::state::State;

fn tick(t: Timestamp) -> i64 {
    t.as_millis() / TICK_MS
}

/// The record and the effects, in one line.
fn summary(s: &State) -> String {
    let record = match &s.store.record {
        None => "none".to_owned(),
        Some(r) => {
            let r = &r.0;
            let lease = r
                .lease_until
                .map(|l| format!(" lease<{}", tick(l)))
                .unwrap_or_default();
            format!(
                "{} f{}{lease} exp<{}",
                r.status.as_str(),
                r.fence.get(),
                tick(r.expires_at)
            )
        }
    };
    format!("record {record}; effects {}", s.ghost.effects)
}

fn describe(action: Action) -> String {
    match action {
        Action::Tick => "tick".to_owned(),
        Action::Amnesia => "the store forgets".to_owned(),
        Action::Claim(g) => format!("gw{g} claim"),
        Action::ClaimAnswerLost(g) => format!("gw{g} claim, answer lost"),
        Action::Act(g) => format!("gw{g} effect"),
        Action::Release(g) => format!("gw{g} release"),
        Action::ReleaseFails(g) => format!("gw{g} release fails"),
        Action::Heartbeat(g) => format!("gw{g} heartbeat"),
        Action::Complete(g) => format!("gw{g} complete"),
        Action::CompleteFails(g) => format!("gw{g} complete fails"),
        Action::HeldStored(g) => format!("gw{g} held completion stored"),
        Action::HeldBeat(g) => format!("gw{g} held completion fails, lease renewed"),
        Action::HeldExpired(g) => format!("gw{g} held completion expired"),
        Action::Crash(g) => format!("gw{g} crashes"),
    }
}

/// `path` as a trace: `t=0 gw0 claim -> record in_progress f1 lease<2
/// exp<6; effects 0`, one line per step.
pub fn trace(path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut out = String::new();
    for pair in steps.windows(2) {
        let [(before, Some(action)), (after, _)] = pair else {
            continue;
        };
        let what = describe(*action);
        let _ = writeln!(out, "t={} {what:<44} -> {}", before.now, summary(after));
    }
    out
}
