//! `wr-collectives`: a Rust worker for accel's tests and benchmark. Start it
//! under `accel-agent --no-python`.
//!
//! * `wr-collectives check` runs a fixed sequence of collectives whose
//!   inputs depend only on rank and world size — the same sequence as
//!   `tests/workers/mixed.py`, so Rust and Python ranks can share a job —
//!   and writes the results to `$RECORD_DIR/rank<RANK>.json`.
//! * `wr-collectives bench BYTES... [--iters N]` all-reduces float32
//!   tensors of each size and prints one line per size from rank 0:
//!   `bench rust <bytes> <median seconds>`.
//! * `wr-collectives leave` joins and exits at once, as a crashed peer would.
//!
//! `WR_TIMEOUT_MS` overrides the group timeout. Errors go to stderr with
//! exit code 2 (environment) or 1 (process group).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tch::Tensor;
use worker_runtime::{GroupError, ProcessGroup, ReduceOp, WorkerEnv, DEFAULT_TIMEOUT};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env = match WorkerEnv::from_process() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("wr-collectives: {e}");
            return ExitCode::from(2);
        }
    };
    let timeout = std::env::var("WR_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
    let result = ProcessGroup::from_env(&env, timeout).and_then(|group| {
        match args.first().map(String::as_str) {
            Some("bench") => bench(&group, &args[1..]),
            // A crash right after joining: no drop, no goodbye.
            Some("leave") => std::process::exit(0),
            _ => check(&group),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wr-collectives: rank {}: {e}", env.rank);
            ExitCode::FAILURE
        }
    }
}

fn tensor(values: &[f32]) -> Tensor {
    Tensor::from_slice(values)
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t).unwrap_or_default()
}

fn json_list(v: &[f32]) -> String {
    let items: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
    format!("[{}]", items.join(", "))
}

/// The shared sequence (keep in step with tests/workers/mixed.py).
fn check(group: &ProcessGroup) -> Result<(), GroupError> {
    let (r, n) = (group.rank() as f32, group.world_size());
    let mut out = Vec::new();

    for (name, op, input) in [
        ("sum", ReduceOp::Sum, [r + 1.0, 0.5 * (r + 1.0)]),
        ("avg", ReduceOp::Avg, [r + 1.0, 10.0 * (r + 1.0)]),
        ("min", ReduceOp::Min, [r + 1.0, -(r + 1.0)]),
        ("max", ReduceOp::Max, [r + 1.0, -(r + 1.0)]),
    ] {
        let mut t = tensor(&input);
        group.all_reduce(&mut t, op)?;
        out.push((name.to_owned(), json_list(&values(&t))));
    }
    for (name, root) in [("broadcast_first", 0), ("broadcast_last", n - 1)] {
        let mut t = tensor(&[100.0 * r + 1.0, 100.0 * r + 2.0]);
        group.broadcast(&mut t, root)?;
        out.push((name.to_owned(), json_list(&values(&t))));
    }
    let gathered = group.all_gather(&tensor(&[r, r * r]))?;
    let lists: Vec<String> = gathered.iter().map(|t| json_list(&values(t))).collect();
    out.push(("all_gather".to_owned(), format!("[{}]", lists.join(", "))));

    let inputs: Vec<Tensor> = (0..n)
        .map(|i| tensor(&[10.0 * r + i as f32, i as f32 - r]))
        .collect();
    let mut scattered = tensor(&[0.0, 0.0]);
    group.reduce_scatter(&mut scattered, &inputs, ReduceOp::Sum)?;
    out.push(("reduce_scatter".to_owned(), json_list(&values(&scattered))));
    group.barrier()?;

    let mut json = format!(
        "{{\"rank\": {}, \"world\": {n}, \"kind\": \"rust\", \"results\": {{",
        group.rank()
    );
    for (i, (name, value)) in out.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(json, "{sep}\"{name}\": {value}");
    }
    json.push_str("}}\n");
    let dir = std::env::var("RECORD_DIR").unwrap_or_else(|_| ".".to_owned());
    let path = std::path::Path::new(&dir).join(format!("rank{}.json", group.rank()));
    if let Err(e) = std::fs::write(&path, json) {
        eprintln!("wr-collectives: writing {}: {e}", path.display());
    }
    Ok(())
}

/// All-reduce timing: `iters` timed runs after 3 warm-ups, each between barriers.
fn bench(group: &ProcessGroup, args: &[String]) -> Result<(), GroupError> {
    let mut iters = 20usize;
    let mut sizes = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--iters" {
            iters = it
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(iters)
                .max(1);
        } else if let Ok(bytes) = a.parse::<usize>() {
            sizes.push(bytes);
        }
    }
    for bytes in sizes {
        let numel = i64::try_from(bytes / 4).unwrap_or(i64::MAX);
        let mut t = Tensor::ones([numel], (tch::Kind::Float, tch::Device::Cpu));
        let mut times = Vec::with_capacity(iters);
        for i in 0..iters + 3 {
            group.barrier()?;
            let start = Instant::now();
            group.all_reduce(&mut t, ReduceOp::Sum)?;
            if i >= 3 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        if group.rank() == 0 {
            println!("bench rust {bytes} {:.6}", times[times.len() / 2]);
        }
    }
    group.barrier()
}
