//! Running under Slurm: `srun accel-agent train.py` with one task per node
//! and no flags takes the job's shape from Slurm's variables, as it would
//! have to be typed by hand otherwise:
//!
//! | from | becomes |
//! |---|---|
//! | `SLURM_STEP_NUM_NODES` (else `SLURM_NNODES`, `SLURM_JOB_NUM_NODES`) | `--nnodes` |
//! | `SLURM_PROCID` (one task per node: the node's place in the step; else `SLURM_NODEID`) | `--node-rank` |
//! | `SLURM_JOB_ID` | `--rdzv-id` |
//! | first host of `SLURM_STEP_NODELIST` (else `SLURM_NODELIST`, `SLURM_JOB_NODELIST`; hostlist syntax, expanded) | `--master-addr` (static), or the `--rdzv-endpoint` host (c10d) |
//!
//! The step's own values come first: a step may use part of its
//! allocation (`srun -N2` in a 4-node job), and its node 0 is the first host
//! of the step, not of the job. Two steps of one job that run at once on
//! one c10d server would share the job id: give one of them `--rdzv-id`.
//!
//! The static rendezvous is kept (node 0 of the allocation hosts it; no
//! server is needed). Only values the user did not give are taken: a flag,
//! or its `PET_*` variable, always wins. It applies only inside an `srun`
//! step (`SLURM_STEP_ID` set) whose tasks are one per node, so a batch
//! script that runs the agent once, or an `srun` with several tasks per
//! node, is told what to change instead of forming a job that cannot
//! complete.

use accel_input::excerpt;

use super::{Backend, ConfigError, LaunchOptions, NodeCount, C10D_PORT};

/// Most hosts a node list is expanded to.
pub const MAX_HOSTS: usize = 100_000;

/// Which options the user gave (on the command line or as `PET_*`), by
/// their clap ids (`nnodes`, `node_rank`, `rdzv_id`, `master_addr`,
/// `rdzv_backend`, `rdzv_endpoint`).
pub type Given<'a> = &'a dyn Fn(&str) -> bool;

/// Fills what `given` says the user left out from Slurm's variables
/// (`env`). Returns the one line to log when anything was taken; an error
/// when the step cannot form a job as it is.
pub fn apply(
    o: &mut LaunchOptions,
    given: Given<'_>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    let (Some(job), Some(_step)) = (
        env("SLURM_JOB_ID"),
        env("SLURM_STEP_ID").or_else(|| env("SLURM_STEPID")),
    ) else {
        return Ok(None);
    };
    // One node by definition, with a rendezvous of its own.
    if o.standalone {
        return Ok(None);
    }
    let number = |k: &str| -> Result<Option<u32>, ConfigError> {
        env(k)
            .map(|v| {
                v.trim().parse::<u32>().map_err(|_| {
                    ConfigError(format!(
                        "Slurm's {k}={v:?} is not a count; is this an srun step?"
                    ))
                })
            })
            .transpose()
    };
    let first_of = |keys: &[&str]| -> Result<Option<u32>, ConfigError> {
        for k in keys {
            if let Some(n) = number(k)? {
                return Ok(Some(n));
            }
        }
        Ok(None)
    };
    let nnodes = first_of(&[
        "SLURM_STEP_NUM_NODES",
        "SLURM_NNODES",
        "SLURM_JOB_NUM_NODES",
    ])?;
    let node_id = first_of(&["SLURM_PROCID", "SLURM_NODEID"])?;
    let (Some(nnodes), Some(node_id)) = (nnodes, node_id) else {
        return Ok(None);
    };
    let tasks = number("SLURM_STEP_NUM_TASKS")?.or(number("SLURM_NTASKS")?);
    let wanted = [
        "nnodes",
        "node_rank",
        "rdzv_id",
        "master_addr",
        "rdzv_endpoint",
    ];
    if wanted.iter().all(|id| given(id)) {
        return Ok(None);
    }
    if let Some(t) = tasks.filter(|t| *t != nnodes) {
        return Err(ConfigError(format!(
            "under Slurm, accel-agent runs once per node (it starts the workers itself), but this srun step has {t} tasks on {nnodes} nodes: use `srun --ntasks-per-node=1` (or pass --nnodes, --node-rank and the rendezvous flags yourself)"
        )));
    }
    let list = env("SLURM_STEP_NODELIST")
        .or_else(|| env("SLURM_NODELIST"))
        .or_else(|| env("SLURM_JOB_NODELIST"))
        .unwrap_or_default();
    let hosts = expand_hostlist(&list, MAX_HOSTS)
        .map_err(|e| ConfigError(format!("Slurm's SLURM_JOB_NODELIST: {e}")))?;
    let first = hosts.first().cloned();
    let mut taken = Vec::new();
    if !given("nnodes") {
        o.nnodes = NodeCount::fixed(nnodes);
        taken.push(format!("{nnodes} nodes"));
    }
    if !given("rdzv_id") {
        o.rdzv_id = job.clone();
        taken.push(format!("rdzv_id {job}"));
    }
    match o.rdzv_backend {
        Backend::Static => {
            if !given("node_rank") {
                o.node_rank = node_id;
                taken.push(format!("node rank {node_id}"));
            }
            if let (false, Some(host)) = (given("master_addr"), &first) {
                o.master_addr = host.clone();
                taken.push(format!("rendezvous host {host} (node 0 hosts it)"));
            }
        }
        Backend::C10d => {
            if let (false, Some(host)) = (given("rdzv_endpoint"), &first) {
                o.rdzv_endpoint = format!("{host}:{C10D_PORT}");
                taken.push(format!("rendezvous at {host}:{C10D_PORT}"));
            }
        }
        Backend::Etcd | Backend::EtcdV2 => {}
    }
    Ok((!taken.is_empty()).then(|| {
        format!(
            "running under Slurm (job {job}): took {} from its SLURM_* variables; flags and PET_* variables override them",
            taken.join(", ")
        )
    }))
}

