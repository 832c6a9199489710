//! Where a job's time went: goodput accounting.
//!
//! From the job's first join to its end, every instant is in exactly one
//! [`Category`]:
//! - **productive**: a round steps past the best step any earlier round
//!   reached;
//! - **recomputation**: a round redoes steps an earlier round had done (it
//!   resumed from a checkpoint before the step a failure interrupted);
//! - **recovery**: from a restart to the next round's first step (the
//!   re-formation, the workers' start, loading the checkpoint, the first
//!   step), and the part of an interrupted step done before the failure;
//! - **start-up**: from the first round's start to its first step;
//! - **waiting**: forming the first round, and any later forming while the
//!   job has fewer than its minimum nodes (a lost node not replaced yet, a
//!   quarantined host).
//!
//! The accounting is one mark and one open category: each event closes the
//! time since the mark into the category it was in and moves the mark, so
//! the categories add up to the wall time exactly (the property the unit
//! tests, the simulator and the fuzzer check). Time after a round's last
//! step is held open until the next step (then it was spent stepping) or
//! the round's end (then a failure interrupted a step: recovery).
//!
//! Steps come from the workers' progress reports, which reach the
//! rendezvous with the agents' keep-alives (every 5 s by default): each
//! report says how long ago its node's first step of the round and its
//! latest step were, so the first step is placed when it happened, not when
//! it was heard. The job's step is the freshest report's least step (each
//! node reports at its own keep-alive, and in synchronous training every
//! node is at the same step); a smaller step from an older report moves
//! nothing back. A job whose workers do not report steps spends its running
//! rounds in start-up and recovery.
//!
//! Each restart is a [`Loss`]: its cause, the step it interrupted, the
//! checkpoint the job resumes from, the steps to redo, and the recovery and
//! recomputation time it cost.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The losses a job keeps, newest last (older ones stay in the totals).
pub const MAX_LOSSES: usize = 16;
/// The stretches a job keeps for its time bar, newest last (older ones
/// stay in the totals).
pub(super) const MAX_SEGMENTS: usize = 96;
/// The longest cause kept, in bytes.
pub(super) const MAX_CAUSE: usize = 256;

/// What a stretch of a job's time was spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// Steps past the best step an earlier round reached.
    Productive,
    /// Steps an earlier round had done, redone after a restart.
    Recomputation,
    /// From a restart to the next round's first step; interrupted steps.
    Recovery,
    /// From the first round's start to its first step.
    StartUp,
    /// Forming the first round, or short of nodes.
    Waiting,
}

impl Category {
    /// Every category, in the order [`Spent`] keeps them.
    pub const ALL: [Category; 5] = [
        Category::Productive,
        Category::Recomputation,
        Category::Recovery,
        Category::StartUp,
        Category::Waiting,
    ];

    /// Its name in status output, metrics and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Category::Productive => "productive",
            Category::Recomputation => "recomputation",
            Category::Recovery => "recovery",
            Category::StartUp => "start-up",
            Category::Waiting => "waiting",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Time per category, in [`Category::ALL`]'s order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent(pub [Duration; 5]);

impl Spent {
    /// The time spent in `c`.
    pub fn of(&self, c: Category) -> Duration {
        self.0[c.index()]
    }

    /// All of it: the job's wall time (saturating: a restored record's
    /// values are not trusted to add up without overflow).
    pub fn total(&self) -> Duration {
        self.0
            .iter()
            .fold(Duration::ZERO, |a, d| a.saturating_add(*d))
    }

    fn add(&mut self, c: Category, d: Duration) {
        let t = &mut self.0[c.index()];
        *t = t.saturating_add(d);
    }
}

/// What the time since the mark is being spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Forming the first round, or short of nodes.
    Waiting,
    /// The first round runs; no step yet.
    StartUp,
    /// After a restart: forming again, or running before the first step.
    Recovery,
    /// A round steps; the mark is its last step, this one (`None`: not
    /// known, a job a replica took over).
    Stepping(Option<u64>),
    /// The job is over.
    Over,
}

