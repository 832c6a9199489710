//! Helpers for accel's integration tests: start the real `rdzv-server` and
//! `accel-agent` binaries on loopback, with small Python workers that record
//! what they saw (`tests/workers/record.py`).
//!
//! The binaries are taken from the same target directory as the test binary;
//! the README's test command builds them first (`cargo build --workspace`).
//!
//! # Deterministic by construction
//! Tests run side by side (threads of one run, and two clones running the
//! suite on one machine), so nothing here guesses:
//! - **Addresses.** A process that can report where it listens binds port 0
//!   and says so: [`Server`] starts `rdzv-server --bind 127.0.0.1:0
//!   --address-file F` (metrics on port 0 too) and reads both addresses
//!   from `F` once the server has renamed it into place; its log is never
//!   parsed for them. A port a process must be told before it starts (a
//!   static `--master-port`, a c10d endpoint an `is_host` agent binds on
//!   the wildcard address, etcd's client and peer URLs, an agent's
//!   `--metrics-bind`, a server restarted on the same address) is a
//!   [`Port`]: leased machine-wide under a lock file, outside the kernel's
//!   ephemeral range, held until the test drops it ([`lease`] says why a
//!   unique loopback address would not do).
//! - **Network namespaces.** [`Netns`] and [`Lan`] take a [`Subnet`]
//!   `10.N.0.0/16` leased the same way; names and addresses derive from
//!   `N`, so they never collide, and a crashed run's leases are reclaimed.
//! - **Order.** A test waits for the event it needs ([`poll_until`] on a
//!   file, a metric, a status call; a log line only as a last resort),
//!   never a fixed sleep; a test that proves something does *not* happen
//!   asserts it over the whole window ([`ensure_quiet_for`]).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod chaos;
pub mod etcd;
pub mod lease;

pub use lease::{Port, Subnet};

/// Path of a workspace binary next to the running test.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first with `cargo build --workspace`",
        path.display()
    );
    path
}

/// The Python worker script that records its environment.
pub fn record_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workers/record.py")
}

/// The pinned Python environment with torch and accelerate, from `ACCEL_VENV`
/// (set by `scripts/test.sh`, which creates it with `scripts/setup.sh`).
pub fn venv() -> PathBuf {
    let dir = std::env::var_os("ACCEL_VENV").map(PathBuf::from).unwrap_or_else(|| {
        panic!("ACCEL_VENV is not set: run the tests through scripts/test.sh, or export ACCEL_VENV=$(scripts/setup.sh)")
    });
    assert!(
        dir.join("bin/python").exists(),
        "ACCEL_VENV={} has no bin/python; run scripts/setup.sh",
        dir.display()
    );
    dir
}

/// `PATH` with the venv's `bin/` first, so `python3` and `torchrun` are the pinned ones.
pub fn venv_path() -> String {
    let old = std::env::var("PATH").unwrap_or_default();
    format!("{}:{old}", venv().join("bin").display())
}

/// The torch releases the conformance tests (worker store, worker
/// environment, DDP resume, torchrun's flags) run against: the oldest
/// supported, the pinned one (`ACCEL_VENV`'s) and the newest.
/// `scripts/setup.sh` makes a venv for each but the pinned one.
pub const TORCH_VERSIONS: [&str; 3] = ["2.4.1", PINNED_TORCH, "2.15.0"];

/// The torch release of `ACCEL_VENV` (scripts/setup.sh's pin).
pub const PINNED_TORCH: &str = "2.13.0";

/// The venv with torch `version` (one of [`TORCH_VERSIONS`]): the pinned
/// venv, or its sibling `venv-pyX.Y-torchVERSION` that scripts/setup.sh
/// makes (torch alone, with its own `torchrun`).
pub fn torch_venv(version: &str) -> PathBuf {
    let pinned = venv();
    if version == PINNED_TORCH {
        return pinned;
    }
    let name = pinned
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let py = name.split("-torch").next().unwrap_or("venv");
    let dir = pinned
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("{py}-torch{version}"));
    assert!(
        dir.join(".complete").exists(),
        "{} (torch {version}) is missing: run scripts/setup.sh",
        dir.display()
    );
    dir
}

/// Every torch the conformance tests run against, with its venv: the
/// [`TORCH_VERSIONS`], and the venv `ACCEL_NEWEST_VENV` names, if set
/// (`scripts/newest.sh` sets it to a scratch venv of the newest torch and
/// accelerate on the package registry).
pub fn tested_torch() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = TORCH_VERSIONS
        .iter()
        .map(|v| ((*v).to_owned(), torch_venv(v)))
        .collect();
    if let Some(extra) = std::env::var_os("ACCEL_NEWEST_VENV").map(PathBuf::from) {
        assert!(
            extra.join("bin/python").exists(),
            "ACCEL_NEWEST_VENV={} has no bin/python",
            extra.display()
        );
        out.push(("newest".to_owned(), extra));
    }
    out
}

/// `PATH` with `venv`'s `bin/` first.
pub fn path_with(venv: &Path) -> String {
    let old = std::env::var("PATH").unwrap_or_default();
    format!("{}:{old}", venv.join("bin").display())
}

/// The accelerate releases the parity tests run against: the oldest
/// supported (1.10's latest patch), the pinned one (`ACCEL_VENV`'s) and the
/// newest. `scripts/setup.sh` makes a venv for each but the pinned one.
pub const ACCELERATE_VERSIONS: [&str; 3] = ["1.10.1", PINNED_ACCELERATE, "1.16.0"];

/// The accelerate release of `ACCEL_VENV` (scripts/setup.sh's pin).
pub const PINNED_ACCELERATE: &str = "1.15.0";

/// The newest accelerate release the launch parity test runs against:
/// [`ACCELERATE_VERSIONS`]' newest, or the release `ACCEL_NEWEST_ACCELERATE`
/// names (`scripts/newest.sh` sets it to the newest on the package registry,
/// after making its venv beside the others with scripts/setup.sh).
pub fn newest_accelerate() -> &'static str {
    match std::env::var("ACCEL_NEWEST_ACCELERATE") {
        Ok(v) if !v.is_empty() => Box::leak(v.into_boxed_str()),
        _ => ACCELERATE_VERSIONS[2],
    }
}

