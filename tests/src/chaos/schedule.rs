//! The fault schedule: a pure function of (seed, duration, mode).
//!
//! Same seed, same duration, same mode: the same list of faults at the same
//! offsets, so a failing run is repeated by its seed. Targets are named by
//! role and index (agent 2, replica 0, etcd member 1); a worker is named by
//! a number the run resolves, when the fault is due, to one of the live
//! workers of the job's newest round (the schedule cannot know pids).
//!
//! Node `i` is named by rank, not by host: when the fault is due, the run
//! takes it to be the node holding group rank `i` of the recording job's
//! newest round (so "node 0" is where ranks 0.. run, and a fixed schedule
//! can aim at it).
//!
//! Times are seconds from the moment the workload first runs. Every fault
//! heals by `duration`, so the run can then check that the job recovers.

use std::fmt;

/// What runs the rendezvous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Two `rdzv-server` replicas on a three-member etcd.
    Server,
    /// No server: the agents elect one of themselves on the etcd (`--rdzv-backend etcd`).
    Agents,
}

impl Mode {
    /// `server` or `agents`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "server" => Some(Mode::Server),
            "agents" => Some(Mode::Agents),
            _ => None,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Server => "server",
            Mode::Agents => "agents",
        })
    }
}

/// Nodes (agent hosts) of the topology.
pub const NODES: usize = 3;
/// `rdzv-server` replicas in server mode.
pub const REPLICAS: usize = 2;
/// etcd members.
pub const ETCD: usize = 3;

/// One of the two workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Job {
    /// The recording job (`workers/chaos_worker.py`), elastic.
    Rec,
    /// The DDP job (`workers/ddp_train.py`), fixed size.
    Ddp,
}

impl Job {
    /// Its `--rdzv-id` (and name in the history).
    pub fn id(self) -> &'static str {
        match self {
            Job::Rec => "rec",
            Job::Ddp => "ddp",
        }
    }
}

/// A host of the topology: each is a network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    /// Agent host `i` (runs one agent of each job).
    Node(usize),
    /// `rdzv-server` replica `i`.
    Replica(usize),
    /// etcd member `i`.
    Etcd(usize),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Node(i) => write!(f, "node{i}"),
            Host::Replica(i) => write!(f, "replica{i}"),
            Host::Etcd(i) => write!(f, "etcd{i}"),
        }
    }
}

/// A process the harness runs (and restarts after a kill, as systemd would).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Daemon {
    /// The agent of `job` on node `i`.
    Agent(usize, Job),
    /// `rdzv-server` replica `i`.
    Replica(usize),
    /// etcd member `i`.
    Etcd(usize),
}

impl fmt::Display for Daemon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Daemon::Agent(i, j) => write!(f, "agent{i}/{}", j.id()),
            Daemon::Replica(i) => write!(f, "replica{i}"),
            Daemon::Etcd(i) => write!(f, "etcd{i}"),
        }
    }
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of a live worker of `job`'s newest round: the `pick`-th by
    /// global rank, modulo their number (so `pick` 0 is rank 0's).
    KillWorker {
        /// The job.
        job: Job,
        /// Which worker.
        pick: u32,
    },
    /// `SIGSTOP` of a live worker, `SIGCONT` at the heal.
    StopWorker {
        /// The job.
        job: Job,
        /// Which worker.
        pick: u32,
    },
    /// `kill -9` of a daemon; the harness starts it again at the heal.
    Kill(Daemon),
    /// `SIGSTOP` of a daemon, `SIGCONT` at the heal.
    Stop(Daemon),
    /// Packets from `from` to `to` dropped (and back too, `both`), until the heal.
    Partition {
        /// Sender whose packets are dropped.
        from: Host,
        /// Receiver.
        to: Host,
        /// Both directions.
        both: bool,
    },
    /// `host` cut off from every other host, both ways.
    Isolate(Host),
    /// `host`'s link rate-limited (tc) until the heal.
    Slow(Host),
    /// Node `i`'s agents' log directory (a small tmpfs) filled up until the heal.
    DiskFull(usize),
}