/// What one restart cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// The round it ended.
    pub round: u64,
    /// When.
    pub at: Instant,
    /// Why (the restart's reason, at most 256 bytes).
    pub cause: String,
    /// The step the round had reached (`None`: none reported).
    pub step: Option<u64>,
    /// The step the job resumes from: the last checkpoint every reporting
    /// rank saved (`None`: none reported; counted as step 0).
    pub checkpoint: Option<u64>,
    /// Time lost to it: the interrupted step, and until the next round's
    /// first step.
    pub recovery: Duration,
    /// Time spent redoing the steps it lost.
    pub recomputation: Duration,
}

impl Loss {
    /// The steps to redo: from the checkpoint to the step it interrupted.
    pub fn lost_steps(&self) -> u64 {
        self.step
            .map_or(0, |s| s.saturating_sub(self.checkpoint.unwrap_or(0)))
    }
}

/// One job's accounting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Goodput {
    /// Closed time, per category.
    pub spent: Spent,
    /// What the time since `mark` is.
    pub open: Option<Open>,
    /// Accounted up to here (`None`: nothing happened yet).
    pub mark: Option<Instant>,
    /// The latest losses, oldest first (at most [`MAX_LOSSES`]).
    pub losses: VecDeque<Loss>,
    /// Restarts, all of them.
    pub restarts: u32,
    /// Steps lost to restarts, all of them.
    pub lost_steps: u64,
    /// The latest closed stretches, oldest first, adjacent ones of one
    /// category merged (at most 96): the status page's time
    /// bar. Not stored: a replica that takes the job over draws from then.
    pub segments: VecDeque<Segment>,
}

/// A closed stretch of a job's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// What it was spent on.
    pub category: Category,
    /// From when.
    pub from: Instant,
    /// How long.
    pub length: Duration,
}

/// A cause, cut to at most 256 bytes (on a character boundary).
pub fn clip(cause: &str) -> String {
    let mut end = cause.len().min(MAX_CAUSE);
    while !cause.is_char_boundary(end) {
        end -= 1;
    }
    cause[..end].to_owned()
}

/// Where the job was in its steps when a stretch ended: productive past
/// `best`, recomputation up to it.
fn split(d: Duration, from: u64, to: u64, best: Option<u64>) -> (Duration, Duration) {
    let Some(best) = best else {
        return (d, Duration::ZERO);
    };
    if from >= best {
        return (d, Duration::ZERO);
    }
    if to <= best {
        return (Duration::ZERO, d);
    }
    // Steps from..to, of which from..best were redone.
    let redo = d.mul_f64((best - from) as f64 / (to - from) as f64).min(d);
    (d - redo, redo)
}

impl Goodput {
    fn open(&self) -> Open {
        self.open.unwrap_or(Open::Waiting)
    }

    /// Starts the accounting at the first event.
    fn begin(&mut self, now: Instant) -> Instant {
        *self.mark.get_or_insert(now)
    }

    /// The job's time counts from `now`, unless it already counts.
    pub fn start(&mut self, now: Instant) {
        self.begin(now);
    }

    /// Closes the time up to `to` (not before the mark, not after `now`)
    /// into `c`; a recovery counts for the latest loss.
    fn close(&mut self, to: Instant, c: Category) {
        let mark = self.begin(to);
        let d = to.saturating_duration_since(mark);
        self.spent.add(c, d);
        self.segment(c, mark, d);
        if c == Category::Recovery {
            if let Some(l) = self.losses.back_mut() {
                l.recovery = l.recovery.saturating_add(d);
            }
        }
        self.mark = Some(to.max(mark));
    }

