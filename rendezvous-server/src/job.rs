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
//! - a member of the round leaves or is lost before its workers succeeded: a
//!   membership restart, which never consumes the budget;
//! - every member of the round reports success: the job succeeded.
//!
//! # Node ranks
//! With static rendezvous a node asks for its rank and gets exactly it. With
//! dynamic rendezvous the server assigns ranks: members of the previous round
//! keep their relative order (so ranks do not move while membership does not
//! change), and members new to the job follow, ordered by host name, then by
//! node id.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::event::Kind;

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

/// Why a join was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The node disagrees with the job on a setting.
    #[error("job '{job}' runs with {flag} {job_value}, but this node was started with {flag} {node_value}; start every node of a job with the same {flag}")]
    Mismatch {
        /// The job id.
        job: String,
        /// The flag that differs.
        flag: &'static str,
        /// The job's value.
        job_value: String,
        /// The joining node's value.
        node_value: String,
    },
    /// Static rendezvous: another node holds this node rank.
    #[error("node rank {rank} is already taken by host '{holder}' in job '{job}'; give every node a distinct --node-rank")]
    DuplicateRank {
        /// The job id.
        job: String,
        /// The contested rank.
        rank: u32,
        /// Host name of the node that holds it.
        holder: String,
    },
    /// A node rank outside `0..nnodes`.
    #[error("node rank {rank} is out of range for job '{job}' with {nnodes} nodes; use --node-rank between 0 and {}", nnodes - 1)]
    RankOutOfRange {
        /// The job id.
        job: String,
        /// The requested rank.
        rank: u32,
        /// The job's node count.
        nnodes: u32,
    },
    /// The node id is already a member.
    #[error("node id '{node}' already joined job '{job}'")]
    DuplicateNode {
        /// The job id.
        job: String,
        /// The node id.
        node: String,
    },
    /// The job is over.
    #[error("job '{job}' has already {outcome}; start new jobs with a new --rdzv-id")]
    Finished {
        /// The job id.
        job: String,
        /// `succeeded` or `failed`.
        outcome: &'static str,
    },
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
    /// Its rank in the running round, if it takes part.
    pub rank: Option<u32>,
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

/// What [`decide`] concluded for a job at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do.
    Idle,
    /// Still forming: `ready` of `needed` nodes are ready.
    Wait {
        /// Members ready for the round.
        ready: u32,
        /// Ready members the round needs before it may start (MIN).
        needed: u32,
        /// When the last call ends, once MIN are ready.
        last_call_ends: Option<Instant>,
    },
    /// Complete the round with these node ids, in node-rank order.
    Complete(Vec<String>),
    /// These nodes are lost (no keep-alive in time).
    Lost(Vec<String>),
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
    /// Participants whose workers all exited 0.
    succeeded: BTreeSet<String>,
    last_failure: Option<String>,
    finished_at: Option<Instant>,
    next_seq: u64,
    /// Since when at least MIN members are ready for the forming round.
    min_ready_since: Option<Instant>,
}

