//! When each job next has periodic work, as a min-heap of instants.
//!
//! A job says when it next needs a tick ([`crate::job::Job::next_deadline`]);
//! the registry's periodic work pops only the entries that are due, so a tick
//! costs O(due · log n) however many jobs are idle. A job that is rescheduled
//! earlier gets a second entry instead of a search through the heap: each job
//! keeps the instant its newest entry stands for (its `scheduled`), and an
//! entry that is no longer that instant is stale and skipped. Stale entries
//! pile up only when deadlines keep moving earlier; [`Deadlines::compact`]
//! rebuilds the heap from the jobs' own instants when they outnumber the jobs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Pending deadlines of every job.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, String)>>,
}

impl Deadlines {
    /// Schedules `job_id` at `next` if that is earlier than what
    /// `scheduled` (the job's own record of its entry) says.
    pub(super) fn schedule(
        &mut self,
        scheduled: &mut Option<Instant>,
        job_id: &str,
        next: Option<Instant>,
    ) {
        if let Some(t) = next {
            if scheduled.is_none_or(|s| t < s) {
                *scheduled = Some(t);
                self.heap.push(Reverse((t, job_id.to_owned())));
            }
        }
    }

    /// The next entry due at `now`, removed from the heap: the instant it
    /// stands for and its job. The caller skips it unless the job's
    /// `scheduled` is still that instant.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(Instant, String)> {
        match self.heap.peek() {
            Some(Reverse((t, _))) if *t <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// The earliest entry's instant (it may be stale).
    pub(super) fn peek(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Rebuilds the heap from `live` (each job's scheduled instant) when
    /// stale entries outnumber the `jobs` held by more than a margin.
    pub(super) fn compact(&mut self, jobs: usize, live: impl Iterator<Item = (Instant, String)>) {
        if self.heap.len() > 2 * jobs + 1024 {
            self.heap = live.map(Reverse).collect();
        }
    }

    /// Entries in the heap, stale ones included.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(base: Instant, s: u64) -> Instant {
        base + Duration::from_secs(s)
    }

    #[test]
    fn only_due_entries_come_out_earliest_first() {
        let base = crate::clock::epoch();
        let mut d = Deadlines::default();
        let (mut a, mut b) = (None, None);
        d.schedule(&mut a, "a", Some(at(base, 5)));
        d.schedule(&mut b, "b", Some(at(base, 2)));
        assert_eq!(d.pop_due(at(base, 1)), None);
        assert_eq!(d.pop_due(at(base, 5)), Some((at(base, 2), "b".into())));
        assert_eq!(d.pop_due(at(base, 5)), Some((at(base, 5), "a".into())));
        assert_eq!(d.pop_due(at(base, 100)), None);
    }

    #[test]
    fn a_later_deadline_does_not_replace_an_earlier_one_and_an_earlier_one_leaves_a_stale_entry() {
        let base = crate::clock::epoch();
        let mut d = Deadlines::default();
        let mut s = None;
        d.schedule(&mut s, "job", Some(at(base, 10)));
        d.schedule(&mut s, "job", Some(at(base, 20)));
        assert_eq!((s, d.len()), (Some(at(base, 10)), 1), "later: ignored");
        d.schedule(&mut s, "job", Some(at(base, 3)));
        assert_eq!((s, d.len()), (Some(at(base, 3)), 2), "earlier: a new entry");
        d.schedule(&mut s, "job", None);
        assert_eq!(s, Some(at(base, 3)), "no deadline changes nothing");
        let (t, _) = d.pop_due(at(base, 30)).expect("due");
        assert_eq!(Some(t), s, "the live entry first");
        let (t, _) = d.pop_due(at(base, 30)).expect("due");
        assert_ne!(Some(t), s, "then the stale one, which the caller skips");
    }

    #[test]
    fn compacting_keeps_only_the_live_entries_once_stale_ones_pile_up() {
        let base = crate::clock::epoch();
        let mut d = Deadlines::default();
        let mut s = None;
        for i in (0..2000u64).rev() {
            d.schedule(&mut s, "job", Some(at(base, i + 1)));
        }
        assert_eq!(d.len(), 2000);
        d.compact(1, std::iter::once((at(base, 1), "job".to_owned())));
        assert_eq!(d.len(), 1);
        d.compact(1, std::iter::empty());
        assert_eq!(d.len(), 1, "below the margin nothing is rebuilt");
        assert_eq!(d.pop_due(at(base, 1)), Some((at(base, 1), "job".into())));
    }
}
