//! The simulated cluster: one rendezvous server running the real
//! `Registry` (and with it the real [`Job`]), N agents running the real
//! [`NodeMachine`], their fake workers, and the network between them, all
//! on one virtual clock.
//!
//! # What each side does, and where it comes from
//! - The **server** is the real `Registry` on the world's clock (a
//!   `ManualClock` moved with virtual time), behind a thin model of the
//!   gRPC service: each call becomes the registry method the service calls
//!   (`join`, `for_node`, `keep_alive_vouching`, `leave`, `quarantine`), a
//!   connection's end drops the node's `NodeStream` (a departure, as in a
//!   server), and after every call the streams' events go out on the
//!   network. Every incarnation but a store-less restart writes to an
//!   in-memory store through the registry's durable commit path, so the
//!   events of a change leave only once the store took it
//!   (`Spec::store_latency` sets how long that takes; a crash before the
//!   write loses both); a failover loads a new registry from that store
//!   (jobs and tombstones), a store-less restart starts an empty one that
//!   holds back the jobs it creates. Its periodic work runs at the
//!   registry's next deadline and at least every half second; paused,
//!   it reads nothing, and the registry itself notices the gap when it
//!   wakes (`Registry::woke`).
//! - The **peer hub** mirrors the agent's `peers` task with its real pure
//!   parts: from a round's start until its next offer (or the agent's end)
//!   each node pings the round's hub every [`Timing::every`] and publishes
//!   what its [`View`] says, the vouch its keep-alives carry and until when
//!   the evidence keeps its workers ([`Timing::keeps_until`], from its fence
//!   clock); the node holding node rank 0 serves the [`Hub`]. Pings and
//!   answers are datagrams on peer links that fail apart from the links to
//!   the server ([`Fault::CutPeers`], [`Fault::CutServer`],
//!   [`Fault::Partition`] for both).
//! - Each **agent** mirrors the driver (`agent.rs`, `actions.rs`,
//!   `link.rs`): it feeds the machine only from the sources the machine's
//!   phase listens to ([`NodeMachine::sources`]), performs the returned
//!   actions in order, sends keep-alives, takes its server for silent when
//!   a call or the probe goes unanswered for the silence bound
//!   (`Heard::Silent`, with the send time of the last answered call), and
//!   rejoins (retrying) until the reconnect grace ends. While it recovers
//!   it feeds the machine the peers' evidence when it moves
//!   (`Event::Vouched`), and the held connection of a silent server follows
//!   that evidence a drop limit past it (`link::hold`).
//! - **Workers** are records: started by `Action::Start`, they run until
//!   told (`finish`, `fail-worker`) or for the job's `run` time, and die on a
//!   stop after `term` (SIGTERM) or at once (SIGKILL). An agent that dies
//!   takes its workers with it (its guard kills them). A *flaky* node's
//!   local rank 0 exits 1 [`FLAKY_AFTER`] into each of its next rounds (a
//!   bad machine, for the server's quarantine, [`Spec::quarantine`]).
//!
//! # Simplifications
//! A driver call is not awaited (the real driver blocks on a call for at
//! most the silence bound); an unanswered call trips the link exactly as
//! there. A partition drops calls and their answers both ways, and holds a
//! stream's events until it heals (TCP retransmits; a node that rejoined
//! meanwhile ignores its old stream). Peer datagrams have the link's
//! latency and no MAC (one under another round's key is dropped, as its MAC
//! would fail); the vouch is the last published one while fresh, as
//! `peers::Shared` keeps it. A paused server's buffered join attempts that
//! their nodes give up before an answer could reach them are dropped with
//! their cancellation instead of being served (the open
//! `known_abandoned_rejoin.sim` issue otherwise). The fork server, zygote,
//! store, health checks, etcd presence and the guard (its beats and its
//! deadline, which the peers' evidence also moves) are not modelled.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use accel_agent::agent::machine::{Action, Event, NodeMachine, Settings};
use accel_agent::agent::round::Exit;
use accel_agent::config::RestartBackoff;
use accel_agent::peers::{Hub, Timing, View};
use accel_agent::{AgentError, Ended, Outcome};
use accel_proto::v1 as pb;
use nix::sys::signal::Signal;
use pb::event::Kind;
use rendezvous_server::clock::{Clock, ManualClock};
use rendezvous_server::job::{Job, Phase, QuarantinePolicy, Session, SESSION_BYTES};
use rendezvous_server::registry::NodeStream;
use rendezvous_server::store::MemoryStore;
use rendezvous_server::Registry;

use crate::invariants::{Checker, Violation};

/// The job every node runs, and the timings of the simulated agents.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Fewest nodes a round may run with.
    pub min_nodes: u32,
    /// Most nodes a round holds.
    pub max_nodes: u32,
    /// Workers per node.
    pub nproc: u32,
    /// The job-wide restart budget.
    pub max_restarts: u32,
    /// `keep_alive_interval`.
    pub keep_alive: Duration,
    /// `keep_alive_max_attempt`: the drop limit is `keep_alive × attempts`.
    pub attempts: u32,
    /// `last_call_timeout`.
    pub last_call: Duration,
    /// `join_timeout`.
    pub join_timeout: Duration,
    /// `reconnect_grace`.
    pub grace: Duration,
    /// `--exit-barrier-timeout`.
    pub barrier: Duration,
    /// `--shutdown-timeout`.
    pub shutdown: Duration,
    /// `--restart-backoff`.
    pub backoff: RestartBackoff,
    /// How long a worker runs before it exits 0 (`None`: until told).
    pub run: Option<Duration>,
    /// How long a worker takes to end on SIGTERM.
    pub term: Duration,
    /// One-way latency of every link.
    pub latency: Duration,
    /// Static rendezvous: node `nK` asks for node rank `K-1`.
    pub static_ranks: bool,
    /// What `restart-server` does without saying: relearn (no store) or
    /// restore the job from its record (a failover to a replica).
    pub failover: bool,
    /// The server's `--quarantine-after/-window/-for` (`None`: off).
    pub quarantine: Option<QuarantinePolicy>,
    /// A node whose ranks report half as much time again per step as the
    /// others' (a straggler; `--straggler-quarantine` is
    /// [`QuarantinePolicy::stragglers`]).
    pub slow: Option<usize>,
    /// How long the store takes to write a change (`failover` only): the
    /// events it caused wait for the write, and a crash before it loses
    /// both.
    pub store_latency: Duration,
    /// The planted commit bug: the server sends a change's events before
    /// the store holds it (`Registry::delivering_before_durable`).
    pub broken_commit: bool,
    /// The planted quarantine bug: the server ends every bench as soon as
    /// it begins, so rounds place benched hosts.
    pub broken_quarantine: bool,
    /// `outage_timeout`: how long the nodes keep their workers without a
    /// rendezvous on their peers' word (the peer hub, `Peer`), and how
    /// long the server holds a round through a mass silence. Zero: agents
    /// without a peer hub (they fence at the drop limit, and the server
    /// holds nothing).
    pub outage: Duration,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            min_nodes: 1,
            max_nodes: 1,
            nproc: 1,
            max_restarts: 0,
            keep_alive: Duration::from_secs(1),
            attempts: 3,
            last_call: Duration::from_secs(1),
            join_timeout: Duration::from_secs(600),
            grace: Duration::from_secs(60),
            barrier: Duration::from_secs(300),
            shutdown: Duration::from_secs(30),
            backoff: RestartBackoff {
                base: Duration::ZERO,
                max: Duration::from_secs(30),
                window: Duration::from_secs(60),
            },
            run: None,
            term: Duration::from_millis(100),
            latency: Duration::from_millis(1),
            static_ranks: false,
            failover: false,
            quarantine: None,
            slow: None,
            store_latency: Duration::ZERO,
            broken_commit: false,
            broken_quarantine: false,
            // Five drop limits of the default timings.
            outage: Duration::from_secs(15),
        }
    }
}

impl Spec {
    /// The job's drop limit: how long the server keeps a silent node.
    pub fn drop_limit(&self) -> Duration {
        self.keep_alive.saturating_mul(self.attempts)
    }

    /// The peer hub's timing for a round of `nnodes`, as the agent's
    /// `start_peers` makes it (`None`: no peer hub).
    pub fn timing(&self, nnodes: u32) -> Option<Timing> {
        let fence_in = self.settings().fence_in();
        (!self.outage.is_zero()).then(|| {
            Timing::new(
                self.drop_limit(),
                self.keep_alive,
                self.outage,
                fence_in,
                nnodes,
            )
        })
    }

    /// The agents' machine settings (fencing on).
    pub fn settings(&self) -> Settings {
        Settings {
            run_id: JOB.into(),
            nproc_per_node: self.nproc,
            join_timeout: self.join_timeout,
            exit_barrier_timeout: self.barrier,
            shutdown_timeout: self.shutdown,
            reconnect_grace: self.grace,
            fence_after: self.drop_limit(),
            outage_timeout: self.outage,
            fence: true,
            restart_backoff: self.backoff,
        }
    }

    /// The link's silence bound (`link::silence_bound`): a third of the
    /// drop limit, at most a second, at least 20 ms.
    pub fn silence(&self) -> Duration {
        (self.drop_limit() / 3)
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(20))
    }
}

/// The job id every node joins.
pub const JOB: &str = "sim";
/// How often a join that got no answer is tried again.
const JOIN_RETRY: Duration = Duration::from_millis(500);
/// Lines of trace kept for a failure's report.
const TRACE_KEEP: usize = 150;
/// How long a flaky node's worker runs before it fails.
pub const FLAKY_AFTER: Duration = Duration::from_millis(300);

/// A message in flight.
#[derive(Debug)]
enum Msg {
    /// A call from node `from` (its index) to the server.
    Call {
        from: usize,
        node_id: String,
        session: Vec<u8>,
        id: u64,
        body: Call,
    },
    /// The server's answer to call `id`.
    Reply {
        to: usize,
        id: u64,
        ok: Result<(), Refusal>,
    },
    /// The answer to a join attempt.
    Joined {
        to: usize,
        attempt: u64,
        result: Result<(u64, pb::Joined), String>,
    },
    /// An event on stream `stream` of node `to`.
    Stream { to: usize, stream: u64, kind: Kind },
    /// The server ended stream `stream` (`silent`: the connection broke).
    StreamEnd {
        to: usize,
        stream: u64,
        silent: bool,
    },
    /// A peer hub ping from node `from` to node `to`, the hub of the round
    /// whose peer key is `key` (a datagram under another key fails its MAC).
    Ping {
        from: usize,
        to: usize,
        key: Vec<u8>,
        rank: u32,
        seq: u64,
        version: u64,
    },
    /// The hub's answer to node rank `rank`'s ping `seq`.
    Answer {
        from: usize,
        to: usize,
        key: Vec<u8>,
        rank: u32,
        seq: u64,
        heard: u32,
        version: u64,
        map: Option<Vec<u8>>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    NotFound,
    Denied,
}

/// What a keep-alive vouches for: the round, the bitmap of node ranks its
/// node hears through the round's hub, or all of them.
type Vouch = (u64, Vec<u8>, bool);

#[derive(Debug, Clone)]
enum Call {
    Join(Box<pb::JoinRequest>, u64),
    Ready(u64),
    KeepAlive(Option<Vouch>, Option<pb::Progress>),
    Failure {
        round: u64,
        reason: String,
        detail: pb::Failure,
        progress: Option<pb::Progress>,
    },
    Fenced(u64, String),
    Success(u64),
    Leave(String),
    /// The connection carrying stream `.0` ended.
    Closed(u64),
    /// The node gave join attempt `.0` up (its probe timed out): the
    /// attempt's stream is cancelled, which the server takes for its end.
    Abandon(u64),
}

impl Call {
    fn name(&self) -> &'static str {
        match self {
            Call::Join(..) => "join",
            Call::Ready(_) => "ready",
            Call::KeepAlive(..) => "keep-alive",
            Call::Failure { .. } => "the failure report",
            Call::Fenced(..) => "the fenced report",
            Call::Success(_) => "the success report",
            Call::Leave(_) => "leave",
            Call::Closed(_) => "close",
            Call::Abandon(_) => "a cancelled join",
        }
    }
}

