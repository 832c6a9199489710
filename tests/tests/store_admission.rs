//! Who may connect to the worker store, and on which port: a non-member
//! address in another network namespace is refused while the job's own
//! worker is served; a PyTorch job on two hosts is served across them while
//! a third host is refused; the store admits exactly the members it is
//! given; another local user is refused over loopback while the agent's
//! user is served; one address at its share of connections leaves room for
//! the others; a port range gives every round a fresh port.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use accel_tests::{
    as_other_user, eventually, read_json, records, scratch, venv, venv_path, worker, Agent,
    AgentCmd, Lan, Netns, Server,
};
use accel_worker_store::{Admit, ConnLimits, StoreOptions, WorkerStore};

use crate::heavy;
use crate::store_bounds::{answers, client, set_get_works, LIMIT};

/// Where the worker store of a one-node c10d job on `local_addr` is, once its
/// worker (a PyTorch client, `store_member.py`) has used it.
fn member_job(dir: &Path, server: &Server, local_addr: &str) -> (Agent, PathBuf, String) {
    let script = worker("store_member.py");
    let python = venv().join("bin/python");
    let agent = AgentCmd::c10d(&server.addr, "members")
        .local_addr(local_addr)
        .no_python(&python, &[script.to_str().expect("path")])
        .env("OUT_DIR", dir.to_str().expect("path"))
        .start(dir, "agent");
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
    probe_output(Command::new(argv[0]).args(&argv[1..]))
}

/// What a probe printed; it must have run to the end.
fn probe_output(cmd: &mut Command) -> String {
    let out = cmd.output().expect("probe");
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
    let outsider = Netns::create();
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
fn a_two_host_torch_job_is_served_across_hosts_while_a_third_host_is_refused() {
    let _heavy = heavy();
    // Three hosts on one segment; this namespace (the rendezvous) is on it too.
    let lan = Lan::create();
    let hosts = [lan.host(2), lan.host(3)];
    let outsider = lan.host(4);
    // A server on a routable address needs a token; the agents present it.
    let token = "store-admission-token-0123456789";
    let server = Server::start_with("0.0.0.0:0", &[], &[("RDZV_TOKEN", token)]);
    let endpoint = format!(
        "{}:{}",
        lan.gateway,
        server.addr.rsplit(':').next().expect("port")
    );
    let dir = scratch("store-two-hosts");
    let (rec, done) = (dir.to_string_lossy().to_string(), dir.join("done"));
    let (script, path) = (worker("allreduce.py"), venv_path());
    let agents: Vec<Agent> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            AgentCmd::c10d(&endpoint, "two-hosts")
                .local_addr(&h.addr)
                .nnodes(2)
                .nproc(2)
                .script(&script)
                .env("PATH", &path)
                .env("RECORD_DIR", &rec)
                .env("WAIT_FOR", done.to_str().expect("path"))
                // gloo's own connections go over the segment too.
                .env("GLOO_SOCKET_IFNAME", &h.iface)
                .env("ACCEL_RDZV_TOKEN", token)
                .start_with(&h.exec(), &dir, &format!("h{i}"))
        })
        .collect();
    let result = |rank: u32| dir.join(format!("allreduce_{rank}.json"));
    // Every worker, on both hosts, has met the others through node rank 0's
    // store and all-reduced; the workers now wait for `done`.
    assert!(
        eventually(Duration::from_secs(120), || (0..4)
            .all(|r| result(r).exists())),
        "all four workers all-reduced:\n{}",
        agents
            .iter()
            .map(|a| fs::read_to_string(&a.stderr).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let first: Vec<_> = (0..4).map(|r| read_json(&result(r))).collect();
    let var = |v: &serde_json::Value, k: &str| v["env"][k].as_str().expect(k).to_owned();
    let (host, port) = (var(&first[0], "MASTER_ADDR"), var(&first[0], "MASTER_PORT"));
    let rank0 = hosts
        .iter()
        .position(|h| h.addr == host)
        .unwrap_or_else(|| panic!("MASTER_ADDR {host} is one of the hosts' --local-addr"));
    let rank1 = &hosts[1 - rank0];
    for v in &first {
        assert_eq!(
            (var(v, "MASTER_ADDR"), var(v, "MASTER_PORT")),
            (host.clone(), port.clone())
        );
    }
    assert_eq!(
        first.iter().filter(|v| var(v, "GROUP_RANK") == "1").count(),
        2,
        "two workers ran on node rank 1, in the other namespace"
    );
    // A third host reaches the store's port but is closed unread; a process
    // on the member host is answered.
    for _ in 0..3 {
        assert_eq!(probe_from(&outsider, &host, &port), "closed");
    }
    assert_eq!(probe_from(rank1, &host, &port), "answered");
    fs::write(&done, "").expect("done");
    let outs: Vec<_> = agents.into_iter().map(|a| a.wait(LIMIT)).collect();
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out.code(), 0, "host {i}: {}", out.stderr);
    }
    for rank in 0..4 {
        let v = read_json(&result(rank));
        assert_eq!(v["world"], 4);
        assert_eq!(v["sum"], 10.0, "1+2+3+4 on rank {rank}");
        assert_eq!(v["after"], 10.0, "again after the probes, on rank {rank}");
    }
    let store_log = &outs[rank0].stderr;
    assert!(
        store_log.contains(&format!("peer={}:", outsider.addr)),
        "the refusal names the third host: {store_log}"
    );
    for key in ["peer", "latest"] {
        assert!(
            !store_log.contains(&format!("{key}={}:", rank1.addr)),
            "node rank 1 was never refused: {store_log}"
        );
    }
}

