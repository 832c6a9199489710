//! The agent's side of the rendezvous API: connecting with jittered backoff,
//! joining, and the unary calls, each with a deadline.
//!
//! Every call carries the rendezvous token when the agent has one, and every
//! call for this node carries the session secret the server handed out in
//! `Joined` (the server refuses a call for a node without it, so nobody else
//! can fail, stop or keep alive this node).

use std::time::Duration;

use accel_proto::v1 as pb;
use pb::event::Kind;
use pb::rendezvous_client::RendezvousClient;
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tracing::info;

use accel_wire::auth::{AttachToken, ClientToken};
use accel_wire::limits::{truncated, MAX_FAILURE_BYTES, MAX_REASON_BYTES};
use accel_wire::tls::ClientTlsFiles;
use accel_wire::LEADER_METADATA;

use crate::EndpointError;

/// Why a join was not taken. The agent maps each to its own error (and exit
/// code): a refusal or a bad setting is final, a timeout is the rendezvous'.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// A bad endpoint or TLS file (the caller's configuration).
    #[error("{0}")]
    Config(String),
    /// The rendezvous refused this node. `code` is the server's gRPC status
    /// code, so callers can tell a refusal of the job's settings from one of
    /// credentials.
    #[error("the rendezvous refused this node: {message}")]
    Rejected {
        /// The server's status code.
        code: Code,
        /// The server's explanation.
        message: String,
    },
    /// TLS with the rendezvous failed: a certificate this side or the other
    /// refuses.
    #[error("the rendezvous refused this node: {0}")]
    Tls(String),
    /// No replica took the join in time.
    #[error("rendezvous timed out: {0}")]
    Timeout(String),
}

type Inner = RendezvousClient<InterceptedService<Channel, AttachToken>>;

/// What a join that was taken gives: the client, the node's event stream,
/// the probe's health watch (see [`RdzvClient::join`]), what joining said,
/// and which endpoint served.
pub type Taken = (
    RdzvClient,
    Streaming<pb::Event>,
    Option<Streaming<HealthCheckResponse>>,
    pb::Joined,
    usize,
);

/// A joined node's handle on its job.
#[derive(Clone)]
pub struct RdzvClient {
    inner: Inner,
    job_id: String,
    node_id: String,
    /// The secret from `Joined`; never logged.
    session: Vec<u8>,
    read_timeout: Duration,
    /// The replica that took the join, `(host, port)`.
    server: (String, u16),
    /// When the join that `Joined` answered was sent: the server's last
    /// sign of life of this node is no earlier.
    sent: Instant,
    /// The token every call carries, re-read when it is refused.
    token: ClientToken,
}

impl std::fmt::Debug for RdzvClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdzvClient")
            .field("job_id", &self.job_id)
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

/// Delays between attempts to reach the rendezvous: 25 ms doubling to `max`,
/// each plus up to as much again at random (so at most twice `max`), for
/// ever; the caller's deadline ends the retries.
pub(crate) fn retry_delays(max: Duration) -> impl Iterator<Item = Duration> + Send {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(25))
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The timings of a join.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Deadline of each call.
    pub read_timeout: Duration,
    /// How long a connection may go without an answer (HTTP/2 PINGs)
    /// before the server is taken for silent.
    pub silence: Duration,
    /// The longest wait (before jitter) between attempts at endpoints that
    /// do not answer: [`Pace::RETRY_MAX`] unless set (the agent's
    /// `cas_backoff_max_seconds`).
    pub retry_max: Duration,
}

impl Pace {
    /// The default longest wait between attempts.
    pub const RETRY_MAX: Duration = Duration::from_secs(1);
    /// The shortest it may be set to (attempts start 25 ms apart).
    pub const RETRY_MIN: Duration = Duration::from_millis(25);

    /// `read_timeout` and `silence`, with the default retry pace.
    pub fn new(read_timeout: Duration, silence: Duration) -> Self {
        Self {
            read_timeout,
            silence,
            retry_max: Self::RETRY_MAX,
        }
    }

    /// With `max` (at least [`Pace::RETRY_MIN`]) as the longest wait between attempts.
    pub fn retrying_at_most(self, max: Duration) -> Self {
        Self {
            retry_max: max.max(Self::RETRY_MIN),
            ..self
        }
    }
}

use crate::walk::{Step, Walk, LEADER_RETRY, PUBLISHED_CONNECT};

