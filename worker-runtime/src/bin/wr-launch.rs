//! `wr-launch`: a program that launches a function in several processes of
//! itself, for the launcher's tests.
//!
//! * `wr-launch run N OUT` — [`Launcher`] with N processes and one restart:
//!   every rank joins the group, all-reduces `rank + 1`, and writes
//!   `OUT/<attempt>_<rank>.json`; with `FAIL_RANK=r`, rank r fails on the
//!   first attempt (so the second attempt is the restart), or on every
//!   attempt with `FAIL_ALWAYS=1` (so the job fails).
//! * `wr-launch debug N OUT` — the same through [`debug_launch`].
//! * `wr-launch after-group` — creates a one-rank group first, then tries to
//!   launch: must be refused.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use tch::Tensor;
use worker_runtime::launcher::DEBUG_VAR;
use worker_runtime::{
    debug_launch, GroupOptions, LaunchError, Launcher, ProcessGroup, ReduceOp, WorkerEnv,
    DEFAULT_TIMEOUT,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [mode, n, out] if mode == "run" || mode == "debug" => {
            let n: u32 = n.parse().unwrap_or(0);
            let out = out.clone();
            let work = move |env: &WorkerEnv| rank_work(env, Path::new(&out));
            if mode == "run" {
                Launcher::new(n).max_restarts(1).run(work)
            } else {
                debug_launch(n, work)
            }
        }
        [mode] if mode == "after-group" => after_group(),
        _ => {
            eprintln!("usage: wr-launch run|debug N OUT | wr-launch after-group");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wr-launch: {e}");
            ExitCode::FAILURE
        }
    }
}

fn rank_work(env: &WorkerEnv, out: &Path) -> Result<(), String> {
    let group = ProcessGroup::from_env(env, DEFAULT_TIMEOUT).map_err(|e| e.to_string())?;
    let fail = std::env::var("FAIL_RANK")
        .ok()
        .and_then(|r| r.parse::<usize>().ok());
    let always = std::env::var_os("FAIL_ALWAYS").is_some();
    if fail == Some(env.rank) && (env.restart_count == 0 || always) {
        return Err(format!("injected failure on attempt {}", env.restart_count));
    }
    let mut t = Tensor::from_slice(&[env.rank as f32 + 1.0]);
    group
        .all_reduce(&mut t, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let sum = t.double_value(&[0]);
    group.barrier().map_err(|e| e.to_string())?;
    let cuda = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => format!("{v:?}"),
        Err(_) => "null".into(),
    };
    let record = format!(
        "{{\"rank\": {}, \"world\": {}, \"sum\": {sum}, \"restart\": {}, \"debug\": {:?}, \"cuda_visible\": {cuda}}}",
        env.rank,
        env.world_size,
        env.restart_count,
        std::env::var(DEBUG_VAR).unwrap_or_default(),
    );
    std::fs::write(
        out.join(format!("{}_{}.json", env.restart_count, env.rank)),
        record,
    )
    .map_err(|e| e.to_string())
}

fn after_group() -> Result<(), LaunchError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(LaunchError::NoExecutable)?;
    let opts = GroupOptions {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank: 0,
        world_size: 1,
        host_store: true,
        timeout: Duration::from_secs(30),
    };
    let _group = ProcessGroup::join(&opts).map_err(|e| LaunchError::Config(e.to_string()))?;
    Launcher::new(2).run(|_env: &WorkerEnv| -> Result<(), String> { Ok(()) })
}
