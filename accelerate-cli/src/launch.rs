//! `accel launch`: accelerate's `launch`, run on accel's agent.
//!
//! The steps follow accelerate's: parse the flags ([`flags`]), read the
//! configuration file and merge it in ([`merge`]), pick the launcher
//! accelerate would pick and compute the variables it would export
//! ([`mod@env`]). Where accelerate then calls torchrun, accel turns the same
//! decisions into the agent's typed [`LaunchOptions`] (no command line is
//! rendered and parsed again), validated by the same `build` as
//! `accel-agent`'s flags, so there is one launcher behind both commands.
//!
//! Deviations (all in the user guide's accelerate page): one machine always uses a private
//! rendezvous on a free port (no port clash between jobs); several CPU
//! processes (`--cpu`/`MULTI_CPU` with `num_processes` > 1) run as that many
//! processes instead of one; `num_processes` that does not divide by
//! `num_machines` is an error instead of being rounded down; DeepSpeed's
//! multi-machine launchers (pdsh, ...) are replaced by one agent per machine.

pub mod env;
pub mod flags;
pub mod merge;
pub mod nvidia;

use std::path::PathBuf;

use serde_json::Value;

use crate::config_file;
use crate::release::Release;
use accel_agent::config::{
    Backend, Config, ConfigError, LaunchOptions, NodeCount, Nproc, RdzvConf,
};
use accel_agent::logs::{parse_ranks, StdSpec};
use accel_input::excerpt;
use accel_input::parse_duration;
use env::Launcher;
use flags::{Dest as D, Namespace, Parsed};

/// A launch ready to run.
#[derive(Debug)]
pub struct LaunchPlan {
    /// The agent's configuration.
    pub config: Config,
    /// `-q/--quiet`.
    pub quiet: bool,
    /// Printed after the job succeeds (`accel test`).
    pub on_success: Option<String>,
}

/// What `plan` decided.
#[derive(Debug)]
pub enum Planned {
    /// `--help`: print this.
    Help(String),
    /// Run the agent.
    Run(Box<LaunchPlan>),
}

/// Why a launch cannot start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A flag cannot be parsed (a value of the wrong type, a missing
    /// value, an unknown flag): a usage error, exit 2 as argparse's.
    #[error("accel launch: {0}")]
    Usage(String),
    /// The flags or the configuration do not make a launch.
    #[error("accel launch: {0}")]
    Invalid(String),
    /// The configuration file could not be read.
    #[error(transparent)]
    Config(#[from] config_file::LoadError),
}

