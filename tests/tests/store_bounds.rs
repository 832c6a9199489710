//! The worker store under abuse, as an attacker on the network would try it:
//! replies that are never read, WAIT floods, half frames, many connections
//! each holding most of a maximal request, a large request trickled in, too
//! many connections. Each test runs the real agent and measures what
//! matters: its resident memory and CPU time from /proc, whether connections
//! are closed, what it logs. (Who may connect, and on which port:
//! `store_admission`.)

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use accel_tests::{
    closed_by_peer, ensure_quiet_for, eventually, poll_until, received_unread, scratch,
    unread_by_peer, Agent, AgentCmd,
};
use accel_worker_store::wire::{
    encode, Command as Cmd, MAX_KEY_LEN, MAX_REQUEST_LEN, MAX_VALUE_LEN, VALIDATION_MAGIC,
};

pub(crate) const LIMIT: Duration = Duration::from_secs(90);

/// The agent's resident set size in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}

/// A standalone agent whose one worker (`sh`) records `MASTER_ADDR MASTER_PORT`
/// and sleeps; `prefix` is a shell prefix run before the agent (e.g. `ulimit`).
struct StoreHost {
    agent: Agent,
    store: SocketAddr,
}

impl StoreHost {
    fn start(dir: &Path, prefix: &str) -> Self {
        let master = dir.join("master");
        let shell = format!("{prefix} exec \"$0\" \"$@\"");
        let agent = AgentCmd::new()
            .no_python(
                "sh",
                &[
                    "-c",
                    "echo \"$MASTER_ADDR:$MASTER_PORT\" > \"$MASTER_FILE\"; exec sleep 300",
                ],
            )
            .env("MASTER_FILE", master.to_str().expect("path"))
            .start_with(&["sh", "-c", &shell], dir, "agent");
        assert!(
            eventually(Duration::from_secs(20), || fs::read_to_string(&master)
                .is_ok_and(|s| s.ends_with('\n'))),
            "the worker started"
        );
        let text = fs::read_to_string(&master).expect("master");
        let store = text.trim().parse().expect("MASTER_ADDR:MASTER_PORT");
        // The agent is `sh`'s exec'd image: the pid is the agent's.
        Self { agent, store }
    }

    fn rss(&self) -> f64 {
        rss_mib(self.agent.pid())
    }

    /// The agent's CPU time (user + system) in seconds.
    fn cpu(&self) -> f64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.agent.pid())).expect("stat");
        let after_name = stat.rsplit_once(')').expect("stat format").1;
        let f: Vec<&str> = after_name.split_whitespace().collect();
        let ticks: f64 =
            f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
        // SAFETY: sysconf only reads a constant.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    fn stop(self) -> String {
        self.agent.signal("TERM");
        self.agent.wait(LIMIT).stderr
    }
}

/// A validated client.
pub(crate) fn client(addr: SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(addr).expect("connect");
    c.write_all(&encode(&Cmd::Validate(VALIDATION_MAGIC)))
        .expect("validate");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c
}

fn key(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// Whether the server answers a PING on `c`.
pub(crate) fn answers(c: &mut TcpStream) -> bool {
    if c.write_all(&encode(&Cmd::Ping(77))).is_err() {
        return false;
    }
    let mut b = [0u8; 4];
    c.read_exact(&mut b).is_ok() && b == 77u32.to_le_bytes()
}

/// How reading a connection until it ends went.
enum Ending {
    /// End of file: the server closed it (everything it was sent was read).
    Eof,
    /// A reset: the server closed it with bytes of ours unread.
    Reset,
    /// The read timeout set on `c` passed first: still open.
    StillOpen(std::io::ErrorKind),
    /// Any other error: not how a close by the server reads.
    Failed(std::io::Error),
}

impl Ending {
    fn closed(&self) -> bool {
        matches!(self, Self::Eof | Self::Reset)
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Eof => write!(f, "end of file"),
            Self::Reset => write!(f, "reset"),
            Self::StillOpen(kind) => write!(f, "still open at the read timeout ({kind:?})"),
            Self::Failed(e) => write!(f, "read failed: {e} ({:?})", e.kind()),
        }
    }
}

/// Reads `c` until it ends, or its read timeout passes. A read is tried
/// again when it was interrupted: with a timeout set, the kernel does not
/// restart it after a signal or a stop and continue of this process, and
/// fails it with EINTR (the whole suite saw such failures at 22 and 27 s).
fn ending(c: &mut TcpStream) -> Ending {
    use std::io::ErrorKind;
    let mut b = [0u8; 4096];
    loop {
        match c.read(&mut b) {
            Ok(0) => return Ending::Eof,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ending::Reset,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ending::StillOpen(e.kind())
            }
            Err(e) => return Ending::Failed(e),
        }
    }
}

