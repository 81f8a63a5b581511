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
//! and makes a try safe to run again (PostgreSQL rolls it back whole;
//! MySQL's statements, which commit one by one, are each written to be
//! re-run).

use std::time::Duration;

use crate::{StoreError, StoreErrorKind};

/// The shortest wait a try may have.
const SHORTEST_WAIT: Duration = Duration::from_millis(1);

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
    /// `wait` a try (at least 1 ms), `tries` in all (at least 1).
    pub fn new(wait: Duration, tries: u32) -> MigrationLockWaits {
        MigrationLockWaits {
            wait: wait.max(SHORTEST_WAIT),
            tries: tries.max(1),
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
        tokio::time::sleep(self.wait / 2 * tries_made).await;
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
    fn waits_and_tries_have_a_floor() {
        let w = MigrationLockWaits::new(Duration::ZERO, 0);
        assert_eq!((w.wait(), w.tries()), (Duration::from_millis(1), 1));
        let d = MigrationLockWaits::default();
        assert_eq!((d.wait(), d.tries()), (Duration::from_secs(1), 3));
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
