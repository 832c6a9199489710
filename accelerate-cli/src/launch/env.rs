//! The variables accelerate gives training processes (reference:
//! accelerate §3.7), with accelerate's names and value spellings: Python's
//! `str()` of each value (`True`, `1.0`, `None`), lower-cased where
//! accelerate lower-cases.
//!
//! Which variables are set depends on the launcher accelerate would pick:
//! the simple one (one process, or accel's agent for several CPU
//! processes), the multi-GPU one (torchrun), or DeepSpeed's; and on the
//! installed accelerate release (`ns.release`, see [`crate::release`]).
//!
//! Gaps accelerate leaves, fixed here (each listed in the user guide):
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

use accel_input::excerpt;
use serde_json::Value;

use super::flags::{str_to_bool, Dest, Dest as D, Namespace};

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
use crate::release::KmpVars;
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
    let s = |k: Dest| ns.text(k);
    let lc = |k: Dest| ns.text(k).to_lowercase();
    let use_cpu = py_str(if truthy(ns.get(D::cpu)) {
        ns.get(D::cpu)
    } else {
        ns.get(D::use_cpu)
    });
    if launcher == Launcher::Simple {
        set("ACCELERATE_USE_CPU", use_cpu.clone());
    }
    if ns.truthy(D::debug) {
        set("ACCELERATE_DEBUG_MODE", "true".into());
    }
    let ids = ns.get(D::gpu_ids);
    if !ids.is_null() && ids != "all" {
        set("CUDA_VISIBLE_DEVICES", py_str(ids));
    }
    let release = ns.release.behaviour;
    if launcher == Launcher::Simple {
        let processes = ns.int(D::num_processes).unwrap_or(1);
        let machines = super::merge::machines_max(ns.get(D::num_machines));
        if release.ccl_worker_count && (processes > 1 || machines > 1) {
            // oneCCL's worker count, 0 without its Python bindings (accel
            // cannot ask Python whether they are installed).
            set("CCL_WORKER_COUNT", "0".into());
        }
        let kmp = match release.kmp_vars {
            KmpVars::Always => true,
            KmpVars::Never => false,
            KmpVars::OnCpu => str_to_bool(&use_cpu) == Some(true),
        };
        if kmp {
            set("KMP_AFFINITY", "granularity=fine,compact,1,0".into());
            set("KMP_BLOCKTIME", "1".into());
        }
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
    let mp = match ns.get(D::mixed_precision) {
        Value::String(m) => m.to_lowercase(),
        other => {
            return Err(format!(
                "mixed_precision {} is not one of no, fp16, bf16, fp8",
                excerpt(&py_repr(other))
            ))
        }
    };
    let Some(mode) = MixedPrecision::parse(&mp) else {
        return Err(format!(
            "unknown mixed_precision '{}': choose one of no, fp8, fp16, bf16",
            excerpt(&mp)
        ));
    };
    set("ACCELERATE_MIXED_PRECISION", mode.name().to_owned());
    if mode == MixedPrecision::Fp8 {
        fp8_env(ns, &mut set);
    }
    if launcher == Launcher::DeepSpeed {
        set(
            "ACCELERATE_CONFIG_DS_FIELDS",
            ds_fields.join(",").to_lowercase(),
        );
        set("ACCELERATE_USE_DEEPSPEED", "true".into());
        for (flag, var, lower) in [
            (D::zero_stage, "ACCELERATE_DEEPSPEED_ZERO_STAGE", false),
            (
                D::gradient_accumulation_steps,
                "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
                false,
            ),
            (D::gradient_clipping, "ACCELERATE_GRADIENT_CLIPPING", true),
            (
                D::offload_optimizer_device,
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
                true,
            ),
            (
                D::offload_param_device,
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
                true,
            ),
            // accel's fix: accelerate's plugin reads these, its launcher never sets them.
            (
                D::offload_optimizer_nvme_path,
                "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
                false,
            ),
            (
                D::offload_param_nvme_path,
                "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
                false,
            ),
            (D::zero3_init_flag, "ACCELERATE_DEEPSPEED_ZERO3_INIT", true),
            (
                D::zero3_save_16bit_model,
                "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
                true,
            ),
            (
                D::deepspeed_config_file,
                "ACCELERATE_DEEPSPEED_CONFIG_FILE",
                false,
            ),
        ] {
            if ns.given(flag) {
                set(var, if lower { lc(flag) } else { s(flag) });
            }
        }
    } else {
        let backend = ns.text(D::dynamo_backend).to_uppercase();
        if DynamoBackend::parse(&backend).is_none() {
            let names: Vec<&str> = DynamoBackend::ALL.map(DynamoBackend::name).to_vec();
            return Err(format!(
                "unknown dynamo backend '{}': choose one of {}",
                excerpt(&backend),
                names.join(", ")
            ));
        }
        set("ACCELERATE_DYNAMO_BACKEND", backend);
        set("ACCELERATE_DYNAMO_MODE", s(D::dynamo_mode));
        set(
            "ACCELERATE_DYNAMO_USE_FULLGRAPH",
            s(D::dynamo_use_fullgraph),
        );
        if !release.dynamo_dynamic_optional || ns.given(D::dynamo_use_dynamic) {
            set("ACCELERATE_DYNAMO_USE_DYNAMIC", s(D::dynamo_use_dynamic));
        }
        set(
            "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
            s(D::dynamo_use_regional_compilation),
        );
    }
    if launcher == Launcher::MultiGpu && ns.truthy(D::use_fsdp) {
        fsdp_env(ns, &mut set)?;
    }
    if launcher == Launcher::MultiGpu && ns.truthy(D::use_megatron_lm) {
        megatron_env(ns, &mut set);
    }
    if launcher != Launcher::DeepSpeed {
        set("OMP_NUM_THREADS", s(D::num_cpu_threads_per_process));
    }
    if ns.truthy(D::enable_cpu_affinity) {
        set("ACCELERATE_CPU_AFFINITY", "1".into());
    }
    if launcher == Launcher::DeepSpeed && ns.given(D::deepspeed_moe_layer_cls_names) {
        set(
            "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
            s(D::deepspeed_moe_layer_cls_names),
        );
    }
    let parallelism_launcher = match launcher {
        Launcher::Simple => false,
        Launcher::MultiGpu => true,
        Launcher::DeepSpeed => release.parallelism_sequence,
    };
    if parallelism_launcher && ns.truthy(D::use_parallelism_config) {
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
    let s = |k: Dest| ns.text(k);
    let lc = |k: Dest| ns.text(k).to_lowercase();
    set("ACCELERATE_USE_FSDP", "true".into());
    if ns.truthy(D::fsdp_cpu_ram_efficient_loading) && !ns.truthy(D::fsdp_sync_module_states) {
        return Err(
            "fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states: set --fsdp_sync_module_states true".into(),
        );
    }
    set("FSDP_VERSION", s(D::fsdp_version));
    set("FSDP_SHARDING_STRATEGY", s(D::fsdp_sharding_strategy));
    set(
        "FSDP_RESHARD_AFTER_FORWARD",
        lc(D::fsdp_reshard_after_forward),
    );
    set("FSDP_OFFLOAD_PARAMS", lc(D::fsdp_offload_params));
    set("FSDP_MIN_NUM_PARAMS", s(D::fsdp_min_num_params));
    for (flag, var) in [
        (D::fsdp_auto_wrap_policy, "FSDP_AUTO_WRAP_POLICY"),
        (
            D::fsdp_transformer_layer_cls_to_wrap,
            "FSDP_TRANSFORMER_CLS_TO_WRAP",
        ),
        (D::fsdp_backward_prefetch, "FSDP_BACKWARD_PREFETCH"),
        (D::fsdp_state_dict_type, "FSDP_STATE_DICT_TYPE"),
    ] {
        if ns.given(flag) {
            set(var, s(flag));
        }
    }
    for (flag, var) in [
        (D::fsdp_forward_prefetch, "FSDP_FORWARD_PREFETCH"),
        (D::fsdp_use_orig_params, "FSDP_USE_ORIG_PARAMS"),
        (
            D::fsdp_cpu_ram_efficient_loading,
            "FSDP_CPU_RAM_EFFICIENT_LOADING",
        ),
        (D::fsdp_sync_module_states, "FSDP_SYNC_MODULE_STATES"),
        (
            D::fsdp_activation_checkpointing,
            "FSDP_ACTIVATION_CHECKPOINTING",
        ),
        (
            D::fsdp_activation_checkpointing_offload,
            "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD",
        ),
    ] {
        if ns.release.has_flag(flag) {
            set(var, lc(flag));
        }
    }
    if !ns.attr("fsdp_ignored_modules").is_null() {
        set(
            "FSDP_IGNORED_MODULES",
            py_str(ns.attr("fsdp_ignored_modules")),
        );
    }
    Ok(())
}

/// Megatron-LM settings, each to `MEGATRON_LM_<SUFFIX>`: (flag, always set).
const MEGATRON: &[(Dest, bool)] = &[
    (D::megatron_lm_tp_degree, true),
    (D::megatron_lm_use_custom_fsdp, true),
    (D::megatron_lm_no_load_optim, false),
    (D::megatron_lm_eod_mask_loss, false),
    (D::megatron_lm_no_save_optim, false),
    (D::megatron_lm_optimizer_cpu_offload, false),
    (D::megatron_lm_use_precision_aware_optimizer, false),
    (D::megatron_lm_overlap_cpu_optimizer_d2h_h2d, false),
    (D::megatron_lm_decoder_last_pipeline_num_layers, false),
    (D::megatron_lm_pp_degree, true),
    (D::megatron_lm_gradient_clipping, true),
    (D::megatron_lm_num_micro_batches, false),
    (D::megatron_lm_sequence_parallelism, false),
    (D::megatron_lm_recompute_activations, false),
    (D::megatron_lm_use_distributed_optimizer, false),
    (D::megatron_lm_recompute_granularity, false),
    (D::megatron_lm_recompute_method, false),
    (D::megatron_lm_recompute_num_layers, false),
    (D::megatron_lm_attention_backend, false),
    (D::megatron_lm_expert_model_parallel_size, false),
    (D::megatron_lm_context_parallel_size, false),
    (D::megatron_lm_attention_dropout, false),
    (D::megatron_lm_hidden_dropout, false),
    (D::megatron_lm_attention_softmax_in_fp32, false),
    (D::megatron_lm_expert_tensor_parallel_size, false),
    (D::megatron_lm_calculate_per_token_loss, false),
    (D::megatron_lm_use_rotary_position_embeddings, false),
];

fn megatron_env(ns: &Namespace, set: &mut Set<'_>) {
    set("ACCELERATE_USE_MEGATRON_LM", "true".into());
    for &(flag, always) in MEGATRON {
        if (always && ns.release.has_flag(flag)) || ns.given(flag) {
            set(&flag.name().to_uppercase(), ns.text(flag));
        }
    }
}

fn parallelism_env(ns: &Namespace, set: &mut Set<'_>) {
    set("ACCELERATE_USE_PARALLELISM_CONFIG", "true".into());
    // Each flag to the variable of its name in capitals.
    let mut pass = |flag: Dest| set(&flag.name().to_uppercase(), ns.text(flag));
    if !ns.release.behaviour.parallelism_sequence {
        // Before 1.12: the four sizes, and the context-parallel strategy.
        for flag in [
            D::parallelism_config_dp_replicate_size,
            D::parallelism_config_tp_size,
            D::parallelism_config_cp_size,
            D::parallelism_config_dp_shard_size,
        ] {
            pass(flag);
        }
        if ns.int(D::parallelism_config_cp_size).unwrap_or(1) > 1 {
            pass(D::parallelism_config_cp_comm_strategy);
        }
        return;
    }
    for flag in [
        D::parallelism_config_dp_replicate_size,
        D::parallelism_config_dp_shard_size,
        D::parallelism_config_tp_size,
        D::parallelism_config_cp_size,
        D::parallelism_config_cp_backend,
        D::parallelism_config_sp_size,
        D::parallelism_config_sp_backend,
    ] {
        pass(flag);
    }
    if ns.int(D::parallelism_config_cp_size).unwrap_or(1) > 1 {
        pass(D::parallelism_config_cp_comm_strategy);
    }
    if ns.int(D::parallelism_config_sp_size).unwrap_or(1) > 1 {
        // accel's fix: no `None` text when the length is unset.
        if ns.given(D::parallelism_config_sp_seq_length) {
            pass(D::parallelism_config_sp_seq_length);
        }
        pass(D::parallelism_config_sp_seq_length_is_variable);
        pass(D::parallelism_config_sp_attn_implementation);
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