/// Which leaders a join follows when a replica names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaders {
    /// Only those among the endpoints (`rdzv-server` replicas given with
    /// `--rdzv-endpoint`): the token goes nowhere else.
    Listed,
    /// Whichever the first endpoint names: it is this agent's own replica,
    /// which reads the leader's address from etcd (agent-only rendezvous).
    /// A name from any other replica is not followed.
    Published,
}

impl RdzvClient {
    /// Joins through the first of `endpoints` that serves the job, retrying
    /// unreachable ones with jittered backoff until `deadline`, and waits for
    /// `Joined`. Several endpoints are replicas of one rendezvous: a follower
    /// names the leader, which is tried next if it is one of `endpoints`
    /// (the token goes nowhere else); otherwise the next endpoint is. A
    /// refusal by the server (a setting that disagrees with the job, a
    /// duplicate node rank, a missing token, a certificate the other side
    /// refuses) is not retried. `tls`: the link's TLS files (disabled: plain
    /// HTTP/2). `leaders`: which named leaders are followed. `silence`: how
    /// long a connection may go without an answer to an HTTP/2 PING before
    /// it is given up (a paused or cut-off server answers none, though its
    /// kernel keeps TCP up). `avoid`: a replica that went silent (see
    /// below). Returns which endpoint served (a followed
    /// [`Leaders::Published`] leader counts as the first), so a rejoin
    /// starts there.
    ///
    /// # The probe
    /// The node's stream and calls go over a connection without PINGs: a
    /// server takes the end of that connection for the node's death, so
    /// the node must be able to give up a silent server without ending it
    /// (`agent/link.rs`). Silence is watched on a second connection, the
    /// probe: PINGed every `silence / 2` and given up `silence / 2` after an
    /// unanswered one, it carries a health watch that ends then. A join
    /// whose probe ends before the join is taken is retried; once joined,
    /// the probe makes one keep-alive, so the server keeps the connection
    /// (it closes connections that make no admitted call, see
    /// `rendezvous_server::admission`).
    ///
    /// # A silent replica
    /// With `avoid`, the join is a node leaving a replica that stopped
    /// answering: it asks the other endpoints (or, [`Leaders::Published`],
    /// its own replica) who leads, every quarter second or so, and goes to
    /// any leader they name but the silent one; meanwhile, beside that, it
    /// keeps trying the silent one itself (it may come back, still leading,
    /// after a short pause). Whichever takes the join first wins. The
    /// request says which replica went silent (`silent_replica`), so a
    /// follower can depose a leader most of a job's nodes cannot reach.
    #[allow(clippy::too_many_arguments)]
    pub async fn join(
        endpoints: &[(String, u16)],
        leaders: Leaders,
        req: pb::JoinRequest,
        token: &ClientToken,
        tls: &ClientTlsFiles,
        pace: Pace,
        avoid: Option<&(String, u16)>,
        deadline: Instant,
    ) -> Result<Taken, JoinError> {
        let avoid = avoidable(leaders, endpoints, avoid);
        // Say why: a follower that still names the silent replica as the
        // leader counts this, and deposes a leader most of a job's nodes
        // cannot reach.
        let mut req = req;
        if let Some((host, port)) = avoid {
            req.silent_replica = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
        }
        let how = How {
            req: &req,
            token,
            tls,
            read_timeout: pace.read_timeout,
            silence: pace.silence,
            retry_max: pace.retry_max,
        };
        let walk = Self::walk(endpoints, leaders, how, avoid, deadline);
        let Some(silent) = avoid else {
            return walk.await;
        };
        let at = endpoints.iter().position(|e| e == silent).unwrap_or(0);
        tokio::select! {
            r = walk => r,
            r = Self::wait_for(silent, at, how, deadline) => r,
        }
    }

    /// Tries the replica that went silent, `silent` (endpoint `at`), until
    /// it takes the join or refuses it; never returns otherwise (the walk
    /// over the others ends the join at the deadline).
    async fn wait_for(
        silent: &(String, u16),
        at: usize,
        how: How<'_>,
        deadline: Instant,
    ) -> Result<Taken, JoinError> {
        let mut delays = retry_delays(LEADER_RETRY);
        let connect = how.read_timeout.min(PUBLISHED_CONNECT);
        // A paused server accepts the connection (its kernel does) and then
        // answers nothing: the PINGs give up after `silence`; this bounds
        // whatever else could hang.
        let bound = connect + how.silence * 2;
        loop {
            let (host, port) = silent;
            let tried = tokio::time::timeout_at(
                deadline.min(Instant::now() + bound),
                attempt(host, *port, how, connect),
            )
            .await;
            match tried {
                Ok(Attempt::Joined(joined)) => return Ok(how.joined(*joined, silent, at)),
                Ok(Attempt::Refused(code, message)) => {
                    return Err(JoinError::Rejected { code, message })
                }
                Ok(Attempt::Config(e)) => return Err(JoinError::Config(e)),
                Ok(Attempt::Retry(_)) | Err(_) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(JoinError::Timeout(format!(
                    "the rendezvous at {host}:{port} stopped answering and no other replica named another leader before the deadline"
                )));
            }
            let delay = delays.next().unwrap_or(LEADER_RETRY);
            tokio::time::sleep(delay.min(deadline.saturating_duration_since(now))).await;
        }
    }