/// A worker's first step, after its start (loading, the first batch).
pub const FIRST_STEP: Duration = Duration::from_millis(1500);
/// Each later step.
pub const STEP: Duration = Duration::from_millis(500);
/// Steps between checkpoints.
pub const CHECKPOINT_EVERY: u64 = 10;

/// The rendezvous server: the real `Registry` on the world's virtual
/// clock, with the in-memory store when a restart is a failover (so the
/// durable commit path and the tombstones run as they do on etcd).
struct Server {
    up: bool,
    /// Bumped by every crash: what was in flight to or from the last
    /// incarnation is lost.
    epoch: u64,
    /// The running incarnation.
    registry: Option<Registry>,
    /// The job store replicas share: what one that takes over loads.
    store: Arc<MemoryStore>,
    /// Whether the running incarnation writes to it: every one but a
    /// store-less server restarted in its place (`restart-server` without
    /// `failover`).
    durable: bool,
    /// The registry's clock: the world's virtual time.
    clock: Arc<ManualClock>,
    /// Bumped whenever the job is replaced (a new job, a restored one): the
    /// goodput invariant compares a job only with itself.
    pub job_epoch: u64,
    /// Each node's current stream: the number its node knows it by, and
    /// the registry's stream (dropping it is the connection's end).
    streams: BTreeMap<String, (u64, NodeStream)>,
    /// The stream each join attempt opened: attempt → (node id, stream).
    attempts: BTreeMap<u64, (String, u64)>,
    /// Streams of joins not answered yet (their `Joined` waits for the
    /// store): stream → (node index, attempt, node id, stream).
    answers: BTreeMap<u64, (usize, u64, String, NodeStream)>,
    /// When the store's write of what was decided since the last one is
    /// done (`Spec::store_latency`).
    flush_at: Option<Duration>,
    /// The highest round any node was told of (a round formed, or the
    /// next round of a restart): a server that takes over must know it.
    announced: u64,
    /// [`Fault::CrashOnRoundChange`] armed: a replica takes over after
    /// this long.
    crash_armed: Option<Duration>,
    /// It fired: the crash happens before anything else runs.
    crash_due: Option<Duration>,
    /// The last round's world size.
    world: u32,
    /// When the registry's periodic work last ran.
    ticked: Duration,
    /// Stopped (SIGSTOP) since: it reads nothing, answers nothing and runs
    /// no periodic work until resumed.
    paused: Option<Duration>,
    /// Calls that reached a paused server (its kernel's buffers), read in
    /// order when it resumes.
    unread: Vec<Msg>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("up", &self.up)
            .field("epoch", &self.epoch)
            .field("streams", &self.server_streams())
            .finish_non_exhaustive()
    }
}

impl Server {
    fn server_streams(&self) -> Vec<(&String, u64)> {
        self.streams.iter().map(|(n, (s, _))| (n, *s)).collect()
    }
}

/// A node's part of its round's peer hub: the agent's `peers` task, with
/// the real [`Hub`] (node rank 0 only), [`View`] and [`Timing`]; datagrams
/// are [`Msg::Ping`] and [`Msg::Answer`] on the peer links, without the
/// wire format or its MAC (a datagram under another round's key is dropped).
#[derive(Debug)]
struct Peer {
    /// The round's peer key (the sim's: a number unique in the run).
    key: Vec<u8>,
    round: u64,
    rank: u32,
    /// The node at the round's `MASTER_ADDR` (its node rank 0), if that
    /// agent still runs.
    hub_at: Option<usize>,
    timing: Timing,
    hub: Option<Hub>,
    view: View,
    /// The next tick: a ping, and the hub's sweep.
    next: Duration,
}
/// A fake worker.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Its local rank.
    pub local_rank: u32,
    /// Its global rank.
    pub rank: u32,
    /// Its round.
    pub round: u64,
    /// Its pid (unique in the run).
    pub pid: u32,
    /// Whether it runs.
    pub alive: bool,
    /// When it exits by itself, and how.
    ends: Option<(Duration, Ended)>,
    /// When it started, and the step it resumed from (its training: a
    /// first step [`FIRST_STEP`] after the start, then one per [`STEP`]).
    started: Duration,
    resumed: u64,
}

/// A join in progress.
#[derive(Debug)]
struct Joining {
    resume: Option<pb::Resume>,
    first: bool,
    deadline: Duration,
    /// The attempt in flight and when it is given up, or when to try again.
    attempt: Option<(u64, Duration)>,
    retry_at: Duration,
}

/// How a node ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The machine's outcome.
    Outcome(Outcome),
    /// An error, with its exit code.
    Error(u8, String),
    /// The agent was killed.
    Crashed,
}

impl End {
    /// The agent's exit code (`None`: killed).
    pub fn code(&self) -> Option<u8> {
        match self {
            End::Outcome(o) => Some(o.exit_code()),
            End::Error(c, _) => Some(*c),
            End::Crashed => None,
        }
    }
}

/// One agent and its workers.
#[derive(Debug)]
pub struct Node {
    /// Its name in scripts (`n1`).
    pub name: String,
    incarnation: u32,
    /// Its node id (the name and incarnation).
    pub node_id: String,
    machine: Option<NodeMachine>,
    /// Its end, once over.
    pub end: Option<End>,
    /// Fencing is off for this node (the planted bug).
    pub broken_fence: bool,
    /// Its workers per round (the job's unless a script says otherwise).
    pub nproc: u32,
    /// The node rank it asks for (static rendezvous).
    pub rank: Option<u32>,
    /// Its `--topology` path.
    pub topology: String,
    session: Vec<u8>,
    stream: Option<u64>,
    inbox: VecDeque<Kind>,
    /// A lost or broken stream, said after its events.
    lost: Option<(String, bool)>,
    tripped: Option<String>,
    answered: Option<Duration>,
    outstanding: Vec<(u64, Duration, Call, Option<u64>)>,
    keep_alive_at: Option<Duration>,
    joining: Option<Joining>,
    rejoined: Option<Result<pb::Joined, AgentError>>,
    /// The held connection of a silent server, closed at its fence
    /// deadline (`.2`: which follows the peers' evidence, a drop limit
    /// past it, as the link's `hold` does).
    hold: Option<(Duration, u64, bool)>,
    /// This node's part of its round's peer hub, while the round's task runs.
    peer: Option<Peer>,
    /// What the peer task last published (`peers::Shared`): the vouch, when,
    /// and how long it counts.
    vouch: Option<(Vouch, Duration, Duration)>,
    /// The peers' evidence: until when they keep the workers.
    pub peers_until: Option<Duration>,
    /// The latest `peers_until` of the round (`peers::Shared::latest`).
    peers_latest: Option<Duration>,
    /// The evidence moved since the driver last read it (its watch).
    peers_moved: bool,
    /// Cut off from its round's peers (the hub's datagrams to and from it
    /// are lost), since.
    pub peer_cut: Option<Duration>,
    workers: Vec<Worker>,
    group: bool,
    exits: VecDeque<Exit>,
    stopping: Option<(Duration, Vec<Exit>)>,
    queue: VecDeque<Event>,
    /// The last deadline a timer event was given for.
    timer_for: Option<std::time::Instant>,
    /// Cut off from the server since.
    pub cut: Option<Duration>,
    delay: Duration,
    drop: f64,
    /// Only the server's answers are lost (its calls arrive).
    drop_answers: bool,
    held: Vec<Msg>,
    /// The root cause this node's summary named, if it failed.
    pub summary: Option<String>,
    /// Its round info while workers run.
    pub node_rank: Option<u32>,
    /// Rounds left in which its local rank 0 fails ([`Fault::Flaky`]).
    pub flaky: u32,
}

impl Node {
    /// The machine's phase, or `joining`, `crashed`, `exited`.
    pub fn state(&self) -> &'static str {
        match (&self.end, &self.machine) {
            (Some(End::Crashed), _) => "crashed",
            (Some(_), _) => "exited",
            (None, Some(m)) => m.phase_name(),
            (None, None) => "joining",
        }
    }

    /// Workers that run now.
    pub fn live_workers(&self) -> impl Iterator<Item = &Worker> {
        self.workers.iter().filter(|w| w.alive)
    }
}

/// Faults and commands that act on the world.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Worker `local` of node `node` exits with `code`.
    FailWorker {
        /// The node's index.
        node: usize,
        /// Its local rank.
        local: u32,
        /// The exit code.
        code: i32,
    },
    /// Every live worker of the node (or all) exits 0.
    Finish(Option<usize>),
    /// The agent is killed (its guard kills its workers).
    CrashNode(usize),
    /// A killed agent starts again (a new node id, the same host).
    RestartNode(usize),
    /// A stop signal to the agent.
    Signal(usize, Signal),
    /// The node is cut off from everything: the server and its peers.
    Partition(usize),
    /// The node cannot reach the server, nor the server it; its peers it can.
    CutServer(usize),
    /// The node's peer hub datagrams are lost, to and from it (a hub node
    /// still hears its own pings); the server it reaches.
    CutPeers(usize),
    /// Every link of the node works again.
    Heal(usize),
    /// The node's link to the server works again.
    HealServer(usize),
    /// The node's peer datagrams go through again.
    HealPeers(usize),
    /// The server process is stopped (SIGSTOP): calls wait in its buffers.
    PauseServer,
    /// It runs again (SIGCONT), noticing the gap as the registry does.
    ResumeServer,
    /// The server is killed.
    CrashServer,
    /// The server starts again: `true`, restoring the job from its record
    /// (a failover); `false`, relearning it from the nodes.
    RestartServer(bool),
    /// Extra one-way delay on a node's link.
    Delay(usize, Duration),
    /// Probability of losing a call of the node (it is never answered).
    Drop(usize, f64),
    /// Probability of losing the server's answers only on a node's link
    /// (its calls, joins included, arrive and take effect).
    DropAnswers(usize, f64),
    /// The node's local rank 0 exits 1 [`FLAKY_AFTER`] into each of the
    /// node's next `.1` rounds (a machine that keeps failing).
    Flaky(usize, u32),
    /// An operator ends the bench of the node's host
    /// (`rdzv-server quarantine release HOST`).
    Release(usize),
    /// The server crashes as soon as a node is told of a new round (a
    /// round formed, a restart), and is back (`Spec::failover`: a replica
    /// that takes over from the store) after the given time: the moment a
    /// write that decision needs is most likely under way.
    CrashOnRoundChange(Duration),
}

/// The simulated cluster.
#[derive(Debug)]
pub struct World {
    /// The job.
    pub spec: Spec,
    base: std::time::Instant,
    now: Duration,
    rng: fastrand::Rng,
    server: Server,
    /// The agents.
    pub nodes: Vec<Node>,
    flight: BinaryHeap<Reverse<(Duration, u64)>>,
    msgs: BTreeMap<u64, (u64, Msg)>,
    /// Per node and direction (to server, to node): when the last message
    /// arrives, so a link keeps order.
    fifo: Vec<(Duration, Duration)>,
    seq: u64,
    stalled: u32,
    next_pid: u32,
    /// Whether trace lines are kept.
    pub tracing: bool,
    trace: VecDeque<String>,
    /// Every trace line, when asked for.
    pub full_trace: Option<Vec<String>>,
    /// The invariants' bookkeeping.
    pub checker: Checker,
    /// The last checkpoint the workers saved (every rank of a node, as its
    /// reports say): where new workers resume.
    saved: u64,
    /// Scheduled faults, by time.
    pub schedule: Vec<(Duration, Fault)>,
}

