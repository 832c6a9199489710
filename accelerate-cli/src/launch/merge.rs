//! accelerate's `_validate_launch_command`: checks the flags, then merges
//! the configuration file into them (reference: accelerate §3.1).
//!
//! Precedence, as accelerate has it: a flag given on the command line beats
//! the file; the file's dictionary keys (`fsdp_config`, ...) beat flag
//! defaults; the file's other keys fill in only flags whose default is
//! "not given". accel departs from that in one place, to fix a known defect:
//! the file's `rdzv_backend` and `same_network` are honoured unless the
//! command line gives them (accelerate ignores both, because their flag
//! defaults are not "not given").

use accel_input::excerpt;
use serde_json::{json, Value};

use super::flags::{Dest as D, Namespace};
use crate::config_file::{AccelerateConfig, CLUSTER_FIELDS};
use crate::release::ProcessDefault;
use crate::vocab::DistributedType;

/// The machine facts the merge depends on.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    /// CUDA devices.
    pub gpus: u32,
    /// Physical CPU cores.
    pub physical_cores: u32,
}

/// The merged result.
#[derive(Debug)]
pub struct Merged {
    /// Flags with the file merged in.
    pub ns: Namespace,
    /// The file, when one was read.
    pub config: Option<AccelerateConfig>,
    /// `mixed_precision` came from the file (DeepSpeed reports it).
    pub mp_from_config: bool,
    /// accelerate's "values were not passed" warning, when it applies.
    pub warning: Option<String>,
}

