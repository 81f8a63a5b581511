//! What one check explores: how many gateways, how far in time, which
//! policies, which faults.

use std::time::Duration;

use idem_core::{Takeover, Timestamp};

/// The length of one tick of the model's clock. Any value works (every
/// duration is a whole number of ticks); a second reads well in traces.
pub(crate) const TICK_MS: i64 = 1_000;

/// The model's instant `t` as a [`Timestamp`].
pub(crate) fn at(t: u8) -> Timestamp {
    Timestamp::from_millis(i64::from(t) * TICK_MS)
}

/// `ticks` ticks as a [`Duration`].
pub(crate) fn ticks(ticks: u8) -> Duration {
    Duration::from_millis(u64::from(ticks) * TICK_MS.unsigned_abs())
}

/// How long a store fails when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stalls {
    /// The store answers every call.
    Never,
    /// A call may fail (a completion, a release, a claim's answer), but
    /// the store is back before any lease runs out: every heartbeat lands
    /// in time.
    Short,
    /// As `Short`, and a stall may outlast a lease: heartbeats fail for
    /// as long as the clock runs.
    Long,
}

/// What a store that forgets loses (issue 36, item 3 detects it; the
/// model only shows why that is needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Amnesia {
    /// The store keeps what it acknowledged.
    Never,
    /// Once, the record vanishes (a failover to a replica that missed the
    /// last writes); the fence counter is kept.
    Record,
    /// Once, the store comes back empty, its fence counter too (a Redis
    /// restarted without persistence).
    Everything,
}

/// The faults a check injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Faults {
    /// How many gateway crashes (each drops a gateway's execution and held
    /// completion) a run may contain.
    pub crashes: u8,
    /// How the store may fail.
    pub stalls: Stalls,
    /// Whether, and how, the store may forget.
    pub amnesia: Amnesia,
}

impl Faults {
    /// No faults at all.
    pub const NONE: Faults = Faults {
        crashes: 0,
        stalls: Stalls::Never,
        amnesia: Amnesia::Never,
    };
}

/// One check: the bounds of the state space, the protocol's settings and
/// the faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Gateway instances sharing the store, each serving one request for
    /// the key at a time.
    pub gateways: u8,
    /// How many requests for the key (the first and the client's retries)
    /// each gateway serves in one run.
    pub requests: u8,
    /// The last instant of the clock, in ticks from 0.
    pub horizon: u8,
    /// The lease, in ticks (at least 2, so that a heartbeat can land
    /// between two ticks before its lease ends).
    pub lease: u8,
    /// The record's time to live, in ticks. Past the horizon, no record
    /// expires in the run.
    pub ttl: u8,
    /// What a takeover does.
    pub takeover: Takeover,
    /// Whether an execution renews its lease (the lease heartbeat).
    pub heartbeat: bool,
    /// Whether a completion the store fails is held and retried (with a
    /// lease renewal after each failed attempt) rather than given up.
    pub pending_retry: bool,
    /// What goes wrong.
    pub faults: Faults,
}

impl Config {
    /// The shipped protocol under every fault but amnesia, small enough
    /// for CI: two gateways, two requests each, ticks 0 to 7, a lease of
    /// two ticks, `hold`, heartbeat and pending retry on, one crash,
    /// stalls longer than the lease. No record expires (the ttl is past
    /// the horizon).
    pub const fn safe() -> Config {
        Config {
            gateways: 2,
            requests: 2,
            horizon: 7,
            lease: 2,
            ttl: 8,
            takeover: Takeover::Hold,
            heartbeat: true,
            pending_retry: true,
            faults: Faults {
                crashes: 1,
                stalls: Stalls::Long,
                amnesia: Amnesia::Never,
            },
        }
    }

    /// [`Config::safe`] with the deeper bounds of `bench/model.sh`: three
    /// gateways, three requests each, ticks 0 to 12, a lease of three
    /// ticks (a heartbeat every tick is a third of it), two crashes.
    pub const fn deep() -> Config {
        Config {
            gateways: 3,
            requests: 3,
            horizon: 12,
            lease: 3,
            ttl: 13,
            faults: Faults {
                crashes: 2,
                ..Config::safe().faults
            },
            ..Config::safe()
        }
    }

    /// The same bounds with another takeover policy.
    pub const fn with_takeover(self, takeover: Takeover) -> Config {
        Config { takeover, ..self }
    }

    /// The same bounds with other faults.
    pub const fn with_faults(self, faults: Faults) -> Config {
        Config { faults, ..self }
    }

    /// Checks the bounds the model relies on.
    ///
    /// # Panics
    /// If the lease is under two ticks (a heartbeat could not land before
    /// the lease ends), there are no gateways, or more than 8.
    pub(crate) fn validate(&self) {
        assert!(self.lease >= 2, "a lease of at least two ticks");
        assert!((1..=8).contains(&self.gateways), "1 to 8 gateways");
    }
}
