//! Noticing a store that forgot: its epoch, and [`EpochWatch`].
//!
//! A store that loses records (a Redis restarted without persistence, a
//! failover to a replica that had not received the last writes, a restored
//! backup) lets the next retry of a lost intent execute again. Nothing in a
//! single record can tell: an absent record looks like a new key. So every
//! store keeps one more record of its own, the *epoch*, per place that can
//! lose data on its own (the store, or each shard of a Redis Cluster): an id
//! written once, when the place has none, and a counter that every check
//! advances ([`Store::advance_epoch`](crate::Store::advance_epoch)).
//!
//! A watcher that remembers what it saw last notices, at its next check:
//! - an epoch written again, or another one: the place was emptied or
//!   replaced (a restart without persistence, a restored backup of another
//!   epoch, another store behind the same address);
//! - the same epoch with a counter at or below the one it last read: the
//!   place lost a write it had acknowledged (a failover to a replica behind
//!   the old primary, a restored backup of the same epoch).
//!
//! What it cannot notice: a loss that keeps the epoch's last write (a
//! replica that had the epoch but not some records), and anything lost
//! while no watcher was running (a watcher that starts remembers nothing).

use std::collections::HashMap;
use std::fmt;

/// One place's epoch, as [`Store::advance_epoch`](crate::Store::advance_epoch)
/// left it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EpochMark {
    /// Where the epoch lives: `store` for a store that loses data as a
    /// whole, a shard's name for one that loses it per shard.
    pub place: String,
    /// The epoch's id, written once when the place had none.
    pub epoch: String,
    /// The counter after this advance.
    pub counter: u64,
    /// Whether this advance wrote the epoch: the place had none.
    pub created: bool,
}

impl EpochMark {
    /// A mark.
    pub fn new(
        place: impl Into<String>,
        epoch: impl Into<String>,
        counter: u64,
        created: bool,
    ) -> Self {
        EpochMark {
            place: place.into(),
            epoch: epoch.into(),
            counter,
            created,
        }
    }
}

/// What a place lost, as an [`EpochWatch`] tells.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossCause {
    /// The place had no epoch any more: emptied (restarted without
    /// persistence, flushed, its table dropped).
    Emptied,
    /// The place holds another epoch: replaced (a restored backup of
    /// another epoch, another store behind the same address).
    Replaced,
    /// The same epoch, its counter at or below the one last read: the
    /// place lost writes it had acknowledged (a failover to a replica
    /// behind the old primary, a restored backup).
    RolledBack {
        /// The counter the watcher read last.
        seen: u64,
        /// The counter it reads now.
        read: u64,
    },
}

impl LossCause {
    /// A short name for metrics and logs: `emptied`, `replaced`, `rolled_back`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LossCause::Emptied => "emptied",
            LossCause::Replaced => "replaced",
            LossCause::RolledBack { .. } => "rolled_back",
        }
    }
}

/// The label values of [`LossCause::as_str`].
pub const LOSS_CAUSES: [&str; 3] = ["emptied", "replaced", "rolled_back"];

/// A loss an [`EpochWatch`] noticed at one place.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreLoss {
    /// The place, as [`EpochMark::place`].
    pub place: String,
    /// What it lost.
    pub cause: LossCause,
}

impl fmt::Display for StoreLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            LossCause::Emptied => write!(
                f,
                "the store ({}) had no epoch any more: it was emptied (restarted without persistence, flushed, or its tables dropped)",
                self.place
            ),
            LossCause::Replaced => write!(
                f,
                "the store ({}) holds another epoch: it was replaced (a restored backup, or another store behind the same address)",
                self.place
            ),
            LossCause::RolledBack { seen, read } => write!(
                f,
                "the store ({}) lost acknowledged writes: its epoch counter went from {seen} to {read} (a failover to a replica that was behind, or a restored backup)",
                self.place
            ),
        }
    }
}

/// Remembers each place's epoch and counter and tells when a store forgot
/// (see the module's documentation). Pure: the caller advances the epoch
/// and hands the marks to [`EpochWatch::observe`].
#[derive(Debug, Clone, Default)]
pub struct EpochWatch {
    seen: HashMap<String, (String, u64)>,
}

impl EpochWatch {
    /// A watch that has seen nothing.
    pub fn new() -> EpochWatch {
        EpochWatch::default()
    }