/// A Python environment with one accelerate release (and the pinned torch).
#[derive(Debug, Clone)]
pub struct AccelerateVenv {
    /// accelerate's version in it.
    pub version: &'static str,
    /// Its root (`bin/python`, `bin/accelerate`, `bin/torchrun`).
    pub root: PathBuf,
}

impl AccelerateVenv {
    /// The venv for `version` (one of [`ACCELERATE_VERSIONS`]): the pinned
    /// venv itself, or the one setup.sh made beside it
    /// (`$ACCEL_VENV/accelerate-versions/X.Y.Z`). Panics naming the fix
    /// when it is missing: a test never skips a version silently.
    pub fn of(version: &'static str) -> AccelerateVenv {
        let root = if version == PINNED_ACCELERATE {
            venv()
        } else {
            venv().join("accelerate-versions").join(version)
        };
        assert!(
            root.join(".complete").exists() || version == PINNED_ACCELERATE,
            "no venv with accelerate {version} at {}: run scripts/setup.sh",
            root.display()
        );
        let meta = root.join(format!(
            "lib/python3.{}/site-packages/accelerate-{version}.dist-info",
            python_minor(&root)
        ));
        assert!(
            meta.is_dir(),
            "{} is not accelerate {version}'s venv ({} is missing): run scripts/setup.sh",
            root.display(),
            meta.display()
        );
        AccelerateVenv { version, root }
    }

    /// A program in its `bin/`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.root.join("bin").join(name)
    }

    /// `PATH` with its `bin/` first.
    pub fn path(&self) -> String {
        let old = std::env::var("PATH").unwrap_or_default();
        format!("{}:{old}", self.root.join("bin").display())
    }
}

/// The minor Python version of a venv (from its `lib/python3.N`).
fn python_minor(root: &Path) -> String {
    std::fs::read_dir(root.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .find_map(|n| n.strip_prefix("python3.").map(str::to_owned))
        .unwrap_or_default()
}

/// A worker script under `tests/workers/`.
pub fn worker(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workers")
        .join(name)
}

/// Runs `argv` in a private mount namespace whose `/etc/hosts` also maps
/// `::1` and `::ffff:127.0.0.1` to `localhost`, so PyTorch's TCPStore server
/// (used by torchrun) answers its reverse lookups of loopback peers locally
/// instead of stalling on unreachable DNS. The machine's file is untouched.
/// Needs root (the test command runs as root in CI).
pub fn with_private_hosts(dir: &Path, argv: &[&str]) -> Command {
    let hosts = dir.join("hosts");
    let mut text = fs::read_to_string("/etc/hosts").unwrap_or_default();
    text.push_str("\n::1 localhost\n::ffff:127.0.0.1 localhost\n");
    fs::write(&hosts, text).expect("write hosts");
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/hosts && exec \"$@\"",
    ])
    .arg(&hosts)
    .args(argv);
    cmd
}

/// Runs `cmd` to completion with output to `dir/<name>.*`, failing the test after `limit`.
pub fn run_logged(mut cmd: Command, dir: &Path, name: &str, limit: Duration) -> Finished {
    let stdout = dir.join(format!("{name}.stdout"));
    let stderr = dir.join(format!("{name}.stderr"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout).expect("stdout file"))
        .stderr(fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("spawn");
    let status = wait_for(&mut child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        panic!(
            "{name} did not finish within {limit:?}: {}",
            fs::read_to_string(&stderr).unwrap_or_default()
        )
    });
    Finished {
        status,
        stdout: fs::read_to_string(&stdout).unwrap_or_default(),
        stderr: fs::read_to_string(&stderr).unwrap_or_default(),
    }
}

/// A JSON file written by a worker.
pub fn read_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The second local user of the shared-node tests: a job runs as one user
/// (root, as the tests do), and what this user can read or reach of it is
/// what any other user of the node could. `scripts/setup.sh` creates it.
pub const OTHER_USER: &str = "accel-other";

/// [`OTHER_USER`]'s uid and gid. Panics with the fix when the user is missing:
/// a test that needs it never passes without it.
pub fn other_user() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, OTHER_USER])
            .output()
            .expect("run id");
        assert!(
            out.status.success(),
            "the local user {OTHER_USER} is missing: run scripts/setup.sh (it creates it)"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
}

/// Makes `cmd` run as [`OTHER_USER`], with its primary group only.
pub fn as_other_user(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    let (uid, gid) = other_user();
    cmd.uid(uid)
        .gid(gid)
        .env("HOME", "/")
        .env_remove("ACCEL_RDZV_TOKEN")
}

/// A fresh scratch directory for one test, kept afterwards (a failed test's
/// logs and worker files stay readable) for a day: the first call of a run
/// deletes the scratch directories of runs older than that.
pub fn scratch(name: &str) -> PathBuf {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| sweep_scratch(std::time::Duration::from_secs(24 * 3600)));
    tempfile::Builder::new()
        .prefix(&format!("accel-test-{name}-"))
        .tempdir()
        .expect("create scratch dir")
        .keep()
}

/// Deletes the `accel-test-*` and `accel-chaos-*` directories in the
/// temporary directory last modified more than `age` ago.
fn sweep_scratch(age: std::time::Duration) {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|e| e > age);
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // And the chaos run's own, which a run with violations keeps.
        let ours = name.starts_with("accel-test-") || name.starts_with("accel-chaos-");
        if ours && old && entry.path().is_dir() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// `GET http://ADDR/PATH` (plain HTTP/1.1): the status code and the body;
/// `None` if nothing answers.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http_get_with(addr, path, &[]).map(|(status, _, body)| (status, body))
}

