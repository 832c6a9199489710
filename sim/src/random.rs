//! Randomized mode: a seed gives a small job and a schedule of faults
//! (worker failures, agent crashes and restarts, partitions, cuts from the
//! server only or from the peer hub only, server crashes with relearning
//! or failover, server pauses, the server cut off from every node, link
//! delays and losses), all healed by a known instant. Most seeds' agents
//! have a peer hub (an outage limit of 2 to 10 drop limits; a sixth have
//! none). A third of the seeds fail the control plane only
//! (`control_plane`): a fixed-size job, one or two outages of the server
//! from a tenth of the drop limit to twice the outage limit; those whose
//! outages the peers' evidence can ride out are *calm*, and no worker may
//! stop in them (invariant g). About a third of the seeds run a server with a quarantine
//! (`--quarantine-after` 1 or 2) and one flaky node, whose workers fail in
//! several rounds in a row. The run goes on until every agent's life is over, or
//! until a bound past the healing (a liveness violation), with the
//! invariants checked after every step and at the end
//! ([`crate::invariants`]). The same seed always gives the same run, so a
//! failing seed found anywhere replays anywhere: `accel-sim seed N --trace`.

use std::time::Duration;

use crate::invariants::Violation;
use crate::world::{Fault, Spec, World};

/// How long after the faults heal the job must be over.
pub const BOUND: Duration = Duration::from_secs(240);

/// What one seed's run found.
#[derive(Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The broken invariants.
    pub violations: Vec<Violation>,
    /// The job, the faults and how it ended, in a few lines.
    pub summary: String,
    /// Every trace line, when asked for.
    pub trace: Option<Vec<String>>,
    /// How the job ended: succeeded, failed, or never (its agents gave up).
    pub outcome: Option<bool>,
    /// Faults the schedule injected.
    pub faults: usize,
    /// Virtual time the run took.
    pub took: Duration,
    /// Where the job's time went (the server's accounting of the job it
    /// holds at the end; `None`: it holds none).
    pub goodput: Option<rendezvous_server::job::Spent>,
}

fn ms(rng: &mut fastrand::Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.u64(lo..=hi))
}

/// What a seed runs: the job, how many agents, the faults by time, when
/// the last heals, and whether only the control plane fails, briefly
/// enough that no worker may be stopped ([`crate::invariants::Checker::calm`]).
#[derive(Debug, Clone)]
pub struct Plan {
    /// The job.
    pub spec: Spec,
    /// Its agents.
    pub nodes: usize,
    /// The faults, by time.
    pub faults: Vec<(Duration, Fault)>,
    /// When the last fault heals.
    pub healed: Duration,
    /// Invariant (g) applies.
    pub calm: bool,
}

/// The faults that take the server away from every node for `d` from
/// `at`, one of four kinds: paused, killed and restarted (relearning or
/// failing over), or cut off from every node.
fn server_away(
    rng: &mut fastrand::Rng,
    at: Duration,
    d: Duration,
    nodes: usize,
    failover: bool,
) -> Vec<(Duration, Fault)> {
    let back = at + d;
    match rng.u8(..3) {
        0 => vec![(at, Fault::PauseServer), (back, Fault::ResumeServer)],
        1 => vec![
            (at, Fault::CrashServer),
            (back, Fault::RestartServer(failover)),
        ],
        _ => (0..nodes)
            .flat_map(|i| [(at, Fault::CutServer(i)), (back, Fault::HealServer(i))])
            .collect(),
    }
}

/// How long the server may be away: from a tenth of the drop limit to
/// twice the outage limit, often around the drop limit and the outage
/// limit (where the rules change).
fn away_for(rng: &mut fastrand::Rng, spec: &Spec) -> Duration {
    let drop = spec.drop_limit().as_millis() as u64;
    let outage = (spec.outage.as_millis() as u64).max(drop);
    match rng.u8(..4) {
        0 => ms(rng, drop / 10, drop),
        1 => ms(rng, drop, 4 * drop),
        2 => ms(rng, 4 * drop, outage.max(4 * drop)),
        _ => ms(rng, outage / 2, 2 * outage),
    }
}

