//! Starting, watching and stopping one round's workers.
//!
//! # Reaping strategy
//! Each worker is a `tokio::process::Child` awaited by its own task
//! (`Child::wait`, pidfd- or SIGCHLD-driven), which reports the exit on a
//! channel: exits are events, seen at once. The agent never calls
//! `waitpid(-1)`. The monitor interval only drives [`WorkerGroup::check`], a
//! backstop that peeks (without reaping) at workers whose exit has not been
//! reported yet, so the agent's view is never staler than that interval.
//!
//! # Process groups
//! Every worker leads its own process group; stop signals go to the whole
//! group (`killpg`), so processes a worker started (DataLoader workers) get
//! them too. When a round ends, however it ends, each group is swept with
//! SIGKILL so no grandchild outlives it. The [`Guard`] covers the agent's own
//! death.

use std::sync::Arc;
use std::time::Duration;

/// Variables of the agent that workers do not inherit.
pub(crate) const SECRET_VARIABLES: [&str; 2] = ["ACCEL_RDZV_TOKEN", "RDZV_TOKEN"];

use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::process::Stdio;

use crate::agent::round::Exit;
use crate::logs::filter::Filtered;
use crate::logs::tee::{self, Console, RankFiles, ToConsole};
use crate::logs::Sink;
use crate::sys::{self, Ended};
use accel_process::fork_server::{ForkGroup, ForkRequest, ForkServer};
use accel_process::guard::Guard;

/// What to start for one local rank.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSpec {
    /// Local rank on this node.
    pub local_rank: u32,
    /// Global rank in the round.
    pub global_rank: u32,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Variables set on top of the agent's environment.
    pub env: Vec<(String, String)>,
    /// Where its stdout goes.
    pub stdout: Sink,
    /// Where its stderr goes.
    pub stderr: Sink,
    /// `--duplicate-stdout-filters`, for a tee'd stdout shown on the console.
    pub stdout_filtered: Option<Filtered>,
    /// `--duplicate-stderr-filters`, likewise.
    pub stderr_filtered: Option<Filtered>,
    /// Its `TORCHELASTIC_ERROR_FILE`.
    pub error_file: crate::files::FileAt,
    /// The CPUs it is bound to (`--numa-binding`); `None`: the agent's.
    pub cpus: Option<crate::numa::CpuList>,
}

impl WorkerSpec {
    /// Whether the agent's `py-spy` must be able to read its stacks: always,
    /// for job-wide stacks (`rdzv-server stacks`, the status page) and a
    /// hang's report. Where Yama restricts `ptrace` to ancestors, the worker
    /// names the agent as its tracer; that lets the agent's other
    /// descendants (this node's other workers of the job, of the same user)
    /// trace it too, and nothing outside the agent's process tree.
    pub(crate) fn readable_stacks(&self) -> bool {
        true
    }
}

#[derive(Debug)]
struct Slot {
    local_rank: u32,
    global_rank: u32,
    pid: i32,
    ended: Option<Ended>,
}

/// How long a stopped group waits for its tee'd output to drain.
const DRAIN: Duration = Duration::from_secs(2);

/// The running workers of one round on this node.
#[derive(Debug)]
pub(crate) struct WorkerGroup {
    slots: Vec<Slot>,
    exits: mpsc::UnboundedReceiver<(usize, Ended)>,
    guard: Option<Arc<Guard>>,
    /// Tee pumps, drained when the group stops.
    pumps: Vec<tokio::task::JoinHandle<()>>,
}

impl WorkerGroup {
    /// Whether the guard killed this group's workers since this was last
    /// asked (see [`Guard::take_fenced`]).
    pub(crate) fn fenced_by_guard(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.take_fenced())
    }
}