fn value_len(c: &mut TcpStream, k: &str) -> u64 {
    c.write_all(&encode(&Cmd::Get(key(k)))).expect("get");
    let mut len = [0u8; 8];
    c.read_exact(&mut len).expect("length");
    let n = u64::from_le_bytes(len);
    std::io::copy(&mut c.take(n), &mut std::io::sink()).expect("value");
    n
}

#[test]
fn replies_that_are_never_read_do_not_grow_the_agent() {
    let dir = scratch("store-unread");
    let host = StoreHost::start(&dir, "");
    let mut w = client(host.store);
    w.write_all(&encode(&Cmd::Set(
        key("/big"),
        vec![b'v'; MAX_VALUE_LEN as usize],
    )))
    .expect("set");
    assert!(answers(&mut w));
    let before = host.rss();
    // 4 connections × 16 GETs of the 8 MiB value, and one MULTI_GET naming it
    // 16 times: 640 MiB of replies that nobody reads.
    let mut readers: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut c = client(host.store);
            let gets: Vec<u8> = (0..16)
                .flat_map(|_| encode(&Cmd::Get(key("/big"))))
                .collect();
            c.write_all(&gets).expect("gets");
            c
        })
        .collect();
    let mut multi = client(host.store);
    multi
        .write_all(&encode(&Cmd::MultiGet(vec![key("/big"); 16])))
        .expect("multi_get");
    // Measured once the store is stuck: every connection has replies
    // queued here, and neither they nor the requests it has left unread
    // move between two looks (the queues are full; it can send no more).
    let conns: Vec<&TcpStream> = readers.iter().chain([&multi]).collect();
    let mut last = None;
    poll_until("the store's replies stalled", LIMIT, || {
        let now = (
            unread_by_peer(&conns),
            conns
                .iter()
                .map(|c| received_unread(c))
                .collect::<Vec<u64>>(),
        );
        let stalled = now.1.iter().all(|q| *q > 0) && last.as_ref() == Some(&now);
        let seen = format!("unread by the store, replies queued here: {now:?}");
        last = Some(now);
        match stalled {
            true => Ok(()),
            false => Err(seen),
        }
    });
    let during = host.rss();
    // APPEND cannot grow a value past the limit a SET has (it used to reach 104 MiB).
    let mut a = client(host.store);
    a.write_all(&encode(&Cmd::Append(key("/big"), vec![b'w'; 1 << 20])))
        .expect("append");
    let end = ending(&mut a);
    assert!(
        end.closed(),
        "APPEND past 8 MiB closes the connection: {end}"
    );
    assert_eq!(
        value_len(&mut w, "/big"),
        MAX_VALUE_LEN,
        "the value is unchanged"
    );
    assert!(answers(&mut w), "other clients are served meanwhile");
    eprintln!("agent RSS: {before:.1} MiB before, {during:.1} MiB with 640 MiB of unread replies");
    assert!(
        during - before < 48.0,
        "unread replies are bounded: {before:.1} → {during:.1} MiB"
    );
    // Readers that start reading get every reply.
    let r = &mut readers[0];
    let mut got = 0;
    for _ in 0..16 {
        let mut len = [0u8; 8];
        r.read_exact(&mut len).expect("length");
        got += std::io::copy(&mut r.take(u64::from_le_bytes(len)), &mut std::io::sink())
            .expect("value");
    }
    assert_eq!(got, 16 * MAX_VALUE_LEN);
    drop((readers, multi));
    host.stop();
}

#[test]
fn wait_floods_and_parked_senders_are_bounded() {
    let dir = scratch("store-wait");
    let host = StoreHost::start(&dir, "");
    let keys: Vec<Vec<u8>> = (0..20_000)
        .map(|i| key(&format!("/flood/{i:08}")))
        .collect();
    let wait = encode(&Cmd::Wait(keys));
    let mut probe = client(host.store);
    let before = host.rss();
    // 20 abandoned WAITs on 20,000 keys (each used to leak about 20 MB).
    for _ in 0..20 {
        let mut c = client(host.store);
        c.write_all(&wait).expect("wait");
        // Abandoned only once the store has read the whole WAIT.
        poll_until("the store read the WAIT", LIMIT, || {
            match unread_by_peer(&[&c]) {
                0 => Ok(()),
                n => Err(format!("{n} bytes unread")),
            }
        });
    }
    // A parked client that keeps sending is closed past one maximal request.
    let mut parked = client(host.store);
    parked
        .write_all(&encode(&Cmd::Wait(vec![key("/never")])))
        .expect("wait");
    let pings: Vec<u8> = (0..(1 << 20)).flat_map(|_| encode(&Cmd::Ping(1))).collect();
    let mut sent = 0usize;
    for _ in 0..20 {
        match parked.write_all(&pings) {
            Ok(()) => sent += pings.len(),
            Err(_) => break,
        }
    }
    let end = ending(&mut parked);
    assert!(
        end.closed(),
        "closed after {sent} bytes sent while parked: {end}"
    );
    assert!(answers(&mut probe));
    let after = host.rss();
    eprintln!("agent RSS: {before:.1} MiB before, {after:.1} MiB after 20 abandoned WAITs on 20,000 keys and {sent} bytes from a parked client");
    assert!(
        after - before < 48.0,
        "WAIT floods leave nothing behind: {before:.1} → {after:.1} MiB"
    );
    host.stop();
}

