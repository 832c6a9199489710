//! The run: builds the topology, starts the jobs, injects the schedule's
//! faults at their times, heals them, tells the job to finish, then checks
//! the invariants on what was recorded.
//!
//! Every host is a network namespace on one [`Lan`]: etcd members at
//! `.30+i`, `rdzv-server` replicas (server mode) at `.20+i`, nodes at
//! `.10+i`; each node runs one agent of each job. Partitions are nftables
//! rules inside the namespaces (one table per fault, deleted at the heal),
//! slow links a `tbf` rate limit on the host's interface, a full log disk a
//! file filling the node's small tmpfs `--log-dir`. A daemon the harness
//! killed is started again at the heal, as systemd or Kubernetes would; one
//! that ends by itself is not (that is a finding).
//!
//! Every process of the jobs carries `CHAOS_RUN=<id>` in its environment,
//! so what is left at the end is found in /proc (invariant (e)).

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use serde_json::Value;

use super::history::{Exit, Injected, Parser, Victim, Worker};
use super::invariants::{self, Ending, Violation};
use super::report::{self, Effect};
use super::schedule::{self, Daemon, Fault, Host, Job, Mode, Planned, ETCD, NODES, REPLICAS};
use crate::{Lan, Netns};

/// Keep-alives: every second, three missed drop a node (the drop limit, 3 s).
pub const KEEP_ALIVE: &str = "keep_alive_interval=1,keep_alive_max_attempt=3";
/// The etcd lease of the replicas' (or agents') election, seconds.
pub const ETCD_LEASE: u32 = 2;
/// Invariant (d): the recording job runs again within this many seconds of the last heal.
pub const RUN_BOUND: f64 = 30.0;
/// Invariant (d): its agents exit 0 within this many seconds of being told to finish.
pub const FINISH_BOUND: f64 = 20.0;
/// Invariant (d): the DDP job's agents exit 0 within this many seconds of the last heal.
pub const DDP_BOUND: f64 = 150.0;
/// Workers per node of the recording job.
pub const NPROC: u32 = 2;

/// How to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds of faults.
    pub seconds: f64,
    /// The schedule's seed.
    pub seed: u64,
    /// What runs the rendezvous.
    pub mode: Mode,
    /// Run the DDP job beside the recording job (and check (f)).
    pub ddp: bool,
    /// A schedule to use instead of the seed's (tests).
    pub schedule: Option<Vec<Planned>>,
    /// Scratch directory (histories, logs, etcd data).
    pub dir: PathBuf,
    /// Where `accel-agent` and `rdzv-server` are.
    pub bins: PathBuf,
    /// A venv whose `bin/` has python with torch (for the DDP job).
    pub venv: Option<PathBuf>,
    /// The Lan's subnet: `10.<net>.0.0/24`.
    pub net: u8,
    /// Variables added to every agent's environment.
    pub agent_env: Vec<(String, String)>,
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// The schedule it ran.
    pub schedule: Vec<Planned>,
    /// What was injected.
    pub injected: Vec<Injected>,
    /// The recording job's workers.
    pub workers: Vec<Worker>,
    /// What each injected fault did.
    pub effects: Vec<Effect>,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// The report's table.
    pub table: String,
}

/// CLOCK_MONOTONIC in seconds: the clock the workers write.
pub fn now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn signal(pid: u32, sig: i32) -> bool {
    // SAFETY: kill(2) with a pid the harness started or read from the history.
    unsafe { libc::kill(pid as i32, sig) == 0 }
}

/// One daemon: how to start it, and its current incarnation.
#[derive(Debug)]
struct Proc {
    who: Daemon,
    ns: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    /// The harness killed it (its exit is not a finding).
    killed: bool,
    /// How the last incarnation ended.
    end: Option<(f64, i32)>,
}

impl Proc {
    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("daemon log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(&self.argv)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.who));
        self.child = Some(child);
        self.killed = false;
        self.end = None;
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.killed = true;
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Reaps it if it ended: (code, whether the harness killed it).
    fn reap(&mut self) -> Option<(i32, bool)> {
        let c = self.child.as_mut()?;
        let status = c.try_wait().ok()??;
        self.child = None;
        let code = status.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
        });
        self.end = Some((now(), code));
        Some((code, self.killed))
    }
}

/// The topology.
struct Cluster {
    id: String,
    dir: PathBuf,
    // Dropped last: the daemons first (field order).
    procs: Vec<Proc>,
    hosts: Vec<(Host, Netns)>,
    _lan: Lan,
    /// Each node's log tmpfs.
    log_dirs: Vec<PathBuf>,
    history: PathBuf,
    stop: PathBuf,
    /// Stopped pids to continue at heal (worker pauses).
    tables: u32,
}