/// Plans `accel launch ARGS` (the words after `launch`) as `release`
/// launches (the installed accelerate's, [`Release::installed`]).
pub fn plan(
    args: &[String],
    release: Release,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Planned, LaunchError> {
    let on_path = |p: &str| crate::find_program(p, env).is_some();
    let ns = match flags::parse(args, &on_path, release).map_err(LaunchError::Usage)? {
        Parsed::Help => return Ok(Planned::Help(flags::help(release))),
        Parsed::Launch(ns) => ns,
    };
    let explicit = ns.get(D::config_file).as_str().map(PathBuf::from);
    let config = config_file::load_optional(explicit.as_deref(), env)?;
    let machine = merge::Machine {
        gpus: accel_agent::probe::cuda_devices(env),
        physical_cores: accel_agent::probe::physical_cores(),
    };
    let merged = merge::merge(ns, config, machine, env).map_err(LaunchError::Invalid)?;
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    build(merged, &cwd, env).map(|p| Planned::Run(Box::new(p)))
}

/// Turns merged flags into the agent's configuration.
pub fn build(
    merged: merge::Merged,
    cwd: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<LaunchPlan, LaunchError> {
    let bad = LaunchError::Invalid;
    let ns = &merged.ns;
    let cpu = ns.truthy(D::cpu);
    let launcher = if ns.truthy(D::use_deepspeed) && !cpu {
        Launcher::DeepSpeed
    } else if (ns.truthy(D::use_fsdp) || ns.truthy(D::use_megatron_lm) || ns.truthy(D::multi_gpu))
        && !cpu
    {
        Launcher::MultiGpu
    } else if ns.truthy(D::tpu) && !cpu {
        return Err(bad(
            "TPU launches (XLA) are not supported by accel; use `accelerate launch` for TPUs"
                .into(),
        ));
    } else {
        Launcher::Simple
    };
    let mut ds_fields: Vec<String> = Vec::new();
    if launcher == Launcher::DeepSpeed {
        if let Some(c) = &merged.config {
            ds_fields.extend(c.dict("deepspeed_config").keys().cloned());
        }
        if merged.mp_from_config {
            ds_fields.push("mixed_precision".into());
        }
    }
    let mut vars = env::accelerate_env(ns, launcher, &ds_fields, cwd, env).map_err(bad)?;
    let mut warnings: Vec<String> = ns.release.warning().into_iter().collect();
    warnings.extend(merged.warning.iter().cloned());
    if launcher != Launcher::Simple && nvidia::detect() {
        let mut set_any = false;
        for var in ["NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"] {
            if env(var).is_none() && !vars.iter().any(|(k, _)| k == var) {
                vars.push((var.to_owned(), "1".to_owned()));
                set_any = true;
            }
        }
        if set_any {
            warnings.push("Using RTX 4000 series which doesn't support faster communication speedups. Ensuring P2P and IB communications are disabled.".into());
        }
    }
    let (mut options, single_process) =
        agent_options(ns, launcher, &mut warnings, env).map_err(bad)?;
    options.warnings = warnings;
    options.torchrun_env = !single_process;
    options.base_env = vars;
    // The agent sees accelerate's variables as part of its environment (so
    // its OMP_NUM_THREADS hint knows accelerate already set it).
    let vars = &options.base_env;
    let view = |k: &str| {
        vars.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .or_else(|| env(k))
    };
    let config = options.build(&view).map_err(|e| bad(e.to_string()))?;
    Ok(LaunchPlan {
        config,
        quiet: ns.truthy(D::quiet),
        on_success: None,
    })
}

/// The agent's options for the launch, and whether it is accelerate's
/// single plain process.
///
/// torchrun's flags that accelerate's launch does not have keep their
/// `PET_*` environment fallbacks, read from `env`: accelerate hands
/// torchrun a namespace parsed from the environment and overrides only the
/// keys it has itself, so `PET_LOCAL_ADDR` (a pod's address on
/// Kubernetes, say) reaches the launch there as well.
fn agent_options(
    ns: &Namespace,
    launcher: Launcher,
    warnings: &mut Vec<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(LaunchOptions, bool), String> {
    let machines_text = match ns.get(D::num_machines) {
        Value::Null => "1".to_owned(),
        v => env::py_str(v),
    };
    let nnodes: NodeCount = machines_text
        .parse()
        .map_err(|e| format!("--num_machines: {e}"))?;
    let NodeCount {
        min: min_m,
        max: max_m,
    } = nnodes;
    let total = ns.int(D::num_processes).unwrap_or(1);
    let mut o = LaunchOptions::new(ns.script.clone());
    o.training_script_args = ns.script_args.clone();
    let single_process = launcher == Launcher::Simple && total <= 1 && max_m <= 1;
    if launcher == Launcher::Simple && ns.given(D::mpirun_hostfile) {
        return Err("accel starts the processes itself and does not run mpirun: drop --mpirun_hostfile (mpirun_config) and run `accel launch --num_machines N --machine_rank R ...` on each machine".into());
    }
    let nproc = match ns.int(D::nproc_per_node) {
        Some(n) => n,
        None if single_process => 1,
        None => {
            if total < 1 {
                return Err(format!(
                    "{total} processes: no GPUs were found and no --num_processes was given; pass --num_processes N (the total over all machines)"
                ));
            }
            let m = i64::from(max_m);
            if total % m != 0 {
                return Err(format!(
                    "--num_processes {total} is the total over all machines and does not divide by {m} machines; give a multiple of {m} (accelerate would round it down to {} per machine)",
                    total / m
                ));
            }
            total / m
        }
    };
    // The agent's own rule for a worker count (and its message).
    o.nproc_per_node = nproc
        .to_string()
        .parse::<Nproc>()
        .map_err(|e| e.to_string())?;
    o.nnodes = nnodes;
    if max_m > 1 {
        let ip = ns.get(D::main_process_ip);
        let Some(ip) = ip.as_str().filter(|s| !s.is_empty()) else {
            return Err("--main_process_ip is required with more than one machine: the address of machine rank 0 (static) or of the rendezvous host (c10d)".into());
        };
        let port = match ns.int(D::main_process_port) {
            None => 29500,
            Some(0) => return Err("--main_process_port 0 would pick a different port on each machine; give a fixed port".into()),
            Some(p) => u16::try_from(p).map_err(|_| {
                format!("--main_process_port {p} is not a port; give one from 1 to 65535")
            })?,
        };
        let backend = ns.text(D::rdzv_backend);
        o.rdzv_backend = backend
            .parse::<Backend>()
            .map_err(|e| format!("--rdzv_backend: {e}"))?;
        // With static rendezvous, machine rank 0 hosts it at the main address
        // either way, so `same_network` changes nothing; c10d always uses
        // the main address (torchrun would fall back to localhost there).
        if o.rdzv_backend == Backend::Static {
            let rank = ns.int(D::machine_rank).ok_or(
                "--machine_rank is required with more than one machine and static rendezvous (0 on the main machine)",
            )?;
            if min_m != max_m {
                return Err("--num_machines MIN:MAX needs --rdzv_backend c10d".into());
            }
            o.master_addr = ip.to_owned();
            o.master_port = Some(port);
            o.node_rank = u32::try_from(rank).map_err(|_| {
                format!(
                    "--machine_rank {rank} is out of range; use 0 to {}",
                    max_m - 1
                )
            })?;
        } else {
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_owned()
            };
            o.rdzv_endpoint = format!("{host}:{port}");
        }
        if let Some(id) = ns.get(D::rdzv_id).as_str() {
            o.rdzv_id = id.to_owned();
        }
    } else {
        o.standalone = true;
    }
    if launcher == Launcher::DeepSpeed && max_m > 1 {
        let l = ns.get(D::deepspeed_multinode_launcher);
        if l != "standard" {
            warnings.push(format!(
                "deepspeed_multinode_launcher {}: accel runs one agent per machine (DeepSpeed's 'standard' launcher); start `accel launch` on every machine",
                if l.is_null() { "pdsh (the default)".to_owned() } else { env::py_str(l) }
            ));
        }
    }
    let e = |err: ConfigError| err.to_string();
    o.rdzv_conf = RdzvConf::parse(&ns.text(D::rdzv_conf)).map_err(e)?;
    let restarts = ns.text(D::max_restarts);
    o.max_restarts = restarts.trim().parse().map_err(|_| {
        format!(
            "--max_restarts '{}' is not a number of restarts; give 0 or more",
            excerpt(&restarts)
        )
    })?;
    o.monitor_interval = parse_duration(&ns.text(D::monitor_interval))
        .map_err(|err| format!("--monitor_interval: {err}"))?;
    o.role = ns.text(D::role);
    o.tee = StdSpec::parse("--tee", &ns.text(D::tee)).map_err(e)?;
    o.redirects = StdSpec::parse("--redirects", &ns.text(D::redirects)).map_err(e)?;
    o.local_ranks_filter =
        parse_ranks("--local_ranks_filter", &ns.text(D::local_ranks_filter)).map_err(e)?;
    o.ranks_filter = parse_ranks("--ranks_filter", &ns.text(D::ranks_filter)).map_err(e)?;
    if ns.given(D::log_dir) {
        o.log_dir = Some(ns.text(D::log_dir).into());
    }
    if ns.given(D::log_line_prefix_template) {
        o.log_line_prefix_template = Some(ns.text(D::log_line_prefix_template));
    }
    // A duration flag that may be absent, its errors naming it.
    let duration = |dest: D| -> Result<Option<std::time::Duration>, String> {
        if !ns.given(dest) {
            return Ok(None);
        }
        parse_duration(&ns.text(dest))
            .map(Some)
            .map_err(|err| format!("--{}: {err}", dest.name()))
    };
    o.shutdown_timeout = duration(D::shutdown_timeout)?;
    // Hot restart, crash loops and node health: accel-agent's flags.
    if ns.given(D::preload) {
        o.preload = ns
            .text(D::preload)
            .split(',')
            .map(|m| m.trim().to_owned())
            .collect();
    }
    if ns.given(D::restart_backoff) {
        let (base, max) =
            accel_agent::config::RestartBackoff::parse_wait(&ns.text(D::restart_backoff))
                .map_err(|err| format!("--restart_backoff: {err}"))?;
        (o.restart_backoff.base, o.restart_backoff.max) = (base, max);
    }
    if let Some(window) = duration(D::restart_backoff_window)? {
        o.restart_backoff.window = window;
    }
    let check_timeout = duration(D::health_check_timeout)?;
    if let Some(command) = ns
        .get(D::health_check)
        .as_str()
        .filter(|c| !c.trim().is_empty())
    {
        o.health_check.command = Some(command.to_owned());
    }
    if let Some(t) = check_timeout {
        o.health_check.timeout = t;
    }
    if let Some(nic) = ns
        .get(D::health_check_nic)
        .as_str()
        .filter(|v| !v.trim().is_empty())
    {
        o.health_check.nic = Some(nic.to_owned());
    }
    if let Some(p) = ns
        .get(D::health_check_storage)
        .as_str()
        .filter(|v| !v.trim().is_empty())
    {
        o.health_check.storage = Some(p.into());
    }
    o.health_check.gpu = ns.truthy(D::health_check_gpu);
    if let Some(p) = ns
        .get(D::health_check_sysfs)
        .as_str()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        o.health_check.sysfs = p.into();
    }
    if ns.given(D::nnodes_multiple_of) {
        let k = ns.text(D::nnodes_multiple_of);
        o.nnodes_multiple_of = k.trim().parse().ok().filter(|k| *k >= 1).ok_or_else(|| {
            format!(
                "--nnodes_multiple_of '{}' is not a machine count; give 1 or more",
                excerpt(&k)
            )
        })?;
    }
    if let Some(settle) = duration(D::scale_up_settle)? {
        o.scale_up_settle = settle;
    }
    if let Some(p) = ns
        .get(D::health_check_kernel_log)
        .as_str()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        o.health_check.kernel_log = (p != "none").then(|| p.into());
    }
    if let Some(ep) = ns
        .get(D::health_check_endpoint)
        .as_str()
        .filter(|v| !v.trim().is_empty())
    {
        o.health_check.endpoint = Some(
            ep.parse()
                .map_err(|err| format!("--health_check_endpoint: {err}"))?,
        );
    }
    if let Some(i) = duration(D::health_check_interval)? {
        o.health_check.interval = (!i.is_zero()).then_some(i);
    }
    if let Some(t) = duration(D::gpu_free_timeout)? {
        o.gpu_free_timeout = t;
    }
    o.module = ns.truthy(D::module);
    o.no_python = ns.truthy(D::no_python);
    if let Some(addr) = env("PET_LOCAL_ADDR").filter(|a| !a.is_empty()) {
        o.local_addr = Some(addr);
    }
    if let Some(signals) = env("PET_SIGNALS_TO_HANDLE") {
        o.signals_to_handle = signals
            .parse()
            .map_err(|err: ConfigError| format!("PET_SIGNALS_TO_HANDLE: {err}"))?;
    }
    if let Some(t) = env("PET_EXIT_BARRIER_TIMEOUT") {
        o.exit_barrier_timeout =
            parse_duration(&t).map_err(|err| format!("PET_EXIT_BARRIER_TIMEOUT: {err}"))?;
    }
    if let Some(v) = env("PET_VIRTUAL_LOCAL_RANK") {
        o.virtual_local_rank = accel_agent::config::parse_bool(&v).ok_or_else(|| {
            format!(
                "PET_VIRTUAL_LOCAL_RANK '{}' is not a boolean; use true or false",
                excerpt(&v)
            )
        })?;
    }
    Ok((o, single_process))
}

#[cfg(test)]
mod tests;
