//! Scenario scripts: one command a line, run in order on one [`World`].
//!
//! ```text
//! # comments and blank lines are skipped
//! job nnodes=2:3 nproc=2 max_restarts=1   # first: the job and timings
//! add-nodes 3                             # n1, n2, n3 join now
//! tick 5s                                 # let 5 s of virtual time pass
//! expect round 1 world 6 ranks contiguous
//! fail-worker n2 r1                       # n2's local rank 1 exits 1
//! run-until round=2 phase=running within 10s
//! expect restarts 1
//! ```
//!
//! Commands:
//! - `job KEY=VALUE...`: `nnodes=N|MIN:MAX`, `nproc`, `max_restarts`,
//!   `keep_alive`, `attempts` (the drop limit is their product), `last_call`,
//!   `join_timeout`, `grace` (reconnect), `barrier`, `shutdown`,
//!   `backoff=BASE[:MAX]` (`0`: off, the default), `window`,
//!   `run=DURATION|forever` (how long workers run; default until told),
//!   `term` (how long a worker takes to stop on SIGTERM), `latency`,
//!   `static` (node `nK` asks for node rank K-1), `failover`
//!   (`restart-server` restores the job from its record),
//!   `quarantine=AFTER:WINDOW:HOLD[:stragglers]` (the server's
//!   `--quarantine-after`, `--quarantine-window`, `--quarantine-for`, and
//!   `--straggler-quarantine`), `slow=nK` (node K's ranks report half as
//!   much time again per step: a straggler), `store_latency` (with
//!   `failover`: how long the store takes to write a change; its events
//!   wait for it), `broken-commit` (the planted bug: a change's events go
//!   out before the store holds it), `broken-quarantine` (the
//!   planted bug: the server ends every bench as soon as it begins),
//!   `outage` (the agents' `outage_timeout`: how long the peer hub may keep
//!   workers without the rendezvous; default five drop limits, `0`: agents
//!   without a peer hub), `seed`.
//! - `add-nodes N [broken-fence]`, `add-node [broken-fence] [nproc=K]
//!   [rank=R] [topology=PATH]`: agents join now; `broken-fence` builds their
//!   machine without fencing (the planted bug); `nproc`, `rank` (static) and
//!   `topology` give one node its own `--nproc-per-node`, `--node-rank` and
//!   `--topology`.
//! - `fail-worker NODE rK [code=C]`: local rank K exits with C (default 1).
//! - `finish [NODE]`: the live workers of NODE (or of every node) exit 0.
//! - `flaky NODE N`: NODE's local rank 0 exits 1 shortly after each of its
//!   next N rounds starts (a machine that keeps failing).
//! - `release NODE`: an operator ends the bench of NODE's host.
//! - `crash-node NODE`, `restart-node NODE` (a new node id, same host),
//!   `signal NODE [TERM|INT|HUP|KILL]`.
//! - `partition NODE|all` (cut off from everything: the server and the
//!   round's peer hub), `cut-server NODE|all` (from the server only; `all`:
//!   the server is cut off from every node), `cut-peers NODE|all` (from the
//!   peer hub only: its pings and the hub's answers are lost; a hub node
//!   still hears its own), `heal [NODE|all]` (every link; default all),
//!   `heal-server NODE|all`, `heal-peers NODE|all`, `delay NODE|all DURATION`,
//!   `drop NODE|all PROBABILITY [answers]` (the node's calls are lost, so
//!   never answered; with `answers`, the server's answers are lost: the
//!   calls took effect).
//! - `crash-server`, `restart-server [relearn|failover]`, `pause-server`
//!   (SIGSTOP: calls wait unread, nothing is answered or dropped),
//!   `resume-server` (a pause over a second gives every node the whole drop
//!   limit, as the registry's `woke`).
//! - `tick DURATION`, `run-until CONDITIONS [within DURATION]` (default
//!   within 600 s; fails if they never hold).
//! - `expect CONDITIONS`.
//!
//! Conditions are `KEY VALUE` pairs (or `KEY=VALUE`; `KEY~TEXT`: contains):
//! `phase` (forming, running, succeeded, failed), `round`, `world`,
//! `restarts`, `members`, `started` (workers started in all), `stopped`
//! (live workers their agents stopped, in all), `benched`
//! (hosts the job benched, by name, comma-separated), `reason~TEXT`
//! (the job's failure), `ranks contiguous` (the live workers are of the
//! current round and hold exactly `0..world`), `done` (every agent's life is over), and per node
//! `NODE.state` (joining, forming, running, recovering, reconnecting,
//! backing-off, stopping, exited, crashed), `NODE.exit` (its exit code),
//! `NODE.rank` (its node rank while workers run), `NODE.workers` (live
//! workers), `NODE.error~TEXT`, `NODE.summary~TEXT` (its failure summary's
//! root cause).
//!
//! Any invariant violation fails the script at the command that caused it.