/// [`http_get`] with request `headers`; the status code, the response's
/// head (status line and headers) and its body.
pub fn http_get_with(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String, String)> {
    http_request(addr, "GET", path, headers)
}

/// One `method` request without a body (see [`http_get_with`]).
pub fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut body = raw[end + 4..].to_vec();
    // A large answer comes in chunks (Prometheus's beyond 2 KiB).
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
        })
    });
    if chunked {
        body = dechunk(&body)?;
    }
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, head, String::from_utf8_lossy(&body).into_owned()))
}

/// The payload of a chunked HTTP/1.1 body; `None` if it is cut short.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// The value of the sample `series` (name and labels exactly as exposed,
/// e.g. `accel_rdzv_restarts_total{kind="failure"}`) in a Prometheus text
/// exposition; `None` if absent.
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Polls `f` every 100 ms until it gives `Ok`, for at most `limit`;
/// panics naming `what` (and the last state `f` saw) otherwise.
pub fn poll_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("{what}: not within {limit:?}; last seen: {last}")
            }
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The jobs a rendezvous at `endpoint` (an `rdzv-server`, or an agent's
/// embedded one) reports (`rdzv-server status --json`), with `env` added
/// (e.g. `ACCEL_RDZV_TOKEN`); or why not. For a test that waits until the
/// rendezvous has seen something (a join, a job's end) before going on.
pub fn status_jobs(endpoint: &str, env: &[(&str, &str)]) -> Result<Vec<Value>, String> {
    let out = Command::new(bin("rdzv-server"))
        .args(["status", "--json", "--rdzv-endpoint", endpoint])
        .envs(env.iter().copied())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {out:?}"))?;
    v["jobs"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("no jobs list in {v}"))
}

/// Whether the rendezvous at `endpoint` (with `env`, e.g. its token) has
/// job `job` running round `round` with `nodes` nodes, each running.
pub fn job_running(
    endpoint: &str,
    env: &[(&str, &str)],
    job: &str,
    round: u64,
    nodes: usize,
) -> bool {
    status_jobs(endpoint, env).is_ok_and(|jobs| {
        jobs.iter().any(|j| {
            j["job_id"] == job
                && j["phase"] == "running"
                && j["round"] == round
                && j["nodes"]
                    .as_array()
                    .is_some_and(|n| n.len() == nodes && n.iter().all(|x| x["state"] == "running"))
        })
    })
}

/// Asserts that every worker of `recs` stays alive for the whole of
/// `window` (for a fault that must stop none of them; nothing marks the
/// moment a fence would have come, so the whole window is watched).
pub fn all_alive_for(recs: &[Record], window: Duration) {
    ensure_quiet_for("every worker keeps running", window, || {
        match recs.iter().find(|r| !alive(r.pid)) {
            Some(r) => Err(format!("rank {} (pid {}) was stopped", r.rank, r.pid)),
            None => Ok(()),
        }
    });
}

/// One TCP socket of this network namespace (`/proc/net/tcp` and `tcp6`):
/// what the kernel knows about a connection that a test can wait on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    /// Its own address.
    pub local: std::net::SocketAddr,
    /// Its peer's (unspecified for a listener).
    pub remote: std::net::SocketAddr,
    /// Its state, as the kernel numbers it (1: established, 8: close-wait, 10: listen).
    pub state: u8,
    /// Bytes written and not acknowledged by the peer yet.
    pub tx_queue: u64,
    /// Bytes received and not read by the program yet (for a listener:
    /// connections not accepted yet).
    pub rx_queue: u64,
}

/// `/proc/net/tcp`'s `HEX_IP:HEX_PORT` (each 32-bit word in host order).
fn proc_addr(field: &str) -> Option<std::net::SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
            .ok()
            .map(u32::to_ne_bytes)
    };
    let ip: std::net::IpAddr = match ip.len() {
        8 => std::net::Ipv4Addr::from(word(0)?).into(),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = std::net::Ipv6Addr::from(octets);
            v6.to_ipv4_mapped().map_or(v6.into(), Into::into)
        }
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

