//! The node's link to its job, as the driver uses it: the calls it makes,
//! what it hears, and joining again as the same node.
//!
//! [`Link`] is a seam, not an abstraction over transports: the agent has
//! one link, [`RdzvLink`] (the gRPC client, its event stream and its
//! keep-alive task), and the driver's unit tests have a fake that records
//! the calls and says what a test tells it to. Everything the driver does
//! with the rendezvous goes through these methods, so the tests see every
//! call the real agent would make.
//!
//! # A silent leader is a dead leader
//! The drop limit (`keep_alive_interval × keep_alive_max_attempt`, 15 s by
//! default) is when the rendezvous gives a node up; waiting that long to
//! give the *rendezvous* up would lose the job whenever its leader pauses
//! (a GC pause, a frozen VM, swap) or goes deaf, since its TCP connections
//! stay open and nobody asks who leads now. So the link declares its
//! server silent after [`silence_bound`] (1 s by default, a third of a
//! shorter drop limit): HTTP/2 PINGs on the connection ([`pings`](accel_rdzv_client::client::pings)) that go
//! unanswered for that long end it, and so does a keep-alive, ready or
//! report that gets no answer within it, or any error from one. The node
//! then rejoins (its workers keep running) and the join leaves the silent
//! replica for whichever the others name ([`RdzvClient::join`]), trying
//! the silent one beside that. A failure report that was lost with the
//! silent server is made again to the new one (`machine.rs`, `Round::reported`).
//!
//! The fence counts from the *send* time of the last call the server
//! answered ([`Heard::Silent`]'s `since`): the server's own last sign of
//! life of this node is no earlier, so a node never keeps its workers
//! longer than the server keeps the node. The same clock ([`Answered`],
//! one per agent) goes to the guard with every beat, so the workers of an
//! agent that stops running die by the same deadline (`guard.rs`).
//!
//! # Leaving a silent server without hanging up
//! A server takes a node whose connection ends for gone and re-forms its
//! job at once (that is how a `kill -9`ed agent is noticed in
//! milliseconds). A node that gives up a *silent* server keeps its workers
//! while it rejoins, so it must not end that connection: a server that was
//! only paused or cut off would read the close when it wakes or the link
//! heals, re-form the job without the node, and start its ranks elsewhere
//! while they still run here. So the PINGs that detect silence run on a
//! connection of their own (the probe: a health watch, see
//! [`RdzvClient::join`]), and the connection that carries the node's
//! stream has no PING timeout; when the link leaves a silent server it
//! keeps that connection open ([`hold`]) until the fence deadline, by
//! which time the node's workers are stopped or it has joined again (a
//! rejoined node's old stream ending is ignored by the server).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use accel_proto::v1 as pb;
use accel_wire::auth::ClientToken;
use accel_wire::tls::ClientTlsFiles;
use std::time::Instant;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tonic_health::pb::HealthCheckResponse;
use tracing::warn;

use crate::config::Config;
use crate::error::AgentError;
use accel_rdzv_client::client::{Leaders, RdzvClient};