    /// Walks the endpoints (see [`RdzvClient::join`]), never trying
    /// `avoid`: tries what the [`Walk`] says, tells it how each try failed,
    /// waits when it says to.
    async fn walk(
        endpoints: &[(String, u16)],
        leaders: Leaders,
        how: How<'_>,
        avoid: Option<&(String, u16)>,
        deadline: Instant,
    ) -> Result<Taken, JoinError> {
        let now = Instant::now().into_std();
        let walk = Walk::new(
            endpoints,
            leaders,
            avoid,
            how.read_timeout,
            how.retry_max,
            now,
            deadline.into_std(),
        )?;
        let Some(mut walk) = walk else {
            // Only the silent one: trying it is all there is to do.
            return std::future::pending().await;
        };
        let mut step = walk.next();
        loop {
            match step {
                Step::Try {
                    host,
                    port,
                    at,
                    connect,
                } => {
                    let server = (host.clone(), port);
                    // No attempt outlives the deadline (a cut link would
                    // hang a connect).
                    let tried =
                        tokio::time::timeout_at(deadline, attempt(&host, port, how, connect)).await;
                    let (error, leader) = match tried {
                        Ok(Attempt::Joined(joined)) => return Ok(how.joined(*joined, &server, at)),
                        Ok(Attempt::Refused(code, message)) => {
                            return Err(JoinError::Rejected { code, message })
                        }
                        Ok(Attempt::Config(e)) => return Err(JoinError::Config(e)),
                        Ok(Attempt::Retry(Retry {
                            error, tls: true, ..
                        })) if how.tls.enabled() => {
                            return Err(JoinError::Tls(format!(
                                "TLS with the rendezvous at {host}:{port} failed: {error}; check --rdzv-conf tls_ca \
                                 (the CA that signed the server's certificate, whose names must include '{host}') \
                                 and tls_cert/tls_key"
                            )))
                        }
                        Ok(Attempt::Retry(Retry { error, leader, .. })) => (error, leader),
                        Err(_) => ("no answer before the deadline".to_owned(), None),
                    };
                    step = walk.failed(Instant::now().into_std(), &error, leader.as_deref());
                    if let Some((endpoint, error)) = walk.take_notice() {
                        info!(%endpoint, %error, "waiting for the rendezvous to be reachable");
                    }
                }
                Step::Wait(delay) => {
                    tokio::time::sleep(delay).await;
                    step = walk.next();
                }
                Step::Fail(e) => return Err(e),
            }
        }
    }

    /// The session secret, for a `Join` that resumes this node.
    pub fn session(&self) -> &[u8] {
        &self.session
    }

    /// The job joined.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The replica that took the join, `(host, port)`.
    pub fn server(&self) -> &(String, u16) {
        &self.server
    }

    /// When the join was sent (the server's last sign of life of this node
    /// is no earlier).
    pub fn sent(&self) -> Instant {
        self.sent
    }

    /// Makes a call with deadline `timeout`, and once more if the server
    /// refused its token (`UNAUTHENTICATED`) and the token file now holds
    /// another: the token was rotated (see `accel_wire::accepted`), and a
    /// running job keeps its rendezvous.
    async fn call<T, R, F, Fut>(&self, msg: T, timeout: Duration, call: F) -> Result<R, Status>
    where
        T: Clone,
        F: Fn(Inner, tonic::Request<T>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let request = |msg| {
            let mut r = tonic::Request::new(msg);
            r.set_timeout(timeout);
            r
        };
        let generation = self.token.generation();
        match call(self.inner.clone(), request(msg.clone())).await {
            Err(s) if s.code() == Code::Unauthenticated && self.token.refused(generation) => {
                call(self.inner.clone(), request(msg)).await
            }
            r => r,
        }
        .map(tonic::Response::into_inner)
    }