/// Every TCP socket of this network namespace (IPv4-mapped addresses as IPv4).
pub fn tcp_sockets() -> Vec<TcpSocket> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| fs::read_to_string(t).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    // sl local rem st tx_queue:rx_queue ...
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let (tx, rx) = f.get(4)?.split_once(':')?;
                    Some(TcpSocket {
                        local: proc_addr(f.get(1)?)?,
                        remote: proc_addr(f.get(2)?)?,
                        state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                        tx_queue: u64::from_str_radix(tx, 16).ok()?,
                        rx_queue: u64::from_str_radix(rx, 16).ok()?,
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How many connections to the listener at `addr` (`IP:PORT` in this
/// network namespace) the kernel has completed and the program has not
/// accepted yet; `None` if nothing listens there.
pub fn accept_queue(addr: &str) -> Option<u64> {
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    tcp_sockets()
        .into_iter()
        .find(|s| s.local == addr && s.state == 10)
        .map(|s| s.rx_queue)
}

/// Bytes this process sent on `conns` that the program at their far end
/// has not read yet: in flight, or waiting in its receive queue. 0 once it
/// has read everything (or closed the connection). For a test that must
/// not go on before a server has taken what it was sent.
pub fn unread_by_peer(conns: &[&std::net::TcpStream]) -> u64 {
    let sockets = tcp_sockets();
    conns
        .iter()
        .filter_map(|c| Some((c.local_addr().ok()?, c.peer_addr().ok()?)))
        .map(|(me, peer)| {
            let mine = sockets
                .iter()
                .find(|s| s.local == me && s.remote == peer)
                .map_or(0, |s| s.tx_queue);
            let theirs = sockets
                .iter()
                .find(|s| s.local == peer && s.remote == me)
                .map_or(0, |s| s.rx_queue);
            mine + theirs
        })
        .sum()
}

/// Bytes that arrived on `c` and this process has not read yet.
pub fn received_unread(c: &std::net::TcpStream) -> u64 {
    let (Ok(me), Ok(peer)) = (c.local_addr(), c.peer_addr()) else {
        return 0;
    };
    tcp_sockets()
        .iter()
        .find(|s| s.local == me && s.remote == peer)
        .map_or(0, |s| s.rx_queue)
}

/// Whether the far end of `c` has closed it (the kernel's side of `c` is
/// no longer established: close-wait after a FIN, gone after a reset).
pub fn closed_by_peer(c: &std::net::TcpStream) -> bool {
    let (Ok(me), Ok(peer)) = (c.local_addr(), c.peer_addr()) else {
        return true;
    };
    !tcp_sockets()
        .iter()
        .any(|s| s.local == me && s.remote == peer && s.state == 1)
}

/// Asserts `check` holds (`Ok`) at every poll for the whole of `window`:
/// for a test that proves something does *not* happen, when nothing
/// observable marks the moment it would have (say why at the call).
/// Panics naming `what` and what `check` saw the first time it failed.
pub fn ensure_quiet_for(
    what: &str,
    window: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) {
    let deadline = Instant::now() + window;
    loop {
        if let Err(seen) = check() {
            panic!("{what}: broken within {window:?}: {seen}");
        }
        if Instant::now() >= deadline {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// A prefix that runs a command as another host, `stranger` (a UTS
/// namespace of its own), for a node that must not be taken for one of
/// this host's: `cmd.start_with(&STRANGER_HOST, ...)`.
pub const STRANGER_HOST: [&str; 5] = [
    "unshare",
    "--uts",
    "sh",
    "-c",
    "hostname stranger && exec \"$0\" \"$@\"",
];

/// A prefix that runs a command as host `name` (a UTS namespace of its
/// own, with that host name): for tests of what follows host names (node
/// ranks, quarantine), `cmd.start_with(&prefix, ...)`.
pub fn as_host(name: &str) -> Vec<String> {
    [
        "unshare",
        "--uts",
        "sh",
        "-c",
        &format!("hostname {name} && exec \"$0\" \"$@\""),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A running `rdzv-server`.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// `IP:PORT` it listens on (from its `--address-file`).
    pub addr: String,
    /// `IP:PORT` of its metrics endpoint, unless that is `off`.
    pub metrics: Option<String>,
    /// What it logged so far (the first [`SERVER_LOG_LINES`] lines).
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Holds its `--address-file`; removed on drop.
    _files: tempfile::TempDir,
}

/// Lines of a [`Server`]'s log kept for [`Server::stderr`].
pub const SERVER_LOG_LINES: usize = 100_000;

/// The addresses `rdzv-server --address-file PATH` wrote (`grpc`, and
/// `metrics` if served), once it listens; panics naming what it logged if
/// it exits or writes nothing within 20 s.
pub fn wait_for_address_file(
    path: &Path,
    server: &mut Child,
    log: &dyn Fn() -> String,
) -> (String, Option<String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Written whole (renamed into place): present means complete.
        if let Ok(text) = fs::read_to_string(path) {
            let field = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                    .map(str::to_owned)
            };
            let grpc = field("grpc").unwrap_or_else(|| panic!("no grpc= in {text:?}"));
            return (grpc, field("metrics"));
        }
        if let Ok(Some(status)) = server.try_wait() {
            panic!("rdzv-server exited ({status}) before listening:\n{}", log());
        }
        assert!(
            Instant::now() < deadline,
            "rdzv-server wrote no {} within 20 s:\n{}",
            path.display(),
            log()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

impl Server {
    /// Starts `rdzv-server --bind 127.0.0.1:0` and waits until it listens.
    pub fn start() -> Self {
        Self::start_at("127.0.0.1:0")
    }

    /// Starts `rdzv-server --bind BIND` and waits until it listens.
    pub fn start_at(bind: &str) -> Self {
        Self::start_with(bind, &[], &[])
    }

    /// Starts `rdzv-server --bind BIND ARGS` with `env` added, and waits
    /// until it listens.
    pub fn start_with(bind: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_in(&[], bind, args, env)
    }

    /// [`Self::start_with`] behind `PREFIX...` (e.g. a [`Netns`]'s `exec`,
    /// which leaves the server's pid as it is). Its addresses are read from
    /// its `--address-file`, never from its log.
    pub fn start_in(prefix: &[&str], bind: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let server = bin("rdzv-server");
        let files = tempfile::Builder::new()
            .prefix("accel-rdzv-")
            .tempdir()
            .expect("address file dir");
        let address_file = files.path().join("addresses");
        let mut command = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&server);
                c
            }
            None => Command::new(&server),
        };
        let mut child = command
            .args(["--bind", bind])
            .args(args)
            // Tests run side by side: metrics on a port of their own.
            .env("RDZV_METRICS_BIND", "127.0.0.1:0")
            .env("RDZV_ADDRESS_FILE", &address_file)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rdzv-server");
        let stderr = child.stderr.take().expect("stderr");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = log.clone();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut kept) = kept.lock() {
                    if kept.len() < SERVER_LOG_LINES {
                        kept.push(line.clone());
                    }
                }
                eprintln!("[rdzv-server] {line}");
            }
        });
        let logged = || log.lock().map(|l| l.join("\n")).unwrap_or_default();
        let (addr, metrics) = wait_for_address_file(&address_file, &mut child, &logged);
        Self {
            child,
            addr,
            metrics,
            log,
            _files: files,
        }
    }

    /// What the server logged so far, one line per line.
    pub fn stderr(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Sends `sig` to the server.
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the server to exit.
    pub fn wait(mut self, limit: Duration) -> ExitStatus {
        wait_for(&mut self.child, limit).expect("rdzv-server exits in time")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `accel-agent` whose output goes to files.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    /// Its stdout file.
    pub stdout: PathBuf,
    /// Its stderr file.
    pub stderr: PathBuf,
}

/// The result of an agent run.
#[derive(Debug)]
pub struct Finished {
    /// Exit status.
    pub status: ExitStatus,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
}

impl Finished {
    /// The exit code (panics if killed by a signal).
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("agent killed by a signal: {self:?}"))
    }
}

impl Agent {
    /// Starts `accel-agent ARGS` with `env` added, output under `dir/<name>.*`.
    pub fn start(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_with(&[], dir, name, args, env)
    }

    /// Starts `PREFIX... accel-agent ARGS` (e.g. `ip netns exec NS`).
    pub fn start_with(
        prefix: &[&str],
        dir: &Path,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = agent_command(prefix)
            .args(args)
            .envs(env.iter().copied())
            .env("ACCEL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout).expect("stdout file"))
            .stderr(fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start accel-agent");
        Self {
            child: Some(child),
            stdout,
            stderr,
        }
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends `sig` (`TERM`, `KILL`, …) to the agent.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Whether the agent is still running.
    pub fn running(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        matches!(child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the agent to exit.
    pub fn wait(mut self, limit: Duration) -> Finished {
        let mut child = self.child.take().expect("running");
        let status = wait_for(&mut child, limit).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "accel-agent did not exit within {limit:?}\nstderr:\n{}",
                fs::read_to_string(&self.stderr).unwrap_or_default()
            )
        });
        Finished {
            status,
            stdout: fs::read_to_string(&self.stdout).unwrap_or_default(),
            stderr: fs::read_to_string(&self.stderr).unwrap_or_default(),
        }
    }
}

/// `PREFIX... accel-agent`, or `accel-agent` alone for an empty prefix.
fn agent_command(prefix: &[&str]) -> Command {
    let agent = bin("accel-agent");
    match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&agent);
            c
        }
        None => Command::new(&agent),
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A network namespace joined to this one by a veth pair: a separate host on
/// `10.N.0.2`, reaching this namespace at `10.N.0.1`, `N` from a leased
/// [`Subnet`] (or a host on a [`Lan`]). Needs root; removed on drop.
#[derive(Debug)]
pub struct Netns {
    /// Namespace name.
    pub name: String,
    /// The far end of the namespace's link (set it down to cut the link).
    pub host_if: String,
    /// The namespace holding `host_if`: this one, or a [`Lan`]'s switch.
    link_ns: Option<String>,
    /// This namespace's side of the link, as the namespace reaches it.
    pub gateway: String,
    /// The namespace's own address.
    pub addr: String,
    /// The namespace's interface on the link (e.g. for `GLOO_SOCKET_IFNAME`).
    pub iface: String,
    /// Its subnet, released after the namespace is gone (a [`Lan`] host's
    /// is the segment's).
    _subnet: Option<Subnet>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    /// Creates a namespace on a subnet of its own, leased for its lifetime
    /// (see [`lease`]): names and addresses never collide with another
    /// test's, in this run or a concurrent one.
    pub fn create() -> Self {
        let subnet = Subnet::lease();
        let net = subnet.net();
        let name = format!("accel{}-n{net}", std::process::id());
        // Link names are unique machine-wide with the subnet (at most 15 bytes).
        let host_if = format!("acn{net}h");
        let peer_if = format!("acn{net}n");
        let gateway = format!("10.{net}.0.1");
        let addr = format!("10.{net}.0.2");
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if,
        ]);
        ip(&["link", "set", &peer_if, "netns", &name]);
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "netns",
            "exec",
            &name,
            "ip",
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            &peer_if,
        ]);
        ip(&["netns", "exec", &name, "ip", "link", "set", &peer_if, "up"]);
        ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        Self {
            name,
            host_if,
            link_ns: None,
            gateway,
            addr,
            iface: peer_if,
            _subnet: Some(subnet),
        }
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn exec(&self) -> Vec<&str> {
        vec!["ip", "netns", "exec", &self.name]
    }

    /// `ip ARGS` where the far end of the link is.
    fn ip_at_link(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        if let Some(ns) = &self.link_ns {
            c.args(["-n", ns]);
        }
        c.args(args);
        c
    }

    /// Loads nftables `script` (`nft -f -`) in this namespace: a firewall
    /// of the host's own, for a partition finer than [`Netns::cut`].
    pub fn nft(&self, script: &str) {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("run nft (the test command installs nftables)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("nft script");
        assert!(child.wait().expect("nft").success(), "nft: {script}");
    }

    /// Cuts the link: packets stop, no connection is reset.
    pub fn cut(&self) {
        let out = self
            .ip_at_link(&["link", "set", &self.host_if, "down"])
            .output()
            .expect("run ip (iproute2)");
        assert!(
            out.status.success(),
            "cutting {}: {}",
            self.host_if,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.ip_at_link(&["link", "del", &self.host_if]).output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// One network segment: hosts (network namespaces) whose links meet at a
/// bridge in a namespace of its own, which this namespace joins at
/// `10.N.0.1` (`N` from a leased [`Subnet`]); host `i` is `10.N.0.<i>`. The
/// hosts reach each other directly, as machines on one switch do, so
/// nothing in this namespace has to forward their traffic (no setting of
/// this machine changes, and its firewall never sees it). Needs root;
/// removed on drop.
#[derive(Debug)]
pub struct Lan {
    net: u8,
    /// The namespace holding the bridge.
    switch: String,
    /// This namespace's interface on the segment.
    uplink: String,
    /// This namespace's address on the segment.
    pub gateway: String,
    /// Its subnet, released after the segment is gone.
    _subnet: Subnet,
}

/// The bridge's name inside a [`Lan`]'s switch namespace.
const BRIDGE: &str = "br0";

impl Lan {
    /// Creates a segment on a leased subnet, with this namespace on it.
    pub fn create() -> Self {
        Self::create_on(Subnet::lease())
    }

    /// Creates the segment `10.N.0.0/24` of `subnet`, with this namespace on it.
    pub fn create_on(subnet: Subnet) -> Self {
        let pid = std::process::id();
        let net = subnet.net();
        let switch = format!("accel{pid}-lan{net}");
        let uplink = format!("acn{net}l");
        let gateway = format!("10.{net}.0.1");
        let _ = Command::new("ip").args(["netns", "del", &switch]).output();
        ip(&["netns", "add", &switch]);
        let lan = Self {
            net,
            switch,
            uplink,
            gateway,
            _subnet: subnet,
        };
        let sw = lan.switch.as_str();
        ip(&["-n", sw, "link", "add", BRIDGE, "type", "bridge"]);
        ip(&["-n", sw, "link", "set", BRIDGE, "up"]);
        ip(&[
            "link",
            "add",
            &lan.uplink,
            "type",
            "veth",
            "peer",
            "name",
            "up0",
            "netns",
            sw,
        ]);
        ip(&["-n", sw, "link", "set", "up0", "master", BRIDGE, "up"]);
        ip(&[
            "addr",
            "add",
            &format!("{}/24", lan.gateway),
            "dev",
            &lan.uplink,
        ]);
        ip(&["link", "set", &lan.uplink, "up"]);
        lan
    }

    /// Creates host `index` (2–254) on the segment: a namespace at
    /// `10.N.0.<index>` whose interface is `lan0`.
    pub fn host(&self, index: u8) -> Netns {
        assert!(
            (2..=254).contains(&index),
            "host index {index} is not 2-254"
        );
        let name = format!("accel{}-{}h{index}", std::process::id(), self.net);
        let port = format!("p{index}");
        let addr = format!("10.{}.0.{index}", self.net);
        let iface = "lan0".to_owned();
        let sw = self.switch.as_str();
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let host = Netns {
            name,
            host_if: port,
            link_ns: Some(self.switch.clone()),
            gateway: self.gateway.clone(),
            addr,
            iface,
            _subnet: None,
        };
        let (ns, port, iface) = (&host.name, &host.host_if, &host.iface);
        ip(&[
            "-n", sw, "link", "add", port, "type", "veth", "peer", "name", iface, "netns", ns,
        ]);
        ip(&["-n", sw, "link", "set", port, "master", BRIDGE, "up"]);
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/24", host.addr),
            "dev",
            iface,
        ]);
        ip(&["-n", ns, "link", "set", iface, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        host
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.uplink])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.switch])
            .output();
    }
}