fn host_index(h: Host) -> u8 {
    match h {
        Host::Node(i) => 10 + i as u8,
        Host::Replica(i) => 20 + i as u8,
        Host::Etcd(i) => 30 + i as u8,
    }
}

impl Cluster {
    fn ns(&self, h: Host) -> &Netns {
        &self.hosts.iter().find(|(x, _)| *x == h).expect("host").1
    }

    fn addr(&self, h: Host) -> String {
        self.ns(h).addr.clone()
    }

    fn proc(&mut self, d: Daemon) -> &mut Proc {
        self.procs.iter_mut().find(|p| p.who == d).expect("daemon")
    }

    fn start(o: &Options) -> Cluster {
        let id = format!("chaos-{}-{}", std::process::id(), o.seed);
        let dir = o.dir.clone();
        fs::create_dir_all(&dir).expect("scratch dir");
        let lan = Lan::create(o.net);
        let mut hosts = Vec::new();
        for i in 0..NODES {
            hosts.push(Host::Node(i));
        }
        if o.mode == Mode::Server {
            for i in 0..REPLICAS {
                hosts.push(Host::Replica(i));
            }
        }
        for i in 0..ETCD {
            hosts.push(Host::Etcd(i));
        }
        let hosts: Vec<(Host, Netns)> = hosts
            .into_iter()
            .map(|h| (h, lan.host(host_index(h))))
            .collect();
        let mut c = Cluster {
            id,
            history: dir.join("history.jsonl"),
            stop: dir.join("stop"),
            dir,
            procs: Vec::new(),
            hosts,
            _lan: lan,
            log_dirs: Vec::new(),
            tables: 0,
        };
        let token = c.dir.join("token");
        fs::write(&token, "chaos-token-0123456789abcdef\n").expect("token");
        let token = token.to_string_lossy().into_owned();

        // etcd.
        let peer = |c: &Cluster, i: usize| format!("http://{}:2380", c.addr(Host::Etcd(i)));
        let initial = (0..ETCD)
            .map(|i| format!("e{i}={}", peer(&c, i)))
            .collect::<Vec<_>>()
            .join(",");
        for i in 0..ETCD {
            let client = format!("http://{}:2379", c.addr(Host::Etcd(i)));
            let data = c.dir.join(format!("etcd{i}"));
            let argv = vec![
                "etcd".into(),
                "--name".into(),
                format!("e{i}"),
                "--data-dir".into(),
                data.to_string_lossy().into_owned(),
                "--listen-client-urls".into(),
                client.clone(),
                "--advertise-client-urls".into(),
                client,
                "--listen-peer-urls".into(),
                peer(&c, i),
                "--initial-advertise-peer-urls".into(),
                peer(&c, i),
                "--initial-cluster".into(),
                initial.clone(),
                "--initial-cluster-token".into(),
                c.id.clone(),
                "--heartbeat-interval".into(),
                "50".into(),
                "--election-timeout".into(),
                "500".into(),
            ];
            c.add(Daemon::Etcd(i), Host::Etcd(i), argv, Vec::new());
        }
        let etcd_eps: Vec<String> = (0..ETCD)
            .map(|i| format!("{}:2379", c.addr(Host::Etcd(i))))
            .collect();
        c.wait_etcd(&etcd_eps);

        // Replicas.
        let bins = &o.bins;
        if o.mode == Mode::Server {
            let urls = etcd_eps
                .iter()
                .map(|e| format!("http://{e}"))
                .collect::<Vec<_>>()
                .join(",");
            for i in 0..REPLICAS {
                let argv = vec![
                    bins.join("rdzv-server").to_string_lossy().into_owned(),
                    "--bind".into(),
                    format!("{}:29400", c.addr(Host::Replica(i))),
                    "--etcd-endpoints".into(),
                    urls.clone(),
                    "--etcd-prefix".into(),
                    "/chaos".into(),
                    "--etcd-lease".into(),
                    ETCD_LEASE.to_string(),
                    "--token-file".into(),
                    token.clone(),
                ];
                let env = vec![
                    ("RDZV_METRICS_BIND".into(), "off".into()),
                    ("RUST_LOG".into(), "info".into()),
                ];
                c.add(Daemon::Replica(i), Host::Replica(i), argv, env);
            }
        }

        // Agents.
        let (backend, endpoint, extra) = match o.mode {
            Mode::Server => (
                "c10d",
                (0..REPLICAS)
                    .map(|i| format!("{}:29400", c.addr(Host::Replica(i))))
                    .collect::<Vec<_>>()
                    .join(","),
                String::new(),
            ),
            Mode::Agents => (
                "etcd",
                etcd_eps.join(","),
                format!(",etcd_lease={ETCD_LEASE},etcd_prefix=/chaos"),
            ),
        };
        let path = {
            let old = std::env::var("PATH").unwrap_or_default();
            match &o.venv {
                Some(v) => format!("{}:{old}", v.join("bin").display()),
                None => old,
            }
        };
        let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("workers");
        let ddp_dirs = (c.dir.join("ddp/ckpt"), c.dir.join("ddp/out"));
        fs::create_dir_all(&ddp_dirs.0).expect("ddp dir");
        fs::create_dir_all(&ddp_dirs.1).expect("ddp dir");
        for i in 0..NODES {
            let logs = c.dir.join(format!("node{i}-logs"));
            fs::create_dir_all(&logs).expect("log dir");
            let ok = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
                .arg(&logs)
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "mount a tmpfs at {} (needs root and a private mount namespace)",
                logs.display()
            );
            c.log_dirs.push(logs.clone());
            let addr = c.addr(Host::Node(i));
            for job in [Job::Rec, Job::Ddp] {
                if job == Job::Ddp && !o.ddp {
                    continue;
                }
                let (nnodes, nproc) = match job {
                    Job::Rec => ("2:3", NPROC),
                    // Two ranks (the third node's agent a spare): a sum
                    // of two gradients has one order, so a resumed run is
                    // bit-exact whatever DDP's bucket layout (with three, the
                    // buckets DDP rebuilds after its first step change the
                    // order of additions across a restart).
                    Job::Ddp => ("2", 1),
                };
                let mut argv: Vec<String> = vec![
                    bins.join("accel-agent").to_string_lossy().into_owned(),
                    "--rdzv-backend".into(),
                    backend.into(),
                    "--rdzv-endpoint".into(),
                    endpoint.clone(),
                    "--rdzv-id".into(),
                    job.id().into(),
                    "--nnodes".into(),
                    nnodes.into(),
                    "--nproc-per-node".into(),
                    nproc.to_string(),
                    "--max-restarts".into(),
                    "1000".into(),
                    "--local-addr".into(),
                    addr.clone(),
                    "--rdzv-conf".into(),
                    format!("{KEEP_ALIVE},last_call_timeout=1,token_file={token}{extra}"),
                    "--log-dir".into(),
                    logs.join(job.id()).to_string_lossy().into_owned(),
                    "--redirects".into(),
                    "3".into(),
                ];
                match job {
                    Job::Rec => argv.push(
                        worker
                            .join("chaos_worker.py")
                            .to_string_lossy()
                            .into_owned(),
                    ),
                    Job::Ddp => {
                        argv.push(worker.join("ddp_train.py").to_string_lossy().into_owned());
                        argv.extend(ddp_args(o.seconds, &ddp_dirs.0, &ddp_dirs.1, 0.2));
                    }
                }
                let mut env: Vec<(String, String)> = vec![
                    ("CHAOS_RUN".into(), c.id.clone()),
                    ("CHAOS_JOB".into(), job.id().into()),
                    ("CHAOS_NODE".into(), format!("node{i}")),
                    ("CHAOS_LOG".into(), c.history.to_string_lossy().into_owned()),
                    ("CHAOS_STOP".into(), c.stop.to_string_lossy().into_owned()),
                    ("PATH".into(), path.clone()),
                    ("GLOO_SOCKET_IFNAME".into(), "lan0".into()),
                    // One thread per worker here and in the uninterrupted
                    // run, so their arithmetic is the same (a one-worker
                    // node would otherwise use every core).
                    ("OMP_NUM_THREADS".into(), "1".into()),
                    ("ACCEL_LOG".into(), "info".into()),
                ];
                env.extend(o.agent_env.iter().cloned());
                c.add(Daemon::Agent(i, job), Host::Node(i), argv, env);
            }
        }
        c
    }

    fn add(&mut self, who: Daemon, host: Host, argv: Vec<String>, env: Vec<(String, String)>) {
        let mut p = Proc {
            who,
            ns: self.ns(host).name.clone(),
            argv,
            env,
            log: self
                .dir
                .join(format!("{}.log", who.to_string().replace('/', "-"))),
            child: None,
            killed: false,
            end: None,
        };
        p.spawn();
        self.procs.push(p);
    }

    fn wait_etcd(&self, eps: &[String]) {
        let deadline = now() + 30.0;
        loop {
            let ok = Command::new("etcdctl")
                .args([
                    "--endpoints",
                    &eps.join(","),
                    "--command-timeout",
                    "2s",
                    "put",
                    "/chaos-probe",
                    "1",
                ])
                .env("ETCDCTL_API", "3")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            assert!(
                now() < deadline,
                "etcd did not serve within 30 s; logs in {}",
                self.dir.display()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// `nft -f -` of `script` in `h`'s namespace; its error's first line.
    fn nft(&self, h: Host, script: &str) -> Result<(), String> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns(h).name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run nft (nftables; scripts/setup.sh installs it)");
        let _ = child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes());
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "nft: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or("failed")
            ))
        }
    }

    fn new_table(&mut self) -> String {
        self.tables += 1;
        format!("chaos{}", self.tables)
    }
}

