//! The invariants, checked on the recorded history: pure functions of the
//! workers' records, the faults the harness injected and what it saw at the
//! end. Each returns the violations it found, each with the slice of the
//! history that shows it.
//!
//! * (a) fencing: no two live workers ever hold the same global rank of
//!   one job. Live is what a worker wrote: a worker whose last line is later
//!   than the start of another worker with its rank (another pid, same job)
//!   ran beside it. No false positives: a process writes nothing once dead;
//!   an overlap shorter than a heartbeat (50 ms) may go unseen.
//! * (b) rounds: in every round (restart count, store address, WORLD_SIZE)
//!   every rank is below WORLD_SIZE and held once, ranks follow the node
//!   layout (`GROUP_RANK * nproc + LOCAL_RANK`), a node rank is one node's;
//!   the round the job finished in has every rank `0..WORLD_SIZE`.
//! * (c) the restart budget (recording job, whose workers fail only when
//!   killed): every counted restart k (TORCHELASTIC_RESTART_COUNT = k seen
//!   by a worker) follows an injected `kill -9` of a worker that ran with
//!   count k-1 (budget spent only by worker failures; a failed round is one
//!   restart however many of its workers were killed), and every isolated
//!   kill (no other fault active within [`SETTLE`] of it) of a worker of the
//!   newest round is followed by the next count (spent once per failure).
//! * (d) liveness: after the last fault heals, the job runs (a round with
//!   every rank live) within the stated bound, and finishes once told to:
//!   every agent exits 0 in time; no agent ends otherwise meanwhile.
//! * (e) no process of the job is left once its agents are gone (the run
//!   scans /proc for the job's mark in the environment).
//! * (f) the DDP job's final parameters equal an uninterrupted run's.
//! * (g) in a run whose faults are all of the control plane (replicas,
//!   etcd, their links: `--faults control-plane` and the etcd scenarios),
//!   no worker stopped or restarted: the recording job ran one round, every
//!   worker of it until told to finish; each DDP rank's last process
//!   trained from step 0 with restart count 0.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

use super::history::{Exit, Injected, RoundKey, Worker};
use super::schedule::{Fault, Job};

/// Seconds around a worker kill in which no other fault may be active for
/// it to count as isolated (invariant (c)).
pub const SETTLE: f64 = 5.0;

/// A broken invariant.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// Which: `a` to `f`.
    pub invariant: char,
    /// What broke, in a sentence.
    pub what: String,
    /// The history that shows it.
    pub slice: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "violation ({}): {}", self.invariant, self.what)?;
        for l in &self.slice {
            writeln!(f, "    {l}")?;
        }
        Ok(())
    }
}

/// (a): no two live workers hold one global rank of one job.
pub fn fencing(workers: &[Worker]) -> Vec<Violation> {
    let mut by_rank: BTreeMap<(&str, u32), Vec<&Worker>> = BTreeMap::new();
    for w in workers {
        by_rank.entry((&w.job, w.rank)).or_default().push(w);
    }
    let mut out = Vec::new();
    for ((job, rank), mut ws) in by_rank {
        ws.sort_by(|a, b| a.start.total_cmp(&b.start));
        for (i, old) in ws.iter().enumerate() {
            for new in &ws[i + 1..] {
                if new.pid != old.pid && old.last > new.start {
                    out.push(Violation {
                        invariant: 'a',
                        what: format!(
                            "two live workers held rank {rank} of job {job}: pid {} wrote {:.3} s after pid {} started",
                            old.pid,
                            old.last - new.start,
                            new.pid
                        ),
                        slice: vec![old.describe(), new.describe()],
                    });
                }
            }
        }
    }
    out
}

/// Every round's workers.
pub fn rounds(workers: &[Worker]) -> BTreeMap<RoundKey, Vec<&Worker>> {
    let mut out: BTreeMap<RoundKey, Vec<&Worker>> = BTreeMap::new();
    for w in workers {
        out.entry(w.round()).or_default().push(w);
    }
    out
}

