//! One job's rendezvous state machine: pure, clock-injected, no I/O.
//!
//! The gRPC layer ([`crate::service`]) locks a [`Job`], calls one of its
//! methods with the current time and forwards the returned [`Outbound`]
//! events to the nodes' streams. Every decision of the server lives here, so
//! it is unit-tested with synthetic instants.
//!
//! # Rounds
//! A job moves through numbered rounds. In round `r` the job first *forms*:
//! each member stops its workers and calls `ready(r)` with the endpoint its
//! workers would use as `MASTER_ADDR:MASTER_PORT`. [`decide`] completes the
//! round once enough members are ready, assigns node ranks and pushes every
//! member its [`pb::RoundComplete`]. The round then *runs* until
//! - a member reports a worker failure: while the job-wide budget lasts the
//!   job restarts as round `r + 1` (counted), otherwise it fails;
//! - a member of the round leaves or is lost before its workers succeeded, or
//!   a node joins while the round has free slots: a membership restart, which
//!   never consumes the budget;
//! - every member of the round reports success: the job succeeded.
//!
//! Nodes beyond MAX wait as spares and take a freed slot in the next round.
//!
//! # Node ranks
//! With static rendezvous a node asks for its rank and gets exactly it. With
//! dynamic rendezvous the server assigns ranks: members of the previous round
//! keep their relative order (so ranks do not move while membership does not
//! change), and members new to the job follow, ordered by host name, then by
//! node id.
//!
//! # Cost
//! Joining, getting ready, keep-alives and success reports are O(log n) in
//! the number of members; O(n) work happens once per round (completing it,
//! restarting it) and in the periodic liveness scan. Progress reports to
//! every member are rate-limited ([`PROGRESS_EVERY`]), so a round of n nodes
//! costs O(n log n), not O(n²).

mod decide;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod lifecycle;
mod membership;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::event::Kind;

pub use decide::{decide, lost, rank_order, Decision};
pub use error::JoinError;

/// How often at most every member of a forming round is sent its progress.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Host names listed in a progress report.
const HOSTS_LISTED: usize = 16;
/// Prefix of the placeholder ids of a relearned job's absent nodes.
const ABSENT: &str = "\u{0}absent-rank-";

/// The settings every node of a job must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobConfig {
    /// Fewest nodes a round may run with.
    pub min_nodes: u32,
    /// Most nodes a round may hold.
    pub max_nodes: u32,
    /// Workers per node.
    pub nproc_per_node: u32,
    /// Job-wide restart budget.
    pub max_restarts: u32,
    /// A node silent this long is lost; `None`: never.
    pub dead_after: Option<Duration>,
    /// Once `min_nodes` are ready, how long a first round waits for more.
    pub last_call: Duration,
}

impl JobConfig {
    /// The job settings a join request carries.
    pub fn from_join(req: &pb::JoinRequest) -> Self {
        Self {
            min_nodes: req.min_nodes,
            max_nodes: req.max_nodes,
            nproc_per_node: req.nproc_per_node,
            max_restarts: req.max_restarts,
            dead_after: (req.dead_after_ms > 0).then(|| Duration::from_millis(req.dead_after_ms)),
            last_call: Duration::from_millis(req.last_call_ms),
        }
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Round `round` is forming.
    Forming,
    /// Round `round` runs.
    Running,
    /// Every worker of the last round succeeded.
    Succeeded,
    /// The job failed for the given reason.
    Failed(String),
}

impl Phase {
    /// A short name for status output.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Forming => "forming",
            Phase::Running => "running",
            Phase::Succeeded => "succeeded",
            Phase::Failed(_) => "failed",
        }
    }

    /// Whether the job is over.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed(_))
    }
}

/// One member node.
#[derive(Debug, Clone)]
pub struct Member {
    /// The agent's host name.
    pub hostname: String,
    /// Static rendezvous: the rank it asked for.
    pub requested_rank: Option<u32>,
    /// Ready for the forming round, with its offered store endpoint.
    pub ready: Option<(String, u32)>,
    /// Its rank in the running (or last) round, if it takes part.
    pub rank: Option<u32>,
    /// Its workers all succeeded in the running round.
    pub succeeded: bool,
    /// Last sign of life, on the server's clock.
    pub last_seen: Instant,
    /// Order of arrival, a tie-breaker only.
    joined_seq: u64,
}