fn session_bytes(rng: &mut fastrand::Rng) -> [u8; SESSION_BYTES] {
    let mut b = [0u8; SESSION_BYTES];
    rng.fill(&mut b);
    b
}

impl World {
    /// An empty cluster for `spec`; `seed` drives every random choice.
    pub fn new(spec: Spec, seed: u64) -> Self {
        let checker = Checker::new(&spec);
        let base = rendezvous_server::clock::epoch();
        let clock = Arc::new(ManualClock::starting_at(base));
        let mut server = Server {
            up: true,
            epoch: 0,
            registry: None,
            store: Arc::new(MemoryStore::new()),
            durable: true,
            clock,
            job_epoch: 0,
            streams: BTreeMap::new(),
            attempts: BTreeMap::new(),
            answers: BTreeMap::new(),
            flush_at: None,
            announced: 0,
            crash_armed: None,
            crash_due: None,
            world: 0,
            ticked: Duration::ZERO,
            paused: None,
            unread: Vec::new(),
        };
        // The first server: long before the job, so it holds nothing back.
        server.registry = Some(registry_for(&spec, &server));
        Self {
            spec,
            base,
            now: Duration::ZERO,
            rng: fastrand::Rng::with_seed(seed),
            server,
            nodes: Vec::new(),
            flight: BinaryHeap::new(),
            msgs: BTreeMap::new(),
            fifo: Vec::new(),
            seq: 0,
            stalled: 0,
            next_pid: 1000,
            tracing: true,
            trace: VecDeque::new(),
            full_trace: None,
            checker,
            schedule: Vec::new(),
            saved: 0,
        }
    }

    /// Node `i`'s workers' progress now, as its agent would report it
    /// (`accel_agent::progress`): its live workers, and `dying`, the one
    /// whose failure it reports. A worker steps every [`STEP`] from
    /// [`FIRST_STEP`] after its start, and saves a checkpoint every
    /// [`CHECKPOINT_EVERY`] steps.
    fn progress(&mut self, i: usize, dying: Option<u32>) -> Option<pb::Progress> {
        let now = self.now;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut ranks = Vec::new();
        for w in &self.nodes[i].workers {
            if !(w.alive || Some(w.pid) == dying) {
                continue;
            }
            let Some(stepping) = now.checked_sub(w.started + FIRST_STEP) else {
                continue;
            };
            let steps = ms(stepping) / ms(STEP);
            let step = w.resumed + steps + 1;
            let first = w.started + FIRST_STEP;
            let last = first + STEP * u32::try_from(steps).unwrap_or(u32::MAX);
            let saved = step / CHECKPOINT_EVERY * CHECKPOINT_EVERY;
            ranks.push((
                w.round,
                step,
                (saved > w.resumed).then_some(saved),
                first,
                last,
            ));
        }
        let (round, ..) = *ranks.first()?;
        let least = ranks.iter().min_by_key(|r| r.1)?;
        let checkpoint = ranks.iter().map(|r| r.2).collect::<Option<Vec<u64>>>();
        let checkpoint = checkpoint.and_then(|c| c.into_iter().min());
        self.saved = self.saved.max(checkpoint.unwrap_or(0));
        let first = ranks.iter().map(|r| r.3).min()?;
        let step_us = match self.spec.slow == Some(i) {
            true => ms(STEP) * 1500,
            false => ms(STEP) * 1000,
        };
        let rank_times = (0..ranks.len() as u32)
            .map(|local_rank| pb::RankTime {
                local_rank,
                step_us,
            })
            .collect();
        Some(pb::Progress {
            round,
            ranks: ranks.len() as u32,
            min_step: least.1,
            max_step: ranks.iter().map(|r| r.1).max().unwrap_or(0),
            checkpoint_step: checkpoint,
            first_step_ms_ago: ms(now.saturating_sub(first)),
            min_step_ms_ago: ms(now.saturating_sub(least.4)),
            hang_timeout_ms: 0,
            failing_step: None,
            rank_times,
        })
    }

    /// Virtual time since the start.
    pub fn now(&self) -> Duration {
        self.now
    }

    fn std(&self, at: Duration) -> std::time::Instant {
        self.base + at
    }

    /// The server's clock at virtual time `at`.
    pub fn instant(&self, at: Duration) -> std::time::Instant {
        self.std(at)
    }

    fn since(&self, t: std::time::Instant) -> Duration {
        t.saturating_duration_since(self.base)
    }

