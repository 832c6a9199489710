//! Arrivals and departures, counted per job and logged at most once per
//! [`TALLY_EVERY`]: a 10,000-node job's arrival is one line, not 10,000.
//!
//! Joins, resumes, departures and drops are counted where they happen; the
//! periodic tick takes the counts that are due ([`Tallies::due`]), which go
//! to the metrics and to one log line per job ([`describe`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::metrics::Movements;

/// How often at most the arrivals and departures of one job are logged.
pub(super) const TALLY_EVERY: Duration = Duration::from_secs(1);

/// Counts since they were last logged, by job.
#[derive(Debug, Default)]
pub(super) struct Tallies {
    by_job: HashMap<String, Movements>,
    logged: Option<Instant>,
}

impl Tallies {
    /// The counts of `job_id` since they were last taken.
    pub(super) fn of(&mut self, job_id: &str) -> &mut Movements {
        self.by_job.entry(job_id.to_owned()).or_default()
    }

    /// Every job's counts, taken, if [`TALLY_EVERY`] passed since the last
    /// time and there are any; nothing otherwise.
    pub(super) fn due(&mut self, now: Instant) -> Vec<(String, Movements)> {
        let due = self
            .logged
            .is_none_or(|t| now.saturating_duration_since(t) >= TALLY_EVERY);
        if !due || self.by_job.is_empty() {
            return Vec::new();
        }
        self.logged = Some(now);
        self.by_job.drain().collect()
    }
}

/// One job's counts in words ("3 joined, 1 left"), and whether any of them
/// is a loss an operator should see as a warning; `None` if all are zero.
pub(super) fn describe(t: &Movements) -> Option<(String, bool)> {
    let mut parts = Vec::new();
    for (n, what) in [
        (t.joined, "joined"),
        (t.resumed, "resumed after reconnecting"),
        (t.left, "left"),
        (t.disconnected, "lost their connection"),
        (t.silent, "dropped for sending no keep-alive in time"),
        (t.expired, "dropped when their etcd lease expired"),
        (t.too_slow, "disconnected for not reading their events"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let loss = t.disconnected + t.silent + t.too_slow + t.expired > 0;
    Some((parts.join(", "), loss))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_at_most_once_per_interval_and_none_are_lost_meanwhile() {
        let base = crate::clock::epoch();
        let mut t = Tallies::default();
        t.of("a").joined += 2;
        let first = t.due(base);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].1.joined, 2);
        t.of("a").joined += 1;
        t.of("b").left += 1;
        assert!(
            t.due(base + Duration::from_millis(999)).is_empty(),
            "too soon"
        );
        let mut later = t.due(base + TALLY_EVERY);
        later.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(later.len(), 2);
        assert_eq!(
            (later[0].1.joined, later[1].1.left),
            (1, 1),
            "kept until due"
        );
        assert!(t.due(base + 10 * TALLY_EVERY).is_empty(), "nothing new");
    }

    #[test]
    fn one_line_per_job_and_a_warning_only_for_losses() {
        let joined = Movements {
            joined: 10_000,
            resumed: 2,
            ..Movements::default()
        };
        assert_eq!(
            describe(&joined),
            Some(("10000 joined, 2 resumed after reconnecting".into(), false))
        );
        let lost = Movements {
            left: 1,
            silent: 3,
            ..Movements::default()
        };
        assert_eq!(
            describe(&lost),
            Some((
                "1 left, 3 dropped for sending no keep-alive in time".into(),
                true
            ))
        );
        assert_eq!(describe(&Movements::default()), None);
    }
}
