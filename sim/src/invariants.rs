//! The invariants, checked after every step of a simulation and at its
//! end. They are the chaos run's (`tests/src/chaos/invariants.rs`), stated
//! on the simulator's exact bookkeeping instead of the workers' records:
//!
//! * (a) **fencing and ranks**: no global rank is held by two live workers
//!   at once (the chaos run's `fencing`); within a round every rank is
//!   below the world size, held once, and follows the node layout
//!   (`node_rank × nproc + local_rank`); the round the job succeeded in
//!   started every rank `0..world` (the chaos run's `round_ranks`).
//! * (b) **budget**: restarts are counted job-wide, never beyond
//!   `max_restarts`, and only by worker failures: no round a worker sees
//!   has a restart count above the failures injected so far, and a counted
//!   restart is never announced without one (membership changes, fencing
//!   and server restarts spend nothing: the chaos run's `budget`).
//! * (c) **liveness**: once the faults heal, the job ends (success, or a
//!   failure with a reason) and every agent's life is over within a bound
//!   (the chaos run's `liveness`); a driver never busy-loops.
//! * (d) **exit codes**: an agent that exits 0 belongs to a job that
//!   succeeded, one that exits with a failed outcome to a job that failed;
//!   an agent no fault touched exits with the job's code.
//! * (e) **segments**: in a running round of dynamic rendezvous, the nodes
//!   of each topology path hold one run of node ranks (the server's
//!   `job::placement`); the chaos run has no paths.
//! * (f) **quarantine**: no node of a benched host gets a rank in a round
//!   that forms while its host is benched (`job::quarantine`): benched in
//!   the job when the round completes, or by a bench the job announced
//!   earlier that has neither run out nor been released since (a server
//!   that forgets a bench does not excuse it; a job relearned without a
//!   store starts without benches).
//! * (g) **control plane**: in a run whose only faults are the
//!   rendezvous's (paused, killed, restarted empty or failed over, cut off
//!   from every node), each short enough for the nodes' outage limit (less
//!   a keep-alive, the rejoin and the margins), at timings where the peers'
//!   evidence reaches past its ping at all, of a job that never changes
//!   size (no spare, no elastic range, no worker failure, no quarantine),
//!   no agent stops a worker: each runs until it exits by itself (the peer
//!   hub, and the server's mass-silence hold). The random mode marks such
//!   runs ([`Checker::calm`]); a scenario says `expect stopped 0`.
//! * (h) **goodput**: the categories of the server's goodput accounting
//!   add up to the time that passed (every instant in exactly one), and a
//!   forming job never gains productive time (a restart is never
//!   productive); compared for one job while the server holds it (a
//!   restored job's accounting elides the failover, as its records do).
//! * (j) **world sizes**: every round a worker runs in has a node count the
//!   job can use: at most `max_nodes`, and a multiple of
//!   `--nnodes-multiple-of` (the server's `JobConfig::allowed`).
//! * (i) **durability**: a server that takes over from the store holds the
//!   job at least at the highest round any node was told of (a round
//!   formed, a restart's next round): no node acts on a decision the store
//!   did not hold (the registry's commit path). Checked in the world, at
//!   each failover from a store the crashed server wrote.
//!
//! The chaos run checks the same properties on real processes' records
//! (pids, timestamps written by the workers), where an overlap shorter than
//! a heartbeat may go unseen; here every start and death is known exactly,
//! so its record-based functions are not shared (they would need worker
//! records the simulator would have to fake). The letters differ: the
//! chaos run's (b) and (c) are (a) and (b) here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use accel_agent::agent::round::RoundInfo;
use accel_proto::v1 as pb;
use pb::event::Kind;
use rendezvous_server::job::Phase;

use crate::world::{End, Node, Spec, Worker, World};

/// A topology path whose nodes do not hold one run of node ranks in the
/// running round of a dynamic job (placeholders of a relearned job, which
/// have no path, are skipped).
fn split_segment(job: &rendezvous_server::job::Job) -> Option<String> {
    let members = job.members();
    if *job.phase() != Phase::Running || members.values().any(|m| m.requested_rank.is_some()) {
        return None;
    }
    let paths: Vec<&str> = job
        .participants()
        .iter()
        .filter(|id| !id.starts_with('\0'))
        .filter_map(|id| members.get(id))
        .map(|m| &*m.topology)
        .collect();
    // Each run's path must be new: a path seen in an earlier run is split.
    let mut seen = BTreeSet::new();
    for (k, p) in paths.iter().enumerate() {
        let starts_run = k == 0 || paths[k - 1] != *p;
        if starts_run && !seen.insert(*p) {
            return Some(format!("segments: topology path '{p}' is split: {paths:?}"));
        }
    }
    None
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which: `a` to `f`.
    pub invariant: char,
    /// What broke, in a sentence.
    pub what: String,
    /// When (virtual time).
    pub at: Duration,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant ({}) at {:.3}s: {}",
            self.invariant,
            self.at.as_secs_f64(),
            self.what
        )
    }
}