    /// Adds a trace line (when tracing).
    pub fn say(&mut self, line: impl FnOnce() -> String) {
        if !self.tracing {
            return;
        }
        let line = format!("{:>9.3}s {}", self.now.as_secs_f64(), line());
        if let Some(all) = &mut self.full_trace {
            all.push(line.clone());
        }
        if self.trace.len() == TRACE_KEEP {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    /// The recent trace, oldest first.
    pub fn recent(&self) -> String {
        let mut s = String::new();
        for l in &self.trace {
            let _ = writeln!(s, "  {l}");
        }
        s
    }

    /// `f` of the job as the server holds it, if it holds one.
    pub fn with_job<R>(&self, f: impl FnOnce(&Job) -> R) -> Option<R> {
        self.server.registry.as_ref()?.with_job(JOB, f)
    }

    /// The job's outcome as the server knows it: the phase of the job it
    /// holds (the registry keeps a finished job for a day here).
    pub fn outcome(&self) -> Option<Result<(), String>> {
        self.with_job(|job| match job.phase() {
            Phase::Succeeded => Some(Ok(())),
            Phase::Failed(r) => Some(Err(r.clone())),
            _ => None,
        })
        .flatten()
    }

    /// The last round's world size.
    pub fn world_size(&self) -> u32 {
        self.server.world
    }

    /// Which job the server holds: bumped whenever it is replaced.
    pub fn job_epoch(&self) -> u64 {
        self.server.job_epoch
    }

    /// Whether the server runs.
    pub fn server_up(&self) -> bool {
        self.server.up
    }

    /// The index of node `name`.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Whether every agent's life is over.
    pub fn all_done(&self) -> bool {
        !self.nodes.is_empty() && self.nodes.iter().all(|n| n.end.is_some())
    }

    /// Adds a node that joins now; `broken_fence`: the planted bug.
    pub fn add_node(&mut self, broken_fence: bool) -> usize {
        let rank = self.spec.static_ranks.then_some(self.nodes.len() as u32);
        self.add_node_with(broken_fence, self.spec.nproc, rank, String::new())
    }

    /// Adds a node that joins now with its own `--nproc-per-node`, (static
    /// rendezvous) node rank and `--topology` path.
    pub fn add_node_with(
        &mut self,
        broken_fence: bool,
        nproc: u32,
        rank: Option<u32>,
        topology: String,
    ) -> usize {
        let i = self.nodes.len();
        let name = format!("n{}", i + 1);
        self.nodes.push(Node {
            node_id: format!("{name}-1"),
            name,
            incarnation: 1,
            machine: None,
            end: None,
            broken_fence,
            nproc,
            rank,
            topology,
            session: Vec::new(),
            stream: None,
            inbox: VecDeque::new(),
            lost: None,
            tripped: None,
            answered: None,
            outstanding: Vec::new(),
            keep_alive_at: None,
            joining: None,
            rejoined: None,
            hold: None,
            peer: None,
            vouch: None,
            peers_until: None,
            peers_latest: None,
            peers_moved: false,
            peer_cut: None,
            workers: Vec::new(),
            group: false,
            exits: VecDeque::new(),
            stopping: None,
            queue: VecDeque::new(),
            timer_for: None,
            cut: None,
            delay: Duration::ZERO,
            drop: 0.0,
            drop_answers: false,
            held: Vec::new(),
            summary: None,
            node_rank: None,
            flaky: 0,
        });
        self.fifo.push((Duration::ZERO, Duration::ZERO));
        self.start_join(i, None, true);
        i
    }

    fn settings(&self, i: usize) -> Settings {
        let settings = Settings {
            nproc_per_node: self.nodes[i].nproc,
            ..self.spec.settings()
        };
        match self.nodes[i].broken_fence {
            true => settings.without_fencing(),
            false => settings,
        }
    }

    fn join_request(&self, i: usize, resume: Option<pb::Resume>) -> pb::JoinRequest {
        let s = &self.spec;
        let n = &self.nodes[i];
        pb::JoinRequest {
            job_id: JOB.into(),
            node_id: n.node_id.clone(),
            hostname: n.name.clone(),
            min_nodes: s.min_nodes,
            max_nodes: s.max_nodes,
            last_call_ms: s.last_call.as_millis() as u64,
            nproc_per_node: n.nproc,
            max_restarts: s.max_restarts,
            node_rank: n.rank,
            dead_after_ms: s.drop_limit().as_millis() as u64,
            resume,
            session: n.session.clone(),
            silent_replica: String::new(),
            topology: n.topology.clone(),
            no_restart_exit_code: 0,
            agent_version: String::new(),
            // As the agent says them (`agent::run`): zero, agents without a
            // peer hub.
            outage_ms: s.outage.as_millis() as u64,
            keep_alive_ms: s.keep_alive.as_millis() as u64,
            // Every simulated agent starts with its job: none is a new run
            // of a finished one (unknown reads as "started before the end").
            started_unix_ms: 0,
            max_no_progress_restarts: 0,
        }
    }

    fn start_join(&mut self, i: usize, resume: Option<pb::Resume>, first: bool) {
        let limit = match first {
            true => self.spec.join_timeout,
            false => self.spec.grace,
        };
        let n = &mut self.nodes[i];
        n.keep_alive_at = None;
        n.joining = Some(Joining {
            resume,
            first,
            deadline: self.now + limit,
            attempt: None,
            retry_at: self.now,
        });
    }

    // ---- the network -------------------------------------------------

    fn send(&mut self, link: usize, to_server: bool, msg: Msg) {
        let n = &self.nodes[link];
        // A connection's end is not a call that can go unanswered.
        let lossy = match &msg {
            Msg::Call { body, .. } => !matches!(body, Call::Closed(_) | Call::Abandon(_)),
            Msg::Reply { .. } | Msg::Joined { .. } => true,
            _ => false,
        };
        // Either the node's calls are lost (and never answered), or the
        // server's answers (its calls took effect).
        let lossy = lossy && n.drop_answers != to_server;
        if lossy && n.drop > 0.0 && self.rng.f64() < n.drop {
            self.say(|| format!("dropped {}", describe(&msg)));
            return;
        }
        let delay = self.spec.latency + n.delay;
        let last = match to_server {
            true => &mut self.fifo[link].0,
            false => &mut self.fifo[link].1,
        };
        let at = (self.now + delay).max(*last);
        *last = at;
        self.seq += 1;
        self.flight.push(Reverse((at, self.seq)));
        self.msgs.insert(self.seq, (self.server.epoch, msg));
    }

    fn call(&mut self, i: usize, body: Call) {
        let n = &self.nodes[i];
        if n.end.is_some() {
            return;
        }
        self.seq += 1;
        let id = self.seq;
        let msg = Msg::Call {
            from: i,
            node_id: n.node_id.clone(),
            session: n.session.clone(),
            id,
            body: body.clone(),
        };
        let stream = n.stream;
        if !matches!(
            body,
            Call::Leave(_) | Call::Closed(_) | Call::Abandon(_) | Call::Join(..)
        ) {
            let at = self.now;
            self.nodes[i].outstanding.push((id, at, body, stream));
        }
        self.send(i, true, msg);
    }

    /// Sends a peer hub datagram: the link's latency, no order kept, no
    /// server in the way.
    fn send_peer(&mut self, msg: Msg) {
        let at = self.now + self.spec.latency;
        self.seq += 1;
        self.flight.push(Reverse((at, self.seq)));
        self.msgs.insert(self.seq, (self.server.epoch, msg));
    }

    /// Delivers one message that arrived now.
    fn arrive(&mut self, epoch: u64, msg: Msg) {
        let link = match &msg {
            Msg::Call { from, .. } => *from,
            Msg::Reply { to, .. }
            | Msg::Joined { to, .. }
            | Msg::Stream { to, .. }
            | Msg::StreamEnd { to, .. } => *to,
            Msg::Ping { .. } | Msg::Answer { .. } => return self.peer_arrive(msg),
        };
        // What the last server incarnation sent or was sent is gone.
        if (epoch != self.server.epoch || !self.server.up)
            && !matches!(msg, Msg::StreamEnd { silent: true, .. })
        {
            return;
        }
        if self.nodes[link].cut.is_some() {
            if matches!(msg, Msg::Stream { .. } | Msg::StreamEnd { .. }) {
                self.nodes[link].held.push(msg);
            }
            return;
        }
        if let (Some(_), Msg::Call { body, from, .. }) = (self.server.paused, &msg) {
            // A paused server reads nothing: the call waits in its buffers.
            // A join attempt the node gave up before the server read it
            // goes with its cancellation: the server reads the request and
            // the stream's reset together when it wakes, and a stream reset
            // before its handler runs never runs it (h2). Were it read
            // first, its cancelled stream's end would drop the node at once
            // (`known_abandoned_rejoin.sim`, open), and every pause longer
            // than the silence bound would drop every node.
            if let Call::Abandon(attempt) = body {
                let (attempt, from) = (*attempt, *from);
                let before = self.server.unread.len();
                self.server.unread.retain(|m| {
                    !matches!(m, Msg::Call { from: f, body: Call::Join(_, a), .. } if *f == from && *a == attempt)
                });
                if self.server.unread.len() < before {
                    return;
                }
            }
            self.server.unread.push(msg);
            return;
        }
        match msg {
            Msg::Call {
                from,
                node_id,
                session,
                id,
                body,
            } => self.serve(from, &node_id, &session, id, body),
            Msg::Reply { to, id, ok } => self.replied(to, id, ok),
            Msg::Joined {
                to,
                attempt,
                result,
            } => self.joined(to, attempt, result),
            Msg::Stream { to, stream, kind } => {
                let n = &mut self.nodes[to];
                if n.stream == Some(stream) && n.end.is_none() {
                    n.inbox.push_back(kind);
                }
            }
            Msg::StreamEnd { to, stream, silent } => {
                let n = &mut self.nodes[to];
                if n.stream == Some(stream) && n.end.is_none() && n.lost.is_none() {
                    n.lost = Some(match silent {
                        true => ("lost the rendezvous: the connection was reset".into(), true),
                        false => ("the rendezvous ended this node's session".into(), false),
                    });
                }
            }
            Msg::Ping { .. } | Msg::Answer { .. } => {}
        }
    }

    // ---- the peer hub ---------------------------------------------------

    /// Whether a peer datagram between nodes `a` and `b` is lost: either
    /// is cut off from its peers (a hub node's own pings never are).
    fn peer_lost(&self, a: usize, b: usize) -> bool {
        a != b && (self.nodes[a].peer_cut.is_some() || self.nodes[b].peer_cut.is_some())
    }

    /// A ping or an answer arrives, as the agent's `peers::run` reads it.
    fn peer_arrive(&mut self, msg: Msg) {
        let now = self.std(self.now);
        match msg {
            Msg::Ping {
                from,
                to,
                key,
                rank,
                seq,
                version,
            } => {
                if self.peer_lost(from, to) || self.nodes[to].end.is_some() {
                    return;
                }
                let Some(p) = self.nodes[to].peer.as_mut().filter(|p| p.key == key) else {
                    return;
                };
                let Some(hub) = &mut p.hub else { return };
                if !hub.ping(now, rank, seq) {
                    return;
                }
                let (heard, version, map) = hub.answer(version);
                let map = map.map(<[u8]>::to_vec);
                self.send_peer(Msg::Answer {
                    from: to,
                    to: from,
                    key,
                    rank,
                    seq,
                    heard,
                    version,
                    map,
                });
                self.publish(to);
            }
            Msg::Answer {
                from,
                to,
                key,
                rank,
                seq,
                heard,
                version,
                map,
            } => {
                if self.peer_lost(from, to) || self.nodes[to].end.is_some() {
                    return;
                }
                let Some(p) = self.nodes[to].peer.as_mut().filter(|p| p.key == key) else {
                    return;
                };
                if rank == p.rank {
                    p.view.answer(now, seq, heard, version, map.as_deref());
                }
                self.publish(to);
            }
            _ => {}
        }
    }

    /// Node `i`'s peer task ticks: a ping to the hub, and the hub's sweep.
    fn peer_tick(&mut self, i: usize) {
        let now = self.now;
        let tk = self.std(now);
        let Some(p) = self.nodes[i].peer.as_mut().filter(|p| p.next <= now) else {
            return;
        };
        p.next = now + p.timing.every;
        let (seq, version) = p.view.ping(tk);
        let ping = p.hub_at.map(|to| Msg::Ping {
            from: i,
            to,
            key: p.key.clone(),
            rank: p.rank,
            seq,
            version,
        });
        if let Some(hub) = &mut p.hub {
            hub.sweep(tk);
        }
        if let Some(ping) = ping {
            self.send_peer(ping);
        }
        self.publish(i);
    }

    /// What the peer task publishes after each step (`peers::Shared`): the
    /// vouch for the keep-alives, and the evidence's deadline given the
    /// node's last contact with the rendezvous (its fence clock).
    fn publish(&mut self, i: usize) {
        let now = self.std(self.now);
        let base = self.base;
        let n = &mut self.nodes[i];
        let Some(p) = &n.peer else { return };
        let t = p.timing;
        n.vouch = p
            .view
            .vouch(now, p.round)
            .map(|v| ((v.round, v.ranks, v.all), self.now, t.fresh));
        let contact = n.answered.map(|a| base + a);
        let until = contact
            .and_then(|c| {
                p.view
                    .majority(now, t.lag)
                    .and_then(|sent| t.keeps_until(sent, c))
            })
            .map(|u| u.saturating_duration_since(base));
        if until != n.peers_until {
            n.peers_until = until;
            n.peers_moved = true;
        }
        if let Some(u) = until {
            n.peers_latest = Some(n.peers_latest.map_or(u, |l| l.max(u)));
        }
    }

    /// Node `i`'s round starts: its peer task for the round (node rank 0
    /// serves the hub), as the agent's `start_peers`.
    fn start_peers(&mut self, i: usize, info: &accel_agent::agent::round::RoundInfo) {
        self.end_peers(i);
        let Some(timing) = self.spec.timing(info.nnodes) else {
            return;
        };
        if info.peer_key.is_empty() || info.node_rank >= info.nnodes {
            return;
        }
        let hub_at = info
            .master_addr
            .strip_suffix(".host")
            .and_then(|id| self.index_of(id));
        let hub = (info.node_rank == 0).then(|| Hub::new(info.nnodes, timing.fresh));
        self.nodes[i].peer = Some(Peer {
            key: info.peer_key.clone(),
            round: info.round,
            rank: info.node_rank,
            hub_at,
            timing,
            hub,
            view: View::new(info.node_rank, info.nnodes, timing.fresh),
            next: self.now,
        });
    }

    /// The round's peer task ends (a new offer, the agent's end): nothing
    /// is vouched for or kept any more.
    fn end_peers(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.peer = None;
        n.vouch = None;
        n.peers_latest = None;
        if n.peers_until.take().is_some() {
            n.peers_moved = true;
        }
    }

    // ---- the server -------------------------------------------------

    fn reply(&mut self, to: usize, id: u64, ok: Result<(), Refusal>) {
        self.send(to, false, Msg::Reply { to, id, ok });
    }

    /// The server's clock now.
    fn server_now(&self) -> std::time::Instant {
        self.server.clock.now().at
    }

    fn serve(&mut self, from: usize, node_id: &str, session: &[u8], id: u64, body: Call) {
        if let Call::Join(req, attempt) = body {
            return self.serve_join(from, *req, attempt);
        }
        let Some(registry) = self.server.registry.clone() else {
            return;
        };
        let now = self.server_now();
        let closed = match body {
            Call::Closed(stream) => Some(stream),
            Call::Abandon(attempt) => self
                .server
                .attempts
                .remove(&attempt)
                .filter(|(id, _)| id == node_id)
                .map(|(_, stream)| stream),
            _ => None,
        };
        if matches!(body, Call::Closed(_) | Call::Abandon(_)) {
            let Some(stream) = closed else { return };
            if self.server.answers.remove(&stream).is_some() {
                self.say(|| format!("server: {node_id}'s join was cancelled"));
                self.after(&registry);
            } else if self.server.streams.get(node_id).map(|s| s.0) == Some(stream) {
                // Its end tells the registry (`NodeStream`'s drop): the
                // node departs, if that stream is still its current one.
                self.server.streams.remove(node_id);
                self.say(|| format!("server: {node_id}'s connection ended"));
                self.after(&registry);
            }
            return;
        }
        use rendezvous_server::error::Error;
        let member = |r: Result<(), Error>| -> Result<(), Refusal> {
            match r {
                Err(Error::WrongSession(..)) => Err(Refusal::Denied),
                Err(Error::UnknownJob(_) | Error::UnknownNode(..)) => Err(Refusal::NotFound),
                _ => Ok(()),
            }
        };
        let result: Result<(), Refusal> = match &body {
            Call::KeepAlive(vouch, progress) => {
                let req = pb::KeepAliveRequest {
                    job_id: JOB.into(),
                    node_id: node_id.into(),
                    session: session.to_vec(),
                    round: vouch.as_ref().map_or(0, |v| v.0),
                    vouch: vouch.as_ref().map(|v| v.1.clone()).unwrap_or_default(),
                    vouch_all: vouch.as_ref().is_some_and(|v| v.2),
                    progress: progress.clone(),
                };
                let with = (vouch.is_some() || progress.is_some()).then_some(&req);
                member(
                    registry
                        .keep_alive_vouching(now, JOB, node_id, session, with)
                        .map(|_| ()),
                )
            }
            Call::Ready(round) => member(registry.for_node(now, JOB, node_id, session, |job| {
                let out = job.ready(
                    now,
                    node_id,
                    *round,
                    (format!("{node_id}.host"), 29500),
                    None,
                );
                ((), out)
            })),
            Call::Failure {
                round,
                reason,
                detail,
                progress,
            } => member(registry.for_node(now, JOB, node_id, session, |job| {
                // `service.rs` `report_failure`.
                let mut out = match progress {
                    Some(p) => job.report_progress(now, node_id, p),
                    None => Vec::new(),
                };
                let host = job
                    .members()
                    .get(node_id)
                    .map(|m| m.hostname.clone())
                    .unwrap_or_default();
                let reason = format!(
                    "worker rank {} (local rank {}) on host '{host}' {reason}",
                    detail.rank, detail.local_rank
                );
                out.extend(job.failure(now, node_id, *round, reason, Some(detail.clone())));
                ((), out)
            })),
            Call::Fenced(round, reason) => {
                member(registry.for_node(now, JOB, node_id, session, |job| {
                    let out = job.fenced(now, node_id, *round, reason);
                    ((), out)
                }))
            }
            Call::Success(round) => member(registry.for_node(now, JOB, node_id, session, |job| {
                let out = job.success(now, node_id, *round);
                ((), out)
            })),
            Call::Leave(reason) => {
                let r = registry.leave(now, JOB, node_id, session, reason, false);
                // A node that left has no stream to end: its own leaving
                // closed it.
                if r.is_ok() {
                    self.server.streams.remove(node_id);
                }
                match member(r) {
                    Err(Refusal::NotFound) => Ok(()),
                    other => other,
                }
            }
            Call::Join(..) | Call::Closed(_) | Call::Abandon(_) => Ok(()),
        };
        let what = body.name();
        if result.is_ok() {
            self.say(|| format!("server: {what} from {node_id}"));
        }
        self.reply(from, id, result);
        self.after(&registry);
    }

    fn serve_join(&mut self, from: usize, req: pb::JoinRequest, attempt: u64) {
        let Some(registry) = self.server.registry.clone() else {
            return;
        };
        let now = self.server_now();
        let node_id = req.node_id.clone();
        let held = registry
            .with_job(JOB, |j| !j.phase().is_terminal())
            .unwrap_or(false);
        let fresh = Session::from_bytes(session_bytes(&mut self.rng));
        match registry.join(now, &req, None, fresh) {
            Err(e) => {
                let why = e.to_string();
                self.say(|| format!("server: refused {node_id}: {why}"));
                self.send(
                    from,
                    false,
                    Msg::Joined {
                        to: from,
                        attempt,
                        result: Err(why),
                    },
                );
            }
            Ok(stream) => {
                // A job this join created (or relearned from its node).
                let created =
                    !held && registry.with_job(JOB, |j| !j.phase().is_terminal()) == Some(true);
                if created {
                    if let Some(resume) = &req.resume {
                        self.say(|| format!("server: relearns the job from {node_id}"));
                        self.checker.new_job(Some(resume.round));
                    } else {
                        self.checker.new_job(None);
                    }
                    self.server.job_epoch += 1;
                }
                // Its first event is the join's answer, sent once the store
                // holds the join (with one).
                self.seq += 1;
                let number = self.seq;
                self.server
                    .attempts
                    .insert(attempt, (node_id.clone(), number));
                self.server
                    .answers
                    .insert(number, (from, attempt, node_id, stream));
                self.after(&registry);
            }
        }
    }

    /// What follows every call: the store takes the changes (the events
    /// they caused are released only then), the streams' events go out, the
    /// checker hears of benches, and the planted quarantine bug acts.
    fn after(&mut self, registry: &Registry) {
        match self.spec.store_latency.is_zero() || !self.server.durable {
            true => self.flush(registry),
            false if self.server.flush_at.is_none() => {
                self.server.flush_at = Some(self.now + self.spec.store_latency);
            }
            false => {}
        }
        if self.spec.broken_quarantine {
            // The planted bug: every bench ends as soon as it begins.
            let now = self.server_now();
            let hosts: Vec<String> = registry
                .with_job(JOB, |j| {
                    j.quarantine().benched().map(|(h, _)| h.clone()).collect()
                })
                .unwrap_or_default();
            for h in hosts {
                let _ = registry.quarantine(now, JOB, &h);
            }
            if self.spec.failover {
                self.flush(registry);
            }
        }
        self.pump(registry);
    }

    /// The server's flusher: with a store, every change is written (the
    /// store answers at once) and the events it held are released.
    /// The checker hears of the benches then: a bench a crash loses
    /// before it is written was never one (nobody heard of it).
    fn flush(&mut self, registry: &Registry) {
        self.server.flush_at = None;
        if self.server.durable {
            if let Err(e) = ready(registry.flush()) {
                self.say(|| format!("server: the store refused a write: {e}"));
            }
        }
        self.note_benches(registry);
    }

    /// Tells the checker the hosts the job benched, and until when.
    fn note_benches(&mut self, registry: &Registry) {
        let base = self.base;
        let benches: Vec<(String, Duration)> = registry
            .with_job(JOB, |job| {
                job.quarantine()
                    .benched()
                    .map(|(h, b)| (h.clone(), b.until.saturating_duration_since(base)))
                    .collect()
            })
            .unwrap_or_default();
        for (host, until) in benches {
            self.checker.benched(host, until);
        }
    }

    /// Sends what every node's stream holds, and the end of the streams
    /// the registry ended.
    fn pump(&mut self, registry: &Registry) {
        self.answer_joins();
        let mut sends = Vec::new();
        let mut ended = Vec::new();
        for (node, (number, stream)) in &mut self.server.streams {
            loop {
                match poll_stream(stream) {
                    Polled::Event(kind) => sends.push((node.clone(), *number, kind)),
                    Polled::Empty => break,
                    Polled::Ended => {
                        ended.push((node.clone(), *number));
                        break;
                    }
                }
            }
        }
        let mut said_over = false;
        for (node, number, kind) in sends {
            self.checker.outbound(&kind);
            let told = match &kind {
                Kind::RoundComplete(r) => Some(r.round),
                Kind::RestartRequested(r) => Some(r.next_round),
                _ => None,
            };
            if let Some(told) = told {
                self.server.announced = self.server.announced.max(told);
                if let Some(after) = self.server.crash_armed.take() {
                    self.server.crash_due = Some(after);
                }
            }
            if let Kind::RoundComplete(r) = &kind {
                self.server.world = r.world_size;
                let (host, benched) = registry
                    .with_job(JOB, |job| {
                        let m = job.members().get(&node);
                        (
                            m.map_or(String::new(), |m| m.hostname.clone()),
                            m.is_some_and(|m| job.is_benched(m)),
                        )
                    })
                    .unwrap_or_default();
                let at = self.now;
                self.checker.placed(&host, &node, r, benched, at);
            }
            if let (Kind::JobSucceeded(_) | Kind::JobFailed(_), false) = (&kind, said_over) {
                said_over = true;
                let over = registry.with_job(JOB, |j| format!("{:?}", j.phase()));
                if let Some(phase) = over {
                    self.say(|| format!("server: the job is over: {phase}"));
                }
            }
            let Some(to) = self.index_of(&node) else {
                continue;
            };
            self.say(|| format!("server -> {node}: {}", kind_name(&kind)));
            self.send(
                to,
                false,
                Msg::Stream {
                    to,
                    stream: number,
                    kind,
                },
            );
        }
        for (node, number) in ended {
            self.server.streams.remove(&node);
            if let Some(to) = self.index_of(&node) {
                self.say(|| format!("server: ends {node}'s stream"));
                self.send(
                    to,
                    false,
                    Msg::StreamEnd {
                        to,
                        stream: number,
                        silent: false,
                    },
                );
            }
        }
    }

    /// Answers the joins whose `Joined` came out of the registry: the
    /// stream becomes the node's (a job that is over: the answer is all).
    fn answer_joins(&mut self) {
        let numbers: Vec<u64> = self.server.answers.keys().copied().collect();
        for number in numbers {
            let Some((from, attempt, node, mut stream)) = self.server.answers.remove(&number)
            else {
                continue;
            };
            let joined = match poll_stream(&mut stream) {
                Polled::Event(Kind::Joined(j)) => j,
                Polled::Empty => {
                    self.server
                        .answers
                        .insert(number, (from, attempt, node, stream));
                    continue;
                }
                other => {
                    let what = match other {
                        Polled::Ended => "its stream ended",
                        _ => "another event came first",
                    };
                    self.say(|| format!("server: {node}'s join got no answer: {what}"));
                    continue;
                }
            };
            self.say(|| {
                format!(
                    "server: {node} joined (round {}, resumed {})",
                    joined.round, joined.resumed
                )
            });
            if joined.over.is_none() {
                self.server.streams.insert(node, (number, stream));
            }
            self.send(
                from,
                false,
                Msg::Joined {
                    to: from,
                    attempt,
                    result: Ok((number, joined)),
                },
            );
        }
    }

    fn index_of(&self, node_id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.node_id == node_id)
    }

    /// When the server next runs its periodic work: the registry's next
    /// deadline, and at least every [`SERVER_TICK`] (as its ticker does, so
    /// that it never takes its own quiet for a pause of the process).
    fn server_deadline(&self) -> Option<Duration> {
        if !self.server.up || self.server.paused.is_some() {
            return None;
        }
        let registry = self.server.registry.as_ref()?;
        let heartbeat = self.server.ticked + SERVER_TICK;
        let due = registry
            .next_deadline()
            .map(|t| t.saturating_duration_since(self.base).max(self.now));
        Some(due.map_or(heartbeat, |d| d.min(heartbeat)))
    }

    fn server_tick(&mut self) {
        self.server.ticked = self.now;
        let Some(registry) = self.server.registry.clone() else {
            return;
        };
        let before = registry.with_job(JOB, |j| j.members().len()).unwrap_or(0);
        registry.tick(self.server_now());
        let after = registry.with_job(JOB, |j| j.members().len()).unwrap_or(0);
        let lost = before.saturating_sub(after);
        if lost > 0 {
            self.say(|| format!("server: dropped {lost} silent node(s)"));
        }
        self.after(&registry);
    }

    // ---- the agents ---------------------------------------------------

    fn replied(&mut self, to: usize, id: u64, ok: Result<(), Refusal>) {
        let n = &mut self.nodes[to];
        let Some(at) = n.outstanding.iter().position(|c| c.0 == id) else {
            return; // answered after it timed out
        };
        let (_, sent, call, stream) = n.outstanding.remove(at);
        match ok {
            Ok(()) => n.answered = Some(n.answered.map_or(sent, |a| a.max(sent))),
            Err(Refusal::NotFound) if matches!(call, Call::KeepAlive(..)) => {
                if n.stream == stream && n.lost.is_none() {
                    n.lost = Some((
                        "the rendezvous no longer knows this node: keep-alive refused".into(),
                        false,
                    ));
                }
                n.keep_alive_at = None;
            }
            Err(Refusal::NotFound) if matches!(call, Call::Ready(_)) => {
                // Not the server's silence: the driver fails the agent.
                self.end_node(
                    to,
                    End::Error(1, "the rendezvous did not accept this node as ready".into()),
                );
            }
            Err(_) => {}
        }
    }

    fn joined(&mut self, to: usize, attempt: u64, result: Result<(u64, pb::Joined), String>) {
        let n = &mut self.nodes[to];
        let Some(j) = &n.joining else { return };
        if j.attempt.map(|a| a.0) != Some(attempt) || n.end.is_some() {
            return;
        }
        let first = j.first;
        let Some(j) = n.joining.take() else { return };
        // `join_step` sets `retry_at` to the attempt's send time.
        let sent = j.retry_at;
        match result {
            Err(why) => {
                let e = AgentError::Rejected {
                    code: tonic::Code::FailedPrecondition,
                    message: why,
                };
                match first {
                    true => {
                        // Refused before it took part: not one of the job's agents.
                        self.checker.excused.insert(to);
                        self.end_node(to, End::Error(e.exit_code(), e.to_string()));
                    }
                    false => n.rejoined = Some(Err(e)),
                }
            }
            Ok((stream, joined)) => {
                if let Some(over) = joined.over.clone() {
                    n.stream = None;
                    match first {
                        true => {
                            let outcome = match over.succeeded {
                                true => Outcome::Succeeded,
                                false => Outcome::Failed(over.reason),
                            };
                            self.say(|| format!("{to}: the job was over when it joined"));
                            self.end_node(to, End::Outcome(outcome));
                        }
                        false => n.rejoined = Some(Ok(joined)),
                    }
                    return;
                }
                n.stream = Some(stream);
                n.session.clone_from(&joined.session);
                n.inbox.clear();
                n.lost = None;
                n.tripped = None;
                n.outstanding.clear();
                n.answered = Some(n.answered.map_or(sent, |a| a.max(sent)));
                n.keep_alive_at = Some(self.now + self.spec.keep_alive);
                match first {
                    true => {
                        let settings = self.settings(to);
                        let (machine, actions) =
                            NodeMachine::new(settings, self.std(self.now), joined.round);
                        self.nodes[to].machine = Some(machine);
                        self.perform(to, actions);
                    }
                    false => n.rejoined = Some(Ok(joined)),
                }
            }
        }
    }

    fn end_node(&mut self, i: usize, end: End) {
        let n = &mut self.nodes[i];
        if n.end.is_some() {
            return;
        }
        let stream = n.stream.take();
        let name = n.name.clone();
        let e = end.clone();
        self.say(|| format!("{name} ends: {e:?}"));
        if end == End::Crashed {
            // Its guard kills its workers.
            let pids: Vec<u32> = self.nodes[i]
                .workers
                .iter()
                .filter(|w| w.alive)
                .map(|w| w.pid)
                .collect();
            for w in &mut self.nodes[i].workers {
                w.alive = false;
            }
            for pid in pids {
                self.checker.died(pid);
            }
        }
        self.checker.ended_in.insert(i, self.checker.generation);
        self.end_peers(i);
        let n = &mut self.nodes[i];
        n.machine = None;
        n.joining = None;
        n.keep_alive_at = None;
        n.outstanding.clear();
        n.stopping = None;
        n.queue.clear();
        n.end = Some(end);
        let node_id = n.node_id.clone();
        if let Some(stream) = stream {
            // Its connection ends with the process.
            let msg = Msg::Call {
                from: i,
                node_id,
                session: Vec::new(),
                id: 0,
                body: Call::Closed(stream),
            };
            self.send(i, true, msg);
        }
    }

    fn perform(&mut self, i: usize, actions: Vec<Action>) {
        for action in actions {
            if self.nodes[i].end.is_some() {
                return;
            }
            let name = self.nodes[i].name.clone();
            self.say(|| format!("{name}: {}", action_name(&action)));
            match action {
                Action::Offer { round } => {
                    // The last round's peer hub ends with the round.
                    self.end_peers(i);
                    self.call(i, Call::Ready(round));
                }
                Action::Start { info, .. } => {
                    self.start_peers(i, &info);
                    let n = &mut self.nodes[i];
                    n.node_rank = Some(info.node_rank);
                    let mut started = Vec::new();
                    let flaky = n.flaky > 0;
                    n.flaky = n.flaky.saturating_sub(1);
                    for local in 0..self.nodes[i].nproc {
                        self.next_pid += 1;
                        let ends = match (flaky && local == 0, self.spec.run) {
                            (true, _) => Some((self.now + FLAKY_AFTER, Ended::Exited(1))),
                            (false, run) => run.map(|d| (self.now + d, Ended::Exited(0))),
                        };
                        let w = Worker {
                            local_rank: local,
                            rank: info.base_rank + local,
                            round: info.round,
                            pid: self.next_pid,
                            alive: true,
                            ends,
                            started: self.now,
                            resumed: self.saved,
                        };
                        started.push(w);
                    }
                    for w in &started {
                        self.checker.started(&self.nodes, i, w, &info, self.now);
                    }
                    let n = &mut self.nodes[i];
                    n.workers = started;
                    n.group = true;
                    n.exits.clear();
                }
                Action::Stop { signal, grace } => {
                    let n = &mut self.nodes[i];
                    if !n.group {
                        n.queue.push_back(Event::Stopped(Vec::new()));
                        continue;
                    }
                    n.group = false;
                    let mut exits: Vec<Exit> = n.exits.drain(..).collect();
                    let after = match signal {
                        Signal::SIGKILL => Duration::ZERO,
                        _ => self.spec.term.min(grace),
                    };
                    // A worker honours the stop signal within `term`; past
                    // the grace it is SIGKILLed.
                    let ended = match signal == Signal::SIGKILL || self.spec.term > grace {
                        true => Ended::Signaled(Signal::SIGKILL as i32),
                        false => Ended::Signaled(signal as i32),
                    };
                    for w in n.workers.iter().filter(|w| w.alive) {
                        exits.push(Exit {
                            local_rank: w.local_rank,
                            global_rank: w.rank,
                            pid: w.pid,
                            ended,
                        });
                    }
                    n.stopping = Some((self.now + after, exits));
                    if after.is_zero() {
                        self.finish_stop(i);
                    }
                }
                Action::Kill => {
                    if let Some((at, _)) = &mut self.nodes[i].stopping {
                        *at = self.now;
                        self.finish_stop(i);
                    }
                }
                Action::ReportFailure { round, exit } => {
                    let detail = pb::Failure {
                        host: name.clone(),
                        rank: exit.global_rank,
                        local_rank: exit.local_rank,
                        exitcode: exit.ended.code(),
                        pid: exit.pid,
                        error_file: "<N/A>".into(),
                        ..pb::Failure::default()
                    };
                    let reason = exit.ended.to_string();
                    let progress = self.progress(i, Some(exit.pid));
                    self.call(
                        i,
                        Call::Failure {
                            round,
                            reason,
                            detail,
                            progress,
                        },
                    );
                }
                Action::ReportStartFailure {
                    round,
                    local_rank,
                    global_rank,
                    message,
                } => {
                    let detail = pb::Failure {
                        host: name.clone(),
                        rank: global_rank,
                        local_rank,
                        exitcode: 127,
                        ..pb::Failure::default()
                    };
                    self.call(
                        i,
                        Call::Failure {
                            round,
                            reason: message,
                            detail,
                            progress: None,
                        },
                    );
                }
                Action::ReportFenced { round, reason } => self.call(i, Call::Fenced(round, reason)),
                Action::Note(_) => {}
                Action::ReportSuccess { round } => self.call(i, Call::Success(round)),
                Action::Rejoin { resume } => {
                    let n = &mut self.nodes[i];
                    n.inbox.clear();
                    n.lost = None;
                    n.tripped = None;
                    self.start_join(i, resume, false);
                }
                Action::Leave { reason } => self.call(i, Call::Leave(reason)),
                Action::Summarize { root } => {
                    self.nodes[i].summary = Some(
                        root.map(|f| format!("rank {} on {}", f.rank, f.host))
                            .unwrap_or_default(),
                    );
                }
                Action::Exit(result) => {
                    let end = match result {
                        Ok(o) => End::Outcome(o),
                        Err(e) => End::Error(e.exit_code(), e.to_string()),
                    };
                    self.end_node(i, end);
                }
            }
        }
    }

    fn finish_stop(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let Some((_, exits)) = n.stopping.take() else {
            return;
        };
        let mut dead = Vec::new();
        for w in &mut n.workers {
            if w.alive {
                w.alive = false;
                dead.push(w.pid);
            }
        }
        n.node_rank = None;
        n.queue.push_back(Event::Stopped(exits));
        if !dead.is_empty() {
            let (name, at) = (n.name.clone(), self.now);
            self.checker.stopped(&name, dead.len(), at);
        }
        for pid in dead {
            self.checker.died(pid);
        }
    }

    /// Feeds node `i`'s machine what its phase listens to, until nothing is
    /// ready.
    fn drive(&mut self, i: usize) {
        for _ in 0..10_000 {
            let n = &mut self.nodes[i];
            if n.end.is_some() {
                return;
            }
            let Some(machine) = &n.machine else { return };
            let src = machine.sources();
            let deadline = machine.deadline();
            let now = self.now;
            let event = if let Some(e) = n.queue.pop_front() {
                e
            } else {
                let mut ready: [bool; 6] = [false; 6];
                // [0]: a stop's end comes through the queue (`finish_stop`).
                ready[1] = src.rejoin && n.rejoined.is_some();
                ready[2] = src.workers && !n.exits.is_empty();
                ready[3] =
                    src.stream && (!n.inbox.is_empty() || n.tripped.is_some() || n.lost.is_some());
                let due = deadline.filter(|d| {
                    d.saturating_duration_since(self.base) <= now && n.timer_for != Some(*d)
                });
                ready[4] = due.is_some();
                // [5]: the peers' evidence moved (the driver's watch).
                ready[5] = src.peers && n.peers_moved;
                let count = ready.iter().filter(|r| **r).count();
                if count == 0 {
                    return;
                }
                let mut pick = self.rng.usize(..count);
                let which = ready
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| **r)
                    .find(|_| {
                        let hit = pick == 0;
                        pick = pick.saturating_sub(1);
                        hit
                    })
                    .map(|(k, _)| k)
                    .unwrap_or(4);
                let n = &mut self.nodes[i];
                match which {
                    1 => match n.rejoined.take() {
                        Some(Ok(j)) => match j.over {
                            Some(over) => Event::Over(over),
                            None => Event::Rejoined {
                                round: j.round,
                                resumed: j.resumed,
                            },
                        },
                        Some(Err(e)) => Event::RejoinFailed(e),
                        None => continue,
                    },
                    2 => match n.exits.pop_front() {
                        Some(e) => Event::Exited(e),
                        None => continue,
                    },
                    3 => {
                        if let Some(why) = n.tripped.take() {
                            let since = n.answered.unwrap_or(now);
                            self.silent(i, since);
                            Event::Silent {
                                why,
                                since: self.std(since),
                            }
                        } else if let Some(kind) = n.inbox.pop_front() {
                            Event::Message(kind)
                        } else if let Some((why, silent)) = n.lost.take() {
                            match silent {
                                true => {
                                    let since = n.answered.unwrap_or(now);
                                    self.silent(i, since);
                                    Event::Silent {
                                        why,
                                        since: self.std(since),
                                    }
                                }
                                false => {
                                    // The stream is over; its connection closes with the link.
                                    if let Some(stream) = n.stream.take() {
                                        n.hold = Some((now, stream, false));
                                    }
                                    Event::Lost(why)
                                }
                            }
                        } else {
                            continue;
                        }
                    }
                    5 => {
                        n.peers_moved = false;
                        match n.peers_until {
                            Some(until) => Event::Vouched(self.std(until)),
                            None => continue,
                        }
                    }
                    _ => {
                        n.timer_for = due;
                        Event::Timer
                    }
                }
            };
            let name = self.nodes[i].name.clone();
            let base = self.base;
            self.say(|| format!("{name} <- {}", event_name(&event, base)));
            let now = self.std(self.now);
            let Some(machine) = &mut self.nodes[i].machine else {
                return;
            };
            let actions = machine.step(now, event);
            self.perform(i, actions);
        }
        self.checker.note(
            'c',
            "a node's driver did not settle (a busy loop)",
            self.now,
        );
    }

