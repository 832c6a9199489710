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

/// Which faults a seeded schedule draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Every kind: workers, agents, the control plane, the network, disks.
    All,
    /// The control plane only (server mode): every replica paused, killed
    /// or cut off from every node, one replica paused, killed or cut off,
    /// etcd without quorum or full, for 5 s to 5 min, one outage at a time.
    /// No such fault alone may stop or restart a worker (invariant (g)).
    ControlPlane,
}

impl Class {
    /// `all` or `control-plane`.
    pub fn parse(s: &str) -> Option<Class> {
        match s {
            "all" => Some(Class::All),
            "control-plane" => Some(Class::ControlPlane),
            _ => None,
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Class::All => "all",
            Class::ControlPlane => "control-plane",
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
    /// etcd filled to its space quota (the NOSPACE alarm: no writes, no
    /// new leases) until the heal, which recovers it as an operator would
    /// (delete, compact, defragment, disarm).
    EtcdFull,
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
            Fault::EtcdFull => "etcd full",
        }
    }

    /// A fault of the control plane alone: its processes (replicas, etcd
    /// members) or its links (among them, or between them and the nodes).
    /// Nothing of a node, its agents or workers is touched.
    pub fn control_plane(&self) -> bool {
        let cp = |h: &Host| !matches!(h, Host::Node(_));
        match self {
            Fault::Kill(d) | Fault::Stop(d) => !matches!(d, Daemon::Agent(..)),
            Fault::Partition { from, to, .. } => cp(from) || cp(to),
            Fault::Isolate(h) | Fault::Slow(h) => cp(h),
            Fault::EtcdFull => true,
            Fault::KillWorker { .. } | Fault::StopWorker { .. } | Fault::DiskFull(_) => false,
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
            Fault::EtcdFull => f.write_str("etcd full (space quota)"),
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
    schedule_of(Class::All, seed, duration, mode, ddp)
}

/// The faults of a run of `class`: [`schedule`] for [`Class::All`];
/// [`control_plane`] for [`Class::ControlPlane`].
pub fn schedule_of(class: Class, seed: u64, duration: f64, mode: Mode, ddp: bool) -> Vec<Planned> {
    if class == Class::ControlPlane {
        return control_plane(seed, duration);
    }
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

/// The control-plane outages of a server-mode run: starting 2 s in, one
/// at a time with 3–15 s between them, each lasting 5 s to 5 min (log-uniform,
/// so short and long ones both come up), all healed by `duration`. An
/// outage is one or more faults with the same start and heal (every replica
/// paused, every replica cut off from every node...).
pub fn control_plane(seed: u64, duration: f64) -> Vec<Planned> {
    let mut rng = Rng::new(seed ^ 0xc0_17a1);
    let mut out = Vec::new();
    let mut at = 2.0;
    while at + 5.0 < duration - 1.0 {
        let longest = (duration - 1.0 - at).min(300.0);
        let span = (5.0 * (longest / 5.0).powf(rng.between(0.0, 1.0))).clamp(5.0, longest);
        let heal = ((at + span) * 100.0).round() / 100.0;
        for fault in outage(&mut rng) {
            out.push(Planned { at, fault, heal });
        }
        at = heal + rng.between(3.0, 15.0);
    }
    out
}

/// One control-plane outage.
fn outage(rng: &mut Rng) -> Vec<Fault> {
    let replicas = || (0..REPLICAS).map(Daemon::Replica);
    let members = |n: usize, rng: &mut Rng| {
        let skip = rng.below(ETCD);
        (0..ETCD)
            .filter(move |&i| n == ETCD || i != skip)
            .map(Daemon::Etcd)
            .collect::<Vec<_>>()
    };
    let cut = |rs: Vec<usize>| {
        rs.into_iter()
            .flat_map(|r| {
                (0..NODES).map(move |n| Fault::Partition {
                    from: Host::Replica(r),
                    to: Host::Node(n),
                    both: true,
                })
            })
            .collect::<Vec<_>>()
    };
    match rng.below(9) {
        0 => replicas().map(Fault::Stop).collect(),
        1 => replicas().map(Fault::Kill).collect(),
        2 => vec![Fault::Stop(Daemon::Replica(rng.below(REPLICAS)))],
        3 => vec![Fault::Kill(Daemon::Replica(rng.below(REPLICAS)))],
        // Every member, or two of three (quorum lost).
        4 => {
            let n = if rng.below(2) == 0 { ETCD } else { ETCD - 1 };
            members(n, rng).into_iter().map(Fault::Kill).collect()
        }
        5 => {
            let n = if rng.below(2) == 0 { ETCD } else { ETCD - 1 };
            members(n, rng).into_iter().map(Fault::Stop).collect()
        }
        6 => cut((0..REPLICAS).collect()),
        7 => cut(vec![rng.below(REPLICAS)]),
        _ => vec![Fault::EtcdFull],
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
/// keep-alive, not its agent's last beat; `etcd-down` kills every etcd
/// member at 5 s for 120 s and `etcd-full` fills etcd to its quota at 5 s
/// for 60 s: control-plane faults alone, so no worker may stop (g).
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
        "etcd-down" => Some((
            135.0,
            (0..ETCD)
                .map(|i| p(5.0, Fault::Kill(Daemon::Etcd(i)), 125.0))
                .collect(),
        )),
        "etcd-full" => Some((75.0, vec![p(5.0, Fault::EtcdFull, 65.0)])),
        _ => None,
    }
}

/// The names [`scenario`] knows.
pub const SCENARIOS: [&str; 5] = [
    "fence",
    "failure-while-cut-off",
    "short-faults",
    "etcd-down",
    "etcd-full",
];

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
    fn a_control_plane_schedule_has_only_control_plane_outages_one_at_a_time() {
        let mut kinds = std::collections::BTreeSet::new();
        let (mut short, mut long) = (0, 0);
        for seed in 0..60 {
            let s = schedule_of(Class::ControlPlane, seed, 600.0, Mode::Server, true);
            assert!(!s.is_empty());
            let mut last_heal = -10.0;
            let mut start = -1.0;
            for p in &s {
                assert!(p.fault.control_plane(), "{p}");
                kinds.insert(p.fault.kind());
                assert!(p.heal <= 599.0 && p.heal - p.at >= 4.99, "{p}");
                assert!(p.heal - p.at <= 300.0, "{p}");
                if p.at != start {
                    assert!(p.at >= last_heal + 3.0, "one outage at a time: {p}");
                    start = p.at;
                    if p.heal - p.at < 30.0 {
                        short += 1;
                    } else if p.heal - p.at > 120.0 {
                        long += 1;
                    }
                }
                last_heal = p.heal;
            }
        }
        assert!(short > 20 && long > 10, "short {short}, long {long}");
        assert_eq!(kinds.len(), 6, "{kinds:?}");
        for (_, plan) in ["etcd-down", "etcd-full"].map(|n| scenario(n).expect("known")) {
            assert!(plan.iter().all(|p| p.fault.control_plane()));
        }
        assert!(!Fault::Isolate(Host::Node(0)).control_plane());
        assert!(!Fault::Kill(Daemon::Agent(0, Job::Rec)).control_plane());
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
