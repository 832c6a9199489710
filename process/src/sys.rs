//! The process layer's only `unsafe` code and raw process calls: the
//! worker's pre-exec hooks, forking the guard, signalling process groups,
//! making the process non-dumpable and blanking its token in its
//! environment block, finding the processes that hold a pipe, and the
//! health check's keeper ([`keeper`]).
//!
//! Everything here is a thin wrapper; the policy lives in the agent's
//! supervisor and in [`crate::guard`].
#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;

use nix::sys::signal::{killpg as nix_killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getpid, Pid};

/// Makes the spawned worker die with SIGKILL if the agent thread that spawned
/// it dies (`PR_SET_PDEATHSIG`), closing the race where the agent died before
/// the hook ran.
pub fn kill_with_parent(cmd: &mut tokio::process::Command) {
    let agent = getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid, kill), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if nix::unistd::getppid() != agent {
                let _ = nix::sys::signal::raise(Signal::SIGKILL);
            }
            Ok(())
        });
    }
}

pub mod keeper;

/// Runs the spawned command under a keeper ([`keeper`]): the spawned
/// process (the one the caller waits for, and signals) leads a session
/// and process group of its own, forks the command, and when the command
/// exits (or on SIGTERM, or when the spawning thread of this process dies,
/// `kill -9` included) kills every process below it, those that left its
/// group or session included, and exits as the command did. Stop it with
/// SIGTERM, never SIGKILL: killed, it cannot take the command's processes
/// along. Do not combine with `process_group`.
pub fn run_under_keeper(cmd: &mut tokio::process::Command) {
    let agent = getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls on stack buffers (see `keeper`).
    unsafe {
        cmd.pre_exec(move || keeper::split(agent));
    }
}

/// Lets the agent and its children (`py-spy`, for a hung worker's stacks)
/// trace the spawned worker where Yama restricts `ptrace` to ancestors
/// (`kernel.yama.ptrace_scope` 1, Ubuntu's default): `PR_SET_PTRACER`
/// naming the agent. Without Yama the call fails and changes nothing.
pub fn let_agent_trace(cmd: &mut tokio::process::Command) {
    let agent = getpid().as_raw() as nix::libc::c_ulong;
    // SAFETY: the closure runs in the forked child before exec and makes one
    // async-signal-safe system call (prctl), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            let _ = nix::libc::prctl(nix::libc::PR_SET_PTRACER, agent, 0, 0, 0);
            Ok(())
        });
    }
}

/// Makes `fd` the spawned program's descriptor `target`, open across the
/// exec (the zygote's socket).
pub fn pass_fd(cmd: &mut tokio::process::Command, fd: std::os::fd::RawFd, target: i32) {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (dup2, fcntl), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            if fd == target {
                let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
                fcntl(borrowed, FcntlArg::F_SETFD(FdFlag::empty())).map_err(io::Error::from)?;
            } else if nix::libc::dup2(fd, target) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Checks that `fd`, inherited from the parent, is a Unix stream socket,
/// and marks it close-on-exec so no worker inherits it. Called at start-up,
/// before the agent opens any descriptor of its own.
pub fn check_inherited_socket(fd: i32) -> io::Result<()> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, UnixAddr};
    use nix::sys::stat::{fstat, SFlag};
    // SAFETY: `fd` is only borrowed for the calls below, which fail cleanly
    // on a descriptor that is not open.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    let stat =
        fstat(borrowed).map_err(|e| invalid(format!("file descriptor {fd} is not open ({e})")))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
        return Err(invalid(format!("file descriptor {fd} is not a socket")));
    }
    let stream =
        getsockopt(&borrowed, sockopt::SockType).map_err(io::Error::from)? == SockType::Stream;
    if !stream || getsockname::<UnixAddr>(fd).is_err() {
        return Err(invalid(format!(
            "file descriptor {fd} is not a Unix stream socket"
        )));
    }
    nix::fcntl::fcntl(
        borrowed,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(())
}

/// Takes ownership of `fd`, the socket [`check_inherited_socket`] accepted.
pub fn take_inherited_socket(fd: i32) -> io::Result<OwnedFd> {
    check_inherited_socket(fd)?;
    // SAFETY: the descriptor was checked at start-up, before the agent
    // opened any of its own, so this number is the inherited socket; this
    // is its one owner.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Sends `sig` to process group `pgid`; a group that no longer exists is not an error.
pub fn killpg(pgid: i32, sig: Signal) {
    match nix_killpg(Pid::from_raw(pgid), sig) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pgid, signal = %sig, error = %e, "cannot signal worker group"),
    }
}

/// How a process ended, in the shell's convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal number.
    Signaled(i32),
}

impl Ended {
    /// The exit code, `128 + signal` for a killed process.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exited(c) => c,
            Ended::Signaled(s) => 128 + s,
        }
    }

    /// Whether it exited 0.
    pub fn success(self) -> bool {
        self == Ended::Exited(0)
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Ended::Exited(c) => write!(f, "exited with code {c}"),
            Ended::Signaled(s) => match Signal::try_from(s) {
                Ok(sig) => write!(f, "was killed by {sig} (exit code {})", 128 + s),
                Err(_) => write!(f, "was killed by signal {s} (exit code {})", 128 + s),
            },
        }
    }
}

