//! The agent's life: reach the rendezvous, then for each round get ready,
//! wait for the round to form, run the workers, and follow the server's
//! decision (restart, fail, succeed). This module holds the session (the
//! connection to the rendezvous, rejoining it); `round` holds one round.

mod report;
mod round;
mod store_bind;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use accel_proto::v1 as pb;
use nix::sys::signal::Signal;
use pb::event::Kind;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tracing::{info, warn};

use crate::client::RdzvClient;
use crate::config::{Config, Rendezvous};
use crate::error::{AgentError, Outcome};
use crate::guard::Guard;
use crate::rendezvous::{hostname, locate_rendezvous};
use crate::signal::Signals;
use crate::supervisor::{Exit, WorkerGroup};
use crate::worker_env::RoundInfo;

/// How long an exiting agent waits for its embedded rendezvous to drain.
const EMBEDDED_DRAIN: Duration = Duration::from_secs(5);

/// Runs the job on this node to its outcome.
pub async fn run(cfg: Config, guard: Option<Arc<Guard>>) -> Result<Outcome, AgentError> {
    let mut signals = Signals::install(&cfg.signals)?;
    let hostname = hostname();
    let node_id = format!(
        "{hostname}-{}-{:04x}",
        std::process::id(),
        fastrand::u16(..)
    );
    let stop_server = CancellationToken::new();
    let (host, port, server) = locate_rendezvous(&cfg, &stop_server).await?;
    let session = async {
        let deadline = crate::deadline::after(cfg.join_timeout());
        let join_req = pb::JoinRequest {
            job_id: cfg.run_id.clone(),
            node_id: node_id.clone(),
            hostname: hostname.clone(),
            min_nodes: cfg.min_nodes,
            max_nodes: cfg.max_nodes,
            last_call_ms: crate::deadline::millis(cfg.rdzv.last_call_timeout),
            nproc_per_node: cfg.nproc_per_node,
            max_restarts: cfg.max_restarts,
            node_rank: match cfg.rendezvous {
                Rendezvous::Static { node_rank, .. } => Some(node_rank),
                _ => None,
            },
            dead_after_ms: crate::deadline::millis(cfg.rdzv.dead_after()),
            resume: None,
            session: Vec::new(),
        };
        let link_tls = cfg.link_tls();
        let joined = tokio::select! {
            r = RdzvClient::join(&host, port, join_req.clone(), cfg.token.as_ref(), &link_tls, cfg.rdzv.read_timeout, deadline) => r?,
            sig = signals.recv() => return Ok(Outcome::Signaled(sig)),
        };
        let (client, events, first) = joined;
        let (keep_alive, silent) = spawn_keep_alive(client.clone(), &cfg);
        let console = match cfg.logs.tee == crate::logs::StdSpec::default() {
            true => None,
            false => Some(
                crate::logs::tee::Console::start()
                    .map_err(|e| AgentError::io("cannot start the console writer", e))?,
            ),
        };
        let mut session = Session {
            cfg: &cfg,
            endpoint: (host.clone(), port),
            join_req,
            keep_alive,
            silent,
            client,
            events,
            signals: &mut signals,
            guard,
            hostname: hostname.clone(),
            run_dir: None,
            store_listener: None,
            store_binder: store_bind::StoreBinder::new(cfg.rdzv.store_ports),
            console,
            error_files: Vec::new(),
            failures: Vec::new(),
        };
        let result = session.run(first.round).await;
        session.keep_alive.abort();
        if let Some(console) = &session.console {
            console.drain(Duration::from_secs(2));
            if console.dropped() > 0 {
                warn!(lines = console.dropped(), "the console was slower than the workers: tee'd lines were dropped from it (the log files have every line)");
            }
        }
        result
    };
    let result = session.await;
    stop_server.cancel();
    if let Some(server) = server {
        if tokio::time::timeout(EMBEDDED_DRAIN, server).await.is_err() {
            warn!("the embedded rendezvous did not drain in time");
        }
    }
    result
}

