//! Machine-wide leases of what concurrent test runs share: TCP ports that a
//! process must be told before it starts, and `10.N.0.0/16` subnets for
//! network namespaces.
//!
//! Why leases and not "bind port 0, read the port, release it, pass it
//! on": between the release and the real bind anything on the machine may
//! take the port (the kernel hands out recently freed ports again), and
//! two test processes (two threads of one run, or two clones of the
//! repository running the suite at once) may be handed the same number.
//! Why not a unique loopback address per test: the processes under test
//! bind such ports on the wildcard address (a c10d `is_host` agent, node
//! rank 0 of a static job, torchrun's TCPStore), so only the port number
//! can be unique, never the address.
//!
//! So every port and subnet in use is recorded as a file, `KIND-N`, in one
//! directory for the whole machine (`/run/lock/accel-tests`, else
//! `$TMPDIR/accel-leases-UID`), holding its owner's pid and start time. A lease
//! is taken under an exclusive `flock` of `lock` in that directory, so two
//! takers never pick the same entry; it is removed when the lease is
//! dropped. A crashed run leaves its entries behind: an entry whose owner
//! is no longer alive (the pid is gone, or now names a process started at
//! another time) is reclaimed by the next taker.
//!
//! Leased ports lie outside the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`), so no `bind(port 0)` or outgoing
//! connection anywhere on the machine is given one, and skip the ports accel
//! and etcd use by default (a process started with its defaults binds
//! those). A candidate that something else holds right now is skipped too.
//! Leased subnets skip any `10.N` that an address or a harness link name
//! in this namespace already uses (a crashed run's leftovers).

use std::fs;
use std::io::Write as _;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// One entry of the machine-wide registry, removed on drop.
#[derive(Debug)]
struct Lease {
    path: PathBuf,
    stamp: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _guard = Locked::take();
        // Only ours: a reclaimed entry belongs to its new owner.
        if fs::read_to_string(&self.path).is_ok_and(|s| s == self.stamp) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The registry's directory, created on first use.
fn registry() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        // Usable: the lock can be opened for writing (another user's
        // directory may not let this one in; then this user's runs share
        // the fallback among themselves).
        let usable = |dir: &Path| {
            if fs::create_dir(dir).is_ok() {
                // Every user's runs share it; each removes only its own entries.
                use std::os::unix::fs::PermissionsExt as _;
                let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o1777));
            }
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("lock"))
                .map(|f| {
                    use std::os::unix::fs::PermissionsExt as _;
                    // Openable by every user (only its owner can widen it).
                    let _ = f.set_permissions(fs::Permissions::from_mode(0o666));
                })
                .is_ok()
        };
        let run = Path::new("/run/lock/accel-tests");
        if usable(run) {
            return run.to_owned();
        }
        let tmp = std::env::temp_dir().join(format!("accel-leases-{}", nix_uid()));
        assert!(usable(&tmp), "cannot use {} for leases", tmp.display());
        tmp
    })
    .clone()
}

/// This process's user id.
fn nix_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The registry's lock, held from [`Locked::take`] until drop.
struct Locked {
    _file: fs::File,
}

impl Locked {
    fn take() -> Self {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(registry().join("lock"))
            .expect("open the lease lock");
        // SAFETY: flock on a descriptor this function owns; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(
            rc,
            0,
            "flock the lease lock: {}",
            std::io::Error::last_os_error()
        );
        // Unlocked when the file is closed, on drop.
        Locked { _file: file }
    }
}

/// A process's start time since boot, in clock ticks (`/proc/PID/stat`'s
/// 22nd field): with the pid, it names one process even after pid reuse.
fn start_time(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from the 3rd.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// This process's stamp: `PID START`.
fn own_stamp() -> String {
    let pid = std::process::id();
    format!("{pid} {}", start_time(pid).unwrap_or_default())
}

/// Whether the process a stamp names still runs.
fn alive(stamp: &str) -> bool {
    let mut parts = stamp.split_whitespace();
    let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
        return false;
    };
    pid.parse::<u32>()
        .ok()
        .and_then(start_time)
        .is_some_and(|s| s == start)
}

/// Leases the first of `candidates` that no live process holds and
/// `usable` accepts; `None` if none is left.
fn take(
    kind: &str,
    candidates: impl IntoIterator<Item = u32>,
    mut usable: impl FnMut(u32) -> bool,
) -> Option<(u32, Lease)> {
    let _guard = Locked::take();
    let dir = registry();
    let stamp = own_stamp();
    for n in candidates {
        let path = dir.join(format!("{kind}-{n}"));
        match fs::read_to_string(&path) {
            Ok(owner) if alive(&owner) => continue,
            // A crashed run's entry (or a torn write): reclaimed.
            Ok(_) => {
                let _ = fs::remove_file(&path);
            }
            Err(_) => {}
        }
        if !usable(n) {
            continue;
        }
        // An entry another user left (and this one may not replace) is skipped.
        let Ok(mut f) = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        else {
            continue;
        };
        f.write_all(stamp.as_bytes()).expect("write a lease");
        return Some((
            n,
            Lease {
                path,
                stamp: stamp.clone(),
            },
        ));
    }
    None
}

/// Spreads the first candidate of successive takers of this process (and
/// of different processes) over the range, so they rarely probe the same
/// entries; correctness does not depend on it.
fn start_offset(len: u32) -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(n.wrapping_mul(104_729)))
        % len.max(1)
}

