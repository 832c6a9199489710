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
//! # Sessions
//! Every member holds a [`Session`] secret, given to it in `Joined`. The
//! service checks it with [`Job::authorize`] before any call that acts for a
//! node; a resuming `Join` must present it too, except to a relearned job,
//! which cannot know it and hands out a new one.
//!
//! # Deadlines
//! [`Job::next_deadline`] says when the job next has periodic work (a
//! liveness check, the end of a last call, progress due, expiry), so the
//! service runs [`Job::tick`] only for jobs whose deadline is due instead of
//! scanning every job on every tick.
//!
//! # Node ranks
//! With static rendezvous a node asks for its rank and gets exactly it. With
//! dynamic rendezvous the server assigns ranks: members of the previous round
//! keep their relative order (so ranks do not move while membership does not
//! change); a departed member's rank goes to a newcomer of its topology
//! segment, and other newcomers join their segment's run, ordered by
//! topology path, then host name (numbers as numbers), then node id
//! (the `placement` module has the rule).
//!
//! # Cost
//! Joining, getting ready, keep-alives and success reports are O(log n) in
//! the number of members; O(n) work happens once per round (completing it,
//! restarting it) and in the periodic liveness scan. Progress reports to
//! every member are rate-limited ([`Job::progress_every`]: once a second,
//! slower for large jobs so a broadcast costs each node the same), so a round of n nodes
//! costs O(n log n), not O(n²).

mod config;
mod decide;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod goodput;
mod invariants;
mod membership;
mod placement;
mod progress;
mod quarantine;
mod record;
mod rounds;
mod session;
mod stragglers;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::event::Kind;

pub use config::JobConfig;
pub use decide::{decide, liveness, mass_silence, rank_order, Decision};
pub use error::{AuthError, JoinRefused};
pub use goodput::{
    clip as clip_cause, Category, Goodput, Loss, Spent, Stored as StoredGoodput, StoredLoss,
    MAX_LOSSES,
};
pub use placement::{natural_cmp, topology_cmp};
pub use progress::{Progress, Stuck};
pub use quarantine::{
    Bench, Quarantine, QuarantinePolicy, QuarantineScope, QuarantineSettings,
    MAX_HOSTS as MAX_QUARANTINED, RAN_FOR,
};
pub use record::{JobRecord, MemberRecord, Offset};
pub use session::{Session, SESSION_BYTES};

/// How often at most every member of a forming round is sent its progress
/// (for jobs of up to [`PROGRESS_NODES`] members; larger jobs less often).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Members per [`PROGRESS_EVERY`] of progress interval, up to [`PROGRESS_MAX`].
pub const PROGRESS_NODES: usize = 1000;
/// The longest progress interval.
pub const PROGRESS_MAX: Duration = Duration::from_secs(10);
/// Prefix of the placeholder ids of a relearned job's absent nodes.
const ABSENT: &str = "\u{0}absent-rank-";
/// The longest a relearned job keeps a placeholder for a node that does not
/// come back (shorter if the job's keep-alive limit is): agents reconnect
/// within their `reconnect_grace`, 60 s by default.
pub const RELEARN_WINDOW: Duration = Duration::from_secs(60);

/// The least a job that lost every member before it was over is kept for
/// them: the agents' default `reconnect_grace`, which the server is not
/// told (a node that comes back later finds its job gone, as before).
pub const RECONNECT_WINDOW: Duration = Duration::from_secs(60);

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
    /// Where the node sits in the machine (`zone-a/rack-3/nvl-0`; empty:
    /// unknown): the node-rank order keeps each path's nodes together.
    pub topology: Arc<str>,
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
    /// The address its last `Join` or `Ready` came from, as the server saw it.
    pub seen_from: Option<IpAddr>,
    /// The secret its calls must carry.
    session: Session,
    /// Order of arrival, a tie-breaker only.
    joined_seq: u64,
    /// The forming round this node learned of by rejoining while it still
    /// ran an older round's workers (`Job::reattach`): the wait for the last
    /// round's nodes restarts from such a rejoin once per round and leader,
    /// so a node that rejoins again and again cannot hold the round.
    learned_round: Option<u64>,
}