    /// Ready for `round`, offering `master` as the workers' store endpoint.
    pub async fn ready(&mut self, round: u64, master: (String, u32)) -> Result<(), Status> {
        let req = pb::ReadyRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            round,
            master_addr: master.0,
            master_port: master.1,
            session: self.session.clone(),
        };
        self.call(req, self.read_timeout, |mut c, r| async move {
            c.ready(r).await
        })
        .await
        .map(drop)
    }

    /// Proves this node is alive, vouches for the nodes of its round that
    /// it hears through the round's peer hub, if any, and says how far its
    /// workers got (`progress`), if they report it.
    pub async fn keep_alive(
        &mut self,
        vouch: Option<Vouch>,
        progress: Option<pb::Progress>,
    ) -> Result<(), Status> {
        let vouch = vouch.unwrap_or_default();
        let req = pb::KeepAliveRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            session: self.session.clone(),
            round: vouch.round,
            vouch: vouch.ranks,
            vouch_all: vouch.all,
            progress,
        };
        self.call(req, self.read_timeout, |mut c, r| async move {
            c.keep_alive(r).await
        })
        .await
        .map(drop)
    }

    /// Reports a worker failure in `round`.
    pub async fn report_failure(&mut self, round: u64, f: WorkerFailure) -> Result<(), Status> {
        let (reason, failure) = fit_failure(f.reason, f.failure);
        let req = pb::ReportFailureRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            round,
            local_rank: f.local_rank,
            global_rank: f.global_rank,
            exit_code: f.exit_code,
            reason,
            failure,
            session: self.session.clone(),
            fenced: false,
            no_restart: f.no_restart,
            progress: f.progress,
        };
        self.report(req).await
    }

    /// Says that this node stopped its workers in `round` because it lost
    /// the rendezvous (fencing): the job re-forms without spending its
    /// restart budget (a server that predates this counts it as a failure).
    pub async fn report_fenced(&mut self, round: u64, reason: String) -> Result<(), Status> {
        let req = pb::ReportFailureRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            round,
            reason: truncated(&reason, MAX_REASON_BYTES).to_owned(),
            session: self.session.clone(),
            fenced: true,
            ..Default::default()
        };
        self.report(req).await
    }

    async fn report(&self, req: pb::ReportFailureRequest) -> Result<(), Status> {
        self.call(req, self.read_timeout, |mut c, r| async move {
            c.report_failure(r).await
        })
        .await
        .map(drop)
    }

    /// Reports that every worker of this node succeeded in `round`.
    pub async fn report_success(&mut self, round: u64) -> Result<(), Status> {
        let req = pb::ReportSuccessRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            round,
            session: self.session.clone(),
        };
        self.call(req, self.read_timeout, |mut c, r| async move {
            c.report_success(r).await
        })
        .await
        .map(drop)
    }

    /// Answers the server's `StacksRequested` numbered `request_id` with
    /// this node's workers' stacks.
    pub async fn report_stacks(
        &mut self,
        request_id: u64,
        workers: Vec<pb::WorkerStack>,
    ) -> Result<(), Status> {
        let req = pb::ReportStacksRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            session: self.session.clone(),
            request_id,
            workers,
        };
        self.call(req, self.read_timeout, |mut c, r| async move {
            c.report_stacks(r).await
        })
        .await
        .map(drop)
    }

    /// Asks the server for every worker's stacks in this node's job,
    /// grouped; the server waits at most `timeout` for the nodes.
    pub async fn job_stacks(&mut self, timeout: Duration) -> Result<pb::StacksResponse, Status> {
        let req = pb::StacksRequest {
            job_id: self.job_id.clone(),
            native: false,
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            // A member asking: the agents' token is enough.
            node_id: self.node_id.clone(),
            session: self.session.clone(),
        };
        self.call(
            req,
            timeout + Duration::from_secs(2),
            |mut c, r| async move { c.stacks(r).await },
        )
        .await
    }

    /// Leaves the job; `unhealthy`: because the node failed its health
    /// check (the server may quarantine its host).
    pub async fn leave(&mut self, reason: &str, unhealthy: bool) {
        let req = pb::LeaveRequest {
            job_id: self.job_id.clone(),
            node_id: self.node_id.clone(),
            reason: truncate_head(reason, 1024),
            session: self.session.clone(),
            unhealthy,
        };
        let timeout = self.read_timeout.min(Duration::from_secs(2));
        let _ = self
            .call(req, timeout, |mut c, r| async move { c.leave(r).await })
            .await;
    }
}

