//! The agent's life: reach the rendezvous, join, then let the node's state
//! machine ([`machine::NodeMachine`]) decide, round after round, while this
//! module's driver does the I/O it asks for.
//!
//! The driver waits only for what the machine's phase listens to
//! ([`machine::Sources`]): the event stream and the keep-alive watch, worker
//! exits (and the monitor's backstop), a rejoin attempt, a stop in flight,
//! the phase's deadline, and always the stop signals. What it hears becomes
//! one [`machine::Event`]; the returned actions run in order
//! (`actions`). A stop runs as its own task, so a second signal is heard
//! while the workers stop.

mod actions;
mod link;
pub mod machine;
mod report;
pub mod round;
mod store_bind;
#[cfg(test)]
mod tests;
mod workers;

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use accel_proto::v1 as pb;
use tokio::net::TcpListener;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use self::round::Exit;
use crate::config::{Config, Rendezvous};
use crate::error::{AgentError, Outcome};
use crate::events::{Ending, EventLog, Identity};
use crate::rendezvous::{hostname, locate_rendezvous};
use crate::signal::Signals;
use accel_process::guard::Guard;
use accel_worker_store::WorkerStore;
use link::{Heard, Link};
use machine::{Action, Event, NodeMachine, Settings};
use workers::{Spawner, Workers};

/// Aborts a background task when the agent's life ends, however it ends.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// How long an exiting agent waits for its embedded rendezvous to drain.
const EMBEDDED_DRAIN: Duration = Duration::from_secs(5);

