//! The agent's life: reach the rendezvous, then for each round get ready,
//! wait for the round to form, run the workers, and follow the server's
//! decision (restart, fail, succeed).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use accel_proto::v1 as pb;
use nix::sys::signal::Signal;
use pb::event::Kind;
use tokio::net::TcpListener;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tracing::{info, warn};

use crate::client::RdzvClient;
use crate::config::{Config, Rendezvous};
use crate::error::{AgentError, Outcome};
use crate::guard::Guard;
use crate::signal::Signals;
use crate::store::WorkerStore;
use crate::supervisor::{Exit, WorkerGroup, WorkerSpec};
use crate::worker_env::{worker_argv, worker_env, RoundInfo};

/// How long a finished job is remembered by an embedded rendezvous.
const EMBEDDED_FINISHED_TTL: Duration = Duration::from_secs(5);
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
        let deadline = Instant::now() + cfg.join_timeout();
        let req = pb::JoinRequest {
            job_id: cfg.run_id.clone(),
            node_id: node_id.clone(),
            hostname: hostname.clone(),
            min_nodes: cfg.min_nodes,
            max_nodes: cfg.max_nodes,
            last_call_ms: cfg.rdzv.last_call_timeout.as_millis() as u64,
            nproc_per_node: cfg.nproc_per_node,
            max_restarts: cfg.max_restarts,
            node_rank: match cfg.rendezvous {
                Rendezvous::Static { node_rank, .. } => Some(node_rank),
                _ => None,
            },
            dead_after_ms: (cfg.rdzv.keep_alive_interval * cfg.rdzv.keep_alive_max_attempt)
                .as_millis() as u64,
        };
        let joined = tokio::select! {
            r = RdzvClient::join(&host, port, req, cfg.rdzv.read_timeout, deadline) => r?,
            sig = signals.recv() => return Ok(Outcome::Signaled(sig)),
        };
        let (client, events) = joined;
        let keep_alive = spawn_keep_alive(client.clone(), cfg.rdzv.keep_alive_interval);
        let mut session = Session {
            cfg: &cfg,
            client,
            events,
            signals: &mut signals,
            guard,
            hostname: hostname.clone(),
            run_dir: None,
            store_listener: None,
        };
        let result = session.run().await;
        keep_alive.abort();
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

/// Where the rendezvous is, starting it inside this agent when this node hosts it.
async fn locate_rendezvous(
    cfg: &Config,
    stop: &CancellationToken,
) -> Result<(String, u16, Option<tokio::task::JoinHandle<()>>), AgentError> {
    let host_at = |addr: SocketAddr| {
        let stop = stop.clone();
        async move {
            let listener = TcpListener::bind(addr).await?;
            let port = listener.local_addr()?.port();
            let task = tokio::spawn(async move {
                let shutdown = async move { stop.cancelled().await };
                if let Err(e) =
                    rendezvous_server::serve(listener, EMBEDDED_FINISHED_TTL, shutdown).await
                {
                    warn!(error = %e, "embedded rendezvous failed");
                }
            });
            Ok::<_, std::io::Error>((port, task))
        }
    };
    match &cfg.rendezvous {
        Rendezvous::Standalone => {
            let (port, task) = host_at(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
                .await
                .map_err(|e| {
                    AgentError::io("cannot start the embedded rendezvous on 127.0.0.1", e)
                })?;
            Ok(("127.0.0.1".into(), port, Some(task)))
        }
        Rendezvous::Static {
            host,
            port,
            node_rank,
        } => {
            if *node_rank != 0 {
                return Ok((host.clone(), *port, None));
            }
            let (_, task) = host_at(wildcard(host, *port)).await.map_err(|e| {
                AgentError::Config(format!(
                    "node rank 0 cannot serve the rendezvous on port {port}: {e}; pick a free --master-port"
                ))
            })?;
            info!(port, "node rank 0 serves the static rendezvous");
            Ok((host.clone(), *port, Some(task)))
        }
        Rendezvous::C10d { host, port } => {
            let local = cfg.rdzv.is_host.unwrap_or_else(|| is_local_host(host));
            if local {
                match host_at(wildcard(host, *port)).await {
                    Ok((_, task)) => {
                        info!(port, "this agent hosts the c10d rendezvous");
                        return Ok((host.clone(), *port, Some(task)));
                    }
                    // Another process (rdzv-server, or an agent of this host) serves it.
                    Err(e) if cfg.rdzv.is_host.is_none() => {
                        tracing::debug!(error = %e, "rendezvous port taken; joining as a client")
                    }
                    Err(e) => {
                        return Err(AgentError::Config(format!(
                            "is_host=true but the rendezvous cannot be served on port {port}: {e}"
                        )))
                    }
                }
            }
            Ok((host.clone(), *port, None))
        }
    }
}

fn wildcard(host: &str, port: u16) -> SocketAddr {
    if host.contains(':') {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    }
}

/// torchrun's is_host inference, without DNS: `localhost`, a loopback
/// address, or this machine's host name.
fn is_local_host(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
        || host == hostname()
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

fn spawn_keep_alive(mut client: RdzvClient, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(s) = client.keep_alive().await {
                tracing::debug!(error = %s.message(), "keep-alive failed");
            }
        }
    })
}