/// The DDP job's arguments: 1.5 steps a second of faults (at 0.2 s a step,
/// it trains for about a third of the run, restarts and waits aside).
fn ddp_args(seconds: f64, ckpt: &Path, out: &Path, sleep: f64) -> Vec<String> {
    let steps = ((seconds * 1.5) as u64).max(30);
    vec![
        ckpt.to_string_lossy().into_owned(),
        out.to_string_lossy().into_owned(),
        "--steps".into(),
        steps.to_string(),
        "--step-sleep".into(),
        sleep.to_string(),
    ]
}

/// A fault or a heal that is due: when, which planned fault, and (for a
/// heal) what to undo and its entry in the injected list.
type Due = (f64, usize, Option<(Undo, usize)>);

/// What a fault left to undo at its heal.
#[derive(Debug)]
enum Undo {
    Nothing,
    Restart(Daemon),
    Continue(u32),
    Tables(Vec<(Host, String)>),
    Unslow(Host),
    Unfill(PathBuf),
}

/// Pids and environments of every process carrying `CHAOS_RUN=id`.
fn marked(id: &str) -> Vec<(u32, Vec<(String, String)>)> {
    let needle = format!("CHAOS_RUN={id}");
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(raw) = fs::read(e.path().join("environ")) else {
            continue;
        };
        let vars: Vec<(String, String)> = raw
            .split(|&b| b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect();
        if vars.iter().any(|(k, v)| format!("{k}={v}") == needle) && crate::alive(pid) {
            out.push((pid, vars));
        }
    }
    out
}