use std::collections::BTreeSet;
use std::time::Duration;

use accel_agent::Outcome;
use nix::sys::signal::Signal;

use crate::world::{End, Fault, Spec, World};

/// A script that failed: where, why, and what happened last.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: `{command}`: {why}\nrecent events:\n{trace}")]
pub struct ScriptError {
    /// The script's name.
    pub file: String,
    /// The line (1-based).
    pub line: usize,
    /// The command.
    pub command: String,
    /// What went wrong.
    pub why: String,
    /// The last trace lines.
    pub trace: String,
}

/// Parses a duration: `5s`, `200ms`, `1.5s`, `2m`, or plain seconds.
pub fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => s.split_at(at),
        None => (s, "s"),
    };
    let v: f64 = num.parse().map_err(|_| format!("bad duration `{s}`"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("bad duration unit in `{s}` (ms, s, m)")),
    };
    if !(0.0..1e9).contains(&secs) {
        return Err(format!("bad duration `{s}`"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => break,
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn number<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("`{v}` is not a number"))
}

fn job_spec(args: &[String]) -> Result<(Spec, u64), String> {
    let mut spec = Spec::default();
    let mut seed = 0;
    let mut outage = None;
    for a in args {
        let (k, v) = a.split_once('=').unwrap_or((a.as_str(), ""));
        match k {
            "nnodes" => {
                let (min, max) = v.split_once(':').unwrap_or((v, v));
                spec.min_nodes = number(min)?;
                spec.max_nodes = number(max)?;
            }
            "multiple_of" => spec.multiple_of = number(v)?,
            "settle" => spec.settle = duration(v)?,
            "nproc" => spec.nproc = number(v)?,
            "max_restarts" => spec.max_restarts = number(v)?,
            "keep_alive" => spec.keep_alive = duration(v)?,
            "attempts" => spec.attempts = number(v)?,
            "last_call" => spec.last_call = duration(v)?,
            "join_timeout" => spec.join_timeout = duration(v)?,
            "grace" => spec.grace = duration(v)?,
            "barrier" => spec.barrier = duration(v)?,
            "shutdown" => spec.shutdown = duration(v)?,
            "backoff" => {
                let (b, m) = v.split_once(':').unwrap_or((v, "30s"));
                spec.backoff.base = duration(b)?;
                spec.backoff.max = duration(m)?;
            }
            "window" => spec.backoff.window = duration(v)?,
            "run" if v == "forever" => spec.run = None,
            "run" => spec.run = Some(duration(v)?),
            "term" => spec.term = duration(v)?,
            "latency" => spec.latency = duration(v)?,
            "static" => spec.static_ranks = true,
            "failover" => spec.failover = true,
            "quarantine" => {
                let mut parts = v.split(':');
                let mut next = || {
                    parts
                        .next()
                        .ok_or("quarantine=AFTER:WINDOW:HOLD[:stragglers]")
                };
                spec.quarantine = Some(rendezvous_server::job::QuarantinePolicy {
                    after: number(next()?)?,
                    window: duration(next()?)?,
                    hold: duration(next()?)?,
                    stragglers: parts.next() == Some("stragglers"),
                });
            }
            "slow" => {
                let k: usize = number(v.trim_start_matches('n'))?;
                spec.slow = Some(k.checked_sub(1).ok_or("slow=nK, K from 1")?);
            }
            "broken-quarantine" => spec.broken_quarantine = true,
            "store_latency" => spec.store_latency = duration(v)?,
            "broken-commit" => spec.broken_commit = true,
            "outage" => outage = Some(duration(v)?),
            "seed" => seed = number(v)?,
            _ => return Err(format!("unknown job setting `{k}`")),
        }
    }
    // Five drop limits unless said (`0`: agents without a peer hub).
    spec.outage = outage.unwrap_or(spec.drop_limit() * 5);
    if spec.min_nodes == 0 || spec.min_nodes > spec.max_nodes || spec.nproc == 0 {
        return Err("need 0 < MIN <= MAX and nproc > 0".into());
    }
    Ok((spec, seed))
}

fn node(w: &World, name: &str) -> Result<usize, String> {
    w.node_index(name)
        .ok_or_else(|| format!("no node `{name}` (nodes are n1, n2, ... in order of adding)"))
}

fn nodes(w: &World, name: &str) -> Result<Vec<usize>, String> {
    match name {
        "all" => Ok((0..w.nodes.len()).collect()),
        n => Ok(vec![node(w, n)?]),
    }
}

/// Conditions as `(key, op, value)`, op `=` or `~`.
fn conditions(args: &[String]) -> Result<Vec<(String, char, String)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "done" {
            out.push(("done".into(), '=', String::new()));
            continue;
        }
        if let Some(at) = a.find(['=', '~']) {
            let op = a[at..].chars().next().unwrap_or('=');
            out.push((a[..at].to_owned(), op, a[at + 1..].to_owned()));
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("`{a}` needs a value"))?
            .clone();
        out.push((a.clone(), '=', v));
    }
    Ok(out)
}

