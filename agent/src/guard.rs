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

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

use nix::sys::signal::Signal;

use crate::sys;

/// The agent's end of the guard's pipe.
#[derive(Debug)]
pub struct Guard {
    pipe: File,
}

impl Guard {
    /// Forks the guard. Call before starting any thread (the async runtime).
    pub fn start() -> io::Result<Self> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let write = sys::fork_guard(guard_main, read, write)?;
        Ok(Self {
            pipe: File::from(write),
        })
    }

    /// The guard will kill process group `pgid` if the agent dies.
    pub fn watch(&self, pgid: i32) {
        self.send(pgid);
    }

    /// Process group `pgid` is gone; the guard forgets it.
    pub fn forget(&self, pgid: i32) {
        self.send(-pgid);
    }

    fn send(&self, v: i32) {
        // Four bytes to a pipe are written atomically; the guard drains it at once.
        if let Err(e) = (&self.pipe).write_all(&v.to_le_bytes()) {
            tracing::warn!(error = %e, "cannot reach the guard process; workers may outlive a crashed agent");
        }
    }
}

fn guard_main(read: OwnedFd) -> ! {
    sys::ignore_stop_signals();
    let _ = nix::sys::prctl::set_name(c"accel-guard");
    let mut pipe = File::from(read);
    let mut groups = BTreeSet::new();
    let mut buf = [0u8; 4];
    while pipe.read_exact(&mut buf).is_ok() {
        match i32::from_le_bytes(buf) {
            v if v > 0 => groups.insert(v),
            v => groups.remove(&-v),
        };
    }
    for pgid in groups {
        sys::killpg(pgid, Signal::SIGKILL);
    }
    sys::exit_now(0)
}
