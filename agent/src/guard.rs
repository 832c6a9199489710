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
//! this net.
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
pub const BEAT: Duration = Duration::from_millis(500);
/// How often the agent beats at least (the shortest drop limits).
const FASTEST_BEAT: Duration = Duration::from_millis(10);

/// How often an agent whose guard acts after `limit` beats: a quarter of
/// the limit, between 10 ms and [`BEAT`], so a running agent is
/// never taken for a frozen one (a sub-second drop limit, e.g. 0.2 s × 2,
/// is shorter than one beat of [`BEAT`]).
pub fn beat_every(limit: Option<Duration>) -> Duration {
    limit.map_or(BEAT, |l| (l / 4).clamp(FASTEST_BEAT, BEAT))
}
/// The value of a beat on the pipe (no process group is 0).
const BEAT_VALUE: i32 = 0;

/// The agent's end of the guard's pipe.
#[derive(Debug)]
pub struct Guard {
    pipe: File,
    /// The guard is gone (said once).
    lost: std::sync::atomic::AtomicBool,
    /// How often [`Guard::beat`] is due ([`beat_every`] of the limit).
    every: Duration,
}

impl Guard {
    /// Forks the guard. Call before starting any thread (the async runtime).
    /// `limit`: how long the agent may go without a beat before the guard
    /// kills its workers (`None`: never).
    pub fn start(limit: Option<Duration>) -> io::Result<Self> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let write = sys::fork_guard(guard_main, read, write, limit)?;
        Ok(Self {
            pipe: File::from(write),
            lost: std::sync::atomic::AtomicBool::new(false),
            every: beat_every(limit),
        })
    }

    /// How often the agent must [`beat`](Guard::beat): a quarter of the
    /// guard's limit ([`beat_every`]).
    pub fn every(&self) -> Duration {
        self.every
    }

    /// The guard will kill process group `pgid` if the agent dies.
    pub fn watch(&self, pgid: i32) {
        self.send(pgid);
    }

    /// Process group `pgid` is gone; the guard forgets it.
    pub fn forget(&self, pgid: i32) {
        self.send(-pgid);
    }

    /// The agent is alive and running: call every [`Guard::every`].
    pub fn beat(&self) {
        self.send(BEAT_VALUE);
    }

    fn send(&self, v: i32) {
        // Four bytes to a pipe are written atomically; the guard drains it at once.
        if let Err(e) = (&self.pipe).write_all(&v.to_le_bytes()) {
            if !self.lost.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %e, "cannot reach the guard process; workers may outlive a crashed agent");
            }
        }
    }
}

fn guard_main(read: OwnedFd, limit: Option<Duration>) -> ! {
    sys::ignore_stop_signals();
    let _ = nix::sys::prctl::set_name(c"accel-guard");
    let mut pipe = File::from(read);
    let mut groups = BTreeSet::new();
    let mut buf = [0u8; 4];
    let mut heard = Instant::now();
    loop {
        // Wait for the next value, at most until the agent is overdue.
        let wait = match limit {
            Some(l) if !groups.is_empty() => {
                let left = l.saturating_sub(heard.elapsed());
                PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX)
            }
            _ => PollTimeout::NONE,
        };
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, wait) {
            Ok(0) => {
                if limit.is_some_and(|l| heard.elapsed() >= l) {
                    // Kill first: the note may have nowhere to go.
                    for pgid in std::mem::take(&mut groups) {
                        sys::killpg(pgid, Signal::SIGKILL);
                    }
                    crate::node::say(&format!(
                        "accel-guard: the agent has not run for {:.1} s (frozen or starved): killed its workers so no second copy of its ranks runs beside a re-formed job",
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
        match i32::from_le_bytes(buf) {
            BEAT_VALUE => {}
            v if v > 0 => {
                groups.insert(v);
            }
            v => {
                groups.remove(&-v);
            }
        }
    }
    for pgid in groups {
        sys::killpg(pgid, Signal::SIGKILL);
    }
    sys::exit_now(0)
}

#[cfg(test)]
mod tests {
    use super::{beat_every, BEAT, FASTEST_BEAT};
    use std::time::Duration;

    #[test]
    fn an_agent_beats_several_times_within_its_guards_limit() {
        assert_eq!(beat_every(None), BEAT);
        assert_eq!(beat_every(Some(Duration::from_secs(15))), BEAT);
        // 0.2 s × 2: shorter than one default beat.
        assert_eq!(
            beat_every(Some(Duration::from_millis(400))),
            Duration::from_millis(100)
        );
        assert_eq!(beat_every(Some(Duration::from_millis(1))), FASTEST_BEAT);
    }
}