impl Fault {
    /// The kind, for the report's table (the DDP job's workers and agents apart).
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillWorker { job: Job::Ddp, .. } => "kill -9 DDP worker",
            Fault::StopWorker { job: Job::Ddp, .. } => "SIGSTOP DDP worker",
            Fault::Kill(Daemon::Agent(_, Job::Ddp)) => "kill -9 DDP agent",
            Fault::Stop(Daemon::Agent(_, Job::Ddp)) => "SIGSTOP DDP agent",
            Fault::KillWorker { .. } => "kill -9 worker",
            Fault::StopWorker { .. } => "SIGSTOP worker",
            Fault::Kill(Daemon::Agent(..)) => "kill -9 agent",
            Fault::Kill(Daemon::Replica(_)) => "kill -9 replica",
            Fault::Kill(Daemon::Etcd(_)) => "kill -9 etcd member",
            Fault::Stop(Daemon::Agent(..)) => "SIGSTOP agent",
            Fault::Stop(Daemon::Replica(_)) => "SIGSTOP replica",
            Fault::Stop(Daemon::Etcd(_)) => "SIGSTOP etcd member",
            Fault::Partition { both: false, .. } => "partition one-way",
            Fault::Partition { both: true, .. } => "partition two-way",
            Fault::Isolate(_) => "isolate host",
            Fault::Slow(_) => "slow link",
            Fault::DiskFull(_) => "log disk full",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillWorker { job, pick } => write!(f, "kill -9 worker #{pick} of {}", job.id()),
            Fault::StopWorker { job, pick } => write!(f, "SIGSTOP worker #{pick} of {}", job.id()),
            Fault::Kill(d) => write!(f, "kill -9 {d}"),
            Fault::Stop(d) => write!(f, "SIGSTOP {d}"),
            Fault::Partition { from, to, both } => {
                write!(
                    f,
                    "partition {from} {} {to}",
                    if *both { "<->" } else { "->" }
                )
            }
            Fault::Isolate(h) => write!(f, "isolate {h}"),
            Fault::Slow(h) => write!(f, "slow link {h}"),
            Fault::DiskFull(i) => write!(f, "log disk full node{i}"),
        }
    }
}

/// A fault at an offset, healed at another (equal for an instant fault: a worker kill).
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Seconds from the start of the faults.
    pub at: f64,
    /// The fault.
    pub fault: Fault,
    /// When it heals (the killed daemon restarts, the stopped one continues, the link is back).
    pub heal: f64,
}

impl fmt::Display for Planned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.heal > self.at {
            write!(
                f,
                "{:7.2}s {} (healed at {:.2}s)",
                self.at, self.fault, self.heal
            )
        } else {
            write!(f, "{:7.2}s {}", self.at, self.fault)
        }
    }
}

/// A small deterministic generator (SplitMix64): the schedule must not
/// depend on a library's choice of algorithm.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in `[lo, hi)`, rounded to 10 ms (schedules print readably).
    pub fn between(&mut self, lo: f64, hi: f64) -> f64 {
        let x = lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (x * 100.0).round() / 100.0
    }
}

/// The faults of a run: starting 2 s in, one every 2–6 s, each lasting
/// 1–8 s (a killed daemon is restarted after 0.5–3 s), all healed by
/// `duration`. Kills, pauses and partitions make up most of them; slow
/// links and full log disks the rest. `ddp`: the DDP job runs (its
/// workers and agents are targets too).
pub fn schedule(seed: u64, duration: f64, mode: Mode, ddp: bool) -> Vec<Planned> {
    let mut rng = Rng::new(
        seed ^ match mode {
            Mode::Server => 0,
            Mode::Agents => 0x5eed_a6e7,
        },
    );
    let mut out = Vec::new();
    let mut at = 2.0;
    while at < duration - 1.0 {
        let fault = pick(&mut rng, mode, ddp);
        let heal = match fault {
            Fault::KillWorker { .. } => at,
            Fault::Kill(_) => at + rng.between(0.5, 3.0),
            _ => at + rng.between(1.0, 8.0),
        };
        out.push(Planned {
            at,
            heal: heal.min(duration),
            fault,
        });
        at += rng.between(2.0, 6.0);
    }
    out
}

