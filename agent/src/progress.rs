//! Training progress, as the workers report it: `accel.progress(step)` and
//! `accel.checkpointed(step)` in Python (or any program that writes the
//! same datagrams), summed up per node for the rendezvous.
//!
//! # Transport
//! Each worker gets `ACCEL_PROGRESS_SOCKET`, the path of a Unix datagram
//! socket in a directory private to the agent's user (0700). A report is one
//! datagram of ASCII text: `p STEP` (a step done, optionally `p STEP
//! SAMPLES`, and optionally ending `w=US`: the microseconds of that step
//! that were the rank's own work, before it waited for the others) or
//! `c STEP` (a checkpoint of that step is saved). A datagram
//! is sent without waiting (a full queue drops it), so reporting never
//! slows a step; step reports less than 10 ms apart are folded into the
//! next by the sender (`accel.progress`, the Rust worker runtime), so a
//! worker sends at most about 100 a second. The agent polls the socket
//! every 5 ms instead of being woken for each datagram.
//!
//! # Whose reports count
//! The socket is created with `SO_PASSCRED`: the kernel attaches the
//! sender's pid to every datagram, which the sender cannot forge. A report
//! counts for the worker whose process group the sender is in (the worker,
//! or a process it started); anything else, and anything malformed, is
//! dropped. Steps and samples are bounded integers; a datagram is at most
//! [`MAX_DATAGRAM`] bytes.
//!
//! # What the rendezvous gets
//! Per node and round: how many ranks reported, the least and the most
//! steps among them, and the step every reporting rank last checkpointed
//! (when all of them did): a [`pb::Progress`], sent with each keep-alive
//! and with a failure report (after reading whatever the workers sent up
//! to then), so the step a failing round reached counts. A new round
//! starts from nothing.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use accel_proto::v1 as pb;
use std::os::unix::net::UnixDatagram;

use crate::file_timer::{Watched, Workers};

/// The variable that names the socket, in every worker's environment.
pub const ENV: &str = "ACCEL_PROGRESS_SOCKET";
/// The longest report read; longer datagrams are dropped.
pub const MAX_DATAGRAM: usize = 64;
/// Datagrams read in one go before the task yields.
const BATCH: usize = 256;
/// The reader drains the queue every this often, polling a non-blocking
/// socket that is not registered for readiness: a worker reporting every
/// step at 1,000 steps/s would otherwise wake the agent's runtime 1,000
/// times a second per rank, and each wake-up costs the node's CPUs (which
/// the workers use) far more than reading one more datagram. The queue
/// holds a few hundred datagrams; a step is heard at most this much later
/// (a failure report reads the queue at once).
const READ_EVERY: std::time::Duration = std::time::Duration::from_millis(5);
/// Datagrams a failure report reads at most (a socket's default queue
/// holds far fewer).
const QUEUED_AT_MOST: usize = 4096;

/// Per-step times a rank keeps (the median goes to the rendezvous).
const STEP_TIMES: usize = 10;
/// Ranks whose step times a report carries.
const MAX_RANK_TIMES: usize = 64;

/// One rank's reports in the current round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rank {
    step: u64,
    checkpoint: Option<u64>,
    /// Its last step report: the step, and when it was read.
    at: Option<(u64, Instant)>,
    /// Its time per step between its last reports, µs, oldest first.
    per_step: std::collections::VecDeque<u64>,
    /// Its own work per step (`w=`), µs, oldest first.
    own: std::collections::VecDeque<u64>,
}

impl Rank {
    fn stepped(&mut self, now: Instant, step: u64, own_us: Option<u64>) {
        if let Some(us) = own_us.filter(|_| self.at.is_none_or(|(s0, _)| step > s0)) {
            if self.own.len() == STEP_TIMES {
                self.own.pop_front();
            }
            self.own.push_back(us);
        }
        if let Some((s0, t0)) = self.at {
            if step <= s0 {
                return;
            }
            let us = u64::try_from(now.duration_since(t0).as_micros()).unwrap_or(u64::MAX);
            if self.per_step.len() == STEP_TIMES {
                self.per_step.pop_front();
            }
            self.per_step.push_back(us / (step - s0));
        }
        self.at = Some((step, now));
    }