/// Runs the job on this node to its outcome.
pub async fn run(cfg: Config, guard: Option<Arc<Guard>>) -> Result<Outcome, AgentError> {
    let mut signals = Signals::install(&cfg.signals)?;
    // A log directory the agent must not write into fails it now, not
    // when the first round starts its workers.
    crate::files::check_log_dir(cfg.log_dir.as_deref())?;
    let hostname = hostname();
    let identity = cfg.identity(&hostname).to_owned();
    // The fence clock: the send time of the last call a rendezvous
    // answered, kept by every link of this agent.
    let answered = link::Answered::default();
    // What the round's peers say (the `peers` module): the vouch the
    // keep-alives carry, and how long the workers may run without a
    // rendezvous on their word.
    let peers = crate::peers::Shared::default();
    // The guard kills the workers if these beats stop (a frozen agent), by
    // the fence deadline they carry: when the rendezvous may drop this
    // node, less half the fence margin (the agent's own fence acts a
    // margin before it).
    // The peers' evidence moves that deadline as it moves the agent's own
    // fence, half a margin later.
    let beating = guard.clone().map(|g| {
        let answered = answered.clone();
        let peers = peers.clone();
        let drop_limit = cfg.rdzv.dead_after();
        let half = link::fence_margin(drop_limit) / 2;
        let before = drop_limit.saturating_sub(half);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(g.every());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = Instant::now().into_std();
                let own = answered.get().and_then(|a| a.checked_add(before));
                let vouched = peers.until().and_then(|u| u.checked_add(half));
                g.beat(own.max(vouched).map(|d| d.saturating_duration_since(now)));
            }
        })
    });
    let _beating = AbortOnDrop(beating);
    let stop_server = CancellationToken::new();
    // However the agent's life ends (an error included), the embedded
    // rendezvous and the metrics endpoint stop with it.
    let _stopping = stop_server.clone().drop_guard();
    let metrics = crate::metrics::AgentMetrics::default();
    if let accel_telemetry::Bind::At(addr) = cfg.metrics_bind {
        let listener = accel_telemetry::http::bind(addr)
            .await
            .map_err(|e| AgentError::Config(e.to_string()))?;
        tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "serving metrics, /healthz and /readyz");
        tokio::spawn(accel_telemetry::http::serve(
            listener,
            metrics_endpoint(&metrics),
            stop_server.clone(),
        ));
    }
    let forks = match cfg.fork_server_fd {
        None => None,
        Some(fd) => Some(Arc::new(start_fork_server(fd)?)),
    };
    let watched = crate::file_timer::Workers::default();
    // The workers' progress reports (`accel.progress(step)`): a socket each
    // worker is told of, read into `progress` for the keep-alives and the
    // failure reports.
    let mut progress = crate::progress::Progress::default();
    if let Some(settings) = cfg.hang {
        progress = progress.with_hangs(settings, cfg.nproc_per_node);
    }
    let mut cfg = cfg;
    let _progress_socket = match crate::progress::ProgressSocket::start(
        &std::env::temp_dir(),
        &mut progress,
        watched.clone(),
    ) {
        Ok(socket) => {
            cfg.base_env.push((
                crate::progress::ENV.into(),
                socket.path().to_string_lossy().into_owned(),
            ));
            Some(socket)
        }
        Err(e) => {
            warn!(error = %e, "cannot create the progress socket; accel.progress() reports go nowhere");
            None
        }
    };
    let _checkpoint_file = cfg.checkpoint_iteration_file.clone().map(|path| {
        AbortOnDrop(Some(progress.watch_file(
            path,
            cfg.nproc_per_node,
            Duration::from_secs(1),
        )))
    });
    // The rendezvous this node reaches, for a hang's job-wide stacks.
    let job_stacks = crate::stacks::JobStacks::default();
    // Checked ten times per least timeout (at least every 20 ms, at most
    // every second).
    let _hangs = cfg.hang.map(|h| {
        let every = (h.floor / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
        AbortOnDrop(Some(progress.watch_hangs(
            watched.clone(),
            job_stacks.clone(),
            every,
        )))
    });
    let _file_timer = match &cfg.file_timer {
        None => None,
        Some(path) => Some(
            crate::file_timer::FileTimerServer::start(
                path,
                watched.clone(),
                metrics.clone(),
                job_stacks.clone(),
            )
            .map_err(|e| {
                AgentError::io(
                    "cannot start the FileTimer server (TORCHELASTIC_ENABLE_FILE_TIMER=1)",
                    e,
                )
            })?,
        ),
    };
    // Preparing the zygote overlaps the rendezvous.
    let zygote = (!cfg.preload.is_empty())
        .then(|| Arc::new(accel_process::zygote::Zygote::start(zygote_spec(&cfg))));
    let run_started = Instant::now();
    // Tells the rendezvous whether this agent is a late node of a job that
    // has finished (started before its end) or a new run of its id.
    let started_unix_ms = accel_wire::time::unix_ms(std::time::SystemTime::now());
    let events = Arc::new(std::sync::Mutex::new(EventLog::new(
        cfg.event_log_handler,
        std::env::var("LOGLEVEL").ok().as_deref(),
        Identity {
            run_id: cfg.run_id.clone(),
            role: cfg.role.clone(),
            // torchrun reports `socket.getfqdn()`; the lookup only when printed.
            hostname: match cfg.event_log_handler {
                crate::events::EventHandler::Console => crate::sys::fqdn(&hostname),
                _ => hostname.clone(),
            },
            rdzv_backend: cfg.rdzv_backend_name.into(),
            entry_point: std::path::Path::new(&cfg.entrypoint.program)
                .file_name()
                .map_or_else(
                    || cfg.entrypoint.program.clone(),
                    |n| n.to_string_lossy().into_owned(),
                ),
        },
    )));
    let located = locate_rendezvous(&cfg, &stop_server).await?;
    let (endpoints, leaders, server, etcd) = (
        located.endpoints,
        located.leaders,
        located.server,
        located.etcd,
    );
    let console = match cfg.logs.tee == crate::logs::StdSpec::default() {
        true => None,
        false => Some(
            crate::logs::tee::Console::start()
                .map_err(|e| AgentError::io("cannot start the console writer", e))?
                .counting(metrics.tee_dropped()),
        ),
    };
    let processes = workers::Processes {
        guard: guard.clone(),
        console: console.clone(),
        forks,
        zygote,
        gpu_free_timeout: cfg.gpu_free_timeout,
    };
    // One session per membership: a node that fails its health check
    // between rounds leaves the job and joins again once healthy.
    let sessions = async {
        let mut departed = false;
        loop {
            if let Some(check) = &cfg.health_check {
                if let Some(sig) = wait_healthy(check, &mut signals, &metrics, departed).await {
                    return Ok(Outcome::Signaled(sig));
                }
            }
            let node_id = format!(
                "{identity}-{}-{:04x}",
                std::process::id(),
                fastrand::u16(..)
            );
            let deadline = crate::deadline::after(cfg.join_timeout());
            let join_req = pb::JoinRequest {
                job_id: cfg.run_id.clone(),
                node_id: node_id.clone(),
                hostname: identity.clone(),
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
                // Set by a join that leaves a silent replica.
                silent_replica: String::new(),
                topology: cfg.topology.clone(),
                no_restart_exit_code: cfg.no_restart_exit_code.unwrap_or(0),
                agent_version: env!("CARGO_PKG_VERSION").into(),
                outage_ms: match rides_outages(&cfg) {
                    true => crate::deadline::millis(cfg.rdzv.outage_timeout),
                    false => 0,
                },
                keep_alive_ms: crate::deadline::millis(cfg.rdzv.keep_alive_interval),
                started_unix_ms,
                max_no_progress_restarts: cfg.max_no_progress_restarts,
                nnodes_multiple_of: cfg.nnodes_multiple_of,
                scale_up_settle_ms: crate::deadline::millis(cfg.scale_up_settle),
            };
            // Agent-only: the node's presence key is written before it
            // joins, and kept while it is a member (withdrawn below).
            let presence = etcd
                .as_ref()
                .map(|o| rendezvous_server::presence::Presence::announce(o, &node_id, &identity));
            let reach = Arc::new(
                link::Reach::new(&cfg, endpoints.clone(), leaders, join_req)
                    .with_presence(presence.as_ref().map(|p| p.held()))
                    .with_answered(answered.clone())
                    .with_peers(peers.clone())
                    .with_progress(progress.clone())
                    .with_stacks(watched.clone(), job_stacks.clone()),
            );
            let joined = tokio::select! {
                r = reach.join(reach.join_req.clone(), 0, None, deadline.into()) => r.map(Ok),
                sig = signals.recv() => Ok(Err(sig)),
            };
            let (link, first) = match joined {
                Ok(Ok(joined)) => joined,
                Ok(Err(sig)) => {
                    withdraw(presence).await;
                    return Ok(Outcome::Signaled(sig));
                }
                Err(e) => {
                    withdraw(presence).await;
                    return Err(e);
                }
            };
            if let Some(over) = &first.over {
                // The job was over before this node came: it took part in
                // it (cut off at the end, or restarted since), and ends
                // with the job's result at once.
                withdraw(presence).await;
                let line = machine::over_line(&cfg.run_id, over);
                let outcome = machine::outcome_of(over);
                match &outcome {
                    Outcome::Succeeded => info!("{line}"),
                    _ => error!("{line}"),
                }
                return Ok(outcome);
            }
            if let Some(previous) = &first.previous {
                info!("{}", machine::new_run_line(&cfg.run_id, previous));
            }
            let (machine, first_actions) =
                NodeMachine::new(Settings::of(&cfg), Instant::now().into_std(), first.round);
            let mut driver = Driver::new(
                &cfg,
                machine,
                link,
                processes.clone(),
                &mut signals,
                hostname.clone(),
                metrics.clone(),
                watched.clone(),
            );
            driver.progress = progress.clone();
            driver.events = Some(events.clone());
            if rides_outages(&cfg) {
                driver.peers = Some(Peers {
                    shared: peers.clone(),
                    watch: peers.watch(),
                    task: AbortOnDrop(None),
                    answered: answered.clone(),
                });
            }
            driver.presence = reach.presence().cloned();
            let result = driver.drive(first_actions).await;
            // This membership is over (the node left, the job ended, or the
            // agent exits): its presence goes at once, not after the lease.
            withdraw(presence).await;
            match result {
                Ok(DriverEnd::Unhealthy) => {
                    departed = true;
                    continue;
                }
                Ok(DriverEnd::Done(outcome)) => return Ok(outcome),
                Err(e) => return Err(e),
            }
        }
    };
    let result = sessions.await;
    emit(events_lock(&events).ended(&ending(&result), run_started.elapsed()));
    if let Some(console) = &console {
        console.drain(Duration::from_secs(2));
        if console.dropped() > 0 {
            warn!(lines = console.dropped(), "the console was slower than the workers: tee'd lines were dropped from it (the log files have every line)");
        }
    }
    stop_server.cancel();
    if let Some(server) = server {
        if tokio::time::timeout(EMBEDDED_DRAIN, server).await.is_err() {
            warn!("the embedded rendezvous did not drain in time");
        }
    }
    result
}

