//! The node's link to its job, as the driver uses it: the calls it makes,
//! what it hears, and joining again as the same node.
//!
//! [`Link`] is a seam, not an abstraction over transports: the agent has
//! one link, [`RdzvLink`] (the gRPC client, its event stream and its
//! keep-alive task), and the driver's unit tests have a fake that records
//! the calls and says what a test tells it to. Everything the driver does
//! with the rendezvous goes through these methods, so the tests see every
//! call the real agent would make.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use accel_proto::v1 as pb;
use rendezvous_server::tls::ClientTlsFiles;
use rendezvous_server::Token;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use crate::client::{Leaders, RdzvClient};
use crate::config::Config;
use crate::error::AgentError;

/// What the link heard.
#[derive(Debug)]
pub(crate) enum Heard {
    /// A message from the job.
    Message(pb::event::Kind),
    /// A message without content (nothing to act on).
    Nothing,
    /// The session ended or broke: why.
    Lost(String),
    /// Keep-alives went unanswered for the drop limit: why, and when one
    /// was last answered.
    Silent {
        /// Why, in words.
        why: String,
        /// The last answered keep-alive.
        since: Instant,
    },
}

/// A joined node's connection to its job.
pub(crate) trait Link: Send + Sized + 'static {
    /// Ready for `round`, offering `store` (host, port) for the workers'
    /// store if this node becomes node rank 0.
    fn ready(
        &mut self,
        round: u64,
        store: (String, u32),
    ) -> impl Future<Output = Result<(), Status>> + Send;

    /// Reports a worker's failure in `round` (best effort).
    fn report_failure(&mut self, round: u64, failed: Failed) -> impl Future<Output = ()> + Send;

    /// Says that this node stopped its workers in `round` for want of a
    /// rendezvous (fencing), not because one failed (best effort).
    fn report_fenced(&mut self, round: u64, reason: String) -> impl Future<Output = ()> + Send;

    /// Reports that every worker of this node succeeded in `round` (best
    /// effort).
    fn report_success(&mut self, round: u64) -> impl Future<Output = ()> + Send;

    /// Leaves the job (best effort).
    fn leave(&mut self, reason: &str) -> impl Future<Output = ()> + Send;

    /// What the job says next. Cancel-safe: the driver waits for it beside
    /// other things.
    fn next(&mut self) -> impl Future<Output = Heard> + Send;

    /// Joins again as the same node, until the reconnect grace ends;
    /// `resume`: the round this node's workers run. The new link, and what
    /// joining said.
    fn rejoin(
        &self,
        resume: Option<pb::Resume>,
    ) -> impl Future<Output = Result<(Self, pb::Joined), AgentError>> + Send + 'static;
}

/// A worker failure as reported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failed {
    /// Its local rank.
    pub local_rank: u32,
    /// Its global rank.
    pub global_rank: u32,
    /// Its exit code (127: it could not start).
    pub exit_code: i32,
    /// Why, in words.
    pub reason: String,
    /// What its error file says, when it ran.
    pub failure: Option<pb::Failure>,
}

/// How to reach the rendezvous again: what a rejoin needs, shared by every
/// link of one session.
#[derive(Debug)]
pub(crate) struct Reach {
    /// Every replica of the rendezvous, `(host, port)`.
    pub endpoints: Vec<(String, u16)>,
    /// Which leaders a rejoin follows.
    pub leaders: Leaders,
    /// This node's join request, reused to rejoin.
    pub join_req: pb::JoinRequest,
    token: Option<Token>,
    tls: ClientTlsFiles,
    read_timeout: Duration,
    reconnect_grace: Duration,
    keep_alive_interval: Duration,
    keep_alive_max_attempt: u32,
    /// Agent-only rendezvous: this node's presence key, which must be in
    /// etcd before it joins (the leader drops a member without one).
    presence: Option<rendezvous_server::presence::Held>,
}

impl Reach {
    /// Reaching the rendezvous at `endpoints` as `cfg` says, joining with
    /// `join_req`.
    pub(crate) fn new(
        cfg: &Config,
        endpoints: Vec<(String, u16)>,
        leaders: Leaders,
        join_req: pb::JoinRequest,
    ) -> Self {
        Self {
            endpoints,
            leaders,
            join_req,
            token: cfg.token.clone(),
            tls: cfg.link_tls(),
            read_timeout: cfg.rdzv.read_timeout,
            reconnect_grace: cfg.reconnect_grace(),
            keep_alive_interval: cfg.rdzv.keep_alive_interval,
            keep_alive_max_attempt: cfg.rdzv.keep_alive_max_attempt,
            presence: None,
        }
    }

    /// The same, joining only while this node's presence key is in etcd.
    pub(crate) fn with_presence(mut self, held: Option<rendezvous_server::presence::Held>) -> Self {
        self.presence = held;
        self
    }