/// Sends keep-alives every `keep_alive_interval`. If none is answered for
/// `keep_alive_interval × keep_alive_max_attempt` (a cut link stalls a
/// stream without ending it), or the server no longer knows this node, the
/// returned receiver says why: the session treats that as a lost rendezvous.
fn spawn_keep_alive(
    mut client: RdzvClient,
    cfg: &Config,
) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel(1);
    let every = cfg.rdzv.keep_alive_interval;
    let limit = every.saturating_mul(cfg.rdzv.keep_alive_max_attempt);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        let mut answered = Instant::now();
        loop {
            tick.tick().await;
            match tokio::time::timeout(every, client.keep_alive()).await {
                Ok(Ok(())) => answered = Instant::now(),
                Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                    let _ = tx
                        .send(format!(
                            "the rendezvous no longer knows this node: {}",
                            s.message()
                        ))
                        .await;
                    return;
                }
                Ok(Err(s)) => tracing::debug!(error = %s.message(), "keep-alive failed"),
                Err(_) => tracing::debug!("keep-alive timed out"),
            }
            if answered.elapsed() > limit {
                let _ = tx
                    .send(format!(
                        "no keep-alive answered for {:.1} s",
                        answered.elapsed().as_secs_f64()
                    ))
                    .await;
                return;
            }
        }
    });
    (task, rx)
}

enum Formed {
    /// The round, and where its members are (node rank 0 admits them to its store).
    Round(RoundInfo, Vec<String>),
    Done(Outcome),
}

enum RoundEnd {
    Restart(u64),
    Done(Outcome),
}

/// How a round ended early, from inside a helper.
type RoundExit = Result<RoundEnd, AgentError>;

/// What rejoining after a lost stream found.
enum Recovery {
    /// The round is still current: go on.
    Resumed,
    /// The job moved on: get ready for this round.
    MovedOn(u64),
    /// A stop signal arrived meanwhile.
    Signaled(Signal),
}

struct Session<'a> {
    cfg: &'a Config,
    /// The rendezvous `(host, port)`.
    endpoint: (String, u16),
    /// This node's join request, reused to rejoin.
    join_req: pb::JoinRequest,
    keep_alive: tokio::task::JoinHandle<()>,
    /// Says why, when keep-alives go unanswered for too long.
    silent: mpsc::Receiver<String>,
    client: RdzvClient,
    events: Streaming<pb::Event>,
    signals: &'a mut Signals,
    guard: Option<Arc<Guard>>,
    hostname: String,
    run_dir: Option<PathBuf>,
    /// The listener offered for the forming round's worker store.
    store_listener: Option<TcpListener>,
    /// Binds each round's store listener.
    store_binder: store_bind::StoreBinder,
    /// The console writer for tee'd worker output, if anything is tee'd.
    console: Option<crate::logs::tee::Console>,
    /// The running round's error files, by local rank.
    error_files: Vec<PathBuf>,
    /// This node's failures in the running round.
    failures: Vec<pb::Failure>,
}

/// What woke the round loop.
enum Wake {
    Exit(Exit),
    Tick,
    Event(Option<Kind>),
    Lost(String),
    Signal(Signal),
    BarrierExpired,
}

impl Session<'_> {
    async fn run(&mut self, first_round: u64) -> Result<Outcome, AgentError> {
        let mut round = first_round;
        loop {
            let (info, members) = match self.form(round).await? {
                Formed::Round(info, members) => (info, members),
                Formed::Done(outcome) => return Ok(self.finish(outcome).await),
            };
            match self.run_round(info, members).await? {
                RoundEnd::Restart(next) => round = next,
                RoundEnd::Done(outcome) => return Ok(self.finish(outcome).await),
            }
        }
    }

    /// Takes over a new connection to the rendezvous.
    fn adopt(&mut self, client: RdzvClient, events: Streaming<pb::Event>) {
        self.keep_alive.abort();
        (self.keep_alive, self.silent) = spawn_keep_alive(client.clone(), self.cfg);
        self.client = client;
        self.events = events;
    }

    async fn finish(&mut self, outcome: Outcome) -> Outcome {
        match &outcome {
            Outcome::Signaled(sig) => {
                self.client
                    .leave(&format!("its agent received {sig}"))
                    .await
            }
            Outcome::Succeeded => info!("job succeeded"),
            Outcome::Failed(reason) => tracing::error!(%reason, "job failed"),
        }
        outcome
    }
}

