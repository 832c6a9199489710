//! The guard: a tiny process that kills the workers if the agent dies.
//!
//! # Why
//! Workers run in their own process groups (so a signal reaches the
//! DataLoader processes they start) and carry `PR_SET_PDEATHSIG`, but the
//! death signal reaches only direct children: if the agent is `kill -9`ed,
//! OOM-killed or crashes, grandchildren would live on, holding GPUs. The
//! guard is forked from the agent before any thread exists; the agent tells
//! it each worker's process group over a pipe. When the pipe reports end of
//! file, the agent is gone (the kernel closes its end however it died), and
//! the guard sends SIGKILL to every group it was told about, then exits.
//!
//! Workers that leave their process group on purpose (`setsid`) are outside
//! this net. The health check is not the guard's: it runs under a keeper of
//! its own ([`crate::sys::keeper`]), which no process of the check can leave.
//!
//! The guard ignores SIGINT/SIGTERM/SIGHUP/SIGQUIT: a terminal's Ctrl-C or a
//! service manager's stop reaches the agent, which stops the workers in
//! order; the guard only acts once the agent is gone.
//!
//! # A frozen agent
//! An agent that is alive but does not run (SIGSTOP, swapped out, a hung
//! host) cannot stop its workers when its job re-forms without it. So the
//! agent also beats on the pipe ([`Guard::beat`], every [`beat_every`]); a guard
//! that hears nothing for its `limit` (the job's drop limit: by then the
//! rendezvous has dropped the node and the others may be re-forming) kills
//! the worker groups, so no second copy of this node's ranks runs. The agent,
//! if it wakes, finds its workers gone and reports them failed.
//!
//! The limit alone is late: the rendezvous counts the drop limit from this
//! node's last keep-alive, which may be up to a keep-alive interval older
//! than the agent's last beat. So each beat also carries the *fence
//! deadline*: the earliest moment the rendezvous may drop the node (the send
//! time of the last call it answered plus the drop limit, less a margin). A
//! guard that has not heard a beat for [`stale_after`] (the agent is not
//! running) kills the workers once that deadline passes. A running agent
//! keeps beating, so the guard never races the agent's own fence (which
//! stops the workers a little before the same deadline, see
//! `agent/machine.rs`), and never stops workers that the agent keeps for a
//! reason of its own.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use crate::sys;

/// How often the agent beats at most (longer drop limits).
pub const BEAT: Duration = Duration::from_millis(250);
/// How often the agent beats at least (the shortest drop limits).
const FASTEST_BEAT: Duration = Duration::from_millis(10);

/// How often an agent whose guard acts after `limit` beats: an eighth of
/// the limit, between 10 ms and [`BEAT`], so a running agent is never
/// taken for a frozen one and a frozen one is known within two beats (a
/// sub-second drop limit, e.g. 0.2 s × 2, is shorter than one [`BEAT`]).
pub fn beat_every(limit: Option<Duration>) -> Duration {
    limit.map_or(BEAT, |l| (l / 8).clamp(FASTEST_BEAT, BEAT))
}

/// How long without a beat the guard takes the agent for not running:
/// two beats.
pub fn stale_after(every: Duration) -> Duration {
    every * 2
}

/// The records on the pipe: a tag and a value, written at once (well
/// under `PIPE_BUF`, so never interleaved).
const RECORD: usize = 12;
/// Watch process group `value`.
const WATCH: u32 = 1;
/// Forget process group `value`.
const FORGET: u32 = 2;
/// A beat; `value`: nanoseconds from now to the fence deadline, or
/// [`NO_DEADLINE`].
const BEAT_TAG: u32 = 3;
/// A beat without a fence deadline.
const NO_DEADLINE: i64 = -1;

/// The agent's end of the guard's pipe.
#[derive(Debug)]
pub struct Guard {
    pipe: File,
    /// What the guard tells the agent (non-blocking): a byte each time it
    /// killed the workers.
    back: File,
    /// The guard is gone (said once).
    lost: std::sync::atomic::AtomicBool,
    /// How often [`Guard::beat`] is due ([`beat_every`] of the limit).
    every: Duration,
    /// The guard process.
    pid: nix::unistd::Pid,
}