    /// When node `i`'s fence falls: the send time of the last call its
    /// server answered plus the fence (`None`: fencing off, or nothing
    /// answered yet).
    fn stop_fence(&self, i: usize) -> Option<Duration> {
        let settings = self.settings(i);
        let a = self.nodes[i].answered?;
        settings.fence.then(|| a + settings.fence_in())
    }

    /// The node took its server for silent: the old connection stays open
    /// until the fence deadline, and keep-alives stop.
    fn silent(&mut self, i: usize, since: Duration) {
        let drop_limit = self.spec.drop_limit();
        let n = &mut self.nodes[i];
        n.keep_alive_at = None;
        if let Some(stream) = n.stream.take() {
            n.hold = Some((since + drop_limit, stream, true));
        }
    }

    // ---- time ---------------------------------------------------------

    fn next_event(&self) -> Option<Duration> {
        let mut t: Option<Duration> = None;
        let mut at = |x: Option<Duration>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        at(self.flight.peek().map(|Reverse((t, _))| *t));
        at(self.server_deadline());
        at(self
            .server
            .flush_at
            .filter(|_| self.server.up && self.server.paused.is_none()));
        at(self.server.crash_due.map(|_| self.now));
        at(self.schedule.first().map(|(t, _)| *t));
        let silence = self.spec.silence();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.end.is_some() {
                continue;
            }
            if let Some(m) = &n.machine {
                at(m.deadline()
                    .filter(|d| n.timer_for != Some(*d))
                    .map(|d| self.since(d).max(self.now)));
            }
            at(n.keep_alive_at);
            at(n.outstanding.iter().map(|c| c.1 + silence).min());
            if let Some(j) = &n.joining {
                at(Some(match j.attempt {
                    Some((_, until)) => until,
                    None => j.retry_at,
                }));
            }
            at(n.stopping.as_ref().map(|s| s.0));
            if n.stopping.is_some() {
                at(self.stop_fence(i).map(|f| f.max(self.now)));
            }
            at(n.hold.map(|h| h.0));
            at(n.peer.as_ref().map(|p| p.next));
            if let (Some(cut), Some(_), None) = (n.cut, n.stream, &n.tripped) {
                at(Some(cut + silence));
            }
            for w in n.workers.iter().filter(|w| w.alive) {
                at(w.ends.map(|e| e.0));
            }
        }
        t
    }

    /// Moves the clock to `t`; false (and a violation) when the
    /// simulation stalls: many steps without time passing.
    fn advance(&mut self, t: Duration) -> bool {
        if t <= self.now {
            self.stalled += 1;
            if self.stalled > 100_000 {
                let at = self.now;
                self.checker.note(
                    'c',
                    "the simulation stalled: steps without time passing",
                    at,
                );
                return false;
            }
        } else {
            self.stalled = 0;
            self.set_now(t);
        }
        true
    }

    /// Moves the virtual time, the server's clock with it.
    fn set_now(&mut self, t: Duration) {
        self.server.clock.advance(t.saturating_sub(self.now));
        self.now = self.now.max(t);
    }

    /// Runs until `until` (virtual time), or until every agent is done.
    pub fn run_until(&mut self, until: Duration) {
        self.settle();
        loop {
            if self.all_done() && self.flight.is_empty() && self.schedule.is_empty() {
                break;
            }
            let Some(t) = self.next_event() else { break };
            if t > until || !self.advance(t) {
                break;
            }
            self.process();
        }
        if self.now < until {
            self.set_now(until);
        }
    }

    /// Runs until `done` holds, checking after every step; at most until
    /// `limit`. Whether it held.
    pub fn run_while(&mut self, limit: Duration, done: impl Fn(&World) -> bool) -> bool {
        self.settle();
        loop {
            if done(self) {
                return true;
            }
            let Some(t) = self.next_event() else {
                return false;
            };
            if t > limit {
                self.set_now(limit);
                return done(self);
            }
            if !self.advance(t) {
                return false;
            }
            self.process();
        }
    }

    fn settle(&mut self) {
        for i in 0..self.nodes.len() {
            self.drive(i);
        }
    }

    /// Everything due now.
    fn process(&mut self) {
        let now = self.now;
        if let Some(after) = self.server.crash_due.take() {
            self.inject(Fault::CrashServer);
            let at = now + after;
            let i = self.schedule.partition_point(|(t, _)| *t <= at);
            let failover = self.spec.failover;
            self.schedule
                .insert(i, (at, Fault::RestartServer(failover)));
        }
        while let Some((t, f)) = self.schedule.first().cloned() {
            if t > now {
                break;
            }
            self.schedule.remove(0);
            self.inject(f);
        }
        while let Some(Reverse((t, seq))) = self.flight.peek().copied() {
            if t > now {
                break;
            }
            self.flight.pop();
            if let Some((epoch, msg)) = self.msgs.remove(&seq) {
                self.arrive(epoch, msg);
            }
        }
        if self.server_deadline().is_some_and(|t| t <= now) {
            self.server_tick();
        }
        let flush = self
            .server
            .flush_at
            .filter(|t| *t <= now && self.server.paused.is_none());
        if let (Some(_), Some(registry)) = (flush, self.server.registry.clone()) {
            self.flush(&registry);
            self.pump(&registry);
        }
        let silence = self.spec.silence();
        for i in 0..self.nodes.len() {
            if self.nodes[i].end.is_some() {
                continue;
            }
            // Workers that end by themselves.
            let mut ended = Vec::new();
            for w in &mut self.nodes[i].workers {
                if let Some((at, how)) = w.ends {
                    if w.alive && at <= now {
                        w.alive = false;
                        ended.push((w.pid, how));
                    }
                }
            }
            for (pid, how) in ended {
                if !how.success() {
                    // A flaky node's failure is injected as fail-worker's.
                    self.checker.failures += 1;
                }
                self.worker_exit(i, pid, how);
            }
            // The fence holds while workers stop, too (the driver's stop
            // task): past it, the stop's grace ends in SIGKILL.
            if let Some(fence) = self.stop_fence(i).filter(|f| *f <= now) {
                if let Some((at, exits)) = &mut self.nodes[i].stopping {
                    if *at > now {
                        *at = now;
                        for e in exits.iter_mut() {
                            if matches!(e.ended, Ended::Signaled(_)) {
                                e.ended = Ended::Signaled(Signal::SIGKILL as i32);
                            }
                        }
                        let name = self.nodes[i].name.clone();
                        let f = fence.as_secs_f64();
                        self.say(|| {
                            format!("{name}: fence at {f:.3}s: kills its stopping workers")
                        });
                    }
                }
            }
            if self.nodes[i].stopping.as_ref().is_some_and(|s| s.0 <= now) {
                self.finish_stop(i);
            }
            self.peer_tick(i);
            let drop_limit = self.spec.drop_limit();
            let n = &mut self.nodes[i];
            if let Some((at, stream, follows)) = n.hold {
                // The hold follows the peers' evidence, a drop limit past
                // it, read again when its deadline comes (`link::hold`):
                // the latest of the round, which the fence keeps.
                let later = n
                    .peers_latest
                    .map(|u| u + drop_limit)
                    .filter(|u| follows && *u > at);
                if let (true, Some(later)) = (at <= now, later) {
                    n.hold = Some((later, stream, follows));
                } else if at <= now {
                    n.hold = None;
                    if n.stream != Some(stream) {
                        let msg = Msg::Call {
                            from: i,
                            node_id: n.node_id.clone(),
                            session: Vec::new(),
                            id: 0,
                            body: Call::Closed(stream),
                        };
                        self.send(i, true, msg);
                    }
                }
            }
            let n = &mut self.nodes[i];
            // Calls unanswered within the silence bound trip the link.
            let mut expired = Vec::new();
            n.outstanding.retain(|c| {
                let late = c.1 + silence <= now;
                if late {
                    expired.push((c.2.name(), c.3, matches!(c.2, Call::KeepAlive(..))));
                }
                !late
            });
            for (what, stream, keep_alive) in expired {
                if stream == n.stream && stream.is_some() && n.joining.is_none() {
                    n.tripped.get_or_insert_with(|| {
                        format!(
                            "the rendezvous did not answer {what} within {:.1} s",
                            silence.as_secs_f64()
                        )
                    });
                    if keep_alive {
                        n.keep_alive_at = None;
                    }
                }
            }
            // The probe: a cut link's PINGs go unanswered.
            if let (Some(cut), Some(_)) = (n.cut, n.stream) {
                if cut + silence <= now && n.tripped.is_none() && n.joining.is_none() {
                    n.tripped = Some("the rendezvous did not answer the probe's PINGs".into());
                }
            }
            if n.keep_alive_at.is_some_and(|t| t <= now) {
                n.keep_alive_at = Some(now + self.spec.keep_alive);
                // It vouches for the ranks its peer task last heard, while
                // that is fresh (`peers::Shared::vouch`).
                let vouch = n
                    .vouch
                    .as_ref()
                    .filter(|(_, at, fresh)| now.saturating_sub(*at) <= *fresh)
                    .map(|(v, _, _)| v.clone());
                let progress = self.progress(i, None);
                self.call(i, Call::KeepAlive(vouch, progress));
            }
            self.join_step(i);
        }
        for i in 0..self.nodes.len() {
            self.drive(i);
        }
        self.check();
    }

    fn join_step(&mut self, i: usize) {
        let now = self.now;
        // The probe gives a join up after the silence bound.
        let silence = self.spec.silence();
        let Some(j) = &mut self.nodes[i].joining else {
            return;
        };
        if let Some((attempt, until)) = j.attempt {
            if until > now {
                return;
            }
            j.attempt = None;
            j.retry_at = now + JOIN_RETRY;
            self.call(i, Call::Abandon(attempt));
        }
        let Some(j) = &mut self.nodes[i].joining else {
            return;
        };
        if j.retry_at > now {
            return;
        }
        if now >= j.deadline {
            let first = j.first;
            self.nodes[i].joining = None;
            let e = AgentError::JoinTimeout("no rendezvous answered in time".into());
            match first {
                true => self.end_node(i, End::Error(e.exit_code(), e.to_string())),
                false => self.nodes[i].rejoined = Some(Err(e)),
            }
            return;
        }
        self.seq += 1;
        let attempt = self.seq;
        j.attempt = Some((attempt, now + silence));
        j.retry_at = now;
        let resume = j.resume;
        let req = self.join_request(i, resume);
        self.call(i, Call::Join(Box::new(req), attempt));
    }

    fn worker_exit(&mut self, i: usize, pid: u32, how: Ended) {
        self.checker.died(pid);
        let n = &mut self.nodes[i];
        let Some(w) = n.workers.iter().find(|w| w.pid == pid) else {
            return;
        };
        let exit = Exit {
            local_rank: w.local_rank,
            global_rank: w.rank,
            pid,
            ended: how,
        };
        match &mut n.stopping {
            Some((_, exits)) => exits.push(exit),
            None if n.group => n.exits.push_back(exit),
            None => {}
        }
    }

    /// Applies a fault or command now.
    pub fn inject(&mut self, f: Fault) {
        let desc = format!("{f:?}");
        self.say(|| format!("== {desc}"));
        match f {
            Fault::FailWorker { node, local, code } => {
                let Some(w) = self.nodes[node]
                    .workers
                    .iter_mut()
                    .find(|w| w.alive && w.local_rank == local)
                else {
                    return;
                };
                w.alive = false;
                let pid = w.pid;
                self.checker.failures += 1;
                self.worker_exit(node, pid, Ended::Exited(code));
            }
            Fault::Finish(which) => {
                for i in 0..self.nodes.len() {
                    if which.is_some_and(|w| w != i) {
                        continue;
                    }
                    let pids: Vec<u32> = self.nodes[i]
                        .workers
                        .iter_mut()
                        .filter(|w| w.alive)
                        .map(|w| {
                            w.alive = false;
                            w.pid
                        })
                        .collect();
                    for pid in pids {
                        self.worker_exit(i, pid, Ended::Exited(0));
                    }
                }
            }
            Fault::CrashNode(i) => {
                if self.nodes[i].end.is_none() {
                    self.checker.excused.insert(i);
                    self.end_node(i, End::Crashed);
                }
            }
            Fault::RestartNode(i) => {
                let n = &mut self.nodes[i];
                if n.end != Some(End::Crashed) {
                    return;
                }
                n.incarnation += 1;
                n.node_id = format!("{}-{}", n.name, n.incarnation);
                n.end = None;
                n.session.clear();
                n.answered = None;
                n.tripped = None;
                n.lost = None;
                n.inbox.clear();
                n.rejoined = None;
                n.hold = None;
                n.peers_moved = false;
                n.workers.clear();
                n.exits.clear();
                n.group = false;
                n.timer_for = None;
                n.summary = None;
                self.start_join(i, None, true);
            }
            Fault::Signal(i, sig) => {
                if self.nodes[i].machine.is_some() {
                    self.nodes[i].queue.push_back(Event::Signal(sig));
                }
            }
            Fault::Partition(i) => {
                self.inject(Fault::CutServer(i));
                self.inject(Fault::CutPeers(i));
            }
            Fault::CutServer(i) => {
                self.checker.excused.insert(i);
                if self.nodes[i].cut.is_none() {
                    self.nodes[i].cut = Some(self.now);
                }
            }
            Fault::CutPeers(i) => {
                self.checker.excused.insert(i);
                if self.nodes[i].peer_cut.is_none() {
                    self.nodes[i].peer_cut = Some(self.now);
                }
            }
            Fault::Heal(i) => {
                self.inject(Fault::HealServer(i));
                self.inject(Fault::HealPeers(i));
            }
            Fault::HealServer(i) => {
                let n = &mut self.nodes[i];
                n.cut = None;
                let held = std::mem::take(&mut n.held);
                for msg in held {
                    self.send(i, false, msg);
                }
            }
            Fault::HealPeers(i) => self.nodes[i].peer_cut = None,
            Fault::PauseServer => {
                if self.server.up && self.server.paused.is_none() {
                    self.server.paused = Some(self.now);
                    for i in 0..self.nodes.len() {
                        self.checker.excused.insert(i);
                    }
                }
            }
            Fault::ResumeServer => {
                let Some(since) = self.server.paused.take() else {
                    return;
                };
                // The registry's own `lock` takes a gap longer than
                // `PAUSED` for a pause: nobody's silence in it counts
                // (`woke`). Its ticker runs first.
                if self.now.saturating_sub(since) > rendezvous_server::registry::PAUSED {
                    self.say(|| {
                        "server: woke from a pause: every node has the whole drop limit".into()
                    });
                }
                self.server_tick();
                for msg in std::mem::take(&mut self.server.unread) {
                    if let Msg::Call {
                        from,
                        node_id,
                        session,
                        id,
                        body,
                    } = msg
                    {
                        if !self.server.up || self.server.paused.is_some() {
                            break;
                        }
                        // A join attempt its node gives up (or gave up)
                        // before the answer can reach it is read with its
                        // cancellation, as above. Were it taken, the
                        // cancellation would drop the node at once: the
                        // open issue of `known_abandoned_rejoin.sim`, which
                        // a pause ending as the nodes' attempts time out
                        // would otherwise hit (all of them at once, their
                        // rejoins being in step).
                        if let Call::Join(_, attempt) = &body {
                            let n = &self.nodes[from];
                            let answer = (self.spec.latency + n.delay) * 2;
                            let live = n.joining.as_ref().and_then(|j| j.attempt).is_some_and(
                                |(a, until)| a == *attempt && until > self.now + answer,
                            );
                            if !live {
                                continue;
                            }
                        }
                        self.serve(from, &node_id, &session, id, body);
                    }
                }
            }
            Fault::CrashServer => {
                if !self.server.up {
                    return;
                }
                // What the store holds is what the last flush wrote; the
                // registry and its streams die with the process (no node
                // departs: nobody is left to tell).
                if let Some(registry) = self.server.registry.take() {
                    registry.close_all("crashed", true);
                    drop(registry);
                }
                self.server.up = false;
                self.server.paused = None;
                self.server.unread.clear();
                self.server.epoch += 1;
                self.server.attempts.clear();
                // A write under way is lost with the process, and so are
                // the events that waited for it.
                self.server.flush_at = None;
                self.server.answers.clear();
                let streams = std::mem::take(&mut self.server.streams);
                for (id, (stream, node_stream)) in streams {
                    drop(node_stream);
                    if let Some(to) = self.index_of(&id) {
                        self.send(
                            to,
                            false,
                            Msg::StreamEnd {
                                to,
                                stream,
                                silent: true,
                            },
                        );
                    }
                }
                for i in 0..self.nodes.len() {
                    self.checker.excused.insert(i);
                }
            }
            Fault::RestartServer(failover) => {
                if self.server.up {
                    return;
                }
                self.server.up = true;
                self.server.ticked = self.now;
                self.server.job_epoch += 1;
                // A replica that takes over loads the store; a store-less
                // server restarted in the dead one's place starts empty and
                // holds back the jobs it creates (`--state-dir`).
                // The store is the crashed incarnation's only if it wrote it.
                let continues = failover && self.server.durable;
                self.server.durable = failover;
                let registry = match failover {
                    true => registry_for(&self.spec, &self.server),
                    false => registry_for(&self.spec, &self.server).holding_fresh_jobs(),
                };
                if failover {
                    // A replica that takes over: the jobs and tombstones
                    // the store holds, their nodes given the whole drop
                    // limit from now.
                    if let Err(e) = ready(registry.load()) {
                        self.say(|| format!("server: loading the store failed: {e}"));
                    }
                    // (i) What a node was told, the store held: the job
                    // that continues is at least at the round any node heard.
                    let round = registry.with_job(JOB, |j| j.round());
                    let told = self.server.announced;
                    let lost = round.is_some_and(|r| r < told) || (round.is_none() && told > 0);
                    if continues && lost {
                        let what = format!(
                            "durability: nodes were told of round {told}, but the server that took over holds {}",
                            round.map_or("no job".into(), |r| format!("round {r}"))
                        );
                        let at = self.now;
                        self.checker.note('i', &what, at);
                    }
                }
                self.server.registry = Some(registry);
                let registry = self.server.registry.clone();
                if let Some(r) = registry {
                    self.after(&r);
                }
            }
            Fault::Delay(i, d) => {
                self.checker.excused.insert(i);
                self.nodes[i].delay = d;
            }
            Fault::Drop(i, p) => {
                self.checker.excused.insert(i);
                self.nodes[i].drop = p;
                self.nodes[i].drop_answers = false;
            }
            Fault::DropAnswers(i, p) => {
                self.checker.excused.insert(i);
                self.nodes[i].drop = p;
                self.nodes[i].drop_answers = true;
            }
            Fault::Flaky(i, rounds) => self.nodes[i].flaky = rounds,
            Fault::CrashOnRoundChange(after) => self.server.crash_armed = Some(after),
            Fault::Release(i) => {
                let host = self.nodes[i].name.clone();
                self.checker.released(&host);
                let now = self.server_now();
                let registry = self
                    .server
                    .registry
                    .clone()
                    .filter(|_| self.server.up && self.server.paused.is_none());
                if let Some(registry) = registry {
                    if registry.quarantine(now, JOB, &host).is_ok() {
                        self.say(|| format!("server: released {host}"));
                    }
                    self.after(&registry);
                }
            }
        }
        self.settle();
        self.check();
    }

    fn check(&mut self) {
        let mut checker = std::mem::take(&mut self.checker);
        checker.step(self);
        self.checker = checker;
    }

    /// The invariant violations found so far.
    pub fn violations(&self) -> &[Violation] {
        &self.checker.violations
    }
}

