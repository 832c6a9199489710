//! Logging a recurring problem without one line per occurrence.
//!
//! A store may see thousands of refused connections, closed connections or
//! failed accepts in a second (a port scan, a job whose every rank overfills
//! the store, the file-descriptor limit). [`Quiet`] lets the first occurrence
//! of an episode be logged with its details and then only counts, handing
//! back a summary at most once per [`SUMMARY_EVERY`] and when asked at the
//! end ([`Quiet::take`]).

use std::time::Duration;

use tokio::time::Instant;

/// Longest time between summaries of a continuing problem.
pub(super) const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// What to log for one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Say {
    /// The first of an episode: log it in full.
    First,
    /// Log a summary: this many occurrences (this one included) over this long.
    Summary(u64, Duration),
    /// Count it only.
    Nothing,
}

/// The counter of one kind of problem.
#[derive(Debug, Default)]
pub(super) struct Quiet {
    /// Occurrences since the last line.
    unlogged: u64,
    /// When the last line was logged (`None`: no episode yet).
    logged_at: Option<Instant>,
}

impl Quiet {
    /// Records one occurrence at `now`.
    pub(super) fn hit(&mut self, now: Instant) -> Say {
        match self.logged_at {
            None => {
                self.logged_at = Some(now);
                Say::First
            }
            Some(at) if now.saturating_duration_since(at) >= SUMMARY_EVERY => {
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
    pub(super) fn take(&mut self, now: Instant) -> Option<(u64, Duration)> {
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
