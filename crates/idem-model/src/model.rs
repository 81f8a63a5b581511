//! The protocol as a Stateright [`Model`]: which [`Action`]s each gateway,
//! the store and the clock may take in a state, and what each does (the
//! properties are in `properties.rs`). Every decision a store makes is
//! idem-core's own
//! ([`transition::claim`], [`transition::may_finish`],
//! [`transition::extend_lease`], [`transition::complete`]); what this file
//! adds is the executor's side, as `idem-http`'s `flow/` runs it, and the
//! faults.

use idem_core::transition;
use idem_core::{
    Claim, ClaimRequest, Completion, Fence, FieldSelection, Fingerprint, Key, Operation, RecordId,
    Scope, StoredResponse, Takeover, Timestamp,
};
use stateright::{Model, Property};

use crate::action::Action;
use crate::config::{Amnesia, Config, Stalls, at, ticks};
use crate::properties;
use crate::state::{Claimant, Execution, Gateway, Ghost, Held, State, Store, StoredRecord};

/// The protocol model for one key under a [`Config`].
#[derive(Debug, Clone)]
pub struct ProtocolModel {
    config: Config,
    id: RecordId,
    fingerprint: Fingerprint,
}

impl ProtocolModel {
    /// The model of `config`.
    ///
    /// # Panics
    /// If `config`'s bounds are out of range (see [`Config`]).
    pub fn new(config: Config) -> ProtocolModel {
        config.validate();
        let operation = Operation::new("POST", "/transfers");
        let key = Key::new("model-key-0001").unwrap_or_else(|e| panic!("a valid key: {e}"));
        ProtocolModel {
            fingerprint: Fingerprint::compute(
                &operation,
                None,
                b"amount=5",
                &FieldSelection::Whole,
            ),
            id: RecordId::new(Scope::anonymous(), operation, key),
            config,
        }
    }

    /// The configuration checked.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn request(&self, now: u8) -> ClaimRequest {
        ClaimRequest {
            id: self.id.clone(),
            fingerprint: self.fingerprint,
            now: at(now),
            lease: ticks(self.config.lease),
            ttl: ticks(self.config.ttl),
        }
    }

    fn completion() -> Completion {
        Completion::completed(StoredResponse {
            status: 201,
            headers: Vec::new(),
            body: b"{}".to_vec(),
            trailers: Vec::new(),
        })
    }

    fn stalls(&self) -> bool {
        self.config.faults.stalls != Stalls::Never
    }

    /// Whether the clock must wait for a heartbeat: a beat lands before its
    /// lease ends unless the store stalls for longer than a lease.
    fn tick_waits_for_a_beat(&self, s: &State) -> bool {
        if self.config.faults.stalls == Stalls::Long {
            return false;
        }
        let next = at(s.now + 1);
        s.gateways.iter().any(|g| {
            let executing = g
                .executing
                .as_ref()
                .is_some_and(|e| self.config.heartbeat && e.beating && e.lease_until <= next);
            let held = g.held.as_ref().is_some_and(|h| h.lease_until <= next);
            executing || held
        })
    }

    /// Whether a heartbeat to `now + lease` would move a lease that runs
    /// to `lease_until` (a beat that moves nothing changes no state).
    fn beat_moves(&self, s: &State, lease_until: Timestamp) -> bool {
        lease_until < at(s.now) + ticks(self.config.lease)
    }

    /// Decides a claim for `claimant` at the store and writes its record.
    fn claim_at_store(s: &mut State, req: &ClaimRequest, claimant: Claimant) -> Claim {
        let Store { record, fences } = &mut s.store;
        let step = transition::claim(record.as_ref().map(|r| &r.0), req, || {
            *fences += 1;
            Fence::new(*fences)
        });
        if let Some(written) = step.write {
            *record = Some(StoredRecord(written));
            s.ghost.owner = Some(claimant);
        }
        step.claim
    }

    /// Whether the store lets `fence` finish the record
    /// ([`transition::may_finish`]); counts a finish for a claim that is
    /// not the record's current one.
    fn may_finish(s: &mut State, fence: Fence, claimant: Claimant) -> bool {
        let ok = transition::may_finish(s.store.record.as_ref().map(|r| &r.0), fence);
        if ok && s.ghost.owner != Some(claimant) {
            s.ghost.misfenced = s.ghost.misfenced.saturating_add(1);
        }
        ok
    }

    /// Stores the completion of `fence`, or notes its refusal.
    fn complete(s: &mut State, fence: Fence, claimant: Claimant) {
        if Self::may_finish(s, fence, claimant) {
            if let Some(record) = s.store.record.as_mut() {
                transition::complete(&mut record.0, Self::completion());
            }
        } else if s.ghost.effects == 1 && s.gateways.iter().all(|g| g.executing.is_none()) {
            s.ghost.late_completion_refused = true;
        }
    }

    /// Renews `fence`'s lease to `now + lease`; `false` if the fence is
    /// stale.
    fn beat(&self, s: &mut State, fence: Fence, claimant: Claimant) -> bool {
        if !Self::may_finish(s, fence, claimant) {
            return false;
        }
        let until = at(s.now) + ticks(self.config.lease);
        if let Some(record) = s.store.record.as_mut() {
            transition::extend_lease(&mut record.0, until);
        }
        true
    }

    fn act(s: &mut State, g: usize) {
        let now = at(s.now);
        let ghost = &mut s.ghost;
        let Some(e) = s.gateways[g].executing.as_mut() else {
            return;
        };
        e.acted = true;
        // An upstream that keeps its keys refuses an announced duplicate.
        if e.announced && ghost.effects > 0 {
            return;
        }
        if ghost.window_end.is_some_and(|end| now < end) {
            ghost.duplicates = ghost.duplicates.saturating_add(1);
        }
        ghost.window_end = Some(
            ghost
                .window_end
                .map_or(e.expires_at, |w| w.max(e.expires_at)),
        );
        ghost.effects = ghost.effects.saturating_add(1);
    }
}

