//! When to talk to the API server: capped exponential backoff after failures, and a
//! quiet period that turns a burst of changes into one write.

use std::time::Duration;

use tokio::time::Instant;

/// Trailing-edge debounce with a cap: fires `quiet` after the last change, but no
/// later than `max_wait` after the first, so a steady trickle of changes still gets
/// published.
#[derive(Debug, Clone)]
pub(crate) struct Debounce {
    quiet: Duration,
    max_wait: Duration,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Debounce {
    pub(crate) fn new(quiet: Duration, max_wait: Duration) -> Self {
        Self {
            quiet,
            max_wait: max_wait.max(quiet),
            first: None,
            last: None,
        }
    }

    pub(crate) fn poke(&mut self, now: Instant) {
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    #[cfg(test)]
    pub(crate) fn is_pending(&self) -> bool {
        self.first.is_some()
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        let (first, last) = (self.first?, self.last?);
        Some((last + self.quiet).min(first + self.max_wait))
    }

    pub(crate) fn clear(&mut self) {
        self.first = None;
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debounce_waits_for_quiet_but_not_forever() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut d = Debounce::new(ms(500), ms(2000));
        assert_eq!(d.deadline(), None);
        d.poke(t0);
        assert_eq!(d.deadline(), Some(t0 + ms(500)));
        d.poke(t0 + ms(400));
        assert_eq!(d.deadline(), Some(t0 + ms(900)));
        d.poke(t0 + ms(1800));
        assert_eq!(d.deadline(), Some(t0 + ms(2000)));
        assert!(d.is_pending());
        d.clear();
        assert!(!d.is_pending() && d.deadline().is_none());
    }
}