impl Guard {
    /// Forks the guard. Call before starting any thread (the async runtime).
    /// `limit`: how long the agent may go without a beat before the guard
    /// kills its workers (`None`: never).
    pub fn start(limit: Option<Duration>) -> io::Result<Self> {
        use nix::fcntl::OFlag;
        let pipe = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let back =
            nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(io::Error::from)?;
        let (write, back, pid) = sys::fork_guard(guard_main, pipe, back, limit)?;
        Ok(Self {
            pipe: File::from(write),
            back: File::from(back),
            lost: std::sync::atomic::AtomicBool::new(false),
            every: beat_every(limit),
            pid,
        })
    }

    /// The guard process, for [`reap`] once every `Guard` is dropped.
    pub fn pid(&self) -> nix::unistd::Pid {
        self.pid
    }

    /// Whether the guard killed the workers since this was last asked: the
    /// agent did not run past the fence deadline, so the workers that
    /// ended were fenced, not failed.
    pub fn take_fenced(&self) -> bool {
        let mut buf = [0u8; 64];
        let mut fenced = false;
        // Non-blocking: stops at "would block" (nothing more) or at the end.
        while let Ok(1..) = (&self.back).read(&mut buf) {
            fenced = true;
        }
        fenced
    }

    /// How often the agent must [`beat`](Guard::beat): a quarter of the
    /// guard's limit ([`beat_every`]).
    pub fn every(&self) -> Duration {
        self.every
    }

    /// The guard will kill process group `pgid` if the agent dies.
    pub fn watch(&self, pgid: i32) {
        self.send(WATCH, i64::from(pgid));
    }

    /// Process group `pgid` is gone; the guard forgets it.
    pub fn forget(&self, pgid: i32) {
        self.send(FORGET, i64::from(pgid));
    }

    /// The agent is alive and running: call every [`Guard::every`].
    /// `fence`: how long from now until the rendezvous may drop this node
    /// (`None`: not known), after which a guard that stopped hearing beats
    /// kills the workers.
    pub fn beat(&self, fence: Option<Duration>) {
        let value = fence.map_or(NO_DEADLINE, |d| {
            i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
        });
        self.send(BEAT_TAG, value);
    }

    fn send(&self, tag: u32, value: i64) {
        let mut record = [0u8; RECORD];
        record[..4].copy_from_slice(&tag.to_le_bytes());
        record[4..].copy_from_slice(&value.to_le_bytes());
        // Twelve bytes to a pipe are written atomically; the guard drains it at once.
        if let Err(e) = (&self.pipe).write_all(&record) {
            if !self.lost.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %e, "cannot reach the guard process; workers may outlive a crashed agent");
            }
        }
    }
}

/// Waits up to `limit` for the guard `pid` to exit and reaps it. Call once
/// every [`Guard`] is dropped: the guard sees its pipe end, kills what it
/// still watches and exits. An agent that returned without this would
/// leave it behind, a zombie for whatever adopts orphans.
pub fn reap(pid: nix::unistd::Pid, limit: Duration) -> bool {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let until = Instant::now() + limit;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) => return true,
            // Not our child any more, or already reaped.
            Err(_) => return true,
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether the guard kills the workers now: the agent has not beaten for
/// `limit`, or it stopped beating (for `stale`) and the fence deadline it
/// last gave has passed.
fn due(
    now: Instant,
    heard: Instant,
    limit: Option<Duration>,
    stale: Duration,
    deadline: Option<Instant>,
) -> bool {
    let silent = now.saturating_duration_since(heard);
    limit.is_some_and(|l| silent >= l) || (silent >= stale && deadline.is_some_and(|d| now >= d))
}