/// Whether this node's workers may ride out a rendezvous outage on their
/// peers' word (the `peers` module). Not in an agent-only rendezvous on
/// etcd: there a node whose presence lease lapses is dropped whatever its
/// peers say, so it fences at once (`Event::Dead`).
fn rides_outages(cfg: &Config) -> bool {
    !matches!(cfg.rendezvous, Rendezvous::Etcd { .. })
}

/// The round's peer hub as the driver holds it.
struct Peers {
    /// What the round's task publishes.
    shared: crate::peers::Shared,
    /// Wakes the driver when the evidence moves.
    watch: tokio::sync::watch::Receiver<Option<std::time::Instant>>,
    /// The running round's task.
    task: AbortOnDrop,
    /// The agent's fence clock: its last contact with the rendezvous.
    answered: link::Answered,
}

/// Deletes this node's presence key, if it keeps one.
async fn withdraw(presence: Option<rendezvous_server::presence::Presence>) {
    if let Some(p) = presence {
        p.withdraw().await;
    }
}

/// What the job came to, as the final events say it.
fn ending(result: &Result<Outcome, AgentError>) -> Ending {
    match result {
        Ok(Outcome::Succeeded) => Ending::Succeeded,
        Ok(Outcome::Failed(_) | Outcome::NoRestart { .. }) => Ending::Failed,
        // torchrun's raw_error is the Python traceback of the
        // SignalException its agent raises; accel gives its last line, the
        // exception, in the same words (ending in a newline, as there).
        Ok(Outcome::Signaled(sig)) => Ending::AgentFailed(format!(
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process {} got signal: {}\n",
            std::process::id(),
            *sig as i32
        )),
        // Any other error: its message, where torchrun has a traceback.
        Err(e) => Ending::AgentFailed(format!("{e}\n")),
    }
}

