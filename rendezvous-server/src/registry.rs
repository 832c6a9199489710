//! Every job the server knows, keyed by `rdzv_id`, with each member's live
//! event stream.
//!
//! One mutex guards it all; it is never held across an await. Handlers lock
//! it, call one method of the job's state machine and deliver the returned
//! events into the members' bounded [`Outbox`]es. What the lock guards is
//! split by concept, each part a plain type with unit tests of its own:
//! - the job map, with each job's streams (here);
//! - `deadlines`: when each job next has periodic work, a min-heap, so a
//!   tick touches only the jobs that are due, however many are idle;
//! - `commit`: the durable commit path. With a [`JobStore`], every call
//!   that changes a job marks it and wakes the server's flusher
//!   ([`Registry::changes`]); [`Registry::flush`] writes the marked jobs'
//!   records as one batch without holding the lock, and the events those
//!   changes caused come back for delivery only once the store took them.
//!   So no node acts on a decision the store does not hold: a server that
//!   dies before a write took no decision its successor lacks.
//!   [`Registry::load`] brings a store's jobs into a new registry, which
//!   continues them. Keep-alives change nothing a store needs (a record's
//!   instants are relative to when it was taken), so they mark nothing;
//! - `graves`: finished jobs' tombstones, bounded in count and time;
//! - `tally`: arrivals and departures, counted per job and logged at most
//!   once a second per job, so a 10,000-node job's arrival is one line, not
//!   10,000. A round formed, a restart and a job's end are logged once each.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::ops::Bound;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::event::Kind;
use tokio_stream::Stream;
use tonic::Status;
use tracing::{info, warn};

use self::commit::Commit;
use self::deadlines::Deadlines;
use self::graves::Graves;
use self::tally::Tallies;
use crate::clock::{Now, SharedClock, SystemClock};
use crate::error::Error;
use crate::job::{AuthError, Job, JobConfig, Member, Outbound, Phase, Session};
use crate::lease::LeaseClock;
use crate::limits::Limits;
use crate::metrics::{Movements, ServerMetrics, Summary, JOB_SERIES};
use crate::outbox::{outbox, Inbox, Outbox};
use crate::store::{JobStore, StoreError};
use crate::tombstone::Tombstone;
use accel_input::excerpt;
use accel_wire::limits::truncated;

/// Most bytes of the last failure in a status answer (per job).
const STATUS_FAILURE: usize = 4096;
/// Most timeline events kept per job.
const TIMELINE: usize = 16;
/// Longest reason a timeline event keeps, in bytes.
const TIMELINE_REASON: usize = 256;
/// Most nodes listed per job in a status answer.
pub const STATUS_NODES: usize = 1000;
/// Jobs per status answer when the caller does not say, and at most.
pub const STATUS_PAGE: (usize, usize) = (100, 1000);

/// The longest the registry may go without running before it takes the
/// gap for a pause of the process (see `Registry::woke`); its ticker runs
/// every 100 ms.
pub const PAUSED: Duration = Duration::from_secs(1);

/// What a replica whose lease may have lapsed tells its nodes.
pub const NOT_LEADING: &str =
    "this rdzv-server is no longer the leader (its etcd lease lapsed); reconnect to the new one";

#[derive(Debug)]
struct Entry {
    job: Job,
    /// Each member's current stream, tagged with a number so that the end of
    /// a stream a reconnected node replaced is not taken for the node leaving.
    streams: HashMap<String, (u64, Outbox)>,
    /// The instant this job's entry in the deadline heap stands for.
    scheduled: Option<Instant>,
    /// When the round now forming began to (its first join, or the restart
    /// that abandoned the last round), for the latency histograms.
    forming_since: Option<Instant>,
    /// Whether a round of this job formed here before.
    formed: bool,
    /// Whether its end left a tombstone (or it was over when loaded).
    buried: bool,
    /// The job's last rounds, restarts and end, oldest first (at most
    /// [`TIMELINE`]).
    timeline: std::collections::VecDeque<pb::TimelineEvent>,
    /// Nodes that joined through this registry (node id → host name; at
    /// most [`crate::tombstone::MAX_NODES`]): the job's tombstone names them
    /// too, so that a spare or a member dropped before the end (cut off)
    /// still belongs to the job when it comes back.
    joined: BTreeMap<String, String>,
}

/// What the registry's one lock guards.
#[derive(Debug)]
struct Jobs {
    map: BTreeMap<String, Entry>,
    /// When each job next has periodic work.
    deadlines: Deadlines,
    /// Arrivals and departures not yet logged.
    tallies: Tallies,
    /// What is decided and not yet durable (only with a store).
    commit: Commit,
    /// Finished jobs' tombstones.
    graves: Graves,
    /// Hosts benched in every job (`--quarantine-scope server`).
    benches: quarantine::ServerBenches,
    /// When this registry last ran (on the process's own clock): a gap
    /// of more than [`PAUSED`] means it did not watch its nodes meanwhile.
    awake: Option<Instant>,
    /// When this registry started, if it holds the jobs it creates afresh
    /// ([`Registry::holding_fresh_jobs`]).
    started: Option<Instant>,
    /// The number the next node stream gets: streams numbered below a
    /// decision's horizon existed when it was taken.
    next_stream: u64,
}

impl Jobs {
    fn new(durable: bool) -> Self {
        Self {
            map: BTreeMap::new(),
            deadlines: Deadlines::default(),
            tallies: Tallies::default(),
            commit: Commit::new(durable),
            graves: Graves::default(),
            awake: None,
            started: None,
            next_stream: 1,
            benches: quarantine::ServerBenches::default(),
        }
    }
}

/// One node's membership of a job, as [`Registry::memberships`] saw it: a
/// node dropped and joining again under the same id is another membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The job.
    pub job_id: String,
    /// The node.
    pub node_id: String,
    /// Which joining of the node id it is ([`Member::joined_seq`]).
    pub seq: u64,
}

/// Every job the server knows.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<Jobs>>,
    ttl: Duration,
    limits: Limits,
    store: Option<Arc<dyn JobStore>>,
    /// Whether a resuming node may recreate a job this registry does not
    /// hold ([`Registry::without_relearning`]).
    relearn: bool,
    /// The simulator's planted bug ([`Registry::delivering_before_durable`]).
    early: bool,
    /// Woken by every change a flush should write.
    wake: Arc<tokio::sync::Notify>,
    /// A replica's lease: nothing is served once it may have lapsed.
    lease: Option<LeaseClock>,
    /// What is counted for Prometheus.
    metrics: ServerMetrics,
    /// One flush at a time, so batches reach the store in the order taken.
    flushing: Arc<tokio::sync::Mutex<()>>,
    /// Stack collections under way ([`crate::stacks`]).
    stacks: Arc<crate::stacks::Desk>,
    /// Where the time comes from where no caller gives it ([`crate::clock`]).
    clock: SharedClock,
}