/// A Slurm host list expanded: `node[01-03,07],gpu-a` is `node01`,
/// `node02`, `node03`, `node07`, `gpu-a`; several bracket groups multiply
/// (`r[1-2]n[1-2]`). Zero padding is kept. At most `limit` hosts.
pub fn expand_hostlist(list: &str, limit: usize) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_top(list.trim()) {
        if item.is_empty() {
            continue;
        }
        let mut partial = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    partial.iter_mut().for_each(|p| p.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let close = rest[open..]
                        .find(']')
                        .map(|c| open + c)
                        .ok_or_else(|| format!("unclosed '[' in '{}'", excerpt(item)))?;
                    let prefix = &rest[..open];
                    let budget = limit.saturating_sub(hosts.len());
                    let choices = ranges(&rest[open + 1..close], budget)
                        .map_err(|e| format!("{e} in '{}'", excerpt(item)))?;
                    if partial.len().saturating_mul(choices.len()) + hosts.len() > limit {
                        return Err(format!("more than {limit} hosts"));
                    }
                    partial = partial
                        .iter()
                        .flat_map(|p| choices.iter().map(move |c| format!("{p}{prefix}{c}")))
                        .collect();
                    rest = &rest[close + 1..];
                }
            }
        }
        hosts.extend(partial);
        if hosts.len() > limit {
            return Err(format!("more than {limit} hosts"));
        }
    }
    Ok(hosts)
}

/// The top-level comma-separated items (commas inside brackets stay).
fn split_top(list: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    items
}