    /// The median of its own work per step, if it says (where ranks wait
    /// for each other every step, a slow rank's time is in every rank's
    /// steps, and only its own work tells it apart), else of its time per
    /// step (`None`: fewer than 3 of either).
    fn step_us(&self) -> Option<u64> {
        let times = match self.own.len() >= 3 {
            true => &self.own,
            false => &self.per_step,
        };
        if times.len() < 3 {
            return None;
        }
        let mut v: Vec<u64> = times.iter().copied().collect();
        v.sort_unstable();
        Some(v[v.len() / 2])
    }
}

/// The node's reports: per local rank, for one round.
#[derive(Debug, Default)]
struct Table {
    round: u64,
    ranks: HashMap<u32, Rank>,
    /// When the round's first step was reported (any rank's).
    first_step: Option<Instant>,
    /// The least step over the ranks, and when it last grew.
    least: Option<(u64, Instant)>,
    /// Reports dropped (not a worker's, or malformed) since the start.
    dropped: u64,
}

/// What one datagram says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// A step is done, and how much of it was the rank's own work, µs.
    Step(u64, Option<u64>),
    /// A checkpoint of this step is saved.
    Checkpointed(u64),
    /// A named section (`accel.section(name)`) begins.
    Begin(String),
    /// It ends.
    End(String),
}

/// Reads one datagram: `p STEP [SAMPLES]`, `c STEP`, `s NAME` or `e NAME`
/// (a name of at most [`crate::hang::MAX_SECTION_NAME`] letters, digits,
/// `_`, `-` and `.`).
pub fn parse(datagram: &[u8]) -> Option<Report> {
    let text = std::str::from_utf8(datagram).ok()?.trim_end_matches('\n');
    let mut words = text.split(' ');
    let kind = words.next()?;
    if kind == "s" || kind == "e" {
        let name = words.next()?;
        let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if words.next().is_some()
            || name.is_empty()
            || name.len() > crate::hang::MAX_SECTION_NAME
            || !name.chars().all(fine)
        {
            return None;
        }
        return Some(match kind {
            "s" => Report::Begin(name.to_owned()),
            _ => Report::End(name.to_owned()),
        });
    }
    let step: u64 = words.next()?.parse().ok()?;
    let rest: Vec<&str> = words.collect();
    // `w=US` last, if at all.
    let (rest, own) = match rest.split_last() {
        Some((last, before)) if last.starts_with("w=") => {
            (before, Some(last[2..].parse::<u64>().ok()?))
        }
        _ => (&rest[..], None),
    };
    match (kind, rest) {
        ("p", []) => Some(Report::Step(step, own)),
        // Samples are accepted (and not used yet) when they are a number.
        ("p", [samples]) => samples.parse::<u64>().ok().map(|_| Report::Step(step, own)),
        ("c", []) if own.is_none() => Some(Report::Checkpointed(step)),
        _ => None,
    }
}

/// The node's progress, shared by the socket's reader, the keep-alives and
/// the failure reports.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    table: Arc<Mutex<Table>>,
    socket: Option<Arc<UnixDatagram>>,
    /// `--learned-hang-timeouts`: the ranks' clocks (the `hang` module),
    /// and the node's number of ranks.
    hangs: Option<(Arc<Mutex<crate::hang::Watch>>, u32)>,
}

impl Progress {
    /// A new round's workers start: reports begin from nothing.
    pub fn new_round(&self, round: u64) {
        let mut t = lock(&self.table);
        t.round = round;
        t.ranks.clear();
        t.first_step = None;
        t.least = None;
        if let Some((watch, nproc)) = &self.hangs {
            lock(watch).new_round(Instant::now(), *nproc);
        }
    }

    /// Judges the node's `nproc` ranks for hangs by timeouts learned from
    /// their step times (`--learned-hang-timeouts`).
    pub fn with_hangs(mut self, settings: crate::hang::Settings, nproc: u32) -> Self {
        self.hangs = Some((
            Arc::new(Mutex::new(crate::hang::Watch::new(settings))),
            nproc,
        ));
        self
    }