/// The invariants' bookkeeping.
#[derive(Debug, Clone, Default)]
pub struct Checker {
    nproc: u32,
    /// `--nnodes-multiple-of` (0 or 1: any) and `max_nodes` (invariant j).
    multiple_of: u32,
    max_nodes: u32,
    max_restarts: u32,
    /// Worker failures injected so far.
    pub failures: u32,
    /// Nodes a fault touched (their agents may end with an error).
    pub excused: BTreeSet<usize>,
    /// Live workers: pid → (global rank, node, round).
    live: BTreeMap<u32, (u32, usize, u64)>,
    /// Which job: a server restarted without a store starts a new one
    /// (rounds from 0) when a node joins afresh.
    pub generation: u64,
    /// Ranks started per round: (generation, round) → rank → pid.
    rounds: BTreeMap<(u64, u64), BTreeMap<u32, u32>>,
    /// World size per round.
    worlds: BTreeMap<(u64, u64), u32>,
    /// Rounds a counted restart left.
    counted: BTreeSet<u64>,
    /// The job's outcome, as first announced (a server restarted without
    /// a store forgets it).
    pub outcome: Option<Result<(), String>>,
    /// Each job instance's outcome, as announced: a server restarted
    /// without a store may relearn a job that had ended from a node cut
    /// off before the end, and that instance ends on its own.
    outcomes: BTreeMap<u64, Result<(), String>>,
    /// The job instance each agent ended in.
    pub ended_in: BTreeMap<usize, u64>,
    /// What broke.
    pub violations: Vec<Violation>,
    /// Workers started in all.
    pub started: u32,
    /// The held job's accounting at the last step: which job, when, its
    /// time so far, and whether it was over.
    goodput: Option<(u64, Duration, rendezvous_server::job::Spent, Phase)>,
    /// Hosts the job benched, until when (virtual time), as last seen.
    benches: BTreeMap<String, Duration>,
    /// Live workers their agents stopped (fenced, re-formed, shut down), in
    /// all.
    pub stopped: u32,
    /// The run's faults are control-plane ones only, each shorter than the
    /// outage limit can ride out ([`crate::random`]): no agent may stop a
    /// worker (invariant g).
    pub calm: bool,
}

impl Checker {
    /// Bookkeeping for a job of `spec`.
    pub fn new(spec: &Spec) -> Self {
        Self {
            nproc: spec.nproc,
            multiple_of: spec.multiple_of,
            max_nodes: spec.max_nodes,
            max_restarts: spec.max_restarts,
            ..Self::default()
        }
    }

    /// Records a violation (once per sentence).
    pub fn note(&mut self, invariant: char, what: &str, at: Duration) {
        if self
            .violations
            .iter()
            .any(|v| v.invariant == invariant && v.what == what)
        {
            return;
        }
        self.violations.push(Violation {
            invariant,
            what: what.to_owned(),
            at,
        });
    }

    /// A worker starts on node `node` (`nodes[node]`'s workers are the last
    /// round's until this start completes).
    pub fn started(
        &mut self,
        nodes: &[Node],
        node: usize,
        w: &Worker,
        info: &RoundInfo,
        at: Duration,
    ) {
        self.started += 1;
        if let Some((_, other, round)) = self
            .live
            .values()
            .find(|(rank, _, _)| *rank == w.rank)
            .copied()
        {
            let what = format!(
                "fencing: rank {} started on {} in round {} while {}'s worker of round {round} with that rank still runs",
                w.rank, nodes[node].name, info.round, nodes[other].name
            );
            self.note('a', &what, at);
        }
        if w.rank >= info.world_size
            || w.rank != info.node_rank * self.nproc + w.local_rank
            || info.world_size != info.nnodes * self.nproc
        {
            let what = format!(
                "ranks: rank {} (node rank {}, local rank {}) does not fit world {} of {} nodes",
                w.rank, info.node_rank, w.local_rank, info.world_size, info.nnodes
            );
            self.note('a', &what, at);
        }
        if let Some(pid) = self
            .rounds
            .entry((self.generation, info.round))
            .or_default()
            .insert(w.rank, w.pid)
        {
            let what = format!(
                "ranks: rank {} of round {} started twice (pids {pid} and {})",
                w.rank, info.round, w.pid
            );
            self.note('a', &what, at);
        }
        if info.nnodes > self.max_nodes || info.nnodes % self.multiple_of.max(1) != 0 {
            let what = format!(
                "world sizes: round {} runs with {} nodes (at most {}, multiples of {})",
                info.round,
                info.nnodes,
                self.max_nodes,
                self.multiple_of.max(1)
            );
            self.note('j', &what, at);
        }
        self.worlds
            .insert((self.generation, info.round), info.world_size);
        if info.restart_count > self.max_restarts || info.restart_count > self.failures {
            let what = format!(
                "budget: round {} runs with restart count {} after {} worker failure(s) (--max-restarts {})",
                info.round, info.restart_count, self.failures, self.max_restarts
            );
            self.note('b', &what, at);
        }
        self.live.insert(w.pid, (w.rank, node, info.round));
    }

