//! The model's state: the store (one key's record and the fence counter),
//! each gateway's request and held completion, the clock, and the ghost
//! variables the properties read (what happened, which nothing in the
//! protocol can see).

use std::hash::{Hash, Hasher};

use idem_core::{Fence, Record, Timestamp};

/// The store's record, as idem-core's [`Record`], hashed for the checker.
///
/// `Record` has no `Hash`; this hashes every field but the two the model
/// never varies (one key, one set of parameters). The destructuring names
/// every field, so a field added to `Record` fails to compile here rather
/// than being silently ignored by the checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord(pub Record);

impl Hash for StoredRecord {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let Record {
            id: _,
            fingerprint: _,
            status,
            response,
            resource_id,
            created_at,
            lease_until,
            fence,
            expires_at,
        } = &self.0;
        status.hash(state);
        response
            .as_ref()
            .map(|r| (r.status, &r.headers, &r.body))
            .hash(state);
        resource_id.hash(state);
        created_at.hash(state);
        lease_until.hash(state);
        fence.hash(state);
        expires_at.hash(state);
    }
}

/// The store: what it keeps for the key, and where its fence counter is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Store {
    /// The key's record, if any.
    pub record: Option<StoredRecord>,
    /// The last fence drawn (the next claim draws this plus one).
    pub fences: u64,
}

/// A claim's identity in the model alone: which gateway, which of its
/// requests. Fences are what the protocol uses; this is what the fencing
/// property compares them against.
pub type Claimant = (u8, u8);

/// An execution in progress at a gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Execution {
    /// The fence of its claim.
    pub fence: Fence,
    /// Until when the gateway believes its lease runs (the claim's, then
    /// each heartbeat's that landed).
    pub lease_until: Timestamp,
    /// When its claim's record expires.
    pub expires_at: Timestamp,
    /// Whether the operation's effect has happened.
    pub acted: bool,
    /// Whether it runs as an announced takeover (`Idem-Takeover`).
    pub announced: bool,
    /// Whether it still renews its lease (false once a beat found its
    /// fence stale).
    pub beating: bool,
    /// Who claimed.
    pub claimant: Claimant,
}

/// A completion the store failed, held by its gateway and retried.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Held {
    /// The fence to complete with.
    pub fence: Fence,
    /// Until when the gateway believes its lease runs.
    pub lease_until: Timestamp,
    /// When the record expires: the retries stop there.
    pub expires_at: Timestamp,
    /// Who claimed.
    pub claimant: Claimant,
}

/// One gateway instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gateway {
    /// Requests for the key it may still serve.
    pub requests_left: u8,
    /// The request it is executing, if any.
    pub executing: Option<Execution>,
    /// The completion it holds, if any.
    pub held: Option<Held>,
}

/// What happened, as only the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// How many times the operation's effect happened.
    pub effects: u8,
    /// Effects that happened while an earlier effect's record was still
    /// live (by its ttl): the executions the contract forbids.
    pub duplicates: u8,
    /// The latest expiry of the claims under which effects happened.
    pub window_end: Option<Timestamp>,
    /// Who holds the record's current claim.
    pub owner: Option<Claimant>,
    /// Completions, releases or heartbeats the store applied for a claim
    /// that was not the record's current one (a reused fence).
    pub misfenced: u8,
    /// Whether a client got a replay (from the store or a held completion).
    pub replayed: bool,
    /// Whether a claim took over an abandoned one.
    pub took_over: bool,
    /// Whether the store refused, as stale, the completion of the only
    /// effect while no other execution ran (a held takeover fenced it
    /// out: safe, but the answer is lost and the key held).
    pub late_completion_refused: bool,
}

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The clock, in ticks.
    pub now: u8,
    /// The store.
    pub store: Store,
    /// The gateways.
    pub gateways: Vec<Gateway>,
    /// Crashes still allowed.
    pub crashes_left: u8,
    /// Whether the store may still forget.
    pub amnesia_left: bool,
    /// What happened.
    pub ghost: Ghost,
}
