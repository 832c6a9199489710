//! Logging a recurring problem without one line per occurrence.
//!
//! A server may see thousands of refused connections, closed connections or
//! failed accepts in a second (a port scan, a job whose every rank overfills
//! the agent's worker store, the file-descriptor limit). [`Quiet`] lets the
//! first occurrence of an episode be logged with its details and then only
//! counts, handing back a summary at most once per period
//! ([`SUMMARY_EVERY`] unless chosen with [`Quiet::every`]) and when asked at
//! the end ([`Quiet::take`]). The rendezvous server's connection admission
//! and the worker store (`accel-worker-store`) both use it, so it lives here,
//! below both.

use std::time::Duration;

use tokio::time::Instant;

/// Longest time between summaries of a continuing problem, by default.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// What to log for one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Say {
    /// The first of an episode: log it in full.
    First,
    /// Log a summary: this many occurrences (this one included) over this long.
    Summary(u64, Duration),
    /// Count it only.
    Nothing,
}

/// The counter of one kind of problem.
#[derive(Debug)]
pub struct Quiet {
    /// Longest time between summaries.
    period: Duration,
    /// Occurrences since the last line.
    unlogged: u64,
    /// When the last line was logged (`None`: no episode yet).
    logged_at: Option<Instant>,
}

impl Default for Quiet {
    fn default() -> Self {
        Self::every(SUMMARY_EVERY)
    }
}

impl Quiet {
    /// A counter that summarises at most once per `period`.
    pub fn every(period: Duration) -> Self {
        Self {
            period,
            unlogged: 0,
            logged_at: None,
        }
    }

    /// Records one occurrence at `now`.
    pub fn hit(&mut self, now: Instant) -> Say {
        match self.logged_at {
            None => {
                self.logged_at = Some(now);
                Say::First
            }
            Some(at) if now.saturating_duration_since(at) >= self.period => {
                let n = self.unlogged + 1;
                self.unlogged = 0;
                self.logged_at = Some(now);
                Say::Summary(n, now.saturating_duration_since(at))
            }
            Some(_) => {
                self.unlogged += 1;
                Say::Nothing
            }
        }
    }

    /// Occurrences not logged yet and the time since the last line, if any;
    /// the counter starts over.
    pub fn take(&mut self, now: Instant) -> Option<(u64, Duration)> {
        let at = self.logged_at?;
        let n = std::mem::take(&mut self.unlogged);
        (n > 0).then(|| (n, now.saturating_duration_since(at)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_then_counts_then_a_summary_a_minute_later() {
        let t0 = Instant::now();
        let mut q = Quiet::default();
        assert_eq!(q.take(t0), None);
        assert_eq!(q.hit(t0), Say::First);
        for i in 1..=1000 {
            assert_eq!(q.hit(t0 + Duration::from_millis(i)), Say::Nothing);
        }
        assert_eq!(q.hit(t0 + SUMMARY_EVERY), Say::Summary(1001, SUMMARY_EVERY));
        assert_eq!(q.hit(t0 + SUMMARY_EVERY), Say::Nothing);
        assert_eq!(q.take(t0 + SUMMARY_EVERY * 2), Some((1, SUMMARY_EVERY)));
        assert_eq!(q.take(t0 + SUMMARY_EVERY * 3), None, "nothing left");
    }
}