/// A listener on a free port for the round's worker store: dual-stack where
/// the host has IPv6, else IPv4.
async fn bind_store(ip: IpAddr) -> Result<TcpListener, AgentError> {
    match TcpListener::bind((ip, 0)).await {
        Ok(l) => Ok(l),
        Err(_) if ip.is_unspecified() && ip.is_ipv6() => {
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).await
        }
        Err(e) => Err(e),
    }
    .map_err(|e| AgentError::io("cannot bind a port for the worker store (MASTER_PORT)", e))
}

enum Formed {
    Round(RoundInfo),
    Done(Outcome),
}

enum RoundEnd {
    Restart(u64),
    Done(Outcome),
}

struct Session<'a> {
    cfg: &'a Config,
    client: RdzvClient,
    events: Streaming<pb::Event>,
    signals: &'a mut Signals,
    guard: Option<Arc<Guard>>,
    hostname: String,
    run_dir: Option<PathBuf>,
    /// The listener offered for the forming round's worker store.
    store_listener: Option<TcpListener>,
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
    async fn run(&mut self) -> Result<Outcome, AgentError> {
        let mut round = match next_event(&mut self.events).await? {
            Some(Kind::Joined(j)) => j.round,
            other => {
                return Err(AgentError::Rendezvous(format!(
                    "unexpected first event from the rendezvous: {other:?}"
                )))
            }
        };
        loop {
            let info = match self.form(round).await? {
                Formed::Round(info) => info,
                Formed::Done(outcome) => return Ok(self.finish(outcome).await),
            };
            match self.run_round(info).await? {
                RoundEnd::Restart(next) => round = next,
                RoundEnd::Done(outcome) => return Ok(self.finish(outcome).await),
            }
        }
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

impl Session<'_> {
    /// Gets ready for `round` and waits for it to form.
    async fn form(&mut self, mut round: u64) -> Result<Formed, AgentError> {
        let deadline = Instant::now() + self.cfg.join_timeout();
        self.offer(round).await?;
        let mut waiting = String::from("no report from the rendezvous yet");
        loop {
            let kind = tokio::select! {
                ev = next_event(&mut self.events) => ev?,
                sig = self.signals.recv() => return Ok(Formed::Done(Outcome::Signaled(sig))),
                _ = sleep_until(deadline) => return Err(AgentError::JoinTimeout(format!(
                    "round {round} of job '{}' did not form within {:.0} s: {waiting}; start the missing nodes with the same --rdzv-id, --nnodes and endpoint",
                    self.cfg.run_id, self.cfg.join_timeout().as_secs_f64()))),
            };
            match kind {
                Some(Kind::RoundComplete(r)) if r.round == round => {
                    return Ok(Formed::Round(round_info(r)))
                }
                Some(Kind::Waiting(w)) if w.round == round => {
                    waiting = describe_waiting(&w);
                    info!(round, "{waiting}");
                }
                Some(Kind::RestartRequested(r)) if r.next_round > round => {
                    round = r.next_round;
                    self.offer(round).await?;
                }
                Some(Kind::JobFailed(f)) => return Ok(Formed::Done(Outcome::Failed(f.reason))),
                Some(Kind::JobSucceeded(_)) => return Ok(Formed::Done(Outcome::Succeeded)),
                Some(Kind::JobClosed(c)) => {
                    return Err(AgentError::Rendezvous(format!(
                        "the rendezvous closed the job: {}",
                        c.reason
                    )))
                }
                _ => {}
            }
        }
    }

    /// Ready for `round`, offering a freshly bound store listener: if this
    /// node becomes node rank 0, its workers' store is served on it.
    async fn offer(&mut self, round: u64) -> Result<(), AgentError> {
        let any = IpAddr::from(Ipv6Addr::UNSPECIFIED);
        let (addr, bind) = match &self.cfg.rendezvous {
            Rendezvous::Standalone => ("127.0.0.1".to_owned(), IpAddr::from(Ipv4Addr::LOCALHOST)),
            Rendezvous::Static { host, .. } => (host.clone(), any),
            Rendezvous::C10d { .. } => (
                self.cfg
                    .local_addr
                    .clone()
                    .unwrap_or_else(|| self.hostname.clone()),
                any,
            ),
        };
        let listener = bind_store(bind).await?;
        let port = listener
            .local_addr()
            .map_err(|e| AgentError::io("worker store listener", e))?
            .port();
        self.store_listener = Some(listener);
        self.client
            .ready(round, (addr, u32::from(port)))
            .await
            .map_err(|s| {
                AgentError::Rendezvous(format!(
                    "the rendezvous did not accept this node as ready: {}",
                    s.message()
                ))
            })
    }

    fn specs(&mut self, info: &RoundInfo) -> Result<Vec<WorkerSpec>, AgentError> {
        let run_dir = match &self.run_dir {
            Some(d) => d.clone(),
            None => {
                let d = crate::files::run_dir(self.cfg.log_dir.as_deref(), &self.cfg.run_id)?;
                self.run_dir = Some(d.clone());
                d
            }
        };
        let env = |k: &str| std::env::var(k).ok();
        (0..self.cfg.nproc_per_node)
            .map(|local_rank| {
                let error_file =
                    crate::files::error_file(&run_dir, info.restart_count, local_rank)?;
                Ok(WorkerSpec {
                    local_rank,
                    global_rank: info.base_rank + local_rank,
                    argv: worker_argv(&self.cfg.entrypoint, local_rank),
                    env: worker_env(
                        self.cfg,
                        info,
                        local_rank,
                        &error_file.to_string_lossy(),
                        &env,
                    ),
                })
            })
            .collect()
    }

    /// Runs one round's workers until the job decides what comes next.
    async fn run_round(&mut self, info: RoundInfo) -> Result<RoundEnd, AgentError> {
        info!(
            round = info.round,
            node_rank = info.node_rank,
            nnodes = info.nnodes,
            ranks = %format!("{}..{}", info.base_rank, info.base_rank + self.cfg.nproc_per_node),
            world_size = info.world_size,
            restart_count = info.restart_count,
            master = %format!("{}:{}", info.master_addr, info.master_port),
            "round formed; starting workers"
        );
        // Node rank 0 serves this round's store; everyone else lets its offer go.
        let _store = match self.store_listener.take() {
            Some(l) if info.node_rank == 0 => Some(
                WorkerStore::start(l)
                    .map_err(|e| AgentError::io("cannot start the worker store", e))?,
            ),
            _ => None,
        };
        let specs = self.specs(&info)?;
        let mut group = match WorkerGroup::spawn(specs, self.guard.clone()).await {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::error!(error = %e, "worker failed to start");
                self.client
                    .report_failure(info.round, e.local_rank, e.global_rank, 127, e.to_string())
                    .await;
                None
            }
        };
        let grace = self.cfg.shutdown_timeout;
        let mut failed = group.is_none();
        let mut barrier: Option<Instant> = None;
        let mut monitor = tokio::time::interval(self.cfg.monitor_interval);
        monitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let live = group.as_ref().is_some_and(|g| !g.all_ended());
            let wake = tokio::select! {
                exit = async { group.as_mut().expect("guarded by `live`").next_exit().await }, if live => Wake::Exit(exit),
                _ = monitor.tick(), if live => Wake::Tick,
                ev = self.events.message() => match ev {
                    Ok(Some(ev)) => Wake::Event(ev.kind),
                    Ok(None) => Wake::Lost("the rendezvous ended this node's session".into()),
                    Err(s) => Wake::Lost(format!("lost the rendezvous: {}", s.message())),
                },
                sig = self.signals.recv() => Wake::Signal(sig),
                _ = async { sleep_until(barrier.expect("guarded")).await }, if barrier.is_some() => Wake::BarrierExpired,
            };
            let exits = match wake {
                Wake::Exit(e) => vec![e],
                Wake::Tick => group.as_mut().map(WorkerGroup::check).unwrap_or_default(),
                Wake::Event(Some(Kind::RestartRequested(r))) if r.round == info.round => {
                    info!(reason = %r.reason, counted = r.counted, "restart requested; stopping workers");
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Ok(RoundEnd::Restart(r.next_round));
                }
                Wake::Event(Some(Kind::JobFailed(f))) => {
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Ok(RoundEnd::Done(Outcome::Failed(f.reason)));
                }
                Wake::Event(Some(Kind::JobSucceeded(_))) => {
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Ok(RoundEnd::Done(Outcome::Succeeded));
                }
                Wake::Event(Some(Kind::JobClosed(c))) => {
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Err(AgentError::Rendezvous(format!(
                        "the rendezvous closed the job: {}",
                        c.reason
                    )));
                }
                Wake::Event(_) => Vec::new(),
                Wake::Lost(why) => {
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    return Err(AgentError::Rendezvous(why));
                }
                Wake::Signal(sig) => {
                    warn!(signal = %sig, grace_s = grace.as_secs_f64(), "stopping workers; a second signal kills them at once");
                    if let Some(g) = group.as_mut() {
                        tokio::select! {
                            _ = g.stop(sig, grace) => {}
                            again = self.signals.recv() => {
                                warn!(signal = %again, "second signal: killing workers now");
                                g.stop(Signal::SIGKILL, Duration::ZERO).await;
                            }
                        }
                    }
                    return Ok(RoundEnd::Done(Outcome::Signaled(sig)));
                }
                Wake::BarrierExpired => {
                    warn!(
                        timeout_s = self.cfg.exit_barrier_timeout.as_secs_f64(),
                        "this node's workers succeeded but other nodes did not finish within --exit-barrier-timeout; exiting"
                    );
                    stop(&mut group, Signal::SIGTERM, grace).await;
                    self.client
                        .leave("its workers succeeded; exit barrier timed out")
                        .await;
                    return Ok(RoundEnd::Done(Outcome::Succeeded));
                }
            };
            for exit in exits {
                if exit.ended.success() || failed {
                    continue;
                }
                failed = true;
                warn!(local_rank = exit.local_rank, rank = exit.global_rank, ended = %exit.ended, "worker failed");
                self.client
                    .report_failure(
                        info.round,
                        exit.local_rank,
                        exit.global_rank,
                        exit.ended.code(),
                        exit.ended.to_string(),
                    )
                    .await;
                stop(&mut group, Signal::SIGTERM, grace).await;
            }
            if !failed && barrier.is_none() && group.as_ref().is_some_and(WorkerGroup::all_ended) {
                self.client.report_success(info.round).await;
                barrier = Some(Instant::now() + self.cfg.exit_barrier_timeout);
            }
        }
    }
}

async fn stop(group: &mut Option<WorkerGroup>, sig: Signal, grace: Duration) {
    if let Some(g) = group.as_mut() {
        g.stop(sig, grace).await;
    }
}

/// What a forming round waits for, in words.
fn describe_waiting(w: &pb::Waiting) -> String {
    let hosts = if w.hosts.is_empty() {
        "none".to_owned()
    } else {
        w.hosts.join(", ")
    };
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

fn round_info(r: pb::RoundComplete) -> RoundInfo {
    RoundInfo {
        round: r.round,
        node_rank: r.node_rank,
        nnodes: r.nnodes,
        world_size: r.world_size,
        base_rank: r.base_rank,
        restart_count: r.restart_count,
        max_restarts: r.max_restarts,
        master_addr: r.master_addr,
        master_port: r.master_port,
    }
}
