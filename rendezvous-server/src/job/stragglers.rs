//! Stragglers: ranks persistently slower per step than the rest of the job.
//!
//! In synchronous training one slow rank slows every step of every rank,
//! and nothing fails. Each agent sends, with its progress report, each of
//! its ranks' time per step (the median of its last 10 reports); the
//! rendezvous, which hears every node, compares them across the job: a rank
//! slower than the median of all ranks by more than [`MARGIN`] at
//! [`PERSIST`] evaluations in a row (one per [`EVERY`] at most) is a
//! straggler, shown with its host in `rdzv-server status`, on the status
//! page and in a metric, until it is no longer slower or the round ends.
//!
//! A rank's time per step is measured between its reports: where ranks
//! wait for each other every step (a collective), the waiting hides the
//! slow rank's extra time in everyone's steps, and only ranks whose steps
//! are their own (independent replicas, or a section timed on its own)
//! tell a straggler apart. The times are the current round's, not stored:
//! a replica that takes the job over hears them again.
//!
//! Cost: a report updates its node's entries in O(log nodes) without
//! copying the node's id (after its first report of the round); an
//! evaluation is O(ranks), at most once per [`EVERY`] per job.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;

/// Slower than the job's median by more than this share is slow.
pub(super) const MARGIN: f64 = 0.25;
/// Evaluations in a row a rank must be slow at to be a straggler.
pub(super) const PERSIST: u32 = 2;
/// Evaluations at most this often.
pub(super) const EVERY: Duration = Duration::from_secs(1);
/// Stragglers shown, slowest first.
pub(super) const MAX_SHOWN: usize = 16;
/// Local ranks kept per node.
const MAX_RANKS: usize = 64;

/// A rank of a node: its time per step (µs), and its slow evaluations in
/// a row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Timed {
    step_us: u64,
    slow: u32,
}

/// A straggler: a node's local rank, its time per step and the job's
/// median, µs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Straggler {
    /// The node.
    pub node_id: String,
    /// Its local rank.
    pub local_rank: u32,
    /// Its time per step.
    pub step_us: u64,
    /// The median over the job's ranks.
    pub median_us: u64,
}

/// The current round's step times and stragglers.
#[derive(Debug, Clone, Default)]
pub(super) struct Stragglers {
    /// Per node, by local rank.
    times: BTreeMap<String, Vec<Option<Timed>>>,
    flagged: Vec<Straggler>,
    evaluated: Option<Instant>,
    /// Nodes [`Stragglers::take_new`] returned this round.
    taken: BTreeSet<String>,
}

impl Stragglers {
    /// `node_id`'s ranks' times per step at `now`; evaluates the job when
    /// one is due, and then says so.
    pub(super) fn report(&mut self, now: Instant, node_id: &str, times: &[pb::RankTime]) -> bool {
        if times.is_empty() {
            return false;
        }
        if !self.times.contains_key(node_id) {
            self.times.insert(node_id.to_owned(), Vec::new());
        }
        let Some(ranks) = self.times.get_mut(node_id) else {
            return false;
        };
        for t in times {
            let r = t.local_rank as usize;
            if r >= MAX_RANKS || t.step_us == 0 {
                continue;
            }
            if ranks.len() <= r {
                ranks.resize(r + 1, None);
            }
            let slot = ranks[r].get_or_insert_with(Timed::default);
            slot.step_us = t.step_us;
        }
        if self
            .evaluated
            .is_none_or(|e| now.saturating_duration_since(e) >= EVERY)
        {
            self.evaluate(now);
            return true;
        }
        false
    }

