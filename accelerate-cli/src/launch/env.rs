//! The variables accelerate gives training processes (reference:
//! accelerate §3.7), with accelerate's names and value spellings: Python's
//! `str()` of each value (`True`, `1.0`, `None`), lower-cased where
//! accelerate lower-cases.
//!
//! Which variables are set depends on the launcher accelerate would pick:
//! the simple one (one process, or accel's agent for several CPU
//! processes), the multi-GPU one (torchrun), or DeepSpeed's.
//!
//! Gaps accelerate leaves, fixed here (each listed in the README):
//! - `--offload_{optimizer,param}_nvme_path` reach the script as
//!   `ACCELERATE_DEEPSPEED_OFFLOAD_{OPTIMIZER,PARAM}_NVME_PATH`, the names
//!   accelerate's DeepSpeed plugin reads (accelerate never exports them);
//! - `ACCELERATE_FP8_BACKEND` is upper-case (`TE`), which the reader parses;
//! - the fp8 keys `accelerate config` writes (`amax_history_length`,
//!   `amax_compute_algorithm`, `optimization_level`) are also exported under
//!   the names the reader uses (`..._AMAX_HISTORY_LEN`, `..._AMAX_COMPUTE_ALGO`,
//!   `..._OPT_LEVEL`);
//! - `PARALLELISM_CONFIG_SP_SEQ_LENGTH` is left out when unset instead of
//!   being the text `None`.

use rendezvous_server::input::excerpt;
use serde_json::Value;

use super::flags::{str_to_bool, Namespace};

/// The launcher accelerate would use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `simple_launcher`: no distributed framework.
    Simple,
    /// `multi_gpu_launcher`: torchrun (multi-GPU, FSDP, Megatron-LM).
    MultiGpu,
    /// `deepspeed_launcher`.
    DeepSpeed,
}

pub use crate::pyvalue::{repr as py_repr, str_of as py_str, truthy};
use crate::vocab::{DynamoBackend, MixedPrecision};

/// The variables for `launcher`. `ds_fields` is DeepSpeed's
/// `ACCELERATE_CONFIG_DS_FIELDS` list; `cwd` the working directory and
/// `env` the launcher's own environment (for `PYTHONPATH`).
pub fn accelerate_env(
    ns: &Namespace,
    launcher: Launcher,
    ds_fields: &[String],
    cwd: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| out.push((k.to_owned(), v));
    let s = |k: &str| py_str(ns.get(k));
    let lc = |k: &str| py_str(ns.get(k)).to_lowercase();
    let use_cpu = py_str(if truthy(ns.get("cpu")) {
        ns.get("cpu")
    } else {
        ns.get("use_cpu")
    });
    if launcher == Launcher::Simple {
        set("ACCELERATE_USE_CPU", use_cpu.clone());
    }
    if ns.truthy("debug") {
        set("ACCELERATE_DEBUG_MODE", "true".into());
    }
    let ids = ns.get("gpu_ids");
    if !ids.is_null() && ids != "all" {
        set("CUDA_VISIBLE_DEVICES", py_str(ids));
    }
    if launcher == Launcher::Simple && str_to_bool(&use_cpu) == Some(true) {
        set("KMP_AFFINITY", "granularity=fine,compact,1,0".into());
        set("KMP_BLOCKTIME", "1".into());
    }
    if launcher == Launcher::DeepSpeed {
        let mut paths: Vec<String> = env("PYTHONPATH")
            .unwrap_or_default()
            .split(':')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        paths.push(cwd.to_owned());
        set("PYTHONPATH", paths.join(":"));
    }
    let mp = match ns.get("mixed_precision") {
        Value::String(m) => m.to_lowercase(),
        other => {
            return Err(format!(
                "mixed_precision {} is not one of no, fp16, bf16, fp8",
                excerpt(&py_repr(other))
            ))
        }
    };
    if MixedPrecision::parse(&mp).is_none() {
        return Err(format!(
            "unknown mixed_precision '{}': choose one of no, fp8, fp16, bf16",
            excerpt(&mp)
        ));
    }
    set("ACCELERATE_MIXED_PRECISION", mp.clone());
    if mp == "fp8" {
        fp8_env(ns, &mut set);
    }
    if launcher == Launcher::DeepSpeed {
        set(
            "ACCELERATE_CONFIG_DS_FIELDS",
            ds_fields.join(",").to_lowercase(),
        );
        set("ACCELERATE_USE_DEEPSPEED", "true".into());
        for (flag, var, lower) in [
            ("zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE", false),
            (
                "gradient_accumulation_steps",
                "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                false,
            ),
            ("gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING", true),
            (
                "offload_optimizer_device",
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
                true,
            ),
            (
                "offload_param_device",
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
                true,
            ),
            // accel's fix: accelerate's plugin reads these, its launcher never sets them.
            (
                "offload_optimizer_nvme_path",
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
                false,
            ),
            (
                "offload_param_nvme_path",
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
                false,
            ),
            ("zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT", true),
            (
                "zero3_save_16bit_model",
                "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
                true,
            ),
            (
                "deepspeed_config_file",
                "ACCELERATE_DEEPSPEED_CONFIG_FILE",
                false,
            ),
        ] {
            if !ns.get(flag).is_null() {
                set(var, if lower { lc(flag) } else { s(flag) });
            }
        }
    } else {
        let backend = py_str(ns.get("dynamo_backend")).to_uppercase();
        if DynamoBackend::parse(&backend).is_none() {
            let names: Vec<&str> = DynamoBackend::ALL.map(DynamoBackend::name).to_vec();
            return Err(format!(
                "unknown dynamo backend '{}': choose one of {}",
                excerpt(&backend),
                names.join(", ")
            ));
        }
        set("ACCELERATE_DYNAMO_BACKEND", backend);
        set("ACCELERATE_DYNAMO_MODE", s("dynamo_mode"));
        set("ACCELERATE_DYNAMO_USE_FULLGRAPH", s("dynamo_use_fullgraph"));
        set("ACCELERATE_DYNAMO_USE_DYNAMIC", s("dynamo_use_dynamic"));
        set(
            "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
            s("dynamo_use_regional_compilation"),
        );
    }
    if launcher == Launcher::MultiGpu && ns.truthy("use_fsdp") {
        fsdp_env(ns, &mut set)?;
    }
    if launcher == Launcher::MultiGpu && ns.truthy("use_megatron_lm") {
        megatron_env(ns, &mut set);
    }
    if launcher != Launcher::DeepSpeed {
        set("OMP_NUM_THREADS", s("num_cpu_threads_per_process"));
    }
    if ns.truthy("enable_cpu_affinity") {
        set("ACCELERATE_CPU_AFFINITY", "1".into());
    }
    if launcher == Launcher::DeepSpeed && !ns.get("deepspeed_moe_layer_cls_names").is_null() {
        set(
            "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
            s("deepspeed_moe_layer_cls_names"),
        );
    }
    if launcher != Launcher::Simple && ns.truthy("use_parallelism_config") {
        parallelism_env(ns, &mut set);
    }
    Ok(out)
}

