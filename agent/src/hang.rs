//! Hangs without a guessed timeout: timeouts learned from each rank's own
//! step times (`--learned-hang-timeouts`).
//!
//! A FileTimer catches a hang only if the script armed one with a timeout
//! someone guessed. With progress reports (`accel.progress(step)`) the agent
//! knows when each of its ranks finished each step, so it can learn how
//! long a step takes and call a rank hung when it has been silent much
//! longer than that:
//!
//! - after a step, the timeout is `--hang-safety-factor` (3) times the 99th
//!   percentile of the rank's last [`WINDOW`] step times, at least
//!   `--hang-timeout-floor` and at most `--hang-timeout-cap`; until
//!   [`MIN_SAMPLES`] steps are known, and before a round's first step
//!   (start-up, loading a checkpoint, compiling), it is
//!   `--first-step-timeout`;
//! - inside a named section (`with accel.section("checkpoint"):`, for work
//!   that is not a step: saving, evaluating), the factor times the longest
//!   earlier run of that section, within the same floor and cap; the
//!   first run of a section gets the cap.
//!
//! A hung rank is handled as an expired FileTimer is (`crate::file_timer`):
//! every rank's stacks are collected through the rendezvous into its error
//! file, then it is killed, and the job restarts as after any failure. One
//! verdict per round: in synchronous training every rank stops when one
//! hangs (the others wait in a collective), so the first verdict is the
//! round's, and the stacks show where each rank is.
//!
//! Step times survive a restart (the same job steps as fast after it);
//! the silence before a new round's first step is judged by the
//! first-step timeout. This module is the pure decision, clock-injected;
//! the socket reader feeds it and a ticking task acts on its verdicts.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Step times kept per rank.
pub const WINDOW: usize = 256;
/// Steps a rank must have done before its step timeout is learned.
pub const MIN_SAMPLES: usize = 10;
/// Section names a rank may use; more are ignored.
pub const MAX_SECTIONS: usize = 16;
/// The longest section name.
pub const MAX_SECTION_NAME: usize = 32;

/// The flags' values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Times the learned step (or section) time.
    pub factor: f64,
    /// The least timeout.
    pub floor: Duration,
    /// The largest timeout (and a section's before it is learned).
    pub cap: Duration,
    /// Before a round's first step, and while too few steps are known.
    pub first_step: Duration,
}

// The factor is a finite number (`--hang-safety-factor` takes no other).
impl Eq for Settings {}

impl Default for Settings {
    fn default() -> Self {
        Self {
            factor: 3.0,
            floor: Duration::from_secs(30),
            cap: Duration::from_secs(3600),
            first_step: Duration::from_secs(1800),
        }
    }
}

/// What a rank is doing, for its timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Doing {
    /// Before the round's first step, or still learning.
    FirstSteps,
    /// Between steps, its step time learned.
    Stepping {
        /// The learned step time (the 99th percentile of the window).
        p99: Duration,
    },
    /// Inside a section.
    Section {
        /// Its name.
        name: String,
        /// The longest earlier run of it (`None`: the first).
        longest: Option<Duration>,
    },
}

/// A rank's report, as the socket reader hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A step is done.
    Step,
    /// A section begins.
    Begin(String),
    /// A section ends.
    End(String),
}

#[derive(Debug, Clone, Default)]
struct Clock {
    /// The last sign of progress: the round's start, a step, a section's
    /// edge.
    since: Option<Instant>,
    /// The last step of this round.
    last_step: Option<Instant>,
    steps: VecDeque<Duration>,
    section: Option<(String, Instant)>,
    longest: HashMap<String, Duration>,
}

/// A rank that stopped making progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Hang {
    /// Its local rank.
    pub local_rank: u32,
    /// How long it has been silent.
    pub silent: Duration,
    /// The timeout it passed.
    pub timeout: Duration,
    /// What it was doing.
    pub doing: Doing,
}

impl Hang {
    /// What the failure report says.
    pub fn message(&self, rank: u32) -> String {
        let secs = |d: Duration| format!("{:.2}s", d.as_secs_f64());
        let why = match &self.doing {
            Doing::FirstSteps => "--first-step-timeout: before its first steps".to_owned(),
            Doing::Stepping { p99 } => format!(
                "learned from its step times: 99th percentile {} x --hang-safety-factor, within --hang-timeout-floor and --hang-timeout-cap",
                secs(*p99)
            ),
            Doing::Section {
                name,
                longest: Some(l),
            } => format!(
                "in section '{name}', learned from its longest earlier run {} x --hang-safety-factor",
                secs(*l)
            ),
            Doing::Section {
                name,
                longest: None,
            } => format!("in section '{name}' for the first time: --hang-timeout-cap"),
        };
        format!(
            "rank {rank} made no progress for {} (timeout {}, {why}): it hung",
            secs(self.silent),
            secs(self.timeout)
        )
    }
}

/// The node's ranks' clocks and the verdict of the round.
#[derive(Debug, Clone)]
pub struct Watch {
    settings: Settings,
    ranks: HashMap<u32, Clock>,
    /// The round's verdict was given.
    judged: bool,
}