/// The shared event log, even if a holder panicked.
fn events_lock(events: &std::sync::Mutex<EventLog>) -> std::sync::MutexGuard<'_, EventLog> {
    events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Prints event lines on the agent's stderr (the `console` handler), each
/// with one write so lines from other writers do not split them.
fn emit(lines: Vec<String>) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for mut line in lines {
        line.push('\n');
        let _ = err.write_all(line.as_bytes());
    }
}

/// Connects to the fork server on inherited `fd`. If the server goes away
/// (its parent, a notebook kernel, is gone), this agent stops as on SIGTERM:
/// there is nobody left to run the job for.
fn start_fork_server(fd: i32) -> Result<accel_process::fork_server::ForkServer, AgentError> {
    let socket = accel_process::sys::take_inherited_socket(fd)
        .map_err(|e| AgentError::Config(format!("--fork-server-fd {fd}: {e}")))?;
    accel_process::fork_server::ForkServer::start(socket, |why| {
        // The stop first: the log line may go nowhere (the kernel that read
        // this agent's stderr is usually what went away).
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
        warn!("{why}; stopping the job as on SIGTERM");
    })
    .map_err(|e| AgentError::Config(format!("--fork-server-fd {fd}: {e}")))
}

/// What `--preload`'s zygote is started with: the workers' interpreter,
/// their `sys.path[0]` (the script's directory; the working directory for
/// `-m`) and the environment they share.
fn zygote_spec(cfg: &Config) -> accel_process::zygote::ZygoteSpec {
    let entry = &cfg.entrypoint;
    let path = if entry.leading_args.iter().any(|a| a == "-m") {
        std::env::current_dir().ok()
    } else {
        entry
            .leading_args
            .last()
            .and_then(|script| std::fs::canonicalize(script).ok())
            .and_then(|p| p.parent().map(PathBuf::from))
    };
    let agent_env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    accel_process::zygote::ZygoteSpec {
        python: entry.program.clone(),
        modules: cfg.preload.clone(),
        path,
        env: crate::worker_env::zygote_env(cfg, agent_env),
    }
}