impl From<std::process::ExitStatus> for Ended {
    fn from(s: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (s.code(), s.signal()) {
            (Some(c), _) => Ended::Exited(c),
            (None, Some(sig)) => Ended::Signaled(sig),
            (None, None) => Ended::Exited(-1),
        }
    }
}

/// Whether child `pid` has ended, without reaping it (its waiter still gets
/// the status): the backstop of the monitor interval.
pub fn peek_exit(pid: i32) -> Option<Ended> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(pid)), flags) {
        Ok(WaitStatus::Exited(_, code)) => Some(Ended::Exited(code)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(Ended::Signaled(sig as i32)),
        _ => None,
    }
}

/// Forks the guard process; `child` runs in it and never returns. The
/// guard gets `read` (the agent's records) and `back_write` (what it tells
/// the agent); the agent keeps `write` and `back_read`, returned.
///
/// Must be called while the process has a single thread (before the async
/// runtime starts): only then is running arbitrary code after `fork` sound.
pub(crate) fn fork_guard(
    child: fn(OwnedFd, OwnedFd, Option<std::time::Duration>) -> !,
    (read, write): (OwnedFd, OwnedFd),
    (back_read, back_write): (OwnedFd, OwnedFd),
    limit: Option<std::time::Duration>,
) -> io::Result<(OwnedFd, OwnedFd, Pid)> {
    match fork_single_threaded().map_err(io::Error::from)? {
        None => {
            drop(write);
            drop(back_read);
            child(read, back_write, limit)
        }
        Some(pid) => {
            drop(read);
            drop(back_write);
            Ok((write, back_read, pid))
        }
    }
}

/// Forks this process: `None` in the child, the child's pid in the parent.
///
/// Must be called while the process has a single thread: only then is
/// running arbitrary code after `fork` sound.
pub(crate) fn fork_single_threaded() -> nix::Result<Option<Pid>> {
    // SAFETY: documented precondition: the caller is single-threaded, so the
    // child inherits no lock held by another thread.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(None),
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child)),
    }
}

/// Ignores the terminal and service-manager stop signals in this process.
pub(crate) fn ignore_stop_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // SAFETY: installing SIG_IGN involves no handler code at all.
        let _ = unsafe { sigaction(sig, &ignore) };
    }
}

/// Ends this (forked) process at once, without running atexit handlers.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is async-signal-safe and never returns.
    unsafe { nix::libc::_exit(code) }
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0): its
/// `/proc/PID/environ`, `mem`, `fd` and `maps` become root's, and no process
/// of its user may `ptrace` it or read its memory, so a worker (same user)
/// cannot take the rendezvous token from it. Core dumps are off too. Kept
/// by the forked guard; an `exec` (workers, the zygote, `py-spy`) clears it.
pub fn not_dumpable() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(io::Error::from)
}

/// The inode of the pipe `fd` is an end of (as `/proc/PID/fd` names it:
/// `pipe:[INODE]`).
pub fn pipe_inode(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    nix::sys::stat::fstat(fd).ok().map(|st| st.st_ino)
}

/// SIGKILLs every other process that holds the write end of one of the
/// pipes `inodes` (found in `/proc/*/fd` and `/proc/*/fdinfo`; only the
/// processes this one may inspect, those of its user), and the process
/// group each leads, unless it is this process's own. Returns the pids
/// killed.
///
/// Only the write end keeps the reader from its end of file. A holder of
/// the read end is a fork of this process that has not yet reached its
/// `exec` (another spawn's child, a health check's keeper): it holds a copy
/// of every descriptor of this process for a moment, and is no business of
/// the pipe's.
pub fn kill_pipe_holders(inodes: &[u64]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let names: Vec<String> = inodes.iter().map(|i| format!("pipe:[{i}]")).collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // `flags:` in fdinfo is octal; the write end of a pipe is O_WRONLY.
    let writes = |pid: i32, fd: &std::ffi::OsStr| {
        std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy())).is_ok_and(
            |info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| i32::from_str_radix(f.trim(), 8).ok())
                    .is_some_and(|f| f & nix::libc::O_ACCMODE == nix::libc::O_WRONLY)
            },
        )
    };
    let holds = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|link| names.iter().any(|n| link.as_os_str() == n.as_str()))
                    && writes(pid, &fd.file_name())
            })
        })
    };
    let own_group = nix::unistd::getpgrp();
    let mut killed = Vec::new();
    for pid in procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && pid > 1)
    {
        if !holds(pid) {
            continue;
        }
        let target = Pid::from_raw(pid);
        if nix::unistd::getpgid(Some(target)).is_ok_and(|g| g == target && g != own_group) {
            let _ = nix_killpg(target, Signal::SIGKILL);
        }
        let _ = nix::sys::signal::kill(target, Signal::SIGKILL);
        killed.push(pid);
    }
    killed
}

/// The number of threads of this process, from `/proc/self/task`.
pub fn threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task")
        .ok()
        .map(Iterator::count)
}