    /// Closes the time up to `to`, spent stepping from step `from` to `to`.
    fn close_steps(&mut self, to: Instant, from: u64, to_step: u64, best: Option<u64>) {
        let mark = self.begin(to);
        let d = to.saturating_duration_since(mark);
        let (productive, redo) = split(d, from, to_step, best);
        self.spent.add(Category::Productive, productive);
        self.spent.add(Category::Recomputation, redo);
        // The redone steps come first, then the new ones.
        self.segment(Category::Recomputation, mark, redo);
        self.segment(Category::Productive, mark + redo, productive);
        if let Some(l) = self.losses.back_mut() {
            l.recomputation = l.recomputation.saturating_add(redo);
        }
        self.mark = Some(to.max(mark));
    }

    /// Keeps a closed stretch for the time bar.
    fn segment(&mut self, category: Category, from: Instant, length: Duration) {
        if length.is_zero() {
            return;
        }
        if let Some(last) = self.segments.back_mut() {
            if last.category == category && last.from + last.length == from {
                last.length += length;
                return;
            }
        }
        if self.segments.len() == MAX_SEGMENTS {
            self.segments.pop_front();
        }
        self.segments.push_back(Segment {
            category,
            from,
            length,
        });
    }

    /// The category the open time is in.
    fn category(&self, best: Option<u64>) -> Option<Category> {
        Some(match self.open() {
            Open::Waiting => Category::Waiting,
            Open::StartUp => Category::StartUp,
            Open::Recovery => Category::Recovery,
            // The step being made: past the best, or not.
            Open::Stepping(Some(s)) if best.is_some_and(|b| s < b) => Category::Recomputation,
            Open::Stepping(_) => Category::Productive,
            Open::Over => return None,
        })
    }

    /// The job forms at `now`, with fewer than its minimum nodes when
    /// `short`: the first forming and a short one wait; a restarted job
    /// that has its nodes recovers.
    pub fn forming(&mut self, now: Instant, short: bool) {
        let open = self.open();
        let next = match open {
            Open::Waiting | Open::Recovery if short || self.restarts == 0 => Open::Waiting,
            Open::Waiting | Open::Recovery => Open::Recovery,
            _ => return,
        };
        if next != open {
            let c = self.category(None).unwrap_or(Category::Waiting);
            self.close(now, c);
            self.open = Some(next);
        } else {
            self.begin(now);
        }
    }

    /// A round starts running at `now`.
    pub fn round_started(&mut self, now: Instant) {
        let c = self.category(None).unwrap_or(Category::Waiting);
        self.close(now, c);
        self.open = Some(match self.restarts {
            0 => Open::StartUp,
            _ => Open::Recovery,
        });
    }

    /// The running round reached `step` at `at`, its first step having
    /// been at `first`; `best`: the furthest step an earlier round reached;
    /// `resumed`: the step the round started from (its checkpoint).
    /// Instants are clamped between the mark and `now`.
    pub fn stepped(
        &mut self,
        now: Instant,
        first: Instant,
        at: Instant,
        step: u64,
        best: Option<u64>,
        resumed: u64,
    ) {
        let mark = self.begin(now);
        let clamp = |t: Instant| t.clamp(mark, now.max(mark));
        let (first, at) = (clamp(first), clamp(at));
        let at = at.max(first);
        let from = match self.open() {
            Open::StartUp | Open::Recovery => {
                let c = self.category(best).unwrap_or(Category::Recovery);
                self.close(first, c);
                resumed
            }
            Open::Stepping(Some(from)) => from,
            // A job taken over: the steps before are not known.
            Open::Stepping(None) => step,
            Open::Waiting | Open::Over => return,
        };
        if step > from || self.open() != Open::Stepping(Some(from)) {
            self.close_steps(at, from, step.max(from), best);
            self.open = Some(Open::Stepping(Some(step.max(from))));
        }
    }