/// A seed whose only faults are the control plane's: a fixed-size job
/// (no spare, no elastic range, no quarantine, no worker failure) and one
/// or two outages of the server, each from a tenth of the drop limit to
/// twice the outage limit. The run is calm (invariant g) when the peers'
/// evidence can keep workers at these timings and every outage is shorter
/// than what it can ride out.
fn control_plane(rng: &mut fastrand::Rng) -> Plan {
    let n = rng.u32(2..=4);
    let attempts = rng.u32(2..=3);
    let mut spec = Spec {
        min_nodes: n,
        max_nodes: n,
        nproc: rng.u32(1..=2),
        max_restarts: rng.u32(0..=2),
        keep_alive: ms(rng, 300, 1000),
        attempts,
        last_call: ms(rng, 0, 1500),
        join_timeout: Duration::from_secs(120),
        grace: Duration::from_secs(40),
        barrier: Duration::from_secs(120),
        shutdown: Duration::from_secs(5),
        run: Some(ms(rng, 8000, 40_000)),
        term: ms(rng, 0, 300),
        latency: ms(rng, 0, 5),
        failover: rng.bool(),
        ..Spec::default()
    };
    spec.outage = spec.drop_limit() * rng.u32(4..=20);
    let nodes = n as usize;
    let mut faults = Vec::new();
    let mut at = ms(rng, 4000, 8000);
    let mut healed = Duration::ZERO;
    let mut longest = Duration::ZERO;
    for _ in 0..rng.usize(1..=2) {
        let d = away_for(rng, &spec);
        faults.extend(server_away(rng, at, d, nodes, spec.failover));
        healed = at + d;
        longest = longest.max(d);
        // The next begins once the nodes are surely back.
        at = healed + spec.drop_limit() * 2 + ms(rng, 1000, 5000);
    }
    faults.sort_by_key(|f| f.0);
    // When the peers' evidence keeps workers at all: it is dated `lag`
    // back and refreshed every ping, so it reaches past its ping by
    // `fence_in - lag`, which must outlast a ping's round trip and period
    // (small drop limits of two keep-alives leave nothing).
    let calm = spec.timing(n).is_some_and(|t| {
        let reach = t.fence_in.saturating_sub(t.lag);
        let ride = t.outage.saturating_sub(
            // The last answered keep-alive may be an interval before the
            // outage; the nodes are back within a silence bound, a join
            // retry and a round trip after it.
            spec.keep_alive + spec.silence() + Duration::from_millis(500 + 200),
        );
        reach > t.every + spec.latency * 4 + Duration::from_millis(20) && longest < ride
    });
    Plan {
        spec,
        nodes,
        faults,
        healed,
        calm,
    }
}

