//! The topology of a chaos run and the daemons in it.
//!
//! Every host is a network namespace on one [`Lan`]: etcd members at
//! `.30+i`, `rdzv-server` replicas (server mode) at `.20+i`, nodes at
//! `.10+i`; each node runs one agent of each job, with a small tmpfs as
//! its `--log-dir`. A daemon is a command line and its current
//! incarnation: the harness kills and starts it again as systemd or
//! Kubernetes would. Every process of the jobs carries `CHAOS_RUN=<id>` in
//! its environment, so what is left of them is found in /proc.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use super::run::{Options, ETCD_LEASE, NPROC};
use super::schedule::{Daemon, Host, Job, Mode, ETCD, NODES, REPLICAS};
use crate::{Lan, Netns};

/// CLOCK_MONOTONIC in seconds: the clock the workers write.
pub(crate) fn now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Sends `sig` to `pid`; whether it was delivered.
pub(crate) fn signal(pid: u32, sig: i32) -> bool {
    // SAFETY: kill(2) with a pid the harness started or read from the history.
    unsafe { libc::kill(pid as i32, sig) == 0 }
}

/// One daemon: how to start it, and its current incarnation.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) who: Daemon,
    pub(crate) ns: String,
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) log: PathBuf,
    pub(crate) child: Option<Child>,
    /// The harness killed it (its exit is not a finding).
    pub(crate) killed: bool,
    /// How the last incarnation ended.
    pub(crate) end: Option<(f64, i32)>,
}

impl Proc {
    pub(crate) fn spawn(&mut self) {
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

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.killed = true;
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Reaps it if it ended: (code, whether the harness killed it).
    pub(crate) fn reap(&mut self) -> Option<(i32, bool)> {
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
pub(crate) struct Cluster {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    // Dropped last: the daemons first (field order).
    pub(crate) procs: Vec<Proc>,
    pub(crate) hosts: Vec<(Host, Netns)>,
    pub(crate) _lan: Lan,
    /// Each node's log tmpfs.
    pub(crate) log_dirs: Vec<PathBuf>,
    pub(crate) history: PathBuf,
    pub(crate) stop: PathBuf,
    /// Stopped pids to continue at heal (worker pauses).
    pub(crate) tables: u32,
}

fn host_index(h: Host) -> u8 {
    match h {
        Host::Node(i) => 10 + i as u8,
        Host::Replica(i) => 20 + i as u8,
        Host::Etcd(i) => 30 + i as u8,
    }
}

impl Cluster {
    pub(crate) fn ns(&self, h: Host) -> &Netns {
        &self.hosts.iter().find(|(x, _)| *x == h).expect("host").1
    }

    pub(crate) fn addr(&self, h: Host) -> String {
        self.ns(h).addr.clone()
    }

    /// etcd's client URLs, comma-separated.
    pub(crate) fn etcd_endpoints(&self) -> String {
        (0..ETCD)
            .map(|i| format!("http://{}:2379", self.addr(Host::Etcd(i))))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(crate) fn proc(&mut self, d: Daemon) -> &mut Proc {
        self.procs.iter_mut().find(|p| p.who == d).expect("daemon")
    }

    /// Builds the topology and starts every daemon; `etcd_quota`: etcd's
    /// `--quota-backend-bytes` (a run that fills etcd gives a small one);
    /// `keep_alive`: the agents' keep-alive settings (`--rdzv-conf`).
    pub(crate) fn start(o: &Options, etcd_quota: Option<u64>, keep_alive: &str) -> Cluster {
        let id = format!("chaos-{}-{}", std::process::id(), o.seed);
        let dir = o.dir.clone();
        fs::create_dir_all(&dir).expect("scratch dir");
        let lan =
            match o.net {
                None => Lan::create(),
                Some(n) => Lan::create_on(crate::Subnet::exactly(n).unwrap_or_else(|| {
                    panic!("subnet 10.{n}.0.0/16 is in use: pick another --net")
                })),
            };
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
            let mut argv = vec![
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
            if let Some(q) = etcd_quota {
                argv.extend(["--quota-backend-bytes".into(), q.to_string()]);
            }
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
                    format!("{keep_alive},last_call_timeout=1,token_file={token}{extra}"),
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
    pub(crate) fn nft(&self, h: Host, script: &str) -> Result<(), String> {
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

    pub(crate) fn new_table(&mut self) -> String {
        self.tables += 1;
        format!("chaos{}", self.tables)
    }
}

/// The DDP job's arguments: 2.5 steps a second of faults (at 0.2 s a step,
/// it trains for half the run; with its restarts it spans most of it).
pub(crate) fn ddp_args(seconds: f64, ckpt: &Path, out: &Path, sleep: f64) -> Vec<String> {
    let steps = ((seconds * 2.5) as u64).max(30);
    vec![
        ckpt.to_string_lossy().into_owned(),
        out.to_string_lossy().into_owned(),
        "--steps".into(),
        steps.to_string(),
        "--step-sleep".into(),
        sleep.to_string(),
    ]
}

/// Pids and environments of every process carrying `CHAOS_RUN=id`.
pub(crate) fn marked(id: &str) -> Vec<(u32, Vec<(String, String)>)> {
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

/// The value of `k` in an environment read by [`marked`].
pub(crate) fn var<'a>(vars: &'a [(String, String)], k: &str) -> Option<&'a str> {
    vars.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_carrying_the_runs_mark_is_found_and_others_are_not() {
        let id = format!("unit-{}", std::process::id());
        let mut child = Command::new("sleep")
            .arg("30")
            .env("CHAOS_RUN", &id)
            .env("CHAOS_JOB", "rec")
            .spawn()
            .expect("sleep");
        // Until it has exec'ed, the child's environment is still ours.
        let t0 = std::time::Instant::now();
        let mut found = marked(&id);
        while found.is_empty() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            found = marked(&id);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, child.id());
        assert_eq!(var(&found[0].1, "CHAOS_JOB"), Some("rec"));
        assert!(marked(&id).is_empty(), "gone once killed");
        assert!(marked(&format!("{id}-other")).is_empty());
    }
}