    /// The running (or forming) round ends at `now` in a restart of round
    /// `round`, for `cause`; the round had reached `step`, and the job
    /// resumes from `checkpoint`. An interrupted step is lost: recovery.
    pub fn restarted(
        &mut self,
        now: Instant,
        round: u64,
        cause: &str,
        step: Option<u64>,
        checkpoint: Option<u64>,
    ) {
        let c = match self.open() {
            Open::Stepping(_) => Category::Recovery,
            _ => self.category(None).unwrap_or(Category::Waiting),
        };
        let cause = clip(cause);
        let loss = Loss {
            round,
            at: now,
            cause,
            step,
            checkpoint,
            recovery: Duration::ZERO,
            recomputation: Duration::ZERO,
        };
        self.restarts = self.restarts.saturating_add(1);
        self.lost_steps = self.lost_steps.saturating_add(loss.lost_steps());
        if self.losses.len() == MAX_LOSSES {
            self.losses.pop_front();
        }
        self.losses.push_back(loss);
        self.close(now, c);
        self.open = Some(Open::Recovery);
    }

    /// The job ends at `now`; `succeeded`: the steps since the last one
    /// count as they were being made, otherwise they were lost (recovery).
    pub fn finished(&mut self, now: Instant, succeeded: bool, best: Option<u64>) {
        let c = match (self.open(), succeeded) {
            (Open::Over, _) => return,
            (Open::Stepping(_), false) => Category::Recovery,
            _ => self.category(best).unwrap_or(Category::Waiting),
        };
        self.close(now, c);
        self.open = Some(Open::Over);
    }

    /// The time spent by `now`, the open stretch in the category it is in
    /// so far (`best`: the furthest step an earlier round reached).
    pub fn spent_by(&self, now: Instant, best: Option<u64>) -> Spent {
        let mut spent = self.spent;
        if let (Some(mark), Some(c)) = (self.mark, self.category(best)) {
            spent.add(c, now.saturating_duration_since(mark));
        }
        spent
    }

    /// The category of the time now (`None`: the job is over).
    pub fn now_in(&self, best: Option<u64>) -> Option<Category> {
        self.category(best)
    }
}

/// A [`Goodput`] as data for a job record: durations in microseconds,
/// instants as [`super::Offset`]s from when the record was taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// Closed time per category, µs, in [`Category::ALL`]'s order.
    pub spent_us: [u64; 5],
    /// The open category: 0 none yet, 1 waiting, 2 start-up, 3 recovery,
    /// 4 stepping, 5 over.
    pub open: u32,
    /// Stepping: the last step (`None`: not known).
    pub open_step: Option<u64>,
    /// The mark.
    pub mark: Option<super::Offset>,
    /// The latest losses.
    pub losses: Vec<StoredLoss>,
    /// Restarts, all of them.
    pub restarts: u32,
    /// Steps lost to restarts, all of them.
    pub lost_steps: u64,
}