/// The decision function: what should happen to `job` at `now`.
pub fn decide(now: Instant, job: &Job) -> Decision {
    if job.phase.is_terminal() {
        return Decision::Idle;
    }
    if let Some(dead_after) = job.config.dead_after {
        let lost: Vec<String> = job
            .members
            .iter()
            .filter(|(_, m)| now.saturating_duration_since(m.last_seen) > dead_after)
            .map(|(id, _)| id.clone())
            .collect();
        if !lost.is_empty() {
            return Decision::Lost(lost);
        }
    }
    if job.phase != Phase::Forming {
        return Decision::Idle;
    }
    let c = &job.config;
    let ready = job.ready_count();
    if ready >= c.max_nodes {
        return Decision::Complete(job.rank_order());
    }
    if ready < c.min_nodes {
        return Decision::Wait {
            ready,
            needed: c.min_nodes,
            last_call_ends: None,
        };
    }
    // A job re-forming after a round ran starts as soon as every member is
    // ready; a first round waits out the last call for late nodes.
    if !job.participants.is_empty() && ready as usize == job.members.len() {
        return Decision::Complete(job.rank_order());
    }
    let ends = job.min_ready_since.unwrap_or(now) + c.last_call;
    if now >= ends {
        return Decision::Complete(job.rank_order());
    }
    Decision::Wait {
        ready,
        needed: c.min_nodes,
        last_call_ends: Some(ends),
    }
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
            succeeded: BTreeSet::new(),
            last_failure: None,
            finished_at: None,
            next_seq: 0,
            min_ready_since: None,
        }
    }

    /// Rebuilds a running job from the first node that reconnects to a
    /// restarted server: the round it runs, its members (the others are
    /// expected back; any that stay silent past the keep-alive limit are lost,
    /// and the rest re-form), and the restart count.
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
        let mut nodes = resume.nodes.clone();
        nodes.sort_by_key(|n| n.node_rank);
        for n in &nodes {
            job.next_seq += 1;
            job.members.insert(
                n.node_id.clone(),
                Member {
                    hostname: n.hostname.clone(),
                    requested_rank: req.node_rank.map(|_| n.node_rank),
                    ready: None,
                    rank: Some(n.node_rank),
                    last_seen: now,
                    joined_seq: job.next_seq,
                },
            );
        }
        job.participants = nodes.into_iter().map(|n| n.node_id).collect();
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

    /// A node joins. On success it is told which round to get ready for.
    pub fn join(
        &mut self,
        now: Instant,
        node_id: &str,
        req: &pb::JoinRequest,
    ) -> Result<Vec<Outbound>, JoinError> {
        match self.phase {
            Phase::Succeeded => return Err(self.finished("succeeded")),
            Phase::Failed(_) => return Err(self.finished("failed")),
            _ => {}
        }
        self.check_config(&JobConfig::from_join(req))?;
        if let Some(member) = self.members.get_mut(node_id) {
            if req.resume.is_none() {
                return Err(JoinError::DuplicateNode {
                    job: self.id.clone(),
                    node: node_id.to_owned(),
                });
            }
            // A member reconnecting (its stream broke, or this server restarted).
            member.last_seen = now;
            member.hostname.clone_from(&req.hostname);
            let resumed = self.phase == Phase::Running
                && req.resume.as_ref().is_some_and(|r| r.round == self.round)
                && self.participants.iter().any(|p| p == node_id);
            return Ok(vec![Outbound {
                to: node_id.to_owned(),
                event: Kind::Joined(pb::Joined {
                    round: self.round,
                    resumed,
                }),
            }]);
        }
        if let Some(rank) = req.node_rank {
            if rank >= self.config.max_nodes {
                return Err(JoinError::RankOutOfRange {
                    job: self.id.clone(),
                    rank,
                    nnodes: self.config.max_nodes,
                });
            }
            if let Some(holder) = self
                .members
                .values()
                .find(|m| m.requested_rank == Some(rank))
            {
                return Err(JoinError::DuplicateRank {
                    job: self.id.clone(),
                    rank,
                    holder: holder.hostname.clone(),
                });
            }
        }
        self.next_seq += 1;
        self.members.insert(
            node_id.to_owned(),
            Member {
                hostname: req.hostname.clone(),
                requested_rank: req.node_rank,
                ready: None,
                rank: None,
                last_seen: now,
                joined_seq: self.next_seq,
            },
        );
        let mut out = vec![Outbound {
            to: node_id.to_owned(),
            event: Kind::Joined(pb::Joined {
                round: self.round,
                resumed: false,
            }),
        }];
        if self.phase == Phase::Running {
            if (self.participants.len() as u32) < self.config.max_nodes {
                // A node arriving while a round with free slots runs: re-form with it.
                out.extend(self.restart(format!("host '{}' joined the job", req.hostname), false));
            } else {
                // The round is full: the newcomer waits as a spare for a freed slot.
                out.push(Outbound {
                    to: node_id.to_owned(),
                    event: Kind::Waiting(self.waiting(None, true)),
                });
            }
        }
        Ok(out)
    }

    /// A node is ready for `round`, offering its store endpoint.
    pub fn ready(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        master: (String, u32),
    ) -> Vec<Outbound> {
        let Some(m) = self.members.get_mut(node_id) else {
            return Vec::new();
        };
        m.last_seen = now;
        if round != self.round || self.phase != Phase::Forming {
            return Vec::new();
        }
        m.ready = Some(master);
        self.step(now)
    }

    /// A node's keep-alive.
    pub fn keep_alive(&mut self, now: Instant, node_id: &str) -> bool {
        match self.members.get_mut(node_id) {
            Some(m) => {
                m.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// A worker of `node_id` failed in `round`.
    pub fn failure(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        reason: String,
    ) -> Vec<Outbound> {
        if let Some(m) = self.members.get_mut(node_id) {
            m.last_seen = now;
        }
        if round != self.round || self.phase != Phase::Running {
            return Vec::new();
        }
        self.last_failure = Some(reason.clone());
        if self.restart_count < self.config.max_restarts {
            self.restart_count += 1;
            self.restart(reason, true)
        } else {
            let reason = format!(
                "{reason}; the job's restart budget is spent ({} of --max-restarts {})",
                self.restart_count, self.config.max_restarts
            );
            self.finish(now, Phase::Failed(reason))
        }
    }

    /// Every worker of `node_id` succeeded in `round`.
    pub fn success(&mut self, now: Instant, node_id: &str, round: u64) -> Vec<Outbound> {
        if let Some(m) = self.members.get_mut(node_id) {
            m.last_seen = now;
        }
        if round != self.round || self.phase != Phase::Running {
            return Vec::new();
        }
        if self.participants.iter().any(|p| p == node_id) {
            self.succeeded.insert(node_id.to_owned());
        }
        if self.succeeded.len() == self.participants.len() {
            return self.finish(now, Phase::Succeeded);
        }
        Vec::new()
    }

    /// A node left (or its stream ended, or it was lost).
    pub fn leave(&mut self, now: Instant, node_id: &str, reason: &str) -> Vec<Outbound> {
        let Some(m) = self.members.remove(node_id) else {
            return Vec::new();
        };
        match self.phase {
            Phase::Running
                if self.participants.iter().any(|p| p == node_id)
                    && !self.succeeded.contains(node_id) =>
            {
                let reason = format!("host '{}' left the job: {reason}", m.hostname);
                self.restart(reason, false)
            }
            Phase::Forming => self.step(now),
            _ => Vec::new(),
        }
    }

    fn ready_count(&self) -> u32 {
        self.members.values().filter(|m| m.ready.is_some()).count() as u32
    }

    fn track_min_ready(&mut self, now: Instant) {
        if self.phase != Phase::Forming || self.ready_count() < self.config.min_nodes {
            self.min_ready_since = None;
        } else if self.min_ready_since.is_none() {
            self.min_ready_since = Some(now);
        }
    }

    /// Progress for the members (`spare`: the round is full, this node waits).
    fn waiting(&self, last_call: Option<Duration>, spare: bool) -> pb::Waiting {
        pb::Waiting {
            round: self.round,
            ready: self.ready_count(),
            needed: self.config.min_nodes,
            hosts: self.hosts(),
            min_nodes: self.config.min_nodes,
            max_nodes: self.config.max_nodes,
            last_call_ms: last_call.map(|d| d.as_millis() as u64),
            spare,
        }
    }

    /// Periodic check: lost nodes. Progress is announced only when it changes.
    pub fn tick(&mut self, now: Instant) -> Vec<Outbound> {
        match decide(now, self) {
            Decision::Lost(_) | Decision::Complete(_) => self.step(now),
            Decision::Idle | Decision::Wait { .. } => Vec::new(),
        }
    }

    /// Ends the job for everyone (server shutdown); `may_rejoin`: the server
    /// may come back and relearn the job.
    pub fn close(&mut self, reason: &str, may_rejoin: bool) -> Vec<Outbound> {
        let out = self.broadcast(Kind::JobClosed(pb::JobClosed {
            reason: reason.to_owned(),
            may_rejoin,
        }));
        self.members.clear();
        out
    }

    /// Applies [`decide`] until nothing changes.
    fn step(&mut self, now: Instant) -> Vec<Outbound> {
        let mut out = Vec::new();
        loop {
            self.track_min_ready(now);
            match decide(now, self) {
                Decision::Idle => return out,
                Decision::Wait { last_call_ends, .. } => {
                    let left = last_call_ends.map(|t| t.saturating_duration_since(now));
                    let waiting = self.waiting(left, false);
                    out.extend(self.broadcast(Kind::Waiting(waiting)));
                    return out;
                }
                Decision::Complete(order) => {
                    out.extend(self.complete(order));
                    return out;
                }
                Decision::Lost(lost) => {
                    for id in lost {
                        out.extend(self.leave(now, &id, "no keep-alive in time"));
                    }
                }
            }
        }
    }

    fn complete(&mut self, order: Vec<String>) -> Vec<Outbound> {
        let nnodes = order.len() as u32;
        let nproc = self.config.nproc_per_node;
        let (master_addr, master_port) = order
            .first()
            .and_then(|id| self.members[id].ready.clone())
            .unwrap_or_default();
        let nodes: Vec<pb::NodeInfo> = order
            .iter()
            .zip(0u32..)
            .map(|(id, rank)| pb::NodeInfo {
                node_id: id.clone(),
                hostname: self.members[id].hostname.clone(),
                node_rank: rank,
            })
            .collect();
        let mut out = Vec::with_capacity(order.len());
        for (id, rank) in order.iter().zip(0u32..) {
            if let Some(m) = self.members.get_mut(id) {
                m.rank = Some(rank);
                m.ready = None;
            }
            out.push(Outbound {
                to: id.clone(),
                event: Kind::RoundComplete(pb::RoundComplete {
                    round: self.round,
                    node_rank: rank,
                    nnodes,
                    world_size: nnodes * nproc,
                    base_rank: rank * nproc,
                    restart_count: self.restart_count,
                    max_restarts: self.config.max_restarts,
                    master_addr: master_addr.clone(),
                    master_port,
                    nodes: nodes.clone(),
                }),
            });
        }
        for (id, m) in self.members.iter_mut() {
            if !order.contains(id) {
                m.rank = None;
            }
        }
        self.participants = order;
        self.succeeded.clear();
        self.phase = Phase::Running;
        self.min_ready_since = None;
        let spares: Vec<String> = self
            .members
            .keys()
            .filter(|id| !self.participants.contains(id))
            .cloned()
            .collect();
        let waiting = self.waiting(None, true);
        out.extend(spares.into_iter().map(|to| Outbound {
            to,
            event: Kind::Waiting(waiting.clone()),
        }));
        out
    }

    /// Node ids of the ready members in node-rank order (see module docs).
    fn rank_order(&self) -> Vec<String> {
        let mut order = self.rank_order_all();
        order.truncate(self.config.max_nodes as usize);
        order
    }

    fn rank_order_all(&self) -> Vec<String> {
        let ready = self.members.iter().filter(|(_, m)| m.ready.is_some());
        if self.members.values().any(|m| m.requested_rank.is_some()) {
            let mut v: Vec<_> = ready.collect();
            v.sort_by_key(|(_, m)| m.requested_rank);
            return v.into_iter().map(|(id, _)| id.clone()).collect();
        }
        let mut veterans: Vec<_> = ready.clone().filter(|(_, m)| m.rank.is_some()).collect();
        veterans.sort_by_key(|(_, m)| m.rank);
        let mut fresh: Vec<_> = ready.filter(|(_, m)| m.rank.is_none()).collect();
        fresh.sort_by(|(a, ma), (b, mb)| {
            (&ma.hostname, a, ma.joined_seq).cmp(&(&mb.hostname, b, mb.joined_seq))
        });
        veterans
            .into_iter()
            .chain(fresh)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn restart(&mut self, reason: String, counted: bool) -> Vec<Outbound> {
        let old = self.round;
        self.round += 1;
        self.phase = Phase::Forming;
        self.succeeded.clear();
        for m in self.members.values_mut() {
            m.ready = None;
        }
        self.broadcast(Kind::RestartRequested(pb::RestartRequested {
            round: old,
            next_round: self.round,
            reason,
            counted,
        }))
    }

    fn finish(&mut self, now: Instant, phase: Phase) -> Vec<Outbound> {
        let event = match &phase {
            Phase::Failed(reason) => Kind::JobFailed(pb::JobFailed {
                round: self.round,
                reason: reason.clone(),
            }),
            _ => Kind::JobSucceeded(pb::JobSucceeded { round: self.round }),
        };
        self.phase = phase;
        self.finished_at = Some(now);
        self.broadcast(event)
    }

    fn broadcast(&self, event: Kind) -> Vec<Outbound> {
        self.members
            .keys()
            .map(|id| Outbound {
                to: id.clone(),
                event: event.clone(),
            })
            .collect()
    }

    fn hosts(&self) -> Vec<String> {
        self.members.values().map(|m| m.hostname.clone()).collect()
    }

    fn finished(&self, outcome: &'static str) -> JoinError {
        JoinError::Finished {
            job: self.id.clone(),
            outcome,
        }
    }

    fn check_config(&self, other: &JobConfig) -> Result<(), JoinError> {
        let c = &self.config;
        let nnodes = |c: &JobConfig| {
            if c.min_nodes == c.max_nodes {
                c.max_nodes.to_string()
            } else {
                format!("{}:{}", c.min_nodes, c.max_nodes)
            }
        };
        let checks = [
            ("--nnodes", nnodes(c), nnodes(other)),
            (
                "--nproc-per-node",
                c.nproc_per_node.to_string(),
                other.nproc_per_node.to_string(),
            ),
            (
                "--max-restarts",
                c.max_restarts.to_string(),
                other.max_restarts.to_string(),
            ),
        ];
        for (flag, job_value, node_value) in checks {
            if job_value != node_value {
                return Err(JoinError::Mismatch {
                    job: self.id.clone(),
                    flag,
                    job_value,
                    node_value,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