/// (b): every round's ranks unique, below WORLD_SIZE, in the node layout;
/// the finished round complete. `nproc`: workers per node.
pub fn round_ranks(workers: &[Worker], nproc: u32) -> Vec<Violation> {
    let mut out = Vec::new();
    for (key, ws) in rounds(workers) {
        let slice = || ws.iter().map(|w| w.describe()).collect::<Vec<_>>();
        let mut problems = Vec::new();
        let mut held: BTreeMap<u32, u32> = BTreeMap::new();
        let mut node_of: BTreeMap<u32, &str> = BTreeMap::new();
        for w in &ws {
            if w.rank >= w.world {
                problems.push(format!(
                    "rank {} is not below WORLD_SIZE {}",
                    w.rank, w.world
                ));
            }
            if w.local_rank >= nproc || w.rank != w.group_rank * nproc + w.local_rank {
                problems.push(format!(
                    "rank {} is not GROUP_RANK {} * {nproc} + LOCAL_RANK {}",
                    w.rank, w.group_rank, w.local_rank
                ));
            }
            if let Some(other) = held.insert(w.rank, w.pid) {
                problems.push(format!(
                    "rank {} held by pids {other} and {}",
                    w.rank, w.pid
                ));
            }
            match node_of.insert(w.group_rank, &w.node) {
                Some(n) if n != w.node => problems.push(format!(
                    "node rank {} given to {n} and {}",
                    w.group_rank, w.node
                )),
                _ => {}
            }
        }
        let finished = ws.iter().any(|w| w.ended);
        let all: BTreeSet<u32> = (0..key.3).collect();
        let seen: BTreeSet<u32> = held.keys().copied().collect();
        if finished && seen != all {
            problems.push(format!(
                "the job finished in this round, but its ranks are {seen:?}, not 0..{}",
                key.3
            ));
        }
        problems.dedup();
        for p in problems {
            out.push(Violation {
                invariant: 'b',
                what: format!(
                    "round (job {}, restart {}, store {}, WORLD_SIZE {}): {p}",
                    key.0, key.1, key.2, key.3
                ),
                slice: slice(),
            });
        }
    }
    out
}

/// (c): the restart budget is spent by worker failures only, once per
/// failed round. `workers`: the recording job's.
pub fn budget(workers: &[Worker], injected: &[Injected]) -> Vec<Violation> {
    let mut out = Vec::new();
    let kills: Vec<&Injected> = injected
        .iter()
        .filter(|i| {
            matches!(i.fault, Fault::KillWorker { job: Job::Rec, .. }) && i.victim.is_some()
        })
        .collect();
    let killed_counts: BTreeSet<u32> = kills
        .iter()
        .filter_map(|i| i.victim.as_ref().map(|v| v.restart))
        .collect();
    let counts: BTreeSet<u32> = workers.iter().map(|w| w.restart).collect();
    let top = counts.iter().copied().max().unwrap_or(0);
    let first_start = |k: u32| {
        workers
            .iter()
            .filter(|w| w.restart == k)
            .map(|w| w.start)
            .min_by(f64::total_cmp)
    };
    for k in 1..=top {
        if !killed_counts.contains(&(k - 1)) {
            let from = first_start(k - 1).unwrap_or(0.0);
            let to = first_start(k).unwrap_or(f64::MAX);
            let mut slice: Vec<String> = workers
                .iter()
                .filter(|w| (w.restart == k || w.restart + 1 == k) && w.start >= from - 1.0)
                .take(12)
                .map(|w| w.describe())
                .collect();
            slice.extend(
                injected
                    .iter()
                    .filter(|i| i.at <= to && i.healed >= from - SETTLE)
                    .map(|i| format!("fault at {:.3}: {} (healed {:.3})", i.at, i.fault, i.healed)),
            );
            out.push(Violation {
                invariant: 'c',
                what: format!(
                    "restart {k} was counted, but no worker that ran with restart count {} was killed: the budget was spent by something other than a worker failure",
                    k - 1
                ),
                slice,
            });
        }
    }
    for kill in &kills {
        let Some(v) = &kill.victim else { continue };
        let isolated = injected.iter().all(|o| {
            std::ptr::eq(o, *kill)
                || o.skipped.is_some()
                || o.healed + SETTLE < kill.at
                || o.at > kill.at + SETTLE
        });
        let newest = workers
            .iter()
            .filter(|w| w.start <= kill.at)
            .map(|w| w.restart)
            .max()
            .unwrap_or(0);
        if isolated && v.restart == newest && !counts.contains(&(v.restart + 1)) {
            out.push(Violation {
                invariant: 'c',
                what: format!(
                    "worker pid {} (rank {}, restart {}) was killed at {:.3} with no other fault near, but restart {} never came",
                    v.pid,
                    v.rank,
                    v.restart,
                    kill.at,
                    v.restart + 1
                ),
                slice: workers
                    .iter()
                    .filter(|w| w.restart == v.restart)
                    .take(12)
                    .map(|w| w.describe())
                    .collect(),
            });
        }
    }
    out
}

