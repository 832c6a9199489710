//! The gRPC face of the rendezvous: thin handlers that lock the registry,
//! call the pure [`Job`] state machine and forward its events.
//!
//! Each node's `Join` stream is an unbounded channel; sending never blocks
//! while the registry lock is held. When a node's stream is dropped (its agent
//! exited, was killed, or lost its connection), a guard in the stream tells
//! the registry at once, so a dead agent is noticed by the transport, not by a
//! timeout.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use accel_proto::v1 as pb;
use pb::rendezvous_server::Rendezvous;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::error::Error;
use crate::job::{Job, JobConfig, Outbound};

type EventTx = mpsc::UnboundedSender<Result<pb::Event, Status>>;

#[derive(Debug, Default)]
struct Entry {
    job: Option<Job>,
    /// Each member's current stream, tagged with a number so that the end of
    /// a stream a reconnected node replaced is not taken for the node leaving.
    streams: HashMap<String, (u64, EventTx)>,
}

static NEXT_STREAM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Every job the server knows, keyed by `rdzv_id`.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<HashMap<String, Entry>>>,
    finished_ttl: Duration,
}

impl Registry {
    /// An empty registry that forgets a finished job `finished_ttl` after its
    /// last node left.
    pub fn new(finished_ttl: Duration) -> Self {
        Self {
            inner: Arc::default(),
            finished_ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A poisoned lock means a handler panicked mid-update; the state machine
        // methods do not panic, so keep serving with what is there.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on job `job_id` and delivers the events it returns.
    fn with_job<R>(
        &self,
        job_id: &str,
        f: impl FnOnce(&mut Job) -> (R, Vec<Outbound>),
    ) -> Option<R> {
        let mut jobs = self.lock();
        let entry = jobs.get_mut(job_id)?;
        let job = entry.job.as_mut()?;
        let (r, out) = f(job);
        let terminal = job.phase().is_terminal();
        deliver(entry, out);
        if terminal {
            // The job is over: end every stream so agents see the end and a
            // hosting agent can shut its embedded server down gracefully.
            entry.streams.clear();
        } else if let Some(job) = entry
            .job
            .as_ref()
            .filter(|j| entry.streams.len() > j.members().len())
        {
            // A node the job dropped (lost, left) loses its stream: if it is in
            // fact alive, it learns so when it reconnects. (Checked only when
            // membership shrank, to keep each call O(log n).)
            entry.streams.retain(|id, _| job.members().contains_key(id));
        }
        Some(r)
    }

    /// Periodic housekeeping: lost nodes, forgotten jobs.
    pub fn tick(&self, now: Instant) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        for id in ids {
            self.with_job(&id, |job| ((), job.tick(now)));
        }
        let ttl = self.finished_ttl;
        self.lock()
            .retain(|_, e| e.job.as_ref().is_some_and(|j| !j.expired(now, ttl)));
    }

    /// Ends every job's streams (server shutdown).
    pub fn close_all(&self, reason: &str, may_rejoin: bool) {
        let mut jobs = self.lock();
        for entry in jobs.values_mut() {
            if let Some(job) = entry.job.as_mut() {
                let out = job.close(reason, may_rejoin);
                deliver(entry, out);
            }
            entry.streams.clear();
        }
    }

    /// A node leaves: its stream goes first (so the job's own bookkeeping
    /// stays O(log n)), then the job learns. With `stream`, only if that
    /// stream is still the node's current one (a reconnected node replaced it).
    fn depart(&self, job_id: &str, node_id: &str, reason: &str, stream: Option<u64>) {
        let now = Instant::now();
        let mut jobs = self.lock();
        let Some(entry) = jobs.get_mut(job_id) else {
            return;
        };
        match (stream, entry.streams.get(node_id)) {
            (Some(s), Some((current, _))) if *current != s => return,
            (Some(_), None) => return, // already dropped by the job
            _ => {}
        }
        entry.streams.remove(node_id);
        let Some(job) = entry.job.as_mut() else {
            return;
        };
        if stream.is_some() && job.members().contains_key(node_id) && !job.phase().is_terminal() {
            warn!(job = job_id, node = node_id, "node's stream ended");
        }
        let out = job.leave(now, node_id, reason);
        deliver(entry, out);
    }
}

fn deliver(entry: &mut Entry, out: Vec<Outbound>) {
    for o in out {
        if let Some((_, tx)) = entry.streams.get(&o.to) {
            // A closed receiver is a node on its way out; its guard reports it.
            let _ = tx.send(Ok(pb::Event {
                kind: Some(o.event),
            }));
        }
    }
}

/// The event stream of one node; tells the registry when it is dropped.
#[derive(Debug)]
pub struct NodeStream {
    rx: mpsc::UnboundedReceiver<Result<pb::Event, Status>>,
    registry: Registry,
    job_id: String,
    node_id: String,
    stream: u64,
}

impl Stream for NodeStream {
    type Item = Result<pb::Event, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for NodeStream {
    fn drop(&mut self) {
        let why = "its connection to the rendezvous ended";
        self.registry
            .depart(&self.job_id, &self.node_id, why, Some(self.stream));
    }
}

/// The `accel.rendezvous.v1.Rendezvous` service.
#[derive(Debug, Clone)]
pub struct RendezvousService {
    registry: Registry,
}

impl RendezvousService {
    /// A service over `registry`.
    pub fn new(registry: Registry) -> Self {
        Self { registry }
    }