fn pick(rng: &mut Rng, mode: Mode, ddp: bool) -> Fault {
    let job = |rng: &mut Rng| {
        if ddp && rng.below(4) == 0 {
            Job::Ddp
        } else {
            Job::Rec
        }
    };
    let node = |rng: &mut Rng| rng.below(NODES);
    // The rendezvous's hosts: replicas, or (agent-only) the agents themselves.
    let server_side = |rng: &mut Rng| match mode {
        Mode::Server => Host::Replica(rng.below(REPLICAS)),
        Mode::Agents => Host::Etcd(rng.below(ETCD)),
    };
    // Weights: worker faults 3, daemon kills 3, pauses 3, partitions 4, slow 1, disk 1.
    match rng.below(15) {
        0 | 1 => Fault::KillWorker {
            job: job(rng),
            pick: rng.next_u64() as u32,
        },
        2 => Fault::StopWorker {
            job: job(rng),
            pick: rng.next_u64() as u32,
        },
        3..=5 => Fault::Kill(daemon(rng, mode, ddp)),
        6..=8 => Fault::Stop(daemon(rng, mode, ddp)),
        9..=12 => {
            let both = rng.below(2) == 0;
            match rng.below(4) {
                0 => Fault::Isolate(Host::Node(node(rng))),
                1 => {
                    let a = node(rng);
                    let b = (a + 1 + rng.below(NODES - 1)) % NODES;
                    Fault::Partition {
                        from: Host::Node(a),
                        to: Host::Node(b),
                        both,
                    }
                }
                2 if mode == Mode::Server => Fault::Partition {
                    from: Host::Replica(rng.below(REPLICAS)),
                    to: Host::Etcd(rng.below(ETCD)),
                    both,
                },
                _ => {
                    let (a, s) = (Host::Node(node(rng)), server_side(rng));
                    let (from, to) = if rng.below(2) == 0 { (a, s) } else { (s, a) };
                    Fault::Partition { from, to, both }
                }
            }
        }
        13 => Fault::Slow(match rng.below(3) {
            0 => server_side(rng),
            _ => Host::Node(node(rng)),
        }),
        _ => Fault::DiskFull(node(rng)),
    }
}

fn daemon(rng: &mut Rng, mode: Mode, ddp: bool) -> Daemon {
    let job = if ddp && rng.below(4) == 0 {
        Job::Ddp
    } else {
        Job::Rec
    };
    match (mode, rng.below(5)) {
        (Mode::Server, 3) => Daemon::Replica(rng.below(REPLICAS)),
        (_, 4) => Daemon::Etcd(rng.below(ETCD)),
        _ => Daemon::Agent(rng.below(NODES), job),
    }
}

/// The fixed schedules (`--scenario NAME`), each aimed at one guarantee,
/// with the seconds it needs: `fence` cuts node 0 (ranks 0..) off both
/// ways at 1 s for 8 s, then pauses its agent of the recording job at
/// 12 s for 8 s, both past the 3 s drop limit, so its workers must be
/// fenced twice; `failure-while-cut-off` cuts node 0 off at 1 s for 6 s
/// and kills its rank-0 worker at 2 s (within the drop limit): the node's
/// other worker must still stop before the job re-forms without it;
/// `short-faults` cuts node 0 off (both ways, then the replicas' or etcd's
/// packets to it) for 1.5 s, longer than the 1 s silence bound and shorter
/// than the 3 s drop limit, three times, then pauses its agent for 2.6 to
/// 2.9 s four times: the node leaves its silent server and must not end
/// its connection (the server would drop it on reading the close while
/// its workers run), and a paused agent's guard must kill its workers
/// before the server can drop the node, which counts from the node's last
/// keep-alive, not its agent's last beat.
pub fn scenario(name: &str) -> Option<(f64, Vec<Planned>)> {
    let p = |at, fault, heal| Planned { at, fault, heal };
    match name {
        "fence" => Some((
            24.0,
            vec![
                p(1.0, Fault::Isolate(Host::Node(0)), 9.0),
                p(12.0, Fault::Stop(Daemon::Agent(0, Job::Rec)), 20.0),
            ],
        )),
        "failure-while-cut-off" => Some((
            12.0,
            vec![
                p(1.0, Fault::Isolate(Host::Node(0)), 7.0),
                p(
                    2.0,
                    Fault::KillWorker {
                        job: Job::Rec,
                        pick: 0,
                    },
                    2.0,
                ),
            ],
        )),
        "short-faults" => Some((
            42.0,
            vec![
                p(1.0, Fault::Isolate(Host::Node(0)), 2.5),
                p(
                    6.0,
                    Fault::Partition {
                        from: Host::Replica(0),
                        to: Host::Node(0),
                        both: false,
                    },
                    7.5,
                ),
                p(
                    11.0,
                    Fault::Partition {
                        from: Host::Replica(1),
                        to: Host::Node(0),
                        both: false,
                    },
                    12.5,
                ),
                p(16.0, Fault::Stop(Daemon::Agent(0, Job::Rec)), 18.6),
                p(22.0, Fault::Stop(Daemon::Agent(0, Job::Rec)), 24.7),
                p(28.0, Fault::Stop(Daemon::Agent(0, Job::Rec)), 30.8),
                p(34.0, Fault::Stop(Daemon::Agent(0, Job::Rec)), 36.9),
            ],
        )),
        _ => None,
    }
}