/// The agent's `/metrics`, `/healthz` and `/readyz`.
fn metrics_endpoint(metrics: &crate::metrics::AgentMetrics) -> accel_telemetry::Endpoint {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let m = metrics.clone();
    accel_telemetry::Endpoint::new(registry, Arc::new(move || m.ready()))
}

/// A rejoin attempt in flight: the new link, and what joining said.
type Rejoining<L> = Pin<Box<dyn Future<Output = Result<(L, pb::Joined), AgentError>> + Send>>;

/// The driver of one node's [`NodeMachine`]: it owns the I/O (the rendezvous
/// connection, the workers, the store, the files) and does what the machine
/// decides.
struct Driver<'a, L: Link, S: Spawner> {
    cfg: &'a Config,
    machine: NodeMachine,
    /// The connection to the job.
    link: L,
    /// Starts the workers.
    spawner: S,
    signals: &'a mut Signals,
    hostname: String,
    run_dir: Option<Arc<crate::files::Dir>>,
    /// The listener offered for the forming round's worker store.
    store_listener: Option<TcpListener>,
    /// Binds each round's store listener.
    store_binder: store_bind::StoreBinder,
    /// The running round's store (node rank 0 only).
    store: Option<WorkerStore>,
    /// The running round's workers.
    group: Option<S::Group>,
    /// Drives [`Workers::check`], the backstop for missed exits.
    monitor: tokio::time::Interval,
    /// A stop in flight: the group comes back with the exits it saw.
    stopping: Option<tokio::task::JoinHandle<(S::Group, Vec<Exit>)>>,
    /// Tells the stop in flight to SIGKILL now (a second signal).
    kill: Option<Arc<tokio::sync::Notify>>,
    /// A rejoin attempt in flight.
    rejoin: Option<Rejoining<L>>,
    /// The running round's error files, by local rank.
    error_files: Vec<crate::files::FileAt>,
    /// This node's failures in the running round.
    failures: Vec<pb::Failure>,
    /// What is counted for Prometheus.
    metrics: crate::metrics::AgentMetrics,
    /// When this node first offered itself for the forming round.
    offered_at: Option<Instant>,
    /// When a failure stopped the last round (this node's or another's).
    failed_at: Option<std::time::Instant>,
    /// The running round's workers, for the FileTimer server.
    watched: crate::file_timer::Workers,
    /// Whether `--health-check` passed since the last offer (it did just
    /// before joining).
    health_checked: bool,
    /// The last round's workers, whose GPUs a new round waits for.
    last_pids: Vec<i32>,
    /// torchelastic's status events (`--event-log-handler`), kept by the
    /// agent across sessions; none in the driver's unit tests.
    events: Option<Arc<std::sync::Mutex<EventLog>>>,
    /// This node's presence key in etcd (agent-only rendezvous): when its
    /// lease lapses while workers run, they are fenced at once.
    presence: Option<rendezvous_server::presence::PresenceHeld>,
    /// The lapse was said since the node last (re)joined, which it does
    /// only with its key back in etcd.
    lapse_said: bool,
    /// The round's peer hub (`None`: this node fences at the drop limit).
    peers: Option<Peers>,
    /// The workers' progress reports (the `progress` module); empty in the
    /// driver's unit tests.
    progress: crate::progress::Progress,
    /// `--health-check-interval`: the checks in flight, or when the next
    /// run starts.
    health: Periodic<'a>,
}