#[test]
fn half_frames_and_silent_connections_are_closed() {
    let dir = scratch("store-half");
    let host = StoreHost::start(&dir, "");
    let before = host.rss();
    // 50 clients announce an 8 MiB value, send 1 MiB of it and go quiet;
    // 50 more connect and never send VALIDATE.
    let mut set = encode(&Cmd::Set(key("/half"), vec![b'h'; MAX_VALUE_LEN as usize]));
    set.truncate(1 << 20);
    let t0 = Instant::now();
    let mut halves: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut c = client(host.store);
            c.write_all(&set).expect("half");
            c
        })
        .collect();
    let mut silent: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(host.store).expect("connect"))
        .collect();
    let mut idle = client(host.store);
    // Measured once the store holds every half frame it was sent.
    let conns: Vec<&TcpStream> = halves.iter().collect();
    poll_until(
        "the store read the half frames",
        LIMIT,
        || match unread_by_peer(&conns) {
            0 => Ok(()),
            n => Err(format!("{n} bytes unread")),
        },
    );
    let during = host.rss();
    let kinds = ["half frame"; 50].into_iter().chain(["silent"; 50]);
    for (i, (c, kind)) in halves
        .iter_mut()
        .chain(silent.iter_mut())
        .zip(kinds)
        .enumerate()
    {
        c.set_read_timeout(Some(Duration::from_secs(45)))
            .expect("timeout");
        let end = ending(c);
        if !end.closed() {
            // What the kernel and the agent say about it, for the failure.
            let established = !closed_by_peer(c);
            let log = fs::read_to_string(&host.agent.stderr).unwrap_or_default();
            let said: Vec<&str> = log.lines().filter(|l| l.contains("worker store")).collect();
            panic!(
                "connection {i} ({kind}) not closed by the server: {end} at {:?} \
                 (still established in the kernel: {established}); the agent said: {said:#?}",
                t0.elapsed()
            );
        }
    }
    let closed_after = t0.elapsed();
    assert!(
        closed_after >= Duration::from_secs(29) && closed_after < Duration::from_secs(40),
        "the 30 s bounds apply: {closed_after:?}"
    );
    assert!(
        answers(&mut idle),
        "an idle client with nothing pending stays"
    );
    let after = host.rss();
    eprintln!("agent RSS: {before:.1} MiB before, {during:.1} MiB holding 50 half frames of 1 MiB, {after:.1} MiB after they were closed at {closed_after:?}");
    assert!(
        during - before < 50.0 + 32.0,
        "{before:.1} → {during:.1} MiB"
    );
    assert!(after - before < 16.0, "{before:.1} → {after:.1} MiB");
    host.stop();
}