/// Checks `ns` and merges `config` (the explicit or default file, already
/// loaded; `None` when there is none) into it.
pub fn merge(
    mut ns: Namespace,
    config: Option<AccelerateConfig>,
    machine: Machine,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Merged, String> {
    let exclusive = [D::multi_gpu, D::cpu, D::tpu, D::use_deepspeed, D::use_fsdp];
    if exclusive.iter().filter(|&&f| ns.truthy(f)).count() > 1 {
        return Err(
            "use only one of --cpu, --multi_gpu, --tpu, --use_deepspeed, --use_fsdp".into(),
        );
    }
    if ns.truthy(D::multi_gpu) && ns.int(D::num_processes).is_some_and(|n| n < 2) {
        return Err("--multi_gpu needs at least 2 processes: raise --num_processes".into());
    }
    if ns.truthy(D::use_parallelism_config) && !ns.truthy(D::use_fsdp) {
        return Err("--use_parallelism_config needs --use_fsdp and --fsdp_version 2".into());
    }
    // accelerate skips the default file under --cpu (not an explicit one).
    let config = match config {
        Some(c) if ns.truthy(D::config_file) || !ns.truthy(D::cpu) => Some(c),
        _ => None,
    };
    let mut warned = Vec::new();
    let mut mp_from_config = false;
    if let Some(cfg) = &config {
        if cfg.sagemaker {
            return Err(format!(
                "{} is an Amazon SageMaker configuration: accel launches on machines it runs on; use `accelerate launch` for SageMaker",
                cfg.path.display()
            ));
        }
        apply_file(&mut ns, cfg, &mut mp_from_config)?;
    } else {
        defaults_without_file(&mut ns, machine, &mut warned);
    }
    cpu_threads(&mut ns, machine, env, &mut warned)?;
    let warning = (!warned.is_empty()).then(|| {
        format!(
            "The following values were not passed to `accelerate launch` and had defaults used instead:\n{}\n\
             To avoid this warning pass in values for each of the problematic parameters or run `accelerate config`.",
            warned.join("\n")
        )
    });
    Ok(Merged {
        ns,
        config,
        mp_from_config,
        warning,
    })
}

fn apply_file(
    ns: &mut Namespace,
    cfg: &AccelerateConfig,
    mp_from_config: &mut bool,
) -> Result<(), String> {
    // The file reader has checked the key; a value that is not text (which
    // it refuses too) picks no paradigm, like `NO`.
    let t = cfg
        .get("distributed_type")
        .as_str()
        .map_or(Some(DistributedType::No), DistributedType::parse);
    let chosen = [
        D::multi_gpu,
        D::tpu,
        D::tpu_use_cluster,
        D::use_deepspeed,
        D::use_fsdp,
        D::use_megatron_lm,
    ];
    if !chosen.iter().any(|&f| ns.truthy(f)) {
        ns.set(
            D::use_deepspeed,
            json!(t == Some(DistributedType::DeepSpeed)),
        );
        ns.set(
            D::multi_gpu,
            json!(t.is_some_and(DistributedType::is_multi_device)),
        );
        ns.set(D::tpu, json!(t == Some(DistributedType::Xla)));
        ns.set(D::use_fsdp, json!(t == Some(DistributedType::Fsdp)));
        ns.set(
            D::use_megatron_lm,
            json!(t == Some(DistributedType::MegatronLm)),
        );
        let cluster =
            t == Some(DistributedType::Xla) && cfg.get("tpu_use_cluster") == &Value::Bool(true);
        ns.set(D::tpu_use_cluster, json!(cluster));
        ns.set(
            D::use_parallelism_config,
            json!(!cfg.dict("parallelism_config").is_empty()),
        );
    }
    if !ns.given(D::gpu_ids) {
        let ids = match cfg.get("gpu_ids") {
            Value::Null => json!("all"),
            v => v.clone(),
        };
        ns.set(D::gpu_ids, ids);
    }
    if ns.truthy(D::multi_gpu) && !ns.given(D::num_machines) {
        ns.set(D::num_machines, cfg.get("num_machines").clone());
    }
    for (name, _) in CLUSTER_FIELDS {
        let value = cfg.get(name);
        if let Value::Object(dict) = value {
            for (key, v) in dict {
                let key = prefixed(name, key, ns.release.behaviour.dynamo_config_prefix);
                if !ns.nondefault.contains(&key) {
                    ns.set_attr(&key, v.clone());
                }
            }
        } else if matches!(*name, "rdzv_backend" | "same_network") {
            // accel's fix: the file's value counts unless the command line gives one.
            if !ns.nondefault.contains(*name) && !value.is_null() {
                ns.set_attr(name, value.clone());
            }
        } else if !matches!(
            *name,
            "compute_environment" | "mixed_precision" | "distributed_type"
        ) && ns.attr(name).is_null()
        {
            ns.set_attr(name, value.clone());
        }
    }
    if !ns.truthy(D::debug) {
        ns.set(D::debug, json!(cfg.get("debug") == &Value::Bool(true)));
    }
    if !ns.truthy(D::mixed_precision) {
        match cfg.get("mixed_precision") {
            Value::Null => ns.set(D::mixed_precision, json!("no")),
            Value::Bool(false) => {
                return Err(format!(
                    "{}: mixed_precision is the boolean false (unquoted no is a boolean in YAML 1.1, as accelerate reads it); write mixed_precision: 'no'",
                    cfg.path.display()
                ))
            }
            v => {
                ns.set(D::mixed_precision, v.clone());
                *mp_from_config = true;
            }
        }
    }
    if !ns.given(D::dynamo_backend) {
        ns.set(D::dynamo_backend, json!("no"));
    }
    if ns.int(D::num_processes) == Some(-1) {
        return Err(format!(
            "{} gives no num_processes: pass --num_processes (the total over all machines)",
            cfg.path.display()
        ));
    }
    let ids = ns.get(D::gpu_ids).clone();
    let machines = machines_max(ns.get(D::num_machines));
    if let Value::String(ids) = &ids {
        if ids != "all" && ids.split(',').count() < 2 && ns.truthy(D::multi_gpu) && machines <= 1 {
            return Err("fewer than two --gpu_ids for multi-GPU training on one machine: give at least two, or --gpu_ids all".into());
        }
    }
    Ok(())
}

/// A configuration dictionary's key as a flag name (`dynamo_config`'s keys
/// get their prefix from 1.14 on: `dynamo_prefix`).
fn prefixed(dict: &str, key: &str, dynamo_prefix: bool) -> String {
    match dict {
        "fsdp_config" if !key.starts_with("fsdp") => format!("fsdp_{key}"),
        "fp8_config" if !key.starts_with("fp8") => format!("fp8_{key}"),
        "dynamo_config" if dynamo_prefix && !key.starts_with("dynamo_") => {
            format!("dynamo_{key}")
        }
        _ => key.to_owned(),
    }
}

/// The machine count, or MAX of `MIN:MAX` (1 when unset or unreadable: the
/// launch itself then reports the bad value).
pub fn machines_max(v: &Value) -> i64 {
    accel_agent::config::parse_nnodes(&crate::pyvalue::str_of(v))
        .map_or(1, |(_, max)| i64::from(max))
}

fn defaults_without_file(ns: &mut Namespace, machine: Machine, warned: &mut Vec<String>) {
    // The devices accelerate counts: from 1.16 on, none under --cpu.
    let devices = match ns.release.behaviour.process_default {
        ProcessDefault::Devices => machine.gpus,
        ProcessDefault::AtLeastOne if ns.truthy(D::cpu) => 0,
        ProcessDefault::AtLeastOne => machine.gpus,
    };
    if !ns.given(D::num_processes) {
        let n = match ns.release.behaviour.process_default {
            ProcessDefault::Devices => devices,
            ProcessDefault::AtLeastOne => devices.max(1),
        };
        ns.set(D::num_processes, json!(n));
        warned.push(format!("\t`--num_processes` was set to a value of `{n}`"));
    }
    let n = ns.int(D::num_processes).unwrap_or(0);
    if !ns.truthy(D::multi_gpu) && n > 1 && devices > 1 {
        warned.push(
            "\t\tMore than one GPU was found, enabling multi-GPU training.\n\
             \t\tIf this was unintended please pass in `--num_processes=1`."
                .into(),
        );
        ns.set(D::multi_gpu, json!(true));
    }
    if !ns.given(D::num_machines) {
        warned.push("\t`--num_machines` was set to a value of `1`".into());
        ns.set(D::num_machines, json!(1));
    }
    if !ns.given(D::mixed_precision) {
        warned.push("\t`--mixed_precision` was set to a value of `'no'`".into());
        ns.set(D::mixed_precision, json!("no"));
    }
    let cpu = ns.get(D::cpu).clone();
    ns.set(D::use_cpu, cpu);
    if !ns.given(D::dynamo_backend) {
        warned.push("\t`--dynamo_backend` was set to a value of `'no'`".into());
        ns.set(D::dynamo_backend, json!("no"));
    }
}

/// `--num_cpu_threads_per_process`: `$OMP_NUM_THREADS` or 1, and on CPUs
/// without `OMP_NUM_THREADS`, the physical cores shared by the local processes.
fn cpu_threads(
    ns: &mut Namespace,
    machine: Machine,
    env: &dyn Fn(&str) -> Option<String>,
    warned: &mut Vec<String>,
) -> Result<(), String> {
    if ns.given(D::num_cpu_threads_per_process) {
        return Ok(());
    }
    let int_env = |names: &[&str], default: i64| -> Result<i64, String> {
        for n in names {
            if let Some(v) = env(n) {
                return v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{n}={} is not a number", excerpt(&v)));
            }
        }
        Ok(default)
    };
    let omp = int_env(&["OMP_NUM_THREADS"], 1)?;
    ns.set(D::num_cpu_threads_per_process, json!(omp));
    let n = ns.int(D::num_processes).unwrap_or(0);
    if ns.truthy(D::use_cpu) && n >= 1 && int_env(&["OMP_NUM_THREADS"], 0)? == 0 {
        let machines = machines_max(ns.get(D::num_machines)).max(1);
        let local = int_env(
            &[
                "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MV2_COMM_WORLD_LOCAL_SIZE",
            ],
            ((n as f64 / machines as f64) as i64).max(1),
        )?;
        let threads = (f64::from(machine.physical_cores) / local.max(1) as f64) as i64;
        if threads > 1 {
            ns.set(D::num_cpu_threads_per_process, json!(threads));
            warned.push(format!(
                "\t`--num_cpu_threads_per_process` was set to `{threads}` to improve out-of-box performance when training on CPUs"
            ));
        }
    }
    Ok(())
}