fn p99(steps: &VecDeque<Duration>) -> Duration {
    let mut v: Vec<Duration> = steps.iter().copied().collect();
    v.sort_unstable();
    let i = ((v.len() as f64) * 0.99).ceil() as usize;
    v[i.saturating_sub(1).min(v.len() - 1)]
}

impl Watch {
    /// A watch with these settings.
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            ranks: HashMap::new(),
            judged: false,
        }
    }

    /// A round's workers start at `now`: `nproc` ranks, each judged from
    /// now by the first-step timeout.
    pub fn new_round(&mut self, now: Instant, nproc: u32) {
        self.ranks.retain(|r, _| *r < nproc);
        for r in 0..nproc {
            let c = self.ranks.entry(r).or_default();
            c.since = Some(now);
            c.last_step = None;
            c.section = None;
        }
        self.judged = false;
    }

    /// The round's workers stopped: nothing is judged until the next.
    pub fn stopped(&mut self) {
        for c in self.ranks.values_mut() {
            c.since = None;
        }
    }

    /// Rank `local_rank`'s worker exited (its workers' others may run on):
    /// its silence is no hang.
    pub fn exited(&mut self, local_rank: u32) {
        if let Some(c) = self.ranks.get_mut(&local_rank) {
            c.since = None;
        }
    }

    /// Rank `local_rank` reports `event` at `now`.
    pub fn observe(&mut self, now: Instant, local_rank: u32, event: Event) {
        let Some(c) = self.ranks.get_mut(&local_rank) else {
            return; // not a rank of this round
        };
        if c.since.is_none() {
            return;
        }
        match event {
            Event::Step => {
                if let Some(last) = c.last_step {
                    // A section between two steps is not step time.
                    let took = now.saturating_duration_since(last.max(c.since.unwrap_or(last)));
                    if c.steps.len() == WINDOW {
                        c.steps.pop_front();
                    }
                    c.steps.push_back(took);
                }
                c.last_step = Some(now);
            }
            Event::Begin(name) => {
                let known = c.longest.contains_key(&name) || c.longest.len() < MAX_SECTIONS;
                if known && name.len() <= MAX_SECTION_NAME {
                    c.section = Some((name, now));
                }
            }
            Event::End(name) => match c.section.take() {
                Some((open, began)) if open == name => {
                    let took = now.saturating_duration_since(began);
                    let l = c.longest.entry(name).or_default();
                    *l = (*l).max(took);
                }
                other => c.section = other,
            },
        }
        c.since = Some(now);
    }

    /// `d` times the factor, within the floor and the cap.
    fn scaled(&self, d: Duration) -> Duration {
        let s = &self.settings;
        let cap = s.cap.max(s.floor);
        Duration::try_from_secs_f64(d.as_secs_f64() * s.factor)
            .unwrap_or(cap)
            .clamp(s.floor, cap)
    }

    /// What `c` is doing and its timeout.
    fn timeout(&self, c: &Clock) -> (Duration, Doing) {
        let s = &self.settings;
        let clamp = |d: Duration| self.scaled(d);
        if let Some((name, _)) = &c.section {
            let longest = c.longest.get(name).copied();
            let timeout = longest.map_or(s.cap, clamp);
            return (
                timeout,
                Doing::Section {
                    name: name.clone(),
                    longest,
                },
            );
        }
        if c.last_step.is_none() || c.steps.len() < MIN_SAMPLES {
            return (s.first_step, Doing::FirstSteps);
        }
        let p = p99(&c.steps);
        (clamp(p), Doing::Stepping { p99: p })
    }

    /// The round's hang, once: the rank silent past its timeout the
    /// longest (the first to pass it), if any.
    pub fn expired(&mut self, now: Instant) -> Option<Hang> {
        if self.judged {
            return None;
        }
        let mut worst: Option<Hang> = None;
        for (r, c) in &self.ranks {
            let Some(since) = c.since else { continue };
            let silent = now.saturating_duration_since(since);
            let (timeout, doing) = self.timeout(c);
            if silent <= timeout {
                continue;
            }
            let over = silent - timeout;
            if worst.as_ref().is_none_or(|w| {
                over > w.silent - w.timeout || (over == w.silent - w.timeout && *r < w.local_rank)
            }) {
                worst = Some(Hang {
                    local_rank: *r,
                    silent,
                    timeout,
                    doing,
                });
            }
        }
        self.judged = worst.is_some();
        worst
    }

    /// The longest step timeout the ranks learned (`None`: none yet), for
    /// the rendezvous's status.
    pub fn learned(&self) -> Option<Duration> {
        self.ranks
            .values()
            .filter(|c| c.steps.len() >= MIN_SAMPLES)
            .map(|c| self.scaled(p99(&c.steps)))
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn settings() -> Settings {
        Settings {
            factor: 3.0,
            floor: ms(100),
            cap: ms(60_000),
            first_step: ms(10_000),
        }
    }

    #[test]
    fn a_rank_silent_past_three_times_its_step_time_hung() {
        let t0 = Instant::now();
        let mut w = Watch::new(settings());
        w.new_round(t0, 2);
        let mut t = t0 + ms(2000);
        for _ in 0..50 {
            t += ms(100);
            w.observe(t, 0, Event::Step);
            w.observe(t, 1, Event::Step);
        }
        assert_eq!(w.learned(), Some(ms(300)));
        assert_eq!(w.expired(t + ms(300)), None, "not past 3 x 100 ms");
        let hang = w.expired(t + ms(301)).expect("hung");
        assert_eq!(hang.local_rank, 0, "both stopped at once: the first rank");
        assert_eq!((hang.silent, hang.timeout), (ms(301), ms(300)));
        assert!(hang
            .message(4)
            .contains("rank 4 made no progress for 0.30s (timeout 0.30s, learned"));
        assert_eq!(w.expired(t + ms(5000)), None, "one verdict per round");
        // The next round learns nothing new until its first step: the
        // first-step timeout.
        w.new_round(t + ms(6000), 2);
        assert_eq!(w.expired(t + ms(15_000)), None);
        assert!(matches!(
            w.expired(t + ms(16_001)),
            Some(Hang {
                doing: Doing::FirstSteps,
                ..
            })
        ));
    }

    /// The acceptance: 1,000 steps of 100 ms ± 50 % (uniform), under 8 seeds,
    /// no verdict;
    /// then a silence is caught within 3 x the learned step time.
    #[test]
    fn jittery_steps_never_hang_and_a_real_stop_is_caught() {
        let mut rng = fastrand::Rng::with_seed(7);
        for seed in 0..8u64 {
            rng.seed(seed);
            let t0 = Instant::now();
            let mut w = Watch::new(Settings {
                floor: ms(1),
                ..settings()
            });
            w.new_round(t0, 1);
            let mut t = t0;
            for _ in 0..1000 {
                let step = ms(50 + rng.u64(0..=100));
                // Checked every 10 ms while the step runs (as the agent
                // checks every floor / 10).
                let end = t + step;
                while t + ms(10) < end {
                    t += ms(10);
                    assert_eq!(w.expired(t), None, "seed {seed}: a false hang");
                }
                t = end;
                w.observe(t, 0, Event::Step);
            }
            let learned = w.learned().expect("learned");
            assert!(learned <= ms(450) && learned >= ms(400), "{learned:?}");
            let hang = (1..)
                .map(|k| t + ms(10 * k))
                .find_map(|at| w.expired(at))
                .expect("hang");
            assert!(hang.silent <= learned + ms(10), "{hang:?}");
        }
    }

    #[test]
    fn sections_get_their_own_learned_timeout() {
        let t0 = Instant::now();
        let mut w = Watch::new(settings());
        w.new_round(t0, 1);
        let mut t = t0;
        for _ in 0..20 {
            t += ms(100);
            w.observe(t, 0, Event::Step);
        }
        // A 2 s checkpoint the first time: the cap, not the step timeout.
        w.observe(t, 0, Event::Begin("checkpoint".into()));
        assert_eq!(w.expired(t + ms(2000)), None);
        t += ms(2000);
        w.observe(t, 0, Event::End("checkpoint".into()));
        // The step after it is not 2 s of step time.
        t += ms(100);
        w.observe(t, 0, Event::Step);
        assert_eq!(w.learned(), Some(ms(300)));
        // The next checkpoint may take 3 x 2 s.
        w.observe(t, 0, Event::Begin("checkpoint".into()));
        assert_eq!(w.expired(t + ms(6000)), None);
        let hang = w.expired(t + ms(6001)).expect("hung in the section");
        assert_eq!(
            hang.doing,
            Doing::Section {
                name: "checkpoint".into(),
                longest: Some(ms(2000))
            }
        );
    }

    #[test]
    fn strangers_stopped_rounds_and_unbounded_sections_are_ignored() {
        let t0 = Instant::now();
        let mut w = Watch::new(settings());
        w.observe(t0, 0, Event::Step);
        assert_eq!(w.expired(t0 + ms(100_000)), None, "no round");
        w.new_round(t0, 1);
        w.observe(t0, 5, Event::Step);
        w.stopped();
        assert_eq!(w.expired(t0 + ms(100_000)), None, "stopped");
        // A rank whose worker exited (done before the others) is not hung.
        w.new_round(t0, 2);
        w.exited(1);
        w.observe(t0 + ms(99_000), 0, Event::Step);
        assert_eq!(w.expired(t0 + ms(100_000)), None, "exited");
        w.stopped();
        assert_eq!(w.expired(t0 + ms(100_000)), None, "stopped");
        w.new_round(t0, 1);
        for i in 0..40 {
            w.observe(t0, 0, Event::Begin(format!("s{i}")));
            w.observe(t0, 0, Event::End(format!("s{i}")));
        }
        assert_eq!(w.ranks[&0].longest.len(), MAX_SECTIONS);
        w.observe(t0, 0, Event::Begin("x".repeat(33)));
        assert_eq!(w.ranks[&0].section, None);
    }
}