/// The names [`scenario`] knows.
pub const SCENARIOS: [&str; 3] = ["fence", "failure-while-cut-off", "short-faults"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let a = schedule(7, 120.0, Mode::Server, true);
        assert_eq!(a, schedule(7, 120.0, Mode::Server, true));
        assert_ne!(a, schedule(8, 120.0, Mode::Server, true));
        assert_ne!(a, schedule(7, 120.0, Mode::Agents, true));
        assert!(a.len() >= 20, "one fault every 2-6 s: {}", a.len());
    }

    #[test]
    fn every_fault_heals_within_the_run_and_after_it_starts() {
        for seed in 0..50 {
            for mode in [Mode::Server, Mode::Agents] {
                let s = schedule(seed, 60.0, mode, seed % 2 == 0);
                let mut last = 0.0;
                for p in &s {
                    assert!(p.at >= last && p.at >= 2.0, "{p}");
                    assert!(p.heal >= p.at && p.heal <= 60.0, "{p}");
                    last = p.at;
                }
            }
        }
    }

    #[test]
    fn every_scenario_heals_within_its_seconds() {
        for name in SCENARIOS {
            let (secs, plan) = scenario(name).expect("known");
            assert!(
                plan.iter().all(|p| p.at <= p.heal && p.heal < secs),
                "{name}"
            );
        }
        assert!(scenario("nope").is_none());
    }

    #[test]
    fn targets_exist_in_the_mode_and_every_kind_is_drawn() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..40 {
            for p in schedule(seed, 300.0, Mode::Agents, false) {
                kinds.insert(p.fault.kind());
                let bad = match &p.fault {
                    Fault::Kill(Daemon::Replica(_)) | Fault::Stop(Daemon::Replica(_)) => true,
                    Fault::Partition { from, to, .. } => {
                        matches!(from, Host::Replica(_)) || matches!(to, Host::Replica(_))
                    }
                    Fault::Slow(Host::Replica(_)) => true,
                    Fault::KillWorker { job, .. } | Fault::StopWorker { job, .. } => {
                        *job == Job::Ddp
                    }
                    Fault::Kill(Daemon::Agent(_, j)) | Fault::Stop(Daemon::Agent(_, j)) => {
                        *j == Job::Ddp
                    }
                    _ => false,
                };
                assert!(!bad, "agent-only without DDP has no such target: {p}");
                if let Fault::Partition { from, to, .. } = p.fault {
                    assert_ne!(from, to, "{p}");
                }
            }
        }
        assert_eq!(kinds.len(), 11, "{kinds:?}");
        for seed in 0..40 {
            for p in schedule(seed, 300.0, Mode::Server, true) {
                kinds.insert(p.fault.kind());
            }
        }
        assert_eq!(kinds.len(), 17, "{kinds:?}");
    }
}