    /// Compares every rank with the job's median.
    fn evaluate(&mut self, now: Instant) {
        self.evaluated = Some(now);
        let mut all: Vec<u64> = self
            .times
            .values()
            .flatten()
            .flatten()
            .map(|t| t.step_us)
            .collect();
        self.flagged.clear();
        if all.len() < 2 {
            return;
        }
        let mid = all.len() / 2;
        let median = *all.select_nth_unstable(mid).1;
        let limit = median as f64 * (1.0 + MARGIN);
        for (node, ranks) in &mut self.times {
            for (r, t) in ranks.iter_mut().enumerate() {
                let Some(t) = t else { continue };
                t.slow = match t.step_us as f64 > limit {
                    true => t.slow.saturating_add(1),
                    false => 0,
                };
                if t.slow >= PERSIST {
                    self.flagged.push(Straggler {
                        node_id: node.clone(),
                        local_rank: r as u32,
                        step_us: t.step_us,
                        median_us: median,
                    });
                }
            }
        }
        self.flagged
            .sort_by(|a, b| b.step_us.cmp(&a.step_us).then(a.node_id.cmp(&b.node_id)));
        self.flagged.truncate(MAX_SHOWN);
    }

    /// The stragglers of the last evaluation, slowest first.
    pub(super) fn flagged(&self) -> &[Straggler] {
        &self.flagged
    }

    /// The stragglers of the last evaluation on nodes not returned before
    /// this round: each node once a round (a node's slowest rank), however
    /// long it stays slow.
    pub(super) fn take_new(&mut self) -> Vec<Straggler> {
        let mut new = Vec::new();
        for s in &self.flagged {
            if !self.taken.contains(&s.node_id) {
                self.taken.insert(s.node_id.clone());
                new.push(s.clone());
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(us: &[u64]) -> Vec<pb::RankTime> {
        us.iter()
            .enumerate()
            .map(|(r, us)| pb::RankTime {
                local_rank: r as u32,
                step_us: *us,
            })
            .collect()
    }

    #[test]
    fn a_rank_persistently_40_percent_slower_is_a_straggler() {
        let t0 = crate::clock::epoch();
        let mut s = Stragglers::default();
        s.report(t0, "a", &times(&[100_000, 101_000]));
        // Evaluated at most once per EVERY: heard, not judged yet.
        s.report(t0, "b", &times(&[99_000, 140_000]));
        s.report(t0 + EVERY, "b", &times(&[99_000, 140_000]));
        assert!(s.flagged().is_empty(), "one slow evaluation is not enough");
        s.report(t0 + EVERY * 2, "b", &times(&[99_000, 141_000]));
        assert_eq!(
            s.flagged(),
            [Straggler {
                node_id: "b".into(),
                local_rank: 1,
                step_us: 141_000,
                median_us: 101_000,
            }]
        );
        assert_eq!(s.take_new().len(), 1);
        // Still slow at the next evaluation: not new.
        assert!(s.report(t0 + EVERY * 3, "b", &times(&[99_000, 142_000])));
        assert_eq!(s.flagged().len(), 1);
        assert!(s.take_new().is_empty(), "a node is taken once a round");
        // Back to speed: no longer flagged at the next evaluation.
        s.report(t0 + EVERY * 4, "b", &times(&[99_000, 102_000]));
        assert!(s.flagged().is_empty());
    }

    #[test]
    fn jitter_within_the_margin_and_junk_flag_nobody() {
        let t0 = crate::clock::epoch();
        let mut s = Stragglers::default();
        // Up to 20 % apart, differently at every report.
        let mut x: u64 = 3;
        let mut jitter = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % 20_000
        };
        for k in 0..100u32 {
            for node in ["a", "b", "c"] {
                let us: Vec<u64> = (0..4).map(|_| 100_000 + jitter()).collect();
                s.report(t0 + EVERY * k, node, &times(&us));
            }
            assert!(s.flagged().is_empty(), "{:?}", s.flagged());
        }
        // A rank beyond the bound, or a zero, is ignored.
        s.report(
            t0 + EVERY * 200,
            "a",
            &[
                pb::RankTime {
                    local_rank: 1000,
                    step_us: 1,
                },
                pb::RankTime {
                    local_rank: 0,
                    step_us: 0,
                },
            ],
        );
        assert!(s.flagged().is_empty());
    }
}