impl Registry {
    /// An empty registry that forgets a job `ttl` after it finished or lost
    /// its last member, and holds at most what `limits` allow.
    pub fn new(ttl: Duration, limits: Limits) -> Self {
        Self::build(ttl, limits, None)
    }

    fn build(ttl: Duration, limits: Limits, store: Option<Arc<dyn JobStore>>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Jobs::new(store.is_some()))),
            ttl,
            limits,
            store,
            relearn: true,
            early: false,
            wake: Arc::default(),
            lease: None,
            metrics: ServerMetrics::default(),
            flushing: Arc::default(),
            stacks: Arc::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The same, reading the time from `clock` (a test's, the simulator's)
    /// instead of the system's. Give it before [`Registry::holding_fresh_jobs`],
    /// which reads it.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The time now, on this registry's clock: what its callers pass as
    /// `now`.
    pub fn now(&self) -> Now {
        self.clock.now()
    }

    /// The monotonic instant now, on this registry's clock: what its callers
    /// pass as `now` (without reading the wall clock).
    pub fn instant(&self) -> Instant {
        self.clock.instant()
    }

    /// The same, writing every change to `store` ([`Registry::flush`]).
    pub fn with_store(ttl: Duration, limits: Limits, store: Arc<dyn JobStore>) -> Self {
        Self::build(ttl, limits, Some(store))
    }

    /// The same, for a server without a store, which cannot tell its first
    /// start from a restart: a job it creates afresh within a drop limit (or
    /// the outage limit of agents that ride out outages) of now completes no
    /// round until then ([`Job::hold_until`]), as workers of the job's last
    /// instance may run until their fence.
    pub fn holding_fresh_jobs(self) -> Self {
        let now = self.clock.instant();
        self.lock().started = Some(now);
        self
    }

    /// The same, refusing a node that resumes a job it does not hold
    /// ([`Error::JobGone`]) instead of relearning the job from it: for a
    /// store that holds every job there is (an agent-only rendezvous, whose
    /// finished jobs are deleted as its last leader leaves).
    pub fn without_relearning(mut self) -> Self {
        self.relearn = false;
        self
    }

    /// A planted bug, for the simulator to show that its checks catch it
    /// (`sim/scenarios/planted_commit.sim`): a change's events go to the
    /// nodes at once, before the store holds the change, so a leader that
    /// dies before the write leaves nodes acting on a decision its
    /// successor never learns. Nothing else calls it.
    pub fn delivering_before_durable(mut self) -> Self {
        self.early = true;
        self
    }

    /// The same, serving only while `lease` may be valid: once it may have
    /// lapsed (a leader that was paused, or cut off from etcd), the first
    /// call or tick ends every stream, saying this server no longer leads,
    /// and every call is refused with UNAVAILABLE ([`crate::lease`]).
    pub fn with_lease(mut self, lease: LeaseClock) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Whether this registry may act now (see [`Registry::with_lease`]).
    fn acting(&self) -> Result<(), Error> {
        match &self.lease {
            Some(lease) if !lease.may_act(self.clock.instant()) => {
                if !self.lock().commit.closing() {
                    warn!(
                        "this replica's etcd lease may have lapsed (the process was paused, or cut off from etcd): it no longer leads; ending every node's stream"
                    );
                    self.close_all(NOT_LEADING, true);
                }
                Err(Error::NotLeading)
            }
            _ => Ok(()),
        }
    }

    /// The same, counting into `metrics` (shared with the rest of the server).
    pub fn with_metrics(mut self, metrics: ServerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// What this registry counts.
    pub fn metrics(&self) -> &ServerMetrics {
        &self.metrics
    }

    /// Reserves lighthouse quorum ids in the job store
    /// ([`JobStore::reserve_quorum_ids`]); `None` without a store, or one
    /// that keeps no ids.
    pub async fn reserve_quorum_ids(
        &self,
        at_least: i64,
        block: i64,
    ) -> Result<Option<i64>, StoreError> {
        match &self.store {
            Some(store) => store.reserve_quorum_ids(at_least, block).await,
            None => Ok(None),
        }
    }

    /// Brings every job `store` holds into this registry (a server that
    /// starts); returns how many. Jobs this registry already has are kept.
    pub async fn load(&self) -> Result<usize, StoreError> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        let records = store.load().await?;
        let stones = store.tombstones().await?;
        let clock = self.clock.now();
        let now = clock.at;
        self.acting()
            .map_err(|e| StoreError::Fenced(e.to_string()))?;
        let mut guard = self.lock();
        let jobs = &mut *guard;
        let mut loaded = 0;
        for record in records {
            if jobs.map.contains_key(&record.id) {
                continue;
            }
            let id = record.id.clone();
            if record.members.len() > self.limits.max_nodes_per_job as usize {
                // Its nodes are running: continue it, admit no one more.
                warn!(job = %id, nodes = record.members.len(), max_nodes_per_job = self.limits.max_nodes_per_job, "a job in the store has more nodes than this server admits per job (--max-nodes-per-job; in an agent, the MAX of --nnodes); continuing it, but no node joins it until it has fewer");
            }
            let torn = record.torn;
            let restored = Job::restore(record, now);
            let mut job = self.equip(jobs, restored, now);
            // Its nodes kept the last leader alive, not this one.
            job.handed_over(now);
            if torn {
                // No node acted on the half-written change; its nodes rejoin
                // a new round (their workers stop), and the next flush writes
                // the job whole.
                warn!(job = %id, round = job.round(), "the last leader stopped while writing a change to this job; re-forming it (no restart is counted)");
                let _ = job.reform(
                    now,
                    "the rendezvous server that led this job stopped while writing a change to it"
                        .into(),
                );
            }
            // A leader taking over saw neither the round begin nor the
            // job's first one: a round it forms now counts as a re-form.
            let forming = matches!(job.phase(), Phase::Forming);
            let buried = job.phase().is_terminal();
            let entry = Entry {
                job,
                streams: HashMap::new(),
                scheduled: None,
                forming_since: forming.then_some(now),
                formed: true,
                buried,
                timeline: Default::default(),
                joined: BTreeMap::new(),
            };
            jobs.map.insert(id.clone(), entry);
            if torn {
                jobs.commit.mark(&id);
            }
            self.schedule(jobs, &id, now);
            loaded += 1;
        }
        if jobs.map.len() > self.limits.max_jobs {
            warn!(jobs = jobs.map.len(), max_jobs = self.limits.max_jobs, "the job store holds more jobs than --max-jobs; no new job is admitted until some end");
        }
        jobs.graves
            .lay_loaded(stones, clock.unix_ms, &self.limits, &mut jobs.commit);
        Ok(loaded)
    }

    /// Writes every job changed since the last flush to the store, as one
    /// batch, then delivers the events those changes caused; returns how many
    /// jobs it wrote. The lock is held only to take the records and to
    /// deliver. A batch that fails is retried by the next flush, its events
    /// still held.
    pub async fn flush(&self) -> Result<usize, StoreError> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        let _one = self.flushing.lock().await;
        let (pending, put, removed) = {
            let mut guard = self.lock();
            let jobs = &mut *guard;
            let Some(pending) = jobs.commit.take() else {
                return Ok(0);
            };
            let now = self.clock.instant();
            let (mut put, mut removed) = (Vec::new(), Vec::new());
            for id in &pending.ids {
                match jobs.map.get(id) {
                    Some(e) => put.push(e.job.record(now)),
                    None => removed.push(id.clone()),
                }
            }
            (pending, put, removed)
        };
        let written = pending.ids.len();
        let done = match pending
            .write(store.as_ref(), put, removed, self.limits.tombstone_ttl)
            .await
        {
            Ok(done) => done,
            Err((pending, e)) => {
                self.lock().commit.failed(pending, &e);
                return Err(e);
            }
        };
        let mut guard = self.lock();
        let jobs = &mut *guard;
        let now = self.clock.instant();
        for held in jobs.commit.written(done) {
            let (job_id, out, horizon) = held.into_parts();
            release(jobs, &job_id, out, horizon, now);
        }
        Ok(written)
    }

    /// Forgets every job that is over now rather than `ttl` after it ended
    /// (with a store, the next [`Registry::flush`] deletes their records);
    /// returns how many. For a rendezvous whose last server is going away
    /// with the job's nodes: nobody is left to forget them later. Run it
    /// after the flush that sent the outcome, whose events need the job.
    pub fn forget_finished(&self) -> usize {
        let mut guard = self.lock();
        let jobs = &mut *guard;
        let over: Vec<String> = jobs
            .map
            .iter()
            .filter(|(_, e)| e.job.phase().is_terminal())
            .map(|(id, _)| id.clone())
            .collect();
        for id in &over {
            jobs.map.remove(id);
            jobs.commit.mark(id);
            self.stacks.forget(id);
        }
        over.len()
    }

    /// Resolves when a change waits to be written ([`Registry::flush`]).
    pub async fn changes(&self) {
        self.wake.notified().await;
    }

    fn lock(&self) -> MutexGuard<'_, Jobs> {
        // A poisoned lock means a handler panicked mid-update; the state machine
        // methods do not panic, so keep serving with what is there.
        let mut jobs = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // The registry's clock, not a caller's `now`: what counts is
        // whether this process ran.
        let ran = self.clock.instant();
        let last = jobs.awake.replace(ran);
        if let Some(gap) = last.map(|l| ran.saturating_duration_since(l)) {
            if gap > PAUSED {
                self.woke(&mut jobs, ran, gap);
            }
        }
        jobs
    }

    /// This registry did not run for `gap` (the process was paused or
    /// starved; the ticker runs every 100 ms): it did not watch its nodes
    /// meanwhile, so it counts none of that as their silence. Every job's
    /// nodes get the whole drop limit from `now`, as from a new leader
    /// ([`Job::handed_over`]). One line, whatever the number of jobs.
    fn woke(&self, jobs: &mut Jobs, now: Instant, gap: Duration) {
        let ids: Vec<String> = jobs.map.keys().cloned().collect();
        for id in &ids {
            if let Some(entry) = jobs.map.get_mut(id) {
                entry.job.handed_over(now);
            }
            self.schedule(jobs, id, now);
        }
        if !ids.is_empty() {
            warn!(
                stopped_s = gap.as_secs_f64(),
                jobs = ids.len(),
                "this rdzv-server did not run for a while (paused or starved): silence from then is not counted; every node has the whole drop limit from now"
            );
        }
    }

    /// What this registry holds at most.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Jobs known (for tests and metrics).
    pub fn job_count(&self) -> usize {
        self.lock().map.len()
    }

    /// Runs `f` on job `job_id` as held now, if it is held: for the
    /// simulator's checkers and for tests. It reads, so it does not count
    /// as this registry running (a pause it spans is still noticed).
    pub fn with_job<R>(&self, job_id: &str, f: impl FnOnce(&Job) -> R) -> Option<R> {
        let jobs = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        jobs.map.get(job_id).map(|e| f(&e.job))
    }

    /// When the earliest job's periodic work is due (possibly earlier:
    /// an entry a job moved is kept until it comes up): when a caller that
    /// drives the registry's clock itself, as the simulator does, should
    /// next call [`Registry::tick`]. Like [`Registry::with_job`], a read.
    pub fn next_deadline(&self) -> Option<Instant> {
        let jobs = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        jobs.deadlines.peek()
    }

    /// A node joins (or resumes); returns its event stream. `from`: the
    /// address the call came from; `fresh`: the session secret it gets if it
    /// is new to the job.
    pub fn join(
        &self,
        now: Instant,
        req: &pb::JoinRequest,
        from: Option<IpAddr>,
        fresh: Session,
    ) -> Result<NodeStream, Error> {
        self.acting()?;
        let mut guard = self.lock();
        let jobs = &mut *guard;
        if jobs.commit.closing() {
            // Its jobs were closed for the server that continues them.
            return Err(Error::ShuttingDown);
        }
        let mut previous = None;
        if let Some((t, running)) = self.tombstone_for(jobs, &req.job_id) {
            let new_run = t.starts_new_run(&req.node_id, req.resume.is_some(), req.started_unix_ms);
            if running {
                // A new run of the id goes on: the earlier run's own nodes
                // are told that run's outcome; anyone else joins the new one.
                if t.took_part(&req.node_id) {
                    return self.over(t, req);
                }
            } else if !new_run {
                return self.over(t, req);
            } else {
                // The same command typed again after the job ended: a new
                // run of the id. The finished job makes room (its tombstone
                // stays, for the earlier run's own nodes).
                if jobs.map.remove(&req.job_id).is_some() {
                    jobs.commit.mark(&req.job_id);
                    self.stacks.forget(&req.job_id);
                }
                info!(job = %req.job_id, earlier = t.outcome(), finished = %t.finished_text(), "a new run of a finished job's id");
            }
            if new_run {
                previous = Some(t.over());
            }
        }
        let created = !jobs.map.contains_key(&req.job_id);
        let newcomer = jobs
            .map
            .get(&req.job_id)
            .is_none_or(|e| !e.job.members().contains_key(&req.node_id));
        if let (Some(why), true) = (jobs.commit.unwritable(), newcomer) {
            // What members do is bounded (a few calls a round); what
            // newcomers could add is not.
            return Err(Error::Unwritable(why.to_owned()));
        }
        if created {
            if jobs.map.len() >= self.limits.max_jobs {
                return Err(Error::LimitReached(format!(
                    "this server already holds {} jobs (--max-jobs); finished jobs are forgotten after --finished-job-ttl",
                    self.limits.max_jobs
                )));
            }
            let job = match &req.resume {
                Some(_) if !self.relearn => {
                    return Err(Error::JobGone(req.job_id.clone()));
                }
                // This server does not know the job (it restarted): relearn it.
                Some(resume) => {
                    // Placeholders cost memory the resuming node does not
                    // pay for: all relearned jobs together hold at most one
                    // job's worth.
                    let held: u64 = jobs
                        .map
                        .values()
                        .map(|e| u64::from(e.job.absent_count()))
                        .sum();
                    if held + u64::from(resume.nnodes) > u64::from(self.limits.max_nodes_per_job) {
                        return Err(Error::LimitReached(format!(
                            "relearning job '{}' would keep more than {} placeholders for nodes that have not reconnected (--max-nodes-per-job)",
                            req.job_id, self.limits.max_nodes_per_job
                        )));
                    }
                    info!(job = %req.job_id, round = resume.round, "relearning a running job from a reconnecting node");
                    let mut job = Job::relearn(now, req.job_id.clone(), req, resume);
                    if let Some(started) = jobs.started {
                        // Until every node of the round it was told of is
                        // back: one that is not may run a later round this
                        // server formed before it lost everything.
                        job.hold_until(now, started);
                    }
                    job
                }
                None => {
                    let mut job = Job::new(req.job_id.clone(), JobConfig::from_join(req));
                    if let Some(started) = jobs.started {
                        job.hold_until(now, started);
                    }
                    job
                }
            };
            let job = self.equip(jobs, job, now);
            jobs.map.insert(
                req.job_id.clone(),
                Entry {
                    formed: job.round() > 0 && req.resume.is_some(),
                    job,
                    streams: HashMap::new(),
                    scheduled: None,
                    forming_since: Some(now),
                    buried: false,
                    timeline: Default::default(),
                    joined: BTreeMap::new(),
                },
            );
        }
        let Some(entry) = jobs.map.get_mut(&req.job_id) else {
            return Err(Error::UnknownJob(req.job_id.clone()));
        };
        let member = entry.job.members().contains_key(&req.node_id);
        let joined =
            if !member && entry.job.members().len() >= self.limits.max_nodes_per_job as usize {
                Err(Error::LimitReached(format!(
                    "job '{}' already has {} nodes (--max-nodes-per-job)",
                    req.job_id, self.limits.max_nodes_per_job
                )))
            } else {
                entry
                    .job
                    .join(now, &req.node_id, req, fresh)
                    .map_err(Error::from)
            };
        let out = match joined {
            Ok(out) => out,
            Err(e) => {
                // A job this request created goes with it (a relearned one
                // with all its placeholders), so a refusal leaves nothing.
                if created || (entry.job.members().is_empty() && entry.streams.is_empty()) {
                    jobs.map.remove(&req.job_id);
                    jobs.commit.mark(&req.job_id);
                }
                return Err(e);
            }
        };
        entry.job.seen_from(&req.node_id, from);
        let mut out = out;
        if let Some(previous) = previous {
            for o in out.iter_mut().filter(|o| o.to == req.node_id) {
                if let Kind::Joined(j) = &mut o.event {
                    j.previous = Some(previous.clone());
                }
            }
        }
        if entry.joined.len() < crate::tombstone::MAX_NODES {
            entry
                .joined
                .insert(req.node_id.clone(), req.hostname.clone());
        }
        let stream = jobs.next_stream;
        jobs.next_stream = stream.saturating_add(1);
        let (tx, rx) = outbox();
        // A replaced stream (the node reconnected) ends when its outbox drops.
        entry.streams.insert(req.node_id.clone(), (stream, tx));
        let tally = jobs.tallies.of(&req.job_id);
        if req.resume.is_some() {
            tally.resumed += 1;
        } else {
            tally.joined += 1;
        }
        self.after(jobs, &req.job_id, now, out);
        Ok(NodeStream {
            inbox: rx,
            registry: self.clone(),
            job_id: req.job_id.clone(),
            node_id: req.node_id.clone(),
            stream,
        })
    }

    /// Runs `f` on job `job_id` for node `node_id`, once `session` proves the
    /// caller is that node, and delivers the events it returns. A node that
    /// is not a member gets [`Error::UnknownNode`].
    pub fn for_node<R>(
        &self,
        now: Instant,
        job_id: &str,
        node_id: &str,
        session: &[u8],
        f: impl FnOnce(&mut Job) -> (R, Vec<Outbound>),
    ) -> Result<R, Error> {
        self.acting()?;
        let mut guard = self.lock();
        let jobs = &mut *guard;
        let entry = jobs
            .map
            .get_mut(job_id)
            .ok_or_else(|| Error::UnknownJob(job_id.to_owned()))?;
        authorize(&entry.job, job_id, node_id, session)?;
        let (r, out) = f(&mut entry.job);
        self.after(jobs, job_id, now, out);
        Ok(r)
    }

    /// What follows every change to a job: logs, delivering its events,
    /// ending streams of nodes it no longer has, rescheduling its deadline.
    fn after(&self, jobs: &mut Jobs, job_id: &str, now: Instant, out: Vec<Outbound>) {
        jobs.commit.mark(job_id);
        let Some(entry) = jobs.map.get_mut(job_id) else {
            return;
        };
        log_transitions(&entry.job, &out);
        self.count_transitions(entry, &out, now);
        if !entry.buried && entry.job.phase().is_terminal() {
            entry.buried = true;
            let now_ms = self.clock.now().unix_ms;
            if let Some(t) = Tombstone::of(&entry.job, now_ms, &entry.joined) {
                jobs.graves.lay(t, &self.limits, &mut jobs.commit);
            }
        }
        let Some(entry) = jobs.map.get_mut(job_id) else {
            return;
        };
        let out = with_peer_key(out);
        // Nobody acts on a change before it is durable: a leader that dies
        // before the write took no decision its successor lacks.
        let over = entry.job.phase().is_terminal();
        let horizon = jobs.next_stream;
        let out = match self.early {
            true => {
                release(jobs, job_id, out, horizon, now);
                Vec::new()
            }
            false => out,
        };
        match jobs.commit.decided(job_id, out, over, horizon) {
            Some(held) => {
                let (_, out, horizon) = held.into_parts();
                release(jobs, job_id, out, horizon, now);
            }
            None => self.wake.notify_one(),
        }
        let Some(entry) = jobs.map.get_mut(job_id) else {
            return;
        };
        let job = &entry.job;
        if !job.phase().is_terminal() && entry.streams.len() > job.members().len() {
            // A node the job dropped (lost, left) loses its stream: if it is in
            // fact alive, it learns so when it reconnects. (Checked only when
            // membership shrank, to keep each call O(log n).)
            entry.streams.retain(|id, _| job.members().contains_key(id));
        }
        self.schedule(jobs, job_id, now);
        self.spread_benches(jobs, job_id, now);
    }

    /// The tombstone of `job_id`'s last finished run: the job's own if it
    /// is over (or one made from it), with `false`; while a new run of the
    /// id goes on, the earlier run's, with `true`.
    fn tombstone_for(&self, jobs: &Jobs, job_id: &str) -> Option<(Tombstone, bool)> {
        let now_ms = self.clock.now().unix_ms;
        let laid = jobs.graves.live(job_id, now_ms, &self.limits);
        match jobs.map.get(job_id) {
            Some(e) if e.job.phase().is_terminal() => laid
                .cloned()
                .or_else(|| Tombstone::of(&e.job, now_ms, &e.joined))
                .map(|t| (t, false)),
            Some(_) => laid.map(|t| (t.clone(), true)),
            None => laid.map(|t| (t.clone(), false)),
        }
    }

    /// Answers a join of a job that is over: a node of the job is told the
    /// outcome (a stream of one `Joined` carrying it, then its end); any
    /// other node is refused, with the outcome and the fix.
    fn over(&self, t: Tombstone, req: &pb::JoinRequest) -> Result<NodeStream, Error> {
        if !t.belongs(&req.node_id, &req.hostname) {
            let until = t.finished_ms.saturating_add(
                u64::try_from(self.limits.tombstone_ttl.as_millis()).unwrap_or(u64::MAX),
            );
            return Err(Error::Over {
                job: t.job_id.clone(),
                outcome: t.outcome(),
                at: t.finished_text(),
                until: accel_wire::time::utc(until),
            });
        }
        tracing::debug!(job = %t.job_id, node = %req.node_id, outcome = t.outcome(), "a node of a finished job joined late; told the outcome");
        let (tx, rx) = outbox();
        // A fresh outbox takes its first event.
        let _ = tx.send(Kind::Joined(pb::Joined {
            round: t.round,
            resumed: false,
            session: Vec::new(),
            over: Some(t.over()),
            previous: None,
        }));
        drop(tx);
        Ok(NodeStream {
            inbox: rx,
            registry: self.clone(),
            job_id: req.job_id.clone(),
            node_id: req.node_id.clone(),
            // No stream of the job carries this number: its end changes nothing.
            stream: 0,
        })
    }

    /// Tombstones held (for tests).
    pub fn tombstone_count(&self) -> usize {
        self.lock().graves.len()
    }

    /// Counts what a change did: a round formed (and how long it took), a
    /// restart, the job's end.
    fn count_transitions(&self, entry: &mut Entry, out: &[Outbound], now: Instant) {
        let m = &self.metrics;
        let unix_ms = self.clock.now().unix_ms;
        for o in out {
            let event = |kind: &str, round: u64, reason: &str| pb::TimelineEvent {
                unix_ms,
                kind: kind.to_owned(),
                round,
                reason: truncated(reason, TIMELINE_REASON).to_owned(),
                ..Default::default()
            };
            let happened = match &o.event {
                Kind::RoundComplete(r) => {
                    let took = entry.forming_since.take().map(|t| now - t);
                    m.round_formed(took, !entry.formed);
                    entry.formed = true;
                    pb::TimelineEvent {
                        nnodes: r.nnodes,
                        world_size: r.world_size,
                        ..event("formed", r.round, "")
                    }
                }
                Kind::RestartRequested(r) => {
                    m.restart(r.counted);
                    entry.forming_since = Some(now);
                    let kind = if r.counted { "restart" } else { "re-form" };
                    event(kind, r.round, &r.reason)
                }
                Kind::JobSucceeded(r) => {
                    m.job_ended(true, r.goodput.as_deref());
                    event("succeeded", r.round, "")
                }
                Kind::JobFailed(r) => {
                    m.job_ended(false, r.goodput.as_deref());
                    event("failed", r.round, &r.reason)
                }
                _ => continue,
            };
            if entry.timeline.len() >= TIMELINE {
                entry.timeline.pop_front();
            }
            entry.timeline.push_back(happened);
            // One event per member says the same: count the change once.
            break;
        }
    }

    /// Jobs by phase, members by state, and running jobs' restarts, for a
    /// metrics scrape.
    pub fn summary(&self) -> Summary {
        let jobs = self.lock();
        // Every phase and state is there, at 0 when nothing is in it.
        let mut phases: BTreeMap<&'static str, u64> = ["forming", "running", "succeeded", "failed"]
            .into_iter()
            .map(|p| (p, 0))
            .collect();
        let mut states: BTreeMap<&'static str, u64> = [
            "joining",
            "ready",
            "running",
            "spare",
            "quarantined",
            "succeeded",
            "done",
        ]
        .into_iter()
        .map(|p| (p, 0))
        .collect();
        let mut restarts = Vec::new();
        let mut time = Vec::new();
        let mut stragglers = Vec::new();
        let mut forming = Vec::new();
        let now = self.clock.instant();
        for (id, e) in &jobs.map {
            let job = &e.job;
            *phases.entry(job.phase().name()).or_default() += 1;
            if let (Phase::Forming, Some(since)) = (job.phase(), e.forming_since) {
                if forming.len() < JOB_SERIES {
                    forming.push((id.clone(), now.saturating_duration_since(since)));
                }
            }
            for m in job.members().values() {
                *states.entry(node_state(job, m)).or_default() += 1;
            }
            if !job.phase().is_terminal() && restarts.len() < JOB_SERIES {
                restarts.push((id.clone(), job.restart_count(), job.config().max_restarts));
            }
            if time.len() < JOB_SERIES {
                for s in job.straggler_info() {
                    stragglers.push((id.clone(), s.host, s.rank, s.step_us, s.median_us));
                }
                let spent = job.time_spent(now);
                let ms = crate::job::Category::ALL
                    .map(|c| u64::try_from(spent.of(c).as_millis()).unwrap_or(u64::MAX));
                time.push((id.clone(), ms));
            }
        }
        let quarantined_hosts = self.quarantined_in(&jobs);
        Summary {
            jobs: phases.into_iter().collect(),
            nodes: states.into_iter().collect(),
            quarantined_hosts,
            quarantine_free: self.quarantine_free_in(&jobs),
            restarts,
            time,
            stragglers,
            forming,
        }
    }

    /// Puts the job's next deadline in the heap, if it is earlier than the
    /// one there.
    fn schedule(&self, jobs: &mut Jobs, job_id: &str, now: Instant) {
        let Some(entry) = jobs.map.get_mut(job_id) else {
            return;
        };
        let next = entry.job.next_deadline(now, self.ttl);
        jobs.deadlines.schedule(&mut entry.scheduled, job_id, next);
    }

    /// A node's keep-alive, once `session` proves the caller is that node;
    /// false if it is not a member. Nothing else changes, so nothing is
    /// delivered, rescheduled or marked for the store.
    pub fn keep_alive(
        &self,
        now: Instant,
        job_id: &str,
        node_id: &str,
        session: &[u8],
    ) -> Result<bool, Error> {
        self.keep_alive_vouching(now, job_id, node_id, session, None)
            .map(|(member, _)| member)
    }

    /// [`Registry::keep_alive`], and, with `vouch`, the node (a node of
    /// the running round it names) vouches for the nodes of that round it
    /// hears through the round's peer hub ([`Job::vouch`]), under the same
    /// lock and check of its session, and its workers' progress, if the
    /// request carries it ([`Job::report_progress`]). Whether it is a
    /// member, and how many nodes the vouch refreshed. A vouch for another
    /// round counts for nothing.
    pub fn keep_alive_vouching(
        &self,
        now: Instant,
        job_id: &str,
        node_id: &str,
        session: &[u8],
        vouch: Option<&pb::KeepAliveRequest>,
    ) -> Result<(bool, usize), Error> {
        self.acting()?;
        let mut jobs = self.lock();
        let entry = jobs
            .map
            .get_mut(job_id)
            .ok_or_else(|| Error::UnknownJob(job_id.to_owned()))?;
        authorize(&entry.job, job_id, node_id, session)?;
        let member = entry.job.keep_alive(now, node_id);
        let mut out = Vec::new();
        let vouched = vouch.map_or(0, |v| {
            let vouched = match v.vouch_all || v.vouch.iter().any(|b| *b != 0) {
                true => entry
                    .job
                    .vouch(now, node_id, v.round, &v.vouch, v.vouch_all),
                false => 0,
            };
            // Kept in memory, and written with the job's next change: a
            // store write per keep-alive would cost more than a lost
            // report (a failure report carries the failing node's anyway).
            if let Some(p) = &v.progress {
                out = entry.job.report_progress(now, node_id, p);
            }
            vouched
        });
        if !out.is_empty() || entry.job.has_new_benches() {
            // A straggler's host quarantined (--straggler-quarantine): the
            // bench is written, logged and spread as any other, and the
            // round re-forms with a spare in its place when one waits. A
            // bench without a re-form is a change too: else a failover
            // before the job's next write would lose it, and it would place
            // the host it benched (found by the simulator, seeds 214436 and
            // 310397).
            self.after(&mut jobs, job_id, now, out);
        }
        Ok((member, vouched))
    }

    /// Periodic work: runs the jobs whose deadline is due, forgets expired
    /// ones, and logs arrivals and departures.
    pub fn tick(&self, now: Instant) {
        if self.acting().is_err() {
            return;
        }
        let mut guard = self.lock();
        let jobs = &mut *guard;
        while let Some((t, id)) = jobs.deadlines.pop_due(now) {
            let Some(entry) = jobs.map.get_mut(&id) else {
                continue;
            };
            if entry.scheduled != Some(t) {
                continue; // stale: the job was rescheduled earlier
            }
            entry.scheduled = None;
            if entry.job.expired(now, self.ttl) {
                jobs.map.remove(&id);
                jobs.commit.mark(&id);
                self.stacks.forget(&id);
                continue;
            }
            let members = entry.job.members().len();
            let out = entry.job.tick(now);
            let dropped = members.saturating_sub(entry.job.members().len());
            if dropped > 0 {
                jobs.tallies.of(&id).silent += dropped as u64;
            }
            self.after(jobs, &id, now, out);
        }
        let now_ms = self.clock.now().unix_ms;
        jobs.graves.expire(now_ms, &self.limits, &mut jobs.commit);
        let live = jobs
            .map
            .iter()
            .filter_map(|(id, e)| e.scheduled.map(|t| (t, id.clone())));
        jobs.deadlines.compact(jobs.map.len(), live);
        for (job, t) in jobs.tallies.due(now) {
            self.metrics.movements(&t);
            log_tally(&job, &t);
        }
    }

    /// Every member of every job that is not over, as of now (not a
    /// relearned job's placeholders, which stand for nodes not back yet).
    /// O(members): for checks that run now and then, not per call.
    pub fn memberships(&self) -> Vec<Membership> {
        let jobs = self.lock();
        let mut all = Vec::new();
        for (job_id, e) in jobs
            .map
            .iter()
            .filter(|(_, e)| !e.job.phase().is_terminal())
        {
            all.extend(
                e.job
                    .members()
                    .iter()
                    .filter(|(id, _)| !crate::job::is_placeholder(id))
                    .map(|(id, m)| Membership {
                        job_id: job_id.clone(),
                        node_id: id.clone(),
                        seq: m.joined_seq(),
                    }),
            );
        }
        all
    }

    /// Drops the memberships of `gone` that still hold (a node that left
    /// and joined again since is another membership, and stays) because
    /// their nodes' etcd leases expired; `reason` says so to the others.
    /// Each job decides once, after all of its nodes went
    /// ([`Job::drop_nodes`]); a node of the running round re-forms the job
    /// as any departure does. Returns how many went.
    pub fn drop_expired(&self, now: Instant, gone: &[Membership], reason: &str) -> usize {
        let mut by_job: BTreeMap<&str, Vec<&Membership>> = BTreeMap::new();
        for m in gone {
            by_job.entry(m.job_id.as_str()).or_default().push(m);
        }
        let mut guard = self.lock();
        let jobs = &mut *guard;
        let mut dropped = 0;
        for (job_id, nodes) in by_job {
            let Some(entry) = jobs.map.get_mut(job_id) else {
                continue;
            };
            let members = entry.job.members();
            let ids: Vec<String> = nodes
                .iter()
                .filter(|n| {
                    members
                        .get(&n.node_id)
                        .is_some_and(|m| m.joined_seq() == n.seq)
                })
                .map(|n| n.node_id.clone())
                .collect();
            if ids.is_empty() || entry.job.phase().is_terminal() {
                continue;
            }
            for id in &ids {
                entry.streams.remove(id);
            }
            let before = entry.job.members().len();
            let out = entry.job.drop_nodes(now, &ids, reason);
            let n = before.saturating_sub(entry.job.members().len());
            dropped += n;
            jobs.tallies.of(job_id).expired += n as u64;
            self.after(jobs, job_id, now, out);
        }
        dropped
    }

    /// Ends every job's streams (server shutdown). A store is written no
    /// more: the jobs were not closed for the server that continues them, so
    /// it starts from the last batch (flush first to make that the latest).
    pub fn close_all(&self, reason: &str, may_rejoin: bool) {
        let now = self.clock.instant();
        let mut jobs = self.lock();
        // Not durable, so never decided: the server that continues the jobs
        // decides again.
        jobs.commit.close();
        for entry in jobs.map.values_mut() {
            let out = entry.job.close(now, reason, may_rejoin);
            deliver(entry, out, u64::MAX);
            entry.streams.clear();
        }
    }

    /// A node leaves: its stream goes first (so the job's own bookkeeping
    /// stays O(log n)), then the job learns. With `stream`, only if that
    /// stream is still the node's current one (a reconnected node replaced
    /// it, or the server ended it for being too slow).
    pub fn depart(
        &self,
        now: Instant,
        job_id: &str,
        node_id: &str,
        reason: &str,
        stream: Option<u64>,
    ) {
        let mut guard = self.lock();
        self.depart_locked(&mut guard, now, job_id, node_id, reason, stream);
    }

    /// A node asks to leave: only with its own secret (checked under the same
    /// lock as the departure); a call for a node that is not a member, or for
    /// a relearned job's placeholder, changes nothing. `unhealthy`: it
    /// failed its health check, which quarantines its host when the server
    /// quarantines ([`Job::bench_unhealthy`]).
    pub fn leave(
        &self,
        now: Instant,
        job_id: &str,
        node_id: &str,
        session: &[u8],
        reason: &str,
        unhealthy: bool,
    ) -> Result<(), Error> {
        self.acting()?;
        let mut guard = self.lock();
        let Some(entry) = guard.map.get(job_id) else {
            return Ok(());
        };
        match entry.job.authorize(node_id, session) {
            Ok(()) => {}
            Err(AuthError::NotMember) => return Ok(()),
            Err(_) => return Err(Error::WrongSession(job_id.to_owned(), node_id.to_owned())),
        }
        if unhealthy {
            if let Some(entry) = guard.map.get_mut(job_id) {
                entry.job.bench_unhealthy(now, node_id, reason);
            }
        }
        self.depart_locked(&mut guard, now, job_id, node_id, reason, None);
        Ok(())
    }

    fn depart_locked(
        &self,
        jobs: &mut Jobs,
        now: Instant,
        job_id: &str,
        node_id: &str,
        reason: &str,
        stream: Option<u64>,
    ) {
        let Some(entry) = jobs.map.get_mut(job_id) else {
            return;
        };
        match (stream, entry.streams.get(node_id)) {
            (Some(s), Some((current, _))) if *current != s => return,
            (Some(_), None) => return, // already dropped by the job
            _ => {}
        }
        entry.streams.remove(node_id);
        let member = entry.job.members().contains_key(node_id);
        if member && !entry.job.phase().is_terminal() {
            let tally = jobs.tallies.of(job_id);
            if stream.is_some() {
                tally.disconnected += 1;
            } else {
                tally.left += 1;
            }
        }
        let out = entry.job.leave(now, node_id, reason);
        self.after(jobs, job_id, now, out);
    }

    /// One page of job states: `job_id` alone, or every job after
    /// `page_token` in id order, at most `page_size` of them.
    pub fn status(
        &self,
        job_id: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::JobStatusResponse, Error> {
        self.status_listing(job_id, page_size, page_token, STATUS_NODES)
    }

    /// [`Registry::status`] listing at most `nodes` nodes of each job (the
    /// status page shows fewer than `rdzv-server status`).
    pub fn status_listing(
        &self,
        job_id: &str,
        page_size: u32,
        page_token: &str,
        nodes: usize,
    ) -> Result<pb::JobStatusResponse, Error> {
        self.acting()?;
        let nodes = nodes.min(STATUS_NODES);
        let jobs = self.lock();
        if !job_id.is_empty() {
            let e = jobs
                .map
                .get(job_id)
                .ok_or_else(|| Error::UnknownJob(job_id.to_owned()))?;
            let mut info = entry_info(e, self.clock.now(), nodes);
            info.stacks_unix_ms = self.stacks.kept_at(job_id);
            return Ok(pb::JobStatusResponse {
                jobs: vec![info],
                next_page_token: String::new(),
                lighthouse: None,
            });
        }
        let now = self.clock.now();
        let size = match page_size as usize {
            0 => STATUS_PAGE.0,
            n => n.min(STATUS_PAGE.1),
        };
        let start = if page_token.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(page_token.to_owned())
        };
        let mut page: Vec<pb::JobInfo> = jobs
            .map
            .range::<String, _>((start, Bound::Unbounded))
            .take(size + 1)
            .map(|(id, e)| pb::JobInfo {
                stacks_unix_ms: self.stacks.kept_at(id),
                ..entry_info(e, now, nodes)
            })
            .collect();
        let next_page_token = if page.len() > size {
            page.truncate(size);
            page.last().map(|j| j.job_id.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(pb::JobStatusResponse {
            jobs: page,
            next_page_token,
            lighthouse: None,
        })
    }
}

/// Checks that `session` is `node_id`'s secret in `job`.
/// Gives a round that completes in `out` its peer key: 32 random bytes,
/// the same in every node's [`pb::RoundComplete`] (the agents' peer hub
/// authenticates its datagrams with it). Without randomness the round gets
/// none, and its nodes keep no workers past the drop limit without the
/// rendezvous (as agents without a peer hub).
fn with_peer_key(mut out: Vec<Outbound>) -> Vec<Outbound> {
    let completes = |o: &Outbound| matches!(o.event, Kind::RoundComplete(_));
    if !out.iter().any(completes) {
        return out;
    }
    let mut key = [0u8; 32];
    if let Err(e) = getrandom::fill(&mut key) {
        warn!(error = %e, "no randomness for a round's peer key; its nodes fence at the drop limit");
        return out;
    }
    for o in &mut out {
        if let Kind::RoundComplete(rc) = &mut o.event {
            rc.peer_key = key.to_vec();
        }
    }
    out
}

fn authorize(job: &Job, job_id: &str, node_id: &str, session: &[u8]) -> Result<(), Error> {
    job.authorize(node_id, session).map_err(|e| match e {
        AuthError::NotMember => Error::UnknownNode(job_id.to_owned(), node_id.to_owned()),
        _ => Error::WrongSession(job_id.to_owned(), node_id.to_owned()),
    })
}

/// Delivers a change's events to job `job_id`'s streams, counting the
/// streams ended for being too slow; a job that is over ends every stream
/// (agents see the end, and a hosting agent can shut its embedded server
/// down gracefully).
fn release(jobs: &mut Jobs, job_id: &str, out: Vec<Outbound>, horizon: u64, now: Instant) {
    let Some(entry) = jobs.map.get_mut(job_id) else {
        return;
    };
    if out
        .iter()
        .any(|o| matches!(o.event, pb::event::Kind::RestartRequested(_)))
    {
        entry.job.restart_delivered(now);
    }
    let slow = deliver(entry, out, horizon);
    if entry.job.phase().is_terminal() {
        entry.streams.clear();
    }
    if slow > 0 {
        jobs.tallies.of(job_id).too_slow += slow;
    }
}

/// Delivers events to the members' streams numbered below `horizon`;
/// returns how many streams were ended because their node did not keep up.
fn deliver(entry: &mut Entry, out: Vec<Outbound>, horizon: u64) -> u64 {
    let mut slow = Vec::new();
    for o in out {
        if let Some((_, tx)) = entry.streams.get(&o.to).filter(|(n, _)| *n < horizon) {
            if tx.send(o.event).is_err() {
                slow.push(o.to);
            }
        }
    }
    let n = slow.len() as u64;
    for id in slow {
        // Dropping the outbox ends the stream after the error it holds; the
        // node stays a member and may resume.
        entry.streams.remove(&id);
    }
    n
}

/// Logs a round formed, a restart, or the job's end: once each.
fn log_transitions(job: &Job, out: &[Outbound]) {
    let id = job.id();
    let formed = out.iter().find_map(|o| match &o.event {
        Kind::RoundComplete(r) => Some(r),
        _ => None,
    });
    if let Some(r) = formed {
        info!(
            job = id,
            round = r.round,
            nnodes = r.nnodes,
            world_size = r.world_size,
            restart_count = r.restart_count,
            "round formed"
        );
    }
    let restart = out.iter().find_map(|o| match &o.event {
        Kind::RestartRequested(r) => Some(r),
        _ => None,
    });
    if let Some(r) = restart {
        let (used, budget) = (job.restart_count(), job.config().max_restarts);
        // Reasons carry what a client wrote: an excerpt here, the whole in status.
        let reason = excerpt(&r.reason);
        if r.counted {
            warn!(job = id, round = r.round, next_round = r.next_round, restarts = %format!("{used} of {budget}"), %reason, "restarting the job after a failure");
        } else {
            info!(job = id, round = r.round, next_round = r.next_round, %reason, "re-forming the job: membership changed");
        }
    }
    let ended = out
        .iter()
        .any(|o| matches!(o.event, Kind::JobSucceeded(_) | Kind::JobFailed(_)));
    if ended {
        match job.phase() {
            Phase::Succeeded => info!(job = id, round = job.round(), "job succeeded"),
            Phase::Failed(reason) => {
                warn!(job = id, round = job.round(), reason = %excerpt(reason), "job failed")
            }
            _ => {}
        }
    }
}

fn log_tally(job: &str, t: &Movements) {
    match tally::describe(t) {
        Some((summary, true)) => warn!(job, nodes = %summary, "membership changed"),
        Some((summary, false)) => info!(job, nodes = %summary, "membership changed"),
        None => {}
    }
}

/// The event stream of one node; tells the registry when it is dropped.
#[derive(Debug)]
pub struct NodeStream {
    inbox: Inbox,
    registry: Registry,
    job_id: String,
    node_id: String,
    stream: u64,
}

impl Stream for NodeStream {
    type Item = Result<pb::Event, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inbox).poll_next(cx)
    }
}