/// Why an attempt to join is worth another: what went wrong, and the leader
/// a follower named.
struct Retry {
    error: String,
    leader: Option<String>,
    /// The connection failed on a TLS verdict (a certificate one side
    /// does not accept): retrying will not change it.
    tls: bool,
}

impl Retry {
    fn of(s: &Status) -> Self {
        Self {
            error: s.message().to_owned(),
            leader: s
                .metadata()
                .get(LEADER_METADATA)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            tls: false,
        }
    }
}

/// How one attempt to join ended.
enum Attempt {
    /// Joined: the client, its event stream, what `Joined` said.
    Joined(Box<Joined>),
    /// The server refused this node: final.
    Refused(Code, String),
    /// The endpoint or its TLS settings are unusable: final.
    Config(String),
    /// Worth another attempt.
    Retry(Retry),
}

/// What every attempt of one join shares.
#[derive(Clone, Copy)]
struct How<'a> {
    req: &'a pb::JoinRequest,
    token: &'a ClientToken,
    tls: &'a ClientTlsFiles,
    read_timeout: Duration,
    /// How long a connection may go without an answer (HTTP/2 PINGs).
    silence: Duration,
    /// The longest wait (before jitter) between attempts at endpoints that
    /// do not answer.
    retry_max: Duration,
}

impl How<'_> {
    /// The client of a join `server` (endpoint `at`) took.
    fn joined(&self, j: Joined, server: &(String, u16), at: usize) -> Taken {
        let client = RdzvClient {
            inner: j.inner,
            job_id: self.req.job_id.clone(),
            node_id: self.req.node_id.clone(),
            session: j.joined.session.clone(),
            read_timeout: self.read_timeout,
            server: server.clone(),
            sent: j.sent,
            token: self.token.clone(),
        };
        (client, j.stream, j.probe, j.joined, at)
    }
}

/// A join that was taken.
struct Joined {
    inner: Inner,
    stream: Streaming<pb::Event>,
    probe: Option<Streaming<HealthCheckResponse>>,
    joined: pb::Joined,
    /// When the join was sent.
    sent: Instant,
}

/// Opens the probe at `endpoint` (PINGed): its connection and health watch.
/// Why it failed, and whether that was a TLS verdict
/// ([`is_tls_verdict`]): with TLS 1.3 a server that refuses this side's
/// certificate says so only after the handshake, on the first call.
async fn open_probe(
    endpoint: Endpoint,
) -> Result<(Channel, Streaming<HealthCheckResponse>), (String, bool)> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| (source_chain(&e), is_tls_verdict(&e)))?;
    let mut health = HealthClient::new(channel.clone());
    let watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|s| (source_chain(&s), is_tls_verdict(&s)))?;
    Ok((channel, watch.into_inner()))
}

/// Waits until a probe's watch ends (its PINGs went unanswered for
/// `silence`, or the server closed it): why, in words.
pub async fn probe_ended(watch: &mut Streaming<HealthCheckResponse>, silence: Duration) -> String {
    let why = loop {
        match watch.message().await {
            // A change of the server's health: its own streams say what it
            // means for this node.
            Ok(Some(_)) => continue,
            Ok(None) => break "the server ended the probe".to_owned(),
            Err(s) => break s.message().to_owned(),
        }
    };
    format!(
        "the rendezvous answered no HTTP/2 PING within {:.1} s ({why})",
        silence.as_secs_f64()
    )
}

/// The HTTP/2 PINGs of a connection that must go without an answer for no
/// longer than `silence`: one after `silence / 2` without a frame, given
/// up `silence / 2` later. A paused process cannot answer them although
/// its kernel keeps the TCP connection up; a one-way partition drops them
/// or their answers. Every call on the connection (the event stream
/// included) then fails at once.
pub fn pings(silence: Duration) -> (Duration, Duration) {
    let half = (silence / 2).max(Duration::from_millis(10));
    (half, half)
}