    /// The round's workers are stopping: no hang is judged until the next.
    pub fn stopped(&self) {
        if let Some((watch, _)) = &self.hangs {
            lock(watch).stopped();
        }
    }

    /// The worker of `local_rank` exited: its silence is no hang.
    pub fn exited(&self, local_rank: u32) {
        if let Some((watch, _)) = &self.hangs {
            lock(watch).exited(local_rank);
        }
    }

    /// The round's hang at `now`, once (the `hang` module).
    pub fn hang(&self, now: Instant) -> Option<crate::hang::Hang> {
        self.hangs.as_ref().and_then(|(w, _)| lock(w).expired(now))
    }

    /// Applies `report` from the worker of local rank `local_rank`.
    fn apply(&self, local_rank: u32, report: Report) {
        let now = Instant::now();
        if let Some((watch, _)) = &self.hangs {
            let event = match &report {
                Report::Step(..) => Some(crate::hang::Event::Step),
                Report::Begin(n) => Some(crate::hang::Event::Begin(n.clone())),
                Report::End(n) => Some(crate::hang::Event::End(n.clone())),
                Report::Checkpointed(_) => None,
            };
            if let Some(e) = event {
                lock(watch).observe(now, local_rank, e);
            }
        }
        let report = match report {
            Report::Begin(_) | Report::End(_) => return,
            r => r,
        };
        let mut t = lock(&self.table);
        let r = t.ranks.entry(local_rank).or_default();
        match report {
            Report::Step(s, own) => {
                r.stepped(now, s, own);
                r.step = r.step.max(s);
            }
            Report::Checkpointed(s) => {
                r.checkpoint = Some(r.checkpoint.map_or(s, |c| c.max(s)));
                r.step = r.step.max(s);
            }
            Report::Begin(_) | Report::End(_) => {}
        }
        t.first_step.get_or_insert(now);
        // O(ranks of one node): a handful.
        let least = t.ranks.values().map(|r| r.step).min().unwrap_or(0);
        if t.least.is_none_or(|(l, _)| least > l) {
            t.least = Some((least, now));
        }
    }

    fn drop_one(&self) {
        lock(&self.table).dropped += 1;
    }

    /// Reports dropped so far.
    pub fn dropped(&self) -> u64 {
        lock(&self.table).dropped
    }

    /// The node's progress in the current round, or `None` when no worker
    /// reported any.
    pub fn summary(&self) -> Option<pb::Progress> {
        let t = lock(&self.table);
        if t.ranks.is_empty() {
            return None;
        }
        let steps = t.ranks.values().map(|r| r.step);
        let checkpoints: Option<Vec<u64>> = t.ranks.values().map(|r| r.checkpoint).collect();
        let ago = |at: Option<Instant>| {
            at.map_or(0, |at| {
                u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)
            })
        };
        Some(pb::Progress {
            round: t.round,
            ranks: u32::try_from(t.ranks.len()).unwrap_or(u32::MAX),
            min_step: steps.clone().min().unwrap_or(0),
            max_step: steps.max().unwrap_or(0),
            checkpoint_step: checkpoints.and_then(|c| c.into_iter().min()),
            first_step_ms_ago: ago(t.first_step),
            min_step_ms_ago: ago(t.least.map(|(_, at)| at)),
            failing_step: None,
            rank_times: {
                let mut times: Vec<pb::RankTime> = t
                    .ranks
                    .iter()
                    .filter_map(|(r, k)| {
                        k.step_us().map(|step_us| pb::RankTime {
                            local_rank: *r,
                            step_us,
                        })
                    })
                    .collect();
                times.sort_unstable_by_key(|t| t.local_rank);
                times.truncate(MAX_RANK_TIMES);
                times
            },
            hang_timeout_ms: self
                .hangs
                .as_ref()
                .and_then(|(w, _)| lock(w).learned())
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        })
    }

    /// Reads every datagram already waiting (without waiting for more),
    /// then [`Progress::summary`]: what a failure report carries, so the
    /// steps a worker reported just before it died count, with the step of
    /// `failing` (the local rank that failed) on its own.
    pub fn summary_now(&self, workers: &Workers, failing: Option<u32>) -> Option<pb::Progress> {
        if let Some(socket) = &self.socket {
            let watched = lock(workers).clone();
            // What is queued, bounded: a worker writing as fast as this
            // reads cannot hold the failure report.
            for _ in 0..QUEUED_AT_MOST {
                let Ok(got) = receive_now(socket) else { break };
                self.take(got, &watched);
            }
        }
        let mut summary = self.summary()?;
        summary.failing_step =
            failing.and_then(|r| lock(&self.table).ranks.get(&r).map(|r| r.step));
        Some(summary)
    }

    fn take(&self, got: Received, watched: &[Watched]) {
        let (pid, bytes) = match got {
            Received::Datagram { pid, bytes } => (pid, bytes),
            Received::Dropped => return self.drop_one(),
        };
        let worker = crate::file_timer::owner(pid, watched);
        match (worker, parse(&bytes)) {
            (Some(w), Some(report)) => self.apply(w.local_rank, report),
            _ => self.drop_one(),
        }
    }
}