    /// A new job instance: a server without a store starts one when a node
    /// joins afresh, or relearns one from a resuming node, whose round
    /// `resumed` goes on (round numbers may repeat: a node cut off since
    /// an earlier round teaches that round).
    pub fn new_job(&mut self, resumed: Option<u64>) {
        let old = self.generation;
        self.generation += 1;
        // Benches are stored with the job: a job a server relearns or
        // starts afresh without a store has none.
        self.benches.clear();
        if let Some(r) = resumed {
            if let Some(ranks) = self.rounds.get(&(old, r)).cloned() {
                self.rounds.insert((self.generation, r), ranks);
            }
            if let Some(world) = self.worlds.get(&(old, r)).copied() {
                self.worlds.insert((self.generation, r), world);
            }
        }
    }

    /// The job benches `host` until `until`.
    pub fn benched(&mut self, host: String, until: Duration) {
        let at = self.benches.entry(host).or_default();
        *at = (*at).max(until);
    }

    /// An operator ended `host`'s bench.
    pub fn released(&mut self, host: &str) {
        self.benches.remove(host);
    }

    /// The server placed `node` (of `host`) in a round it completed:
    /// `benched`, whether its host is benched in the job at that moment.
    pub fn placed(
        &mut self,
        host: &str,
        node: &str,
        rc: &pb::RoundComplete,
        benched: bool,
        at: Duration,
    ) {
        let until = self.benches.get(host).copied().filter(|u| *u > at);
        if benched || until.is_some() {
            let what = format!(
                "quarantine: {node} of benched host '{host}' got node rank {} in round {}{}",
                rc.node_rank,
                rc.round,
                match until {
                    Some(u) => format!(" (benched until {:.3}s)", u.as_secs_f64()),
                    None => String::new(),
                }
            );
            self.note('f', &what, at);
        }
    }

    /// Node `node`'s agent stopped `count` live workers (a stop's end).
    pub fn stopped(&mut self, node: &str, count: usize, at: Duration) {
        self.stopped += count as u32;
        if self.calm {
            let what = format!(
                "control plane: {node} stopped {count} worker(s), though the only faults were the rendezvous's, each shorter than the outage limit"
            );
            self.note('g', &what, at);
        }
    }

    /// A worker died.
    pub fn died(&mut self, pid: u32) {
        self.live.remove(&pid);
    }

    /// An event the server sends.
    pub fn outbound(&mut self, kind: &Kind) {
        match kind {
            Kind::RestartRequested(r) if r.counted => {
                self.counted.insert(r.round);
            }
            Kind::JobSucceeded(_) => {
                self.outcome.get_or_insert(Ok(()));
                self.outcomes.entry(self.generation).or_insert(Ok(()));
            }
            Kind::JobFailed(f) => {
                self.outcome.get_or_insert(Err(f.reason.clone()));
                self.outcomes
                    .entry(self.generation)
                    .or_insert(Err(f.reason.clone()));
            }
            _ => {}
        }
    }

    /// After every step.
    pub fn step(&mut self, w: &World) {
        let at = w.now();
        if self.counted.len() as u32 > self.failures {
            let what = format!(
                "budget: {} counted restart(s) announced after {} worker failure(s)",
                self.counted.len(),
                self.failures
            );
            self.note('b', &what, at);
        }
        let now = w.instant(at);
        let held = w.with_job(|job| {
            (
                split_segment(job),
                job.restart_count(),
                job.time_spent(now),
                job.phase().clone(),
            )
        });
        if let Some((split, restarts, spent, phase)) = held {
            if let Some(what) = split {
                self.note('e', &what, at);
            }
            self.goodput(w, spent, phase, at);
            if restarts > self.max_restarts || restarts > self.failures {
                let what = format!(
                    "budget: the job counts {restarts} restart(s) after {} worker failure(s) (--max-restarts {})",
                    self.failures,
                    self.max_restarts
                );
                self.note('b', &what, at);
            }
        }
    }