/// An event for one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Outbound {
    /// The receiving node.
    pub to: String,
    /// What it is told.
    pub event: Kind,
}

/// One job's state.
#[derive(Debug)]
pub struct Job {
    id: String,
    config: JobConfig,
    phase: Phase,
    round: u64,
    restart_count: u32,
    members: BTreeMap<String, Member>,
    /// Node ids of the running (or last) round, in node-rank order.
    participants: Vec<String>,
    /// Members ready for the forming round.
    ready: u32,
    /// Participants whose workers all exited 0 (members or departed).
    succeeded: usize,
    last_failure: Option<String>,
    /// The first failure reported in the running round (the job's root cause if it fails).
    root_cause: Option<pb::Failure>,
    finished_at: Option<Instant>,
    next_seq: u64,
    /// Since when at least MIN members are ready for the forming round.
    min_ready_since: Option<Instant>,
    /// When every member was last sent the round's progress.
    progress_sent: Option<Instant>,
}

impl Job {
    /// A new job with the settings of its first node.
    pub fn new(id: impl Into<String>, config: JobConfig) -> Self {
        Self {
            id: id.into(),
            config,
            phase: Phase::Forming,
            round: 0,
            restart_count: 0,
            members: BTreeMap::new(),
            participants: Vec::new(),
            ready: 0,
            succeeded: 0,
            last_failure: None,
            root_cause: None,
            finished_at: None,
            next_seq: 0,
            min_ready_since: None,
            progress_sent: None,
        }
    }

    /// Rebuilds a running job from the first node that reconnects to a
    /// restarted server: the round it runs and the restart count. Every rank
    /// of that round gets a placeholder that the node holding it claims when
    /// it reconnects; a rank nobody claims within the keep-alive limit is
    /// lost, and the job re-forms without it.
    pub fn relearn(
        now: Instant,
        id: impl Into<String>,
        req: &pb::JoinRequest,
        resume: &pb::Resume,
    ) -> Self {
        let mut job = Self::new(id, JobConfig::from_join(req));
        job.phase = Phase::Running;
        job.round = resume.round;
        job.restart_count = resume.restart_count;
        for rank in 0..resume.nnodes.max(resume.node_rank + 1) {
            let id = format!("{ABSENT}{rank}");
            job.insert(
                now,
                id.clone(),
                "(not reconnected yet)".into(),
                req.node_rank.map(|_| rank),
            );
            if let Some(m) = job.members.get_mut(&id) {
                m.rank = Some(rank);
            }
            job.participants.push(id);
        }
        job
    }

    /// The job id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The job's settings.
    pub fn config(&self) -> &JobConfig {
        &self.config
    }
    /// The current phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }
    /// The current round number.
    pub fn round(&self) -> u64 {
        self.round
    }
    /// Restarts consumed from the budget.
    pub fn restart_count(&self) -> u32 {
        self.restart_count
    }
    /// The members, by node id.
    pub fn members(&self) -> &BTreeMap<String, Member> {
        &self.members
    }
    /// The first failure of the latest failed round, if any.
    pub fn last_failure(&self) -> Option<&str> {
        self.last_failure.as_deref()
    }

    /// Whether a finished job has been kept for `ttl` and may be forgotten.
    pub fn expired(&self, now: Instant, ttl: Duration) -> bool {
        self.members.is_empty()
            && self
                .finished_at
                .is_some_and(|t| now.saturating_duration_since(t) >= ttl)
    }

    /// A node is ready for `round`, offering its store endpoint.
    pub fn ready(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        master: (String, u32),
    ) -> Vec<Outbound> {
        let forming = round == self.round && self.phase == Phase::Forming;
        let Some(m) = self.members.get_mut(node_id) else {
            return Vec::new();
        };
        m.last_seen = now;
        if !forming {
            return Vec::new();
        }
        if m.ready.replace(master).is_none() {
            self.ready += 1;
        }
        let mut out = self.step(now);
        if !out.iter().any(|o| o.to == node_id) {
            // Every node hears at once that it counts; others at the progress rate.
            out.push(Outbound {
                to: node_id.to_owned(),
                event: Kind::Waiting(self.waiting(now, false)),
            });
        }
        out
    }