/// Complete rounds (every rank `0..WORLD_SIZE` started) as (running from:
/// the last start, running until: the first last line).
pub fn running_spans(workers: &[Worker]) -> Vec<(f64, f64)> {
    rounds(workers)
        .into_iter()
        .filter_map(|(key, ws)| {
            let ranks: BTreeSet<u32> = ws.iter().map(|w| w.rank).collect();
            (ranks.len() as u32 == key.3 && ranks.iter().all(|&r| r < key.3)).then(|| {
                let from = ws.iter().map(|w| w.start).fold(f64::MIN, f64::max);
                let until = ws.iter().map(|w| w.last).fold(f64::MAX, f64::min);
                (from, until)
            })
        })
        .filter(|(from, until)| from <= until)
        .collect()
}

/// The first time at or after `since` when the job runs (a complete round
/// with every worker live), if it does.
pub fn running_at(workers: &[Worker], since: f64) -> Option<f64> {
    running_spans(workers)
        .into_iter()
        .filter(|&(_, until)| until >= since)
        .map(|(from, _)| from.max(since))
        .min_by(f64::total_cmp)
}

/// How a job's agents ended, for (d).
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// The job.
    pub job: String,
    /// When the last fault healed.
    pub last_heal: f64,
    /// How long after it the job must run again.
    pub run_bound: f64,
    /// When the job was told to finish (the recording job), or `None`
    /// (it finishes by itself: the DDP job).
    pub told_at: Option<f64>,
    /// How long after `told_at` (or `last_heal`) every agent must have exited 0.
    pub finish_bound: f64,
    /// Every agent's last incarnation: who, and when and how it ended (`None`: still running).
    pub agents: Vec<(String, Option<(f64, i32)>)>,
    /// Daemons of the job that ended by themselves before the end (not killed by the harness).
    pub early: Vec<Exit>,
}