/// An `accel-agent` command line said the way a test means it: flags in the
/// order they are set, every [`conf`](Self::conf) in one `--rdzv-conf`, then
/// `--no-python` (if asked), the program and its arguments, always last.
#[derive(Debug, Clone, Default)]
pub struct AgentCmd {
    /// Flags and their values, in the order they were set.
    flags: Vec<String>,
    /// Where in `flags` the `--rdzv-conf` goes: where the first `conf` was.
    conf_at: Option<usize>,
    /// The `--rdzv-conf` entries, in the order given.
    conf: Vec<String>,
    /// Whether `--no-python` precedes the program.
    no_python: bool,
    /// The program and its arguments.
    program: Vec<String>,
    /// Variables added to the agent's environment, in order.
    env: Vec<(String, String)>,
}

/// A path as the `&str` an argv entry is.
fn path_arg(path: &Path) -> &str {
    path.to_str().expect("path")
}

impl AgentCmd {
    /// No flags at all: one node, the default (static) rendezvous.
    pub fn new() -> Self {
        Self::default()
    }

    /// `--standalone`: one node with an embedded rendezvous on a free port.
    pub fn standalone() -> Self {
        Self::new().arg("--standalone")
    }

    /// Node `node_rank` of a static job: `--node-rank R --master-port P`.
    pub fn static_node(master_port: impl Display, node_rank: impl Display) -> Self {
        Self::new()
            .flag("--node-rank", node_rank)
            .flag("--master-port", master_port)
    }

