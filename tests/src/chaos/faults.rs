//! Injecting and healing one fault: signals to workers and daemons,
//! nftables tables inside namespaces (one per fault, deleted at the heal),
//! a `tbf` rate limit on a host's link, a file filling a node's log tmpfs.
//! A fault's node is resolved when it is due ([`physical`]).

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::cluster::{marked, now, signal, var, Cluster};
use super::history::{Injected, Victim, Worker};
use super::schedule::{Daemon, Fault, Host, Job, Planned, NODES};

/// What a fault left to undo at its heal.
#[derive(Debug)]
pub(crate) enum Undo {
    Nothing,
    Restart(Daemon),
    Continue(u32),
    Tables(Vec<(Host, String)>),
    Unslow(Host),
    Unfill(PathBuf),
    MakeRoom,
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

/// Injects `p` now; what it did and what its heal must undo.
pub(crate) fn inject(c: &mut Cluster, workers: &[Worker], p: &Planned) -> (Injected, Undo) {
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
        Fault::EtcdFull => match crate::etcd::fill(&c.etcd_endpoints(), &c.dir) {
            Ok(_) => Undo::MakeRoom,
            Err(e) => {
                inj.skipped = Some(e);
                // What it wrote before the error goes at the heal all the same.
                Undo::MakeRoom
            }
        },
    };
    (inj, undo)
}

/// Heals a fault: undoes what [`inject`] did.
pub(crate) fn heal(c: &mut Cluster, undo: Undo) {
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
        Undo::MakeRoom => {
            // etcd may be busy electing or catching up: a few tries.
            let mut last = String::new();
            for _ in 0..10 {
                match crate::etcd::make_room(&c.etcd_endpoints()) {
                    Ok(()) => return,
                    Err(e) => last = e,
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            eprintln!("chaos: cannot recover etcd from its full state: {last}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::run::NPROC;
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