/// What the link heard.
#[derive(Debug)]
pub(crate) enum Heard {
    /// A message from the job.
    Message(pb::event::Kind),
    /// A message without content (nothing to act on).
    Nothing,
    /// The session ended or broke: why.
    Lost(String),
    /// The server went silent (no answer within the silence bound, or
    /// the connection broke): why, and the send time of the last call it
    /// answered.
    Silent {
        /// Why, in words.
        why: String,
        /// The send time of the last answered call.
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

    /// Reports a worker's failure in `round` (best effort): true once the
    /// rendezvous answered it (took it, or had ended the round already).
    fn report_failure(&mut self, round: u64, failed: Failed) -> impl Future<Output = bool> + Send;

    /// Says that this node stopped its workers in `round` for want of a
    /// rendezvous (fencing), not because one failed (best effort).
    fn report_fenced(&mut self, round: u64, reason: String) -> impl Future<Output = ()> + Send;

    /// Reports that every worker of this node succeeded in `round` (best
    /// effort).
    fn report_success(&mut self, round: u64) -> impl Future<Output = ()> + Send;

    /// Leaves the job (best effort); `unhealthy`: because this node failed
    /// its health check.
    fn leave(&mut self, reason: &str, unhealthy: bool) -> impl Future<Output = ()> + Send;

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

    /// The fence clock: the send time of the last call answered (`None`:
    /// this link keeps none).
    fn answered(&self) -> Option<Answered> {
        None
    }
}

/// Returns once the fence falls: `within` after the last call answered,
/// read again after each wait (later answers move it); never while none was.
pub(crate) async fn fence_falls(answered: Answered, within: Duration) {
    loop {
        let Some(due) = answered.get().and_then(|a| a.checked_add(within)) else {
            return std::future::pending().await;
        };
        if tokio::time::Instant::now().into_std() >= due {
            return;
        }
        tokio::time::sleep_until(due.into()).await;
    }
}

/// A worker failure as reported.
pub(crate) use accel_rdzv_client::client::WorkerFailure as Failed;

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
    /// Re-read from its file when the rendezvous refuses it (rotation).
    token: ClientToken,
    tls: ClientTlsFiles,
    read_timeout: Duration,
    /// The longest wait between attempts at a rendezvous that does not
    /// answer (`cas_backoff_max_seconds`; `None`: the client's default).
    retry_max: Option<Duration>,
    reconnect_grace: Duration,
    /// How long a node with no workers running keeps rejoining
    /// ([`idle_rejoin_grace`]).
    idle_grace: Duration,
    keep_alive_interval: Duration,
    /// How long the server may leave a call or a PING unanswered.
    silence: Duration,
    /// The job's drop limit: how long the server keeps a silent node.
    drop_limit: Duration,
    /// The send time of the last call a server answered (the agent's fence
    /// clock, shared with the guard's beats).
    answered: Answered,
    /// What the round's peer hub says: the vouch for the keep-alives, and
    /// how long the workers may run without a rendezvous.
    peers: crate::peers::Shared,
    /// The workers' progress, which the keep-alives carry.
    progress: crate::progress::Progress,
    /// Agent-only rendezvous: this node's presence key, which must be in
    /// etcd before it joins (the leader drops a member without one).
    presence: Option<rendezvous_server::presence::PresenceHeld>,
    /// The running round's workers, whose stacks the server may ask for.
    workers: crate::file_timer::Workers,
    /// Where a hang's job-wide collection finds the link now serving.
    job_stacks: crate::stacks::JobStacks,
}

/// The most a node waits for an answer before it takes its server for
/// silent: a third of the drop limit, at most a second. Well within the
/// drop limit, so a node leaves a paused or deaf leader and finds the new
/// one long before either side gives the other up; long enough that a
/// loaded server's answer (microseconds of work, plus a round trip) is not
/// mistaken for silence. A server wrongly taken for silent costs a rejoin
/// (the workers keep running), nothing more.
pub(crate) fn silence_bound(drop_limit: Duration) -> Duration {
    (drop_limit / 3)
        .min(Duration::from_secs(1))
        .max(Duration::from_millis(20))
}

/// How long before the drop limit a node stops its own workers: a tenth
/// of the limit, at most 0.2 s, so the kill lands before the rendezvous
/// can drop the node and the other nodes start its ranks again. The guard
/// of an agent that stopped running acts at half of it.
pub(crate) fn fence_margin(drop_limit: Duration) -> Duration {
    (drop_limit / 10).min(Duration::from_millis(200))
}

