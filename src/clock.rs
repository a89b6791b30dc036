//! The one seam for time: every expiry decision asks a [`Clock`], so tests move a [`ManualClock`]
//! instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in UTC seconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// The current time, UTC seconds since the Unix epoch.
    fn now(&self) -> i64;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            // Saturating, as a time may: the system clock's seconds are an i64 on every Unix, so
            // this is exact there.
            Ok(elapsed) => i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX),
            // A wall clock set before 1970: count backwards rather than fail.
            Err(before) => i64::try_from(before.duration().as_secs()).map_or(i64::MIN, |secs| -secs),
        }
    }
}

/// A clock that only moves when told to; for tests and reproducible tools.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A clock standing at `t` seconds since the Unix epoch.
    #[must_use]
    pub fn new(t: i64) -> Self {
        ManualClock { now: AtomicI64::new(t) }
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: i64) {
        self.now.store(t, Ordering::SeqCst);
    }

    /// Moves the clock by `secs` (which may be negative), saturating at the ends of `i64`.
    pub fn advance(&self, secs: i64) {
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(t.saturating_add(secs)));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(100);
        assert_eq!(clock.now(), 100);
        clock.advance(5);
        assert_eq!(clock.now(), 105);
        clock.set(7);
        assert_eq!(clock.now(), 7);
        clock.advance(i64::MAX);
        assert_eq!(clock.now(), i64::MAX);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800);
    }
}
