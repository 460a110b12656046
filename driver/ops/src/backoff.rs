//! Capped exponential backoff with jitter, for retrying the API server.

use std::hash::BuildHasher;
use std::time::Duration;

/// Capped exponential backoff with jitter.
///
/// Jitter matters at scale: after an API server outage every node's plugin fails at
/// once, and without it they would all retry in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            attempt: 0,
        }
    }

    /// Failures since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The delay before the next try: doubling from `initial` up to `max`, then
    /// scaled by a random factor in [0.75, 1], so it never exceeds `max`.
    pub fn next_delay(&mut self) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        // A fresh RandomState is randomly keyed: enough randomness for jitter without
        // a dependency.
        let r = std::collections::hash_map::RandomState::new().hash_one(self.attempt);
        let frac = (r % 1_000) as f64 / 1_000.0;
        base.mul_f64(0.75 + 0.25 * frac)
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_bounded_jitter() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let bases = [1, 2, 4, 8, 16, 30, 30, 30];
        for base in bases {
            let d = b.next_delay();
            let base = Duration::from_secs(base);
            assert!(d <= base && d >= base.mul_f64(0.75), "{d:?} vs {base:?}");
        }
        assert_eq!(b.attempts(), 8);
        b.reset();
        assert!(b.next_delay() <= Duration::from_secs(1));
        // Far past the shift range, still capped rather than overflowing.
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_secs(30));
        }
    }
}
