//! How long a server store's schema migration waits for a table's lock,
//! and how often it tries: the same rule for every store that migrates
//! at start-up (PostgreSQL, MySQL).
//!
//! While a migration waits for a table's lock, the server queues every
//! later statement on that table behind it, so claims stall for as long
//! as the wait. A transaction that holds a record (atomic mode's
//! execution, an operator's session, a dump) can hold that lock for a
//! long time. So each try waits at most `wait`; a try whose wait ran out
//! is given up whole, claims pass during a pause (half the wait after the
//! first try, the whole wait after the second, and so on), and after
//! `tries` the start fails as `Unavailable`.
//!
//! Not here: what a lock wait is on a given server, or how a try is
//! undone. The store says which of its errors is a wait that ran out,
//! and makes a try safe to run again (PostgreSQL rolls it back to a
//! savepoint, holding its migration lock through the pauses;
//! MySQL's statements, which commit one by one, are each written to be
//! re-run).

use std::time::Duration;

use crate::store::{StoreError, StoreErrorKind};

/// The shortest wait a try may have.
const SHORTEST_WAIT: Duration = Duration::from_millis(1);
/// The longest wait a try may have: claims queue behind a waiting
/// migration, and a start that waits longer is an outage of its own.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);
/// The most tries.
const MOST_TRIES: u32 = 100;

/// A migration's lock waits: `wait` a try, `tries` in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationLockWaits {
    wait: Duration,
    tries: u32,
}

/// 1 s a try, 3 tries.
impl Default for MigrationLockWaits {
    fn default() -> MigrationLockWaits {
        MigrationLockWaits::new(Duration::from_secs(1), 3)
    }
}

impl MigrationLockWaits {
    /// `wait` a try (1 ms to 1 h), `tries` in all (1 to 100); values
    /// outside are taken as the nearest bound.
    pub fn new(wait: Duration, tries: u32) -> MigrationLockWaits {
        MigrationLockWaits {
            wait: wait.clamp(SHORTEST_WAIT, LONGEST_WAIT),
            tries: tries.clamp(1, MOST_TRIES),
        }
    }

    /// The longest a try waits for a lock.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// How many tries are made.
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// The longest a migration can take in waits and pauses before it
    /// gives up: every try's wait, and the pauses between them. Another
    /// instance waiting for the same migration's lock must wait at least
    /// this long.
    pub fn longest(&self) -> Duration {
        let pauses = (1..self.tries).fold(Duration::ZERO, |sum, made| {
            sum.saturating_add(self.pause(made))
        });
        self.wait.saturating_mul(self.tries).saturating_add(pauses)
    }

    /// The pause after try number `tries_made` whose wait ran out.
    fn pause(&self, tries_made: u32) -> Duration {
        (self.wait / 2).saturating_mul(tries_made)
    }

    /// After try number `tries_made` (from 1) whose lock wait ran out
    /// (`error`): pauses before the next try (half the wait times the
    /// tries made), or, when that was the last, gives up. The store calls
    /// it in its loop of tries; `store` names the store and `what` the
    /// migration in the message.
    ///
    /// # Errors
    /// After the last try, `Unavailable`, saying how many waits of how
    /// long were spent, with `error` as its source.
    pub async fn pause_or_give_up(
        &self,
        tries_made: u32,
        store: &str,
        what: &str,
        error: StoreError,
    ) -> Result<(), StoreError> {
        if tries_made >= self.tries {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!(
                    "{store} store: migrating {what}: a lock it needs was held by another \
                     transaction through {tries_made} waits of {} ms; the migration is not \
                     recorded as applied and runs again at the next start (or raise the wait)",
                    self.wait.as_millis()
                ),
            )
            .with_source(error));
        }
        tokio::time::sleep(self.pause(tries_made)).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waited() -> StoreError {
        StoreError::new(StoreErrorKind::Unavailable, "lock wait ran out")
    }

    #[test]
    fn waits_and_tries_are_bounded() {
        let w = MigrationLockWaits::new(Duration::ZERO, 0);
        assert_eq!((w.wait(), w.tries()), (Duration::from_millis(1), 1));
        let w = MigrationLockWaits::new(Duration::MAX, u32::MAX);
        assert_eq!((w.wait(), w.tries()), (Duration::from_secs(3600), 100));
        // 100 waits of an hour, and pauses of half an hour times 1..=99.
        assert_eq!(
            w.longest(),
            Duration::from_secs(100 * 3600 + 1800 * (99 * 100 / 2))
        );
        let d = MigrationLockWaits::default();
        assert_eq!((d.wait(), d.tries()), (Duration::from_secs(1), 3));
        assert_eq!(d.longest(), Duration::from_millis(4500));
    }

    /// Tries whose waits all run out: a pause after each but the last
    /// (half the wait, then the whole), then `Unavailable` naming the
    /// waits.
    #[tokio::test(start_paused = true)]
    async fn waits_that_all_run_out_pause_between_tries_then_give_up() {
        let waits = MigrationLockWaits::new(Duration::from_millis(400), 3);
        let start = tokio::time::Instant::now();
        for made in 1..=2 {
            waits
                .pause_or_give_up(made, "test", "schema x", waited())
                .await
                .unwrap();
        }
        assert_eq!(start.elapsed(), Duration::from_millis(600));
        let e = waits
            .pause_or_give_up(3, "test", "schema x", waited())
            .await
            .unwrap_err();
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(600),
            "no pause after the last"
        );
        assert_eq!(e.kind(), StoreErrorKind::Unavailable);
        assert!(e.to_string().contains("3 waits of 400 ms"), "{e}");
        assert!(e.to_string().contains("lock wait ran out"), "{e}");
    }
}