#[test]
fn failing_accepts_back_off_and_are_logged_once() {
    let dir = scratch("store-emfile");
    let host = StoreHost::start(&dir, "ulimit -Sn 64 && ulimit -Hn 64 &&");
    // More connections than the agent has descriptors: accepts fail with
    // EMFILE (the rest wait in the listen backlog) for 3 s, then they close.
    let held: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect_timeout(&host.store, Duration::from_secs(1)).ok())
        .collect();
    // The episode has begun when the store says so; it then lasts three
    // seconds of failing accepts, over which it must say nothing more
    // (nothing marks "it would have logged again by now").
    let stderr = host.agent.stderr.clone();
    let read = || fs::read_to_string(&stderr).unwrap_or_default();
    poll_until("the store reports failing accepts", LIMIT, || {
        match read().contains("cannot accept connections") {
            true => Ok(()),
            false => Err(read()),
        }
    });
    ensure_quiet_for(
        "one line per episode",
        Duration::from_secs(3),
        || match read().matches("cannot accept connections").count() {
            1 => Ok(()),
            n => Err(format!("{n} lines:\n{}", read())),
        },
    );
    let opened = held.len();
    drop(held);
    let mut back = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            let mut c = client(host.store);
            let ok = answers(&mut c);
            back = Some(c);
            ok
        }),
        "the store serves again once descriptors are free"
    );
    // The episode is over once accepts have not failed for a while: the
    // store says so at the first accept after that (no other sign of it),
    // so new clients are served until it does.
    poll_until("the store reports the episode over", LIMIT, || {
        if !answers(&mut client(host.store)) {
            return Err("a new client is not answered".into());
        }
        match read().contains("accepts connections again") {
            true => Ok(()),
            false => Err(read()),
        }
    });
    drop(back);
    let stderr = host.stop();
    let failing = stderr.matches("cannot accept connections").count();
    assert_eq!(
        failing, 1,
        "one line per episode ({opened} connections held):\n{stderr}"
    );
    assert_eq!(
        stderr.matches("accepts connections again").count(),
        1,
        "{stderr}"
    );
}

/// Whether a SET and a GET of a small value are answered on `c`.
pub(crate) fn set_get_works(c: &mut TcpStream, k: &str) -> bool {
    let v = b"answered".to_vec();
    if c.write_all(&encode(&Cmd::Set(key(k), v.clone()))).is_err() {
        return false;
    }
    if c.write_all(&encode(&Cmd::Get(key(k)))).is_err() {
        return false;
    }
    let mut len = [0u8; 8];
    if c.read_exact(&mut len).is_err() || u64::from_le_bytes(len) != v.len() as u64 {
        return false;
    }
    let mut got = vec![0; v.len()];
    c.read_exact(&mut got).is_ok() && got == v
}