/// A worker could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start worker local rank {local_rank} ({program}): {source}")]
pub(crate) struct SpawnError {
    /// The local rank that failed.
    pub local_rank: u32,
    /// Its global rank.
    pub global_rank: u32,
    /// The program.
    pub program: String,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

impl WorkerGroup {
    /// Starts every worker: executed, or forked by `forks`. If one cannot start, the ones already started are
    /// stopped (SIGKILL) before the error is returned.
    pub(crate) async fn spawn(
        specs: Vec<WorkerSpec>,
        guard: Option<Arc<Guard>>,
        console: Option<Console>,
        forks: Option<&ForkServer>,
    ) -> Result<Self, SpawnError> {
        let (tx, exits) = mpsc::unbounded_channel();
        let mut group = Self {
            slots: Vec::with_capacity(specs.len()),
            exits,
            guard,
            pumps: Vec::new(),
        };
        // Forked workers are one group: a function's wait for each other
        // at their end.
        let forks = forks.map(|s| (s, s.group(specs.len() as u32)));
        for (i, spec) in specs.into_iter().enumerate() {
            let started = match forks {
                None => exec(&spec),
                Some((server, group)) => fork(server, &spec, group).await,
            };
            let started = match started {
                Ok(s) => s,
                Err(source) => {
                    group.stop(Signal::SIGKILL, Duration::ZERO).await;
                    return Err(SpawnError {
                        local_rank: spec.local_rank,
                        global_rank: spec.global_rank,
                        program: match forks {
                            None => spec.argv[0].clone(),
                            Some(_) => "a fork of the fork server".into(),
                        },
                        source,
                    });
                }
            };
            let pid = started.pid;
            let files = RankFiles::new(spec.local_rank);
            if let (Some(pipe), Sink::Pipe { file, prefix }) = (started.stdout, &spec.stdout) {
                let to = to_console(prefix, false, &console, &spec.stdout_filtered);
                group
                    .pumps
                    .push(spawn_pump(pipe, file.clone(), files.clone(), to));
            }
            if let (Some(pipe), Sink::Pipe { file, prefix }) = (started.stderr, &spec.stderr) {
                let to = to_console(prefix, true, &console, &spec.stderr_filtered);
                group
                    .pumps
                    .push(spawn_pump(pipe, file.clone(), files.clone(), to));
            }
            if let Some(g) = &group.guard {
                g.watch(pid);
            }
            debug!(local_rank = spec.local_rank, pid, "worker started");
            group.slots.push(Slot {
                local_rank: spec.local_rank,
                global_rank: spec.global_rank,
                pid,
                ended: None,
            });
            let tx = tx.clone();
            let exit = started.exit;
            tokio::spawn(async move {
                let _ = tx.send((i, exit.await));
            });
        }
        Ok(group)
    }

    /// The process ids of the workers, by local rank.
    pub(crate) fn pids(&self) -> Vec<i32> {
        self.slots.iter().map(|s| s.pid).collect()
    }

    /// Whether every worker has ended.
    pub(crate) fn all_ended(&self) -> bool {
        self.slots.iter().all(|s| s.ended.is_some())
    }

    fn record(&mut self, i: usize, ended: Ended) -> Option<Exit> {
        let slot = self.slots.get_mut(i)?;
        if slot.ended.is_some() {
            return None;
        }
        slot.ended = Some(ended);
        Some(Exit {
            local_rank: slot.local_rank,
            global_rank: slot.global_rank,
            pid: slot.pid as u32,
            ended,
        })
    }