/// (d): after the last heal the job runs within the bound and finishes.
/// `workers`: the job's records (empty for a job that records none: only
/// its ending is checked).
pub fn liveness(workers: &[Worker], e: &Ending) -> Vec<Violation> {
    let mut out = Vec::new();
    let slice = || {
        let mut s: Vec<String> = workers
            .iter()
            .filter(|w| w.last >= e.last_heal - 1.0)
            .take(16)
            .map(|w| w.describe())
            .collect();
        s.extend(e.agents.iter().map(|(who, end)| match end {
            Some((t, code)) => format!("{who} exited {code} at {t:.3}"),
            None => format!("{who} still running"),
        }));
        s
    };
    if !workers.is_empty() {
        match running_at(workers, e.last_heal) {
            Some(t) if t - e.last_heal <= e.run_bound => {}
            found => out.push(Violation {
                invariant: 'd',
                what: format!(
                    "job {} did not run within {:.0} s of the last heal at {:.3} ({})",
                    e.job,
                    e.run_bound,
                    e.last_heal,
                    match found {
                        Some(t) => format!("it ran {:.3} s after", t - e.last_heal),
                        None => "it never ran again".into(),
                    }
                ),
                slice: slice(),
            }),
        }
    }
    for x in e.early.iter().filter(|x| !x.ok) {
        out.push(Violation {
            invariant: 'd',
            what: format!(
                "{} ended by itself ({}) at {:.3}, before the job was over",
                x.who, x.status, x.at
            ),
            slice: slice(),
        });
    }
    let from = e.told_at.unwrap_or(e.last_heal);
    for (who, end) in &e.agents {
        // An agent whose end was already reported as early is not reported twice.
        let said = e.early.iter().any(|x| !x.ok && &x.who == who)
            && end.is_some_and(|(_, code)| code != 0);
        if said {
            continue;
        }
        let bad = match end {
            Some((t, 0)) if *t - from <= e.finish_bound => None,
            Some((t, 0)) => Some(format!("exited 0 only {:.3} s after", t - from)),
            Some((_, code)) => Some(format!("exited {code}")),
            None => Some(format!("was still running {:.0} s after", e.finish_bound)),
        };
        if let Some(bad) = bad {
            out.push(Violation {
                invariant: 'd',
                what: format!(
                    "{who} of job {} {bad} the job was {} at {from:.3}",
                    e.job,
                    if e.told_at.is_some() {
                        "told to finish"
                    } else {
                        "healed"
                    }
                ),
                slice: slice(),
            });
        }
    }
    out
}

/// (e): processes of the job still there after its agents ended.
pub fn leftovers(processes: &[String]) -> Vec<Violation> {
    processes
        .iter()
        .map(|p| Violation {
            invariant: 'e',
            what: "a process of the job outlived its agents".into(),
            slice: vec![p.clone()],
        })
        .collect()
}

/// (f): the DDP job's final parameters (`final_<rank>.json` of each rank)
/// equal the uninterrupted run's.
pub fn same_parameters(through: &[Option<Value>], clean: &[Option<Value>]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (rank, (t, c)) in through.iter().zip(clean).enumerate() {
        let what = match (t, c) {
            (Some(t), Some(c)) if t["params"] == c["params"] && t["params"].is_array() => continue,
            (Some(t), Some(_)) => format!(
                "rank {rank}'s final parameters differ from the uninterrupted run's (restart {}, resumed at step {})",
                t["restart"], t["start"]
            ),
            (None, _) => format!("rank {rank} wrote no final parameters"),
            (_, None) => format!("the uninterrupted run's rank {rank} wrote no final parameters"),
        };
        out.push(Violation {
            invariant: 'f',
            what,
            slice: Vec::new(),
        });
    }
    out
}

