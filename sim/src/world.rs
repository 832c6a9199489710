//! The simulated cluster: one rendezvous server running the real
//! `Registry` (and with it the real [`Job`]), N agents running the real
//! [`NodeMachine`], their fake workers, and the network between them, all
//! on one virtual clock.
//!
//! The code is split by concern, as TigerBeetle's VOPR splits its own:
//! `network` (links, latency, losses, partitions), `server` (the registry
//! behind a model of the service, its store), `agents` (a model of each
//! driver and its fake workers), `peers` (each round's hub) and `faults`
//! (what a schedule or a script injects); this module holds the types, the
//! virtual clock and the event loop. The invariants are `crate::invariants`.
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

mod agents;
mod faults;
mod network;
mod peers;
mod server;

use server::{ready, registry_for};

/// The job every node runs, and the timings of the simulated agents.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Fewest nodes a round may run with.
    pub min_nodes: u32,
    /// Most nodes a round holds.
    pub max_nodes: u32,
    /// `--nnodes-multiple-of` (0 or 1: any count).
    pub multiple_of: u32,
    /// `--scale-up-settle` (zero: a running round grows at once).
    pub settle: Duration,
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
            multiple_of: 0,
            settle: Duration::ZERO,
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
        /// Whether its sender is steady (`View::steady`).
        steady: bool,
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
        /// Other ranks heard and steady.
        steady_others: u32,
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
    /// Leaving: why, and whether a health check failed.
    Leave(String, bool),
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
            Call::Leave(..) => "leave",
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
    /// The job's end is in the recorded output.
    over_recorded: bool,
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
    /// The node failed a health check and left the job; the agent checks
    /// again and joins anew once it passes ([`Fault::RestartNode`]).
    Departed,
}

impl End {
    /// The agent's exit code (`None`: killed).
    pub fn code(&self) -> Option<u8> {
        match self {
            End::Outcome(o) => Some(o.exit_code()),
            End::Error(c, _) => Some(*c),
            End::Crashed | End::Departed => None,
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
    /// A stop for a re-form: the fence clock it began with (the agent's
    /// `Answered::fixed`).
    stop_answered: Option<Option<Duration>>,
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
            (Some(End::Departed), _) => "departed",
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
    /// A killed agent starts again, or a departed node's health checks
    /// pass again: it joins anew (a new node id, the same host).
    RestartNode(usize),
    /// The node's periodic health check fails (`--health-check-interval`):
    /// it stops its workers and leaves the job.
    Unhealthy(usize),
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
    /// What the run decided, one line each, with its virtual time: each
    /// round formed (who got which node rank), each restart and the job's
    /// end as the server sent them, each agent's end. A scenario's
    /// recorded output (`sim/scenarios/*.out`).
    pub decisions: Vec<String>,
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
            over_recorded: false,
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
            decisions: Vec::new(),
            checker,
            schedule: Vec::new(),
            saved: 0,
        }
    }

    /// Notes a decision ([`World::decisions`]).
    fn decided(&mut self, what: String) {
        let at = self.now.as_secs_f64();
        self.decisions.push(format!("{at:8.3}s {what}"));
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
            stop_answered: None,
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