fn describe(msg: &Msg) -> String {
    match msg {
        Msg::Call { body, node_id, .. } => format!("{} from {node_id}", body.name()),
        Msg::Reply { to, .. } => format!("an answer to node {to}"),
        Msg::Joined { to, .. } => format!("a join answer to node {to}"),
        Msg::Stream { kind, .. } => kind_name(kind),
        Msg::StreamEnd { .. } => "a stream's end".into(),
        Msg::Ping { from, .. } => format!("a peer ping from node {from}"),
        Msg::Answer { to, .. } => format!("a peer answer to node {to}"),
    }
}

/// A short name of a stream event.
pub fn kind_name(k: &Kind) -> String {
    match k {
        Kind::Joined(j) => format!("joined round {}", j.round),
        Kind::Waiting(w) if !w.quarantine.is_empty() => format!(
            "waiting {}/{} (round {}), quarantined for {} ms",
            w.ready, w.needed, w.round, w.quarantine_left_ms
        ),
        Kind::Waiting(w) => format!("waiting {}/{} (round {})", w.ready, w.needed, w.round),
        Kind::RoundComplete(r) => format!(
            "round {} complete: node rank {} of {}, world {}, restarts {}",
            r.round, r.node_rank, r.nnodes, r.world_size, r.restart_count
        ),
        Kind::RestartRequested(r) => format!(
            "restart {} -> {} (counted {}): {}",
            r.round, r.next_round, r.counted, r.reason
        ),
        Kind::JobSucceeded(_) => "job succeeded".into(),
        Kind::JobFailed(f) => format!("job failed: {}", f.reason),
        Kind::JobClosed(c) => format!("job closed: {}", c.reason),
        #[allow(unreachable_patterns)]
        _ => "another event".into(),
    }
}

