//! Data-parallel training of a small model with tch, one process per rank:
//! every rank computes gradients on its shard of a fixed dataset, the
//! gradients are averaged across ranks each step (`all_reduce` AVG), and
//! rank 0 checkpoints every few steps. A restarted job resumes from the last
//! checkpoint, so a failure costs the steps since it, not the run.
//!
//! ```sh
//! node0$ accel-agent --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 \
//!            --nproc-per-node 2 --max-restarts 3 --no-python target/release/examples/ddp_train
//! node1$ accel-agent --nnodes 2 --node-rank 1 ... (the same)
//! ```
//!
//! Settings (environment): `CHECKPOINT_DIR` (default `checkpoints`), `STEPS`
//! (30), `CHECKPOINT_EVERY` (5), `OUT_DIR` (where each rank writes its final
//! parameters, optional). For tests: `FAIL_AT_STEP` and `FAIL_RANK` make that
//! rank exit with status 3 at that step of the job's first attempt.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Reduction, Tensor};
use worker_runtime::{ProcessGroup, ReduceOp, WorkerEnv, DEFAULT_TIMEOUT};

const FEATURES: i64 = 8;
const SAMPLES: i64 = 256;

fn main() -> ExitCode {
    match train() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ddp_train: {e}");
            // For the launcher's failure summary (as Python's @record does).
            if let Ok(env) = WorkerEnv::from_process() {
                let _ = worker_runtime::record_error(&env, &e.to_string(), "");
            }
            ExitCode::FAILURE
        }
    }
}

fn setting(name: &str, default: i64) -> Result<i64, Box<dyn Error>> {
    match std::env::var(name) {
        Ok(v) => Ok(v
            .parse()
            .map_err(|_| format!("{name}={v} is not a number"))?),
        Err(_) => Ok(default),
    }
}

fn train() -> Result<(), Box<dyn Error>> {
    let env = WorkerEnv::from_process()?;
    let group = ProcessGroup::from_env(&env, DEFAULT_TIMEOUT)?;
    let dir =
        PathBuf::from(std::env::var("CHECKPOINT_DIR").unwrap_or_else(|_| "checkpoints".into()));
    let steps = setting("STEPS", 30)?;
    let every = setting("CHECKPOINT_EVERY", 5)?.max(1);
    let fail_at = setting("FAIL_AT_STEP", -1)?;
    let fail_rank = setting("FAIL_RANK", -1)?;

    tch::manual_seed(0);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let model = nn::seq()
        .add(nn::linear(
            &root / "hidden",
            FEATURES,
            16,
            Default::default(),
        ))
        .add_fn(|x| x.tanh())
        .add(nn::linear(&root / "out", 16, 1, Default::default()));
    let mut opt = nn::Sgd::default().build(&vs, 0.05)?;

    let mut start = 0;
    if let Some((step, path)) = latest_checkpoint(&dir)? {
        vs.load(&path)?;
        start = step;
        if env.rank == 0 {
            println!("resuming from step {step} (attempt {})", env.restart_count);
        }
    }
    // Every rank starts from rank 0's parameters, fresh or resumed.
    let mut names: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| -> Result<(), Box<dyn Error>> {
        for (_, p) in names.iter_mut() {
            group.broadcast(p, 0)?;
        }
        Ok(())
    })?;

    let (x, y) = shard(env.rank as i64, env.world_size as i64);
    for step in start..steps {
        if step == fail_at && env.rank as i64 == fail_rank && env.restart_count == 0 {
            eprintln!("rank {}: injected failure at step {step}", env.rank);
            std::process::exit(3);
        }
        opt.zero_grad();
        let loss = model.forward(&x).mse_loss(&y, Reduction::Mean);
        loss.backward();
        for (_, p) in &names {
            let mut grad = p.grad();
            group.all_reduce(&mut grad, ReduceOp::Avg)?;
        }
        opt.step();
        if (step + 1) % every == 0 {
            if env.rank == 0 {
                save_checkpoint(&vs, &dir, step + 1)?;
            }
            // No rank runs ahead of a checkpoint that is being written.
            group.barrier()?;
        }
        if env.rank == 0 && (step + 1) % 10 == 0 {
            println!("step {} loss {:.6}", step + 1, loss.double_value(&[]));
        }
    }
    if let Ok(out) = std::env::var("OUT_DIR") {
        write_parameters(&names, Path::new(&out), env.rank)?;
    }
    Ok(())
}

/// A fixed regression dataset (the same on every rank), rows `rank, rank +
/// world, ...` of it.
fn shard(rank: i64, world: i64) -> (Tensor, Tensor) {
    tch::manual_seed(1234);
    let x = Tensor::randn([SAMPLES, FEATURES], (Kind::Float, Device::Cpu));
    let w =
        Tensor::arange(FEATURES, (Kind::Float, Device::Cpu)).view([FEATURES, 1]) / FEATURES as f64;
    let y = x.matmul(&w).sin();
    let rows = Tensor::arange_start_step(rank, SAMPLES, world, (Kind::Int64, Device::Cpu));
    (x.index_select(0, &rows), y.index_select(0, &rows))
}

/// The newest `step_N.ot` in `dir`.
fn latest_checkpoint(dir: &Path) -> Result<Option<(i64, PathBuf)>, Box<dyn Error>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display()).into()),
    };
    let mut best = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let step = name
            .strip_prefix("step_")
            .and_then(|s| s.strip_suffix(".ot"))
            .and_then(|s| s.parse::<i64>().ok());
        if let Some(step) = step {
            if best.as_ref().is_none_or(|(b, _)| step > *b) {
                best = Some((step, e.path()));
            }
        }
    }
    Ok(best)
}

/// Writes then renames, so a crash never leaves a half-written checkpoint.
fn save_checkpoint(vs: &nn::VarStore, dir: &Path, step: i64) -> Result<(), Box<dyn Error>> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".step_{step}.ot.tmp"));
    vs.save(&tmp)?;
    std::fs::rename(&tmp, dir.join(format!("step_{step}.ot")))?;
    Ok(())
}

/// Each parameter's values as exact bit patterns, for comparisons.
fn write_parameters(
    names: &[(String, Tensor)],
    out: &Path,
    rank: usize,
) -> Result<(), Box<dyn Error>> {
    let mut text = String::new();
    for (name, p) in names {
        let values: Vec<f32> = Vec::<f32>::try_from(p.flatten(0, -1))?;
        let bits: Vec<String> = values
            .iter()
            .map(|v| format!("{:08x}", v.to_bits()))
            .collect();
        text.push_str(&format!("{name} {}\n", bits.join(",")));
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join(format!("rank{rank}.params")), text)?;
    Ok(())
}