type Set<'a> = dyn FnMut(&str, String) + 'a;

fn fp8_env(ns: &Namespace, set: &mut Set<'_>) {
    for (name, v) in ns.values.iter().filter(|(k, _)| k.starts_with("fp8_")) {
        if v.is_null() {
            continue;
        }
        if name == "fp8_override_linear_precision" {
            let items = v.as_array().cloned().unwrap_or_default();
            for (i, part) in ["FPROP", "DGRAD", "WGRAD"].iter().enumerate() {
                let item = items.get(i).cloned().unwrap_or(Value::Null);
                set(&format!("ACCELERATE_FP8_OVERRIDE_{part}"), py_str(&item));
            }
            continue;
        }
        let var = format!("ACCELERATE_{}", name.to_uppercase());
        let value = if name == "fp8_backend" {
            py_str(v).to_uppercase()
        } else {
            py_str(v)
        };
        // accel's fix: the questionnaire's key names, also under the reader's.
        let alias = match name.as_str() {
            "fp8_amax_history_length" => Some("ACCELERATE_FP8_AMAX_HISTORY_LEN"),
            "fp8_amax_compute_algorithm" => Some("ACCELERATE_FP8_AMAX_COMPUTE_ALGO"),
            "fp8_optimization_level" => Some("ACCELERATE_FP8_OPT_LEVEL"),
            _ => None,
        };
        set(&var, value.clone());
        if let Some(alias) = alias {
            set(alias, value);
        }
    }
}