impl Drop for NodeStream {
    fn drop(&mut self) {
        let why = "its connection to the rendezvous ended";
        self.registry.depart(
            self.registry.clock.instant(),
            &self.job_id,
            &self.node_id,
            why,
            Some(self.stream),
        );
    }
}

fn node_state(job: &Job, m: &Member) -> &'static str {
    match (job.phase(), m.rank, m.ready.is_some()) {
        (Phase::Running, Some(_), _) if m.succeeded => "succeeded",
        (Phase::Running, Some(_), _) => "running",
        (Phase::Running | Phase::Forming, _, _) if job.is_benched(m) => "quarantined",
        (Phase::Running, None, _) => "spare",
        (Phase::Forming, _, true) => "ready",
        (Phase::Forming, _, false) => "joining",
        _ => "done",
    }
}

/// A job's status with what the registry adds: its timeline.
fn entry_info(e: &Entry, now: Now, nodes: usize) -> pb::JobInfo {
    pb::JobInfo {
        timeline: e.timeline.iter().cloned().collect(),
        ..job_info(&e.job, now, nodes)
    }
}

/// A job's status: its nodes in node-rank order first, at most `listed`.
fn job_info(job: &Job, now: Now, listed: usize) -> pb::JobInfo {
    let c = job.config();
    let members = job.members();
    let in_round = job
        .participants()
        .iter()
        .filter_map(|id| members.get_key_value(id));
    let others = members.iter().filter(|(_, m)| m.rank.is_none());
    let nodes = in_round
        .chain(others)
        .take(listed)
        .map(|(id, m)| pb::NodeStatus {
            node_id: id.clone(),
            hostname: m.hostname.clone(),
            node_rank: m.rank,
            state: node_state(job, m).to_owned(),
            topology: m.topology.to_string(),
            last_seen_ms: u64::try_from(now.at.saturating_duration_since(job.heard(m)).as_millis())
                .unwrap_or(u64::MAX),
        })
        .collect();
    pb::JobInfo {
        job_id: job.id().to_owned(),
        phase: job.phase().name().to_owned(),
        round: job.round(),
        restart_count: job.restart_count(),
        max_restarts: c.max_restarts,
        min_nodes: c.min_nodes,
        max_nodes: c.max_nodes,
        nodes,
        last_failure: truncated(job.last_failure().unwrap_or_default(), STATUS_FAILURE).to_owned(),
        node_count: members.len() as u32,
        root_cause: job.root_cause().map(|f| pb::Failure {
            message: truncated(&f.message, 1024).to_owned(),
            traceback: String::new(),
            ..f.clone()
        }),
        stacks_unix_ms: None,
        timeline: Vec::new(),
        world_size: (job.participants().len() as u32).saturating_mul(c.nproc_per_node),
        step: job.steps().1,
        best_step: job.steps().0,
        no_progress_restarts: job.no_progress_restarts(),
        goodput: Some(job.goodput_message(now.at, now.unix_ms)),
        hang_timeout_ms: job.hang_timeout_ms(),
        stragglers: job.straggler_info().collect(),
    }
}

mod commit;
mod deadlines;
mod graves;
mod quarantine;
mod stacks;
mod tally;

#[cfg(test)]
mod tests;