fn var<'a>(vars: &'a [(String, String)], k: &str) -> Option<&'a str> {
    vars.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
}

/// The harness's side of the history: the file the workers append to.
struct Tail {
    file: PathBuf,
    at: u64,
    parser: Parser,
}

impl Tail {
    fn poll(&mut self) {
        let Ok(mut f) = fs::File::open(&self.file) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.at)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_ok() {
            // Cut at the last newline: the rest is read next time.
            let n = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            self.at += n as u64;
            self.parser.feed(&String::from_utf8_lossy(&buf[..n]));
        }
    }
}

/// Runs the chaos run `o` describes.
pub fn run(o: &Options) -> Outcome {
    let plan = o
        .schedule
        .clone()
        .unwrap_or_else(|| schedule::schedule(o.seed, o.seconds, o.mode, o.ddp));
    let mut c = Cluster::start(o);
    let events = c.dir.join("events.log");
    let mut ev = fs::File::create(&events).expect("events log");
    let mut say = |line: String| {
        let _ = writeln!(ev, "{:.3} {line}", now());
        eprintln!("chaos: {line}");
    };
    let mut tail = Tail {
        file: c.history.clone(),
        at: 0,
        parser: Parser::default(),
    };
    // Daemons that ended by themselves (not killed by the harness).
    let mut early: Vec<Exit> = Vec::new();
    let mut reap = |c: &mut Cluster, say: &mut dyn FnMut(String)| {
        for p in c.procs.iter_mut() {
            if let Some((code, killed)) = p.reap() {
                if killed {
                    continue;
                }
                // The DDP job ends by itself; the recording job only when told.
                let ok = code == 0 && matches!(p.who, Daemon::Agent(_, Job::Ddp));
                say(format!(
                    "{} exited {code}{}",
                    p.who,
                    if ok { "" } else { " (by itself)" }
                ));
                if !ok {
                    early.push(Exit {
                        who: p.who.to_string(),
                        at: now(),
                        status: format!("exit {code}"),
                        ok,
                    });
                }
            }
        }
    };

    // The workload runs: every rank of a round started.
    let started = now();
    let t0 = loop {
        tail.poll();
        reap(&mut c, &mut say);
        if let Some(t) = invariants::running_at(&tail.parser.workers(), 0.0) {
            break Some(t.max(now()));
        }
        if now() > started + 90.0 {
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let mut injected: Vec<Injected> = Vec::new();
    let mut violations = Vec::new();
    let Some(t0) = t0 else {
        violations.push(Violation {
            invariant: 'd',
            what: "the recording job never ran (90 s after the start)".into(),
            slice: Vec::new(),
        });
        return finish(o, c, plan, injected, tail, violations, &mut early, &mut say);
    };
    say(format!(
        "workload running; {} faults over {} s",
        plan.len(),
        o.seconds
    ));

    // Inject and heal, in time order.
    let mut pending: Vec<Due> = plan
        .iter()
        .enumerate()
        .map(|(n, p)| (t0 + p.at, n, None))
        .collect();
    let end = t0 + o.seconds;
    while !pending.is_empty() || now() < end {
        tail.poll();
        reap(&mut c, &mut say);
        let t = now();
        pending.sort_by(|a, b| a.0.total_cmp(&b.0));
        while let Some(first) = pending.first() {
            if first.0 > t {
                break;
            }
            let (_, n, undo) = pending.remove(0);
            let p = &plan[n];
            match undo {
                None => {
                    let (inj, undo) = inject(&mut c, &tail.parser.workers(), p);
                    say(format!(
                        "{}{}{}",
                        inj.fault,
                        inj.victim
                            .as_ref()
                            .map(|v| format!(
                                " (pid {} rank {} restart {})",
                                v.pid, v.rank, v.restart
                            ))
                            .unwrap_or_default(),
                        inj.skipped
                            .as_ref()
                            .map(|s| format!(" skipped: {s}"))
                            .unwrap_or_default()
                    ));
                    injected.push(inj);
                    pending.push((t0 + p.heal, n, Some((undo, injected.len() - 1))));
                }
                Some((undo, slot)) => {
                    heal(&mut c, undo);
                    injected[slot].healed = now();
                    say(format!("healed: {}", injected[slot].fault));
                }
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    finish(o, c, plan, injected, tail, violations, &mut early, &mut say)
}

/// Live workers of `job`'s newest round now, by global rank.
fn live_workers(c: &Cluster, workers: &[Worker], job: Job) -> Vec<Victim> {
    let mut out: Vec<Victim> = match job {
        Job::Rec => {
            let t = now();
            workers
                .iter()
                .filter(|w| !w.ended && w.last > t - 0.5 && crate::alive(w.pid))
                .map(|w| Victim {
                    pid: w.pid,
                    restart: w.restart,
                    rank: w.rank,
                })
                .collect()
        }
        Job::Ddp => marked(&c.id)
            .into_iter()
            .filter(|(_, vars)| {
                var(vars, "CHAOS_JOB") == Some("ddp") && var(vars, "RANK").is_some()
            })
            .filter_map(|(pid, vars)| {
                Some(Victim {
                    pid,
                    restart: var(&vars, "TORCHELASTIC_RESTART_COUNT")?.parse().ok()?,
                    rank: var(&vars, "RANK")?.parse().ok()?,
                })
            })
            .collect(),
    };
    // The newest round's only.
    let newest = out.iter().map(|v| v.restart).max().unwrap_or(0);
    out.retain(|v| v.restart == newest);
    out.sort_by_key(|v| (v.rank, v.pid));
    out
}

/// Node `i` of a schedule is the node holding group rank `i` of the
/// recording job's newest round now (nodes outside it follow, by number),
/// so a fixed schedule can aim at the node holding rank 0.
fn physical(workers: &[Worker], t: f64) -> Vec<usize> {
    let live: Vec<&Worker> = workers
        .iter()
        .filter(|w| !w.ended && w.last > t - 0.5)
        .collect();
    let newest =
        live.iter()
            .map(|w| (w.restart, w.start))
            .fold(None, |a: Option<(u32, f64)>, b| match a {
                Some(x) if x.0 > b.0 || (x.0 == b.0 && x.1 >= b.1) => Some(x),
                _ => Some(b),
            });
    let mut order: Vec<(u32, usize)> = Vec::new();
    if let Some((restart, start)) = newest {
        if let Some(w) = live
            .iter()
            .find(|w| w.restart == restart && w.start == start)
        {
            let key = w.round();
            for x in live.iter().filter(|x| x.round() == key) {
                let n = x.node.trim_start_matches("node").parse().unwrap_or(0);
                if !order.iter().any(|o| o.1 == n) {
                    order.push((x.group_rank, n));
                }
            }
        }
    }
    order.sort();
    let mut out: Vec<usize> = order
        .into_iter()
        .map(|(_, n)| n)
        .filter(|&n| n < NODES)
        .collect();
    for n in 0..NODES {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// The fault with its nodes mapped to physical ones ([`physical`]).
fn resolve(f: &Fault, map: &[usize]) -> Fault {
    let host = |h: Host| match h {
        Host::Node(i) => Host::Node(map[i % NODES]),
        h => h,
    };
    let daemon = |d: Daemon| match d {
        Daemon::Agent(i, j) => Daemon::Agent(map[i % NODES], j),
        d => d,
    };
    match f.clone() {
        Fault::Kill(d) => Fault::Kill(daemon(d)),
        Fault::Stop(d) => Fault::Stop(daemon(d)),
        Fault::Partition { from, to, both } => Fault::Partition {
            from: host(from),
            to: host(to),
            both,
        },
        Fault::Isolate(h) => Fault::Isolate(host(h)),
        Fault::Slow(h) => Fault::Slow(host(h)),
        Fault::DiskFull(i) => Fault::DiskFull(map[i % NODES]),
        f => f,
    }
}

fn inject(c: &mut Cluster, workers: &[Worker], p: &Planned) -> (Injected, Undo) {
    let fault = resolve(&p.fault, &physical(workers, now()));
    let p = &Planned { fault, ..p.clone() };
    let mut inj = Injected {
        fault: p.fault.clone(),
        at: now(),
        healed: 0.0,
        victim: None,
        skipped: None,
    };
    let undo = match &p.fault {
        Fault::KillWorker { job, pick } | Fault::StopWorker { job, pick } => {
            let live = live_workers(c, workers, *job);
            if live.is_empty() {
                inj.skipped = Some("no live worker".into());
                Undo::Nothing
            } else {
                let v = live[*pick as usize % live.len()].clone();
                let stop = matches!(p.fault, Fault::StopWorker { .. });
                let sent = signal(v.pid, if stop { libc::SIGSTOP } else { libc::SIGKILL });
                inj.at = now();
                let pid = v.pid;
                if sent {
                    inj.victim = Some(v);
                } else {
                    inj.skipped = Some("the worker was gone".into());
                }
                if stop && sent {
                    Undo::Continue(pid)
                } else {
                    Undo::Nothing
                }
            }
        }
        Fault::Kill(d) => {
            let p = c.proc(*d);
            if p.child.is_some() {
                p.kill();
                Undo::Restart(*d)
            } else {
                inj.skipped = Some("not running".into());
                Undo::Nothing
            }
        }
        Fault::Stop(d) => match c.proc(*d).pid() {
            Some(pid) if signal(pid, libc::SIGSTOP) => Undo::Continue(pid),
            _ => {
                inj.skipped = Some("not running".into());
                Undo::Nothing
            }
        },
        Fault::Partition { from, to, both } => {
            let mut made = Vec::new();
            let pairs = if *both {
                vec![(*from, *to), (*to, *from)]
            } else {
                vec![(*from, *to)]
            };
            for (a, b) in pairs {
                let table = c.new_table();
                let script = format!(
                    "table inet {table} {{\n chain out {{\n type filter hook output priority 0;\n ip daddr {} drop\n }}\n}}\n",
                    c.addr(b)
                );
                match c.nft(a, &script) {
                    Ok(()) => made.push((a, table)),
                    Err(e) => inj.skipped = Some(e),
                }
            }
            Undo::Tables(made)
        }
        Fault::Isolate(h) => {
            let table = c.new_table();
            let script = format!(
                "table inet {table} {{\n chain out {{\n type filter hook output priority 0;\n oifname \"lan0\" drop\n }}\n chain in {{\n type filter hook input priority 0;\n iifname \"lan0\" drop\n }}\n}}\n"
            );
            match c.nft(*h, &script) {
                Ok(()) => Undo::Tables(vec![(*h, table)]),
                Err(e) => {
                    inj.skipped = Some(e);
                    Undo::Nothing
                }
            }
        }
        Fault::Slow(h) => {
            // netem's delay is not in every kernel (not in this one): a
            // token bucket at 1 Mbit/s with up to 400 ms of queue.
            let ok = Command::new("tc")
                .args([
                    "-n",
                    &c.ns(*h).name,
                    "qdisc",
                    "add",
                    "dev",
                    "lan0",
                    "root",
                    "tbf",
                    "rate",
                    "1mbit",
                    "burst",
                    "32kbit",
                    "latency",
                    "400ms",
                ])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                Undo::Unslow(*h)
            } else {
                inj.skipped = Some("already slow".into());
                Undo::Nothing
            }
        }
        Fault::DiskFull(i) => {
            let fill = c.log_dirs[*i].join(format!("fill-{}", c.tables));
            c.tables += 1;
            if let Ok(mut f) = fs::File::create(&fill) {
                let block = vec![0u8; 64 * 1024];
                while f.write_all(&block).is_ok() {}
            }
            Undo::Unfill(fill)
        }
    };
    (inj, undo)
}

fn heal(c: &mut Cluster, undo: Undo) {
    match undo {
        Undo::Nothing => {}
        Undo::Restart(d) => {
            // A finished DDP job's agents stay down (their job is over).
            let ddp_done = c.procs.iter().any(|p| {
                matches!(p.who, Daemon::Agent(_, Job::Ddp))
                    && p.end.is_some_and(|(_, code)| code == 0)
                    && !p.killed
            });
            if !(matches!(d, Daemon::Agent(_, Job::Ddp)) && ddp_done) {
                c.proc(d).spawn();
            }
        }
        Undo::Continue(pid) => {
            signal(pid, libc::SIGCONT);
        }
        Undo::Tables(ts) => {
            for (h, t) in ts {
                if let Err(e) = c.nft(h, &format!("delete table inet {t}\n")) {
                    eprintln!("chaos: cannot heal a partition of {h}: {e}");
                }
            }
        }
        Undo::Unslow(h) => {
            let _ = Command::new("tc")
                .args(["-n", &c.ns(h).name, "qdisc", "del", "dev", "lan0", "root"])
                .status();
        }
        Undo::Unfill(f) => {
            let _ = fs::remove_file(f);
        }
    }
}

/// After the last heal: the job runs again, is told to finish, its agents
/// end; what is left is stopped and found; the invariants are checked.
#[allow(clippy::too_many_arguments)]
fn finish(
    o: &Options,
    mut c: Cluster,
    plan: Vec<Planned>,
    injected: Vec<Injected>,
    mut tail: Tail,
    mut violations: Vec<Violation>,
    early: &mut Vec<Exit>,
    say: &mut dyn FnMut(String),
) -> Outcome {
    let last_heal = injected
        .iter()
        .map(|i| i.healed)
        .reduce(f64::max)
        .unwrap_or_else(now);
    // The recording job runs again, then is told to finish.
    let deadline = last_heal + RUN_BOUND;
    while now() < deadline {
        tail.poll();
        if invariants::running_at(&tail.parser.workers(), last_heal).is_some() {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let told = now();
    fs::write(&c.stop, "").expect("stop file");
    say("the job is told to finish".into());
    let agents_of = |c: &Cluster, job: Job| -> Vec<Daemon> {
        c.procs
            .iter()
            .filter(|p| matches!(p.who, Daemon::Agent(_, j) if j == job))
            .map(|p| p.who)
            .collect()
    };
    let wait_agents = |c: &mut Cluster,
                       job: Job,
                       until: f64,
                       early: &mut Vec<Exit>,
                       say: &mut dyn FnMut(String)| {
        loop {
            for p in c.procs.iter_mut() {
                if let Some((code, killed)) = p.reap() {
                    if !killed && code != 0 && !matches!(p.who, Daemon::Agent(..)) {
                        early.push(Exit {
                            who: p.who.to_string(),
                            at: now(),
                            status: format!("exit {code}"),
                            ok: false,
                        });
                    }
                    say(format!("{} exited {code}", p.who));
                }
            }
            let running = c
                .procs
                .iter()
                .any(|p| matches!(p.who, Daemon::Agent(_, j) if j == job) && p.child.is_some());
            if !running || now() > until {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    };
    wait_agents(&mut c, Job::Rec, told + FINISH_BOUND, early, say);
    if o.ddp {
        wait_agents(&mut c, Job::Ddp, last_heal + DDP_BOUND, early, say);
    }
    tail.poll();
    let workers: Vec<Worker> = tail
        .parser
        .workers()
        .into_iter()
        .filter(|w| w.job == "rec")
        .collect();
    let ending = |c: &Cluster, job: Job, told_at: Option<f64>, bound: f64, early: &[Exit]| Ending {
        job: job.id().into(),
        last_heal,
        run_bound: RUN_BOUND,
        told_at,
        finish_bound: bound,
        agents: agents_of(c, job)
            .into_iter()
            .map(|d| {
                let p = c.procs.iter().find(|p| p.who == d).expect("agent");
                (d.to_string(), if p.child.is_some() { None } else { p.end })
            })
            .collect(),
        early: early
            .iter()
            .filter(|x| match job {
                Job::Rec => !x.who.ends_with("/ddp"),
                Job::Ddp => x.who.ends_with("/ddp"),
            })
            .cloned()
            .collect(),
    };
    let rec_end = ending(&c, Job::Rec, Some(told), FINISH_BOUND, early);
    let ddp_end = o.ddp.then(|| ending(&c, Job::Ddp, None, DDP_BOUND, early));

    // Whatever still runs of the jobs is stopped (the guards take the workers).
    for p in c
        .procs
        .iter_mut()
        .filter(|p| matches!(p.who, Daemon::Agent(..)))
    {
        if let Some(pid) = p.pid() {
            signal(pid, libc::SIGCONT);
        }
        p.kill();
    }
    // (e): nothing of the jobs is left, once the guards have had a moment.
    let mut left = Vec::new();
    let until = now() + 5.0;
    while now() < until {
        left = marked(&c.id);
        if left.is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let leftovers: Vec<String> = left
        .iter()
        .map(|(pid, vars)| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            format!(
                "pid {pid} (job {}): {cmd}",
                var(vars, "CHAOS_JOB").unwrap_or("?")
            )
        })
        .collect();
    for (pid, _) in &left {
        signal(*pid, libc::SIGKILL);
    }
    for p in c.procs.iter_mut() {
        p.kill();
    }
    for d in &c.log_dirs {
        let _ = Command::new("umount").arg(d).status();
    }

    violations.extend(invariants::fencing(&workers));
    violations.extend(invariants::round_ranks(&workers, NPROC));
    violations.extend(invariants::budget(&workers, &injected));
    violations.extend(invariants::liveness(&workers, &rec_end));
    if let Some(e) = &ddp_end {
        violations.extend(invariants::liveness(&[], e));
    }
    violations.extend(invariants::leftovers(&leftovers));
    if o.ddp
        && ddp_end
            .as_ref()
            .is_some_and(|e| e.agents.iter().all(|(_, end)| matches!(end, Some((_, 0)))))
    {
        violations.extend(ddp_parameters(o, &c.dir, say));
    }
    let effects = report::effects(&workers, &injected, told);
    let table = report::table(&injected, &effects, &violations);
    Outcome {
        schedule: plan,
        injected,
        workers,
        effects,
        violations,
        table,
    }
}

/// (f): the same DDP job, uninterrupted (one node, two workers, no
/// sleep), and the final parameters of both compared.
fn ddp_parameters(o: &Options, dir: &Path, say: &mut dyn FnMut(String)) -> Vec<Violation> {
    let (ck, out) = (dir.join("ddp-clean/ckpt"), dir.join("ddp-clean/out"));
    fs::create_dir_all(&ck).expect("dir");
    fs::create_dir_all(&out).expect("dir");
    say("the uninterrupted DDP run (invariant (f))".into());
    let path = match &o.venv {
        Some(v) => format!(
            "{}:{}",
            v.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        None => std::env::var("PATH").unwrap_or_default(),
    };
    let log = fs::File::create(dir.join("ddp-clean.log")).expect("log");
    let status = Command::new(o.bins.join("accel-agent"))
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("workers/ddp_train.py"))
        .args(ddp_args(o.seconds, &ck, &out, 0.0))
        .env("PATH", path)
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        return vec![Violation {
            invariant: 'f',
            what: format!(
                "the uninterrupted DDP run failed; see {}",
                dir.join("ddp-clean.log").display()
            ),
            slice: Vec::new(),
        }];
    }
    let read = |d: &Path| -> Vec<Option<Value>> {
        (0..2)
            .map(|r| {
                fs::read_to_string(d.join(format!("final_{r}.json")))
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
            })
            .collect()
    };
    invariants::same_parameters(&read(&dir.join("ddp/out")), &read(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(node: usize, group_rank: u32, restart: u32, start: f64) -> Worker {
        Worker {
            job: "rec".into(),
            rank: group_rank * NPROC,
            world: 4,
            local_rank: 0,
            group_rank,
            restart,
            master: format!("m:{restart}"),
            pid: 100 + node as u32 + 10 * restart,
            node: format!("node{node}"),
            start,
            last: 10.0,
            ended: false,
        }
    }

    #[test]
    fn a_process_carrying_the_runs_mark_is_found_and_others_are_not() {
        let id = format!("unit-{}", std::process::id());
        let mut child = Command::new("sleep")
            .arg("30")
            .env("CHAOS_RUN", &id)
            .env("CHAOS_JOB", "rec")
            .spawn()
            .expect("sleep");
        let found = marked(&id);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, child.id());
        assert_eq!(var(&found[0].1, "CHAOS_JOB"), Some("rec"));
        assert!(marked(&id).is_empty(), "gone once killed");
        assert!(marked(&format!("{id}-other")).is_empty());
    }

    #[test]
    fn node_i_of_a_schedule_is_the_node_holding_group_rank_i_of_the_newest_round() {
        // Round of restart 1: node2 holds group rank 0, node0 group rank 1;
        // node1 is out of it. An older round ordered them otherwise.
        let ws = vec![
            w(0, 0, 0, 1.0),
            w(1, 1, 0, 1.0),
            w(2, 0, 1, 5.0),
            w(0, 1, 1, 5.0),
        ];
        let map = physical(&ws, 9.9);
        assert_eq!(map, [2, 0, 1]);
        assert_eq!(
            resolve(&Fault::Isolate(Host::Node(0)), &map),
            Fault::Isolate(Host::Node(2))
        );
        assert_eq!(
            resolve(&Fault::Stop(Daemon::Agent(1, Job::Rec)), &map),
            Fault::Stop(Daemon::Agent(0, Job::Rec))
        );
        assert_eq!(
            resolve(&Fault::Kill(Daemon::Etcd(1)), &map),
            Fault::Kill(Daemon::Etcd(1))
        );
        // Nothing live: the nodes by number.
        assert_eq!(physical(&ws, 60.0), [0, 1, 2]);
    }
}