/// (g): no worker stopped or restarted. `workers`: the recording job's;
/// `ddp`: each DDP rank's final record, where the DDP job ran.
pub fn untouched(workers: &[Worker], ddp: &[Option<Value>]) -> Vec<Violation> {
    let mut out = Vec::new();
    let rounds = rounds(workers);
    if rounds.len() > 1 {
        out.push(Violation {
            invariant: 'g',
            what: format!(
                "the recording job ran {} rounds under control-plane faults alone (one expected)",
                rounds.len()
            ),
            slice: rounds
                .values()
                .filter_map(|ws| ws.first().map(|w| w.describe()))
                .collect(),
        });
    }
    let stopped: Vec<String> = workers
        .iter()
        .filter(|w| !w.ended)
        .map(Worker::describe)
        .collect();
    if !stopped.is_empty() {
        out.push(Violation {
            invariant: 'g',
            what: format!(
                "{} worker(s) stopped before the job was told to finish, under control-plane faults alone",
                stopped.len()
            ),
            slice: stopped,
        });
    }
    for (rank, f) in ddp.iter().enumerate() {
        if let Some(f) = f {
            if f["restart"] != 0 || f["start"] != 0 {
                out.push(Violation {
                    invariant: 'g',
                    what: format!(
                        "DDP rank {rank} was restarted under control-plane faults alone (its last process: restart {}, resumed at step {})",
                        f["restart"], f["start"]
                    ),
                    slice: Vec::new(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::history::Victim;
    use super::*;

    /// A worker of job `rec`, 2 per node, store `m`, that ran `start..last`.
    fn w(rank: u32, world: u32, restart: u32, m: &str, pid: u32, start: f64, last: f64) -> Worker {
        Worker {
            job: "rec".into(),
            rank,
            world,
            local_rank: rank % 2,
            group_rank: rank / 2,
            restart,
            master: m.into(),
            pid,
            node: format!("node{}", rank / 2),
            start,
            last,
            ended: false,
        }
    }

    /// A clean history: round 0 (4 ranks) until 10 s, a kill of rank 1 at
    /// 10, round 1 from 10.5 to 20, ended.
    fn clean() -> (Vec<Worker>, Vec<Injected>) {
        let mut ws: Vec<Worker> = (0..4)
            .map(|r| w(r, 4, 0, "a:1", 100 + r, 1.0, 10.0))
            .collect();
        ws.extend((0..4).map(|r| {
            let mut x = w(r, 4, 1, "a:2", 200 + r, 10.5, 20.0);
            x.ended = true;
            x
        }));
        let kill = Injected {
            fault: Fault::KillWorker {
                job: Job::Rec,
                pick: 1,
            },
            at: 10.0,
            healed: 10.0,
            victim: Some(Victim {
                pid: 101,
                restart: 0,
                rank: 1,
            }),
            skipped: None,
        };
        (ws, vec![kill])
    }

    #[test]
    fn a_clean_history_breaks_nothing() {
        let (ws, inj) = clean();
        assert_eq!(fencing(&ws), []);
        assert_eq!(round_ranks(&ws, 2), []);
        assert_eq!(budget(&ws, &inj), []);
        assert_eq!(running_at(&ws, 12.0), Some(12.0));
        assert_eq!(running_at(&ws, 10.2), Some(10.5));
    }

    #[test]
    fn an_old_worker_beating_after_a_new_one_of_its_rank_started_is_caught() {
        let (mut ws, _) = clean();
        // Node 1 was cut off and not fenced: its round-0 rank 2 still beat at 11.
        ws[2].last = 11.0;
        let v = fencing(&ws);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("rank 2 of job rec"), "{}", v[0]);
        assert_eq!(v[0].slice.len(), 2);
        // Another job's rank 2, or the same worker, is no violation.
        let (mut ws, _) = clean();
        ws[6].job = "other".into();
        ws[2].last = 11.0;
        assert_eq!(fencing(&ws[..7]).len(), 0);
    }

    #[test]
    fn a_round_with_a_duplicate_a_gap_or_a_wrong_layout_is_caught() {
        let (mut ws, _) = clean();
        ws[7].rank = 2; // round 1 has rank 2 twice and no rank 3
        ws[7].local_rank = 0;
        let v = round_ranks(&ws, 2);
        let text: Vec<_> = v.iter().map(|v| v.what.clone()).collect();
        assert!(
            text.iter()
                .any(|t| t.contains("rank 2 held by pids 202 and 203")),
            "{text:?}"
        );
        assert!(text.iter().any(|t| t.contains("not 0..4")), "{text:?}");
        let (mut ws, _) = clean();
        ws[1].rank = 5;
        let v = round_ranks(&ws, 2);
        assert!(
            v.iter().any(|v| v.what.contains("not below WORLD_SIZE")),
            "{v:?}"
        );
        // An unfinished round may miss ranks (its start was cut short).
        let (ws, _) = clean();
        assert_eq!(round_ranks(&ws[..3], 2), []);
    }

    #[test]
    fn a_restart_without_a_killed_worker_or_a_kill_without_a_restart_is_caught() {
        let (ws, inj) = clean();
        // A restart counted with no kill: a fenced stop taken for a failure.
        let v = budget(&ws, &[]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("restart 1 was counted"), "{}", v[0]);
        // A kill that was never followed by its restart.
        let v = budget(&ws[..4], &inj);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("restart 1 never came"), "{}", v[0]);
        // A kill of the DDP job's worker is not the recording job's failure.
        let mut ddp = inj.clone();
        ddp[0].fault = Fault::KillWorker {
            job: Job::Ddp,
            pick: 1,
        };
        assert_eq!(budget(&ws, &ddp).len(), 1);
        assert_eq!(budget(&ws[..4], &ddp), []);
        // ... unless another fault was near (its effect is then not defined).
        let mut two = inj.clone();
        two.push(Injected {
            fault: Fault::Isolate(super::super::schedule::Host::Node(1)),
            at: 8.0,
            healed: 9.0,
            victim: None,
            skipped: None,
        });
        assert_eq!(budget(&ws[..4], &two), []);
    }

    #[test]
    fn liveness_needs_a_run_within_the_bound_and_every_agent_to_exit_0() {
        let (ws, _) = clean();
        let ending = Ending {
            job: "rec".into(),
            last_heal: 10.0,
            run_bound: 5.0,
            told_at: Some(19.0),
            finish_bound: 5.0,
            agents: vec![
                ("agent0/rec".into(), Some((20.0, 0))),
                ("agent1/rec".into(), Some((21.0, 0))),
            ],
            early: Vec::new(),
        };
        assert_eq!(liveness(&ws, &ending), []);
        let late = Ending {
            last_heal: 10.1,
            run_bound: 0.2,
            ..ending.clone()
        };
        assert!(liveness(&ws, &late)[0].what.contains("did not run within"));
        let mut stuck = ending.clone();
        stuck.agents[1].1 = None;
        stuck.agents.push(("agent2/rec".into(), Some((12.0, 1))));
        stuck.early.push(Exit {
            who: "agent2/rec".into(),
            at: 12.0,
            status: "exit 1".into(),
            ok: false,
        });
        let v = liveness(&ws, &stuck);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().any(|v| v.what.contains("still running")));
        assert!(v
            .iter()
            .any(|v| v.what.contains("ended by itself (exit 1)")));
        // Never ran again after the heal.
        assert!(liveness(
            &ws,
            &Ending {
                last_heal: 30.0,
                ..ending
            }
        )[0]
        .what
        .contains("never ran again"));
    }

    #[test]
    fn leftovers_and_different_parameters_are_caught() {
        assert_eq!(leftovers(&[]), []);
        assert_eq!(leftovers(&["pid 9 python3".into()])[0].invariant, 'e');
        let p = |x: &str| Some(serde_json::json!({"params": [x], "restart": 1, "start": 5}));
        assert_eq!(same_parameters(&[p("0x1p0")], &[p("0x1p0")]), []);
        assert_eq!(same_parameters(&[p("0x1p0")], &[p("0x1p1")]).len(), 1);
        assert_eq!(same_parameters(&[None], &[p("0x1p1")]).len(), 1);
    }

    #[test]
    fn a_stopped_or_restarted_worker_breaks_g() {
        let (ws, _) = clean();
        // Two rounds, and the first round's workers never ended.
        let found = untouched(&ws, &[]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|v| v.invariant == 'g'));
        let one: Vec<Worker> = ws[4..].to_vec();
        assert_eq!(untouched(&one, &[]), []);
        let f = |restart: u32, start: u32| {
            Some(serde_json::json!({"params": [], "restart": restart, "start": start}))
        };
        assert_eq!(untouched(&one, &[f(0, 0), f(0, 0), None]), []);
        assert_eq!(untouched(&one, &[f(0, 0), f(1, 0)]).len(), 1);
        assert_eq!(untouched(&one, &[f(0, 12)]).len(), 1);
    }
}