impl Progress {
    /// `--learned-hang-timeouts`: checks the ranks every `every` and stops
    /// the round's hung worker as an expired FileTimer's (its stacks and
    /// every rank's into its error file, then SIGKILL), so the job
    /// restarts; `job` collects the stacks.
    pub fn watch_hangs(
        &self,
        workers: Workers,
        job: crate::stacks::JobStacks,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let progress = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(hang) = progress.hang(Instant::now()) else {
                    continue;
                };
                let worker = lock(&workers)
                    .iter()
                    .find(|w| w.local_rank == hang.local_rank)
                    .cloned();
                let Some(worker) = worker else { continue };
                let message = hang.message(worker.rank);
                tracing::warn!(
                    rank = worker.rank,
                    pid = worker.pid,
                    "{message}; collecting every rank's stacks, then stopping it"
                );
                crate::file_timer::stop_hung(
                    worker.pid,
                    &worker,
                    &message,
                    nix::sys::signal::Signal::SIGKILL,
                    &workers,
                    &job,
                )
                .await;
            }
        })
    }
}

/// `--checkpoint-iteration-file`: the number at the start of `text` (the
/// iteration of the last checkpoint, as NVIDIA's resiliency extension and
/// Megatron-LM write it: `1200`, `1200\n`, or a word after it), or `None`.
pub fn parse_iteration(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?.trim_start();
    let digits: &str = &text[..text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len())];
    digits.parse().ok()
}

/// Reads the checkpoint-iteration file without following a link or waiting
/// on a FIFO, at most [`MAX_DATAGRAM`] bytes of a regular file.
fn read_iteration(path: &Path) -> Option<u64> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::with_capacity(MAX_DATAGRAM);
    f.take(MAX_DATAGRAM as u64).read_to_end(&mut buf).ok()?;
    parse_iteration(&buf)
}

impl Progress {
    /// Watches `path` (`--checkpoint-iteration-file`) every `every`: its
    /// iteration counts as a checkpoint of that step by each of the
    /// node's `nproc` ranks, so a job reports progress without a code
    /// change. A file that is missing, a link or not a number is skipped.
    pub fn watch_file(
        &self,
        path: PathBuf,
        nproc: u32,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let progress = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Some(n) = read_iteration(&path) {
                    for rank in 0..nproc {
                        progress.apply(rank, Report::Checkpointed(n));
                    }
                }
            }
        })
    }
}