/// A worker store in this process, listening on every address (loopback and
/// the namespaces' links), on a runtime of its own (kept with it).
fn store_on_every_link(options: StoreOptions) -> (tokio::runtime::Runtime, WorkerStore) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let store = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("0.0.0.0:0")
            .await
            .expect("bind");
        WorkerStore::start_with(l, options).expect("store")
    });
    (rt, store)
}

#[test]
fn the_store_admits_exactly_the_members_it_is_given() {
    let _heavy = heavy();
    let member = Netns::create();
    let other = Netns::create();
    // One store listening on both links, admitting the member's address.
    let (_rt, store) = store_on_every_link(StoreOptions {
        admit: Admit::Members(vec![member.addr.clone()]),
        ..StoreOptions::default()
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

/// What `store_probe.py HOST PORT` saw, run by the system Python as the
/// other local user.
fn probe_as_other_user(host: &str, port: u16) -> String {
    let script = fs::read_to_string(worker("store_probe.py")).expect("probe script");
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.args(["-c", &script, host, &port.to_string()]);
    probe_output(as_other_user(&mut cmd))
}

#[test]
fn another_local_user_is_refused_over_loopback_while_the_agents_user_is_served() {
    let dir = scratch("store-other-user");
    let master = dir.join("master");
    let agent = AgentCmd::new()
        .no_python(
            "sh",
            &[
                "-c",
                "echo \"$MASTER_ADDR:$MASTER_PORT\" > \"$MASTER_FILE\"; exec sleep 300",
            ],
        )
        .env("MASTER_FILE", master.to_str().expect("path"))
        .start(&dir, "agent");
    assert!(
        eventually(Duration::from_secs(20), || fs::read_to_string(&master)
            .is_ok_and(|s| s.ends_with('\n'))),
        "the worker started"
    );
    let store: SocketAddr = fs::read_to_string(&master)
        .expect("master")
        .trim()
        .parse()
        .expect("MASTER_ADDR:MASTER_PORT");
    assert!(
        store.ip().is_loopback(),
        "a standalone job's store is on loopback"
    );
    // The other user reaches the port (the TCP handshake completes) and is
    // closed without a byte of answer, every time.
    for _ in 0..3 {
        assert_eq!(probe_as_other_user("127.0.0.1", store.port()), "closed");
    }
    // Nor can it write by sending a SET and closing before the agent
    // accepts (its closed socket lingers in the kernel's tables as uid 0):
    // the agent is stopped meanwhile, so it accepts only afterwards.
    let set_and_close = format!(
        "import socket, struct\n\
         s = socket.create_connection(('127.0.0.1', {port}))\n\
         k, v = b'/planted', b'by-another-user'\n\
         s.sendall(struct.pack('<BI', 0, 0x3C85F7CE) + bytes([1]) + struct.pack('<Q', len(k)) + k + struct.pack('<Q', len(v)) + v)\n\
         s.close()\n",
        port = store.port()
    );
    agent.signal("STOP");
    for _ in 0..3 {
        let mut cmd = Command::new("/usr/bin/python3");
        cmd.args(["-c", &set_and_close]);
        let out = as_other_user(&mut cmd).output().expect("set and close");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    agent.signal("CONT");
    // The agent's user (root here, as the workers) is served.
    let mut mine = client(store);
    assert!(
        set_get_works(&mut mine, "/mine"),
        "the agent's user is served"
    );
    {
        use std::io::{Read, Write};
        let check =
            accel_worker_store::wire::encode(&accel_worker_store::wire::Command::Check(vec![
                b"/planted".to_vec(),
            ]));
        mine.write_all(&check).expect("check");
        let mut b = [0u8; 1];
        mine.read_exact(&mut b).expect("check answered");
        assert_eq!(
            b[0], 1,
            "the other user's SET was never applied (NOT_READY)"
        );
    }
    let python = venv().join("bin/python");
    let out = Command::new(&python)
        .args([
            worker("store_probe.py").to_str().expect("path"),
            "127.0.0.1",
            &store.port().to_string(),
        ])
        .output()
        .expect("probe");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "answered");
    drop(mine);
    agent.signal("TERM");
    let stderr = agent.wait(LIMIT).stderr;
    let (uid, _) = accel_tests::other_user();
    assert!(
        stderr.contains(&format!("belongs to uid {uid}")),
        "the refusal names the user: {stderr}"
    );
    assert!(
        stderr.matches("other users of this host").count()
            + stderr.matches("only the agent's user").count()
            <= 2,
        "refusals are aggregated: {stderr}"
    );
}

#[test]
fn one_address_at_its_share_leaves_room_for_the_other_members() {
    let _heavy = heavy();
    let member = Netns::create();
    // 40 connections in all, 30 from one address.
    let (_rt, store) = store_on_every_link(StoreOptions {
        admit: Admit::Members(vec![member.addr.clone()]),
        connections: ConnLimits {
            total: 40,
            per_source: 30,
        },
        ..StoreOptions::default()
    });
    let local = SocketAddr::from(([127, 0, 0, 1], store.addr().port()));
    let mut flood: Vec<_> = (0..30).map(|_| client(local)).collect();
    assert!(answers(&mut flood[29]));
    for _ in 0..5 {
        assert!(!answers(&mut client(local)), "past its share: closed");
    }
    let port = store.addr().port().to_string();
    assert_eq!(
        probe_from(&member, &member.gateway, &port),
        "answered",
        "another address still gets in"
    );
    assert!(answers(&mut flood[0]));
    assert_eq!(store.stats().over_limit, 5);
    drop((flood, store));
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
    let out = AgentCmd::new()
        .nproc(1)
        .max_restarts(3)
        .conf(format!("store_ports={base}-{}", base + 2))
        .recording(&dir, "a")
        .env("FAIL_RANKS", "0")
        .env("FAIL_UNTIL", "3")
        .env("FAIL_AFTER", "0")
        .run(&dir, "agent", LIMIT);
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
