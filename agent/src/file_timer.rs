//! Hang detection: the agent serves torchrun's `FileTimer` protocol, so a
//! script that arms `torch.distributed.elastic.timer.expires(after=...)`
//! with a `FileTimerClient` on `TORCHELASTIC_TIMER_FILE` works unchanged.
//!
//! torchrun starts this server only when `TORCHELASTIC_ENABLE_FILE_TIMER=1`
//! is in its environment; so does the agent. Requests are JSON lines
//! written to a named pipe, each smaller than `PIPE_BUF` so writes from
//! several workers never interleave:
//! `{"version": 1, "pid": 42, "scope_id": "step", "expiration_time": 1.7e9, "signal": 9}`
//! (`expiration_time` in seconds since the epoch; a negative one releases
//! the timer). torchrun kills a worker whose timer expired with the timer's
//! signal and then kills itself. accel treats it as a worker failure: it
//! records the hung worker's Python stacks (`py-spy dump`, when installed)
//! in the worker's error file, so the failure report and the job-wide
//! root-cause summary show where it hung, then sends the signal; the exit
//! that follows restarts the job as any failure does. Before the signal,
//! the agent asks the rendezvous for every rank's stacks (`crate::stacks`),
//! so the report also says where the other ranks were when this one hung,
//! grouped; without an answer (no rendezvous reached, or too slow) it dumps
//! the hung worker alone.
//!
//! Everything on the pipe is untrusted: lines are bounded, malformed ones
//! are dropped, the number of timers is bounded, and only a process in one
//! of this node's workers' process groups can be signalled.
//!
//! # Whose requests are accepted
//! A named pipe does not say who wrote to it, and any process of the
//! agent's user may open it (mode 0600). So a request is accepted only for
//! a process of one of the running round's workers: the worker itself, or
//! a process in its process group (a DataLoader worker, a subprocess that
//! arms its own timer, as torchrun's server would serve it). Others are
//! dropped and counted (`accel_agent_file_timer_requests_dropped_total`,
//! and one aggregated warning, at most one per [`REPORT_EVERY`]): thousands of
//! far-future timers for some live process that is no worker's, which
//! would fill the table and make a real worker's timer be dropped, now
//! change nothing. (torchrun accepts any pid.)
//!
//! A worker may arm a timer before the agent has recorded the round's
//! workers (the agent learns the pids as the processes start). So a
//! request of a process that is not a worker yet waits, at most
//! [`PENDING_GRACE`] and [`MAX_PENDING`] of them, oldest displaced first,
//! and is accepted if its process turns out to be one. A release
//! (negative expiry) is always applied.
//!
//! What the pipe cannot tell apart: a process of the agent's user that
//! writes a request naming a worker's pid (to re-arm or release its timer)
//! looks like that worker. That user can also signal the workers directly.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tracing::{debug, warn};

/// The longest request line (torch's client refuses longer ones).
pub const MAX_LINE: usize = 4096;

/// Most timers held at once.
pub const MAX_TIMERS: usize = 4096;

/// How often expiries are checked (torchrun: 0.1 s).
const TICK: Duration = Duration::from_millis(100);

/// How long an expired timer of a process that is no round's worker is
/// kept (it may become one: a worker can arm a timer before the agent has
/// recorded it) before it is dropped.
pub const UNOWNED_GRACE: f64 = 60.0;

/// How long collecting a hung worker's stacks may take.
const STACKS_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the job-wide collection of a hang may take (the nodes get four
/// fifths of it): the hung worker keeps running meanwhile, nothing else waits.
const JOB_STACKS_TIMEOUT: Duration = Duration::from_secs(10);

/// Most of the job-wide stacks a hung worker's error file carries (the
/// failure report's text is bounded at 64 KiB).
const JOB_STACKS_IN_REPORT: usize = 40 * 1024;

/// How long a request of a process that is not (yet) a worker waits for
/// the agent to record the round's workers.
pub const PENDING_GRACE: f64 = 5.0;

/// Most requests waiting so at once (the oldest is dropped for a new one).
pub const MAX_PENDING: usize = 256;

/// How often dropped requests are reported, at most.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Why requests are dropped: the label of the dropped-requests metric.
pub const DROP_REASONS: [&str; 3] = ["not_a_worker", "malformed", "table_full"];

/// One request from a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The requesting process.
    pub pid: i32,
    /// Which timer of that process.
    pub scope: String,
    /// When it expires, in seconds since the epoch; negative: released.
    pub expires: f64,
    /// The signal to send when it expires (≤ 0: none).
    pub signal: i32,
}

