//! The agent's own `unsafe` calls that are not process control: CPU
//! affinity for `--numa-binding` (it speaks the agent's `CpuList`) and the
//! host-name lookup torchrun's events report. Process control (spawn hooks,
//! signalling groups, the guard's fork, hardening) is in `accel-process`.
//!
//! Everything here is a thin wrapper; the policy lives in `numa` and `events`.
#![allow(unsafe_code)]

use std::io;

use nix::unistd::Pid;

pub(crate) use accel_process::Ended;

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
