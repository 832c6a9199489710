//! Whether a job is getting anywhere: the training progress its nodes
//! report (`accel.progress(step)` in the workers, summed up per node by the
//! agent), and the no-progress verdict.
//!
//! A job that crashes at step 40 after every restart from its step-30
//! checkpoint spends its whole restart budget, and the cluster's time,
//! learning nothing. With `--max-no-progress-restarts N`, N restarts in a
//! row after which the best step the job ever reported did not advance end
//! it, failed, with its `--no-restart-exit-code` (else 1) and a reason that
//! names the step it keeps dying at. A round's step is the furthest any of
//! its ranks reported; the verdict is taken when a worker failure would
//! restart the job, so the failing node's report (sent with the failure)
//! counts. A job whose workers never report progress is never judged.
//!
//! Steps are counted per round: a report of an earlier round (late, or from
//! a node that did not hear the restart) changes nothing. A round reached
//! the step every reporting rank reached: the least of the nodes' least
//! steps (in synchronous training the ranks move together; a rank that ran
//! ahead of one that failed did not take the job with it), or, when a
//! worker failure ends it, the failing node's least step if that is
//! further: its report, sent with the failure, is of that moment, the
//! others' are up to a keep-alive old.
//!
//! A store keeps the best step and the count, not the current round's
//! reports: a replica that takes the job over mid-round hears them again
//! with the next keep-alives.

use std::collections::BTreeMap;

use accel_proto::v1 as pb;

/// A job's progress so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The furthest step an earlier round reached (`None`: none reported).
    pub best: Option<u64>,
    /// The current round's reports: each reporting node's least step.
    pub round: BTreeMap<String, u64>,
    /// Restarts in a row after which the best step did not advance.
    pub stalled: u32,
    /// The current round's checkpoints: each reporting node's last step
    /// every one of its ranks saved.
    pub checkpoints: BTreeMap<String, u64>,
    /// The last checkpoint a whole round saved: where a restarted job
    /// resumes (`None`: none reported).
    pub checkpoint: Option<u64>,
    /// The step the last round that ended reached (not stored).
    pub ended_at: Option<u64>,
    /// The current round's learned hang timeouts, per reporting node, ms
    /// (not stored: heard again).
    pub hang_timeouts: BTreeMap<String, u64>,
    /// The step the failing rank of a failure report reported, and its
    /// node (not stored: the round ends with it).
    pub failing: Option<(String, u64)>,
}

/// The verdict on a job whose worker failed: it makes no progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    /// The furthest step it reached.
    pub best: u64,
    /// Failures in a row that did not pass it.
    pub stalled: u32,
}

impl Progress {
    /// `node_id`'s report, the job's current round being `current`: kept
    /// if it is of the current round (a node's steps only grow).
    /// Whether it was kept.
    pub fn report(&mut self, current: u64, node_id: &str, p: &pb::Progress) -> bool {
        if p.round != current || p.ranks == 0 {
            return false;
        }
        // Every keep-alive of every node comes here: the node's id is
        // copied only the first time it reports in a round.
        fn keep(
            map: &mut BTreeMap<String, u64>,
            node_id: &str,
            value: u64,
            merge: fn(u64, u64) -> u64,
        ) {
            match map.get_mut(node_id) {
                Some(v) => *v = merge(*v, value),
                None => {
                    map.insert(node_id.to_owned(), value);
                }
            }
        }
        keep(&mut self.round, node_id, p.min_step, u64::max);
        if let Some(step) = p.failing_step {
            self.failing = Some((node_id.to_owned(), step));
        }
        if p.hang_timeout_ms > 0 {
            keep(
                &mut self.hang_timeouts,
                node_id,
                p.hang_timeout_ms,
                |_, new| new,
            );
        }
        if let Some(c) = p.checkpoint_step {
            keep(&mut self.checkpoints, node_id, c, u64::max);
        }
        true
    }

    /// The step the current round saved a checkpoint of: every reporting
    /// node's (`None`: one of them has none).
    pub fn saved(&self) -> Option<u64> {
        if self.checkpoints.len() < self.round.len() {
            return None;
        }
        self.checkpoints.values().copied().min()
    }

