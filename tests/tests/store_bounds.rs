//! The worker store under abuse, as an attacker on the network would try it:
//! replies that are never read, WAIT floods, half frames, too many
//! connections. Each test runs the real agent and measures what matters: its
//! resident memory from /proc, whether connections are closed, what it logs.
//! (Who may connect, and on which port: `store_admission`.)

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use accel_agent::store::wire::{encode, Command as Cmd, MAX_VALUE_LEN, VALIDATION_MAGIC};
use accel_tests::{eventually, scratch, Agent, AgentCmd};

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

/// Whether the server closed `c` (reads end) within 10 s.
fn closed_by_server(c: &mut TcpStream) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match c.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
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
    std::thread::sleep(Duration::from_secs(1));
    let during = host.rss();
    // APPEND cannot grow a value past the limit a SET has (it used to reach 104 MiB).
    let mut a = client(host.store);
    a.write_all(&encode(&Cmd::Append(key("/big"), vec![b'w'; 1 << 20])))
        .expect("append");
    assert!(
        closed_by_server(&mut a),
        "APPEND past 8 MiB closes the connection"
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
        std::thread::sleep(Duration::from_millis(50));
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
    assert!(
        closed_by_server(&mut parked),
        "closed after {sent} bytes sent while parked"
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
    std::thread::sleep(Duration::from_secs(1));
    let during = host.rss();
    for c in halves.iter_mut().chain(silent.iter_mut()) {
        c.set_read_timeout(Some(Duration::from_secs(45)))
            .expect("timeout");
        assert!(closed_by_server(c), "closed after {:?}", t0.elapsed());
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
    std::thread::sleep(Duration::from_secs(3));
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
    // The episode is over once accepts have not failed for a while.
    std::thread::sleep(Duration::from_secs(6));
    assert!(answers(&mut client(host.store)));
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