    /// A loopback node of c10d job `job` at `endpoint` (`--local-addr 127.0.0.1`).
    pub fn c10d(endpoint: &str, job: &str) -> Self {
        Self::c10d_no_local_addr(endpoint, job).local_addr("127.0.0.1")
    }

    /// A node of c10d job `job` at `endpoint` that finds its own address (no `--local-addr`).
    pub fn c10d_no_local_addr(endpoint: &str, job: &str) -> Self {
        Self::new()
            .flag("--rdzv-backend", "c10d")
            .flag("--rdzv-endpoint", endpoint)
            .flag("--rdzv-id", job)
    }

    /// A loopback node of job `job` whose agents host the rendezvous
    /// themselves on etcd at `endpoint` (`--rdzv-backend etcd`).
    pub fn etcd(endpoint: &str, job: &str) -> Self {
        Self::new()
            .flag("--rdzv-backend", "etcd")
            .flag("--rdzv-endpoint", endpoint)
            .flag("--rdzv-id", job)
            .local_addr("127.0.0.1")
    }

    /// `--nnodes N` (or `MIN:MAX`).
    pub fn nnodes(self, n: impl Display) -> Self {
        self.flag("--nnodes", n)
    }

    /// `--nproc-per-node N`.
    pub fn nproc(self, n: impl Display) -> Self {
        self.flag("--nproc-per-node", n)
    }

    /// `--max-restarts N`.
    pub fn max_restarts(self, n: impl Display) -> Self {
        self.flag("--max-restarts", n)
    }

    /// `--local-addr ADDR`, in place of one already set.
    pub fn local_addr(mut self, addr: impl Display) -> Self {
        match self.flags.iter().position(|f| f == "--local-addr") {
            Some(i) => {
                self.flags[i + 1] = addr.to_string();
                self
            }
            None => self.flag("--local-addr", addr),
        }
    }

    /// `--rdzv-backend NAME`, in place of one already set.
    pub fn backend(mut self, name: &str) -> Self {
        match self.flags.iter().position(|f| f == "--rdzv-backend") {
            Some(i) => {
                self.flags[i + 1] = name.to_owned();
                self
            }
            None => self.flag("--rdzv-backend", name),
        }
    }

    /// `--master-addr ADDR`.
    pub fn master_addr(self, addr: impl Display) -> Self {
        self.flag("--master-addr", addr)
    }