/// Parses one request line.
pub fn parse(line: &[u8]) -> Result<Request, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let pid = v
        .get("pid")
        .and_then(Value::as_i64)
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 1)
        .ok_or("'pid' is not a process id")?;
    let scope = v
        .get("scope_id")
        .and_then(Value::as_str)
        .ok_or("'scope_id' is not text")?
        .chars()
        .take(256)
        .collect();
    let expires = v
        .get("expiration_time")
        .and_then(Value::as_f64)
        .filter(|e| e.is_finite())
        .ok_or("'expiration_time' is not a number")?;
    let signal = v
        .get("signal")
        .and_then(Value::as_i64)
        .map_or(0, |s| s.clamp(-1, 64) as i32);
    Ok(Request {
        pid,
        scope,
        expires,
        signal,
    })
}

/// A process whose timers expired.
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    /// The process.
    pub pid: i32,
    /// The expired scopes, earliest first.
    pub scopes: Vec<String>,
    /// The signal of the earliest expired timer that has one (≤ 0: none).
    pub signal: i32,
}

/// The armed timers: a pure table, clock passed in.
#[derive(Debug, Default)]
pub struct Timers {
    armed: HashMap<(i32, String), Request>,
}

impl Timers {
    /// Arms or releases; `false` if the table is full (the request is dropped).
    pub fn apply(&mut self, req: Request) -> bool {
        let key = (req.pid, req.scope.clone());
        if req.expires < 0.0 {
            self.armed.remove(&key);
            return true;
        }
        if self.armed.len() >= MAX_TIMERS && !self.armed.contains_key(&key) {
            return false;
        }
        self.armed.insert(key, req);
        true
    }

    /// Takes the timers expired at `now` (seconds since the epoch), by
    /// process, of the processes `owner` finds one for (this round's
    /// workers), each with that owner; a process that is not one yet keeps
    /// its expired timers until it is, for [`UNOWNED_GRACE`].
    /// A process that will be signalled loses all its timers; one whose
    /// expired timers ask for no signal loses only those.
    pub fn expired<T>(&mut self, now: f64, owner: impl Fn(i32) -> Option<T>) -> Vec<(Expired, T)> {
        let mut by_pid: HashMap<i32, Vec<Request>> = HashMap::new();
        for r in self.armed.values().filter(|r| r.expires <= now) {
            by_pid.entry(r.pid).or_default().push(r.clone());
        }
        let owned: HashMap<i32, (Vec<Request>, T)> = by_pid
            .into_iter()
            .filter_map(|(pid, timers)| Some((pid, (timers, owner(pid)?))))
            .collect();
        // Expired long ago and still nobody's: a stranger's, dropped.
        let strangers =
            |r: &Request| r.expires + UNOWNED_GRACE <= now && !owned.contains_key(&r.pid);
        self.armed.retain(|_, r| !strangers(r));
        let mut out: Vec<(Expired, T)> = owned
            .into_iter()
            .map(|(pid, (mut timers, owner))| {
                timers.sort_by(|a, b| a.expires.total_cmp(&b.expires));
                let expired = Expired {
                    pid,
                    signal: timers
                        .iter()
                        .map(|t| t.signal)
                        .find(|s| *s > 0)
                        .unwrap_or(0),
                    scopes: timers.into_iter().map(|t| t.scope).collect(),
                };
                (expired, owner)
            })
            .collect();
        out.sort_by_key(|(e, _)| e.pid);
        for (e, _) in &out {
            if e.signal > 0 {
                self.armed.retain(|(pid, _), _| *pid != e.pid);
            } else {
                for scope in &e.scopes {
                    self.armed.remove(&(e.pid, scope.clone()));
                }
            }
        }
        out
    }