/// `01-03,07` as `01`, `02`, `03`, `07` (each number as wide as its
/// range's first bound was written), at most `budget` of them.
fn ranges(spec: &str, budget: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let width = lo.len();
        let bad = || format!("'{}' is not a number or a range", excerpt(part));
        // u64 has at most 20 digits: wider padding is not a host name.
        if width > 20 {
            return Err(bad());
        }
        let (a, b): (u64, u64) = (
            lo.parse().map_err(|_| bad())?,
            hi.parse().map_err(|_| bad())?,
        );
        if b < a {
            return Err(bad());
        }
        if b - a >= budget.saturating_sub(out.len()) as u64 {
            return Err(format!("more than {budget} hosts"));
        }
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_expand_like_slurm() {
        let e = |s: &str| expand_hostlist(s, 1000).expect("valid");
        assert_eq!(e("node01"), ["node01"]);
        assert_eq!(
            e("node[01-03,07],gpu-a"),
            ["node01", "node02", "node03", "node07", "gpu-a"]
        );
        assert_eq!(e("r[1-2]n[8-9]"), ["r1n8", "r1n9", "r2n8", "r2n9"]);
        assert_eq!(e("a[9-10]-ib"), ["a9-ib", "a10-ib"]);
        assert!(e("").is_empty());
        assert!(expand_hostlist("n[1-", 10).is_err());
        assert!(expand_hostlist("n[3-1]", 10).is_err());
        assert!(expand_hostlist("n[x]", 10).is_err());
        let e = expand_hostlist("n[1-100000000]", 1000).expect_err("bounded");
        assert!(
            e.contains("is not a number or a range") || e.contains("more than"),
            "{e}"
        );
        assert!(expand_hostlist("n[1-600],m[1-600]", 1000).is_err());
        // Many parts of one bracket are bounded together, and so is padding.
        let many = format!("n[{}]", vec!["1-900"; 1000].join(","));
        assert!(expand_hostlist(&many, 1000).is_err());
        assert!(expand_hostlist(&format!("n[{}]", "0".repeat(10_000)), 10).is_err());
    }

    fn slurm(extra: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let mut vars: Vec<(String, String)> = [
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NNODES", "4"),
            ("SLURM_NODEID", "2"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_JOB_NODELIST", "gpu[07-10]"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        for (k, v) in extra {
            vars.retain(|(key, _)| key != k);
            if !v.is_empty() {
                vars.push(((*k).to_owned(), (*v).to_owned()));
            }
        }
        move |k| {
            vars.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn an_srun_step_gives_the_job_its_shape() {
        let mut o = LaunchOptions::new("train.py");
        let line = apply(&mut o, &|_| false, &slurm(&[]))
            .expect("ok")
            .expect("taken");
        assert_eq!(o.nnodes, NodeCount::fixed(4));
        assert_eq!(o.node_rank, 2);
        assert_eq!(o.rdzv_id, "4242");
        assert_eq!(o.master_addr, "gpu07");
        assert!(
            line.contains("took 4 nodes, rdzv_id 4242, node rank 2, rendezvous host gpu07"),
            "{line}"
        );
    }

    #[test]
    fn a_step_on_part_of_the_allocation_uses_the_steps_own_values() {
        // srun -N2 --relative=2 in a 4-node job: the step's nodes are
        // gpu[09-10]; this task is the step's second.
        let env = slurm(&[
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_STEP_NODELIST", "gpu[09-10]"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NODEID", "3"),
        ]);
        let mut o = LaunchOptions::new("train.py");
        apply(&mut o, &|_| false, &env).expect("ok");
        assert_eq!(o.nnodes, NodeCount::fixed(2));
        assert_eq!(o.node_rank, 1);
        assert_eq!(o.master_addr, "gpu09");
        // --standalone is one node whatever the allocation.
        let mut o = LaunchOptions::new("train.py");
        o.standalone = true;
        assert_eq!(apply(&mut o, &|_| false, &env).expect("ok"), None);
        assert_eq!(o.nnodes, NodeCount::fixed(1));
    }

    #[test]
    fn flags_win_over_slurm() {
        let mut o = LaunchOptions::new("train.py");
        o.nnodes = NodeCount::fixed(1);
        o.master_addr = "head".into();
        let given = |id: &str| id == "nnodes" || id == "master_addr";
        apply(&mut o, &given, &slurm(&[])).expect("ok");
        assert_eq!(o.nnodes, NodeCount::fixed(1));
        assert_eq!(o.master_addr, "head");
        assert_eq!(o.rdzv_id, "4242");
        // Everything given: nothing to say.
        let mut o = LaunchOptions::new("train.py");
        assert_eq!(apply(&mut o, &|_| true, &slurm(&[])).expect("ok"), None);
    }

    #[test]
    fn c10d_takes_the_first_host_as_its_endpoint() {
        let mut o = LaunchOptions::new("train.py");
        o.rdzv_backend = Backend::C10d;
        let given = |id: &str| id == "rdzv_backend";
        apply(&mut o, &given, &slurm(&[])).expect("ok");
        assert_eq!(o.rdzv_endpoint, "gpu07:29400");
        assert_eq!(o.node_rank, 0, "c10d assigns node ranks itself");
    }

    #[test]
    fn outside_a_step_or_with_several_tasks_per_node() {
        // A batch script (no step) or no Slurm at all: nothing happens.
        let mut o = LaunchOptions::new("train.py");
        assert_eq!(
            apply(&mut o, &|_| false, &slurm(&[("SLURM_STEP_ID", "")])).expect("ok"),
            None
        );
        assert_eq!(apply(&mut o, &|_| false, &|_| None).expect("ok"), None);
        assert_eq!(o.nnodes, NodeCount::fixed(1));
        // srun with 8 tasks per node would start 8 agents per node.
        let e = apply(
            &mut o,
            &|_| false,
            &slurm(&[("SLURM_STEP_NUM_TASKS", "32")]),
        )
        .expect_err("refused");
        assert!(e.0.contains("--ntasks-per-node=1"), "{e}");
        let e = apply(&mut o, &|_| false, &slurm(&[("SLURM_NNODES", "four")])).expect_err("bad");
        assert!(e.0.contains("SLURM_NNODES=\"four\""), "{e}");
    }
}