    /// Whether this watch has seen a mark.
    pub fn has_seen(&self) -> bool {
        !self.seen.is_empty()
    }

    /// Compares `marks` with what was seen last, remembers them, and
    /// answers every loss. A place seen for the first time is no loss
    /// (nothing was known of it), whether or not its epoch was just
    /// written; a place missing from `marks` (a shard that left) is
    /// forgotten.
    pub fn observe(&mut self, marks: &[EpochMark]) -> Vec<StoreLoss> {
        let mut losses = Vec::new();
        let mut now = HashMap::with_capacity(marks.len());
        for mark in marks {
            if let Some((epoch, counter)) = self.seen.get(&mark.place) {
                let cause = if *epoch != mark.epoch {
                    Some(if mark.created {
                        LossCause::Emptied
                    } else {
                        LossCause::Replaced
                    })
                } else if mark.counter <= *counter {
                    Some(LossCause::RolledBack {
                        seen: *counter,
                        read: mark.counter,
                    })
                } else {
                    None
                };
                if let Some(cause) = cause {
                    losses.push(StoreLoss {
                        place: mark.place.clone(),
                        cause,
                    });
                }
            }
            now.insert(mark.place.clone(), (mark.epoch.clone(), mark.counter));
        }
        self.seen = now;
        losses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(place: &str, epoch: &str, counter: u64, created: bool) -> EpochMark {
        EpochMark::new(place, epoch, counter, created)
    }

    #[test]
    fn first_sight_is_no_loss_even_when_written_now() {
        let mut w = EpochWatch::new();
        assert!(!w.has_seen());
        assert!(w.observe(&[mark("store", "a", 1, true)]).is_empty());
        assert!(w.has_seen());
    }

    #[test]
    fn a_counter_that_moves_on_is_no_loss() {
        let mut w = EpochWatch::new();
        w.observe(&[mark("store", "a", 5, false)]);
        // Other watchers advanced it meanwhile: any higher counter is fine.
        assert!(w.observe(&[mark("store", "a", 9, false)]).is_empty());
        assert!(w.observe(&[mark("store", "a", 10, false)]).is_empty());
    }

    #[test]
    fn an_epoch_written_again_is_an_emptied_store() {
        let mut w = EpochWatch::new();
        w.observe(&[mark("store", "a", 7, false)]);
        let losses = w.observe(&[mark("store", "b", 1, true)]);
        assert_eq!(losses.len(), 1);
        assert_eq!(losses[0].cause, LossCause::Emptied);
        assert!(losses[0].to_string().contains("emptied"), "{}", losses[0]);
        // Remembered: the next advance of the new epoch is fine.
        assert!(w.observe(&[mark("store", "b", 2, false)]).is_empty());
    }

    #[test]
    fn another_epoch_not_written_now_is_a_replaced_store() {
        let mut w = EpochWatch::new();
        w.observe(&[mark("store", "a", 7, false)]);
        let losses = w.observe(&[mark("store", "old", 40, false)]);
        assert_eq!(losses[0].cause, LossCause::Replaced);
    }

    #[test]
    fn a_counter_at_or_below_the_last_read_is_a_rollback() {
        let mut w = EpochWatch::new();
        w.observe(&[mark("store", "a", 7, false)]);
        for read in [7, 3] {
            let mut again = w.clone();
            let losses = again.observe(&[mark("store", "a", read, false)]);
            assert_eq!(losses[0].cause, LossCause::RolledBack { seen: 7, read });
            assert_eq!(losses[0].cause.as_str(), "rolled_back");
        }
    }

    #[test]
    fn shards_are_judged_apart_and_new_ones_are_first_sight() {
        let mut w = EpochWatch::new();
        w.observe(&[
            mark("slot 0", "a", 3, false),
            mark("slot 8192", "b", 3, false),
        ]);
        let losses = w.observe(&[
            mark("slot 0", "a", 4, false),
            mark("slot 8192", "c", 1, true),
            mark("slot 12000", "d", 1, true),
        ]);
        assert_eq!(losses.len(), 1);
        assert_eq!(losses[0].place, "slot 8192");
        // A shard that left is forgotten: its return is first sight.
        w.observe(&[mark("slot 0", "a", 5, false)]);
        assert!(w.observe(&[mark("slot 8192", "z", 1, true)]).is_empty());
    }
}