    /// Drops the timers of processes `alive` says are gone.
    pub fn forget(&mut self, alive: impl Fn(i32) -> bool) {
        self.armed.retain(|(pid, _), _| alive(*pid));
    }

    /// How many are armed.
    pub fn len(&self) -> usize {
        self.armed.len()
    }

    /// Whether none is armed.
    pub fn is_empty(&self) -> bool {
        self.armed.is_empty()
    }
}

/// Requests of processes that were no worker's when they arrived, waiting
/// (at most [`PENDING_GRACE`], [`MAX_PENDING`] of them) for the agent to
/// record the round they may belong to. Pure, clock passed in.
#[derive(Debug, Default)]
pub struct Pending {
    queue: std::collections::VecDeque<(f64, Request)>,
}

impl Pending {
    /// Holds `req`, received at `now`; returns a request displaced to make
    /// room, if any (dropped: no worker's).
    pub fn hold(&mut self, now: f64, req: Request) -> Option<Request> {
        let displaced = if self.queue.len() >= MAX_PENDING {
            self.queue.pop_front().map(|(_, r)| r)
        } else {
            None
        };
        self.queue.push_back((now, req));
        displaced
    }

    /// Drops the waiting requests of `pid`'s timer `scope` (a release).
    pub fn release(&mut self, pid: i32, scope: &str) {
        self.queue
            .retain(|(_, r)| !(r.pid == pid && r.scope == scope));
    }

    /// The requests whose process `owned` now says is a worker's, and
    /// those that waited [`PENDING_GRACE`] in vain (dropped), each in the
    /// order they came.
    pub fn settle(
        &mut self,
        now: f64,
        owned: impl Fn(i32) -> bool,
    ) -> (Vec<Request>, Vec<Request>) {
        let mut accepted = Vec::new();
        let mut expired = Vec::new();
        self.queue.retain(|(at, r)| {
            if owned(r.pid) {
                accepted.push(r.clone());
                false
            } else if now - at >= PENDING_GRACE {
                expired.push(r.clone());
                false
            } else {
                true
            }
        });
        (accepted, expired)
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Dropped requests since the last report, for one aggregated line.
#[derive(Debug, Default, PartialEq)]
pub struct Dropped {
    /// For processes that are no worker's.
    pub not_a_worker: u64,
    /// Lines that are no request.
    pub malformed: u64,
    /// Workers' requests beyond [`MAX_TIMERS`].
    pub table_full: u64,
    /// The last process named by a request that was no worker's.
    pub last_stranger: Option<i32>,
}

impl Dropped {
    /// The report of what was dropped, if anything was; starts counting again.
    pub fn report(&mut self) -> Option<String> {
        let d = std::mem::take(self);
        if d == Dropped::default() {
            return None;
        }
        let mut parts = Vec::new();
        if d.not_a_worker > 0 {
            parts.push(format!(
                "{} for processes in no worker's process group of this node (the last for pid {}): \
                 only the round's workers may arm timers",
                d.not_a_worker,
                d.last_stranger.unwrap_or(0)
            ));
        }
        if d.malformed > 0 {
            parts.push(format!(
                "{} malformed or over {MAX_LINE} bytes",
                d.malformed
            ));
        }
        if d.table_full > 0 {
            parts.push(format!(
                "{} beyond the {MAX_TIMERS} timers the agent holds",
                d.table_full
            ));
        }
        Some(format!("dropped FileTimer requests: {}", parts.join("; ")))
    }
}

/// A worker of the running round, as the timer server knows it.
#[derive(Debug, Clone)]
pub struct Watched {
    /// Its pid, which is also its process group.
    pub pid: i32,
    /// Its global rank.
    pub rank: u32,
    /// Its local rank.
    pub local_rank: u32,
    /// Its `TORCHELASTIC_ERROR_FILE`, in its rank directory's handle.
    pub error_file: crate::files::FileAt,
}

/// The running round's workers, updated by the agent as rounds start.
pub type Workers = Arc<Mutex<Vec<Watched>>>;

/// The agent's timer server: the named pipe, and the task that reads it.
#[derive(Debug)]
pub struct FileTimerServer {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FileTimerServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl FileTimerServer {
    /// Makes the named pipe at `path` (replacing an old pipe there, as
    /// torchrun does; refusing any other file) and serves it; dropped
    /// requests are counted in `metrics`; a hang's job-wide stacks are asked
    /// through `job`.
    pub fn start(
        path: &Path,
        workers: Workers,
        metrics: crate::metrics::AgentMetrics,
        job: crate::stacks::JobStacks,
    ) -> io::Result<Self> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_fifo() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "TORCHELASTIC_TIMER_FILE {} exists and is not a named pipe; choose another path",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(io::Error::from)?;
        // Open for reading and writing: the pipe never reports an end when
        // the last worker closes it.
        let pipe = tokio::net::unix::pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(path)?;
        // The pipe opened must be the one made above: in a directory others
        // may write, one of theirs could have taken its name in between, and
        // they could then write requests into it.
        let st = nix::sys::stat::fstat(&pipe).map_err(io::Error::from)?;
        if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "TORCHELASTIC_TIMER_FILE {} was replaced by another user's pipe while the agent created it; choose a path in a directory only you can write",
                    path.display()
                ),
            ));
        }
        let task = tokio::spawn(serve(pipe, workers, metrics, job));
        Ok(Self {
            path: path.to_path_buf(),
            task,
        })
    }

    /// Where the pipe is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Reads requests and acts on expiries until aborted.
