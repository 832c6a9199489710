//! The run's report: faults injected by kind, what each did to the
//! recording job (it kept running, or it ran again after some time, or it
//! was not running again before the next fault), recovery times
//! (p50/p99/max) and the violations.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::history::{Injected, Worker};
use super::invariants::{running_spans, Violation};

/// What a fault did to the recording job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Effect {
    /// A round that ran before the fault ran on until the next one.
    KeptRunning,
    /// A new round ran (every rank started) this long after the fault.
    Recovered(f64),
    /// Neither, before the next fault (or the end).
    NotYet,
}

/// What each fault (injected, not skipped) did: a new complete round
/// started after it and running before `next` (the next fault, or `end`),
/// or a round spanning it.
pub fn effects(workers: &[Worker], injected: &[Injected], end: f64) -> Vec<Effect> {
    let spans = running_spans(workers);
    let firsts: Vec<(f64, f64)> = super::invariants::rounds(workers)
        .values()
        .filter_map(|ws| {
            let first = ws.iter().map(|w| w.start).fold(f64::MAX, f64::min);
            running_spans(&ws.iter().map(|w| (*w).clone()).collect::<Vec<_>>())
                .first()
                .map(|&(from, _)| (first, from))
        })
        .collect();
    let live: Vec<&Injected> = injected.iter().filter(|i| i.skipped.is_none()).collect();
    live.iter()
        .enumerate()
        .map(|(n, i)| {
            let next = live.get(n + 1).map_or(end, |x| x.at);
            let recovered = firsts
                .iter()
                .filter(|&&(first, from)| first >= i.at && from <= next)
                .map(|&(_, from)| from - i.at)
                .min_by(f64::total_cmp);
            match recovered {
                Some(d) => Effect::Recovered(d),
                None if spans.iter().any(|&(f, u)| f <= i.at && u >= next - 0.2) => {
                    Effect::KeptRunning
                }
                None => Effect::NotYet,
            }
        })
        .collect()
}

/// The `q` quantile (nearest rank) of sorted `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    let i = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1;
    xs[i]
}

/// The table, as Markdown.
pub fn table(injected: &[Injected], effects: &[Effect], violations: &[Violation]) -> String {
    #[derive(Default)]
    struct Row {
        injected: usize,
        skipped: usize,
        kept: usize,
        recovered: Vec<f64>,
        not_yet: usize,
    }
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    let mut live = effects.iter();
    for i in injected {
        let row = rows.entry(i.fault.kind()).or_default();
        if i.skipped.is_some() {
            row.skipped += 1;
            continue;
        }
        row.injected += 1;
        match live.next() {
            Some(Effect::KeptRunning) => row.kept += 1,
            Some(Effect::Recovered(d)) => row.recovered.push(*d),
            Some(Effect::NotYet) | None => row.not_yet += 1,
        }
    }
    let mut all = Row::default();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| fault | injected | skipped | kept running | recovered | not before the next fault | to running again p50 / p99 / max (s) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let line = |s: &mut String, name: &str, r: &mut Row| {
        r.recovered.sort_by(f64::total_cmp);
        let times = if r.recovered.is_empty() {
            "-".to_owned()
        } else {
            format!(
                "{:.2} / {:.2} / {:.2}",
                quantile(&r.recovered, 0.5),
                quantile(&r.recovered, 0.99),
                r.recovered[r.recovered.len() - 1]
            )
        };
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {times} |",
            r.injected,
            r.skipped,
            r.kept,
            r.recovered.len(),
            r.not_yet
        );
    };
    for (name, r) in rows.iter_mut() {
        line(&mut s, name, r);
        all.injected += r.injected;
        all.skipped += r.skipped;
        all.kept += r.kept;
        all.not_yet += r.not_yet;
        all.recovered.extend(r.recovered.iter().copied());
    }
    line(&mut s, "**all**", &mut all);
    let mut by: BTreeMap<char, usize> = BTreeMap::new();
    for v in violations {
        *by.entry(v.invariant).or_default() += 1;
    }
    let _ = writeln!(
        s,
        "\nviolations: {}{}",
        violations.len(),
        if by.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                by.iter()
                    .map(|(k, n)| format!("({k}) {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    s
}

#[cfg(test)]
mod tests {
    use super::super::history::Victim;
    use super::super::schedule::{Fault, Host, Job};
    use super::*;

    fn w(rank: u32, restart: u32, m: &str, pid: u32, start: f64, last: f64) -> Worker {
        Worker {
            job: "rec".into(),
            rank,
            world: 2,
            local_rank: rank,
            group_rank: 0,
            restart,
            master: m.into(),
            pid,
            node: "node0".into(),
            start,
            last,
            ended: false,
        }
    }

    #[test]
    fn a_fault_that_restarts_the_job_is_timed_and_one_that_does_not_kept_it_running() {
        let ws = vec![
            w(0, 0, "a:1", 1, 0.0, 10.0),
            w(1, 0, "a:1", 2, 0.1, 10.0),
            w(0, 1, "a:2", 3, 10.3, 30.0),
            w(1, 1, "a:2", 4, 10.5, 30.0),
        ];
        let inj = |fault, at| Injected {
            fault,
            at,
            healed: at + 1.0,
            victim: None,
            skipped: None,
        };
        let injected = vec![
            inj(Fault::Slow(Host::Node(0)), 5.0),
            Injected {
                victim: Some(Victim {
                    pid: 2,
                    restart: 0,
                    rank: 1,
                }),
                ..inj(
                    Fault::KillWorker {
                        job: Job::Rec,
                        pick: 1,
                    },
                    10.0,
                )
            },
            inj(Fault::Isolate(Host::Node(0)), 20.0),
        ];
        let e = effects(&ws, &injected, 30.0);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0], Effect::KeptRunning);
        match e[1] {
            Effect::Recovered(d) => assert!((d - 0.5).abs() < 1e-9, "{d}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(e[2], Effect::KeptRunning);
        let t = table(&injected, &e, &[]);
        assert!(
            t.contains("| kill -9 worker | 1 | 0 | 0 | 1 | 0 | 0.50 / 0.50 / 0.50 |"),
            "{t}"
        );
        assert!(t.contains("| **all** | 3 | 0 | 2 | 1 | 0 |"), "{t}");
        assert!(t.contains("violations: 0"), "{t}");
    }
}