/// Joins again with the same node id, retrying until `reconnect_grace` ends,
/// presenting `session`, the node's secret (a server that still holds the
/// node reattaches it only with it); `resume`: the round its workers run.
async fn rejoin(
    cfg: &Config,
    endpoint: &(String, u16),
    mut req: pb::JoinRequest,
    resume: Option<pb::Resume>,
    session: Vec<u8>,
) -> Result<(RdzvClient, Streaming<pb::Event>, pb::Joined), AgentError> {
    req.resume = resume;
    req.session = session;
    let deadline = crate::deadline::after(cfg.rdzv.reconnect_grace);
    RdzvClient::join(
        &endpoint.0,
        endpoint.1,
        req,
        cfg.token.as_ref(),
        &cfg.link_tls(),
        cfg.rdzv.read_timeout,
        deadline,
    )
    .await
}

fn gave_up(why: &str, cfg: &Config, e: &AgentError) -> AgentError {
    AgentError::Rendezvous(format!(
        "lost the rendezvous ({why}) and could not rejoin within reconnect_grace={:.0} s ({e}); this node stopped its workers",
        cfg.rdzv.reconnect_grace.as_secs_f64()
    ))
}

fn closed(c: &pb::JobClosed) -> AgentError {
    AgentError::Rendezvous(format!("the rendezvous closed the job: {}", c.reason))
}

/// The next event of a node's stream; its end is an error.
async fn next_event(events: &mut Streaming<pb::Event>) -> Result<Option<Kind>, AgentError> {
    {
        match events.message().await {
            Ok(Some(ev)) => Ok(ev.kind),
            Ok(None) => Err(AgentError::Rendezvous(
                "the rendezvous ended this node's session".into(),
            )),
            Err(s) => Err(AgentError::Rendezvous(format!(
                "lost the rendezvous: {}",
                s.message()
            ))),
        }
    }
}

/// Stops the group, if any; returns the exits it saw.
async fn stop(group: &mut Option<WorkerGroup>, sig: Signal, grace: Duration) -> Vec<Exit> {
    match group.as_mut() {
        Some(g) => g.stop(sig, grace).await,
        None => Vec::new(),
    }
}

/// What a forming round waits for, in words.
fn describe_waiting(w: &pb::Waiting) -> String {
    let mut hosts = match (w.hosts.is_empty(), w.members) {
        (true, 0) => "none".to_owned(),
        // A large job's progress names nobody, only counts.
        (true, n) => format!("{n} nodes"),
        (false, _) => w.hosts.join(", "),
    };
    if !w.hosts.is_empty() && w.members as usize > w.hosts.len() {
        hosts.push_str(&format!(" and {} more", w.members as usize - w.hosts.len()));
    }
    if w.spare {
        return format!(
            "waiting as a spare: the job runs with its maximum of {} nodes; this node joins when a slot frees (members: {hosts})",
            w.max_nodes
        );
    }
    let range = if w.min_nodes == w.max_nodes {
        w.max_nodes.to_string()
    } else {
        format!("{}..{}", w.min_nodes, w.max_nodes)
    };
    let mut s = format!("{} of {range} nodes ready", w.ready);
    if w.ready < w.min_nodes {
        s.push_str(&format!(", {} missing", w.min_nodes - w.ready));
    }
    if let Some(ms) = w.last_call_ms {
        s.push_str(&format!(
            ", last call closes in {:.1} s",
            ms as f64 / 1000.0
        ));
    }
    s.push_str(&format!(" (joined: {hosts})"));
    s
}

fn round_info(r: &pb::RoundComplete) -> RoundInfo {
    RoundInfo {
        round: r.round,
        node_rank: r.node_rank,
        nnodes: r.nnodes,
        world_size: r.world_size,
        base_rank: r.base_rank,
        restart_count: r.restart_count,
        max_restarts: r.max_restarts,
        master_addr: r.master_addr.clone(),
        master_port: r.master_port,
    }
}
