//! The registry's clock: the one place the server's deciding code reads
//! the time.
//!
//! # Why
//! The deciders (`Job`, the registry's parts) take `now` as an argument so
//! that tests and the simulator can run them on virtual time. The registry
//! itself also needs the time where no caller hands it one: the wall
//! clock for a timeline event or a tombstone, the monotonic clock to notice
//! that the process was paused, a node's stream that ends when its
//! connection drops. Reading the system clocks there made registry tests
//! sleep for real and left the simulator unable to run the registry. So
//! the registry holds a [`Clock`]: [`SystemClock`] in a server,
//! [`ManualClock`] where a test or the simulator moves time itself.
//!
//! # One reading
//! A [`Now`] is one reading of both clocks: the monotonic instant the
//! deciders compare, and the wall time at that instant (Unix ms) for what
//! is shown or stored as a date. Reading them together keeps the two
//! consistent within one call (a timeline event and the job's deadline
//! come from the same moment).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// One reading of the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The monotonic instant: what deciders compare.
    pub at: Instant,
    /// The wall clock at `at`, ms since the Unix epoch (0 before it).
    pub unix_ms: u64,
}

impl Now {
    /// The wall time (Unix ms) of `t`, an instant before or after this
    /// reading.
    pub fn unix_ms_of(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.at) {
            Some(after) => self.unix_ms.saturating_add(ms(after)),
            None => self
                .unix_ms
                .saturating_sub(ms(self.at.saturating_duration_since(t))),
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Where the time comes from.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The time now.
    fn now(&self) -> Now;

    /// The monotonic instant now, without the wall clock: what nearly every
    /// call of the registry needs, on its hot path.
    fn instant(&self) -> Instant {
        self.now().at
    }
}

/// A clock shared by a registry and what it hands out (its node streams).
pub type SharedClock = Arc<dyn Clock>;

/// The system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Now {
        Now {
            at: Instant::now(),
            unix_ms: accel_wire::time::unix_ms(SystemTime::now()),
        }
    }
    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told ([`ManualClock::advance`]): for
/// tests and the simulator.
#[derive(Debug)]
pub struct ManualClock {
    start: Now,
    elapsed: Mutex<Duration>,
}

/// The wall time a [`ManualClock`] starts at: 2026-01-01T00:00:00Z.
pub const MANUAL_START_UNIX_MS: u64 = 1_767_225_600_000;

impl ManualClock {
    /// A clock at [`MANUAL_START_UNIX_MS`] (any monotonic instant).
    pub fn new() -> Self {
        Self::starting_at(epoch())
    }

    /// A clock whose monotonic time starts at `at`.
    pub fn starting_at(at: Instant) -> Self {
        Self {
            start: Now {
                at,
                unix_ms: MANUAL_START_UNIX_MS,
            },
            elapsed: Mutex::new(Duration::ZERO),
        }
    }

    /// Moves the clock `by` forward.
    pub fn advance(&self, by: Duration) {
        let mut e = self.elapsed.lock().unwrap_or_else(|e| e.into_inner());
        *e = e.saturating_add(by);
    }

    /// Time since the clock started.
    pub fn elapsed(&self) -> Duration {
        *self.elapsed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Now {
        let e = self.elapsed();
        Now {
            at: self.start.at.checked_add(e).unwrap_or(self.start.at),
            unix_ms: self.start.unix_ms.saturating_add(ms(e)),
        }
    }
}

impl Clock for Arc<ManualClock> {
    fn now(&self) -> Now {
        self.as_ref().now()
    }
}

/// Some monotonic instant, for a test's or a virtual clock's start: the
/// deciders care only about the time between instants.
pub fn epoch() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_both_readings_together() {
        let c = ManualClock::new();
        let t0 = c.now();
        c.advance(Duration::from_millis(1500));
        let t1 = c.now();
        assert_eq!(t1.at - t0.at, Duration::from_millis(1500));
        assert_eq!(t1.unix_ms - t0.unix_ms, 1500);
        assert_eq!(t1.unix_ms_of(t0.at), t0.unix_ms);
        assert_eq!(t0.unix_ms_of(t1.at), t1.unix_ms);
    }

    #[test]
    fn the_system_clock_reads_both_clocks() {
        let a = SystemClock.now();
        let b = SystemClock.now();
        assert!(b.at >= a.at);
        assert!(a.unix_ms > MANUAL_START_UNIX_MS - 365 * 86_400_000);
    }
}