/// How long a node with no workers running (a spare, a node between
/// rounds) keeps rejoining a rendezvous it cannot reach: `reconnect_grace`,
/// but at least `outage_timeout`. It risks nothing by waiting (no rank of
/// its runs), and giving up during a control-plane outage would end its
/// agent (a failed pod, a lost spare) while the job's running nodes ride
/// the outage out. A node with workers rejoins for `reconnect_grace`, and
/// on for as long as its peers vouch for it (the machine's `Vouched`).
pub(crate) fn idle_rejoin_grace(reconnect_grace: Duration, outage_timeout: Duration) -> Duration {
    reconnect_grace.max(outage_timeout)
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
            token: ClientToken::new(cfg.token.as_ref(), cfg.rdzv.token_file.as_deref()),
            tls: cfg.link_tls(),
            read_timeout: cfg.rdzv.read_timeout,
            retry_max: cfg.rdzv.cas_backoff_max,
            reconnect_grace: cfg.reconnect_grace(),
            idle_grace: idle_rejoin_grace(cfg.reconnect_grace(), cfg.rdzv.outage_timeout),
            keep_alive_interval: cfg.rdzv.keep_alive_interval,
            silence: silence_bound(cfg.rdzv.dead_after()),
            drop_limit: cfg.rdzv.dead_after(),
            answered: Answered::default(),
            peers: crate::peers::Shared::default(),
            progress: crate::progress::Progress::default(),
            presence: None,
            workers: crate::file_timer::Workers::default(),
            job_stacks: crate::stacks::JobStacks::default(),
        }
    }

    /// The same, answering the server's requests for the stacks of
    /// `workers`, and handing each link's client to `job_stacks`.
    pub(crate) fn with_stacks(
        mut self,
        workers: crate::file_timer::Workers,
        job_stacks: crate::stacks::JobStacks,
    ) -> Self {
        self.workers = workers;
        self.job_stacks = job_stacks;
        self
    }

    /// The same, vouching in every keep-alive for the nodes the round's
    /// peer hub hears, and holding a silent server's connection for as long
    /// Keep-alives carry the workers' progress (`progress`: the agent's).
    pub(crate) fn with_progress(mut self, progress: crate::progress::Progress) -> Self {
        self.progress = progress;
        self
    }

    /// as the peers keep the workers (`peers`: the agent's one).
    pub(crate) fn with_peers(mut self, peers: crate::peers::Shared) -> Self {
        self.peers = peers;
        self
    }

    /// The same, keeping the fence clock in `answered` (the agent's one).
    pub(crate) fn with_answered(mut self, answered: Answered) -> Self {
        self.answered = answered;
        self
    }

    /// This node's presence key (agent-only rendezvous), if it keeps one.
    pub(crate) fn presence(&self) -> Option<&rendezvous_server::presence::PresenceHeld> {
        self.presence.as_ref()
    }

    /// The same, joining only while this node's presence key is in etcd.
    pub(crate) fn with_presence(
        mut self,
        held: Option<rendezvous_server::presence::PresenceHeld>,
    ) -> Self {
        self.presence = held;
        self
    }

    /// Joins (the first time, or again), within `deadline`, starting at
    /// endpoint `first`; `avoid`: a replica that went silent.
    pub(crate) async fn join(
        self: &Arc<Self>,
        req: pb::JoinRequest,
        first: usize,
        avoid: Option<(String, u16)>,
        deadline: Instant,
    ) -> Result<(RdzvLink, pb::Joined), AgentError> {
        if let Some(held) = &self.presence {
            if !held.wait(deadline.into()).await {
                return Err(AgentError::JoinTimeout(
                    "this node's presence key could not be written to etcd in time (the rendezvous drops a node without one); is etcd reachable from this node?".into(),
                ));
            }
        }
        // The replica that served last first, then the others.
        let mut order = self.endpoints.clone();
        let first = first.min(order.len());
        order.rotate_left(first);
        let (client, events, probe, joined, at) = RdzvClient::join(
            &order,
            self.leaders,
            req,
            &self.token,
            &self.tls,
            {
                let pace = accel_rdzv_client::Pace::new(self.read_timeout, self.silence);
                match self.retry_max {
                    Some(max) => pace.retrying_at_most(max),
                    None => pace,
                }
            },
            avoid.as_ref(),
            deadline.into(),
        )
        .await?;
        // `at` counts from the endpoint tried first.
        let serving = (first + at) % self.endpoints.len().max(1);
        Ok((
            RdzvLink::new(client, events, probe, serving, self.clone()),
            joined,
        ))
    }
}

/// The agent's link: a gRPC client, its event stream, and the keep-alives
/// that watch the connection.
pub(crate) struct RdzvLink {
    client: RdzvClient,
    /// The node's event stream (taken by [`hold`] when the link is
    /// dropped after its server went silent).
    events: Option<Streaming<pb::Event>>,
    /// The probe's health watch: it ends when its PINGs go unanswered.
    probe: Option<Streaming<HealthCheckResponse>>,
    /// Says why, when a keep-alive goes unanswered or fails.
    silent: mpsc::Receiver<Silence>,
    /// The send time of the last call the server answered.
    answered: Answered,
    /// A call of the driver's went unanswered (or failed): why.
    tripped: Option<String>,
    /// The server went silent, or closed the job saying it is going away
    /// (it no longer leads): a rejoin leaves it for another.
    leaving: bool,
    /// The server went silent: its connection is held open until the fence
    /// deadline once the link is dropped.
    went_silent: bool,
    keep_alive: tokio::task::JoinHandle<()>,
    /// Which endpoint served: a rejoin starts there.
    serving: usize,
    reach: Arc<Reach>,
}

