//! The keeper: a process that runs one command (the agent's health check)
//! and takes everything that command starts with it, whenever and however
//! its run ends, the agent's `kill -9` included.
//!
//! # Why
//! A process group, and the guard that kills groups when the agent dies,
//! reach only the processes that stay in the group. A check that starts
//! `setsid sleep 300 &` has a child in a session of its own; when the
//! agent was killed mid-check, that child (and the check itself) lived on
//! (issue 50, B8). Nothing a process can do takes it out of its ancestor's
//! subtree while a *child subreaper* (`PR_SET_CHILD_SUBREAPER`) sits above
//! it: an orphan is re-parented to the nearest living subreaper, not to
//! init. So the check runs under a process of its own, the keeper, which
//! is such a subreaper and which kills its whole subtree when it is done.
//!
//! # How
//! [`run_under_keeper`](super::run_under_keeper) adds a hook to the check's spawn. In the
//! forked child (the keeper, `C`), before anything else:
//! 1. `setsid`: the keeper leads a session and a process group of its own
//!    (no terminal signal reaches the check);
//! 2. it becomes a child subreaper, blocks every signal, gives every
//!    signal its default disposition (what the agent ignores, the check
//!    should not; and with SIGCHLD ignored the kernel would reap the check
//!    before the keeper could read its status), and asks for SIGTERM when
//!    the agent's thread that spawned it dies (`PR_SET_PDEATHSIG`; checked
//!    against a death before the call);
//! 3. it forks the check (`G`), which leads a process group of its own
//!    (as a check did before the keeper: its `kill 0` or `kill -- -$$`
//!    reaches its own processes, never the keeper, which would take a
//!    SIGTERM for the agent's), restores the signal mask, asks for SIGKILL
//!    if the keeper dies, and returns from the hook: the spawn goes on to
//!    `exec` the command in `G`;
//! 4. the keeper closes every descriptor it holds (so the agent's spawn,
//!    and its reads of the check's output, do not wait for it) and waits
//!    for signals: SIGCHLD reaps; when `G` exits, the keeper kills its
//!    subtree and exits with `G`'s status (re-raising `G`'s signal), which
//!    the agent reads as the check's; SIGTERM (the agent cancels the check,
//!    or died) kills the subtree and exits at once.
//!
//! The subtree is killed by walking `/proc`: every process whose chain of
//! parents reaches the keeper gets SIGKILL, pass after pass (a process
//! killed in one pass may have forked in between), until a pass kills no
//! running one, at most `SWEEPS` (200) passes. Details that matter:
//! - the signal goes through a pidfd opened *before* the chain is read
//!   (Linux 5.3; plain `kill` before that): a process that exits and is
//!   reaped by its own parent between the read and the signal cannot have
//!   its pid, taken by an unrelated process, killed instead;
//! - a process shown as a zombie is killed too: a process whose main
//!   thread ended while others run shows as one (`Z`), and lives on;
//! - only a signal that was delivered counts as a kill: a process of
//!   another user (a set-user-ID program) cannot be killed, and does not
//!   keep the passes going.
//!
//! # Async-signal safety
//! The keeper is a fork of the agent, which has threads: until it would
//! `exec`, which it never does, it may only make async-signal-safe calls.
//! So everything here is raw system calls on stack buffers: no allocation,
//! no lock, no logging.

use std::io;

use nix::libc;
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpid, getppid, Pid};

/// Most passes over `/proc` a sweep makes.
const SWEEPS: u32 = 200;
/// Deepest chain of parents followed from a process to the keeper.
const DEPTH: u32 = 256;

/// The spawn hook: see the module docs. Runs in the forked child; in the
/// check it returns so that the spawn goes on to `exec`, in the keeper it
/// never returns.
pub(super) fn split(agent: Pid) -> io::Result<()> {
    nix::unistd::setsid()?;
    // SAFETY: prctl with integer arguments; a kernel without subreapers
    // (before 3.4) refuses, and the check runs as before.
    let _ = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut before = SigSet::empty();
    sigprocmask(
        SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut before),
    )?;
    default_dispositions();
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    if getppid() != agent {
        // The agent died before the death signal was asked for.
        exit_now(1);
    }
    let keeper = getpid();
    // Its own name, not the agent's: `pkill accel-agent` (and a reader of
    // `ps`) tells the two apart. A syscall on a static string.
    let _ = nix::sys::prctl::set_name(c"accel-keeper");
    // SAFETY: fork in a single-threaded process (this forked child); the
    // check only makes async-signal-safe calls until its exec.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if getppid() != keeper {
                let _ = nix::sys::signal::raise(Signal::SIGKILL);
            }
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
            Ok(())
        }
        nix::unistd::ForkResult::Parent { child } => keep(child),
    }
}