/// Ports processes use when told nothing else: accel's rendezvous and
/// metrics, torchrun's master port, etcd's client and peer ports.
const DEFAULT_PORTS: [u32; 5] = [29400, 29401, 29500, 2379, 2380];

/// The kernel's ephemeral port range.
fn ephemeral() -> (u32, u32) {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// A TCP port leased to this process until dropped: no concurrent test
/// (of this run or another) is given it, and the kernel never picks it for
/// a `bind` to port 0. For a port a process must be told before it starts
/// (a static `--master-port`, a c10d endpoint several agents are given, an
/// etcd member's URLs, a server restarted on the same address); a process
/// that can report its own port binds port 0 instead. Keep it alive as
/// long as the port is used.
#[derive(Debug)]
pub struct Port {
    port: u16,
    _lease: Lease,
}

impl Port {
    /// Leases a port that nothing holds now. Panics if every candidate is
    /// taken.
    pub fn lease() -> Port {
        let (lo, hi) = ephemeral();
        let candidates: Vec<u32> = (10_000..=65_535)
            .filter(|p| !(lo..=hi).contains(p) && !DEFAULT_PORTS.contains(p))
            .collect();
        let len = candidates.len() as u32;
        let first = start_offset(len) as usize;
        let order = candidates[first..]
            .iter()
            .chain(&candidates[..first])
            .copied();
        let free = |p: u32| {
            let p = p as u16;
            // Both families' wildcards: a holder of any address has the
            // port. Only "in use" counts (a machine may lack IPv6).
            let taken = |ip: &str| {
                std::net::TcpListener::bind((ip, p))
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
            };
            !taken("0.0.0.0") && !taken("::")
        };
        let (port, lease) = take("port", order, free).expect("every leasable port is taken");
        Port {
            port: port as u16,
            _lease: lease,
        }
    }

    /// The port number.
    pub fn get(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn loopback(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl std::fmt::Display for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.port)
    }
}

/// A subnet `10.N.0.0/16` leased to this process until dropped, for
/// network namespaces ([`crate::Netns`], [`crate::Lan`]): their addresses
/// and link names derive from `N`, so concurrent tests and runs never
/// collide.
#[derive(Debug)]
pub struct Subnet {
    net: u8,
    _lease: Lease,
}

/// The `N`s a [`Subnet`] is leased from.
const SUBNETS: std::ops::RangeInclusive<u32> = 64..=250;

impl Subnet {
    /// Leases a subnet that no live run holds and this namespace does not
    /// use. Panics if none is left.
    pub fn lease() -> Subnet {
        let len = SUBNETS.clone().count() as u32;
        let first = *SUBNETS.start() + start_offset(len);
        let order = (first..=*SUBNETS.end()).chain(*SUBNETS.start()..first);
        Self::take(order).expect("every leasable subnet is taken")
    }

    /// Leases `10.net.0.0/16` itself (a run told which subnet to use);
    /// `None` if another run holds it or this namespace uses it.
    pub fn exactly(net: u8) -> Option<Subnet> {
        Self::take([u32::from(net)])
    }

    fn take(order: impl IntoIterator<Item = u32>) -> Option<Subnet> {
        let show = |what: &str| {
            Command::new("ip")
                .args(["-o", what, "show"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let (addrs, links) = (show("addr"), show("link"));
        let link_names: Vec<&str> = links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n))
            .collect();
        let unused = |n: u32| {
            let prefix = format!(" 10.{n}.");
            !addrs.contains(&prefix)
                && !link_names
                    .iter()
                    .any(|l| ["h", "n", "l"].iter().any(|s| *l == format!("acn{n}{s}")))
        };
        take("subnet", order, unused).map(|(net, lease)| Subnet {
            net: net as u8,
            _lease: lease,
        })
    }

    /// `N` of `10.N.0.0/16`.
    pub fn net(&self) -> u8 {
        self.net
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leased_port_is_not_leased_again_until_dropped() {
        let ports: Vec<Port> = (0..20).map(|_| Port::lease()).collect();
        let mut numbers: Vec<u16> = ports.iter().map(Port::get).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), 20, "all different");
        let (lo, hi) = ephemeral();
        for p in &numbers {
            assert!(!(lo..=hi).contains(&u32::from(*p)), "{p} is ephemeral");
        }
        let path = registry().join(format!("port-{}", numbers[0]));
        assert!(path.exists());
        drop(ports);
        assert!(!path.exists(), "released on drop");
    }

    #[test]
    fn a_dead_owners_entry_is_reclaimed_and_a_live_ones_is_not() {
        // Subnet 251 is outside the leased range: only this test uses it.
        let path = registry().join("subnet-251");
        // pid 1's real start time: alive.
        fs::write(&path, format!("1 {}", start_time(1).expect("pid 1"))).expect("entry");
        assert!(Subnet::exactly(251).is_none(), "a live owner keeps it");
        // The same pid with another start time: a reused pid, dead owner.
        fs::write(&path, "1 0").expect("entry");
        let s = Subnet::exactly(251).expect("reclaimed");
        assert_eq!(s.net(), 251);
        assert_eq!(fs::read_to_string(&path).expect("entry"), own_stamp());
        drop(s);
        assert!(!path.exists());
    }
}
