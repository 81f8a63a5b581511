//! Delays between attempts: exponential with jitter.
//!
//! Without jitter, clients that failed together retry together and fail
//! together again. Full jitter (a uniform delay between zero and the
//! exponential bound) spreads them best and is the default; equal jitter
//! keeps half the bound as a floor; decorrelated jitter grows from the
//! previous delay instead of the attempt number.

use std::sync::Mutex;
use std::time::Duration;

/// The jitter strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// `uniform(0, min(cap, base * 2^n))`. The default.
    #[default]
    Full,
    /// `b/2 + uniform(0, b/2)` with `b = min(cap, base * 2^n)`.
    Equal,
    /// `min(cap, uniform(base, previous * 3))`.
    Decorrelated,
}

/// Exponential backoff with jitter.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
    rng: Mutex<u64>,
}

impl Clone for Backoff {
    fn clone(&self) -> Self {
        Backoff {
            base: self.base,
            cap: self.cap,
            jitter: self.jitter,
            rng: Mutex::new(seed()),
        }
    }
}

fn seed() -> u64 {
    // Different per backoff and per process; no cryptographic need.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let here = &t as *const u64 as u64;
    t ^ here.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15
}

impl Backoff {
    /// Base and cap; full jitter.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap: cap.max(base),
            jitter: Jitter::Full,
            rng: Mutex::new(seed()),
        }
    }

    /// The jitter strategy. Default [`Jitter::Full`].
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// A fixed random seed, for reproducible tests.
    pub fn seeded(self, seed: u64) -> Self {
        *self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = seed;
        self
    }

    /// The smallest delay unit.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The delay before retry number `retry` (1 for the first retry), given
    /// the previous delay (for decorrelated jitter; pass the base at first).
    pub fn delay(&self, retry: u32, previous: Duration) -> Duration {
        let exp = self
            .base
            .saturating_mul(
                1u32.checked_shl(retry.saturating_sub(1))
                    .unwrap_or(u32::MAX),
            )
            .min(self.cap);
        match self.jitter {
            Jitter::Full => self.uniform(Duration::ZERO, exp),
            Jitter::Equal => exp / 2 + self.uniform(Duration::ZERO, exp / 2),
            Jitter::Decorrelated => {
                let upper = previous.max(self.base).saturating_mul(3).min(self.cap);
                self.uniform(self.base.min(upper), upper)
            }
        }
    }

    /// Uniform in `[low, high]`, at nanosecond resolution (SplitMix64).
    fn uniform(&self, low: Duration, high: Duration) -> Duration {
        let span = high.saturating_sub(low).as_nanos() as u64;
        if span == 0 {
            return low;
        }
        let mut state = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        low + Duration::from_nanos(z % (span + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn full_jitter_stays_under_the_exponential_bound() {
        let b = Backoff::new(MS * 100, MS * 1000).seeded(7);
        let mut seen_low = false;
        for retry in 1..=8u32 {
            let bound = (MS * 100 * 2u32.pow(retry - 1)).min(MS * 1000);
            for _ in 0..200 {
                let d = b.delay(retry, MS * 100);
                assert!(d <= bound, "retry {retry}: {d:?} > {bound:?}");
                seen_low |= d < bound / 4;
            }
        }
        assert!(seen_low, "full jitter reaches low delays");
    }

    #[test]
    fn equal_jitter_keeps_half_the_bound() {
        let b = Backoff::new(MS * 100, MS * 1000)
            .jitter(Jitter::Equal)
            .seeded(7);
        for retry in 1..=6u32 {
            let bound = (MS * 100 * 2u32.pow(retry - 1)).min(MS * 1000);
            for _ in 0..200 {
                let d = b.delay(retry, MS * 100);
                assert!(d >= bound / 2 && d <= bound, "retry {retry}: {d:?}");
            }
        }
    }

    #[test]
    fn decorrelated_jitter_grows_from_the_previous_delay() {
        let b = Backoff::new(MS * 100, MS * 5000)
            .jitter(Jitter::Decorrelated)
            .seeded(7);
        let mut prev = MS * 100;
        for _ in 0..200 {
            let d = b.delay(2, prev);
            assert!(
                d >= MS * 100 && d <= (prev * 3).min(MS * 5000),
                "{d:?} from {prev:?}"
            );
            prev = d;
        }
    }

    #[test]
    fn huge_retry_numbers_do_not_overflow() {
        let b = Backoff::new(MS * 100, MS * 1000);
        assert!(b.delay(200, MS * 100) <= MS * 1000);
        assert!(b.delay(u32::MAX, MS * 100) <= MS * 1000);
    }
}