/// One attempt to join at `host:port`: joined, refused (final), or to retry.
async fn attempt(host: &str, port: u16, how: How<'_>, connect_timeout: Duration) -> Attempt {
    let How {
        req, token, tls, ..
    } = how;
    let endpoint = match crate::endpoint(host, port, tls) {
        Ok(e) => e,
        Err(EndpointError::Invalid(e)) => {
            return Attempt::Config(format!("rendezvous endpoint {host}:{port} is invalid: {e}"))
        }
        Err(EndpointError::TlsConfig(e)) => {
            return Attempt::Config(format!("TLS: {}", source_chain(&e)))
        }
        Err(e) => return Attempt::Config(e.to_string()),
    };
    let endpoint = endpoint.connect_timeout(connect_timeout).tcp_nodelay(true);
    // The node's connection has no PINGs; the probe's has (see `join`).
    let (interval, timeout) = pings(how.silence);
    let probe = endpoint
        .clone()
        .http2_keep_alive_interval(interval)
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(true);
    let (channel, probe) = tokio::join!(endpoint.connect(), open_probe(probe));
    let channel = match channel {
        Ok(c) => c,
        Err(e) => {
            return Attempt::Retry(Retry {
                error: source_chain(&e),
                leader: None,
                tls: is_tls_verdict(&e),
            })
        }
    };
    let (probe_channel, mut probe) = match probe {
        Ok(p) => p,
        Err((error, tls)) => {
            return Attempt::Retry(Retry {
                error: format!("the probe connection failed: {error}"),
                leader: None,
                tls,
            })
        }
    };
    let inner = RendezvousClient::with_interceptor(channel, token.attach())
        // node rank 0 hears every member's address in its RoundComplete.
        .max_decoding_message_size(64 << 20);
    let sent = Instant::now();
    let generation = token.generation();
    let joining = async {
        match inner.clone().join(req.clone()).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                match first_event(stream.message().await) {
                    First::Joined(joined) => Ok((stream, joined)),
                    First::Attempt(a) => Err(a),
                }
            }
            // Only the server's own verdicts are final; transport trouble (a
            // server going down, a reset connection, a follower) is retried.
            Err(s) if !is_refusal(s.code()) => Err(Attempt::Retry(Retry::of(&s))),
            Err(s) => Err(Attempt::Refused(s.code(), refusal(&s))),
        }
    };
    let taken = tokio::select! {
        taken = joining => taken,
        error = probe_ended(&mut probe, how.silence) => Err(Attempt::Retry(Retry {
            error,
            leader: None,
            tls: false,
        })),
    };
    let (stream, joined) = match taken {
        Ok(t) => t,
        // The token was rotated: the file now holds another, sent from
        // the next attempt on.
        Err(Attempt::Refused(Code::Unauthenticated, message)) if token.refused(generation) => {
            return Attempt::Retry(Retry {
                error: message,
                leader: None,
                tls: false,
            })
        }
        Err(a) => return a,
    };
    // Proves the probe's connection (one keep-alive, as the node); without
    // it the server would close the probe, and the node would take that
    // for silence and rejoin.
    let proof = pb::KeepAliveRequest {
        job_id: req.job_id.clone(),
        node_id: req.node_id.clone(),
        session: joined.session.clone(),
        ..Default::default()
    };
    let mut prover = RendezvousClient::with_interceptor(probe_channel, token.attach());
    let _ = tokio::time::timeout(how.silence, prover.keep_alive(proof)).await;
    Attempt::Joined(Box::new(Joined {
        inner,
        stream,
        probe: Some(probe),
        joined,
        sent,
    }))
}

/// What the first event of a join's stream means.
enum First {
    /// The join was taken.
    Joined(pb::Joined),
    /// It was not: retry, or give up.
    Attempt(Attempt),
}

/// Judges the first event of a join's stream. `Joined` takes the node. A
/// server going away may close the job before the join's `Joined` was
/// sent (a leader stepping down holds events until they are durable, and
/// then ends every stream with `JobClosed{may_rejoin}`), or end the stream
/// with no event at all: the join is made again, at the leader it names
/// or the next endpoint, as for any server going away. Anything else is a
/// refusal.
fn first_event(message: Result<Option<pb::Event>, Status>) -> First {
    match message {
        Ok(Some(pb::Event {
            kind: Some(Kind::Joined(joined)),
        })) => First::Joined(joined),
        Ok(Some(pb::Event {
            kind: Some(Kind::JobClosed(c)),
        })) if c.may_rejoin => First::Attempt(Attempt::Retry(Retry {
            error: format!(
                "the rendezvous closed the job before it took this join: {}",
                c.reason
            ),
            leader: None,
            tls: false,
        })),
        Ok(None) => First::Attempt(Attempt::Retry(Retry {
            error: "the rendezvous ended the join's stream before answering it".into(),
            leader: None,
            tls: false,
        })),
        Ok(Some(pb::Event {
            kind: Some(Kind::JobClosed(c)),
        })) => First::Attempt(Attempt::Refused(
            Code::FailedPrecondition,
            format!("the rendezvous closed the job: {}", c.reason),
        )),
        Ok(other) => First::Attempt(Attempt::Refused(
            Code::Internal,
            format!("unexpected first event from the rendezvous: {other:?}"),
        )),
        Err(s) if !is_refusal(s.code()) => First::Attempt(Attempt::Retry(Retry::of(&s))),
        Err(s) => First::Attempt(Attempt::Refused(s.code(), refusal(&s))),
    }
}