#[test]
fn incomplete_maximal_requests_share_one_budget_and_a_client_is_still_served() {
    let dir = scratch("store-budget");
    let host = StoreHost::start(&dir, "");
    let mut legit = client(host.store);
    assert!(set_get_works(&mut legit, "/before"));
    let before = host.rss();
    // 64 connections, each sending a maximal COMPARE_SET but its last byte
    // (1 GiB in all, 32 MiB used to stay resident per connection).
    let mut cas = encode(&Cmd::CompareSet {
        key: vec![b'k'; MAX_KEY_LEN as usize],
        expected: vec![b'e'; MAX_VALUE_LEN as usize],
        desired: vec![b'd'; MAX_VALUE_LEN as usize],
    });
    assert_eq!(cas.len() as u64, MAX_REQUEST_LEN);
    cas.pop();
    let cas = std::sync::Arc::new(cas);
    let senders: Vec<_> = (0..64)
        .map(|_| {
            let cas = cas.clone();
            let addr = host.store;
            std::thread::spawn(move || {
                let mut c = client(addr);
                let sent = c.write_all(&cas).is_ok();
                (c, sent)
            })
        })
        .collect();
    // The peak, sampled every 5 ms while they send.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, pid) = (stop.clone(), host.agent.pid());
        std::thread::spawn(move || {
            let mut peak = 0f64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = rss_mib(pid);
                peak = peak.max(r);
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let mut held = Vec::new();
    for s in senders {
        held.push(s.join().expect("sender"));
    }
    // Measured (and the peak sampling ends) once the store has closed the
    // requests beyond its budget: at most 8 are still open.
    poll_until(
        "the store closed the requests beyond its budget",
        LIMIT,
        || {
            let open = held.iter().filter(|(c, _)| !closed_by_peer(c)).count();
            match open <= 8 {
                true => Ok(()),
                false => Err(format!("{open} of 64 open")),
            }
        },
    );
    let during = host.rss();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().expect("sampler").max(during);
    assert!(
        set_get_works(&mut legit, "/during"),
        "a legitimate client is answered meanwhile"
    );
    let mut fresh = client(host.store);
    assert!(set_get_works(&mut fresh, "/fresh"), "and a new one too");
    // The budget (64 MiB) holds four whole ones; the others were closed.
    let mut closed = 0;
    for (c, _) in held.iter_mut() {
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let mut b = [0u8; 1];
        match c.read(&mut b) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            _ => {} // still held: no answer to an incomplete request
        }
    }
    let gone: Vec<(SocketAddr, SocketAddr)> = held
        .iter()
        .filter_map(|(c, _)| Some((c.peer_addr().ok()?, c.local_addr().ok()?)))
        .collect();
    drop(held);
    // Measured once the store has closed its side of every one of them.
    poll_until("the store closed the dropped connections", LIMIT, || {
        let open = accel_tests::tcp_sockets()
            .iter()
            // Established or close-wait: the store still holds it.
            .filter(|s| gone.contains(&(s.local, s.remote)) && matches!(s.state, 1 | 8))
            .count();
        match open {
            0 => Ok(()),
            n => Err(format!("{n} still open at the store")),
        }
    });
    let after = host.rss();
    eprintln!("agent RSS: {before:.1} MiB before, {during:.1} MiB with 64 incomplete 16 MiB requests (peak seen {peak:.1} MiB), {after:.1} MiB after they closed; {closed} of 64 closed by the store");
    assert!(
        peak - before <= 128.0,
        "the agent grew by at most 128 MiB: {before:.1} → {peak:.1} MiB"
    );
    assert!(closed >= 56, "at most 8 held, {closed} of 64 closed");
    assert!(
        after - before <= 48.0,
        "the memory of closed requests is returned: {before:.1} → {after:.1} MiB"
    );
    assert!(set_get_works(&mut legit, "/after"));
    let stderr = host.stop();
    let lines = stderr.matches("worker store closed").count();
    assert!(
        stderr.contains("budget of 67108864 bytes"),
        "the reason is logged: {stderr}"
    );
    assert!(
        (1..=3).contains(&lines),
        "aggregated, not a line each: {stderr}"
    );
}

#[test]
fn a_trickled_check_costs_what_it_costs_sent_at_once() {
    let dir = scratch("store-trickle");
    let host = StoreHost::start(&dir, "");
    // A 1.2 MB CHECK: 66,000 keys (that no one has set: the answer is NOT_READY).
    let keys: Vec<Vec<u8>> = (0..66_000).map(|i| key(&format!("/k/{i:07}"))).collect();
    let check = encode(&Cmd::Check(keys));
    assert!(check.len() > 1_150_000, "{}", check.len());
    let answered = |c: &mut TcpStream| {
        let mut b = [0u8; 1];
        c.read_exact(&mut b).expect("CHECK answered");
        assert_eq!(b[0], 1, "NOT_READY");
    };
    let mut once = Vec::new();
    for _ in 0..2 {
        let mut c = client(host.store);
        assert!(answers(&mut c));
        let t0 = host.cpu();
        c.write_all(&check).expect("check");
        answered(&mut c);
        once.push(host.cpu() - t0);
    }
    // The same bytes in writes of 1 to 4 KiB, each sent on its own.
    let mut c = client(host.store);
    c.set_nodelay(true).expect("nodelay");
    assert!(answers(&mut c));
    let (t0, wall) = (host.cpu(), Instant::now());
    let (mut at, mut writes) = (0, 0);
    while at < check.len() {
        let n = (1024 + (writes * 1531) % 3072).min(check.len() - at);
        c.write_all(&check[at..at + n]).expect("trickle");
        at += n;
        writes += 1;
        std::thread::sleep(Duration::from_micros(300));
    }
    answered(&mut c);
    let trickled = host.cpu() - t0;
    let once = once.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "agent CPU for a {} byte CHECK: {once:.3} s sent at once, {trickled:.3} s in {writes} writes over {:?}",
        check.len(),
        wall.elapsed()
    );
    // A floor of 50 ms keeps clock-tick noise on small numbers from deciding.
    assert!(
        trickled <= 2.0 * once.max(0.05),
        "trickled: {trickled:.3} s of agent CPU, at once: {once:.3} s"
    );
    host.stop();
}

#[test]
fn one_address_is_cut_at_its_share_of_connections() {
    let dir = scratch("store-conn-limit");
    let host = StoreHost::start(&dir, "");
    // A one-worker job: 2,048 connections in all, 1,536 from one address
    // (this host is one address); the test's own connections are from here.
    let share = 1536;
    let mut held: Vec<TcpStream> = (0..share).map(|_| client(host.store)).collect();
    assert!(answers(&mut held[0]) && answers(&mut held[share - 1]));
    for _ in 0..3 {
        let mut over = client(host.store);
        assert!(!answers(&mut over), "a connection past the share is closed");
    }
    assert!(answers(&mut held[7]), "the ones held are still served");
    // A place freed is a place taken.
    held.truncate(share - 1);
    let mut again = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            let mut c = client(host.store);
            let ok = answers(&mut c);
            again = Some(c);
            ok
        }),
        "a closed connection frees its place"
    );
    drop((held, again));
    let stderr = host.stop();
    assert!(
        stderr.contains("holds its limit of 1536 worker store connections"),
        "{stderr}"
    );
    assert!(
        stderr.matches("over its limit").count() <= 2,
        "aggregated: {stderr}"
    );
}