/// A [`Loss`] as data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredLoss {
    /// [`Loss::round`].
    pub round: u64,
    /// [`Loss::at`].
    pub at: super::Offset,
    /// [`Loss::cause`].
    pub cause: String,
    /// [`Loss::step`].
    pub step: Option<u64>,
    /// [`Loss::checkpoint`].
    pub checkpoint: Option<u64>,
    /// [`Loss::recovery`], µs.
    pub recovery_us: u64,
    /// [`Loss::recomputation`], µs.
    pub recomputation_us: u64,
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Goodput {
    /// Its record at `now`. Durations keep whole microseconds.
    pub fn store(&self, now: Instant) -> Stored {
        let (open, open_step) = match self.open {
            None => (0, None),
            Some(Open::Waiting) => (1, None),
            Some(Open::StartUp) => (2, None),
            Some(Open::Recovery) => (3, None),
            Some(Open::Stepping(s)) => (4, s),
            Some(Open::Over) => (5, None),
        };
        Stored {
            spent_us: self.spent.0.map(us),
            open,
            open_step,
            mark: self.mark.map(|t| super::record::offset(t, now)),
            losses: self
                .losses
                .iter()
                .map(|l| StoredLoss {
                    round: l.round,
                    at: super::record::offset(l.at, now),
                    cause: l.cause.clone(),
                    step: l.step,
                    checkpoint: l.checkpoint,
                    recovery_us: us(l.recovery),
                    recomputation_us: us(l.recomputation),
                })
                .collect(),
            restarts: self.restarts,
            lost_steps: self.lost_steps,
        }
    }

    /// The accounting a record describes, rebased onto `now`. The time
    /// between taking the record and restoring it is elided, as for every
    /// instant of a record (the `record` module). Out-of-range values are
    /// clamped, never trusted.
    pub fn restore(s: Stored, now: Instant) -> Self {
        let open = match s.open {
            0 => None,
            1 => Some(Open::Waiting),
            2 => Some(Open::StartUp),
            3 => Some(Open::Recovery),
            4 => Some(Open::Stepping(s.open_step)),
            _ => Some(Open::Over),
        };
        let mut losses: VecDeque<Loss> = s
            .losses
            .into_iter()
            .map(|l| Loss {
                round: l.round,
                at: super::record::instant(l.at, now),
                cause: l.cause,
                step: l.step,
                checkpoint: l.checkpoint,
                recovery: Duration::from_micros(l.recovery_us),
                recomputation: Duration::from_micros(l.recomputation_us),
            })
            .collect();
        while losses.len() > MAX_LOSSES {
            losses.pop_front();
        }
        Goodput {
            spent: Spent(s.spent_us.map(Duration::from_micros)),
            open,
            // A mark ahead of now (a record that disagrees with itself)
            // is now.
            mark: s.mark.map(|m| super::record::instant(m, now).min(now)),
            losses,
            restarts: s.restarts,
            lost_steps: s.lost_steps,
            segments: VecDeque::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// The acceptance scenario: steps every second, a checkpoint every 10
    /// steps, a failure at step 35, resumed from step 30.
    #[test]
    fn a_failure_at_35_after_a_checkpoint_at_30_costs_recovery_and_5_steps_of_recomputation() {
        let t0 = crate::clock::epoch();
        let at = |secs: u64| t0 + s(secs);
        let mut g = Goodput::default();
        g.forming(at(0), true);
        g.forming(at(1), false);
        g.round_started(at(2));
        // First step 3 s after the start; reports every 5 s.
        g.stepped(at(6), at(5), at(6), 1, None, 0);
        g.stepped(at(11), at(5), at(11), 6, None, 0);
        g.stepped(at(39), at(5), at(39), 34, None, 0);
        g.stepped(at(40), at(5), at(40), 35, None, 0);
        // Killed at 40.5: the half step is lost.
        g.restarted(
            at(40) + Duration::from_millis(500),
            0,
            "rank 3 killed",
            Some(35),
            Some(30),
        );
        g.forming(at(41), false);
        g.round_started(at(41));
        // Back at step 31 at 44: recovery 40.5 → 44 (3.5 s).
        g.stepped(at(45), at(44), at(45), 32, Some(35), 30);
        g.stepped(at(48), at(44), at(48), 35, Some(35), 30);
        g.stepped(at(53), at(44), at(53), 40, Some(35), 30);
        g.finished(at(54), true, Some(35));
        let spent = g.spent;
        assert_eq!(spent.total(), s(54), "every second is in one category");
        assert_eq!(spent.of(Category::Waiting), s(2));
        assert_eq!(spent.of(Category::StartUp), s(3));
        assert_eq!(
            spent.of(Category::Recovery),
            Duration::from_millis(500) + s(3) + Duration::from_millis(500)
        );
        // 44 → 48: steps 30 → 35 (4 s); 48 → 53 + the last second: past.
        assert_eq!(spent.of(Category::Recomputation), s(4));
        assert_eq!(spent.of(Category::Productive), s(35) + s(6));
        let loss = &g.losses[0];
        assert_eq!(loss.lost_steps(), 5);
        assert_eq!(loss.recovery, s(4));
        assert_eq!(loss.recomputation, s(4));
        assert_eq!((g.restarts, g.lost_steps), (1, 5));
        // The time bar: in order, merged, covering the whole job.
        let bar: Vec<(Category, u64)> = g
            .segments
            .iter()
            .map(|s| (s.category, s.length.as_millis() as u64))
            .collect();
        use Category::*;
        assert_eq!(
            bar,
            [
                (Waiting, 2000),
                (StartUp, 3000),
                (Productive, 35000),
                (Recovery, 4000),
                (Recomputation, 4000),
                (Productive, 6000)
            ]
        );
        let mut at = t0;
        for s in &g.segments {
            assert_eq!(s.from, at, "segments are contiguous");
            at = s.from + s.length;
        }
    }

    #[test]
    fn a_stretch_that_passes_the_best_step_is_split_by_steps() {
        let (p, r) = split(s(10), 30, 40, Some(35));
        assert_eq!((p, r), (s(5), s(5)));
        assert_eq!(split(s(10), 30, 40, None), (s(10), Duration::ZERO));
        assert_eq!(split(s(10), 36, 40, Some(35)), (s(10), Duration::ZERO));
        assert_eq!(split(s(10), 30, 35, Some(35)), (Duration::ZERO, s(10)));
    }

    #[test]
    fn a_restart_never_counts_as_productive() {
        let t0 = crate::clock::epoch();
        let mut g = Goodput::default();
        g.round_started(t0);
        g.stepped(t0 + s(2), t0 + s(1), t0 + s(2), 10, None, 0);
        let before = g.spent_by(t0 + s(2), None).of(Category::Productive);
        // Silent for 30 s (a node died), then lost.
        g.restarted(t0 + s(32), 0, "node lost", Some(10), None);
        g.forming(t0 + s(33), true);
        g.forming(t0 + s(60), false);
        g.round_started(t0 + s(61));
        let spent = g.spent_by(t0 + s(70), Some(10));
        assert_eq!(spent.of(Category::Productive), before);
        assert_eq!(spent.of(Category::Waiting), s(27));
        assert_eq!(spent.total(), s(70));
        assert_eq!(
            g.losses[0].recovery,
            s(32),
            "the open stretch is not closed yet"
        );
    }

    #[test]
    fn a_job_without_reports_starts_up_and_recovers() {
        let t0 = crate::clock::epoch();
        let mut g = Goodput::default();
        g.forming(t0, false);
        g.round_started(t0 + s(1));
        g.restarted(t0 + s(5), 0, "exit 1", None, None);
        g.round_started(t0 + s(6));
        g.finished(t0 + s(9), true, None);
        assert_eq!(g.spent.of(Category::Waiting), s(1));
        assert_eq!(g.spent.of(Category::StartUp), s(4));
        assert_eq!(g.spent.of(Category::Recovery), s(4));
        assert_eq!(g.spent.total(), s(9));
        assert_eq!(
            g.spent_by(t0 + s(100), None).total(),
            s(9),
            "over: no more time"
        );
    }

    #[test]
    fn reports_out_of_order_or_from_before_the_mark_are_clamped() {
        let t0 = crate::clock::epoch();
        let mut g = Goodput::default();
        g.round_started(t0 + s(10));
        // A first step "before" the round started: clamped to the start.
        g.stepped(t0 + s(12), t0, t0 + s(11), 5, None, 0);
        // A smaller step later (another node's): nothing moves back.
        g.stepped(t0 + s(13), t0, t0 + s(13), 3, None, 0);
        assert_eq!(g.open, Some(Open::Stepping(Some(5))));
        assert_eq!(g.spent_by(t0 + s(20), None).total(), s(10));
        let mut losses = Goodput::default();
        for i in 0..40 {
            losses.restarted(t0 + s(i), i, &"x".repeat(1000), Some(i), None);
        }
        assert_eq!(losses.losses.len(), MAX_LOSSES);
        assert_eq!(losses.losses[0].cause.len(), MAX_CAUSE);
        assert_eq!(losses.restarts, 40);
    }
}