    /// The longest hang timeout the round's nodes learned, ms.
    pub fn hang_timeout(&self) -> Option<u64> {
        self.hang_timeouts.values().copied().max()
    }

    /// Where the running round resumed from: the last checkpoint an
    /// earlier round saved (0: none).
    pub fn resumed(&self) -> u64 {
        self.checkpoint.unwrap_or(0)
    }

    /// The round ends: its step and checkpoint are folded in, and the
    /// next round counts from nothing. Its step: every reporting node's, or
    /// `fresh`'s when that is further (the node whose failure ended it: its
    /// report, sent with the failure, is the only one of that moment, and
    /// it says the failing rank's own step; the others' are up to a
    /// keep-alive old, and in synchronous training the ranks are at the
    /// same step).
    fn end_round(&mut self, fresh: Option<&str>) -> Option<u64> {
        // The failing rank's own step, else its node's least.
        let fresh = fresh.and_then(|n| match self.failing.take() {
            Some((node, step)) if node == n => Some(step),
            _ => self.round.get(n).copied(),
        });
        self.failing = None;
        let reached = self.reached().max(fresh);
        self.checkpoint = self.checkpoint.max(self.saved());
        self.round.clear();
        self.checkpoints.clear();
        self.hang_timeouts.clear();
        self.ended_at = reached;
        reached
    }

    /// The step the current round reached: every reporting rank's.
    pub fn reached(&self) -> Option<u64> {
        self.round.values().copied().min()
    }

    /// The running round ended in a worker failure of node `failing` that
    /// would restart the job: whether the job is stuck, with `limit` the job's
    /// `--max-no-progress-restarts` (0: never). Either way the round's step
    /// is folded into the best, and the next round counts from nothing.
    pub fn failed(&mut self, limit: u32, failing: &str) -> Option<Stuck> {
        let reached = self.end_round(Some(failing));
        let advanced = match (reached, self.best) {
            (Some(r), Some(b)) => r > b,
            (Some(_), None) => true,
            // Nothing reported this round: it did not get past the best.
            (None, Some(_)) => false,
            // Nothing ever reported: nothing to judge.
            (None, None) => return None,
        };
        self.best = self.best.max(reached);
        self.stalled = if advanced {
            0
        } else {
            self.stalled.saturating_add(1)
        };
        let best = self.best?;
        (limit > 0 && self.stalled >= limit).then_some(Stuck {
            best,
            stalled: self.stalled,
        })
    }

