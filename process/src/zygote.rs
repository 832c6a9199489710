//! Hot restart (`--preload MODULES`): workers forked from a prepared Python
//! interpreter instead of executed, so a round does not pay for starting
//! Python and importing torch again in every rank.
//!
//! The **zygote** is a fresh `python -u` that runs the `accel` package's
//! fork server (`python/accel/_forkserver.py`, compiled into the agent and
//! handed over on its standard input), imports the modules and nothing
//! else, checks that forking it is safe (one thread, no CUDA context), and
//! says so in one line on its socket; then it speaks the [`fork_server`]
//! protocol, each request carrying the worker's whole environment, its
//! output pipes and the script's argv. The worker runs the script as
//! `python -u script.py args` would (see the Python module for what that
//! means). Supervision is the agent's, exactly as for executed workers:
//! process groups, signals, exits, the guard, the error file.
//!
//! The zygote is started with the agent, so the first round's imports
//! overlap the rendezvous, and it has the environment every worker shares
//! (the agent's, the launcher's variables, `OMP_NUM_THREADS`): modules that
//! read the environment when imported see what a cold worker would. Forking
//! leaves the zygote unchanged, so one serves every round; one that dies is
//! replaced at once, and a round waits for a zygote being prepared (a cold
//! start would import the same modules from the beginning). If preparing
//! fails, or forking would be unsafe, rounds start cold, with the reason
//! logged once.
//!
//! [`fork_server`]: crate::fork_server

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use crate::fork_server::{ForkServer, MAX_LINE};

/// The fork server's source, run by the zygote.
const SOURCE: &str = include_str!("../../python/accel/_forkserver.py");

/// What `python -c` runs: the source above, read from standard input.
const BOOT: &str = "import sys; exec(compile(sys.stdin.read(), '<accel zygote>', 'exec'))";

/// The descriptor number of the zygote's socket.
const ZYGOTE_FD: i32 = 3;

/// How long importing the preloaded modules may take.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(600);

/// How many zygote deaths turn rounds cold for good (the first deaths are
/// replaced).
const MAX_REPLACEMENTS: u32 = 5;

/// What the zygote is started with.
#[derive(Debug, Clone)]
pub struct ZygoteSpec {
    /// The Python interpreter (the workers').
    pub python: String,
    /// The modules to import.
    pub modules: Vec<String>,
    /// The workers' `sys.path[0]`: the script's directory, or the working
    /// directory for `-m`.
    pub path: Option<PathBuf>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
}

/// Where the zygote is.
#[derive(Debug, Clone)]
enum State {
    /// Importing.
    Preparing,
    /// Serving forks.
    Ready(Arc<ForkServer>),
    /// Rounds start cold, for this reason.
    Cold(String),
}

/// The agent's zygote, kept ready in the background.
#[derive(Debug)]
pub struct Zygote {
    state: watch::Receiver<State>,
    keeper: tokio::task::JoinHandle<()>,
    /// Whether the reason for a cold start was logged.
    said_cold: std::sync::atomic::AtomicBool,
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // The keeper owns the process (killed on drop) and the socket.
        self.keeper.abort();
    }
}

impl Zygote {
    /// Starts preparing a zygote.
    pub fn start(spec: ZygoteSpec) -> Self {
        let (tx, state) = watch::channel(State::Preparing);
        let keeper = tokio::spawn(keep(spec, tx));
        Self {
            state,
            keeper,
            said_cold: false.into(),
        }
    }

    /// The fork server to start this round's workers with, once the zygote
    /// is ready; `None` (a cold start, its reason logged once) if it cannot
    /// serve.
    pub async fn server(&self) -> Option<Arc<ForkServer>> {
        let mut state = self.state.clone();
        loop {
            let now = state.borrow_and_update().clone();
            match now {
                State::Ready(server) if !server.is_closed() => return Some(server),
                State::Cold(why) => {
                    if !self
                        .said_cold
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        warn!("--preload: workers start cold (executed, not forked): {why}");
                    }
                    return None;
                }
                // Importing (a replacement, after a death, too): waiting
                // is never slower than a cold start, which imports the
                // same modules from the beginning.
                State::Preparing | State::Ready(_) => {
                    if state.changed().await.is_err() {
                        return None;
                    }
                }
            }
        }
    }
}

/// Keeps a zygote ready: prepares one, and replaces it when it dies.
async fn keep(spec: ZygoteSpec, tx: watch::Sender<State>) {
    let mut deaths = 0;
    loop {
        let _ = tx.send(State::Preparing);
        let (server, mut child, closed) = match prepare(&spec).await {
            Ok(z) => z,
            Err(why) => {
                let _ = tx.send(State::Cold(why));
                return;
            }
        };
        let _ = tx.send(State::Ready(server));
        let why = closed.await.unwrap_or_default();
        deaths += 1;
        if deaths >= MAX_REPLACEMENTS {
            let _ = tx.send(State::Cold(format!(
                "the zygote died {deaths} times (last: {why})"
            )));
            return;
        }
        let _ = tx.send(State::Preparing);
        let status = match child.wait().await {
            Ok(s) => crate::Ended::from(s).to_string(),
            Err(e) => e.to_string(),
        };
        warn!(%why, %status, "the zygote ended; preparing another");
    }
}