/// When [`due`] may next become true (`None`: only on a beat).
fn next_check(
    heard: Instant,
    limit: Option<Duration>,
    stale: Duration,
    deadline: Option<Instant>,
) -> Option<Instant> {
    let by_limit = limit.map(|l| heard + l);
    let by_deadline = deadline.map(|d| d.max(heard + stale));
    match (by_limit, by_deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn guard_main(read: OwnedFd, back: OwnedFd, limit: Option<Duration>) -> ! {
    sys::ignore_stop_signals();
    let _ = nix::sys::prctl::set_name(c"accel-guard");
    let mut pipe = File::from(read);
    let mut back = File::from(back);
    let mut groups = BTreeSet::new();
    let mut buf = [0u8; RECORD];
    let mut heard = Instant::now();
    let mut deadline: Option<Instant> = None;
    let stale = stale_after(beat_every(limit));
    // Without a limit the guard only acts when the agent is gone.
    let deadline_of = |value: i64| {
        (limit.is_some() && value >= 0)
            .then(|| Instant::now() + Duration::from_nanos(u64::try_from(value).unwrap_or(0)))
    };
    loop {
        // Wait for the next record, at most until the guard may be due.
        let wait = match next_check(heard, limit, stale, deadline) {
            Some(at) if !groups.is_empty() => {
                let left = at.saturating_duration_since(Instant::now());
                PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX)
            }
            _ => PollTimeout::NONE,
        };
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, wait) {
            Ok(0) => {
                if !groups.is_empty() && due(Instant::now(), heard, limit, stale, deadline) {
                    // Kill first: the note may have nowhere to go.
                    for pgid in std::mem::take(&mut groups) {
                        sys::killpg(pgid, Signal::SIGKILL);
                    }
                    // The agent, when it runs again, reads this before the
                    // workers' exits: they were fenced, not failed.
                    let _ = back.write_all(&[1]);
                    say(&format!(
                        "accel-guard: the agent has not run for {:.1} s (frozen or starved) and the rendezvous may drop this node: killed its workers so no second copy of its ranks runs beside a re-formed job",
                        heard.elapsed().as_secs_f64()
                    ));
                }
                continue;
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        if pipe.read_exact(&mut buf).is_err() {
            break;
        }
        heard = Instant::now();
        let mut tag = [0u8; 4];
        tag.copy_from_slice(&buf[..4]);
        let mut value = [0u8; 8];
        value.copy_from_slice(&buf[4..]);
        let value = i64::from_le_bytes(value);
        match u32::from_le_bytes(tag) {
            WATCH => {
                if let Ok(pgid) = i32::try_from(value) {
                    groups.insert(pgid);
                }
            }
            FORGET => {
                if let Ok(pgid) = i32::try_from(value) {
                    groups.remove(&pgid);
                }
            }
            BEAT_TAG => deadline = deadline_of(value),
            _ => {}
        }
    }
    for pgid in groups {
        sys::killpg(pgid, Signal::SIGKILL);
    }
    sys::exit_now(0)
}

/// One line on stderr, unformatted (the forked guard has no logger; the
/// agent's `node::say` writes the same way).
fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::{beat_every, due, next_check, stale_after, BEAT, FASTEST_BEAT};
    use std::time::{Duration, Instant};

    #[test]
    fn an_agent_beats_several_times_within_its_guards_limit() {
        assert_eq!(beat_every(None), BEAT);
        assert_eq!(beat_every(Some(Duration::from_secs(15))), BEAT);
        // 0.2 s × 2: shorter than one default beat.
        assert_eq!(
            beat_every(Some(Duration::from_millis(400))),
            Duration::from_millis(50)
        );
        assert_eq!(beat_every(Some(Duration::from_millis(1))), FASTEST_BEAT);
        assert_eq!(stale_after(BEAT), Duration::from_millis(500));
    }

    #[test]
    fn a_frozen_agents_workers_die_by_the_fence_deadline_not_the_full_limit() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let limit = Some(ms(3000));
        let stale = ms(500);
        // The agent froze right after a beat at t0; its last keep-alive
        // was answered 0.9 s before, so the rendezvous may drop it at 2.1 s.
        let deadline = Some(t0 + ms(2100));
        assert!(!due(t0 + ms(2000), t0, limit, stale, deadline));
        assert!(due(t0 + ms(2100), t0, limit, stale, deadline));
        assert_eq!(next_check(t0, limit, stale, deadline), deadline);
        // Without a deadline, the limit.
        assert!(!due(t0 + ms(2999), t0, limit, stale, None));
        assert!(due(t0 + ms(3000), t0, limit, stale, None));
    }

    #[test]
    fn a_running_agent_is_never_raced_past_its_deadline() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // The deadline passed, but the agent beat 0.1 s ago: it is running
        // and fences (or keeps its workers) by itself.
        let deadline = Some(t0);
        assert!(!due(t0 + ms(100), t0, Some(ms(3000)), ms(500), deadline));
        // It stopped beating: due once the beats are stale.
        assert!(due(t0 + ms(500), t0, Some(ms(3000)), ms(500), deadline));
        assert_eq!(
            next_check(t0, Some(ms(3000)), ms(500), deadline),
            Some(t0 + ms(500))
        );
        // No limit: the guard acts only when the agent is gone.
        assert_eq!(next_check(t0, None, ms(500), None), None);
    }
}