    /// A restart that was not a worker failure (a node left, or fenced
    /// itself): the round's step counts towards the best (a step past it is
    /// progress, and starts the count again); otherwise the count is left
    /// as it is.
    pub fn reformed(&mut self) {
        let reached = self.end_round(None);
        if reached > self.best {
            self.best = reached;
            self.stalled = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(round: u64, min_step: u64) -> pb::Progress {
        pb::Progress {
            round,
            ranks: 2,
            min_step,
            max_step: min_step + 8,
            checkpoint_step: None,
            first_step_ms_ago: 0,
            min_step_ms_ago: 0,
            hang_timeout_ms: 0,
            failing_step: None,
            rank_times: Vec::new(),
        }
    }

    #[test]
    fn dying_at_the_same_step_after_every_restart_is_stuck_after_the_limit() {
        let mut p = Progress::default();
        // Round 0 reaches step 40 and fails: progress (the first ever).
        p.report(0, "a", &at(0, 35));
        p.report(0, "a", &at(0, 40));
        assert_eq!(p.failed(2, "a"), None);
        assert_eq!((p.best, p.stalled), (Some(40), 0));
        // Rounds 1 and 2 restart from the step-30 checkpoint and die at 40.
        p.report(1, "a", &at(1, 40));
        assert_eq!(p.failed(2, "a"), None, "one restart without progress");
        p.report(2, "a", &at(2, 39));
        assert_eq!(
            p.failed(2, "a"),
            Some(Stuck {
                best: 40,
                stalled: 2
            })
        );
    }

    #[test]
    fn a_step_past_the_best_starts_the_count_again() {
        let mut p = Progress::default();
        p.report(0, "a", &at(0, 40));
        assert_eq!(p.failed(2, "a"), None);
        p.report(1, "a", &at(1, 40));
        assert_eq!(p.failed(2, "a"), None);
        p.report(2, "a", &at(2, 41));
        assert_eq!(p.failed(2, "a"), None, "41 passed 40");
        assert_eq!(p.stalled, 0);
        // A round that reports nothing did not pass the best.
        assert_eq!(p.failed(2, "a"), None);
        assert_eq!(
            p.failed(2, "a"),
            Some(Stuck {
                best: 41,
                stalled: 2
            })
        );
    }

    #[test]
    fn a_round_saved_the_checkpoint_every_reporting_node_saved() {
        let mut p = Progress::default();
        let saved = |round, step, c| pb::Progress {
            checkpoint_step: Some(c),
            ..at(round, step)
        };
        p.report(0, "a", &saved(0, 35, 30));
        p.report(0, "b", &at(0, 35));
        assert_eq!(p.saved(), None, "b saved none");
        p.report(0, "b", &saved(0, 35, 20));
        p.report(0, "b", &saved(0, 36, 30));
        assert_eq!(p.saved(), Some(30));
        assert_eq!(p.failed(0, "a"), None);
        assert_eq!(
            (p.checkpoint, p.ended_at, p.resumed()),
            (Some(30), Some(35), 30)
        );
        // A round that saved nothing leaves the last checkpoint.
        p.report(1, "a", &at(1, 33));
        p.reformed();
        assert_eq!((p.checkpoint, p.ended_at), (Some(30), Some(33)));
    }

    #[test]
    fn a_failing_nodes_fresh_report_counts_over_the_others_older_ones() {
        let mut p = Progress::default();
        // b's report is a keep-alive old; a's came with its failure.
        p.report(0, "b", &at(0, 33));
        p.report(0, "a", &at(0, 35));
        assert_eq!(p.reached(), Some(33));
        assert_eq!(p.failed(0, "a"), None);
        assert_eq!(p.best, Some(35));
        // The failing rank's own step, with its failure, counts over its
        // node's least (another rank's report may be a few ms old).
        p.report(
            1,
            "a",
            &pb::Progress {
                failing_step: Some(38),
                rank_times: Vec::new(),
                ..at(1, 36)
            },
        );
        assert_eq!(p.failed(0, "a"), None);
        assert_eq!(p.best, Some(38));
        // A failing node that had reported nothing changes nothing.
        p.report(2, "b", &at(2, 39));
        assert_eq!(p.failed(0, "c"), None);
        assert_eq!(p.best, Some(39));
    }

    #[test]
    fn a_round_reached_what_every_reporting_node_reached() {
        let mut p = Progress::default();
        p.report(0, "a", &at(0, 40));
        p.report(0, "b", &at(0, 35));
        p.report(0, "b", &at(0, 30)); // late: b's steps only grow
        assert_eq!(p.reached(), Some(35));
    }

    #[test]
    fn no_limit_no_reports_or_stale_reports_judge_nothing() {
        let mut p = Progress::default();
        assert_eq!(p.failed(1, "a"), None, "never reported");
        p.report(3, "a", &at(2, 100));
        assert_eq!(p.reached(), None, "a report of an earlier round");
        p.report(
            3,
            "a",
            &pb::Progress {
                ranks: 0,
                ..at(3, 7)
            },
        );
        assert_eq!(p.reached(), None, "no rank reported");
        p.report(3, "a", &at(3, 10));
        assert_eq!(p.failed(0, "a"), None);
        p.report(4, "a", &at(4, 10));
        assert_eq!(p.failed(0, "a"), None, "0: never");
        assert_eq!(p.stalled, 1);
        // A re-formation (a node left) folds the round in: past the best,
        // the count starts again; short of it, the count is kept.
        p.report(5, "a", &at(5, 9));
        p.reformed();
        assert_eq!((p.best, p.stalled), (Some(10), 1));
        p.report(6, "a", &at(6, 12));
        p.reformed();
        assert_eq!((p.best, p.stalled), (Some(12), 0));
    }
}
