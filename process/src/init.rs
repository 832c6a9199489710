//! The agent as a container's first process (PID 1).
//!
//! # Why
//! In a container the agent is often PID 1 (Kubernetes without a shared
//! process namespace, `docker run` without `--init`). Every process whose
//! parent dies is re-parented to PID 1, and a zombie stays until PID 1
//! waits for it. A worker that exits while processes it started are still
//! alive (a DataLoader worker, a shell's background job) leaves them to the
//! agent; when the round's sweep kills them, they become zombies nobody
//! waits for. The agent waits only for its own children (each one's task
//! awaits it; it never calls `waitpid(-1)`, which would take those exits
//! from their tasks). Over a long job the zombies fill the pid limit.
//!
//! # How
//! As PID 1, the agent forks once, first thing, while it has one thread:
//! the child goes on as the agent; the parent stays PID 1 and does only
//! what PID 1 must, like `tini`:
//! - it waits for every child it gets (`waitpid(-1)`), orphans included;
//! - it passes the stop signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT,
//!   SIGUSR1, SIGUSR2) on to the agent, which stops its workers as usual;
//! - when the agent ends, it exits with the agent's status (128 + N for
//!   signal N).
//!
//! The signals are blocked before the fork and taken with `sigwait`, so
//! none is lost between the fork and the loop; a blocked signal is queued
//! for PID 1 even from outside its namespace, where a signal PID 1 has no
//! handler for would be dropped.

use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The signals PID 1 passes on to the agent.
pub const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// If this process is PID 1, forks: returns `Ok(true)` in the child, which
/// goes on as the agent, while the parent reaps and forwards signals until
/// the child ends, then exits with its status (it never returns).
/// `Ok(false)`: not PID 1, nothing done.
///
/// Call it first thing, while the process has one thread.
pub fn reap_as_pid1() -> nix::Result<bool> {
    if nix::unistd::getpid().as_raw() != 1 {
        return Ok(false);
    }
    let mut waited = SigSet::empty();
    for s in FORWARDED {
        waited.add(s);
    }
    waited.add(Signal::SIGCHLD);
    let mut before = SigSet::empty();
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&waited), Some(&mut before))?;
    match crate::sys::fork_single_threaded()? {
        None => {
            // The agent: the mask it started with.
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
            Ok(true)
        }
        Some(agent) => std::process::exit(supervise(agent, &waited)),
    }
}

/// PID 1's loop: forwards signals to `agent`, reaps every child, and
/// returns the agent's exit status once it ends.
fn supervise(agent: Pid, waited: &SigSet) -> i32 {
    loop {
        let Ok(sig) = waited.wait() else {
            continue;
        };
        if sig != Signal::SIGCHLD {
            let _ = kill(agent, sig);
            continue;
        }
        if let Some(code) = reap(agent) {
            return code;
        }
    }
}

/// Waits for every child that has ended (SIGCHLDs merge: one may stand for
/// several); the agent's exit status if it was among them.
fn reap(agent: Pid) -> Option<i32> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == agent => return Some(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == agent => return Some(128 + sig as i32),
            // An orphan reaped, or a stop or continue reported: look again.
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}