/// The socket's directory and path, removed when dropped.
#[derive(Debug)]
pub struct ProgressSocket {
    dir: PathBuf,
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ProgressSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl ProgressSocket {
    /// Creates the socket in a new private directory under `base` (the
    /// temporary directory) and reads it into `progress`, counting reports
    /// of `workers` only.
    pub fn start(base: &Path, progress: &mut Progress, workers: Workers) -> io::Result<Self> {
        use nix::sys::socket::{bind, setsockopt, socket, sockopt, AddressFamily, SockFlag};
        use nix::sys::socket::{SockType, UnixAddr};
        let dir = tempfile::Builder::new()
            .prefix("accel-progress-")
            .tempdir_in(base)?
            .keep();
        let path = dir.join("s");
        let fd = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(io::Error::from)?;
        let cleanup = |e: io::Error| {
            let _ = std::fs::remove_dir(&dir);
            e
        };
        setsockopt(&fd, sockopt::PassCred, &true)
            .map_err(io::Error::from)
            .map_err(cleanup)?;
        let addr = UnixAddr::new(&path)
            .map_err(io::Error::from)
            .map_err(cleanup)?;
        bind(fd.as_raw_fd(), &addr)
            .map_err(io::Error::from)
            .map_err(cleanup)?;
        let socket = Arc::new(UnixDatagram::from(fd));
        progress.socket = Some(socket.clone());
        let reader = progress.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(READ_EVERY).await;
                // Nothing queued (the usual poll): nothing else to do.
                let Some(first) = receive(&socket) else {
                    continue;
                };
                let watched = lock(&workers).clone();
                reader.take(first, &watched);
                let mut n = 1;
                while let Some(got) = receive(&socket) {
                    reader.take(got, &watched);
                    n += 1;
                    if n == BATCH {
                        // More waits: read on after the others had their turn.
                        tokio::task::yield_now().await;
                        n = 0;
                    }
                }
            }
        });
        Ok(Self { dir, path, task })
    }

    /// The socket's path (the workers' `ACCEL_PROGRESS_SOCKET`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// One datagram read.
enum Received {
    Datagram {
        pid: i32,
        bytes: Vec<u8>,
    },
    /// Too long, or without credentials.
    Dropped,
}

/// Reads one datagram without waiting, for the reader task; `None` when
/// none is waiting (or the socket failed). Through tokio's `try_io`, so a
/// read that finds nothing clears the socket's readiness.
fn receive(socket: &UnixDatagram) -> Option<Received> {
    receive_now(socket).ok()
}