/// Gives every signal but SIGKILL and SIGSTOP (refused) its default
/// disposition. Called with every signal blocked: none is lost (only a
/// pending signal whose default is to be ignored would be, and the keeper
/// has no child yet).
fn default_dispositions() {
    // SAFETY: an all-zero `sigaction` is SIG_DFL with an empty mask and no
    // flags; a number that is no signal (or one the C library keeps for
    // itself) is refused, and nothing else changes.
    unsafe {
        let default: libc::sigaction = std::mem::zeroed();
        for sig in 1..=libc::SIGRTMAX() {
            libc::sigaction(sig, &default, std::ptr::null_mut());
        }
    }
}

/// The keeper's life once the check runs: see the module docs.
fn keep(check: Pid) -> ! {
    close_all();
    let mut waited = SigSet::empty();
    waited.add(Signal::SIGCHLD);
    waited.add(Signal::SIGTERM);
    loop {
        if let Ok(Signal::SIGTERM) = waited.wait() {
            sweep();
            exit_now(128 + Signal::SIGTERM as i32);
        }
        if let Some(status) = reap(check) {
            sweep();
            exit_as(status);
        }
    }
}

/// Reaps every child that exited; `Some` with the check's status if it
/// was among them.
fn reap(check: Pid) -> Option<WaitStatus> {
    let mut found = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return found,
            Ok(s @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)))
                if pid == check =>
            {
                found = Some(s);
            }
            Ok(_) => {}
        }
    }
}

/// Kills every process below the keeper until none is left (or
/// [`SWEEPS`] passes), reaping those that become its children.
fn sweep() {
    let me = getpid().as_raw();
    for _ in 0..SWEEPS {
        let mut found = false;
        each_process(|pid| {
            if pid != me {
                found |= kill_if_below(pid, me);
            }
        });
        let _ = reap(Pid::from_raw(-1));
        if !found {
            return;
        }
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        // SAFETY: nanosleep with a valid request and no remainder wanted.
        unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
    }
}

/// SIGKILLs `pid` if its chain of parents reaches `keeper` (see the module
/// docs): whether it was a running process (not a zombie) and the signal
/// was delivered.
fn kill_if_below(pid: i32, keeper: i32) -> bool {
    if below(pid, keeper).is_none() {
        return false;
    }
    // SAFETY: pidfd_open with a pid and no flags; a descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) } as i32;
    if pidfd < 0 && nix::errno::Errno::last() == nix::errno::Errno::ESRCH {
        return false;
    }
    // Read again now that the pidfd holds this very process: if the pid
    // was taken by another since, the chain read is that other's.
    let Some(state) = below(pid, keeper) else {
        if pidfd >= 0 {
            close(pidfd);
        }
        return false;
    };
    let killed = if pidfd >= 0 {
        // SAFETY: pidfd_send_signal on the pidfd just opened, no siginfo.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        } == 0;
        close(pidfd);
        sent
    } else {
        // No pidfds (before Linux 5.3, or refused by a seccomp filter).
        kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
    };
    killed && !matches!(state, b'Z' | b'X' | b'x')
}

/// The state letter of `pid` if its chain of parents reaches `keeper`.
fn below(pid: i32, keeper: i32) -> Option<u8> {
    let (state, mut parent) = stat(pid)?;
    for _ in 0..DEPTH {
        if parent == keeper {
            return Some(state);
        }
        if parent <= 1 {
            return None;
        }
        parent = stat(parent)?.1;
    }
    None
}

/// Calls `f` with the pid of every process in `/proc`.
fn each_process(mut f: impl FnMut(i32)) {
    let fd = open(
        b"/proc\0",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                buf.as_mut_ptr(),
                buf.len() as libc::c_uint,
            )
        };
        let Ok(n) = usize::try_from(n) else { break };
        if n == 0 {
            break;
        }
        for name in dirents(&buf[..n.min(buf.len())]) {
            if let Some(pid) = number(name) {
                f(pid);
            }
        }
    }
    close(fd);
}