    fn on_job<R>(
        &self,
        job_id: &str,
        f: impl FnOnce(&mut Job) -> (R, Vec<Outbound>),
    ) -> Result<R, Error> {
        self.registry
            .with_job(job_id, f)
            .ok_or_else(|| Error::UnknownJob(job_id.to_owned()))
    }
}

fn required(field: &'static str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::InvalidArgument(format!("{field} must not be empty")));
    }
    // Ids are printed in logs and status; the job also reserves a
    // NUL-prefixed form for the placeholders of a relearned job.
    if value.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!(
            "{field} {value:?} contains control characters; use printable ones"
        )));
    }
    Ok(())
}

/// Most nodes a job may have (MAX of `--nnodes`): the default of the
/// per-job limit of issue 12. A relearned job allocates one placeholder per
/// node of the round it resumes, so MAX must be bounded before that.
pub const MAX_NODES_PER_JOB: u32 = 100_000;

/// The highest round a resume may name: far beyond any job's life (a round
/// takes at least the workers' start), and far from `u64::MAX`, so the
/// relearned job's next round is always a larger number.
pub const MAX_RESUME_ROUND: u64 = u32::MAX as u64;

/// The checks a join request passes before it reaches a [`Job`] (public for
/// the fuzz targets, which drive a `Job` as this service does).
#[doc(hidden)]
pub fn validate_join(req: &pb::JoinRequest) -> Result<(), Error> {
    required("job_id", &req.job_id)?;
    required("node_id", &req.node_id)?;
    if req.min_nodes == 0 || req.min_nodes > req.max_nodes {
        return Err(Error::InvalidArgument(format!(
            "nnodes {}:{} is invalid; need 0 < MIN <= MAX",
            req.min_nodes, req.max_nodes
        )));
    }
    if req.max_nodes > MAX_NODES_PER_JOB {
        return Err(Error::InvalidArgument(format!(
            "nnodes {}:{} is more nodes than this server takes in one job ({MAX_NODES_PER_JOB})",
            req.min_nodes, req.max_nodes
        )));
    }
    if req.nproc_per_node == 0 {
        return Err(Error::InvalidArgument(
            "nproc_per_node must be at least 1".into(),
        ));
    }
    // Every rank of the largest round must be a rank PyTorch can hold (int32).
    let world = u64::from(req.max_nodes) * u64::from(req.nproc_per_node);
    if world > i32::MAX as u64 {
        return Err(Error::InvalidArgument(format!(
            "nnodes {} x nproc_per_node {} is a world of {world} ranks, more than PyTorch's {}",
            req.max_nodes,
            req.nproc_per_node,
            i32::MAX
        )));
    }
    // A resume may make a restarted server relearn the job from it: it must
    // describe a round this job could have run.
    if let Some(r) = &req.resume {
        let fits = (req.min_nodes..=req.max_nodes).contains(&r.nnodes)
            && r.node_rank < r.nnodes
            && r.restart_count <= req.max_restarts;
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "resume names node rank {} of {} nodes after {} restarts, impossible for nnodes {}:{} and max_restarts {}",
                r.node_rank, r.nnodes, r.restart_count, req.min_nodes, req.max_nodes, req.max_restarts
            )));
        }
        if r.round > MAX_RESUME_ROUND {
            return Err(Error::InvalidArgument(format!(
                "resume names round {}, beyond any round a job reaches ({MAX_RESUME_ROUND})",
                r.round
            )));
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl Rendezvous for RendezvousService {
    type JoinStream = NodeStream;

    async fn join(
        &self,
        request: Request<pb::JoinRequest>,
    ) -> Result<Response<NodeStream>, Status> {
        let req = request.into_inner();
        validate_join(&req)?;
        let now = Instant::now();
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = NEXT_STREAM.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        {
            let mut jobs = self.registry.lock();
            let entry = jobs.entry(req.job_id.clone()).or_default();
            let job = entry.job.get_or_insert_with(|| match &req.resume {
                // This server does not know the job (it restarted): relearn it.
                Some(resume) => {
                    info!(job = %req.job_id, round = resume.round, "relearning a running job from a reconnecting node");
                    Job::relearn(now, req.job_id.clone(), &req, resume)
                }
                None => Job::new(req.job_id.clone(), JobConfig::from_join(&req)),
            });
            let out = match job.join(now, &req.node_id, &req) {
                Ok(out) => out,
                Err(e) => {
                    if job.members().is_empty() {
                        jobs.remove(&req.job_id);
                    }
                    return Err(Error::from(e).into());
                }
            };
            info!(job = %req.job_id, node = %req.node_id, host = %req.hostname, resume = req.resume.is_some(), "node joined");
            entry.streams.insert(req.node_id.clone(), (stream, tx));
            deliver(entry, out);
        }
        Ok(Response::new(NodeStream {
            rx,
            registry: self.registry.clone(),
            job_id: req.job_id,
            node_id: req.node_id,
            stream,
        }))
    }

    async fn ready(&self, request: Request<pb::ReadyRequest>) -> Result<Response<pb::Ack>, Status> {
        let r = request.into_inner();
        let now = Instant::now();
        self.on_job(&r.job_id, |job| {
            (
                (),
                job.ready(
                    now,
                    &r.node_id,
                    r.round,
                    (r.master_addr.clone(), r.master_port),
                ),
            )
        })?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = request.into_inner();
        let now = Instant::now();
        let known = self.on_job(&r.job_id, |job| {
            (job.keep_alive(now, &r.node_id), Vec::new())
        })?;
        if !known {
            return Err(Error::UnknownNode(r.job_id, r.node_id).into());
        }
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_failure(
        &self,
        request: Request<pb::ReportFailureRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = request.into_inner();
        let now = Instant::now();
        let host = self
            .on_job(&r.job_id, |job| {
                (
                    job.members().get(&r.node_id).map(|m| m.hostname.clone()),
                    Vec::new(),
                )
            })?
            .unwrap_or_else(|| r.node_id.clone());
        let reason = format!(
            "worker rank {} (local rank {}) on host '{}' {}",
            r.global_rank, r.local_rank, host, r.reason
        );
        warn!(job = %r.job_id, round = r.round, %reason, "worker failure reported");
        self.on_job(&r.job_id, |job| {
            (
                (),
                job.failure(now, &r.node_id, r.round, reason, r.failure.clone()),
            )
        })?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_success(
        &self,
        request: Request<pb::ReportSuccessRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        let r = request.into_inner();
        let now = Instant::now();
        self.on_job(&r.job_id, |job| ((), job.success(now, &r.node_id, r.round)))?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn leave(&self, request: Request<pb::LeaveRequest>) -> Result<Response<pb::Ack>, Status> {
        let r = request.into_inner();
        info!(job = %r.job_id, node = %r.node_id, reason = %r.reason, "node left");
        self.registry.depart(&r.job_id, &r.node_id, &r.reason, None);
        Ok(Response::new(pb::Ack {}))
    }

    async fn job_status(
        &self,
        request: Request<pb::JobStatusRequest>,
    ) -> Result<Response<pb::JobStatusResponse>, Status> {
        let want = request.into_inner().job_id;
        let jobs = self.registry.lock();
        let mut out: Vec<pb::JobInfo> = jobs
            .values()
            .filter_map(|e| e.job.as_ref())
            .filter(|j| want.is_empty() || j.id() == want)
            .map(job_info)
            .collect();
        out.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        if !want.is_empty() && out.is_empty() {
            return Err(Error::UnknownJob(want).into());
        }
        Ok(Response::new(pb::JobStatusResponse { jobs: out }))
    }
}

fn node_state(job: &Job, m: &crate::job::Member) -> &'static str {
    use crate::job::Phase;
    match (job.phase(), m.rank, m.ready.is_some()) {
        (Phase::Running, Some(_), _) if m.succeeded => "succeeded",
        (Phase::Running, Some(_), _) => "running",
        (Phase::Running, None, _) => "spare",
        (Phase::Forming, _, true) => "ready",
        (Phase::Forming, _, false) => "joining",
        _ => "done",
    }
}

fn job_info(job: &Job) -> pb::JobInfo {
    let c = job.config();
    pb::JobInfo {
        job_id: job.id().to_owned(),
        phase: job.phase().name().to_owned(),
        round: job.round(),
        restart_count: job.restart_count(),
        max_restarts: c.max_restarts,
        min_nodes: c.min_nodes,
        max_nodes: c.max_nodes,
        nodes: job
            .members()
            .iter()
            .map(|(id, m)| pb::NodeStatus {
                node_id: id.clone(),
                hostname: m.hostname.clone(),
                node_rank: m.rank,
                state: node_state(job, m).to_owned(),
            })
            .collect(),
        last_failure: job.last_failure().unwrap_or_default().to_owned(),
    }
}

#[cfg(test)]
mod tests;