fn event_name(e: &Event, base: std::time::Instant) -> String {
    match e {
        Event::Silent { why, since } => format!(
            "silent since {:.3}s: {why}",
            since.saturating_duration_since(base).as_secs_f64()
        ),
        Event::Message(k) => kind_name(k),
        Event::Vouched(until) => format!(
            "vouched until {:.3}s",
            until.saturating_duration_since(base).as_secs_f64()
        ),
        Event::Exited(x) => format!("worker {} {}", x.global_rank, x.ended),
        Event::Stopped(x) => format!("stopped {} worker(s)", x.len()),
        other => {
            let s = format!("{other:?}");
            s.chars().take(120).collect()
        }
    }
}

fn action_name(a: &Action) -> String {
    match a {
        Action::Start { info, .. } => format!(
            "start round {} node rank {} ranks {}..{} world {} restarts {}",
            info.round,
            info.node_rank,
            info.base_rank,
            info.base_rank + info.world_size / info.nnodes.max(1),
            info.world_size,
            info.restart_count
        ),
        other => {
            let s = format!("{other:?}");
            s.chars().take(120).collect()
        }
    }
}

/// How often the registry's periodic work runs at least (its ticker runs
/// every 100 ms; anything under `registry::PAUSED` keeps it from taking
/// its own quiet for a pause).
const SERVER_TICK: Duration = Duration::from_millis(500);