fn gateway(g: usize) -> u8 {
    u8::try_from(g).unwrap_or(u8::MAX)
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let c = &self.config;
        vec![State {
            now: 0,
            store: Store {
                record: None,
                fences: 0,
            },
            gateways: (0..c.gateways)
                .map(|_| Gateway {
                    requests_left: c.requests,
                    executing: None,
                    held: None,
                })
                .collect(),
            crashes_left: c.faults.crashes,
            amnesia_left: c.faults.amnesia != Amnesia::Never,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.config.horizon && !self.tick_waits_for_a_beat(s) {
            actions.push(Action::Tick);
        }
        for (i, gw) in s.gateways.iter().enumerate() {
            let g = gateway(i);
            match &gw.executing {
                None if gw.requests_left > 0 => {
                    actions.push(Action::Claim(g));
                    let answered_from_held =
                        gw.held.as_ref().is_some_and(|h| at(s.now) < h.expires_at);
                    if self.stalls() && !answered_from_held {
                        actions.push(Action::ClaimAnswerLost(g));
                    }
                }
                None => {}
                Some(e) => {
                    if e.acted {
                        actions.push(Action::Complete(g));
                        if self.stalls() {
                            actions.push(Action::CompleteFails(g));
                        }
                    } else {
                        actions.push(Action::Act(g));
                        actions.push(Action::Release(g));
                        if self.stalls() {
                            actions.push(Action::ReleaseFails(g));
                        }
                    }
                    if self.config.heartbeat && e.beating && self.beat_moves(s, e.lease_until) {
                        actions.push(Action::Heartbeat(g));
                    }
                }
            }
            if let Some(h) = &gw.held {
                if at(s.now) >= h.expires_at {
                    actions.push(Action::HeldExpired(g));
                } else {
                    actions.push(Action::HeldStored(g));
                    if self.beat_moves(s, h.lease_until) {
                        actions.push(Action::HeldBeat(g));
                    }
                }
            }
            if s.crashes_left > 0 && (gw.executing.is_some() || gw.held.is_some()) {
                actions.push(Action::Crash(g));
            }
        }
        if s.amnesia_left && s.store.record.is_some() {
            actions.push(Action::Amnesia);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let lease = ticks(self.config.lease);
        match action {
            Action::Tick => s.now += 1,
            Action::Claim(g) | Action::ClaimAnswerLost(g) => {
                let i = usize::from(g);
                s.gateways[i].requests_left -= 1;
                let claimant = (g, s.gateways[i].requests_left);
                let held_answer = s.gateways[i]
                    .held
                    .as_ref()
                    .is_some_and(|h| at(s.now) < h.expires_at);
                if held_answer {
                    // `pending.rs`: a retry that reaches the gateway holding
                    // the completion is answered from it.
                    s.ghost.replayed = true;
                    return Some(s);
                }
                let req = self.request(s.now);
                let answered = action == Action::Claim(g);
                let lease = match Self::claim_at_store(&mut s, &req, claimant) {
                    Claim::Acquired(lease) => lease,
                    Claim::Replay(_) => {
                        s.ghost.replayed |= answered;
                        return Some(s);
                    }
                    Claim::InFlight { .. } => return Some(s),
                    Claim::Mismatch { .. } => {
                        unreachable!("one set of parameters: never a mismatch")
                    }
                };
                if lease.takeover {
                    s.ghost.took_over = true;
                }
                let runs = !lease.takeover || self.config.takeover.executes();
                if answered && runs {
                    s.gateways[i].executing = Some(Execution {
                        fence: lease.fence,
                        lease_until: lease.lease_until,
                        expires_at: lease.expires_at,
                        acted: false,
                        announced: lease.takeover && self.config.takeover == Takeover::Announce,
                        beating: true,
                        claimant,
                    });
                }
            }
            Action::Act(g) => Self::act(&mut s, usize::from(g)),
            Action::Release(g) => {
                let e = s.gateways[usize::from(g)].executing.take()?;
                // An announced takeover keeps its claim (idem-http's
                // `Claimed::keep_claim`): the next attempt is a takeover,
                // and announced, too.
                if !e.announced && Self::may_finish(&mut s, e.fence, e.claimant) {
                    s.store.record = None;
                    s.ghost.owner = None;
                }
            }
            Action::ReleaseFails(g) => {
                s.gateways[usize::from(g)].executing = None;
            }
            Action::Heartbeat(g) => {
                let i = usize::from(g);
                let e = s.gateways[i].executing.clone()?;
                let renewed = self.beat(&mut s, e.fence, e.claimant);
                let e = s.gateways[i].executing.as_mut()?;
                if renewed {
                    e.lease_until = at(s.now) + lease;
                } else {
                    e.beating = false;
                }
            }
            Action::Complete(g) => {
                let e = s.gateways[usize::from(g)].executing.take()?;
                Self::complete(&mut s, e.fence, e.claimant);
            }
            Action::CompleteFails(g) => {
                let e = s.gateways[usize::from(g)].executing.take()?;
                if self.config.pending_retry {
                    s.gateways[usize::from(g)].held = Some(Held {
                        fence: e.fence,
                        lease_until: e.lease_until,
                        expires_at: e.expires_at,
                        claimant: e.claimant,
                    });
                }
            }
            Action::HeldStored(g) => {
                let h = s.gateways[usize::from(g)].held.take()?;
                Self::complete(&mut s, h.fence, h.claimant);
            }
            Action::HeldBeat(g) => {
                let i = usize::from(g);
                let h = s.gateways[i].held.clone()?;
                if self.beat(&mut s, h.fence, h.claimant) {
                    s.gateways[i].held.as_mut()?.lease_until = at(s.now) + lease;
                } else {
                    s.gateways[i].held = None;
                }
            }
            Action::HeldExpired(g) => {
                s.gateways[usize::from(g)].held = None;
            }
            Action::Crash(g) => {
                let gw = &mut s.gateways[usize::from(g)];
                gw.executing = None;
                gw.held = None;
                s.crashes_left -= 1;
            }
            Action::Amnesia => {
                s.store.record = None;
                if self.config.faults.amnesia == Amnesia::Everything {
                    s.store.fences = 0;
                }
                s.amnesia_left = false;
                s.ghost.owner = None;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
