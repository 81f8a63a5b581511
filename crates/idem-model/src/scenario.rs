//! The configurations worth checking, each with what the check must show:
//! the safe settings keep every key to one execution under their faults,
//! the unsafe ones break a named property. Shared by the CI tests and
//! `bench/model.sh`, at two sizes.

use idem_core::Takeover;

use crate::config::{Amnesia, Config, Faults, Stalls};
use crate::properties::{FENCED, NO_DOUBLE_EXECUTION, NO_OVERLAP, REPLAY_FOLLOWS_EFFECT};

/// One configuration and its expected verdict.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// A short name, for reports.
    pub name: &'static str,
    /// What is checked.
    pub config: Config,
    /// The `always` properties that must hold in every reachable state.
    pub holds: &'static [&'static str],
    /// The `always` property that has a counterexample, if any.
    pub breaks: Option<&'static str>,
}

const ALL: &[&str] = &[
    NO_DOUBLE_EXECUTION,
    NO_OVERLAP,
    FENCED,
    REPLAY_FOLLOWS_EFFECT,
];
const NONE: &[&str] = &[];

/// Every scenario, with the bounds (gateways, requests, horizon, lease,
/// crashes) of `size`; each sets its own policy and faults. `size` is
/// [`Config::safe`] for CI and [`Config::deep`] for `bench/model.sh`.
pub fn scenarios(size: Config) -> Vec<Scenario> {
    let crashes = size.faults.crashes;
    let faults = |crashes, stalls, amnesia| Faults {
        crashes,
        stalls,
        amnesia,
    };
    let with = |takeover, heartbeat, pending_retry, faults| Config {
        takeover,
        heartbeat,
        pending_retry,
        faults,
        ..size
    };
    let safe = with(
        Takeover::Hold,
        true,
        true,
        faults(crashes, Stalls::Long, Amnesia::Never),
    );
    vec![
        Scenario {
            name: "hold (the default): crashes, stalls past the lease",
            config: safe,
            holds: ALL,
            breaks: None,
        },
        Scenario {
            name: "hold without heartbeat or pending retry",
            config: with(
                Takeover::Hold,
                false,
                false,
                faults(crashes, Stalls::Long, Amnesia::Never),
            ),
            holds: ALL,
            breaks: None,
        },
        Scenario {
            name: "announce: a crash, then a transient failure",
            config: with(
                Takeover::Announce,
                true,
                true,
                faults(1, Stalls::Never, Amnesia::Never),
            ),
            holds: ALL,
            breaks: None,
        },
        Scenario {
            name: "announce: a stall past the lease",
            config: safe.with_takeover(Takeover::Announce),
            holds: NONE,
            breaks: Some(NO_DOUBLE_EXECUTION),
        },
        Scenario {
            name: "reexecute: short stalls, no crash",
            config: with(
                Takeover::Reexecute,
                true,
                true,
                faults(0, Stalls::Short, Amnesia::Never),
            ),
            holds: ALL,
            breaks: None,
        },
        Scenario {
            name: "reexecute: a gateway crash",
            config: with(
                Takeover::Reexecute,
                true,
                true,
                faults(1, Stalls::Never, Amnesia::Never),
            ),
            holds: NONE,
            breaks: Some(NO_DOUBLE_EXECUTION),
        },
        Scenario {
            name: "reexecute: a stall past the lease",
            config: with(
                Takeover::Reexecute,
                true,
                true,
                faults(0, Stalls::Long, Amnesia::Never),
            ),
            holds: NONE,
            breaks: Some(NO_DOUBLE_EXECUTION),
        },
        Scenario {
            name: "reexecute: no pending retry (before issue 36)",
            config: with(
                Takeover::Reexecute,
                true,
                false,
                faults(0, Stalls::Short, Amnesia::Never),
            ),
            holds: NONE,
            breaks: Some(NO_DOUBLE_EXECUTION),
        },
        Scenario {
            name: "reexecute: no heartbeat",
            config: with(Takeover::Reexecute, false, true, Faults::NONE),
            holds: NONE,
            breaks: Some(NO_DOUBLE_EXECUTION),
        },
        Scenario {
            name: "hold: the store loses the record",
            config: safe.with_faults(faults(0, Stalls::Never, Amnesia::Record)),
            holds: NONE,
            breaks: Some(NO_DOUBLE_EXECUTION),
        },
        Scenario {
            name: "hold: the store comes back empty",
            config: safe.with_faults(faults(0, Stalls::Never, Amnesia::Everything)),
            holds: NONE,
            breaks: Some(FENCED),
        },
        Scenario {
            name: "hold: an execution outlives its ttl",
            config: Config {
                ttl: size.lease + 1,
                ..safe.with_faults(Faults::NONE)
            },
            holds: ALL,
            breaks: None,
        },
    ]
}