/// What a node's stream holds now.
enum Polled {
    Event(Kind),
    Empty,
    Ended,
}

/// The next event of `stream`, without waiting.
fn poll_stream(stream: &mut NodeStream) -> Polled {
    use tokio_stream::Stream;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        match std::pin::Pin::new(&mut *stream).poll_next(&mut cx) {
            std::task::Poll::Ready(Some(Ok(pb::Event { kind: Some(kind) }))) => {
                return Polled::Event(kind)
            }
            std::task::Poll::Ready(Some(Ok(_))) => continue,
            std::task::Poll::Ready(Some(Err(_)) | None) => return Polled::Ended,
            std::task::Poll::Pending => return Polled::Empty,
        }
    }
}

/// The output of `f`, which must not wait: the registry's calls on the
/// in-memory store answer at once.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("the in-memory store waited"),
    }
}

/// A registry as `rdzv-server` builds one for `spec`: jobs kept a day once
/// over (the checkers read their outcome), the quarantine policy, and, if
/// `server.durable`, the store replicas share (so every seed runs the
/// durable commit path and the tombstones).
fn registry_for(spec: &Spec, server: &Server) -> Registry {
    use rendezvous_server::job::{QuarantineScope, QuarantineSettings};
    let limits = rendezvous_server::Limits {
        quarantine: spec.quarantine.map(|policy| QuarantineSettings {
            policy,
            scope: QuarantineScope::Job,
        }),
        ..rendezvous_server::Limits::default()
    };
    let day = Duration::from_secs(86_400);
    let registry = match server.durable {
        true => Registry::with_store(day, limits, server.store.clone()),
        false => Registry::new(day, limits),
    };
    let registry = registry.with_clock(Arc::new(server.clock.clone()));
    match spec.broken_commit {
        true => registry.delivering_before_durable(),
        false => registry,
    }
}