/// The plan of `seed`.
pub fn plan(seed: u64) -> Plan {
    // A generator of its own decides the flavour, so that the general
    // seeds' plans stay what they were.
    let mut c = fastrand::Rng::with_seed(seed ^ 0xc0_9a7e);
    if c.u8(..3) == 0 {
        return control_plane(&mut c);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let n = rng.u32(2..=4);
    let elastic = rng.bool();
    let spare = rng.u8(..4) == 0;
    let spec = Spec {
        min_nodes: if elastic { n - 1 } else { n },
        max_nodes: n,
        multiple_of: 0,
        settle: Duration::ZERO,
        nproc: rng.u32(1..=2),
        max_restarts: rng.u32(0..=2),
        keep_alive: ms(&mut rng, 300, 1000),
        attempts: rng.u32(2..=3),
        last_call: ms(&mut rng, 0, 1500),
        join_timeout: Duration::from_secs(120),
        grace: Duration::from_secs(40),
        barrier: Duration::from_secs(120),
        shutdown: Duration::from_secs(5),
        run: Some(ms(&mut rng, 3000, 15_000)),
        term: ms(&mut rng, 0, 300),
        latency: ms(&mut rng, 0, 5),
        backoff: accel_agent::config::RestartBackoff {
            base: match rng.bool() {
                true => Duration::ZERO,
                false => Duration::from_millis(500),
            },
            max: Duration::from_secs(4),
            window: Duration::from_secs(10),
        },
        static_ranks: false,
        failover: rng.bool(),
        quarantine: None,
        slow: None,
        store_latency: Duration::ZERO,
        broken_commit: false,
        broken_quarantine: false,
        outage: Duration::ZERO,
    };
    let nodes = n as usize + usize::from(spare);
    // The peer hub, from a generator of its own: a sixth of the seeds run
    // agents without one (outage 0), the others an outage limit of 2 to 10
    // drop limits; and the control plane's faults beside the others.
    let mut p = fastrand::Rng::with_seed(seed ^ 0x9ee7_5ab0);
    let mut spec = spec;
    if p.u8(..6) != 0 {
        spec.outage = spec.drop_limit() * p.u32(2..=10);
    }
    let mut faults = Vec::new();
    let mut healed = Duration::ZERO;
    for _ in 0..p.usize(0..=2) {
        let at = ms(&mut p, 500, 14_000);
        let node = p.usize(..nodes);
        let back = at + ms(&mut p, 100, 12_000);
        match p.u8(..4) {
            0 => {
                faults.push((at, Fault::CutServer(node)));
                faults.push((back, Fault::HealServer(node)));
                healed = healed.max(back);
            }
            1 => {
                faults.push((at, Fault::CutPeers(node)));
                faults.push((back, Fault::HealPeers(node)));
                healed = healed.max(back);
            }
            _ => {
                let d = away_for(&mut p, &spec);
                faults.extend(server_away(&mut p, at, d, nodes, spec.failover));
                healed = healed.max(at + d);
            }
        }
    }
    for _ in 0..rng.usize(0..=4) {
        let at = ms(&mut rng, 500, 14_000);
        let node = rng.usize(..nodes);
        let lasting = |rng: &mut fastrand::Rng, lo, hi| at + ms(rng, lo, hi);
        match rng.u8(..7) {
            0 | 1 => faults.push((
                at,
                Fault::FailWorker {
                    node,
                    local: rng.u32(..spec.nproc),
                    code: 1,
                },
            )),
            2 => {
                let back = lasting(&mut rng, 200, 6000);
                faults.push((at, Fault::CrashNode(node)));
                faults.push((back, Fault::RestartNode(node)));
                healed = healed.max(back);
            }
            3 => {
                let back = lasting(&mut rng, 100, 12_000);
                faults.push((at, Fault::Partition(node)));
                faults.push((back, Fault::Heal(node)));
                healed = healed.max(back);
            }
            4 => {
                let back = lasting(&mut rng, 100, 8000);
                faults.push((at, Fault::CrashServer));
                faults.push((back, Fault::RestartServer(spec.failover)));
                healed = healed.max(back);
            }
            5 => {
                let back = lasting(&mut rng, 500, 5000);
                faults.push((at, Fault::Delay(node, ms(&mut rng, 10, 80))));
                faults.push((back, Fault::Delay(node, Duration::ZERO)));
                healed = healed.max(back);
            }
            _ => {
                let back = lasting(&mut rng, 500, 4000);
                let p = rng.f64() * 0.5;
                // Calls are lost, not answers: see KNOWN_ISSUES in the
                // scenarios' README (an abandoned rejoin).
                faults.push((at, Fault::Drop(node, p)));
                faults.push((back, Fault::Drop(node, 0.0)));
                healed = healed.max(back);
            }
        }
    }
    // The quarantine from a generator of its own, so a seed's plan
    // otherwise (and every finding recorded by seed) is what it was before.
    let mut q = fastrand::Rng::with_seed(seed ^ 0x0a7a_9e17);
    if q.u8(..3) == 0 {
        spec.quarantine = Some(rendezvous_server::job::QuarantinePolicy {
            after: q.u32(1..=2),
            window: Duration::from_secs(60),
            hold: ms(&mut q, 500, 8000),
            stragglers: false,
        });
        let at = ms(&mut q, 500, 8000);
        faults.push((at, Fault::Flaky(q.usize(..nodes), q.u32(1..=3))));
        // A straggler, counted or not (--straggler-quarantine).
        if q.bool() {
            spec.slow = Some(q.usize(..nodes));
            if let Some(p) = spec.quarantine.as_mut() {
                p.stragglers = q.bool();
            }
        }
    }
    // World sizes a model can use (--nnodes-multiple-of 2), from a
    // generator of its own: rounds of 2 or 4 of up to 5 nodes, the others
    // spares.
    let mut k = fastrand::Rng::with_seed(seed ^ 0x6d17_0f02);
    if k.u8(..4) == 0 && !spec.static_ranks {
        spec.multiple_of = 2;
        spec.min_nodes = 2;
        spec.max_nodes = 4;
        // Half of them grow a running round only after a settle time.
        if k.bool() {
            spec.settle = ms(&mut k, 100, 3000);
        }
    }
    // Health checks that fail while the node forms, waits or runs
    // (--health-check-interval), and pass again later: from a generator of
    // its own.
    let mut h = fastrand::Rng::with_seed(seed ^ 0x4ea1_7c4e);
    if h.u8(..4) == 0 {
        for _ in 0..h.usize(1..=2) {
            let at = ms(&mut h, 300, 12_000);
            let back = at + ms(&mut h, 200, 6000);
            let node = h.usize(..nodes);
            faults.push((at, Fault::Unhealthy(node)));
            faults.push((back, Fault::RestartNode(node)));
            healed = healed.max(back);
        }
        // Workers that take their time on SIGTERM (a last checkpoint), up
        // to twice the drop limit: a node leaving for a failed check must
        // still be rid of them before a spare runs its ranks.
        if h.bool() {
            let limit = spec.drop_limit().as_millis() as u64;
            spec.term = ms(&mut h, 0, limit.saturating_mul(2).max(1));
        }
    }
    // A store that takes its time to write, from a
    // generator of its own as the quarantine's.
    let mut st = fastrand::Rng::with_seed(seed ^ 0x5707_e1a7);
    if st.bool() {
        spec.store_latency = ms(&mut st, 1, 200);
    }
    // A server that dies as a node hears of a new round, and a replica
    // that takes over from the store.
    if st.u8(..4) == 0 {
        let at = ms(&mut st, 500, 10_000);
        let back = ms(&mut st, 100, 3000);
        faults.push((at, Fault::CrashOnRoundChange(back)));
        healed = healed.max(at + back + Duration::from_secs(10));
    }
    faults.sort_by_key(|f| f.0);
    Plan {
        spec,
        nodes,
        faults,
        healed,
        calm: false,
    }
}

/// Bugs planted in a run, to show the invariants catch them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Planted {
    /// Every node runs with fencing off.
    pub fence: bool,
    /// The server ends every bench as soon as it begins (seeds without a
    /// quarantine are unaffected).
    pub quarantine: bool,
    /// The server sends a change's events before its store holds the
    /// change (`Registry::delivering_before_durable`).
    pub commit: bool,
}