async fn serve(
    mut pipe: tokio::net::unix::pipe::Receiver,
    workers: Workers,
    metrics: crate::metrics::AgentMetrics,
    job: crate::stacks::JobStacks,
) {
    let mut timers = Timers::default();
    let mut pending = Pending::default();
    let mut dropped = Dropped::default();
    let mut line: Vec<u8> = Vec::new();
    let mut overlong = false;
    let mut buf = [0u8; 8192];
    let mut tick = tokio::time::interval(TICK);
    // The first drops are reported at once, later ones every REPORT_EVERY.
    let mut reported: Option<tokio::time::Instant> = None;
    // The workers (by process group) whose hang is being handled.
    let acting: Arc<Mutex<std::collections::HashSet<i32>>> = Arc::default();
    let stranger = |dropped: &mut Dropped, pid: i32| {
        dropped.not_a_worker += 1;
        dropped.last_stranger = Some(pid);
        metrics.file_timer_dropped("not_a_worker", 1);
    };
    let arm = |timers: &mut Timers, dropped: &mut Dropped, req: Request| {
        if !timers.apply(req) {
            dropped.table_full += 1;
            metrics.file_timer_dropped("table_full", 1);
        }
    };
    loop {
        tokio::select! {
            n = pipe.read(&mut buf) => {
                let n = match n {
                    Ok(n) => n,
                    Err(e) => {
                        warn!(error = %e, "cannot read the FileTimer pipe; hang detection is off");
                        return;
                    }
                };
                // One look at the round's workers per read, not per line.
                let watched = lock(&workers).clone();
                for &b in &buf[..n] {
                    if b != b'\n' {
                        if line.len() < MAX_LINE {
                            line.push(b);
                        } else {
                            overlong = true;
                        }
                        continue;
                    }
                    let parsed = if overlong {
                        Err(format!("over {MAX_LINE} bytes"))
                    } else {
                        parse(&line)
                    };
                    line.clear();
                    overlong = false;
                    match parsed {
                        Ok(req) if req.expires < 0.0 => {
                            pending.release(req.pid, &req.scope);
                            timers.apply(req);
                        }
                        Ok(req) if owner(req.pid, &watched).is_some() => {
                            arm(&mut timers, &mut dropped, req);
                        }
                        Ok(req) => {
                            if let Some(old) = pending.hold(now_unix(), req) {
                                stranger(&mut dropped, old.pid);
                            }
                        }
                        Err(e) => {
                            debug!(error = %e, "dropped a malformed FileTimer request");
                            dropped.malformed += 1;
                            metrics.file_timer_dropped("malformed", 1);
                        }
                    }
                }
            }
            _ = tick.tick() => {
                let watched = lock(&workers).clone();
                let now = now_unix();
                if !pending.is_empty() {
                    let (accepted, expired) = pending.settle(now, |pid| owner(pid, &watched).is_some());
                    for req in accepted {
                        arm(&mut timers, &mut dropped, req);
                    }
                    for req in expired {
                        stranger(&mut dropped, req.pid);
                    }
                }
                // Each expiry on its own task: collecting one hung rank's
                // stacks must not delay another's, nor reading the pipe.
                for (e, worker) in timers.expired(now, |pid| owner(pid, &watched).cloned()) {
                    // One hang handled at a time per worker: a second
                    // py-spy would find it paused by the first.
                    let group = worker.pid;
                    if !lock(&acting).insert(group) {
                        debug!(pid = e.pid, "a FileTimer expired for a worker already being stopped; ignored");
                        continue;
                    }
                    let (workers, acting, job) = (workers.clone(), acting.clone(), job.clone());
                    tokio::spawn(async move {
                        act(&e, &worker, &workers, &job).await;
                        lock(&acting).remove(&group);
                    });
                }
                timers.forget(|pid| nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok());
                if reported.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
                    if let Some(line) = dropped.report() {
                        warn!("{line}");
                        reported = Some(tokio::time::Instant::now());
                    }
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The worker `pid` belongs to: the one whose process group it is in.
pub(crate) fn owner(pid: i32, watched: &[Watched]) -> Option<&Watched> {
    let pgid = nix::unistd::getpgid(Some(Pid::from_raw(pid))).ok()?;
    watched.iter().find(|w| w.pid == pgid.as_raw())
}

/// An expired timer of `worker`'s process group: the stacks into the
/// worker's error file, then the signal, if `workers` still lists it.
async fn act(e: &Expired, worker: &Watched, workers: &Workers, job: &crate::stacks::JobStacks) {
    let scopes = e.scopes.join("', '");
    if e.signal <= 0 {
        warn!(pid = e.pid, rank = worker.rank, scopes = %scopes, "a FileTimer expired, but its client asked for no signal; the worker is left running");
        return;
    }
    warn!(pid = e.pid, rank = worker.rank, scopes = %scopes, "a FileTimer expired: the worker hung; collecting its stacks, then stopping it");
    let message = format!(
        "FileTimer '{scopes}' expired: rank {} (pid {}) hung past its expires(after=...)",
        worker.rank, e.pid
    );
    let sig = Signal::try_from(e.signal).unwrap_or_else(|_| {
        warn!(
            signal = e.signal,
            "a FileTimer asked for an unknown signal; sending SIGKILL"
        );
        Signal::SIGKILL
    });
    stop_hung(e.pid, worker, &message, sig, workers, job).await;
}

/// A hung process `pid` of `worker`'s group (a FileTimer's, or a learned
/// timeout's, `crate::hang`): every rank's stacks and `message` into the
/// worker's error file, then `sig`, if `workers` still lists it.
pub(crate) async fn stop_hung(
    pid: i32,
    worker: &Watched,
    message: &str,
    sig: Signal,
    workers: &Workers,
    job: &crate::stacks::JobStacks,
) {
    let stacks = hung_stacks(pid, worker.rank, job).await;
    if let Err(err) = write_error_file(&worker.error_file, message, &stacks) {
        warn!(file = %worker.error_file.path().display(), error = %err, "cannot write the hung worker's error file");
    }
    // Still that worker's process after the dump (not a reused pid)?
    if owner(pid, &lock(workers).clone()).is_none_or(|w| w.pid != worker.pid) {
        return;
    }
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
}

/// The hung worker's stacks, then every rank's, grouped, as the
/// rendezvous collected them; the hung worker's alone (its own `py-spy
/// dump`) when the collection has no answer for it.
async fn hung_stacks(pid: i32, rank: u32, job: &crate::stacks::JobStacks) -> String {
    let grouped = match job.collect(JOB_STACKS_TIMEOUT).await {
        Ok((job_id, r)) => {
            let own = r
                .groups
                .iter()
                .find(|g| g.ranks.iter().any(|k| k.rank == rank))
                .map(|g| g.stack.clone());
            let all = accel_wire::stacks::render(&job_id, &r);
            let all = accel_wire::limits::truncated(&all, JOB_STACKS_IN_REPORT);
            let all = format!("\nEvery rank's stacks when rank {rank} hung, grouped (`rdzv-server stacks`):\n{all}");
            match own {
                Some(own) => return format!("{own}{all}"),
                None => Some(all),
            }
        }
        Err(why) => {
            warn!(error = %why, "could not collect the job's stacks; dumping the hung worker's alone");
            None
        }
    };
    let own = crate::stacks::dump(pid, false, STACKS_TIMEOUT).await;
    format!("{own}{}", grouped.unwrap_or_default())
}

/// Writes torch's error-file format, which the failure report reads: 0600,
/// in the rank directory's handle, replacing (never following) whatever the
/// worker left at that name.
fn write_error_file(at: &crate::files::FileAt, message: &str, stacks: &str) -> io::Result<()> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let body = serde_json::json!({
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": stacks, "timestamp": secs.to_string()},
        }
    });
    // Whole or not at all: the report may be read while this is written.
    at.dir()
        .replace_file(at.name(), body.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(pid: i32, scope: &str, expires: f64, signal: i32) -> Request {
        Request {
            pid,
            scope: scope.into(),
            expires,
            signal,
        }
    }

    #[test]
    fn torchs_request_lines_parse_and_junk_does_not() {
        let r = parse(br#"{"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": 1700000000.5, "signal": 9}"#)
            .expect("valid");
        assert_eq!(r, req(4242, "step", 1_700_000_000.5, 9));
        for junk in [
            &b"{}"[..],
            b"not json",
            br#"{"pid": 1, "scope_id": "s", "expiration_time": 1}"#,
            br#"{"pid": -5, "scope_id": "s", "expiration_time": 1}"#,
            br#"{"pid": 99999999999, "scope_id": "s", "expiration_time": 1}"#,
            br#"{"pid": 7, "scope_id": 3, "expiration_time": 1}"#,
            br#"{"pid": 7, "scope_id": "s", "expiration_time": "soon"}"#,
        ] {
            assert!(parse(junk).is_err(), "{}", String::from_utf8_lossy(junk));
        }
    }

    #[test]
    fn timers_expire_per_process_and_releases_disarm() {
        let mut t = Timers::default();
        assert!(t.apply(req(10, "a", 100.0, 9)));
        assert!(t.apply(req(10, "b", 90.0, 0)));
        assert!(t.apply(req(11, "a", 200.0, 15)));
        assert!(t.apply(req(12, "a", 50.0, 9)));
        assert!(t.apply(req(12, "a", -1.0, 0)), "released");
        let all = |_| Some(());
        assert!(t.expired(89.0, all).is_empty());
        let e: Vec<Expired> = t.expired(150.0, all).into_iter().map(|(e, ())| e).collect();
        assert_eq!(
            e,
            [Expired {
                pid: 10,
                scopes: vec!["b".into(), "a".into()],
                signal: 9
            }],
            "earliest first; the first signal that is one"
        );
        assert_eq!(t.len(), 1, "pid 10's timers are gone once acted on");
        t.forget(|pid| pid != 11);
        assert!(t.is_empty());
    }

    #[test]
    fn an_unsignalled_expiry_keeps_the_other_timers_and_strangers_wait() {
        let mut t = Timers::default();
        assert!(t.apply(req(10, "watch", 50.0, 0)));
        assert!(t.apply(req(10, "step", 100.0, 9)));
        assert!(t.apply(req(20, "early", 10.0, 9)));
        // 20 is not (yet) a worker of this round: its timer waits.
        let e = t.expired(60.0, |pid| (pid == 10).then_some("rank 0"));
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].0.pid, e[0].0.signal, e[0].1), (10, 0, "rank 0"));
        assert_eq!(t.len(), 2, "pid 10's armed SIGKILL timer survives");
        let e = t.expired(120.0, |_| Some(()));
        let got: Vec<_> = e.iter().map(|(e, _)| (e.pid, e.signal)).collect();
        assert_eq!(got, [(10, 9), (20, 9)]);
        assert!(t.is_empty());
        // A stranger's expired timer is kept for the grace, then dropped.
        assert!(t.apply(req(30, "lost", 10.0, 9)));
        let nobody = |_| None::<()>;
        assert!(t.expired(10.0 + UNOWNED_GRACE - 1.0, nobody).is_empty());
        assert_eq!(t.len(), 1);
        assert!(t.expired(10.0 + UNOWNED_GRACE, nobody).is_empty());
        assert!(t.is_empty(), "dropped after the grace");
    }

    #[test]
    fn only_a_process_in_a_watched_workers_group_is_owned() {
        // This test process leads no group of its own in the list: a worker
        // whose pid is our group is the owner; anything else is nobody's.
        let me = std::process::id() as i32;
        let group = nix::unistd::getpgid(None).expect("pgid").as_raw();
        let dir = std::sync::Arc::new(
            crate::files::Dir::open_base(Path::new("/dev"), "test").expect("/dev"),
        );
        let w = |pid| Watched {
            pid,
            rank: 3,
            local_rank: 1,
            error_file: crate::files::FileAt::new(dir.clone(), "null"),
        };
        assert_eq!(owner(me, &[w(group)]).map(|w| w.rank), Some(3));
        assert!(owner(me, &[w(group + 1)]).is_none(), "another group");
        assert!(owner(me, &[]).is_none(), "no round running");
        assert!(owner(i32::MAX, &[w(group)]).is_none(), "no such process");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = Timers::default();
        for i in 0..MAX_TIMERS {
            assert!(t.apply(req(7, &i.to_string(), 1.0, 9)));
        }
        assert!(!t.apply(req(8, "one more", 1.0, 9)));
        assert!(t.apply(req(7, "0", 2.0, 9)), "re-arming an armed timer");
        assert!(t.apply(req(7, "0", -1.0, 9)), "and releasing are kept");
    }
    #[test]
    fn a_request_of_a_process_that_becomes_a_worker_is_accepted_late() {
        let mut p = Pending::default();
        assert!(p.hold(100.0, req(7, "step", 200.0, 9)).is_none());
        assert!(p.hold(100.0, req(8, "step", 200.0, 9)).is_none());
        // Not yet: both wait.
        let (accepted, expired) = p.settle(101.0, |_| false);
        assert!(accepted.is_empty() && expired.is_empty());
        // The agent recorded pid 7 as a worker: accepted; 8 waits on.
        let (accepted, expired) = p.settle(102.0, |pid| pid == 7);
        assert_eq!(accepted, [req(7, "step", 200.0, 9)]);
        assert!(expired.is_empty());
        assert_eq!(p.len(), 1);
        // 8 never becomes one: dropped after the grace.
        let (accepted, expired) = p.settle(100.0 + PENDING_GRACE, |pid| pid == 7);
        assert!(accepted.is_empty());
        assert_eq!(expired, [req(8, "step", 200.0, 9)]);
        assert!(p.is_empty());
    }

    #[test]
    fn waiting_requests_are_bounded_and_releases_withdraw_them() {
        let mut p = Pending::default();
        for i in 0..MAX_PENDING {
            assert!(p.hold(1.0, req(1000 + i as i32, "s", 9.0, 9)).is_none());
        }
        let displaced = p.hold(1.0, req(42, "s", 9.0, 9)).expect("full");
        assert_eq!(displaced.pid, 1000, "the oldest goes first");
        assert_eq!(p.len(), MAX_PENDING);
        p.release(42, "s");
        p.release(1001, "other scope");
        assert_eq!(p.len(), MAX_PENDING - 1);
        let (accepted, _) = p.settle(2.0, |pid| pid == 42 || pid == 1001);
        assert_eq!(accepted, [req(1001, "s", 9.0, 9)]);
    }

    #[test]
    fn dropped_requests_are_one_line_per_report() {
        let mut d = Dropped::default();
        assert_eq!(d.report(), None);
        d.not_a_worker = 5000;
        d.last_stranger = Some(4242);
        d.malformed = 2;
        let line = d.report().expect("a line");
        assert_eq!(
            line,
            "dropped FileTimer requests: 5000 for processes in no worker's process group of this node \
             (the last for pid 4242): only the round's workers may arm timers; 2 malformed or over 4096 bytes"
        );
        assert_eq!(d.report(), None, "counted afresh");
    }
}
