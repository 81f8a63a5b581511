//! The retry budget: retries limited to a share of first attempts.
//!
//! # Why a budget and not only max attempts?
//!
//! With three attempts per call, a total outage triples the load on a
//! service that is already down: every client turns one request into three.
//! A budget shared by every call of one client allows retries only up to a
//! fraction of the first attempts it made recently (plus a small floor per
//! second, so that a quiet client can still retry). In an outage the client
//! adds that fraction, not a multiple; when the service is healthy, the
//! budget is full and transient failures are retried as usual.
//!
//! This wraps tower's `TpsBudget` (Finagle's design: deposits expire after
//! a time-to-live window) and counts exhaustion.

use std::time::Duration;

use tower::retry::budget::{Budget, TpsBudget};

/// A retry budget shared by all calls of one client. Cheap to share
/// behind an `Arc`.
#[derive(Debug)]
pub struct RetryBudget {
    inner: TpsBudget,
}

impl Default for RetryBudget {
    /// 10% of first attempts over a 10 s window, plus 10 retries per
    /// second.
    fn default() -> Self {
        RetryBudget::new(Duration::from_secs(10), 10, 0.1)
    }
}

impl RetryBudget {
    /// `ratio` of first attempts within `window` (1 to 60 s), plus
    /// `floor_per_sec` retries per second.
    pub fn new(window: Duration, floor_per_sec: u32, ratio: f32) -> RetryBudget {
        let window = window.clamp(Duration::from_secs(1), Duration::from_secs(60));
        RetryBudget {
            inner: TpsBudget::new(window, floor_per_sec, ratio.clamp(0.0, 1000.0)),
        }
    }

    /// Records a first attempt.
    pub fn deposit(&self) {
        self.inner.deposit();
    }

    /// Takes one retry from the budget; `false` when it is spent.
    pub fn withdraw(&self) -> bool {
        self.inner.withdraw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_are_a_share_of_first_attempts_plus_a_floor() {
        let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.1);
        for _ in 0..100 {
            budget.deposit();
        }
        let allowed = (0..100).take_while(|_| budget.withdraw()).count();
        assert!(
            (9..=11).contains(&allowed),
            "about 10% of 100, got {allowed}"
        );
        assert!(!budget.withdraw());
        // Deposits age out with the window; fresh ones refill it.
        tokio::time::advance(Duration::from_secs(11)).await;
        for _ in 0..50 {
            budget.deposit();
        }
        let allowed = (0..100).take_while(|_| budget.withdraw()).count();
        assert!((4..=6).contains(&allowed), "about 10% of 50, got {allowed}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_allows_a_quiet_client_to_retry() {
        let budget = RetryBudget::new(Duration::from_secs(10), 10, 0.1);
        let allowed = (0..1000).take_while(|_| budget.withdraw()).count();
        assert!(
            (90..=110).contains(&allowed),
            "10/s over 10 s, got {allowed}"
        );
    }
}
