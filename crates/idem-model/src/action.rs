//! What can happen next: a gateway's step, the store's, the clock's.

/// One step of the protocol, or of a fault. `u8`s name a gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock moves one tick: leases and records may end.
    Tick,
    /// A request for the key reaches the gateway, which answers from a
    /// held completion or claims
    /// ([`claim`](idem_core::transition::claim)): it executes, replays,
    /// refuses (409) or, on a takeover under `hold`, answers
    /// `outcome-unresolved`.
    Claim(u8),
    /// A claim the store committed but whose answer was lost: the gateway
    /// fails closed (503) and nothing runs; the record is left to its lease.
    ClaimAnswerLost(u8),
    /// The operation's effect happens (once per execution). An announced
    /// takeover reaches an upstream that keeps its keys: it refuses the
    /// duplicate, and nothing happens.
    Act(u8),
    /// The operation failed before acting (a transient failure): the
    /// claim is released.
    Release(u8),
    /// As `Release`, but the store failed the release: the claim is left
    /// to its lease.
    ReleaseFails(u8),
    /// The lease heartbeat
    /// ([`extend_lease`](idem_core::transition::extend_lease)).
    Heartbeat(u8),
    /// The answer is stored
    /// ([`complete`](idem_core::transition::complete)), or refused as
    /// stale.
    Complete(u8),
    /// The store failed the completion: with the pending retry, the
    /// completion is held; without it, given up. The answer leaves.
    CompleteFails(u8),
    /// A held completion stored (or refused as stale).
    HeldStored(u8),
    /// A held completion failed again, and the lease renewal after it
    /// landed (or found the fence stale: the completion is given up).
    HeldBeat(u8),
    /// A held completion whose record expired is given up.
    HeldExpired(u8),
    /// The gateway dies: its execution and held completion are gone.
    Crash(u8),
    /// The store forgets: the record, and with
    /// [`Amnesia::Everything`](crate::Amnesia::Everything) the fence
    /// counter too.
    Amnesia,
}
