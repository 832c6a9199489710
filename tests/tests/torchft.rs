//! torchft 0.2 (from the package registry, unmodified) with its lighthouse
//! in `rdzv-server --lighthouse`: two replica groups, each an accel-agent
//! job, train a DDP model on gloo; killing one group's worker lets the
//! other go on alone and the killed group rejoins and heals. The same run
//! against torchft's own lighthouse is the anchor: both must behave alike.
//! And with two `rdzv-server` replicas on etcd behind a stand-in for a
//! Service, `kill -9` of the leading replica mid-training: the managers get
//! a quorum from the new leader within the lease + 2 s and train on, where
//! the same kill of torchft's own lighthouse stops training.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use accel_tests::etcd::EtcdCluster;
use accel_tests::{
    eventually, http_get, path_with, sample, scratch, signal, venv, Agent, AgentCmd, Port, Server,
};
use serde_json::Value;

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(240);
/// Steps each group trains.
const STEPS: u64 = 120;
/// The step of group 1 at which its worker is killed.
const KILL_AT: u64 = 40;

/// The venv setup.sh made with torchft over the pinned torch.
fn torchft_venv() -> PathBuf {
    let root = venv().join("torchft-0.2.0");
    assert!(
        root.join(".complete").exists(),
        "no torchft venv at {}: run scripts/setup.sh",
        root.display()
    );
    root
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/torchft/train_ft.py")
}

/// One committed step of one group, as the example records it.
#[derive(Debug, Clone)]
struct Step {
    group: u64,
    step: u64,
    quorum_id: i64,
    participants: u64,
    time: f64,
    pid: u64,
    restart: u64,
    param_sum: f64,
}

fn steps(path: &Path) -> Vec<Step> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| Step {
            group: v["group"].as_u64().unwrap_or(99),
            step: v["step"].as_u64().unwrap_or(0),
            quorum_id: v["quorum_id"].as_i64().unwrap_or(-1),
            participants: v["participants"].as_u64().unwrap_or(0),
            time: v["time"].as_f64().unwrap_or(0.0),
            pid: v["pid"].as_u64().unwrap_or(0),
            restart: v["restart"].as_u64().unwrap_or(0),
            param_sum: v["param_sum"].as_f64().unwrap_or(f64::NAN),
        })
        .collect()
}

/// What a run showed, compared between the two lighthouses.
#[derive(Debug, PartialEq, Eq)]
struct Behaviour {
    /// Both groups trained every step and their agents exited 0.
    finished: bool,
    /// The survivor committed steps alone while the other group was down.
    survivor_went_on_alone: bool,
    /// The killed group's restarted worker took part again (two
    /// participants) and had the survivor's weights at the same steps.
    rejoined_and_healed: bool,
}

/// Runs the two groups against `lighthouse` (`http://host:port`), kills
/// group 1's worker at [`KILL_AT`], and says what happened; `tag` names
/// the scratch directory.
fn run(tag: &str, lighthouse: &str) -> (Behaviour, Vec<Step>, Vec<Step>, f64) {
    let dir = scratch(tag);
    let agents = start_groups(&dir, lighthouse, 3, false);
    let g1 = dir.join("g1.jsonl");
    reach(&dir, 1, KILL_AT);
    let victim = steps(&g1).last().expect("a step").pid;
    let killed_at = wall_now();
    signal(u32::try_from(victim).expect("pid"), "KILL");
    let mut finished = true;
    for a in agents {
        let out = a.wait(LIMIT);
        finished &= out.code() == 0;
        if out.code() != 0 {
            eprintln!(
                "[{tag}] a group's agent exited {}:\n{}",
                out.code(),
                out.stderr
            );
        }
    }
    let (s0, s1) = (steps(&dir.join("g0.jsonl")), steps(&g1));
    finished &=
        s0.last().is_some_and(|s| s.step >= STEPS) && s1.last().is_some_and(|s| s.step >= STEPS);
    let alone: Vec<&Step> = s0
        .iter()
        .filter(|s| s.time > killed_at && s.participants == 1)
        .collect();
    let back: Vec<&Step> = s1
        .iter()
        .filter(|s| s.restart >= 1 && s.participants == 2)
        .collect();
    // Healed: at every step both groups committed after the rejoin, the
    // weights are the same.
    let healed = !back.is_empty()
        && back.iter().all(|b| {
            s0.iter()
                .find(|a| a.step == b.step)
                .is_none_or(|a| (a.param_sum - b.param_sum).abs() < 1e-6)
        });
    let first_alone = alone.first().map_or(f64::NAN, |s| s.time - killed_at);
    (
        Behaviour {
            finished,
            survivor_went_on_alone: !alone.is_empty(),
            rejoined_and_healed: healed,
        },
        s0,
        s1,
        first_alone,
    )
}