/// Runs `seed`; `broken_fence`: every node runs with fencing off (the
/// planted bug); `trace`: keep every trace line.
pub fn run(seed: u64, broken_fence: bool, trace: bool) -> Report {
    let planted = Planted {
        fence: broken_fence,
        quarantine: false,
        commit: false,
    };
    run_with(seed, planted, trace)
}

/// Runs `seed` with the `planted` bugs; `trace`: keep every trace line.
pub fn run_with(seed: u64, planted: Planted, trace: bool) -> Report {
    let broken_fence = planted.fence;
    let Plan {
        mut spec,
        nodes,
        faults,
        healed,
        calm,
    } = plan(seed);
    spec.broken_quarantine = planted.quarantine;
    spec.broken_commit = planted.commit;
    let (spec_static, nproc) = (spec.static_ranks, spec.nproc);
    let mut summary = format!(
        "seed {seed}: {}..{} nodes{} ({} agents) × {} workers, max_restarts {}, drop limit {:?}, outage {:?}{}, run {:?}{}\n",
        spec.min_nodes,
        spec.max_nodes,
        match spec.multiple_of {
            0 | 1 => String::new(),
            k => format!(" in multiples of {k}"),
        },
        nodes,
        spec.nproc,
        spec.max_restarts,
        spec.drop_limit(),
        spec.outage,
        if calm { " (calm: no worker may stop)" } else { "" },
        spec.run.unwrap_or_default(),
        match &spec.quarantine {
            Some(q) => format!(", quarantine after {} for {:?}", q.after, q.hold),
            None => String::new(),
        }
    );
    for (at, f) in &faults {
        summary.push_str(&format!("  at {:.3}s: {f:?}\n", at.as_secs_f64()));
    }
    let mut w = World::new(spec, seed);
    // Planted bugs stop workers on purpose.
    w.checker.calm = calm && !planted.fence && !planted.quarantine && !planted.commit;
    w.tracing = trace;
    if trace {
        w.full_trace = Some(Vec::new());
    }
    let fault_count = faults.len();
    w.schedule = faults;
    // Topology paths from a generator of their own, so a seed's plan (and
    // every finding recorded by seed) is what it was before paths existed.
    let mut paths = fastrand::Rng::with_seed(seed ^ 0x7090_1060);
    for i in 0..nodes {
        let rank = spec_static.then_some(i as u32);
        let path = ["", "r1", "r2", "z/r10"][paths.usize(..4)].to_owned();
        w.add_node_with(broken_fence, nproc, rank, path);
    }
    let limit = healed + BOUND;
    w.run_while(limit, |w| w.all_done() && w.schedule.is_empty());
    let mut checker = std::mem::take(&mut w.checker);
    checker.finish(&w);
    w.checker = checker;
    summary.push_str(&format!(
        "  ended at {:.3}s: job {:?}; agents: {}\n",
        w.now().as_secs_f64(),
        w.outcome(),
        w.nodes
            .iter()
            .map(|n| format!("{} {:?}", n.name, n.end.as_ref().map(|e| e.code())))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Report {
        seed,
        violations: w.checker.violations.clone(),
        summary,
        trace: w.full_trace.take(),
        outcome: w.checker.outcome.as_ref().map(Result::is_ok),
        faults: fault_count,
        took: w.now(),
        goodput: w.with_job(|j| j.time_spent(w.instant(w.now()))),
    }
}
