//! The gRPC face of the rendezvous: thin handlers that check the request's
//! bounds and the caller's session secret, then call one method of the
//! [`Job`] state machine through the [`Registry`].
//!
//! The token is checked before any handler runs ([`crate::auth`]); every
//! handler here first requires its scope (an agent's call, a read, an
//! operator's act), then checks sizes and ranges ([`crate::limits`]) and, for a
//! call that acts for a node, that it carries that node's session secret.
//! Text that will be stored and printed (failure reasons, tracebacks) is
//! escaped here, once.
//!
//! When a node's stream is dropped (its agent exited, was killed, or lost its
//! connection), the stream tells the registry at once, so a dead agent is
//! noticed by the transport, not by a timeout.

use std::net::IpAddr;
use std::time::Instant;

use accel_proto::v1 as pb;
use pb::rendezvous_server::Rendezvous;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};

use crate::auth::new_session;
use crate::error::Error;
use crate::ha::{Complaint, Role};
use crate::job::Job;
use crate::limits::{self, printable_failure};
use crate::registry::{NodeStream, Registry};
use accel_wire::limits::printable;

/// The `accel.rendezvous.v1.Rendezvous` service.
#[derive(Debug, Clone)]
pub struct RendezvousService {
    /// What this server is now: the leader with its registry, or a follower
    /// that sends callers to the leader.
    seat: watch::Receiver<Role>,
    /// Where a follower sends the complaints of nodes that left a silent
    /// leader ([`crate::depose`]).
    complaints: Option<mpsc::Sender<Complaint>>,
    /// torchft's lighthouse, when served: `JobStatus` reports it too.
    lighthouse: Option<crate::lighthouse::service::Shared>,
}

impl RendezvousService {
    /// A service over `registry`, for good.
    pub fn new(registry: Registry) -> Self {
        Self::seated(watch::channel(Role::Leader(Box::new(registry))).1)
    }

    /// A service for a replica whose role changes ([`crate::ha`]).
    pub fn seated(seat: watch::Receiver<Role>) -> Self {
        Self {
            seat,
            complaints: None,
            lighthouse: None,
        }
    }

    /// Hands the complaints of joins that say their replica went silent to
    /// `complaints`, while this replica follows.
    pub fn hearing(mut self, complaints: mpsc::Sender<Complaint>) -> Self {
        self.complaints = Some(complaints);
        self
    }

    /// Reports `lighthouse` in `JobStatus` answers.
    pub fn reporting(mut self, lighthouse: crate::lighthouse::service::Shared) -> Self {
        self.lighthouse = Some(lighthouse);
        self
    }

    /// A join this follower refuses: if it says the node left a silent
    /// replica, its complaint is counted (bounded first; dropped when the
    /// queue is full, as the node repeats it within half a second).
    fn complain(&self, req: &pb::JoinRequest) {
        let Some(complaints) = &self.complaints else {
            return;
        };
        if req.silent_replica.is_empty()
            || limits::check_name("job_id", &req.job_id).is_err()
            || limits::check_name("node_id", &req.node_id).is_err()
            || limits::check_silent_replica(&req.silent_replica).is_err()
            || req.session.len() != crate::job::SESSION_BYTES
        {
            return;
        }
        let _ = complaints.try_send(Complaint {
            job: req.job_id.clone(),
            node: req.node_id.clone(),
            session: req.session.clone(),
            silent: req.silent_replica.clone(),
            at: Instant::now(),
        });
    }

    /// The registry to serve a call with; a follower's status otherwise.
    fn registry(&self) -> Result<Registry, Status> {
        self.seat.borrow().registry().cloned()
    }

    /// Runs `f` for the node a request names, once its secret is checked.
    fn for_node<R>(
        &self,
        job_id: &str,
        node_id: &str,
        session: &[u8],
        f: impl FnOnce(&mut Job, Instant) -> (R, Vec<crate::job::Outbound>),
    ) -> Result<R, Error> {
        let registry = self.registry().map_err(Error::Redirect)?;
        let now = registry.instant();
        registry.for_node(now, job_id, node_id, session, |job| f(job, now))
    }
}

/// The caller's IP address, IPv4-mapped IPv6 shown as IPv4.
fn peer<T>(request: &Request<T>) -> Option<IpAddr> {
    crate::admission::ConnInfo::of(request)
        .and_then(|c| c.remote())
        .map(|a| a.ip().to_canonical())
}