fn check(w: &World, (key, op, want): &(String, char, String)) -> Result<(), String> {
    let job = |f: &dyn Fn(&rendezvous_server::job::Job) -> String| {
        w.with_job(f).unwrap_or_else(|| "gone".into())
    };
    let got: String = match key.as_str() {
        "done" => {
            return match w.all_done() {
                true => Ok(()),
                false => Err("not every agent is done".into()),
            }
        }
        "phase" => job(&|j| j.phase().name().into()),
        "round" => job(&|j| j.round().to_string()),
        "restarts" => job(&|j| j.restart_count().to_string()),
        "members" => job(&|j| j.members().len().to_string()),
        "benched" => job(&|j| {
            let hosts: Vec<&str> = j.quarantine().benched().map(|(h, _)| h.as_str()).collect();
            hosts.join(",")
        }),
        "world" => w.world_size().to_string(),
        "started" => w.checker.started.to_string(),
        "stopped" => w.checker.stopped.to_string(),
        "reason" => match w.outcome() {
            Some(Err(r)) => r,
            _ => w
                .with_job(|j| j.last_failure().unwrap_or_default().to_owned())
                .unwrap_or_default(),
        },
        "ranks" => {
            // The live workers, all of the job's current round.
            let round = w.with_job(|j| j.round());
            let ranks: Vec<u32> = w
                .nodes
                .iter()
                .flat_map(|n| n.live_workers())
                .map(|x| match Some(x.round) == round {
                    true => x.rank,
                    false => u32::MAX,
                })
                .collect();
            let set: BTreeSet<u32> = ranks.iter().copied().collect();
            let whole = w.world_size() > 0
                && set.len() == ranks.len()
                && set == (0..w.world_size()).collect();
            return match (want.as_str(), whole) {
                ("contiguous", true) => Ok(()),
                ("contiguous", false) => Err(format!(
                    "live ranks {ranks:?} are not 0..{} once each",
                    w.world_size()
                )),
                _ => Err("only `ranks contiguous` is known".into()),
            };
        }
        k => {
            let (name, what) = k
                .split_once('.')
                .ok_or_else(|| format!("unknown condition `{k}`"))?;
            let n = &w.nodes[node(w, name)?];
            match what {
                "state" => n.state().into(),
                "exit" => match n.end.as_ref().and_then(End::code) {
                    Some(c) => c.to_string(),
                    None => "none".into(),
                },
                "rank" => n.node_rank.map_or("none".into(), |r| r.to_string()),
                "workers" => n.live_workers().count().to_string(),
                "error" => match &n.end {
                    Some(End::Error(_, e)) => e.clone(),
                    Some(End::Outcome(
                        Outcome::Failed(r) | Outcome::NoRestart { reason: r, .. },
                    )) => r.clone(),
                    other => format!("{other:?}"),
                },
                "summary" => n.summary.clone().unwrap_or_default(),
                _ => return Err(format!("unknown node condition `{what}`")),
            }
        }
    };
    let ok = match op {
        '~' => got.contains(want.as_str()),
        _ => got == *want,
    };
    match ok {
        true => Ok(()),
        false => Err(format!("{key}: want {op}{want:?}, got {got:?}")),
    }
}