/// torchft's own lighthouse, on `port`.
fn torchft_lighthouse(port: u16) -> Child {
    let child = Command::new(torchft_venv().join("bin/torchft_lighthouse"))
        .args([
            "--min_replicas",
            "1",
            "--join_timeout_ms",
            "1000",
            "--heartbeat_timeout_ms",
            "2000",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("torchft_lighthouse");
    assert!(
        eventually(Duration::from_secs(20), || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()),
        "torchft_lighthouse did not listen on {port}"
    );
    child
}

#[test]
fn torchft_groups_fail_and_heal_with_rdzv_server_as_their_lighthouse_as_with_torchft_s_own() {
    let _heavy = heavy();
    // The anchor: torchft's own lighthouse.
    let port = Port::lease();
    let mut own = torchft_lighthouse(port.get());
    let (anchor, ..) = run("torchft-own", &format!("http://127.0.0.1:{}", port.get()));
    let _ = own.kill();
    let _ = own.wait();
    // rdzv-server's, with the same settings.
    let lh = Port::lease();
    let server = Server::start_with(
        "127.0.0.1:0",
        &[
            "--lighthouse",
            &lh.loopback(),
            "--lighthouse-join-timeout",
            "1",
            "--lighthouse-heartbeat-timeout",
            "2",
        ],
        &[],
    );
    let started = Instant::now();
    let (ours, s0, s1, alone_after) = run("torchft-rdzv", &format!("http://{}", lh.loopback()));
    let expected = Behaviour {
        finished: true,
        survivor_went_on_alone: true,
        rejoined_and_healed: true,
    };
    assert_eq!(anchor, expected, "torchft's own lighthouse");
    assert_eq!(
        ours,
        expected,
        "rdzv-server's lighthouse:\n{}",
        server.stderr()
    );
    // Quorum ids only grow, in each group's eyes.
    for s in [&s0, &s1] {
        assert!(s
            .windows(2)
            .all(|w| w[0].quorum_id <= w[1].quorum_id || w[1].restart > w[0].restart));
        assert!(s.iter().all(|x| x.group <= 1));
    }
    eprintln!(
        "rdzv-server's lighthouse: the survivor went on alone {alone_after:.2} s after the kill; {} s in all",
        started.elapsed().as_secs()
    );
}

/// A stand-in for a Kubernetes Service over the lighthouse replicas: each
/// connection goes to the next replica in turn that accepts it, and ends
/// when either side ends (a killed replica's connections break, as they do
/// through kube-proxy; the manager then connects again).
struct ServiceProxy {
    addr: String,
    stop: Arc<AtomicBool>,
}

impl ServiceProxy {
    fn over(backends: Vec<String>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("addr").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            let next = AtomicUsize::new(0);
            for client in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let n = next.fetch_add(1, Ordering::SeqCst);
                let upstream = (0..backends.len()).find_map(|i| {
                    let to = backends[(n + i) % backends.len()].parse().ok()?;
                    TcpStream::connect_timeout(&to, Duration::from_secs(1)).ok()
                });
                let Some(upstream) = upstream else { continue };
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("clone"),
                        upstream.try_clone().expect("clone"),
                    ),
                    (upstream, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(k) => {
                                    if to.write_all(&buf[..k]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Self { addr, stop }
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Starts the two groups against `lighthouse`, each agent with
/// `max_restarts`; with `retry_quorums`, torchft's quorum retries on
/// (`TORCHFT_QUORUM_RETRIES`: a failed quorum call is tried again about
/// every half second, for 20 s).
fn start_groups(
    dir: &Path,
    lighthouse: &str,
    max_restarts: u32,
    retry_quorums: bool,
) -> Vec<Agent> {
    let tft = torchft_venv();
    (0..2)
        .map(|g| {
            let mut cmd = AgentCmd::standalone()
                .nproc(1)
                .max_restarts(max_restarts)
                .script(example())
                .env("PATH", path_with(&tft))
                .env("TORCHFT_LIGHTHOUSE", lighthouse)
                .env("REPLICA_GROUP_ID", g)
                .env("NUM_REPLICA_GROUPS", 2)
                .env("STEPS", STEPS)
                .env("STEP_SLEEP", "0.05")
                .env("RECORD", dir.join(format!("g{g}.jsonl")).display())
                .env("GLOO_SOCKET_IFNAME", "lo")
                .env("TORCHFT_HOSTNAME", "127.0.0.1")
                .env("RUST_LOG", "warn");
            if retry_quorums {
                cmd = cmd
                    .env("TORCHFT_QUORUM_RETRIES", 40)
                    .env("QUORUM_TIMEOUT_SEC", 20);
            }
            cmd.start(dir, &format!("group{g}"))
        })
        .collect()
}

fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

/// Waits until `group` has committed `step`.
fn reach(dir: &Path, group: u64, step: u64) {
    let path = dir.join(format!("g{group}.jsonl"));
    assert!(
        eventually(Duration::from_secs(120), || steps(&path)
            .iter()
            .any(|s| s.step >= step)),
        "group {group} never reached step {step}"
    );
}

/// `rdzv-server` replica `i` of two on `etcd` (`--etcd-lease 2`), at
/// 127.0.0.`i+1`, serving the lighthouse at `port` there (every replica
/// on the same port, as on hosts of their own).
fn lighthouse_replica(etcd: &EtcdCluster, i: u8, port: u16) -> Server {
    let endpoints = etcd.endpoints();
    let ip = format!("127.0.0.{}", i + 1);
    Server::start_with(
        &format!("{ip}:0"),
        &[
            "--etcd-endpoints",
            &endpoints,
            "--etcd-prefix",
            "/accel-lighthouse",
            "--etcd-lease",
            "2",
            "--lighthouse",
            &format!("{ip}:{port}"),
            "--lighthouse-join-timeout",
            "1",
            "--lighthouse-heartbeat-timeout",
            "2",
        ],
        &[],
    )
}

fn metric(server: &Server, series: &str) -> Option<f64> {
    let at = server.metrics.as_deref()?;
    let (_, text) = http_get(at, "/metrics")?;
    sample(&text, series)
}

#[test]
fn killing_the_leading_rdzv_server_keeps_torchft_training_where_killing_torchft_s_lighthouse_stops_it(
) {
    let _heavy = heavy();
    // The anchor: torchft's own lighthouse, killed at step 40.
    let dir = scratch("torchft-own-killed");
    let port = Port::lease();
    let mut own = torchft_lighthouse(port.get());
    let groups = start_groups(&dir, &format!("http://127.0.0.1:{}", port.get()), 0, true);
    reach(&dir, 0, KILL_AT);
    let killed_at = wall_now();
    let _ = own.kill();
    let _ = own.wait();
    std::thread::sleep(Duration::from_secs(10));
    let after: Vec<Step> = [0, 1]
        .iter()
        .flat_map(|g| steps(&dir.join(format!("g{g}.jsonl"))))
        .filter(|s| s.time > killed_at + 1.0)
        .collect();
    assert!(
        after.is_empty(),
        "torchft's own lighthouse died, yet training went on: {after:?}"
    );
    for g in groups {
        g.signal("TERM");
        let _ = g.wait(LIMIT);
    }

    // rdzv-server: two replicas on etcd, the managers through a Service.
    let dir = scratch("torchft-ha");
    let etcd = EtcdCluster::start(&dir, 3);
    let port = Port::lease();
    let first = lighthouse_replica(&etcd, 0, port.get());
    assert!(
        eventually(Duration::from_secs(20), || metric(
            &first,
            "accel_rdzv_leader"
        ) == Some(1.0)),
        "the first replica leads:\n{}",
        first.stderr()
    );
    let second = lighthouse_replica(&etcd, 1, port.get());
    let service = ServiceProxy::over(vec![
        format!("127.0.0.1:{}", port.get()),
        format!("127.0.0.2:{}", port.get()),
    ]);
    let groups = start_groups(&dir, &format!("http://{}", service.addr), 0, true);
    reach(&dir, 0, KILL_AT);
    assert_eq!(
        metric(&second, "accel_rdzv_lighthouse_quorum_members"),
        Some(0.0),
        "the follower formed no quorum"
    );
    let before = [0, 1]
        .iter()
        .flat_map(|g| steps(&dir.join(format!("g{g}.jsonl"))))
        .map(|s| s.quorum_id)
        .max()
        .expect("steps");
    let killed = Instant::now();
    let killed_at = wall_now();
    first.signal("KILL");
    assert!(
        eventually(Duration::from_secs(30), || metric(
            &second,
            "accel_rdzv_lighthouse_quorum_members"
        )
        .is_some_and(|m| m >= 1.0)),
        "the new leader formed no quorum:\n{}",
        second.stderr()
    );
    let quorum_after = killed.elapsed();
    let mut finished = true;
    for g in groups {
        let out = g.wait(LIMIT);
        if out.code() != 0 {
            eprintln!(
                "[torchft-ha] a group's agent exited {}:\n{}",
                out.code(),
                out.stderr
            );
            finished = false;
        }
    }
    let (s0, s1) = (steps(&dir.join("g0.jsonl")), steps(&dir.join("g1.jsonl")));
    assert!(
        finished
            && s0.last().is_some_and(|s| s.step >= STEPS)
            && s1.last().is_some_and(|s| s.step >= STEPS),
        "training went on to step {STEPS} in both groups:\n{}",
        second.stderr()
    );
    // The first step committed under a quorum of the new leader.
    let resumed = s0
        .iter()
        .chain(&s1)
        .filter(|s| s.time > killed_at && s.quorum_id > before)
        .map(|s| s.time - killed_at)
        .fold(f64::INFINITY, f64::min);
    eprintln!(
        "rdzv-server HA lighthouse: the new leader's first quorum {:.2} s after kill -9 of the leader, the first step under it {resumed:.2} s after",
        quorum_after.as_secs_f64()
    );
    assert!(
        quorum_after <= Duration::from_secs(2 + 2),
        "a quorum from the new leader within the lease (2 s) + 2 s: {quorum_after:?}"
    );
    assert!(resumed.is_finite(), "a step under the new leader's quorum");
    // Quorum ids never go back, in each group's eyes.
    for s in [&s0, &s1] {
        assert!(
            s.windows(2).all(|w| w[0].quorum_id <= w[1].quorum_id),
            "quorum ids went back: {:?}",
            s.iter().map(|x| x.quorum_id).collect::<Vec<_>>()
        );
    }
    drop(service);
}