/// Reads one datagram without waiting, whatever tokio last saw of the
/// socket: a failure report's reading of what is already queued.
fn receive_now(socket: &UnixDatagram) -> io::Result<Received> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixCredentials};
    let mut buf = [0u8; MAX_DATAGRAM + 1];
    let mut cmsg = nix::cmsg_space!(UnixCredentials);
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let len = msg.bytes;
    let truncated = msg.flags.contains(MsgFlags::MSG_TRUNC) || len > MAX_DATAGRAM;
    let pid = msg.cmsgs().ok().and_then(|mut c| {
        c.find_map(|c| match c {
            ControlMessageOwned::ScmCredentials(creds) => Some(creds.pid()),
            _ => None,
        })
    });
    Ok(match (pid, truncated) {
        (Some(pid), false) => Received::Datagram {
            pid,
            bytes: buf[..len].to_vec(),
        },
        _ => Received::Dropped,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_ranks_own_work_is_its_time_per_step_when_it_says() {
        let t0 = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        let mut r = Rank::default();
        // Steps 100 ms apart (the collective waits for the slowest rank).
        for k in 1..=5u64 {
            r.stepped(t0 + ms(100 * k), k, None);
        }
        assert_eq!(r.step_us(), Some(100_000));
        let mut own = Rank::default();
        for k in 1..=5u64 {
            own.stepped(t0 + ms(100 * k), k, Some(61_000 + k));
        }
        assert_eq!(own.step_us(), Some(61_003), "the median of its own work");
        // A late, repeated step adds nothing.
        own.stepped(t0 + ms(700), 5, Some(1));
        assert_eq!(own.own.len(), 5);
    }

    #[test]
    fn reports_parse_and_anything_else_is_refused() {
        assert_eq!(parse(b"p 40"), Some(Report::Step(40, None)));
        assert_eq!(parse(b"p 40 1280\n"), Some(Report::Step(40, None)));
        assert_eq!(parse(b"p 40 w=8100"), Some(Report::Step(40, Some(8100))));
        assert_eq!(
            parse(b"p 40 1280 w=8100"),
            Some(Report::Step(40, Some(8100)))
        );
        assert_eq!(parse(b"c 30"), Some(Report::Checkpointed(30)));
        for bad in [
            &b""[..],
            b"p",
            b"p -1",
            b"p 1.5",
            b"p 40 x",
            b"p 40 1 2",
            b"p 40 w=",
            b"p 40 w=-3",
            b"p 40 w=1 1280",
            b"c 30 w=1",
            b"c 30 1",
            b"x 1",
            b"p 99999999999999999999999",
            b"\xff 1",
        ] {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_checkpoint_iteration_is_the_number_the_file_starts_with() {
        assert_eq!(parse_iteration(b"1200"), Some(1200));
        assert_eq!(parse_iteration(b" 1200\n"), Some(1200));
        assert_eq!(parse_iteration(b"1200 release"), Some(1200));
        assert_eq!(parse_iteration(b"release"), None);
        assert_eq!(parse_iteration(b""), None);
        assert_eq!(parse_iteration(b"-3"), None);
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("latest");
        std::fs::write(&file, "30\n").expect("write");
        assert_eq!(read_iteration(&file), Some(30));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        assert_eq!(read_iteration(&link), None, "a link is not followed");
        assert_eq!(read_iteration(&dir.path().join("missing")), None);
    }

    #[test]
    fn a_summary_spans_the_ranks_and_a_round_starts_from_nothing() {
        let p = Progress::default();
        assert_eq!(p.summary(), None);
        p.new_round(3);
        p.apply(0, Report::Step(40, None));
        p.apply(1, Report::Step(38, None));
        p.apply(1, Report::Step(37, None)); // late and out of order: kept at 38
        p.apply(0, Report::Checkpointed(30));
        let timeless = |s: Option<pb::Progress>| {
            s.map(|s| pb::Progress {
                first_step_ms_ago: 0,
                min_step_ms_ago: 0,
                hang_timeout_ms: 0,
                failing_step: None,
                rank_times: Vec::new(),
                ..s
            })
        };
        assert_eq!(
            timeless(p.summary()),
            Some(pb::Progress {
                round: 3,
                ranks: 2,
                min_step: 38,
                max_step: 40,
                checkpoint_step: None,
                first_step_ms_ago: 0,
                min_step_ms_ago: 0,
                hang_timeout_ms: 0,
                failing_step: None,
                rank_times: Vec::new(),
            }),
            "rank 1 has not checkpointed"
        );
        let s = p.summary().expect("summary");
        assert!(s.first_step_ms_ago >= s.min_step_ms_ago, "{s:?}");
        p.apply(1, Report::Checkpointed(30));
        assert_eq!(p.summary().and_then(|s| s.checkpoint_step), Some(30));
        p.new_round(4);
        assert_eq!(p.summary(), None);
    }

    #[tokio::test]
    async fn a_workers_datagrams_count_and_a_strangers_do_not() {
        let base = tempfile::tempdir().expect("tempdir");
        let workers: Workers = Arc::default();
        let mut progress = Progress::default();
        let socket =
            ProgressSocket::start(base.path(), &mut progress, workers.clone()).expect("socket");
        let send = |text: &str| {
            let s = std::os::unix::net::UnixDatagram::unbound().expect("socket");
            s.send_to(text.as_bytes(), socket.path()).expect("send");
        };
        // This process is no worker yet: dropped.
        send("p 5");
        assert_eq!(progress.summary_now(&workers, None), None);
        assert_eq!(progress.dropped(), 1);
        // Now this process's group is a worker's (local rank 1).
        let me = nix::unistd::getpgid(None).expect("pgid").as_raw();
        let dir = Arc::new(crate::files::Dir::open_base(base.path(), "test").expect("dir"));
        workers.lock().expect("lock").push(Watched {
            pid: me,
            rank: 5,
            local_rank: 1,
            error_file: crate::files::FileAt::new(dir, "error.json"),
        });
        progress.new_round(2);
        send("p 7");
        send("c 6");
        send("p 8 512");
        send("p x");
        let s = progress.summary_now(&workers, None).expect("reported");
        assert_eq!((s.round, s.ranks, s.max_step), (2, 1, 8));
        assert_eq!(s.checkpoint_step, Some(6));
        assert_eq!(
            progress.dropped(),
            2,
            "the stranger's and the malformed one"
        );
        let path = socket.path().to_owned();
        drop(socket);
        assert!(!path.exists(), "the socket goes with the agent");
    }
}