fn check_all(w: &World, conds: &[(String, char, String)]) -> Result<(), String> {
    conds.iter().try_for_each(|c| check(w, c))
}

fn signal(name: Option<&String>) -> Result<Signal, String> {
    Ok(match name.map(String::as_str).unwrap_or("TERM") {
        "TERM" => Signal::SIGTERM,
        "INT" => Signal::SIGINT,
        "HUP" => Signal::SIGHUP,
        "KILL" => Signal::SIGKILL,
        s => return Err(format!("unknown signal `{s}`")),
    })
}

/// One command on `w`.
fn command(w: &mut World, cmd: &str, args: &[String]) -> Result<(), String> {
    let arg = |k: usize| {
        args.get(k)
            .ok_or_else(|| format!("`{cmd}` needs more arguments"))
    };
    match cmd {
        "add-nodes" => {
            let n: usize = number(arg(0)?)?;
            let broken = args.iter().any(|a| a == "broken-fence");
            for _ in 0..n {
                w.add_node(broken);
            }
        }
        "add-node" => {
            let mut nproc = w.spec.nproc;
            let mut rank = w.spec.static_ranks.then_some(w.nodes.len() as u32);
            let mut topology = String::new();
            for a in args {
                match a.split_once('=') {
                    Some(("nproc", v)) => nproc = number(v)?,
                    Some(("rank", v)) => rank = Some(number(v)?),
                    Some(("topology", v)) => topology = v.to_owned(),
                    _ if a == "broken-fence" => {}
                    _ => return Err(format!("add-node: unknown option `{a}`")),
                }
            }
            w.add_node_with(
                args.iter().any(|a| a == "broken-fence"),
                nproc,
                rank,
                topology,
            );
        }
        "fail-worker" => {
            let i = node(w, arg(0)?)?;
            let local: u32 = number(arg(1)?.trim_start_matches(['r', 'l']))?;
            let code = match args.get(2).and_then(|a| a.strip_prefix("code=")) {
                Some(c) => number(c)?,
                None => 1,
            };
            if !w.nodes[i].live_workers().any(|x| x.local_rank == local) {
                return Err(format!(
                    "{} has no live worker of local rank {local}",
                    arg(0)?
                ));
            }
            w.inject(Fault::FailWorker {
                node: i,
                local,
                code,
            });
        }
        "finish" | "succeed" => {
            let which = match args.first() {
                Some(n) => Some(node(w, n)?),
                None => None,
            };
            w.inject(Fault::Finish(which));
        }
        "flaky" => {
            let i = node(w, arg(0)?)?;
            w.inject(Fault::Flaky(i, number(arg(1)?)?));
        }
        "release" => w.inject(Fault::Release(node(w, arg(0)?)?)),
        "crash-node" => w.inject(Fault::CrashNode(node(w, arg(0)?)?)),
        "restart-node" => w.inject(Fault::RestartNode(node(w, arg(0)?)?)),
        "unhealthy" => w.inject(Fault::Unhealthy(node(w, arg(0)?)?)),
        "signal" => {
            let i = node(w, arg(0)?)?;
            w.inject(Fault::Signal(i, signal(args.get(1))?));
        }
        "partition" | "cut-server" | "cut-peers" | "heal-server" | "heal-peers" => {
            for i in nodes(w, arg(0)?)? {
                w.inject(match cmd {
                    "partition" => Fault::Partition(i),
                    "cut-server" => Fault::CutServer(i),
                    "cut-peers" => Fault::CutPeers(i),
                    "heal-server" => Fault::HealServer(i),
                    _ => Fault::HealPeers(i),
                });
            }
        }
        "heal" => {
            let which = match args.first() {
                Some(n) => nodes(w, n)?,
                None => (0..w.nodes.len()).collect(),
            };
            for i in which {
                w.inject(Fault::Heal(i));
            }
        }
        "pause-server" => w.inject(Fault::PauseServer),
        "resume-server" => w.inject(Fault::ResumeServer),
        "delay" => {
            let d = duration(arg(1)?)?;
            for i in nodes(w, arg(0)?)? {
                w.inject(Fault::Delay(i, d));
            }
        }
        "drop" => {
            let p: f64 = number(arg(1)?)?;
            let answers = args.get(2).is_some_and(|a| a == "answers");
            for i in nodes(w, arg(0)?)? {
                w.inject(match answers {
                    true => Fault::DropAnswers(i, p),
                    false => Fault::Drop(i, p),
                });
            }
        }
        "crash-server" => w.inject(Fault::CrashServer),
        "restart-server" => {
            let failover = match args.first().map(String::as_str) {
                None => w.spec.failover,
                Some("failover") => true,
                Some("relearn") => false,
                Some(o) => return Err(format!("restart-server {o}: relearn or failover")),
            };
            w.inject(Fault::RestartServer(failover));
        }
        "tick" => {
            let until = w.now() + duration(arg(0)?)?;
            w.run_until(until);
        }
        "run-until" => {
            let (conds, within) = match args.iter().position(|a| a == "within") {
                Some(at) => (&args[..at], duration(arg(at + 1)?)?),
                None => (args, Duration::from_secs(600)),
            };
            let conds = conditions(conds)?;
            let limit = w.now() + within;
            if !w.run_while(limit, |w| check_all(w, &conds).is_ok()) {
                check_all(w, &conds)?;
            }
        }
        "expect" => check_all(w, &conditions(args)?)?,
        _ => return Err(format!("unknown command `{cmd}`")),
    }
    Ok(())
}