    /// `--log-dir DIR`.
    pub fn log_dir(self, dir: &Path) -> Self {
        self.flag("--log-dir", path_arg(dir))
    }

    /// `--tee SPEC`.
    pub fn tee(self, spec: impl Display) -> Self {
        self.flag("--tee", spec)
    }

    /// `--redirects SPEC`.
    pub fn redirects(self, spec: impl Display) -> Self {
        self.flag("--redirects", spec)
    }

    /// Adds `key=value` to the one `--rdzv-conf`, after the entries added before.
    pub fn conf(mut self, entry: impl Display) -> Self {
        let at = self.flags.len();
        self.conf_at.get_or_insert(at);
        self.conf.push(entry.to_string());
        self
    }

    /// `NAME VALUE`, for a flag without a setter of its own.
    pub fn flag(mut self, name: &str, value: impl Display) -> Self {
        self.flags.push(name.to_owned());
        self.flags.push(value.to_string());
        self
    }

    /// A lone `ARG` (a switch), for one without a setter of its own.
    pub fn arg(mut self, arg: &str) -> Self {
        self.flags.push(arg.to_owned());
        self
    }

    /// Flags given as a raw list, as they are.
    pub fn flags(mut self, flags: &[&str]) -> Self {
        self.flags.extend(flags.iter().map(|f| (*f).to_owned()));
        self
    }

    /// The Python script to run, without arguments.
    pub fn script(self, path: impl AsRef<Path>) -> Self {
        self.program(path, &[])
    }

    /// The program (a script, or an executable with `--no-python`) and its arguments.
    pub fn program(mut self, program: impl AsRef<Path>, args: &[&str]) -> Self {
        self.program = std::iter::once(path_arg(program.as_ref()))
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect();
        self
    }

    /// `--no-python PROGRAM ARGS`: the program runs directly, not through Python.
    pub fn no_python(mut self, program: impl AsRef<Path>, args: &[&str]) -> Self {
        self.no_python = true;
        self.program(program, args)
    }

    /// Adds `KEY=VALUE` to the agent's environment.
    pub fn env(mut self, key: &str, value: impl Display) -> Self {
        self.env.push((key.to_owned(), value.to_string()));
        self
    }

    /// Adds every `(KEY, VALUE)` of `env` to the agent's environment.
    pub fn envs(mut self, env: &[(&str, &str)]) -> Self {
        self.env
            .extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        self
    }

    /// The recording worker's environment: records into `dir` (`RECORD_DIR`), tagged `tag` (`AGENT_TAG`).
    pub fn record_env(self, dir: &Path, tag: &str) -> Self {
        self.env("RECORD_DIR", dir.to_string_lossy())
            .env("AGENT_TAG", tag)
    }

    /// Runs the recording worker (`workers/record.py`) with [`record_env`](Self::record_env).
    pub fn recording(self, dir: &Path, tag: &str) -> Self {
        self.record_env(dir, tag).script(record_script())
    }

    /// The arguments after `accel-agent`.
    pub fn args(&self) -> Vec<String> {
        let mut args = self.flags.clone();
        if let Some(at) = self.conf_at {
            args.splice(at..at, ["--rdzv-conf".to_owned(), self.conf.join(",")]);
        }
        if self.no_python {
            args.push("--no-python".to_owned());
        }
        args.extend(self.program.iter().cloned());
        args
    }

    /// `accel-agent ARGS` with the environment added (no `ACCEL_LOG`), for a caller that runs it.
    pub fn command(&self) -> Command {
        self.command_with(&[])
    }

    /// `PREFIX... accel-agent ARGS` with the environment added, as [`command`](Self::command).
    pub fn command_with(&self, prefix: &[&str]) -> Command {
        let mut cmd = agent_command(prefix);
        cmd.args(self.args())
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Starts it as [`Agent::start`] does, output under `dir/<name>.*`.
    pub fn start(&self, dir: &Path, name: &str) -> Agent {
        self.start_with(&[], dir, name)
    }

    /// Starts `PREFIX... accel-agent ARGS` as [`Agent::start_with`] does.
    pub fn start_with(&self, prefix: &[&str], dir: &Path, name: &str) -> Agent {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Agent::start_with(prefix, dir, name, &args, &env)
    }

    /// Runs it to completion, failing the test after `limit`.
    pub fn run(&self, dir: &Path, name: &str, limit: Duration) -> Finished {
        self.start(dir, name).wait(limit)
    }
}

/// Starts a c10d agent of `job` at `endpoint` running the recording worker
/// (`workers/record.py`, records into `dir`), tagged `tag` (`AGENT_TAG`),
/// with `flags` (`--nnodes`, `--rdzv-conf`, …) and `env` added.
pub fn start_recording_c10d(
    endpoint: &str,
    job: &str,
    dir: &Path,
    tag: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Agent {
    AgentCmd::c10d(endpoint, job)
        .flags(flags)
        .recording(dir, tag)
        .envs(env)
        .start(dir, tag)
}

/// Runs `accel-agent ARGS` to completion.
pub fn run_agent(
    dir: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Finished {
    Agent::start(dir, name, args, env).wait(limit)
}

fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Sends a signal with `kill(1)`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -{sig} {pid} failed");
}

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Every process descending from `pid` (its children, theirs, and so on),
/// from the parent pids in `/proc` now. A process whose parent has died has
/// been handed to init and is no longer found: look before killing.
pub fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            // After the name: state, then the parent's pid.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            Some((p, ppid.parse().ok()?))
        })
        .collect();
    let mut found = vec![pid];
    let mut next = 0;
    while let Some(&parent) = found.get(next) {
        for &(p, _) in parents.iter().filter(|(_, pp)| *pp == parent) {
            if !found.contains(&p) {
                found.push(p);
            }
        }
        next += 1;
    }
    found.split_off(1)
}