impl Drop for RdzvLink {
    fn drop(&mut self) {
        self.keep_alive.abort();
        if !self.went_silent {
            return;
        }
        let Some(events) = self.events.take() else {
            return;
        };
        let since = self.answered.get().unwrap_or_else(Instant::now);
        // An unbounded drop limit holds for a day (the process is gone long before).
        let until = since
            .checked_add(self.reach.drop_limit)
            .unwrap_or_else(|| since + Duration::from_secs(86_400));
        // The peers may keep the workers longer: the hold follows them, a
        // drop limit past their word (the server reads a close as a leave).
        // Never back: the machine's fence keeps the latest word it had even
        // when the evidence lapses later (the hub's node lost too), so the
        // hold does, else the server would read the close as a leave while
        // the workers still run (found by the simulator, seed 442134).
        let drop_limit = self.reach.drop_limit;
        let peers = self.reach.peers.clone();
        let latest = std::cell::Cell::new(until);
        let until = move || {
            if let Some(u) = peers.latest().and_then(|u| u.checked_add(drop_limit)) {
                latest.set(latest.get().max(u));
            }
            latest.get()
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(hold(self.client.clone(), events, until));
        }
    }
}

/// Keeps a silent server's connection open (and its stream read) until
/// `until`, the node's fence deadline (see the module docs): ending it
/// sooner would tell the server, once it hears again, that the node is
/// gone while its workers still run.
async fn hold(client: RdzvClient, mut events: Streaming<pb::Event>, until: impl Fn() -> Instant) {
    let _connection = client;
    let read = async {
        while let Ok(Some(_)) = events.message().await {}
        // The server ended the stream itself: nothing is left to hold.
    };
    tokio::pin!(read);
    loop {
        let deadline = until();
        if tokio::time::timeout_at(deadline.into(), &mut read)
            .await
            .is_ok()
        {
            return;
        }
        if until() <= deadline {
            return;
        }
    }
}

impl RdzvLink {
    fn new(
        client: RdzvClient,
        events: Streaming<pb::Event>,
        probe: Option<Streaming<HealthCheckResponse>>,
        serving: usize,
        reach: Arc<Reach>,
    ) -> Self {
        let answered = reach.answered.clone();
        answered.note(client.sent().into());
        reach.job_stacks.serve(client.clone());
        let (keep_alive, silent) = spawn_keep_alive(
            client.clone(),
            reach.keep_alive_interval,
            reach.silence,
            answered.clone(),
            reach.peers.clone(),
            reach.progress.clone(),
        );
        Self {
            client,
            events: Some(events),
            probe,
            silent,
            answered,
            tripped: None,
            leaving: false,
            went_silent: false,
            keep_alive,
            serving,
            reach,
        }
    }

    fn since(&self) -> Instant {
        self.answered
            .get()
            .unwrap_or_else(|| self.client.sent().into())
    }

    /// Runs one call of the driver's: an answer moves the keep-alive
    /// clock; no answer within the silence bound, or a failure that is not
    /// the server's verdict on the call, marks the server silent (the next
    /// [`Link::next`] says so).
    async fn call<F>(&mut self, what: &str, call: F) -> Result<(), Status>
    where
        F: Future<Output = Result<(), Status>>,
    {
        let sent = tokio::time::Instant::now().into_std();
        let result = match tokio::time::timeout(self.reach.silence, call).await {
            Ok(r) => r,
            Err(_) => Err(Status::unavailable(format!(
                "the rendezvous did not answer {what} within {:.1} s",
                self.reach.silence.as_secs_f64()
            ))),
        };
        match &result {
            Ok(()) => self.answered.note(sent),
            Err(s) if is_silence(s.code()) => {
                self.tripped.get_or_insert_with(|| {
                    format!("the rendezvous did not answer {what}: {}", s.message())
                });
            }
            Err(_) => {}
        }
        result
    }
}