    /// Joins (the first time, or again), within `deadline`, starting at
    /// endpoint `first`.
    pub(crate) async fn join(
        self: &Arc<Self>,
        req: pb::JoinRequest,
        first: usize,
        deadline: Instant,
    ) -> Result<(RdzvLink, pb::Joined), AgentError> {
        if let Some(held) = &self.presence {
            if !held.wait(deadline).await {
                return Err(AgentError::JoinTimeout(
                    "this node's presence key could not be written to etcd in time (the rendezvous drops a node without one); is etcd reachable from this node?".into(),
                ));
            }
        }
        // The replica that served last first, then the others.
        let mut order = self.endpoints.clone();
        let first = first.min(order.len());
        order.rotate_left(first);
        let (client, events, joined, at) = RdzvClient::join(
            &order,
            self.leaders,
            req,
            self.token.as_ref(),
            &self.tls,
            self.read_timeout,
            deadline,
        )
        .await?;
        // `at` counts from the endpoint tried first.
        let serving = (first + at) % self.endpoints.len().max(1);
        Ok((RdzvLink::new(client, events, serving, self.clone()), joined))
    }
}

/// The agent's link: a gRPC client, its event stream, and the keep-alives
/// that watch the connection.
pub(crate) struct RdzvLink {
    client: RdzvClient,
    events: Streaming<pb::Event>,
    /// Says why, when keep-alives go unanswered for too long.
    silent: mpsc::Receiver<Silence>,
    keep_alive: tokio::task::JoinHandle<()>,
    /// Which endpoint served: a rejoin starts there.
    serving: usize,
    reach: Arc<Reach>,
}

impl Drop for RdzvLink {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

impl RdzvLink {
    fn new(
        client: RdzvClient,
        events: Streaming<pb::Event>,
        serving: usize,
        reach: Arc<Reach>,
    ) -> Self {
        let (keep_alive, silent) = spawn_keep_alive(
            client.clone(),
            reach.keep_alive_interval,
            reach.keep_alive_max_attempt,
        );
        Self {
            client,
            events,
            silent,
            keep_alive,
            serving,
            reach,
        }
    }
}

impl Link for RdzvLink {
    async fn ready(&mut self, round: u64, store: (String, u32)) -> Result<(), Status> {
        self.client.ready(round, store).await
    }

    async fn report_failure(&mut self, round: u64, f: Failed) {
        self.client
            .report_failure(
                round,
                f.local_rank,
                f.global_rank,
                f.exit_code,
                f.reason,
                f.failure,
            )
            .await;
    }

    async fn report_fenced(&mut self, round: u64, reason: String) {
        self.client.report_fenced(round, reason).await;
    }

    async fn report_success(&mut self, round: u64) {
        self.client.report_success(round).await;
    }

    async fn leave(&mut self, reason: &str) {
        self.client.leave(reason).await;
    }

    async fn next(&mut self) -> Heard {
        tokio::select! {
            Some((why, since)) = self.silent.recv() => match since {
                Some(since) => Heard::Silent { why, since },
                None => Heard::Lost(why),
            },
            ev = self.events.message() => match ev {
                Ok(Some(pb::Event { kind: Some(kind) })) => Heard::Message(kind),
                Ok(Some(_)) => Heard::Nothing,
                Ok(None) => Heard::Lost("the rendezvous ended this node's session".into()),
                Err(s) => Heard::Lost(format!("lost the rendezvous: {}", s.message())),
            },
        }
    }

    fn rejoin(
        &self,
        resume: Option<pb::Resume>,
    ) -> impl Future<Output = Result<(Self, pb::Joined), AgentError>> + Send + 'static {
        let reach = self.reach.clone();
        let mut req = reach.join_req.clone();
        req.resume = resume;
        // The node's secret: a server that still holds the node reattaches
        // it only with it.
        req.session = self.client.session().to_vec();
        let first = self.serving;
        async move {
            let deadline = crate::deadline::after(reach.reconnect_grace);
            reach.join(req, first, deadline).await
        }
    }
}

/// Why the keep-alives gave up, and for silence the last answer.
type Silence = (String, Option<Instant>);

/// Sends keep-alives every `every`. If none is answered for `every ×
/// max_attempt` (a cut link stalls a stream without ending it), or the
/// server no longer knows this node, the returned receiver says why (and,
/// for silence, when one was last answered): the session treats that as a
/// lost rendezvous.
fn spawn_keep_alive(
    mut client: RdzvClient,
    every: Duration,
    max_attempt: u32,
) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<Silence>) {
    let (tx, rx) = mpsc::channel(1);
    let limit = every.saturating_mul(max_attempt);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        let mut answered = Instant::now();
        loop {
            tick.tick().await;
            match tokio::time::timeout(every, client.keep_alive()).await {
                Ok(Ok(())) => answered = Instant::now(),
                Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                    // A restarted server relearns its nodes: not silence.
                    let why = format!("the rendezvous no longer knows this node: {}", s.message());
                    let _ = tx.send((why, None)).await;
                    return;
                }
                Ok(Err(s)) => tracing::debug!(error = %s.message(), "keep-alive failed"),
                Err(_) => tracing::debug!("keep-alive timed out"),
            }
            if answered.elapsed() > limit {
                let why = format!(
                    "no keep-alive answered for {:.1} s",
                    answered.elapsed().as_secs_f64()
                );
                let _ = tx.send((why, Some(answered))).await;
                return;
            }
        }
    });
    (task, rx)
}