/// Kills `pid`, its process group and every process descending from it,
/// with the groups those lead, by SIGKILL: a descendant that started its
/// own session (torchrun's workers do) is out of `pid`'s group. The tree is
/// stopped first, until a look finds no process in it not yet stopped, so
/// that none forks a process that escapes, or dies and leaves its children
/// to init, before it is found.
pub fn kill_tree(pid: u32) {
    assert!(pid > 1, "not a process to kill with its tree: {pid}");
    let signal = |p: u32, sig| {
        // SAFETY: kill takes plain integers and touches no memory.
        unsafe { libc::kill(p as libc::pid_t, sig) };
    };
    signal(pid, libc::SIGSTOP);
    let mut tree = vec![pid];
    loop {
        let new: Vec<u32> = descendants(pid)
            .into_iter()
            .filter(|p| !tree.contains(p))
            .collect();
        if new.is_empty() {
            break;
        }
        for p in new {
            signal(p, libc::SIGSTOP);
            tree.push(p);
        }
    }
    for p in tree {
        // SAFETY: getpgid and killpg take plain integers and touch no memory.
        unsafe {
            if libc::getpgid(p as libc::pid_t) == p as libc::pid_t {
                libc::killpg(p as libc::pid_t, libc::SIGKILL);
            }
        }
        signal(p, libc::SIGKILL);
    }
}

/// Polls until `f` holds or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// One worker's record (see `workers/record.py`).
#[derive(Debug, Clone)]
pub struct Record {
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// Its arguments after the script.
    pub argv: Vec<String>,
    /// Its pid.
    pub pid: u32,
    /// Its process group.
    pub pgid: u32,
    /// Pids of processes it started.
    pub children: Vec<u32>,
    /// Whether Python ran unbuffered (`-u`).
    pub unbuffered: bool,
    /// Start time (seconds since the epoch).
    pub start: f64,
    /// Signal it received, if any.
    pub signal: Option<i64>,
    /// When it finished its work normally (absent if it was stopped first).
    pub end: Option<f64>,
    /// Restart count of its attempt.
    pub restart: u32,
    /// Its global rank.
    pub rank: u32,
}

impl Record {
    /// An environment variable the worker saw.
    pub fn var(&self, k: &str) -> &str {
        self.env
            .get(k)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("worker rank {} lacks {k}", self.rank))
    }
}

/// Every record in `dir`, sorted by (restart, rank).
pub fn records(dir: &Path) -> Vec<Record> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("record dir") {
        let path = entry.expect("entry").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.ends_with(".json") {
            continue;
        }
        let mut parts = name.trim_end_matches(".json").split('_');
        let (restart, rank) = (parts.next().expect("restart"), parts.next().expect("rank"));
        let text = fs::read_to_string(&path).expect("record");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad record {name}: {e}"));
        let u32_of = |v: &Value| v.as_u64().map(|n| n as u32);
        out.push(Record {
            env: serde_json::from_value(v["env"].clone()).expect("env map"),
            argv: serde_json::from_value(v["argv"].clone()).expect("argv list"),
            pid: u32_of(&v["pid"]).expect("pid"),
            pgid: u32_of(&v["pgid"]).expect("pgid"),
            children: v["children"]
                .as_array()
                .map(|c| c.iter().filter_map(u32_of).collect())
                .unwrap_or_default(),
            unbuffered: v["unbuffered"] == Value::Bool(true),
            start: v["start"].as_f64().expect("start"),
            signal: v["signal"].as_i64(),
            end: v["end"].as_f64(),
            restart: restart.parse().expect("restart"),
            rank: rank.parse().expect("rank"),
        });
    }
    out.sort_by_key(|r| (r.restart, r.rank));
    out
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn a_tree_is_killed_with_the_sessions_it_started() {
        use std::os::unix::process::CommandExt as _;
        // A process in its own group whose child starts a session of its
        // own with children of its own, as torchrun does with its workers.
        let mut root = Command::new("sh")
            .args([
                "-c",
                "setsid sh -c 'sleep 300 & sleep 300' & exec sleep 300",
            ])
            .process_group(0)
            .spawn()
            .expect("sh");
        let mut tree = Vec::new();
        assert!(
            eventually(Duration::from_secs(20), || {
                tree = descendants(root.id());
                tree.len() == 3
            }),
            "the tree started: {tree:?}"
        );
        kill_tree(root.id());
        root.wait().expect("wait");
        assert!(
            eventually(Duration::from_secs(10), || !tree.iter().any(|&p| alive(p))),
            "every descendant died: {:?}",
            tree.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn socket_queues_are_read_from_the_kernel_tables() {
        for ip in ["127.0.0.1", "::1"] {
            let Ok(listener) = TcpListener::bind((ip, 0)) else {
                continue; // no IPv6 here
            };
            let addr = listener.local_addr().expect("addr");
            let mut client = TcpStream::connect(addr).expect("connect");
            assert_eq!(accept_queue(&addr.to_string()), Some(1), "{ip}");
            let (mut served, _) = listener.accept().expect("accept");
            assert_eq!(accept_queue(&addr.to_string()), Some(0), "{ip}");
            client.write_all(&[7; 1000]).expect("write");
            poll_until(
                "the bytes arrive",
                Duration::from_secs(5),
                || match unread_by_peer(&[&client]) {
                    1000 => Ok(()),
                    n => Err(n.to_string()),
                },
            );
            let mut buf = [0u8; 1000];
            served.read_exact(&mut buf).expect("read");
            assert_eq!(unread_by_peer(&[&client]), 0, "{ip}");
            served.write_all(&[1; 10]).expect("reply");
            poll_until(
                "the reply arrives",
                Duration::from_secs(5),
                || match received_unread(&client) {
                    10 => Ok(()),
                    n => Err(n.to_string()),
                },
            );
            assert!(!closed_by_peer(&client), "{ip}");
            drop(served);
            poll_until(
                "the close is seen",
                Duration::from_secs(5),
                || match closed_by_peer(&client) {
                    true => Ok(()),
                    false => Err("established".into()),
                },
            );
        }
    }
}