    /// The next worker exit; pending forever once every worker has ended.
    pub(crate) async fn next_exit(&mut self) -> Exit {
        loop {
            match self.exits.recv().await {
                Some((i, ended)) => {
                    if let Some(exit) = self.record(i, ended) {
                        return exit;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Backstop check: exits that happened but were not reported yet.
    pub(crate) fn check(&mut self) -> Vec<Exit> {
        let found: Vec<(usize, Ended)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.ended.is_none())
            .filter_map(|(i, s)| accel_process::sys::peek_exit(s.pid).map(|e| (i, e)))
            .collect();
        found
            .into_iter()
            .filter_map(|(i, e)| self.record(i, e))
            .collect()
    }

    /// Stops the group: `sig` to every live worker's process group, SIGKILL
    /// to those still alive after `grace`, then a SIGKILL sweep of every group
    /// so no process a worker started survives. Returns the exits it saw.
    pub(crate) async fn stop(&mut self, sig: Signal, grace: Duration) -> Vec<Exit> {
        let mut seen = Vec::new();
        self.signal_live(sig);
        let deadline = crate::deadline::after(grace);
        seen.extend(self.collect_until(deadline).await);
        if !self.all_ended() {
            warn!(
                grace_s = grace.as_secs_f64(),
                "workers still alive after the grace period; sending SIGKILL"
            );
            self.signal_live(Signal::SIGKILL);
            // Processes in uninterruptible sleep may never die; do not wait forever.
            seen.extend(
                self.collect_until(Instant::now() + Duration::from_secs(10))
                    .await,
            );
            for s in self.slots.iter().filter(|s| s.ended.is_none()) {
                warn!(
                    pid = s.pid,
                    "worker did not die after SIGKILL; abandoning it"
                );
            }
        }
        self.sweep();
        // Whatever the workers wrote reaches the files and the console.
        for pump in std::mem::take(&mut self.pumps) {
            let _ = tokio::time::timeout(DRAIN, pump).await;
        }
        seen
    }

    /// Sends `sig` to the group of every worker that has not ended.
    pub(crate) fn signal_live(&self, sig: Signal) {
        for s in self.slots.iter().filter(|s| s.ended.is_none()) {
            accel_process::sys::killpg(s.pid, sig);
        }
    }

    async fn collect_until(&mut self, deadline: Instant) -> Vec<Exit> {
        let mut seen = Vec::new();
        while !self.all_ended() {
            match tokio::time::timeout_at(deadline, self.next_exit()).await {
                Ok(exit) => seen.push(exit),
                Err(_) => break,
            }
        }
        seen
    }

    /// SIGKILLs what is left of every worker's process group.
    fn sweep(&mut self) {
        for s in &self.slots {
            accel_process::sys::killpg(s.pid, Signal::SIGKILL);
            if let Some(g) = &self.guard {
                g.forget(s.pid);
            }
        }
    }
}

/// A started worker: its pid, its output pipes (for the sinks that are
/// pipes), and its end.
struct Started {
    pid: i32,
    stdout: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
    stderr: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
    exit: Pin<Box<dyn Future<Output = Ended> + Send>>,
}

/// Executes the worker's program.
fn exec(spec: &WorkerSpec) -> std::io::Result<Started> {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    // The rendezvous token is the agent's, not the training code's:
    // with it, a worker could join and fail any job on the server.
    for secret in SECRET_VARIABLES {
        cmd.env_remove(secret);
    }
    accel_process::sys::kill_with_parent(&mut cmd);
    if spec.readable_stacks() {
        accel_process::sys::let_agent_trace(&mut cmd);
    }
    if let Some(cpus) = &spec.cpus {
        sys::bind_to_cpus(&mut cmd, cpus)?;
    }
    cmd.stdout(stdio(&spec.stdout)?)
        .stderr(stdio(&spec.stderr)?);
    let mut child = cmd.spawn()?;
    let pid = child.id().map_or(0, |p| p as i32);
    let stdout = child
        .stdout
        .take()
        .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let stderr = child
        .stderr
        .take()
        .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    Ok(Started {
        pid,
        stdout,
        stderr,
        exit: Box::pin(async move {
            match child.wait().await {
                Ok(status) => Ended::from(status),
                Err(e) => {
                    warn!(pid, error = %e, "cannot wait for worker");
                    Ended::Exited(-1)
                }
            }
        }),
    })
}

/// Has the fork server fork the worker, with the environment an executed
/// worker would have (the agent's, the spec's on top, no secrets).
async fn fork(
    server: &ForkServer,
    spec: &WorkerSpec,
    group: ForkGroup,
) -> std::io::Result<Started> {
    let (out, stdout) = child_end(&spec.stdout, 1)?;
    let (err, stderr) = child_end(&spec.stderr, 2)?;
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| !spec.env.iter().any(|(s, _)| s == k))
        .collect();
    env.extend(spec.env.iter().cloned());
    env.retain(|(k, _)| !SECRET_VARIABLES.contains(&k.as_str()));
    let forked = server
        .spawn(ForkRequest {
            local_rank: spec.local_rank,
            global_rank: spec.global_rank,
            env,
            stdout: out,
            stderr: err,
            argv: server
                .runs_scripts()
                .then(|| spec.argv.get(1..).unwrap_or_default().to_vec()),
            tracer: spec.readable_stacks().then(std::process::id),
            cpus: spec.cpus.as_ref().map(|c| c.iter().collect()),
            group: Some(group),
        })
        .await
        .map_err(std::io::Error::other)?;
    let pid = forked.pid;
    Ok(Started {
        pid,
        stdout,
        stderr,
        exit: Box::pin(async move {
            forked.exit.await.unwrap_or_else(|_| {
                warn!(pid, "the fork server stopped reporting this worker");
                Ended::Signaled(Signal::SIGKILL as i32)
            })
        }),
    })
}

/// The worker's end of a stream (`target`: 1 or 2) and, for a pipe, the
/// agent's end to read.
fn child_end(
    sink: &Sink,
    target: i32,
) -> std::io::Result<(
    OwnedFd,
    Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>,
)> {
    Ok(match sink {
        Sink::Inherit => {
            let fd = if target == 1 {
                std::io::stdout().as_fd().try_clone_to_owned()?
            } else {
                std::io::stderr().as_fd().try_clone_to_owned()?
            };
            (fd, None)
        }
        Sink::Null => (
            OwnedFd::from(std::fs::OpenOptions::new().write(true).open("/dev/null")?),
            None,
        ),
        Sink::Pipe { .. } => {
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            let read = tokio::net::unix::pipe::Receiver::from_owned_fd(read)?;
            (write, Some(Box::new(read)))
        }
    })
}

fn stdio(sink: &Sink) -> std::io::Result<Stdio> {
    Ok(match sink {
        Sink::Inherit => Stdio::inherit(),
        Sink::Null => Stdio::null(),
        Sink::Pipe { .. } => Stdio::piped(),
    })
}

/// Console lines for a stream with a `prefix` (tee'd and shown), and
/// their copies in a filtered file (torchrun tails the same tee'd files
/// for both).
fn to_console(
    prefix: &Option<Vec<u8>>,
    err: bool,
    console: &Option<Console>,
    filtered: &Option<Filtered>,
) -> Option<ToConsole> {
    Some(ToConsole {
        console: console.clone()?,
        prefix: prefix.clone()?,
        err,
        filtered: filtered.clone(),
    })
}

fn spawn_pump(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    file: crate::files::FileAt,
    files: RankFiles,
    console: Option<ToConsole>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = tee::pump(pipe, &file, &files, console).await {
            warn!(file = %file.path().display(), error = %e, "cannot read a worker's output pipe");
        }
    })
}

impl Drop for WorkerGroup {
    fn drop(&mut self) {
        // A group dropped without `stop` (an error path) must not leave workers behind.
        if !self.all_ended() {
            self.signal_live(Signal::SIGKILL);
        }
    }
}
