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
//! that follows restarts the job as any failure does.
//!
//! Everything on the pipe is untrusted: lines are bounded, malformed ones
//! are dropped, the number of timers is bounded, and only a process in one
//! of this node's workers' process groups can be signalled.

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

/// A worker of the running round, as the timer server knows it.
#[derive(Debug, Clone)]
pub struct Watched {
    /// Its pid, which is also its process group.
    pub pid: i32,
    /// Its global rank.
    pub rank: u32,
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
    /// torchrun does; refusing any other file) and serves it.
    pub fn start(path: &Path, workers: Workers) -> io::Result<Self> {
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
        let task = tokio::spawn(serve(pipe, workers));
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
async fn serve(mut pipe: tokio::net::unix::pipe::Receiver, workers: Workers) {
    let mut timers = Timers::default();
    let mut line: Vec<u8> = Vec::new();
    let mut overlong = false;
    let mut buf = [0u8; 8192];
    let mut tick = tokio::time::interval(TICK);
    let mut said_full = false;
    // The workers (by process group) whose hang is being handled.
    let acting: Arc<Mutex<std::collections::HashSet<i32>>> = Arc::default();
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
                for &b in &buf[..n] {
                    if b != b'\n' {
                        if line.len() < MAX_LINE {
                            line.push(b);
                        } else {
                            overlong = true;
                        }
                        continue;
                    }
                    if overlong {
                        debug!("dropped a FileTimer request over {MAX_LINE} bytes");
                    } else {
                        match parse(&line) {
                            Ok(req) => {
                                if !timers.apply(req) && !said_full {
                                    said_full = true;
                                    warn!("{MAX_TIMERS} FileTimer timers are armed; further ones are dropped");
                                }
                            }
                            Err(e) => debug!(error = %e, "dropped a malformed FileTimer request"),
                        }
                    }
                    line.clear();
                    overlong = false;
                }
            }
            _ = tick.tick() => {
                // Each expiry on its own task: collecting one hung rank's
                // stacks must not delay another's, nor reading the pipe.
                let watched = lock(&workers).clone();
                for (e, worker) in timers.expired(now_unix(), |pid| owner(pid, &watched).cloned()) {
                    // One hang handled at a time per worker: a second
                    // py-spy would find it paused by the first.
                    let group = worker.pid;
                    if !lock(&acting).insert(group) {
                        debug!(pid = e.pid, "a FileTimer expired for a worker already being stopped; ignored");
                        continue;
                    }
                    let (workers, acting) = (workers.clone(), acting.clone());
                    tokio::spawn(async move {
                        act(&e, &worker, &workers).await;
                        lock(&acting).remove(&group);
                    });
                }
                timers.forget(|pid| nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok());
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The worker `pid` belongs to: the one whose process group it is in.
fn owner(pid: i32, watched: &[Watched]) -> Option<&Watched> {
    let pgid = nix::unistd::getpgid(Some(Pid::from_raw(pid))).ok()?;
    watched.iter().find(|w| w.pid == pgid.as_raw())
}

/// An expired timer of `worker`'s process group: the stacks into the
/// worker's error file, then the signal, if `workers` still lists it.
async fn act(e: &Expired, worker: &Watched, workers: &Workers) {
    let scopes = e.scopes.join("', '");
    if e.signal <= 0 {
        warn!(pid = e.pid, rank = worker.rank, scopes = %scopes, "a FileTimer expired, but its client asked for no signal; the worker is left running");
        return;
    }
    warn!(pid = e.pid, rank = worker.rank, scopes = %scopes, "a FileTimer expired: the worker hung; collecting its stacks, then stopping it");
    let stacks = stacks(e.pid).await;
    let message = format!(
        "FileTimer '{scopes}' expired: rank {} (pid {}) hung past its expires(after=...)",
        worker.rank, e.pid
    );
    if let Err(err) = write_error_file(&worker.error_file, &message, &stacks) {
        warn!(file = %worker.error_file.path().display(), error = %err, "cannot write the hung worker's error file");
    }
    // Still that worker's process after the dump (not a reused pid)?
    if owner(e.pid, &lock(workers).clone()).is_none_or(|w| w.pid != worker.pid) {
        return;
    }
    let sig = Signal::try_from(e.signal).unwrap_or_else(|_| {
        warn!(
            signal = e.signal,
            "a FileTimer asked for an unknown signal; sending SIGKILL"
        );
        Signal::SIGKILL
    });
    let _ = nix::sys::signal::kill(Pid::from_raw(e.pid), sig);
}

/// The Python stacks of `pid`, from `py-spy dump`, or why there are none.
async fn stacks(pid: i32) -> String {
    let Some(py_spy) = crate::probe::program("py-spy") else {
        return "(no stacks: py-spy is not installed; `pip install py-spy` on the nodes to see where a hung worker is)".into();
    };
    let run = tokio::process::Command::new(&py_spy)
        .args(["dump", "--pid", &pid.to_string()])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(STACKS_TIMEOUT, run).await {
        Ok(Ok(out)) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            text.chars().take(64 * 1024).collect()
        }
        Ok(Ok(out)) => format!(
            "(no stacks: {} failed: {})",
            py_spy.display(),
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .chars()
                .take(2000)
                .collect::<String>()
        ),
        Ok(Err(e)) => format!("(no stacks: cannot run {}: {e})", py_spy.display()),
        Err(_) => format!(
            "(no stacks: py-spy did not answer within {} s)",
            STACKS_TIMEOUT.as_secs()
        ),
    }
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
}