impl Member {
    /// Which joining of its node id this membership is: numbered in order
    /// of arrival within the job, so a node dropped and joining again under
    /// the same id is another membership, with a larger number.
    pub fn joined_seq(&self) -> u64 {
        self.joined_seq
    }
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
    /// The topology path of each node rank of the last round that ran, kept
    /// when its node departs: its place goes to a node of the same segment
    /// (the `placement` module). `None`: not known (a place of a restored job whose
    /// node had departed); such a place is never filled, only closed.
    slot_topologies: Vec<Option<Arc<str>>>,
    /// Members ready for the forming round.
    ready: u32,
    /// Participants whose workers all exited 0 (members or departed).
    succeeded: usize,
    last_failure: Option<String>,
    /// The first failure reported in the running round (the job's root cause if it fails).
    root_cause: Option<pb::Failure>,
    /// What a failed job's agents exit with when a worker's "do not
    /// restart" code ended it ([`Job::fatal_failure`]); `None`: 1.
    exit_code: Option<i32>,
    finished_at: Option<Instant>,
    next_seq: u64,
    /// Since when at least MIN members are ready for the forming round.
    min_ready_since: Option<Instant>,
    /// When every member was last sent the round's progress.
    progress_sent: Option<Instant>,
    /// No member can be lost before this instant (the earliest last sign of
    /// life plus the keep-alive limit, as of the last scan).
    next_liveness: Option<Instant>,
    /// Since when the job has had no members (it expires after the TTL).
    empty_since: Option<Instant>,
    /// Placeholders of a relearned job not claimed yet.
    absent: u32,
    /// When the forming round began after a round ran (the restart): a
    /// node of that round may run its workers until its fence, at most the
    /// drop limit later ([`decide`]). Not stored: a loaded job counts from
    /// its load.
    forming_since: Option<Instant>,
    /// A job a store-less server started afresh or relearned within a drop
    /// limit (or the outage limit) of its own start: no round completes
    /// before this instant ([`Job::hold_until`]), unless it was relearned
    /// and every placeholder was claimed by its node.
    held_until: Option<Instant>,
    /// A placeholder of this relearned job was dropped unclaimed: its node
    /// may still run workers of a round this server never saw.
    placeholder_lost: bool,
    /// When a node is benched (the server's `--quarantine-*`); `None`: never.
    /// Not stored: every replica has its own flags.
    quarantine_policy: Option<QuarantinePolicy>,
    /// Failure counts and benched hosts (the `quarantine` module).
    quarantine: Quarantine,
    /// Members whose host is benched ([`Job::is_benched`]). `ready` does not
    /// count them.
    benched: u32,
    /// Hosts this job benched since [`Job::take_new_benches`] last ran, for
    /// a server-wide quarantine.
    new_benches: Vec<String>,
    /// Since when the running round runs (`None` while none does). Not
    /// stored: a loaded job counts from its load.
    running_since: Option<Instant>,
    /// One of this job's rounds ran for [`quarantine::RAN_FOR`]
    /// ([`Job::ran`]). Not stored, as `running_since`.
    ran: bool,
    /// Since when most of the last round that ran has been silent at once
    /// (a mass silence, as a tick last saw it): their places are held for
    /// the job's outage limit, not the drop limit. Not stored: a loaded job
    /// gives every node the whole drop limit anyway.
    held: Option<Instant>,
    /// When a node of the running round last vouched for all of it (see
    /// [`Job::vouch`]); counts as a sign of life of each of its nodes.
    vouched_all: Option<Instant>,
    /// The training progress its nodes report, and the no-progress count
    /// (the `progress` module).
    progress: progress::Progress,
    /// Where the job's time went (the `goodput` module).
    goodput: goodput::Goodput,
    /// The running round's ranks' step times and stragglers (the
    /// `stragglers` module). Not stored: heard again.
    stragglers: stragglers::Stragglers,
    /// When the running round re-forms to take the ready spares that make
    /// a larger usable count, once they have waited `--scale-up-settle`.
    /// Not stored: a loaded job's tick sets it again.
    grow_at: Option<Instant>,
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
            slot_topologies: Vec::new(),
            exit_code: None,
            ready: 0,
            succeeded: 0,
            last_failure: None,
            root_cause: None,
            finished_at: None,
            next_seq: 0,
            min_ready_since: None,
            progress_sent: None,
            next_liveness: None,
            empty_since: None,
            absent: 0,
            forming_since: None,
            held_until: None,
            placeholder_lost: false,
            quarantine_policy: None,
            quarantine: Quarantine::default(),
            benched: 0,
            new_benches: Vec::new(),
            running_since: None,
            ran: false,
            held: None,
            vouched_all: None,
            progress: progress::Progress::default(),
            goodput: goodput::Goodput::default(),
            stragglers: stragglers::Stragglers::default(),
            grow_at: None,
        }
    }

    /// The same, benching nodes by `policy` (the `quarantine` module).
    pub fn with_quarantine(mut self, policy: Option<QuarantinePolicy>) -> Self {
        self.quarantine_policy = policy.filter(|p| p.after > 0);
        self
    }

    /// Rebuilds a running job from the first node that reconnects to a
    /// restarted server: the round it runs and the restart count. Every rank
    /// of that round gets a placeholder that the node holding it claims when
    /// it reconnects; a rank nobody claims within the keep-alive limit is
    /// lost, and the job re-forms without it.
    ///
    /// The caller has checked `resume` against the job's bounds (the service's
    /// `validate_join`): `node_rank < nnodes <= max_nodes`.
    pub fn relearn(
        now: Instant,
        id: impl Into<String>,
        req: &pb::JoinRequest,
        resume: &pb::Resume,
    ) -> Self {
        let mut job = Self::new(id, JobConfig::from_join(req));
        job.phase = Phase::Running;
        job.running_since = Some(now);
        // The job's time before the restart is not known; from now it
        // steps, from a step its reports will say.
        job.goodput.open = Some(goodput::Open::Stepping(None));
        job.goodput.mark = Some(now);
        job.round = resume.round;
        job.restart_count = resume.restart_count;
        let nnodes = resume
            .nnodes
            .max(resume.node_rank.saturating_add(1))
            .min(job.config.max_nodes);
        for rank in 0..nnodes {
            let id = format!("{ABSENT}{rank}");
            job.insert(
                now,
                id.clone(),
                "(not reconnected yet)".into(),
                "",
                req.node_rank.map(|_| rank),
                // Nobody can present a placeholder's secret: it is claimed by
                // a resuming join (which gets a new one), never authorized.
                PLACEHOLDER_SESSION,
            );
            if let Some(m) = job.members.get_mut(&id) {
                m.rank = Some(rank);
            }
            job.participants.push(id);
        }
        job.absent = nnodes;
        let window = now.checked_add(job.placeholder_limit()).unwrap_or(now);
        job.next_liveness = Some(job.next_liveness.map_or(window, |t| t.min(window)));
        job
    }

    /// How long a placeholder waits for its node: the keep-alive limit, at
    /// most [`RELEARN_WINDOW`].
    pub fn placeholder_limit(&self) -> Duration {
        self.config
            .dead_after
            .unwrap_or(RELEARN_WINDOW)
            .min(RELEARN_WINDOW)
    }

    /// Placeholders of a relearned job that no node has claimed yet.
    pub fn absent_count(&self) -> u32 {
        self.absent
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
    /// The last failure's root cause (its first report), as reported.
    pub fn root_cause(&self) -> Option<&pb::Failure> {
        self.root_cause.as_ref()
    }
    /// The members, by node id.
    pub fn members(&self) -> &BTreeMap<String, Member> {
        &self.members
    }
    /// Node ids of the running (or last) round, in node-rank order.
    pub fn participants(&self) -> &[String] {
        &self.participants
    }
    /// Records the address a member's calls come from (`None`: unknown).
    pub fn seen_from(&mut self, node_id: &str, from: Option<IpAddr>) {
        if let (Some(m), Some(ip)) = (self.members.get_mut(node_id), from) {
            m.seen_from = Some(ip);
        }
    }
    /// The first failure of the latest failed round, if any.
    pub fn last_failure(&self) -> Option<&str> {
        self.last_failure.as_deref()
    }

    /// Whether the job may be forgotten: it finished `ttl` ago, or it has had
    /// no members for `ttl`. Its id can then be used for a new job.
    pub fn expired(&self, now: Instant, ttl: Duration) -> bool {
        self.expires_at(ttl).is_some_and(|t| now >= t)
    }

    /// When the job may be forgotten. A job that is over, `ttl` after it
    /// ended. A job that lost its last member before it was over (they
    /// were dropped for silence, or left), `ttl` after that but no sooner
    /// than [`RECONNECT_WINDOW`]: its nodes may be cut off from a leader
    /// that went silent and come back to resume within their
    /// `reconnect_grace` (60 s by default), and must find their job. A job
    /// that never ran a round has nothing to resume: `ttl` after its last
    /// member went (agents killed while it formed, abandoned joins), so
    /// churn cannot fill the server's job table with empty jobs.
    fn expires_at(&self, ttl: Duration) -> Option<Instant> {
        let (since, keep) = if self.phase.is_terminal() {
            (self.finished_at, ttl)
        } else if self.members.is_empty() && self.round == 0 && self.phase == Phase::Forming {
            (self.empty_since, ttl)
        } else if self.members.is_empty() {
            (self.empty_since, ttl.max(RECONNECT_WINDOW))
        } else {
            (None, ttl)
        };
        let since = since?;
        Some(since.checked_add(keep).unwrap_or(since))
    }

    /// When this job next has periodic work for [`Job::tick`] (or may be
    /// forgotten, given `ttl`); `None`: not until something happens to it.
    pub fn next_deadline(&self, now: Instant, ttl: Duration) -> Option<Instant> {
        let mut due = self.expires_at(ttl);
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                due = Some(due.map_or(t, |d| d.min(t)));
            }
        };
        if !self.phase.is_terminal() {
            consider(self.next_liveness);
            consider(self.quarantine.next_expiry());
            consider(self.grow_at);
        }
        let forming = decide(now, self);
        if let (false, Decision::Wait { last_call_ends, .. }) = (self.members.is_empty(), forming) {
            consider(last_call_ends);
            consider(Some(self.progress_sent.map_or(now, |t| {
                t.checked_add(self.progress_every()).unwrap_or(t)
            })));
        }
        due
    }

    /// How often every member of a forming round hears its progress: once a
    /// second, and one more second per [`PROGRESS_NODES`] members beyond that
    /// (at most [`PROGRESS_MAX`]), so the server's work per member stays flat.
    pub fn progress_every(&self) -> Duration {
        let steps = (self.members.len() / PROGRESS_NODES).max(1) as u32;
        (PROGRESS_EVERY * steps).min(PROGRESS_MAX)
    }

    /// Checks that `session` is `node_id`'s secret.
    pub fn authorize(&self, node_id: &str, session: &[u8]) -> Result<(), AuthError> {
        match self.members.get(node_id) {
            None => Err(AuthError::NotMember),
            Some(_) if node_id.starts_with(ABSENT) => Err(AuthError::NotMember),
            Some(m) if m.session.matches(session) => Ok(()),
            Some(_) => Err(AuthError::WrongSession),
        }
    }

    /// A node is ready for `round`, offering its store endpoint; `from`: the
    /// address the call came from.
    pub fn ready(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        master: (String, u32),
        from: Option<IpAddr>,
    ) -> Vec<Outbound> {
        let forming = round == self.round && self.phase == Phase::Forming;
        let benched = self
            .members
            .get(node_id)
            .is_some_and(|m| self.is_benched(m));
        let Some(m) = self.members.get_mut(node_id) else {
            return Vec::new();
        };
        m.last_seen = now;
        if from.is_some() {
            m.seen_from = from;
        }
        if !forming {
            return Vec::new();
        }
        // A benched node's offer is kept for when its bench ends; it does
        // not count meanwhile.
        if m.ready.replace(master).is_none() && !benched {
            self.ready += 1;
        }
        let mut out = self.step(now);
        if !out.iter().any(|o| o.to == node_id) {
            // Every node hears at once that it counts (or why it does not);
            // others at the progress rate.
            out.push(Outbound {
                to: node_id.to_owned(),
                event: Kind::Waiting(self.waiting_of(now, node_id, false)),
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

    /// `node_id`, a node of the running `round`, hears the nodes of that
    /// round whose node ranks are set in `ranks` (a bitmap, bit r of byte
    /// r / 8) through the round's peer hub: each counts as heard now, as if
    /// its own keep-alive had arrived. So a node cut off from the rendezvous
    /// but not from its round is not dropped while a peer vouches for it
    /// (the peer hub: the agent's `peers` module). A vouch for another round,
    /// from a node outside the round, or naming ranks the round does not
    /// have counts for nothing. Returns how many nodes it refreshed; O(bits
    /// set).
    pub fn vouch(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        ranks: &[u8],
        all: bool,
    ) -> usize {
        let in_round = self.phase == Phase::Running
            && round == self.round
            && self.members.get(node_id).is_some_and(|m| m.rank.is_some());
        if !in_round {
            return 0;
        }
        if all {
            // O(1): the liveness scan reads it for every node of the round.
            self.vouched_all = Some(self.vouched_all.map_or(now, |t| t.max(now)));
            return self.participants.len();
        }
        let mut refreshed = 0;
        for (byte, bits) in ranks.iter().enumerate().filter(|(_, b)| **b != 0) {
            for bit in 0..8 {
                if bits & (1 << bit) == 0 {
                    continue;
                }
                let Some(id) = self.participants.get(byte * 8 + bit) else {
                    return refreshed;
                };
                if let Some(m) = self.members.get_mut(id) {
                    if m.rank.is_some() {
                        m.last_seen = m.last_seen.max(now);
                        refreshed += 1;
                    }
                }
            }
        }
        refreshed
    }

    /// The last sign of life of `m`: its own, or a peer's vouch for the
    /// whole running round it is a node of.
    pub fn heard(&self, m: &Member) -> Instant {
        match (m.rank, self.vouched_all) {
            (Some(_), Some(all)) => m.last_seen.max(all),
            _ => m.last_seen,
        }
    }

    /// Since when most of the last round has been silent at once, as the
    /// last liveness check saw it (`None`: it was not).
    pub fn held_since(&self) -> Option<Instant> {
        self.held
    }

    /// A worker of `node_id` failed in `round`: the job restarts while its
    /// budget lasts, then fails.
    pub fn failure(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        reason: String,
        detail: Option<pb::Failure>,
    ) -> Vec<Outbound> {
        self.worker_failed(now, node_id, round, reason, detail, None)
    }

    /// A worker of `node_id` exited in `round` with `exit_code`, which its
    /// agent says is the "do not restart" code: if it is the one the job
    /// agreed on (`--no-restart-exit-code`, [`JobConfig`]), the job fails at
    /// once, whatever budget is left, and its agents exit with that code
    /// (`JobFailed.exit_code`, the tombstone's); otherwise it is an ordinary
    /// [`Job::failure`], so no node can choose what ends the job or with
    /// which code. Ignored as [`Job::failure`] ignores a report.
    pub fn fatal_failure(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        reason: String,
        detail: Option<pb::Failure>,
        exit_code: i32,
    ) -> Vec<Outbound> {
        let agreed = self.config.no_restart_exit_code.map(i32::from) == Some(exit_code);
        self.worker_failed(
            now,
            node_id,
            round,
            reason,
            detail,
            agreed.then_some(exit_code),
        )
    }

    /// What agents of this job exit with once it is over: 0, the "do not
    /// restart" code that ended it, or 1.
    pub fn exit_code(&self) -> i32 {
        match self.phase {
            Phase::Succeeded => 0,
            _ => self.exit_code.unwrap_or(1),
        }
    }

    fn worker_failed(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        reason: String,
        detail: Option<pb::Failure>,
        no_restart: Option<i32>,
    ) -> Vec<Outbound> {
        self.keep_alive(now, node_id);
        if round != self.round || self.phase != Phase::Running {
            return Vec::new();
        }
        // Only a node of the running round can fail it (a spare has no workers).
        if self.members.get(node_id).is_none_or(|m| m.rank.is_none()) {
            return Vec::new();
        }
        self.last_failure = Some(reason.clone());
        self.root_cause = detail;
        if let Some(code) = no_restart {
            self.exit_code = Some(code);
            let left = self.config.max_restarts.saturating_sub(self.restart_count);
            let reason = format!(
                "{reason}; exit code {code} is --no-restart-exit-code: the job ends without a restart \
                 ({left} of --max-restarts {} left unused)",
                self.config.max_restarts
            );
            return self.finish(now, Phase::Failed(reason));
        }
        let reason = match self.count_failure(now, node_id) {
            Some(benched) => format!("{reason}; {benched}"),
            None => reason,
        };
        let limit = self.config.max_no_progress_restarts;
        if let Some(stuck) = self.progress.failed(limit, node_id) {
            self.exit_code = self.config.no_restart_exit_code.map(i32::from);
            let reason = format!(
                "{reason}; no progress: the job reached step {} at best and failed {} times in a row \
                 after restarts without passing it (--max-no-progress-restarts {limit}): it ends \
                 without a restart ({} of --max-restarts {} left unused)",
                stuck.best,
                stuck.stalled,
                self.config.max_restarts.saturating_sub(self.restart_count),
                self.config.max_restarts
            );
            return self.finish(now, Phase::Failed(reason));
        }
        if self.restart_count < self.config.max_restarts {
            // restart() spends it.
            return self.restart(now, reason, true);
        }
        let reason = format!(
            "{reason}; the job's restart budget is spent ({} of --max-restarts {})",
            self.restart_count, self.config.max_restarts
        );
        self.finish(now, Phase::Failed(reason))
    }

    /// `node_id`, a node of the running round, reports its workers'
    /// progress at `now` (with a keep-alive or a failure report). Nothing
    /// to send, unless `--straggler-quarantine` benches a straggler's host
    /// and the round re-forms without it
    /// ([`Job::quarantine_stragglers`](Job)).
    pub fn report_progress(
        &mut self,
        now: Instant,
        node_id: &str,
        p: &pb::Progress,
    ) -> Vec<Outbound> {
        if self.phase != Phase::Running
            || self.members.get(node_id).is_none_or(|m| m.rank.is_none())
        {
            return Vec::new();
        }
        if !self.progress.report(self.round, node_id, p) {
            return Vec::new();
        }
        let judged = self.stragglers.report(now, node_id, &p.rank_times);
        // The job's time follows the freshest report: each node's comes
        // with its keep-alive (or its failure), the latest is of now, and
        // in synchronous training every node is at the same step.
        let ago = |ms: u64| now.checked_sub(Duration::from_millis(ms)).unwrap_or(now);
        self.goodput.stepped(
            now,
            ago(p.first_step_ms_ago),
            ago(p.min_step_ms_ago),
            p.failing_step.unwrap_or(p.min_step),
            self.progress.best,
            self.progress.resumed(),
        );
        match judged {
            true => self.quarantine_stragglers(now),
            false => Vec::new(),
        }
    }

    /// Where the job's time went by `now` (the open stretch included).
    pub fn time_spent(&self, now: Instant) -> Spent {
        self.goodput.spent_by(now, self.progress.best)
    }

    /// The goodput accounting: the losses, the restarts.
    pub fn goodput(&self) -> &Goodput {
        &self.goodput
    }

    /// The accounting at `now` as a message; `now_unix_ms`: the wall clock
    /// at `now` (0: the losses are left out).
    pub fn goodput_message(&self, now: Instant, now_unix_ms: u64) -> pb::Goodput {
        let spent = self.time_spent(now);
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let unix = |at: Instant| now_unix_ms.saturating_sub(ms(now.saturating_duration_since(at)));
        let losses = match now_unix_ms {
            0 => Vec::new(),
            _ => self
                .goodput
                .losses
                .iter()
                .map(|l| pb::Loss {
                    round: l.round,
                    unix_ms: unix(l.at),
                    cause: l.cause.clone(),
                    step: l.step,
                    checkpoint: l.checkpoint,
                    lost_steps: l.lost_steps(),
                    recovery_ms: ms(l.recovery),
                    recomputation_ms: ms(l.recomputation),
                })
                .collect(),
        };
        let mut segments: Vec<pb::Segment> = match now_unix_ms {
            0 => Vec::new(),
            _ => self
                .goodput
                .segments
                .iter()
                .map(|s| pb::Segment {
                    category: s.category.name().to_owned(),
                    unix_ms: unix(s.from),
                    ms: ms(s.length),
                })
                .collect(),
        };
        // The stretch going on now.
        if let (Some(c), Some(mark), true) = (
            self.goodput.now_in(self.progress.best),
            self.goodput.mark,
            now_unix_ms > 0,
        ) {
            segments.push(pb::Segment {
                category: c.name().to_owned(),
                unix_ms: unix(mark),
                ms: ms(now.saturating_duration_since(mark)),
            });
        }
        pb::Goodput {
            segments,
            productive_ms: ms(spent.of(Category::Productive)),
            recomputation_ms: ms(spent.of(Category::Recomputation)),
            recovery_ms: ms(spent.of(Category::Recovery)),
            start_up_ms: ms(spent.of(Category::StartUp)),
            waiting_ms: ms(spent.of(Category::Waiting)),
            now: self
                .goodput
                .now_in(self.progress.best)
                .map_or("", Category::name)
                .to_owned(),
            restarts: self.goodput.restarts,
            lost_steps: self.goodput.lost_steps,
            losses,
        }
    }

    /// The best step the job's earlier rounds reached, and the current
    /// round's (`None`: none reported).
    pub fn steps(&self) -> (Option<u64>, Option<u64>) {
        (self.progress.best, self.progress.reached())
    }

    /// The running round's stragglers, slowest first, as status shows
    /// them: each with its global rank (node rank x nproc + local rank)
    /// and its node's host.
    pub fn straggler_info(&self) -> impl Iterator<Item = pb::Straggler> + '_ {
        self.stragglers.flagged().iter().map(|s| self.straggler(s))
    }

    /// A straggler with its global rank and host.
    fn straggler(&self, s: &stragglers::Straggler) -> pb::Straggler {
        let m = self.members.get(&s.node_id);
        pb::Straggler {
            rank: m
                .and_then(|m| m.rank)
                .unwrap_or(0)
                .saturating_mul(self.config.nproc_per_node)
                .saturating_add(s.local_rank),
            host: m.map(|m| m.hostname.clone()).unwrap_or_default(),
            node_id: s.node_id.clone(),
            step_us: s.step_us,
            median_us: s.median_us,
        }
    }

    /// The longest hang timeout the running round's nodes learned, ms.
    pub fn hang_timeout_ms(&self) -> Option<u64> {
        self.progress.hang_timeout()
    }

    /// Worker-failure restarts in a row that did not pass the best step.
    pub fn no_progress_restarts(&self) -> u32 {
        self.progress.stalled
    }

    /// `node_id` stopped its workers in `round` itself, not because one
    /// failed: it lost the rendezvous for the drop limit and killed them so
    /// that no second copy of its ranks could run beside a job re-formed
    /// without it (fencing). It is back and the round is still current, but
    /// the round cannot go on without those workers, so the job re-forms as
    /// for a membership change: nothing of the restart budget is spent, and
    /// the round's failure (`last_failure`, the root cause) is untouched.
    /// `reason`: what the node says happened. A node that is not in the
    /// round, or whose workers had succeeded, changes nothing.
    pub fn fenced(
        &mut self,
        now: Instant,
        node_id: &str,
        round: u64,
        reason: &str,
    ) -> Vec<Outbound> {
        self.keep_alive(now, node_id);
        if round != self.round || self.phase != Phase::Running {
            return Vec::new();
        }
        let Some(m) = self
            .members
            .get(node_id)
            .filter(|m| m.rank.is_some() && !m.succeeded)
        else {
            return Vec::new();
        };
        let reason = format!("host '{}' {reason}", m.hostname);
        self.restart(now, reason, false)
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
        match self.remove(now, node_id, reason) {
            Some(_) if forming => self.step(now),
            Some(out) => out,
            None => Vec::new(),
        }
    }

    /// Drops these members at once, each as a departure (`reason`: why,
    /// for instance that its etcd lease expired), and decides the forming
    /// round once, after all of them went, so no round completes with a
    /// node this call drops. Ids that are not members are skipped. Like any
    /// departure, a node of the running round re-forms the job without
    /// spending the restart budget.
    pub fn drop_nodes(&mut self, now: Instant, node_ids: &[String], reason: &str) -> Vec<Outbound> {
        let mut out = Vec::new();
        let mut dropped = false;
        for id in node_ids {
            if let Some(o) = self.remove(now, id, reason) {
                dropped = true;
                out.extend(o);
            }
        }
        if dropped {
            out.extend(self.step(now));
        }
        out
    }

    /// Drops a member without deciding anything: a forming round is decided
    /// by the caller, once. `None`: not a member.
    fn remove(&mut self, now: Instant, node_id: &str, reason: &str) -> Option<Vec<Outbound>> {
        let m = self.members.remove(node_id)?;
        if node_id.starts_with(ABSENT) {
            self.absent = self.absent.saturating_sub(1);
            self.placeholder_lost = true;
        }
        if self.is_benched(&m) {
            self.benched = self.benched.saturating_sub(1);
        } else if m.ready.is_some() {
            self.ready = self.ready.saturating_sub(1);
        }
        if self.members.is_empty() {
            self.empty_since = Some(now);
        }
        Some(match self.phase {
            // A node whose workers succeeded may go; the others finish the round.
            Phase::Running if m.rank.is_some() && !m.succeeded => self.restart(
                now,
                format!("host '{}' left the job: {reason}", m.hostname),
                false,
            ),
            _ => Vec::new(),
        })
    }

    /// Periodic work: lost nodes, the last call, rate-limited progress.
    /// O(members) when a liveness check is due, O(1) otherwise (plus the
    /// events it sends).
    pub fn tick(&mut self, now: Instant) -> Vec<Outbound> {
        let mut out = Vec::new();
        if self.next_liveness.is_some_and(|t| now >= t) {
            if self.watch_silence(now) {
                // The silent nodes came back: the others get the whole drop
                // limit from now, and nobody is dropped at this check.
                self.handed_over(now);
                return self.step(now);
            }
            let (lost, next) = liveness(now, self);
            self.next_liveness = next;
            // Every lost node goes before the round is decided, so a round
            // never completes with a node this same tick drops
            // (fuzz_regressions.rs).
            for id in lost {
                out.extend(
                    self.remove(now, &id, "no keep-alive in time")
                        .unwrap_or_default(),
                );
            }
        }
        if self
            .quarantine
            .next_expiry()
            .is_some_and(|t| now >= t && !self.phase.is_terminal())
        {
            for host in self.quarantine.expire(now) {
                out.extend(self.unbenched(now, &host, "its quarantine ended"));
            }
        }
        out.extend(self.settled(now));
        // step() completes the round if the last call ended and reports
        // progress when due; otherwise it does nothing.
        out.extend(self.step(now));
        out
    }

    /// A new leader took the job over at `now` (it loaded it from the job
    /// store): every member, and every placeholder still waiting, gets the
    /// whole drop limit from `now` to reach it. Their keep-alives went to
    /// the last leader, which this one never heard; silence is counted
    /// from the handover, so a node is dropped only for missing keep-alives
    /// to this leader.
    ///
    /// The same holds when this server did not run for a while (paused,
    /// starved: the registry notices the gap), and when a mass silence ends
    /// ([`Job::tick`]): a rendezvous counts silence only while it watches.
    /// A round forming since before then waits for the last round's nodes
    /// as if the restart had happened now ([`decide`]).
    pub fn handed_over(&mut self, now: Instant) {
        for m in self.members.values_mut() {
            m.last_seen = m.last_seen.max(now);
        }
        if let Some(since) = &mut self.forming_since {
            *since = (*since).max(now);
        }
        if !self.phase.is_terminal() {
            self.next_liveness = liveness(now, self).1;
        }
        // Spares that came while no leader watched (`grow_at` is not
        // stored) make the round grow a settle time from now.
        if !self.config.scale_up_settle.is_zero() {
            self.settle_growth(now);
        }
    }

    /// Notes whether most of the last round is silent at `now` (a mass
    /// silence: the rendezvous, not the nodes, is likely the one cut off);
    /// true when a mass silence just ended, so the caller gives every node
    /// the whole drop limit from now.
    fn watch_silence(&mut self, now: Instant) -> bool {
        let mass = decide::mass_silence(now, self);
        match (mass, self.held) {
            (true, None) => {
                self.held = Some(now);
                false
            }
            (false, Some(_)) => {
                self.held = None;
                true
            }
            _ => false,
        }
    }

    /// A server without a store that started at `started` cannot tell a
    /// first start from a restart: nodes of an earlier instance of this job
    /// may still run its workers until their fence, at most the drop limit
    /// after the last call the lost server answered (before `started`), or,
    /// for agents that ride out outages on their peers' word (`outage`),
    /// the outage limit after it: a round whose nodes hear each other (a
    /// round of one node among them) keeps its workers through a restart
    /// that forgot it. A job it creates afresh or relearns therefore
    /// completes no round before `started` + the longer of the two (no drop
    /// limit: nothing is held), unless, relearned, every node of the round
    /// it was told of has come back (a node that has not may run a later
    /// round the lost server formed). Found by the simulator
    /// (sim/scenarios/storeless_restart_outage.sim; seed 911189 for a
    /// relearned job).
    pub fn hold_until(&mut self, now: Instant, started: Instant) {
        let hold = self
            .config
            .dead_after
            .map(|d| self.config.outage.map_or(d, |o| d.max(o)));
        let until = hold.and_then(|d| started.checked_add(d));
        self.held_until = until.filter(|t| now < *t);
    }

    /// Ends the job for everyone (server shutdown); `may_rejoin`: the server
    /// may come back and relearn the job.
    pub fn close(&mut self, now: Instant, reason: &str, may_rejoin: bool) -> Vec<Outbound> {
        let out = self.broadcast(Kind::JobClosed(pb::JobClosed {
            reason: reason.to_owned(),
            may_rejoin,
        }));
        self.members.clear();
        self.empty_since = Some(now);
        // The counters follow the members: a join racing the shutdown must
        // not find a ready count with nobody ready (fuzz_regressions.rs).
        self.ready = 0;
        self.benched = 0;
        self.min_ready_since = None;
        // So do the placeholders: a closed relearned job holds none, and
        // must not count against the registry's placeholder budget.
        self.absent = 0;
        out
    }
}

fn joined(node_id: &str, round: u64, resumed: bool, session: Session) -> Outbound {
    Outbound {
        to: node_id.to_owned(),
        event: Kind::Joined(pb::Joined {
            round,
            resumed,
            session: session.to_vec(),
            over: None,
            previous: None,
        }),
    }
}

/// Whether `node_id` is a relearned job's placeholder for a node that has
/// not reconnected yet (no node can join under such an id).
pub fn is_placeholder(node_id: &str) -> bool {
    node_id.starts_with(ABSENT)
}

/// A placeholder's secret: never handed out, and [`Job::authorize`] refuses
/// placeholder ids whatever is presented.
const PLACEHOLDER_SESSION: Session = Session::from_bytes([0; SESSION_BYTES]);

#[cfg(test)]
mod fuzz_regressions;
#[cfg(test)]
mod tests;