/// The replica a join leaves aside, of the silent one `avoid`: with
/// [`Leaders::Listed`], only if another endpoint is left to ask. With
/// [`Leaders::Published`], never this agent's own replica (the first
/// endpoint): it runs in this process, so it is not silent but stepped
/// down, and it is the one that names the new leader; avoiding it would
/// leave nobody to ask.
fn avoidable<'a>(
    leaders: Leaders,
    endpoints: &[(String, u16)],
    avoid: Option<&'a (String, u16)>,
) -> Option<&'a (String, u16)> {
    avoid.filter(|a| match leaders {
        Leaders::Listed => endpoints.len() > 1,
        Leaders::Published => endpoints.first() != Some(*a),
    })
}

/// `HOST:PORT` (or `[V6]:PORT`) as a host and port; `None` if it is not one.
pub(crate) fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

/// The longest prefix of `s` of at most `max` bytes, on a char boundary.
fn truncate_head(s: &str, max: usize) -> String {
    truncated(s, max).to_owned()
}

/// The longest suffix of `s` of at most `max` bytes, on a char boundary.
fn truncate_tail(s: &str, max: usize) -> String {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

/// Shortens a failure report to what the server accepts: the message keeps
/// its start, the traceback its end (where the error is), so a worker with a
/// very deep traceback still has its failure reported.
fn fit_failure(reason: String, failure: Option<pb::Failure>) -> (String, Option<pb::Failure>) {
    // Leave room for the fields' own bytes (host, file) and a margin.
    let budget = MAX_FAILURE_BYTES - 4096;
    let reason = truncate_head(&reason, 4096);
    let failure = failure.map(|mut f| {
        f.host = truncate_head(&f.host, 256);
        f.error_file = truncate_head(&f.error_file, 1024);
        let left = budget.saturating_sub(reason.len() + f.host.len() + f.error_file.len());
        f.message = truncate_head(&f.message, left / 4);
        f.traceback = truncate_tail(&f.traceback, left - f.message.len());
        f
    });
    (reason, failure)
}

/// What the agent says of a refusal: the server's words, and for a missing
/// or wrong token how an agent takes it.
fn refusal(s: &tonic::Status) -> String {
    match s.code() {
        Code::Unauthenticated => format!(
            "{}; give the agent --rdzv-conf token_file=PATH or ACCEL_RDZV_TOKEN (notebook_launcher: rdzv_conf={{\"token_file\": PATH}})",
            s.message()
        ),
        _ => s.message().to_owned(),
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
    accel_wire::error_chain(e)
}

/// Whether `e` (a failed connection or call) is a TLS verdict: a
/// `rustls` error among its sources, or an I/O error of kind
/// `InvalidData`, which is how the TLS stream reports rustls' errors (h2
/// keeps only the kind and the text of an error it passes on, as for a
/// server's `CertificateRequired` alert). Told by type and kind, not by
/// words; the caller asks only of a TLS link.
fn is_tls_verdict(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::InvalidData
                || io
                    .get_ref()
                    .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// The nodes of a round that a node vouches for in its keep-alives (see
/// `KeepAliveRequest.vouch`): node ranks as a bitmap, or all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vouch {
    /// The round they are nodes of.
    pub round: u64,
    /// Bit r of byte r / 8: node rank r.
    pub ranks: Vec<u8>,
    /// Every node of the round (`ranks` is then empty).
    pub all: bool,
}

/// A worker failure as a node reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerFailure {
    /// Its local rank.
    pub local_rank: u32,
    /// Its global rank.
    pub global_rank: u32,
    /// Its exit code (127: it could not start; 128 + N for signal N).
    pub exit_code: i32,
    /// Why, in words.
    pub reason: String,
    /// What its error file says, when it ran.
    pub failure: Option<pb::Failure>,
    /// `exit_code` is the one the agent was told means "do not restart"
    /// (`--no-restart-exit-code`): the job ends at once.
    pub no_restart: bool,
    /// How far the node's workers got in the round, if they report it.
    pub progress: Option<pb::Progress>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that wraps another, as hyper and tonic wrap the TLS stream's.
    #[derive(Debug)]
    struct Wrapped(Box<dyn std::error::Error + Send + Sync + 'static>);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("transport error")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn a_tls_verdict_is_told_by_type_and_kind_not_by_words() {
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        assert!(is_tls_verdict(&Wrapped(Box::new(alert.clone()))));
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
        assert!(is_tls_verdict(&Wrapped(Box::new(io))));
        // h2 passes on only the kind and the text.
        let text = std::io::Error::new(std::io::ErrorKind::InvalidData, "received fatal alert");
        assert!(is_tls_verdict(&Wrapped(Box::new(text))));
        // A refused connection is no verdict, whatever its words say.
        let refused = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "certificate handshake refused",
        );
        assert!(!is_tls_verdict(&Wrapped(Box::new(refused))));
    }

    #[test]
    fn an_agent_never_avoids_its_own_replica_nor_its_only_server() {
        let own = ("10.0.0.1".to_owned(), 29400);
        let other = ("10.0.0.2".to_owned(), 29400);
        // Agent-only: its own replica stepped down (it led); it names the
        // new leader, so it is asked, not avoided.
        let published = [own.clone()];
        assert_eq!(avoidable(Leaders::Published, &published, Some(&own)), None);
        // Another agent's replica that went silent is avoided.
        assert_eq!(
            avoidable(Leaders::Published, &published, Some(&other)),
            Some(&other)
        );
        // Listed replicas: avoided while another is left to ask.
        let both = [own.clone(), other.clone()];
        assert_eq!(avoidable(Leaders::Listed, &both, Some(&own)), Some(&own));
        assert_eq!(avoidable(Leaders::Listed, &published, Some(&own)), None);
    }

    #[test]
    fn a_published_leader_is_host_and_port() {
        assert_eq!(
            split_host_port("10.0.0.2:41000"),
            Some(("10.0.0.2".into(), 41000))
        );
        assert_eq!(split_host_port("[::1]:7"), Some(("::1".into(), 7)));
        assert_eq!(split_host_port("node-3:7"), Some(("node-3".into(), 7)));
        for bad in ["", "host", ":7", "host:port", "host:70000"] {
            assert_eq!(split_host_port(bad), None, "{bad}");
        }
    }

    #[test]
    fn failures_are_cut_to_what_the_server_accepts() {
        let f = pb::Failure {
            message: "m".repeat(100_000),
            traceback: format!("{}the end", "é".repeat(100_000)),
            ..Default::default()
        };
        let (reason, f) = fit_failure("r".repeat(10_000), Some(f));
        let f = f.expect("kept");
        let total = reason.len() + f.message.len() + f.traceback.len() + f.host.len();
        assert!(total <= MAX_FAILURE_BYTES, "{total}");
        assert!(
            f.traceback.ends_with("the end"),
            "the end of a traceback is kept"
        );
        assert!(f.message.starts_with('m'));
    }

    /// F6 of the chaos run: a join whose stream begins with the server
    /// closing the job for a rejoin (a leader stepping down before the
    /// join's `Joined` was durable) is made again, not taken for a refusal.
    #[test]
    fn a_join_closed_before_it_was_taken_is_retried_and_a_closed_job_refuses() {
        let event = |kind| Ok(Some(pb::Event { kind: Some(kind) }));
        let closed = |may_rejoin| {
            event(Kind::JobClosed(pb::JobClosed {
                reason: "this rdzv-server is no longer the leader".into(),
                may_rejoin,
            }))
        };
        assert!(matches!(
            first_event(closed(true)),
            First::Attempt(Attempt::Retry(r)) if r.error.contains("no longer the leader")
        ));
        assert!(matches!(
            first_event(Ok(None)),
            First::Attempt(Attempt::Retry(_))
        ));
        assert!(matches!(
            first_event(closed(false)),
            First::Attempt(Attempt::Refused(Code::FailedPrecondition, m)) if m.contains("closed the job")
        ));
        assert!(matches!(
            first_event(event(Kind::Joined(pb::Joined::default()))),
            First::Joined(_)
        ));
        assert!(matches!(
            first_event(Err(Status::unavailable("going away"))),
            First::Attempt(Attempt::Retry(_))
        ));
        assert!(matches!(
            first_event(Err(Status::failed_precondition(
                "job 'j' already succeeded"
            ))),
            First::Attempt(Attempt::Refused(Code::FailedPrecondition, _))
        ));
    }
}