fn fsdp_env(ns: &Namespace, set: &mut Set<'_>) -> Result<(), String> {
    let s = |k: &str| py_str(ns.get(k));
    let lc = |k: &str| py_str(ns.get(k)).to_lowercase();
    set("ACCELERATE_USE_FSDP", "true".into());
    if ns.truthy("fsdp_cpu_ram_efficient_loading") && !ns.truthy("fsdp_sync_module_states") {
        return Err(
            "fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states: set --fsdp_sync_module_states true".into(),
        );
    }
    set("FSDP_VERSION", s("fsdp_version"));
    set("FSDP_SHARDING_STRATEGY", s("fsdp_sharding_strategy"));
    set(
        "FSDP_RESHARD_AFTER_FORWARD",
        lc("fsdp_reshard_after_forward"),
    );
    set("FSDP_OFFLOAD_PARAMS", lc("fsdp_offload_params"));
    set("FSDP_MIN_NUM_PARAMS", s("fsdp_min_num_params"));
    for (flag, var) in [
        ("fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY"),
        (
            "fsdp_transformer_layer_cls_to_wrap",
            "FSDP_TRANSFORMER_CLS_TO_WRAP",
        ),
        ("fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH"),
        ("fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE"),
    ] {
        if !ns.get(flag).is_null() {
            set(var, s(flag));
        }
    }
    for (flag, var) in [
        ("fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH"),
        ("fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS"),
        (
            "fsdp_cpu_ram_efficient_loading",
            "FSDP_CPU_RAM_EFFICIENT_LOADING",
        ),
        ("fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES"),
        (
            "fsdp_activation_checkpointing",
            "FSDP_ACTIVATION_CHECKPOINTING",
        ),
        (
            "fsdp_activation_checkpointing_offload",
            "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD",
        ),
    ] {
        set(var, lc(flag));
    }
    if !ns.attr("fsdp_ignored_modules").is_null() {
        set(
            "FSDP_IGNORED_MODULES",
            py_str(ns.attr("fsdp_ignored_modules")),
        );
    }
    Ok(())
}

/// Megatron-LM settings: (flag suffix, always set).
const MEGATRON: &[(&str, bool)] = &[
    ("tp_degree", true),
    ("use_custom_fsdp", true),
    ("no_load_optim", false),
    ("eod_mask_loss", false),
    ("no_save_optim", false),
    ("optimizer_cpu_offload", false),
    ("use_precision_aware_optimizer", false),
    ("overlap_cpu_optimizer_d2h_h2d", false),
    ("decoder_last_pipeline_num_layers", false),
    ("pp_degree", true),
    ("gradient_clipping", true),
    ("num_micro_batches", false),
    ("sequence_parallelism", false),
    ("recompute_activations", false),
    ("use_distributed_optimizer", false),
    ("recompute_granularity", false),
    ("recompute_method", false),
    ("recompute_num_layers", false),
    ("attention_backend", false),
    ("expert_model_parallel_size", false),
    ("context_parallel_size", false),
    ("attention_dropout", false),
    ("hidden_dropout", false),
    ("attention_softmax_in_fp32", false),
    ("expert_tensor_parallel_size", false),
    ("calculate_per_token_loss", false),
    ("use_rotary_position_embeddings", false),
];

fn megatron_env(ns: &Namespace, set: &mut Set<'_>) {
    set("ACCELERATE_USE_MEGATRON_LM", "true".into());
    for (suffix, always) in MEGATRON {
        let v = ns.get(&format!("megatron_lm_{suffix}"));
        if *always || !v.is_null() {
            set(&format!("MEGATRON_LM_{}", suffix.to_uppercase()), py_str(v));
        }
    }
}

fn parallelism_env(ns: &Namespace, set: &mut Set<'_>) {
    let pc = |k: &str| py_str(ns.get(&format!("parallelism_config_{k}")));
    let int = |k: &str| {
        ns.get(&format!("parallelism_config_{k}"))
            .as_i64()
            .unwrap_or(1)
    };
    set("ACCELERATE_USE_PARALLELISM_CONFIG", "true".into());
    for k in [
        "dp_replicate_size",
        "dp_shard_size",
        "tp_size",
        "cp_size",
        "cp_backend",
        "sp_size",
        "sp_backend",
    ] {
        set(&format!("PARALLELISM_CONFIG_{}", k.to_uppercase()), pc(k));
    }
    if int("cp_size") > 1 {
        set(
            "PARALLELISM_CONFIG_CP_COMM_STRATEGY",
            pc("cp_comm_strategy"),
        );
    }
    if int("sp_size") > 1 {
        // accel's fix: no `None` text when the length is unset.
        if !ns.get("parallelism_config_sp_seq_length").is_null() {
            set("PARALLELISM_CONFIG_SP_SEQ_LENGTH", pc("sp_seq_length"));
        }
        set(
            "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE",
            pc("sp_seq_length_is_variable"),
        );
        set(
            "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION",
            pc("sp_attn_implementation"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_spellings() {
        assert_eq!(py_str(&json!(true)), "True");
        assert_eq!(py_str(&json!(1.0)), "1.0");
        assert_eq!(py_str(&json!(null)), "None");
        assert_eq!(py_str(&json!(["a", 1])), "['a', 1]");
        assert_eq!(py_str(&json!({"k": "v"})), "{'k': 'v'}");
    }
}
