//! The agent's only `unsafe` code and raw process calls: the worker's
//! pre-exec hook, forking the guard, signalling process groups, and the
//! host-name lookup torchrun's events report.
//!
//! Everything here is a thin wrapper; the policy lives in
//! [`crate::supervisor`] and [`crate::guard`].
#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;

use nix::sys::signal::{killpg as nix_killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getpid, Pid};

/// Makes the spawned worker die with SIGKILL if the agent thread that spawned
/// it dies (`PR_SET_PDEATHSIG`), closing the race where the agent died before
/// the hook ran.
pub(crate) fn kill_with_parent(cmd: &mut tokio::process::Command) {
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

/// Lets the agent and its children (`py-spy`, for a hung worker's stacks)
/// trace the spawned worker where Yama restricts `ptrace` to ancestors
/// (`kernel.yama.ptrace_scope` 1, Ubuntu's default): `PR_SET_PTRACER`
/// naming the agent. Without Yama the call fails and changes nothing.
pub(crate) fn let_agent_trace(cmd: &mut tokio::process::Command) {
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

/// The CPUs this process may run on (its affinity), as `--numa-binding`
/// limits a node's CPUs to them, like torch in torchrun's process.
pub(crate) fn allowed_cpus() -> io::Result<crate::numa::CpuList> {
    let set = nix::sched::sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..nix::sched::CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .filter_map(|cpu| u32::try_from(cpu).ok())
        .collect())
}

/// Binds the spawned worker, the whole process from its first instruction,
/// to `cpus` (`--numa-binding`; torchrun runs it under `numactl
/// --physcpubind`, which does the same before its exec).
pub(crate) fn bind_to_cpus(
    cmd: &mut tokio::process::Command,
    cpus: &crate::numa::CpuList,
) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for cpu in cpus.iter() {
        set.set(cpu as usize).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "CPU {cpu} is beyond the {} CPUs an affinity mask holds",
                    nix::sched::CpuSet::count()
                ),
            )
        })?;
    }
    // SAFETY: the closure runs in the forked child before exec and makes one
    // async-signal-safe system call (sched_setaffinity) on a mask built
    // before the fork, allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::sched_setaffinity(Pid::from_raw(0), &set).map_err(io::Error::from)
        });
    }
    Ok(())
}

/// Makes `fd` the spawned program's descriptor `target`, open across the
/// exec (the zygote's socket).
pub(crate) fn pass_fd(cmd: &mut tokio::process::Command, fd: std::os::fd::RawFd, target: i32) {
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
pub(crate) fn check_inherited_socket(fd: i32) -> io::Result<()> {
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
pub(crate) fn take_inherited_socket(fd: i32) -> io::Result<OwnedFd> {
    check_inherited_socket(fd)?;
    // SAFETY: the descriptor was checked at start-up, before the agent
    // opened any of its own, so this number is the inherited socket; this
    // is its one owner.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Sends `sig` to process group `pgid`; a group that no longer exists is not an error.
pub(crate) fn killpg(pgid: i32, sig: Signal) {
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
pub(crate) fn peek_exit(pid: i32) -> Option<Ended> {
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
) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: documented precondition: the caller is single-threaded, so the
    // child inherits no lock held by another thread.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            drop(write);
            drop(back_read);
            child(read, back_write, limit)
        }
        nix::unistd::ForkResult::Parent { .. } => {
            drop(read);
            drop(back_write);
            Ok((write, back_read))
        }
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

/// Python's `socket.getfqdn(name)`, which torchrun's events report as the
/// host name: `name` resolved to its first address and that address back
/// to its host name (`/etc/hosts` or DNS), or `name` itself when either
/// lookup fails. (Python also prefers a dotted alias of that host name;
/// `getnameinfo` gives no aliases, so the primary name is used.) Blocking:
/// a reverse lookup may wait on DNS.
pub(crate) fn fqdn(name: &str) -> String {
    use nix::libc;
    use std::ffi::{CStr, CString};
    let Ok(c_name) = CString::new(name) else {
        return name.to_owned();
    };
    // SAFETY: all-zero is a valid `addrinfo` (null pointers, zero flags).
    let hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: `c_name` is a valid C string, `hints` a valid addrinfo, and
    // `found` receives a list freed below with `freeaddrinfo`.
    let rc = unsafe { libc::getaddrinfo(c_name.as_ptr(), std::ptr::null(), &hints, &mut found) };
    if rc != 0 || found.is_null() {
        return name.to_owned();
    }
    let mut host = [0 as libc::c_char; libc::NI_MAXHOST as usize];
    // SAFETY: `found` is the non-null head of the list getaddrinfo made; its
    // `ai_addr` points to `ai_addrlen` bytes; `host` has the length given.
    let rc = unsafe {
        let first = &*found;
        let rc = libc::getnameinfo(
            first.ai_addr,
            first.ai_addrlen,
            host.as_mut_ptr(),
            host.len() as libc::socklen_t,
            std::ptr::null_mut(),
            0,
            libc::NI_NAMEREQD,
        );
        libc::freeaddrinfo(found);
        rc
    };
    if rc != 0 {
        return name.to_owned();
    }
    // SAFETY: on success getnameinfo wrote a NUL-terminated string into `host`.
    let resolved = unsafe { CStr::from_ptr(host.as_ptr()) };
    resolved.to_string_lossy().into_owned()
}

/// Makes the allocator return large freed blocks to the system at once:
/// every block of `threshold` bytes or more is mmapped, so freeing it unmaps it.
///
/// glibc's malloc raises its mmap threshold to the size of each mmapped
/// block freed (up to 32 MiB), after which blocks of that size come from its
/// heaps, and freeing them keeps the memory in the process: after a burst of
/// large incomplete requests that the worker store closed for its budget,
/// the agent would keep their memory. A fixed threshold turns that
/// adjustment off. (musl's malloc always unmaps large blocks.) Idempotent.
pub(crate) fn unmap_large_frees(threshold: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        let threshold = nix::libc::c_int::try_from(threshold).unwrap_or(nix::libc::c_int::MAX);
        // SAFETY: mallopt only changes a malloc tunable; it is thread-safe.
        ONCE.call_once(|| unsafe {
            nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, threshold);
        });
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = threshold;
}