/// The periodic health checks of a membership: one run at a time, the next
/// an interval after the last ended.
struct Periodic<'a> {
    check: Option<(&'a crate::health::HealthCheck, Duration)>,
    next: Option<tokio::time::Instant>,
    running: Option<Pin<Box<dyn Future<Output = crate::health::Verdict> + Send + 'a>>>,
}

impl<'a> Periodic<'a> {
    /// A run just ended: the next starts an interval from now.
    fn ran(&mut self) {
        self.running = None;
        self.next = self.check.map(|(_, i)| tokio::time::Instant::now() + i);
    }

    fn of(cfg: &'a Config) -> Self {
        let check = cfg
            .health_check
            .as_ref()
            .and_then(|c| c.interval.map(|i| (c, i)));
        Self {
            check,
            // The checks passed just before joining.
            next: check.map(|(_, i)| tokio::time::Instant::now() + i),
            running: None,
        }
    }
}

/// How a driver's membership of the job ended.
enum DriverEnd {
    /// The node's part of the job is over.
    Done(Outcome),
    /// The node failed its health check between rounds and left the job.
    Unhealthy,
}

/// Runs `check` until it passes, waiting longer after each failure; `Some`
/// if a stop signal came first. A node that has just left the job for a
/// failed check (`departed`) waits the first recheck's wait before checking
/// again: a check run at once would compare error counters over nothing and
/// let a failing node straight back in.
async fn wait_healthy(
    check: &crate::health::HealthCheck,
    signals: &mut Signals,
    metrics: &crate::metrics::AgentMetrics,
    departed: bool,
) -> Option<nix::sys::signal::Signal> {
    let mut failed = u32::from(departed);
    if departed {
        tokio::select! {
            _ = tokio::time::sleep(crate::health::recheck_after(failed)) => {}
            sig = signals.recv() => return Some(sig),
        }
    }
    let mut said = String::new();
    loop {
        let result = tokio::select! {
            v = check.run() => v,
            sig = signals.recv() => return Some(sig),
        };
        metrics.health(&result);
        let why = match result.overall() {
            Ok(()) => {
                if failed > 0 {
                    tracing::info!(
                        checks = failed + 1,
                        "the health check passes; this node joins the job"
                    );
                }
                return None;
            }
            Err(why) => why,
        };
        failed += 1;
        // What /readyz says while the node stays out.
        metrics.set_ready(Err(format!(
            "this node is unhealthy and stays out of the job: {why}"
        )));
        let wait = crate::health::recheck_after(failed);
        if why != said {
            warn!(reason = %why, next_check_s = wait.as_secs_f64(), "this node is unhealthy (--health-check*): it stays out of the job and checks again");
            said = why;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            sig = signals.recv() => return Some(sig),
        }
    }
}

/// What woke the driver.
enum Woke<L> {
    Event(Event),
    Rejoined(Box<Result<(L, pb::Joined), AgentError>>),
    /// The monitor's backstop found these exits.
    Checked(Vec<Exit>),
    /// The guard killed the workers while the agent did not run: these
    /// exits (one or, from the backstop, several) were fenced.
    GuardFenced(Vec<Exit>),
}

