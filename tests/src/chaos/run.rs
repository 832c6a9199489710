//! The run: builds the topology (`cluster.rs`), starts the jobs,
//! injects the schedule's faults at their times and heals them
//! (`faults.rs`), waits for the job to run again and tells it to
//! finish, then checks the invariants on what was recorded. A daemon the
//! harness killed is started again at the heal; one that ends by itself is
//! not (that is a finding).

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use serde_json::Value;

use super::cluster::{ddp_args, marked, now, signal, var, Cluster};
use super::faults::{heal, inject, Undo};
use super::history::{Exit, Injected, Parser, Worker};
use super::invariants::{self, Ending, Violation};
use super::report::{self, Effect};
use super::schedule::{self, Class, Daemon, Fault, Job, Mode, Planned};

/// Keep-alives: every second, three missed drop a node (the drop limit, 3 s).
pub const KEEP_ALIVE: &str = "keep_alive_interval=1,keep_alive_max_attempt=3";
/// Keep-alives of a run whose faults are all of the control plane: every
/// second, five missed (a 5 s drop limit). The round's peer hub keeps
/// workers past the drop limit only from evidence at least its lag old
/// (the rendezvous's silence bound, one and a half keep-alives, plus the
/// hub's staleness), so with a 3 s limit its word would come within a
/// third of a second of the fence; the default limit, 15 s, leaves 4.6 s.
pub const KEEP_ALIVE_CONTROL_PLANE: &str = "keep_alive_interval=1,keep_alive_max_attempt=5";
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
/// etcd's space quota in a run that fills it (`Fault::EtcdFull`), bytes:
/// room for the run's own records many times over, filled in seconds.
pub const ETCD_QUOTA: u64 = 32 << 20;

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
    /// Which faults the seed's schedule draws.
    pub faults: Class,
    /// A schedule to use instead of the seed's (tests).
    pub schedule: Option<Vec<Planned>>,
    /// Scratch directory (histories, logs, etcd data).
    pub dir: PathBuf,
    /// Where `accel-agent` and `rdzv-server` are.
    pub bins: PathBuf,
    /// A venv whose `bin/` has python with torch (for the DDP job).
    pub venv: Option<PathBuf>,
    /// The Lan's subnet `10.<net>.0.0/24` (`None`: any free one, leased
    /// as [`crate::Subnet`] says; a given one must not be leased by another run).
    pub net: Option<u8>,
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

/// A fault or a heal that is due: when, which planned fault, and (for a
/// heal) what to undo and its entry in the injected list.
type Due = (f64, usize, Option<(Undo, usize)>);

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
        .unwrap_or_else(|| schedule::schedule_of(o.faults, o.seed, o.seconds, o.mode, o.ddp));
    // etcd gets a small space quota where a fault fills it.
    let quota = plan
        .iter()
        .any(|p| p.fault == Fault::EtcdFull)
        .then_some(ETCD_QUOTA);
    let control_plane = !plan.is_empty() && plan.iter().all(|p| p.fault.control_plane());
    let keep_alive = match control_plane {
        true => KEEP_ALIVE_CONTROL_PLANE,
        false => KEEP_ALIVE,
    };
    let mut c = Cluster::start(o, quota, keep_alive);
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
    if !plan.is_empty() && plan.iter().all(|p| p.fault.control_plane()) {
        let finals = if o.ddp {
            read_finals(&c.dir.join("ddp/out"))
        } else {
            Vec::new()
        };
        violations.extend(invariants::untouched(&workers, &finals));
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
    invariants::same_parameters(&read_finals(&dir.join("ddp/out")), &read_finals(&out))
}

/// The DDP job's final records (`final_<rank>.json`) in `out`, by rank.
fn read_finals(out: &Path) -> Vec<Option<Value>> {
    (0..2)
        .map(|r| {
            fs::read_to_string(out.join(format!("final_{r}.json")))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
        })
        .collect()
}
