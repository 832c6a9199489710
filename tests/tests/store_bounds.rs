//! The worker store under abuse, as an attacker on the network would try it:
//! replies that are never read, WAIT floods, half frames, too many
//! connections, and connections from addresses that are not the round's
//! members. Each test runs the real agent (or the store on real sockets) and
//! measures what matters: the agent's resident memory from /proc, whether
//! connections are closed, what it logs.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use accel_agent::store::wire::{encode, Command as Cmd, MAX_VALUE_LEN, VALIDATION_MAGIC};
use accel_agent::store::{Admit, StoreOptions, WorkerStore};
use accel_tests::{
    eventually, record_script, records, run_agent, scratch, venv, worker, Agent, Netns, Server,
};

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(90);

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
        let script = format!(
            "{prefix} exec \"$0\" --no-python sh -c 'echo \"$MASTER_ADDR:$MASTER_PORT\" > \"$MASTER_FILE\"; exec sleep 300'"
        );
        let agent = Agent::start_with(
            &["sh", "-c", &script],
            dir,
            "agent",
            &[],
            &[("MASTER_FILE", master.to_str().expect("path"))],
        );
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
fn client(addr: SocketAddr) -> TcpStream {
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
fn answers(c: &mut TcpStream) -> bool {
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

/// Where the worker store of a one-node c10d job on `local_addr` is, once its
/// worker (a PyTorch client, `store_member.py`) has used it.
fn member_job(dir: &Path, server: &Server, local_addr: &str) -> (Agent, PathBuf, String) {
    let script = worker("store_member.py");
    let python = venv().join("bin/python");
    let agent = Agent::start(
        dir,
        "agent",
        &[
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            &server.addr,
            "--rdzv-id",
            "members",
            "--local-addr",
            local_addr,
            "--no-python",
            python.to_str().expect("path"),
            script.to_str().expect("path"),
        ],
        &[("OUT_DIR", dir.to_str().expect("path"))],
    );
    let ok = dir.join("ok_0");
    assert!(
        eventually(Duration::from_secs(60), || fs::read_to_string(&ok)
            .is_ok_and(|s| s.ends_with('\n'))),
        "the worker used the store: {}",
        fs::read_to_string(&agent.stderr).unwrap_or_default()
    );
    let master = fs::read_to_string(&ok).expect("ok").trim().to_owned();
    (agent, ok, master)
}

/// What `store_probe.py HOST PORT` saw, run in `ns`.
fn probe_from(ns: &Netns, host: &str, port: &str) -> String {
    let python = venv().join("bin/python");
    let mut argv = ns.exec();
    let (py, script) = (python.to_str().expect("path"), worker("store_probe.py"));
    argv.extend([py, script.to_str().expect("path"), host, port]);
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .expect("probe");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn a_non_member_address_is_refused_while_the_jobs_worker_is_served() {
    let _heavy = heavy();
    let outsider = Netns::create(78, 11);
    let server = Server::start();
    let dir = scratch("store-admission");
    // The node's address is its side of the link to the outsider's namespace.
    let (agent, _, master) = member_job(&dir, &server, &outsider.gateway);
    let (host, port) = master.rsplit_once(' ').expect("MASTER_ADDR MASTER_PORT");
    assert_eq!(host, outsider.gateway, "MASTER_ADDR is --local-addr");
    // The outsider reaches the port (the TCP handshake completes) but is
    // closed before a byte is read, three times over.
    for _ in 0..3 {
        assert_eq!(probe_from(&outsider, host, port), "closed");
    }
    // The store is bound to the node's address only: not on loopback.
    assert!(TcpStream::connect(("127.0.0.1", port.parse::<u16>().expect("port"))).is_err());
    fs::write(dir.join("done"), "").expect("done");
    let out = agent.wait(LIMIT);
    assert_eq!(
        out.code(),
        0,
        "the worker was served throughout: {}",
        out.stderr
    );
    let refusals = out.stderr.matches("worker store refused").count();
    assert!(
        out.stderr.contains(&format!("peer={}:", outsider.addr)),
        "the refusal names the outsider: {}",
        out.stderr
    );
    assert!(
        (1..=2).contains(&refusals),
        "refusals are aggregated, not one line each: {}",
        out.stderr
    );
}

#[test]
fn the_store_admits_exactly_the_members_it_is_given() {
    let _heavy = heavy();
    let member = Netns::create(79, 12);
    let other = Netns::create(79, 13);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    // One store listening on both links, admitting the member's address.
    let store = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("0.0.0.0:0")
            .await
            .expect("bind");
        WorkerStore::start_with(
            l,
            StoreOptions {
                admit: Admit::Members(vec![member.addr.clone()]),
                ..StoreOptions::default()
            },
        )
        .expect("store")
    });
    let port = store.addr().port().to_string();
    assert_eq!(probe_from(&member, &member.gateway, &port), "answered");
    assert_eq!(probe_from(&other, &other.gateway, &port), "closed");
    assert_eq!(probe_from(&other, &other.gateway, &port), "closed");
    assert_eq!(store.stats().refused, 2);
    let mut local = client(SocketAddr::from(([127, 0, 0, 1], store.addr().port())));
    assert!(answers(&mut local), "this host is always admitted");
    drop(store);
}

/// A base port with `n` free loopback ports from it.
fn free_range(n: u16) -> u16 {
    for _ in 0..200 {
        let random = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        let base = 20_000 + (random % 40_000) as u16;
        let held: Vec<_> = (base..base + n)
            .map_while(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
    panic!("no {n} free consecutive ports");
}

#[test]
fn store_ports_give_every_round_a_fresh_port_from_the_range() {
    let dir = scratch("store-ports");
    let base = free_range(3);
    // A port of the range held by someone else is skipped.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", base + 1)).expect("squat");
    let rec = dir.to_string_lossy().to_string();
    let script = record_script();
    let conf = format!("store_ports={base}-{}", base + 2);
    let out = run_agent(
        &dir,
        "agent",
        &[
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "3",
            "--rdzv-conf",
            &conf,
            script.to_str().expect("path"),
        ],
        &[
            ("RECORD_DIR", &rec),
            ("AGENT_TAG", "a"),
            ("FAIL_RANKS", "0"),
            ("FAIL_UNTIL", "3"),
            ("FAIL_AFTER", "0"),
        ],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let ports: Vec<u16> = records(&dir)
        .iter()
        .map(|r| r.var("MASTER_PORT").parse().expect("port"))
        .collect();
    assert_eq!(ports.len(), 4, "four attempts");
    for pair in ports.windows(2) {
        assert_ne!(pair[0], pair[1], "consecutive rounds differ: {ports:?}");
    }
    assert!(
        ports.iter().all(|p| [base, base + 2].contains(p)),
        "from the range, skipping the busy port {}: {ports:?}",
        base + 1
    );
    drop(squatter);
}