impl<'a, L: Link, S: Spawner> Driver<'a, L, S> {
    /// A session of a node that has just joined.
    #[allow(clippy::too_many_arguments)]
    fn new(
        cfg: &'a Config,
        machine: NodeMachine,
        link: L,
        spawner: S,
        signals: &'a mut Signals,
        hostname: String,
        metrics: crate::metrics::AgentMetrics,
        watched: crate::file_timer::Workers,
    ) -> Self {
        let mut monitor = tokio::time::interval(cfg.monitor_interval);
        monitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            cfg,
            machine,
            link,
            spawner,
            signals,
            hostname,
            run_dir: None,
            store_listener: None,
            store_binder: store_bind::StoreBinder::new(cfg.rdzv.store_ports),
            store: None,
            group: None,
            monitor,
            stopping: None,
            kill: None,
            rejoin: None,
            error_files: Vec::new(),
            failures: Vec::new(),
            metrics,
            offered_at: None,
            failed_at: None,
            watched,
            health_checked: true,
            last_pids: Vec::new(),
            events: None,
            presence: None,
            lapse_said: false,
            peers: None,
            progress: crate::progress::Progress::default(),
            health: Periodic::of(cfg),
        }
    }

    /// Does what the machine decides until it exits.
    async fn drive(&mut self, first: Vec<Action>) -> Result<DriverEnd, AgentError> {
        let mut queue: VecDeque<Event> = VecDeque::new();
        let mut actions = first;
        loop {
            for action in std::mem::take(&mut actions) {
                if let Some(end) = self.perform(action, &mut queue).await? {
                    return Ok(end);
                }
            }
            let event = match queue.pop_front() {
                Some(event) => event,
                None => match self.wait().await {
                    Woke::Event(event) => event,
                    Woke::Rejoined(joined) => match *joined {
                        Ok((link, joined)) => {
                            // The old link (and its keep-alives) ends here.
                            self.link = link;
                            self.lapse_said = false;
                            match joined.over {
                                Some(over) => {
                                    let line = machine::over_line(&self.cfg.run_id, &over);
                                    match over.succeeded {
                                        true => info!("{line}"),
                                        false => error!("{line}"),
                                    }
                                    Event::Over(over)
                                }
                                None => Event::Rejoined {
                                    round: joined.round,
                                    resumed: joined.resumed,
                                },
                            }
                        }
                        Err(e) => Event::RejoinFailed(e),
                    },
                    Woke::Checked(exits) => {
                        queue.extend(exits.into_iter().map(Event::Exited));
                        continue;
                    }
                    Woke::GuardFenced(exits) => {
                        queue.extend(exits.into_iter().map(Event::Exited));
                        Event::GuardFenced
                    }
                },
            };
            // The deciders' clock is std's; the runtime's reads the same
            // clock (and follows a paused test runtime).
            let now = Instant::now().into_std();
            self.observe(now, &event);
            actions = self.machine.step(now, event);
            if self.machine.left_round() {
                // Fenced or dropped: out of the round's peer hub at once,
                // not at the next offer (`NodeMachine::left_round`).
                self.quiet_peers();
            }
            self.metrics.set_ready(self.machine.readiness());
        }
    }

    /// A worker that ended badly, by itself or of the agent's stop, for
    /// the final events: its exit and its error file.
    fn note_failure(&self, exit: &Exit) {
        let Some(events) = &self.events else { return };
        let mut events = events_lock(events);
        if !events.on() {
            return;
        }
        let text = self
            .error_files
            .get(exit.local_rank as usize)
            .and_then(|f| crate::failure::read_error_text(&f.path()));
        if let Some(failure) = crate::events::Failure::of(exit.ended, text.as_deref()) {
            events.failed(exit.local_rank, failure);
        }
    }

    /// Records this node's events, if any are printed.
    fn record_events(&self, make: impl FnOnce(&mut EventLog) -> Vec<String>) {
        if let Some(events) = &self.events {
            emit(make(&mut events_lock(events)));
        }
    }

    /// Counts what an event says for the metrics.
    fn observe(&mut self, now: std::time::Instant, event: &Event) {
        match event {
            Event::Exited(exit) => {
                self.note_failure(exit);
                self.metrics.exited(&exit.ended);
                // An exited worker's silence is no hang (`crate::hang`).
                self.progress.exited(exit.local_rank);
                if exit.ended != crate::Ended::Exited(0) {
                    self.failed_at.get_or_insert(now);
                }
            }
            Event::Stopped(exits) => {
                for exit in exits {
                    self.note_failure(exit);
                    self.metrics.exited(&exit.ended);
                }
                self.metrics.stopped();
            }
            Event::Message(pb::event::Kind::RestartRequested(r)) => {
                self.metrics.restart(r.counted);
                if r.counted {
                    self.failed_at.get_or_insert(now);
                }
            }
            _ => {}
        }
    }

    /// Waits for whatever the machine listens to now.
    async fn wait(&mut self) -> Woke<L> {
        let src = self.machine.sources();
        let deadline = self.machine.deadline();
        let Driver {
            group,
            stopping,
            kill,
            rejoin,
            link,
            signals,
            monitor,
            presence,
            lapse_said,
            peers,
            health,
            metrics,
            ..
        } = self;
        let live = src.workers && group.as_ref().is_some_and(|g| !g.all_ended());
        let watch_presence = live && !*lapse_said && presence.is_some();
        tokio::select! {
            done = async { stopping.as_mut().expect("guarded").await }, if src.stop && stopping.is_some() => {
                *stopping = None;
                *kill = None;
                let exits = done.map(|(_, exits)| exits).unwrap_or_else(|e| {
                    // The group went with the task; its Drop SIGKILLed what lived.
                    tracing::error!(error = %e, "stopping the workers failed");
                    Vec::new()
                });
                Woke::Event(Event::Stopped(exits))
            }
            joined = async { rejoin.as_mut().expect("guarded").await }, if src.rejoin && rejoin.is_some() => {
                *rejoin = None;
                Woke::Rejoined(Box::new(joined))
            }
            exit = async { group.as_mut().expect("guarded by `live`").next_exit().await }, if live => {
                match group.as_ref().is_some_and(|g| g.fenced_by_guard()) {
                    true => Woke::GuardFenced(vec![exit]),
                    false => Woke::Event(Event::Exited(exit)),
                }
            }
            _ = monitor.tick(), if live => {
                let exits = group.as_mut().map(Workers::check).unwrap_or_default();
                match !exits.is_empty() && group.as_ref().is_some_and(|g| g.fenced_by_guard()) {
                    true => Woke::GuardFenced(exits),
                    false => Woke::Checked(exits),
                }
            }
            heard = link.next(), if src.stream => match heard {
                Heard::Message(kind) => Woke::Event(Event::Message(kind)),
                // An empty event carries nothing to act on.
                Heard::Nothing => Woke::Checked(Vec::new()),
                Heard::Lost(why) => Woke::Event(Event::Lost(why)),
                Heard::Silent { why, since } => Woke::Event(Event::Silent { why, since }),
            },
            () = async { presence.as_ref().expect("guarded").lapsed().await }, if watch_presence => {
                *lapse_said = true;
                Woke::Event(Event::Dead(
                    "this node's presence lease in etcd could not be renewed in time".into(),
                ))
            }
            changed = async { peers.as_mut().expect("guarded").watch.changed().await }, if src.peers && peers.is_some() => {
                match (changed, peers.as_ref().and_then(|p| p.shared.until())) {
                    (Ok(()), Some(until)) => Woke::Event(Event::Vouched(until)),
                    // The round's task ended: nothing more will come.
                    (Err(_), _) => {
                        *peers = None;
                        Woke::Checked(Vec::new())
                    }
                    (Ok(()), None) => Woke::Checked(Vec::new()),
                }
            }
            sig = signals.recv() => Woke::Event(Event::Signal(sig)),
            _ = async { sleep_until(deadline.expect("guarded").into()).await }, if deadline.is_some() => Woke::Event(Event::Timer),
            () = async { tokio::time::sleep_until(health.next.expect("guarded")).await }, if health.running.is_none() && health.next.is_some() => {
                health.next = None;
                if let Some((check, _)) = health.check {
                    health.running = Some(Box::pin(check.run()));
                }
                Woke::Checked(Vec::new())
            }
            verdict = async { health.running.as_mut().expect("guarded").await }, if health.running.is_some() => {
                health.ran();
                metrics.health(&verdict);
                match verdict.overall() {
                    Ok(()) => Woke::Checked(Vec::new()),
                    Err(why) => Woke::Event(Event::Unhealthy(why)),
                }
            }
        }
    }
}