/// Whether a failed call says nothing about the call itself: the server
/// did not answer, or answers that it does not serve (a follower, a leader
/// whose lease lapsed), or the connection broke.
pub(crate) fn is_silence(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

/// The send time of the last call a server answered, shared by the
/// agent's links, their keep-alive tasks and the guard's beats. The
/// server's last sign of life of this node is no earlier, so the fence
/// that counts from it is never late.
#[derive(Debug, Clone, Default)]
pub(crate) struct Answered(Arc<std::sync::Mutex<Option<Instant>>>);

impl Answered {
    /// A call sent at `sent` was answered.
    pub(crate) fn note(&self, sent: Instant) {
        let mut at = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *at = Some(at.map_or(sent, |a| a.max(sent)));
    }

    /// A clock fixed at `at`, not moved by later answers: the fence of a
    /// stop for a re-form ([`super::machine::NodeMachine::stop_reforms`]).
    pub(crate) fn fixed(at: Option<Instant>) -> Self {
        Self(Arc::new(std::sync::Mutex::new(at)))
    }

    /// The latest send time answered, if any call was.
    pub(crate) fn get(&self) -> Option<Instant> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Link for RdzvLink {
    fn answered(&self) -> Option<Answered> {
        Some(self.answered.clone())
    }

    async fn ready(&mut self, round: u64, store: (String, u32)) -> Result<(), Status> {
        let mut client = self.client.clone();
        self.call("ready", client.ready(round, store)).await
    }

    async fn report_failure(&mut self, round: u64, f: Failed) -> bool {
        let mut client = self.client.clone();
        let call = client.report_failure(round, f);
        match self.call("the failure report", call).await {
            Ok(()) => true,
            Err(s) => {
                // Made again once the node reaches a rendezvous (`Round::reported`).
                warn!(code = ?s.code(), error = %s.message(), "could not report the failure to the rendezvous");
                false
            }
        }
    }

    async fn report_fenced(&mut self, round: u64, reason: String) {
        let mut client = self.client.clone();
        if let Err(s) = self
            .call("the fenced report", client.report_fenced(round, reason))
            .await
        {
            warn!(code = ?s.code(), error = %s.message(), "could not tell the rendezvous that this node's workers were fenced");
        }
    }

    async fn report_success(&mut self, round: u64) {
        let mut client = self.client.clone();
        if let Err(s) = self
            .call("the success report", client.report_success(round))
            .await
        {
            warn!(code = ?s.code(), error = %s.message(), "could not report success to the rendezvous");
        }
    }

    async fn leave(&mut self, reason: &str, unhealthy: bool) {
        self.client.leave(reason, unhealthy).await;
    }

    async fn next(&mut self) -> Heard {
        let since = self.since();
        let silence = self.reach.silence;
        let heard = match (self.tripped.take(), self.events.as_mut()) {
            (Some(why), _) => Heard::Silent { why, since },
            (None, None) => std::future::pending().await,
            (None, Some(events)) => tokio::select! {
                Some((why, silent)) = self.silent.recv() => match silent {
                    true => Heard::Silent { why, since },
                    false => Heard::Lost(why),
                },
                why = probe_ends(&mut self.probe, silence) => Heard::Silent { why, since },
                ev = events.message() => match ev {
                    Ok(Some(pb::Event { kind: Some(pb::event::Kind::StacksRequested(req)) })) => {
                        // Answered beside the driver: it changes nothing
                        // about the node's rounds.
                        tokio::spawn(crate::stacks::answer(
                            self.client.clone(),
                            req,
                            self.reach.workers.clone(),
                        ));
                        Heard::Nothing
                    }
                    Ok(Some(pb::Event { kind: Some(kind) })) => Heard::Message(kind),
                    Ok(Some(_)) => Heard::Nothing,
                    Ok(None) => Heard::Lost("the rendezvous ended this node's session".into()),
                    // The connection broke.
                    Err(s) => Heard::Silent {
                        why: format!("lost the rendezvous: {}", s.message()),
                        since,
                    },
                },
            },
        };
        match heard {
            Heard::Silent { .. } => {
                self.leaving = true;
                self.went_silent = true;
            }
            Heard::Message(pb::event::Kind::JobClosed(_)) => self.leaving = true,
            _ => {}
        }
        if matches!(
            heard,
            Heard::Silent { .. } | Heard::Lost(_) | Heard::Message(pb::event::Kind::JobClosed(_))
        ) {
            // The session is over here: the probe goes now (a server
            // shutting down waits for its open calls to end).
            self.probe = None;
        }
        heard
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
        // A server that went silent is left for whichever the others name
        // (and tried beside that); one that ended the session is tried first.
        let avoid = self.leaving.then(|| self.client.server().clone());
        async move {
            let grace = match req.resume {
                Some(_) => reach.reconnect_grace,
                None => reach.idle_grace,
            };
            let deadline = crate::deadline::after(grace);
            reach.join(req, first, avoid, deadline.into()).await
        }
    }
}

/// Waits until the probe's health watch ends ([`accel_rdzv_client::client::probe_ended`])
/// and drops it: why. Never returns without a probe.
async fn probe_ends(
    probe: &mut Option<Streaming<HealthCheckResponse>>,
    silence: Duration,
) -> String {
    let Some(watch) = probe.as_mut() else {
        return std::future::pending().await;
    };
    let why = accel_rdzv_client::client::probe_ended(watch, silence).await;
    *probe = None;
    why
}

/// Why the keep-alives gave up, and whether the server went silent.
type Silence = (String, bool);

/// Sends keep-alives every `every`, each noting its send time in
/// `answered` once answered. One not answered within `silence`, or failed,
/// means the server went silent (the PINGs usually say so first); one the
/// server answers with NOT_FOUND means it no longer knows this node (a
/// restarted server relearns its nodes). Either way the returned receiver
/// says why, and the session treats that as a lost rendezvous.
fn spawn_keep_alive(
    mut client: RdzvClient,
    every: Duration,
    silence: Duration,
    answered: Answered,
    peers: crate::peers::Shared,
    progress: crate::progress::Progress,
) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<Silence>) {
    let (tx, rx) = mpsc::channel(1);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            let sent = tokio::time::Instant::now().into_std();
            let vouch = peers.vouch(sent);
            let said = client.keep_alive(vouch, progress.summary());
            let why = match tokio::time::timeout(silence, said).await {
                Ok(Ok(())) => {
                    answered.note(sent);
                    continue;
                }
                Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                    let why = format!("the rendezvous no longer knows this node: {}", s.message());
                    let _ = tx.send((why, false)).await;
                    return;
                }
                Ok(Err(s)) => format!("a keep-alive failed: {}", s.message()),
                Err(_) => format!(
                    "no keep-alive answered within {:.1} s",
                    silence.as_secs_f64()
                ),
            };
            let _ = tx.send((why, true)).await;
            return;
        }
    });
    (task, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_silence_bound_is_a_third_of_the_drop_limit_at_most_a_second() {
        let s = Duration::from_secs;
        assert_eq!(silence_bound(s(15)), s(1), "the default drop limit");
        assert_eq!(silence_bound(s(3)), s(1));
        assert_eq!(silence_bound(s(1)), s(1) / 3);
        assert_eq!(silence_bound(Duration::ZERO), Duration::from_millis(20));
        let (interval, timeout) = accel_rdzv_client::client::pings(s(1));
        assert_eq!(
            interval + timeout,
            s(1),
            "a connection with no answer ends within the bound"
        );
    }

    #[test]
    fn the_fence_clock_keeps_the_latest_answered_send_time() {
        let t0 = Instant::now();
        let a = Answered::default();
        assert_eq!(a.get(), None);
        a.note(t0);
        a.note(t0 + Duration::from_secs(2));
        // A slow answer to an older call does not move it back.
        a.note(t0 + Duration::from_secs(1));
        assert_eq!(a.get(), Some(t0 + Duration::from_secs(2)));
    }

    #[test]
    fn a_node_fences_a_little_before_the_drop_limit() {
        let ms = Duration::from_millis;
        assert_eq!(fence_margin(ms(15_000)), ms(200));
        assert_eq!(fence_margin(ms(1_000)), ms(100));
        assert_eq!(fence_margin(ms(400)), ms(40));
    }
}
