//! The agent's side of the rendezvous API: connecting with jittered backoff,
//! joining, and the unary calls, each with a deadline.

use std::time::Duration;

use accel_proto::v1 as pb;
use pb::rendezvous_client::RendezvousClient;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use tracing::{info, warn};

use crate::error::AgentError;

/// A joined node's handle on its job.
#[derive(Debug, Clone)]
pub struct RdzvClient {
    inner: RendezvousClient<Channel>,
    job_id: String,
    node_id: String,
    read_timeout: Duration,
}

/// `http://host:port`, bracketing IPv6 literals.
pub fn endpoint_uri(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// Backoff before retry `attempt` (0-based): 50 ms doubling to 2 s, ±50 % jitter.
pub fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(50)
        .saturating_mul(1 << attempt.min(6))
        .min(Duration::from_secs(2));
    base.mul_f64(0.5 + fastrand::f64())
}

impl RdzvClient {
    /// Connects to `host:port` and joins, retrying an unreachable endpoint with
    /// jittered backoff until `deadline`. A refusal by the server (a setting
    /// that disagrees with the job, a duplicate node rank) is not retried.
    pub async fn join(
        host: &str,
        port: u16,
        req: pb::JoinRequest,
        read_timeout: Duration,
        deadline: Instant,
    ) -> Result<(Self, Streaming<pb::Event>), AgentError> {
        let uri = endpoint_uri(host, port);
        let endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| {
                AgentError::Config(format!("rendezvous endpoint {host}:{port} is invalid: {e}"))
            })?
            .connect_timeout(read_timeout.min(Duration::from_secs(10)))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true);
        let started = Instant::now();
        let mut last_notice: Option<Instant> = None;
        for attempt in 0u32.. {
            let try_once = async {
                let channel = endpoint.connect().await.map_err(|e| source_chain(&e))?;
                let mut inner = RendezvousClient::new(channel);
                match inner.join(req.clone()).await {
                    Ok(stream) => Ok(Ok((inner, stream.into_inner()))),
                    // Only the server's own verdicts are final; transport trouble
                    // (a server going down, a reset connection) is retried.
                    Err(s) if !is_refusal(s.code()) => Err(s.message().to_owned()),
                    Err(s) => Ok(Err(s.message().to_owned())),
                }
            };
            // No attempt outlives the deadline (a cut link would hang a connect).
            let error = match tokio::time::timeout_at(deadline, try_once).await {
                Ok(Ok(Ok((inner, stream)))) => {
                    let client = Self {
                        inner,
                        job_id: req.job_id.clone(),
                        node_id: req.node_id.clone(),
                        read_timeout,
                    };
                    return Ok((client, stream));
                }
                Ok(Ok(Err(refusal))) => return Err(AgentError::Rejected(refusal)),
                Ok(Err(error)) => error,
                Err(_) => "no answer before the deadline".to_owned(),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(AgentError::JoinTimeout(format!(
                    "could not reach the rendezvous at {host}:{port} within {:.0} s ({error}); \
                     start rdzv-server there (or the node-rank-0 agent for static rendezvous), \
                     or fix --rdzv-endpoint / --master-addr",
                    now.duration_since(started).as_secs_f64()
                )));
            }
            if last_notice.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10)) {
                info!(endpoint = %format!("{host}:{port}"), %error, "waiting for the rendezvous to be reachable");
                last_notice = Some(now);
            }
            tokio::time::sleep(backoff(attempt).min(deadline.saturating_duration_since(now))).await;
        }
        unreachable!("the retry loop only ends by returning")
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.read_timeout);
        r
    }

    /// Ready for `round`, offering `master` as the workers' store endpoint.
    pub async fn ready(&mut self, round: u64, master: (String, u32)) -> Result<(), Status> {
        let req = pb::ReadyRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            round,
            master_addr: master.0,
            master_port: master.1,
        };
        let req = self.request(req);
        self.inner.ready(req).await.map(drop)
    }

    /// Proves this node is alive.
    pub async fn keep_alive(&mut self) -> Result<(), Status> {
        let req = self.request(pb::KeepAliveRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
        });
        self.inner.keep_alive(req).await.map(drop)
    }

    /// Reports a worker failure in `round`.
    pub async fn report_failure(
        &mut self,
        round: u64,
        local_rank: u32,
        global_rank: u32,
        exit_code: i32,
        reason: String,
        failure: Option<pb::Failure>,
    ) {
        let req = self.request(pb::ReportFailureRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            round,
            local_rank,
            global_rank,
            exit_code,
            reason,
            failure,
        });
        if let Err(s) = self.inner.report_failure(req).await {
            warn!(error = %s.message(), "could not report the failure to the rendezvous");
        }
    }

    /// Reports that every worker of this node succeeded in `round`.
    pub async fn report_success(&mut self, round: u64) {
        let req = self.request(pb::ReportSuccessRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            round,
        });
        if let Err(s) = self.inner.report_success(req).await {
            warn!(error = %s.message(), "could not report success to the rendezvous");
        }
    }

    /// Leaves the job.
    pub async fn leave(&mut self, reason: &str) {
        let mut req = self.request(pb::LeaveRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            reason: reason.to_owned(),
        });
        req.set_timeout(self.read_timeout.min(Duration::from_secs(2)));
        let _ = self.inner.leave(req).await;
    }
}

/// Whether a status is the rendezvous refusing this node (not worth retrying).
fn is_refusal(code: Code) -> bool {
    matches!(
        code,
        Code::FailedPrecondition
            | Code::InvalidArgument
            | Code::NotFound
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