/// Runs `text` (named `file` in errors) to its end; returns the world.
pub fn run(file: &str, text: &str) -> Result<World, Box<ScriptError>> {
    let mut world: Option<World> = None;
    let mut seen = 0;
    for (n, raw) in text.lines().enumerate() {
        let t = tokens(raw);
        let Some((cmd, args)) = t.split_first() else {
            continue;
        };
        let fail = |w: Option<&World>, why: String| {
            Box::new(ScriptError {
                file: file.to_owned(),
                line: n + 1,
                command: raw.trim().to_owned(),
                why,
                trace: w.map(World::recent).unwrap_or_default(),
            })
        };
        if cmd == "job" {
            let (spec, seed) = job_spec(args).map_err(|e| fail(None, e))?;
            world = Some(World::new(spec, seed));
            continue;
        }
        let Some(w) = world.as_mut() else {
            return Err(fail(None, "the first command must be `job`".into()));
        };
        if let Err(e) = command(w, cmd, args) {
            return Err(fail(Some(w), e));
        }
        if let Some(v) = w.violations().get(seen) {
            let why = v.to_string();
            return Err(fail(Some(w), why));
        }
        seen = w.violations().len();
    }
    let Some(mut w) = world else {
        return Err(Box::new(ScriptError {
            file: file.to_owned(),
            line: 0,
            command: String::new(),
            why: "empty script".into(),
            trace: String::new(),
        }));
    };
    if w.all_done() {
        let mut checker = std::mem::take(&mut w.checker);
        checker.finish(&w);
        w.checker = checker;
        if let Some(v) = w.violations().get(seen) {
            let lines = text.lines().count();
            return Err(Box::new(ScriptError {
                file: file.to_owned(),
                line: lines,
                command: "(end of script)".into(),
                why: v.to_string(),
                trace: w.recent(),
            }));
        }
    }
    Ok(w)
}