/// A call for a node that is not (or no longer) a member changes nothing;
/// only a wrong secret is an error.
fn ignore_non_member(r: Result<(), Error>) -> Result<(), Error> {
    match r {
        Err(Error::UnknownNode(..)) => Ok(()),
        other => other,
    }
}

#[tonic::async_trait]
impl Rendezvous for RendezvousService {
    type JoinStream = NodeStream;

    async fn join(
        &self,
        request: Request<pb::JoinRequest>,
    ) -> Result<Response<NodeStream>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Join)?;
        let from = peer(&request);
        let req = request.into_inner();
        let registry = match self.registry() {
            Ok(r) => r,
            Err(follower) => {
                self.complain(&req);
                return Err(follower);
            }
        };
        limits::check_join(&req, registry.limits())?;
        crate::version::check_agent(&req.agent_version).map_err(Error::Incompatible)?;
        let stream = registry.join(registry.instant(), &req, from, new_session()?)?;
        Ok(Response::new(stream))
    }

    async fn ready(&self, request: Request<pb::ReadyRequest>) -> Result<Response<pb::Ack>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Join)?;
        let from = peer(&request);
        let r = request.into_inner();
        limits::check_ready(&r)?;
        let master = (r.master_addr.clone(), r.master_port);
        ignore_non_member(
            self.for_node(&r.job_id, &r.node_id, &r.session, |job, now| {
                ((), job.ready(now, &r.node_id, r.round, master, from))
            }),
        )?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Join)?;
        let r = request.into_inner();
        limits::check_vouch(&r)?;
        let vouches = r.vouch_all || r.vouch.iter().any(|b| *b != 0);
        let registry = self.registry()?;
        registry.keep_alive_vouching(
            registry.instant(),
            &r.job_id,
            &r.node_id,
            &r.session,
            (vouches || r.progress.is_some()).then_some(&r),
        )?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_failure(
        &self,
        request: Request<pb::ReportFailureRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Join)?;
        let r = request.into_inner();
        limits::check_failure(&r)?;
        if r.fenced {
            // Its reason goes to every member, as a leave's does.
            limits::check_reason(&r.reason)?;
            // Not a failure: the node stopped its workers for want of a
            // rendezvous; the job re-forms without spending the budget.
            ignore_non_member(
                self.for_node(&r.job_id, &r.node_id, &r.session, |job, now| {
                    (
                        (),
                        job.fenced(now, &r.node_id, r.round, &printable(&r.reason)),
                    )
                }),
            )?;
            return Ok(Response::new(pb::Ack {}));
        }
        let detail = r.failure.as_ref().map(printable_failure);
        let mut counted = false;
        ignore_non_member(
            self.for_node(&r.job_id, &r.node_id, &r.session, |job, now| {
                let host = job
                    .members()
                    .get(&r.node_id)
                    .map(|m| m.hostname.clone())
                    .unwrap_or_default();
                let reason = format!(
                    "worker rank {} (local rank {}) on host '{}' {}",
                    r.global_rank,
                    r.local_rank,
                    host,
                    printable(&r.reason)
                );
                // A report that re-forms the round (a straggler's host
                // quarantined) makes the failure one of an earlier round.
                let mut out = match &r.progress {
                    Some(p) => job.report_progress(now, &r.node_id, p),
                    None => Vec::new(),
                };
                let failed = match r.no_restart {
                    true => {
                        job.fatal_failure(now, &r.node_id, r.round, reason, detail, r.exit_code)
                    }
                    false => job.failure(now, &r.node_id, r.round, reason, detail),
                };
                counted = !failed.is_empty();
                out.extend(failed);
                ((), out)
            }),
        )?;
        if counted {
            if let Ok(registry) = self.registry() {
                // The request's code is 128 + N for a signal, which an exit
                // code can equal; the failure detail's is torchrun's (minus
                // the signal number).
                registry
                    .metrics()
                    .failure(r.failure.as_ref().map_or(r.exit_code, |f| f.exitcode));
            }
        }
        Ok(Response::new(pb::Ack {}))
    }

    async fn report_success(
        &self,
        request: Request<pb::ReportSuccessRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Join)?;
        let r = request.into_inner();
        ignore_non_member(
            self.for_node(&r.job_id, &r.node_id, &r.session, |job, now| {
                ((), job.success(now, &r.node_id, r.round))
            }),
        )?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn leave(&self, request: Request<pb::LeaveRequest>) -> Result<Response<pb::Ack>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Join)?;
        let r = request.into_inner();
        limits::check_name("job_id", &r.job_id)?;
        limits::check_name("node_id", &r.node_id)?;
        limits::check_reason(&r.reason)?;
        // Only the node itself may take itself out of the job; the secret is
        // checked under the same lock as the departure.
        let registry = self.registry()?;
        registry.leave(
            registry.instant(),
            &r.job_id,
            &r.node_id,
            &r.session,
            &printable(&r.reason),
            r.unhealthy,
        )?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn job_status(
        &self,
        request: Request<pb::JobStatusRequest>,
    ) -> Result<Response<pb::JobStatusResponse>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Read)?;
        let r = request.into_inner();
        if r.job_id.len() > limits::MAX_NAME_BYTES || r.page_token.len() > limits::MAX_NAME_BYTES {
            return Err(Error::InvalidArgument(format!(
                "job_id and page_token are at most {} bytes",
                limits::MAX_NAME_BYTES
            ))
            .into());
        }
        let mut answer = self
            .registry()?
            .status(&r.job_id, r.page_size, &r.page_token)?;
        if let (Some(l), true) = (&self.lighthouse, r.page_token.is_empty()) {
            let now = std::time::Instant::now();
            answer.lighthouse =
                Some(l.read(|l| crate::lighthouse::report::Report::of(l, now).to_pb()));
        }
        Ok(Response::new(answer))
    }

    async fn quarantine(
        &self,
        request: Request<pb::QuarantineRequest>,
    ) -> Result<Response<pb::QuarantineResponse>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Read)?;
        if !request.get_ref().release.is_empty() {
            crate::auth::require(&request, crate::auth::Scope::Operate)?;
        }
        let r = request.into_inner();
        // Checked as names: they are logged.
        if !r.job_id.is_empty() {
            limits::check_name("job_id", &r.job_id)?;
        }
        if !r.release.is_empty() {
            limits::check_name("release", &r.release)?;
        }
        let registry = self.registry()?;
        Ok(Response::new(registry.quarantine(
            registry.instant(),
            &r.job_id,
            &r.release,
        )?))
    }

    async fn stacks(
        &self,
        request: Request<pb::StacksRequest>,
    ) -> Result<Response<pb::StacksResponse>, Status> {
        if let Err(denied) = crate::auth::require(&request, crate::auth::Scope::Operate) {
            // A member of the job asking for its own job's stacks (hang
            // detection), proven by its session secret: the agents' token
            // is enough for that.
            let r = request.get_ref();
            if r.node_id.is_empty()
                || crate::auth::require(&request, crate::auth::Scope::Join).is_err()
            {
                return Err(denied);
            }
            limits::check_name("job_id", &r.job_id)?;
            limits::check_name("node_id", &r.node_id)?;
            self.registry()?
                .member(&r.job_id, &r.node_id, &r.session)
                .map_err(|_| denied)?;
        }
        let r = request.into_inner();
        limits::check_name("job_id", &r.job_id)?;
        let timeout = crate::stacks::timeout_of(r.timeout_ms);
        let mut done = self.registry()?.stacks(&r.job_id, r.native, timeout)?;
        let answer = done
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Status::unavailable("the stack collection was abandoned; retry"))?
            .clone()
            .ok_or_else(|| Status::internal("the stack collection ended without an answer"))?;
        Ok(Response::new((*answer).clone()))
    }

    async fn report_stacks(
        &self,
        request: Request<pb::ReportStacksRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        crate::auth::require(&request, crate::auth::Scope::Join)?;
        let r = request.into_inner();
        limits::check_stacks(&r)?;
        // The registry escapes the stacks (they are stored and printed)
        // once the caller is known to be the node.
        ignore_non_member(self.registry()?.report_stacks(
            &r.job_id,
            &r.node_id,
            &r.session,
            r.request_id,
            r.workers,
        ))?;
        Ok(Response::new(pb::Ack {}))
    }
}

#[cfg(test)]
mod tests;