/// Starts a zygote and waits for its first line.
async fn prepare(
    spec: &ZygoteSpec,
) -> Result<(Arc<ForkServer>, Child, oneshot::Receiver<String>), String> {
    let started = tokio::time::Instant::now();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("cannot make the zygote's socket: {e}"))?;
    let mut cmd = Command::new(&spec.python);
    cmd.arg("-u")
        .arg("-c")
        .arg(BOOT)
        .args(["--fd", &ZYGOTE_FD.to_string()])
        .args(["--preload", &spec.modules.join(",")]);
    if let Some(path) = &spec.path {
        cmd.arg("--path").arg(path);
    }
    cmd.env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    crate::sys::kill_with_parent(&mut cmd);
    crate::sys::pass_fd(&mut cmd, theirs.as_raw_fd(), ZYGOTE_FD);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", spec.python))?;
    drop(theirs);
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(SOURCE.as_bytes())
            .await
            .map_err(|e| format!("cannot hand the zygote its code: {e}"))?;
    }
    ours.set_nonblocking(true)
        .map_err(|e| format!("the zygote's socket: {e}"))?;
    let mut sock =
        tokio::net::UnixStream::from_std(ours).map_err(|e| format!("the zygote's socket: {e}"))?;
    // The line is kept outside the read, so a read cut short by the
    // zygote's exit loses nothing: one that refuses writes why and exits
    // at once, and the rest of its line is still in the socket.
    let mut first = Vec::new();
    tokio::select! {
        r = tokio::time::timeout(PREPARE_TIMEOUT, first_line(&mut sock, &mut first)) => r.map_err(|_| {
            format!("importing {} took over {} s", spec.modules.join(","), PREPARE_TIMEOUT.as_secs())
        })?,
        status = child.wait() => {
            match tokio::time::timeout(Duration::from_secs(1), first_line(&mut sock, &mut first)).await {
                Ok(Ok(())) => Ok(()),
                _ => return Err(format!("the zygote ended before it was ready ({})", match status {
                    Ok(s) => crate::Ended::from(s).to_string(),
                    Err(e) => e.to_string(),
                })),
            }
        }
    }?;
    hello(&first)?;
    let fd = OwnedFd::from(
        sock.into_std()
            .map_err(|e| format!("the zygote's socket: {e}"))?,
    );
    let (tx, closed) = oneshot::channel();
    let server = ForkServer::start_for_scripts(fd, move |why| {
        let _ = tx.send(why.to_string());
    })
    .map_err(|e| e.to_string())?;
    info!(
        modules = %spec.modules.join(","),
        pid = child.id().unwrap_or(0),
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "zygote ready: workers start as its forks"
    );
    Ok((Arc::new(server), child, closed))
}

/// Reads one line into `line` (without buffering past it: the socket goes
/// on to the fork server's reader). What was read stays in `line` if the
/// read is dropped half-way, so reading again continues the same line.
async fn first_line(sock: &mut tokio::net::UnixStream, line: &mut Vec<u8>) -> Result<(), String> {
    let mut byte = [0u8; 1];
    loop {
        match sock.read(&mut byte).await {
            Ok(0) => return Err("the zygote closed its socket before it was ready".into()),
            Ok(_) if byte[0] == b'\n' => return Ok(()),
            Ok(_) if line.len() >= MAX_LINE => {
                return Err(format!("the zygote sent a line over {MAX_LINE} bytes"))
            }
            Ok(_) => line.push(byte[0]),
            Err(e) => return Err(format!("reading from the zygote: {e}")),
        }
    }
}

/// What the zygote's first line says: ready, or why not.
fn hello(line: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(line)
        .map_err(|e| format!("the zygote sent a malformed line ({e})"))?;
    let text = |k: &str| {
        v.get(k).map(|w| {
            let s = w.as_str().map_or_else(|| w.to_string(), str::to_owned);
            s.chars().take(4000).collect::<String>()
        })
    };
    if v.get("ready").is_some() {
        Ok(())
    } else if let Some(why) = text("unsafe") {
        Err(format!(
            "forking the zygote would be unsafe: {why}; preload only modules that start no thread when imported"
        ))
    } else if let Some(tb) = text("failed") {
        Err(format!("importing the preloaded modules failed:\n{tb}"))
    } else {
        Err("the zygote's first line is neither 'ready', 'unsafe' nor 'failed'".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_lines_say_ready_or_why_not() {
        assert!(hello(br#"{"ready": {"modules": ["torch"], "seconds": 1.5}}"#).is_ok());
        let e = hello(br#"{"unsafe": "importing them started 1 thread(s)"}"#).expect_err("refused");
        assert!(e.contains("unsafe") && e.contains("1 thread"), "{e}");
        let e = hello(br#"{"failed": "ModuleNotFoundError: No module named 'nope'"}"#)
            .expect_err("refused");
        assert!(e.contains("No module named 'nope'"), "{e}");
        assert!(hello(b"{}").is_err());
        assert!(hello(b"junk").expect_err("refused").contains("malformed"));
    }
}