    /// (h): the job's time adds up, and a forming job is not productive.
    fn goodput(
        &mut self,
        w: &World,
        spent: rendezvous_server::job::Spent,
        phase: Phase,
        at: Duration,
    ) {
        use rendezvous_server::job::Category;
        let epoch = w.job_epoch();
        if let Some((e, then, before, was)) = self.goodput.take() {
            if e == epoch {
                let passed = match was.is_terminal() {
                    true => Duration::ZERO,
                    false => at.saturating_sub(then),
                };
                if spent.total() != before.total() + passed {
                    let what = format!(
                        "goodput: the categories grew by {:?} in {passed:?} ({before:?} -> {spent:?})",
                        spent.total().saturating_sub(before.total())
                    );
                    self.note('h', &what, at);
                }
                let productive = |s: &rendezvous_server::job::Spent| s.of(Category::Productive);
                // A late report may show a stretch before a restart was
                // productive after all; a job that formed throughout may not.
                let formed = was == Phase::Forming && phase == Phase::Forming;
                if formed && productive(&spent) != productive(&before) {
                    let what = format!(
                        "goodput: a forming job gained productive time ({:?} -> {:?})",
                        productive(&before),
                        productive(&spent)
                    );
                    self.note('h', &what, at);
                }
            }
        }
        self.goodput = Some((epoch, at, spent, phase));
    }

    /// At the end of a run whose faults healed at `healed`: liveness and
    /// exit codes.
    pub fn finish(&mut self, w: &World) {
        let at = w.now();
        let outcome = self.outcome.clone().or_else(|| w.outcome());
        if !w.all_done() {
            let stuck: Vec<String> = w
                .nodes
                .iter()
                .filter(|n| n.end.is_none())
                .map(|n| format!("{} ({})", n.name, n.state()))
                .collect();
            let what = format!(
                "liveness: agents still running at the bound: {} (job: {})",
                stuck.join(", "),
                w.with_job(|j| format!("{} round {}", j.phase().name(), j.round()))
                    .unwrap_or_else(|| "gone".to_owned())
            );
            self.note('c', &what, at);
            return;
        }
        let Some(outcome) = outcome else {
            // The job never ended (its agents gave up): none may say it succeeded.
            for n in &w.nodes {
                if n.end.as_ref().and_then(End::code) == Some(0) {
                    let what = format!("exit codes: {} exited 0 but the job never ended", n.name);
                    self.note('d', &what, at);
                }
            }
            return;
        };
        if let Err(reason) = &outcome {
            if reason.is_empty() {
                self.note('c', "liveness: the job failed without a reason", at);
            }
        }
        let held = w.with_job(|j| (j.phase().clone(), j.round()));
        if let (Ok(()), Some((phase, round))) = (&outcome, held) {
            if phase == Phase::Succeeded {
                let key = (self.generation, round);
                let world = self.worlds.get(&key).copied().unwrap_or(0);
                let ranks: BTreeSet<u32> = self
                    .rounds
                    .get(&key)
                    .map(|r| r.keys().copied().collect())
                    .unwrap_or_default();
                if ranks != (0..world).collect::<BTreeSet<u32>>() {
                    let what = format!(
                        "ranks: the job succeeded in round {round} of world {world}, but ranks {ranks:?} started"
                    );
                    self.note('a', &what, at);
                }
            }
        }
        for (i, n) in w.nodes.iter().enumerate() {
            let Some(end) = &n.end else { continue };
            let outcome = self
                .ended_in
                .get(&i)
                .and_then(|g| self.outcomes.get(g))
                .unwrap_or(&outcome);
            let code = match outcome {
                Ok(()) => 0,
                Err(_) => 1,
            };
            let wrong = match end {
                End::Crashed | End::Departed => false,
                End::Outcome(accel_agent::Outcome::Succeeded) => outcome.is_err(),
                End::Outcome(
                    accel_agent::Outcome::Failed(_) | accel_agent::Outcome::NoRestart { .. },
                ) => outcome.is_ok(),
                End::Outcome(accel_agent::Outcome::Signaled(_)) => false,
                End::Error(..) => !self.excused.contains(&i),
            };
            if wrong || (!self.excused.contains(&i) && end.code() != Some(code)) {
                let what = format!(
                    "exit codes: {} ended {end:?} (code {:?}) but the job {}",
                    n.name,
                    end.code(),
                    match outcome {
                        Ok(()) => "succeeded".to_owned(),
                        Err(r) => format!("failed: {r}"),
                    }
                );
                self.note('d', &what, at);
            }
        }
    }
}