/// The range of this process's memory that holds the environment it was
/// started with (what `/proc/self/environ` shows): fields 50 and 51 of
/// `/proc/self/stat`, `env_start` and `env_end`.
fn environment_block() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 2, the command name in parentheses, may hold spaces and `)`:
    // the fields after it start at 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let start: usize = fields.get(50 - 3)?.parse().ok()?;
    let end: usize = fields.get(51 - 3)?.parse().ok()?;
    // The kernel shows 0 when it will not say; ARG_MAX bounds a real block.
    (start != 0 && end > start && end - start <= 64 << 20).then_some((start, end))
}

/// Removes the variables `names` from this process's environment, and
/// overwrites their entries (name and value) with NUL bytes in the raw
/// block the process was started with, which `/proc/PID/environ` shows and
/// which `remove_var` leaves in place. Returns how many entries of the
/// block were overwritten.
///
/// Must be called while the process has a single thread: changing the
/// environment races with any other thread reading it. With more than
/// one thread it changes nothing and returns an error.
pub fn scrub_environment(names: &[&str]) -> io::Result<usize> {
    if threads() != Some(1) {
        return Err(io::Error::other(
            "the process has more than one thread; its environment is left as it is",
        ));
    }
    for name in names {
        // Single-threaded (checked above): nothing else reads it now.
        std::env::remove_var(name);
    }
    let Some((start, end)) = environment_block() else {
        return Ok(0);
    };
    // SAFETY: the kernel says the process's initial environment occupies
    // [start, end) of its address space (on its initial stack, mapped
    // read-write for the process's life). Nothing refers to these bytes as
    // Rust data; the C library's `environ` array points into them, but the
    // entries overwritten here were just removed from it (`unsetenv`
    // removes every copy), and the process has one thread, so nothing
    // reads them meanwhile.
    let block = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    Ok(scrub_block(block, names))
}

/// Overwrites with NUL bytes every `NAME=value` entry of the NUL-separated
/// `block` whose name is in `names`; returns how many.
fn scrub_block(block: &mut [u8], names: &[&str]) -> usize {
    let mut scrubbed = 0;
    let mut at = 0;
    while at < block.len() {
        let len = block[at..]
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(block.len() - at);
        let entry = &block[at..at + len];
        let named = names.iter().any(|n| {
            entry.len() > n.len() && entry.starts_with(n.as_bytes()) && entry[n.len()] == b'='
        });
        if named {
            block[at..at + len].fill(0);
            scrubbed += 1;
        }
        at += len + 1;
    }
    scrubbed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_entries_of_an_environment_block_are_blanked() {
        let mut block =
            b"PATH=/bin\0ACCEL_RDZV_TOKEN=s3cret\0ACCEL_RDZV_TOKEN_FILE=/t\0RDZV_TOKEN=x=y\0HOME=/root\0RDZV_TOKEN=again"
                .to_vec();
        let n = scrub_block(&mut block, &["ACCEL_RDZV_TOKEN", "RDZV_TOKEN"]);
        assert_eq!(n, 3, "both copies of RDZV_TOKEN, one ACCEL_RDZV_TOKEN");
        let text = String::from_utf8_lossy(&block).replace('\0', "|");
        assert!(
            !text.contains("s3cret") && !text.contains("again") && !text.contains("x=y"),
            "{text}"
        );
        let entries: Vec<&str> = text.split('|').filter(|e| !e.is_empty()).collect();
        assert_eq!(
            entries,
            ["PATH=/bin", "ACCEL_RDZV_TOKEN_FILE=/t", "HOME=/root"],
            "a longer name with the same start is another variable"
        );
        assert_eq!(block.len(), 101, "the block keeps its length");
    }

    #[test]
    fn the_environment_is_left_alone_when_other_threads_run() {
        // The test harness runs tests on threads of their own.
        let other =
            std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(300)));
        std::env::set_var("ACCEL_TEST_SCRUB_ME", "1");
        assert!(scrub_environment(&["ACCEL_TEST_SCRUB_ME"]).is_err());
        assert_eq!(std::env::var("ACCEL_TEST_SCRUB_ME").as_deref(), Ok("1"));
        other.join().expect("join");
    }

    #[test]
    fn only_a_writer_of_the_pipe_is_killed() {
        use std::os::fd::AsFd;
        use std::process::{Command, Stdio};
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        let inode = pipe_inode(read.as_fd()).expect("inode");
        let mut writer = Command::new("sleep")
            .arg("300")
            .stdout(Stdio::from(write))
            .spawn()
            .expect("writer");
        // As a fork of this process before its exec: the read end only.
        let mut reader = Command::new("sleep")
            .arg("300")
            .stdin(Stdio::from(read))
            .spawn()
            .expect("reader");
        let killed = kill_pipe_holders(&[inode]);
        let _ = reader.kill();
        let _ = reader.wait();
        let _ = writer.kill();
        let _ = writer.wait();
        assert_eq!(killed, [writer.id() as i32], "the reader {}", reader.id());
    }

    #[test]
    fn this_processs_environment_block_is_found() {
        let (start, end) = environment_block().expect("env_start and env_end");
        assert!(end > start);
    }
}
