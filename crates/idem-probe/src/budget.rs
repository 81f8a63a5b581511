//! The request budget: the probe never sends more mutating requests than
//! `--max-requests`, and counts what it sent.

use std::sync::atomic::{AtomicU32, Ordering};

/// A fixed number of requests to the target, taken before each is sent.
#[derive(Debug)]
pub(crate) struct Budget {
    max: u32,
    sent: AtomicU32,
}

impl Budget {
    pub(crate) fn new(max: u32) -> Budget {
        Budget {
            max,
            sent: AtomicU32::new(0),
        }
    }

    /// Takes `n` requests at once, or none if fewer than `n` are left.
    pub(crate) fn take(&self, n: u32) -> bool {
        self.sent
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |sent| {
                sent.checked_add(n).filter(|total| *total <= self.max)
            })
            .is_ok()
    }

    pub(crate) fn sent(&self) -> u32 {
        self.sent.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::Budget;

    #[test]
    fn never_more_than_the_max() {
        let b = Budget::new(5);
        assert!(b.take(3));
        assert!(!b.take(3));
        assert!(b.take(2));
        assert!(!b.take(1));
        assert_eq!(b.sent(), 5);
    }
}