    /// A node's keep-alive; false if it is not a member.
    pub fn keep_alive(&mut self, now: Instant, node_id: &str) -> bool {
        self.members
            .get_mut(node_id)
            .map(|m| m.last_seen = now)
            .is_some()
    }

    /// A worker of `node_id` failed in `round`.
    pub fn failure(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        reason: String,
        detail: Option<pb::Failure>,
    ) -> Vec<Outbound> {
        self.keep_alive(now, node_id);
        if round != self.round || self.phase != Phase::Running {
            return Vec::new();
        }
        self.last_failure = Some(reason.clone());
        self.root_cause = detail;
        if self.restart_count < self.config.max_restarts {
            self.restart_count += 1;
            return self.restart(reason, true);
        }
        let reason = format!(
            "{reason}; the job's restart budget is spent ({} of --max-restarts {})",
            self.restart_count, self.config.max_restarts
        );
        self.finish(now, Phase::Failed(reason))
    }

    /// Every worker of `node_id` succeeded in `round`.
    pub fn success(&mut self, now: Instant, node_id: &str, round: u64) -> Vec<Outbound> {
        self.keep_alive(now, node_id);
        if round != self.round || self.phase != Phase::Running {
            return Vec::new();
        }
        if let Some(m) = self
            .members
            .get_mut(node_id)
            .filter(|m| m.rank.is_some() && !m.succeeded)
        {
            m.succeeded = true;
            self.succeeded += 1;
        }
        if self.succeeded == self.participants.len() {
            return self.finish(now, Phase::Succeeded);
        }
        Vec::new()
    }

    /// A node left (or its stream ended, or it was lost).
    pub fn leave(&mut self, now: Instant, node_id: &str, reason: &str) -> Vec<Outbound> {
        let forming = self.phase == Phase::Forming;
        match self.remove(node_id, reason) {
            Some(_) if forming => self.step(now),
            Some(out) => out,
            None => Vec::new(),
        }
    }

    /// Drops a member without deciding anything: a forming round is decided
    /// by the caller, once. `None`: not a member.
    fn remove(&mut self, node_id: &str, reason: &str) -> Option<Vec<Outbound>> {
        let m = self.members.remove(node_id)?;
        if m.ready.is_some() {
            self.ready -= 1;
        }
        Some(match self.phase {
            // A node whose workers succeeded may go; the others finish the round.
            Phase::Running if m.rank.is_some() && !m.succeeded => self.restart(
                format!("host '{}' left the job: {reason}", m.hostname),
                false,
            ),
            _ => Vec::new(),
        })
    }

    /// Periodic work: lost nodes, the last call, rate-limited progress.
    pub fn tick(&mut self, now: Instant) -> Vec<Outbound> {
        let mut out = Vec::new();
        // Every lost node goes before the round is decided, so a round never
        // completes with a node this same tick drops (fuzz_regressions.rs).
        for id in lost(now, self) {
            out.extend(self.remove(&id, "no keep-alive in time").unwrap_or_default());
        }
        // step() completes the round if the last call ended and reports
        // progress when due; otherwise it does nothing.
        out.extend(self.step(now));
        out
    }

    /// Ends the job for everyone (server shutdown); `may_rejoin`: the server
    /// may come back and relearn the job.
    pub fn close(&mut self, reason: &str, may_rejoin: bool) -> Vec<Outbound> {
        let out = self.broadcast(Kind::JobClosed(pb::JobClosed {
            reason: reason.to_owned(),
            may_rejoin,
        }));
        self.members.clear();
        // The counters follow the members: a join racing the shutdown must
        // not find a ready count with nobody ready (fuzz_regressions.rs).
        self.ready = 0;
        self.min_ready_since = None;
        out
    }
}

fn joined(node_id: &str, round: u64, resumed: bool) -> Outbound {
    Outbound {
        to: node_id.to_owned(),
        event: Kind::Joined(pb::Joined { round, resumed }),
    }
}

#[cfg(test)]
mod fuzz_regressions;
#[cfg(test)]
mod tests;