/// The names of the `linux_dirent64` records in `buf`: after an 8-byte
/// inode and an 8-byte offset, a 2-byte record length, a type byte and
/// the name, NUL-terminated.
fn dirents(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let head = buf.get(at..at + 19)?;
        let len = usize::from(u16::from_ne_bytes([head[16], head[17]]));
        let record = buf.get(at..at + len).filter(|_| len >= 19)?;
        at += len;
        let name = &record[19..];
        Some(&name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())])
    })
}

/// A decimal number of at most 9 digits, or `None`.
fn number(digits: &[u8]) -> Option<i32> {
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    digits.iter().try_fold(0i32, |n, d| {
        d.is_ascii_digit().then(|| n * 10 + i32::from(d - b'0'))
    })
}

/// The state letter and parent pid of `pid`, from `/proc/PID/stat`.
fn stat(pid: i32) -> Option<(u8, i32)> {
    let mut path = [0u8; 32];
    let mut len = 0;
    for part in [&b"/proc/"[..], digits(pid, &mut [0u8; 10]), b"/stat\0"] {
        path.get_mut(len..len + part.len())?.copy_from_slice(part);
        len += part.len();
    }
    let fd = open(&path[..len], libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 512];
    // SAFETY: read writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    close(fd);
    parse_stat(&buf[..usize::try_from(n).ok()?.min(buf.len())])
}

/// The state letter and parent pid in a `/proc/PID/stat` line: the fields
/// after the command name, which is in parentheses and may hold anything.
fn parse_stat(line: &[u8]) -> Option<(u8, i32)> {
    let end = line.iter().rposition(|b| *b == b')')?;
    let rest = line.get(end + 2..)?;
    let state = *rest.first()?;
    let ppid = rest.get(2..)?;
    let ppid = &ppid[..ppid.iter().position(|b| *b == b' ').unwrap_or(ppid.len())];
    Some((state, number(ppid)?))
}

/// `n` in decimal, in `buf`.
fn digits(mut n: i32, buf: &mut [u8; 10]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || at == 0 {
            return &buf[at..];
        }
    }
}

/// Opens the NUL-terminated `path`; a negative descriptor on failure.
fn open(path: &[u8], flags: i32) -> i32 {
    if path.last() != Some(&0) {
        return -1;
    }
    // SAFETY: `path` is NUL-terminated.
    unsafe { libc::open(path.as_ptr().cast(), flags) }
}

fn close(fd: i32) {
    // SAFETY: closes a descriptor this module opened.
    unsafe { libc::close(fd) };
}

/// Closes every descriptor: the agent's (its spawn's error pipe, its
/// sockets) and the check's output pipes, so nothing waits on the keeper.
fn close_all() {
    // SAFETY: close_range over every descriptor; nothing here uses one after.
    let done = unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) } == 0;
    if done {
        return;
    }
    // Before Linux 5.9: one by one, up to the limit.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills `limit`.
    let most = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => limit.rlim_cur.min(1 << 20) as i32,
        _ => 1024,
    };
    for fd in 0..most {
        close(fd);
    }
}

/// Exits as the check did: with its code, or by its signal.
fn exit_as(status: WaitStatus) -> ! {
    match status {
        WaitStatus::Exited(_, code) => exit_now(code),
        WaitStatus::Signaled(_, sig, _) => {
            use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler};
            // No core file of the keeper for a check that dumped one (or
            // died of SIGQUIT, SIGABRT): the keeper's memory is a copy of the
            // agent's, and a core collector would report an agent crash.
            let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
            // SAFETY: the default disposition runs no handler code.
            let _ = unsafe { sigaction(sig, &default) };
            let mut only = SigSet::empty();
            only.add(sig);
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&only), None);
            let _ = nix::sys::signal::raise(sig);
            exit_now(128 + sig as i32)
        }
        _ => exit_now(1),
    }
}

fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is async-signal-safe and never returns.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_state_and_parent_whatever_the_name() {
        assert_eq!(
            parse_stat(b"42 (sleep) S 7 42 42 0 -1 4194560 87"),
            Some((b'S', 7))
        );
        assert_eq!(
            parse_stat(b"42 (a) b) (c) Z 1 0 0"),
            Some((b'Z', 1)),
            "a name with parentheses and spaces"
        );
        assert_eq!(parse_stat(b"1 (init) S 0 1 1"), Some((b'S', 0)));
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"42 (x) S "), None);
    }

    #[test]
    fn numbers_and_digits_round_trip() {
        for n in [0, 1, 9, 10, 4_194_304, i32::MAX] {
            let mut buf = [0u8; 10];
            let d = digits(n, &mut buf);
            assert_eq!(std::str::from_utf8(d).ok(), Some(n.to_string().as_str()));
            if n > 0 && n < 1_000_000_000 {
                assert_eq!(number(d), Some(n));
            }
        }
        assert_eq!(number(b"self"), None);
        assert_eq!(number(b""), None);
    }

    #[test]
    fn this_process_is_found_under_its_parent() {
        let me = std::process::id() as i32;
        let mut seen = false;
        each_process(|pid| seen |= pid == me);
        assert!(seen, "/proc lists this process");
        let parent = std::os::unix::process::parent_id() as i32;
        assert!(below(me, parent).is_some());
        assert!(below(parent, me).is_none());
    }

    #[test]
    fn the_command_leads_its_group_with_no_signal_blocked_or_ignored() {
        use std::os::unix::process::CommandExt;
        // As an agent started in the background by a shell (SIGINT and
        // SIGQUIT ignored): a signal this process ignores (one that nothing
        // else here uses). And one this thread blocks: the spawn empties
        // the mask in the child, and the keeper, which blocks them all,
        // must hand the command that empty mask.
        let ignored = libc::SIGRTMIN() + 7;
        // SAFETY: SIG_IGN runs no handler code.
        unsafe { libc::signal(ignored, libc::SIG_IGN) };
        let mut blocked = SigSet::empty();
        blocked.add(Signal::SIGUSR2);
        let mut before = SigSet::empty();
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&blocked), Some(&mut before)).expect("mask");
        let agent = getpid();
        let mut cmd = std::process::Command::new("/bin/sh");
        // pgrp and session are fields 5 and 6 of /proc/PID/stat, after the
        // parent (the keeper) in 4.
        cmd.args([
            "-c",
            "set -- $(cat /proc/$$/stat); [ \"$5\" = $$ ] && [ \"$6\" = \"$4\" ] || echo group $*; \
             grep -E '^Sig(Blk|Ign)' /proc/self/status",
        ]);
        // SAFETY: the hook makes only async-signal-safe calls (module docs).
        unsafe { cmd.pre_exec(move || split(agent)) };
        let out = cmd.output().expect("run");
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&before), None).expect("mask");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{:?}: {text}", out.status);
        assert!(
            !text.contains("group"),
            "its own group, the keeper's session: {text}"
        );
        let mask = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or_else(|| panic!("{name} in {text}"))
        };
        assert_eq!(mask("SigBlk:"), 0, "{text}");
        // The C library's own signals (32 to 34) are left as they were.
        let ign = mask("SigIgn:");
        assert_eq!(ign & 0x7fff_ffff, 0, "{text}");
        assert_eq!(ign & (1 << (ignored - 1)), 0, "{text}");
    }

    #[test]
    fn only_a_process_below_is_killed() {
        use std::process::{Command, Stdio};
        // A grandchild of this process, and a child beside it.
        let mut sh = Command::new("/bin/sh")
            .args(["-c", "sleep 300 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh");
        let mut other = Command::new("sleep").arg("300").spawn().expect("sleep");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(sh.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the pid");
        let grandchild: i32 = line.trim().parse().expect("a pid");
        let me = std::process::id() as i32;
        assert!(
            !kill_if_below(grandchild, other.id() as i32),
            "not below the other child"
        );
        assert!(
            matches!(stat(grandchild), Some((s, _)) if s != b'Z'),
            "left alone"
        );
        assert!(kill_if_below(grandchild, me), "below this process");
        let status = sh.wait().expect("sh ends");
        assert!(
            status.success(),
            "sh waited for its killed child: {status:?}"
        );
        assert!(stat(grandchild).is_none(), "killed and reaped");
        let _ = other.kill();
        let _ = other.wait();
    }
}
