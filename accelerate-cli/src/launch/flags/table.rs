//! The flag table: accelerate 1.15's `launch` flags in its order, then
//! accel's own. Defaults are JSON literals of what argparse leaves when a flag
//! is not given (`null` for None).

use super::{Flag, Kind};

const fn f(name: &'static str, kind: Kind, default: &'static str, group: &'static str) -> Flag {
    Flag {
        name,
        dest: name,
        kind,
        default,
        choices: &[],
        group,
    }
}

const fn c(
    name: &'static str,
    default: &'static str,
    choices: &'static [&'static str],
    group: &'static str,
) -> Flag {
    Flag {
        name,
        dest: name,
        kind: Kind::Str,
        default,
        choices,
        group,
    }
}

use Kind::{Append, Flag as B, Float, Int, PyBool, Str as S, StrToBool, Triple};

const G: &str = "General";
const HW: &str = "Hardware Selection";
const RES: &str = "Resource Selection";
const PAR: &str = "Training Paradigm";
const DIST: &str = "Distributed GPUs";
const TPU: &str = "TPU";
const DS: &str = "DeepSpeed";
const FSDP: &str = "FSDP";
const MLM: &str = "Megatron-LM";
const FP8: &str = "FP8";
const AWS: &str = "AWS";
const MPI: &str = "MPI";
const PC: &str = "ParallelismConfig";
/// accel's additions (torchrun's options accelerate does not expose).
pub const ACCEL: &str = "accel (not in accelerate)";

/// Every flag, accelerate's first, in accelerate's order.
pub const FLAGS: &[Flag] = &[
    f("config_file", S, "null", G),
    f("quiet", B, "false", G),
    f("module", B, "false", G),
    f("no_python", B, "false", G),
    f("debug", B, "false", G),
    f("cpu", B, "false", HW),
    f("multi_gpu", B, "false", HW),
    f("tpu", B, "false", HW),
    c(
        "mixed_precision",
        "null",
        &crate::vocab::MixedPrecision::CHOICES,
        RES,
    ),
    f("num_processes", Int, "null", RES),
    // An integer in accelerate; accel also takes MIN:MAX.
    f("num_machines", S, "null", RES),
    f("num_cpu_threads_per_process", Int, "null", RES),
    f("enable_cpu_affinity", B, "false", RES),
    c(
        "dynamo_backend",
        "null",
        &crate::vocab::DynamoBackend::LAUNCH_CHOICES,
        RES,
    ),
    c(
        "dynamo_mode",
        "\"default\"",
        &["default", "reduce-overhead", "max-autotune"],
        RES,
    ),
    f("dynamo_use_fullgraph", B, "false", RES),
    f("dynamo_use_dynamic", B, "false", RES),
    f("dynamo_use_regional_compilation", B, "false", RES),
    f("use_deepspeed", B, "false", PAR),
    f("use_fsdp", B, "false", PAR),
    f("use_parallelism_config", B, "false", PAR),
    f("use_megatron_lm", B, "false", PAR),
    f("gpu_ids", S, "null", DIST),
    f("same_network", B, "false", DIST),
    f("machine_rank", Int, "null", DIST),
    f("main_process_ip", S, "null", DIST),
    f("main_process_port", Int, "null", DIST),
    f("tee", S, "\"0\"", DIST),
    f("log_dir", S, "null", DIST),
    f("role", S, "\"default\"", DIST),
    f("rdzv_backend", S, "\"static\"", DIST),
    f("rdzv_conf", S, "\"\"", DIST),
    f("max_restarts", Int, "0", DIST),
    f("monitor_interval", Float, "0.1", DIST),
    Flag {
        name: "tpu_cluster",
        dest: "tpu_use_cluster",
        kind: B,
        default: "false",
        choices: &[],
        group: TPU,
    },
    Flag {
        name: "no_tpu_cluster",
        dest: "tpu_use_cluster",
        kind: Kind::SetTrue,
        default: "false",
        choices: &[],
        group: TPU,
    },
    f("tpu_use_sudo", B, "false", TPU),
    f("vm", Append, "null", TPU),
    f("env", Append, "null", TPU),
    f("main_training_function", S, "null", TPU),
    f("downcast_bf16", B, "false", TPU),
    f("deepspeed_config_file", S, "null", DS),
    f("zero_stage", Int, "null", DS),
    f("offload_optimizer_device", S, "null", DS),
    f("offload_param_device", S, "null", DS),
    f("offload_optimizer_nvme_path", S, "null", DS),
    f("offload_param_nvme_path", S, "null", DS),
    f("gradient_accumulation_steps", Int, "null", DS),
    f("gradient_clipping", Float, "null", DS),
    f("zero3_init_flag", S, "null", DS),
    f("zero3_save_16bit_model", S, "null", DS),
    f("deepspeed_hostfile", S, "null", DS),
    f("deepspeed_exclusion_filter", S, "null", DS),
    f("deepspeed_inclusion_filter", S, "null", DS),
    f("deepspeed_multinode_launcher", S, "null", DS),
    f("deepspeed_moe_layer_cls_names", S, "null", DS),
    c("fsdp_version", "\"1\"", &["1", "2"], FSDP),
    f("fsdp_offload_params", S, "\"false\"", FSDP),
    f("fsdp_min_num_params", Int, "100000000", FSDP),
    f("fsdp_sharding_strategy", S, "\"FULL_SHARD\"", FSDP),
    f("fsdp_reshard_after_forward", S, "\"true\"", FSDP),
    f("fsdp_auto_wrap_policy", S, "null", FSDP),
    f("fsdp_transformer_layer_cls_to_wrap", S, "null", FSDP),
    f("fsdp_backward_prefetch", S, "null", FSDP),
    f("fsdp_state_dict_type", S, "null", FSDP),
    f("fsdp_forward_prefetch", S, "\"false\"", FSDP),
    f("fsdp_use_orig_params", S, "\"true\"", FSDP),
    f("fsdp_cpu_ram_efficient_loading", S, "\"true\"", FSDP),
    f("fsdp_sync_module_states", S, "\"true\"", FSDP),
    f("fsdp_activation_checkpointing", S, "\"false\"", FSDP),
    f(
        "fsdp_activation_checkpointing_offload",
        S,
        "\"false\"",
        FSDP,
    ),
    f("megatron_lm_tp_degree", Int, "1", MLM),
    f("megatron_lm_use_custom_fsdp", PyBool, "false", MLM),
    f("megatron_lm_no_load_optim", PyBool, "false", MLM),
    f("megatron_lm_eod_mask_loss", PyBool, "false", MLM),
    f(
        "megatron_lm_overlap_cpu_optimizer_d2h_h2d",
        PyBool,
        "false",
        MLM,
    ),
    f("megatron_lm_no_save_optim", PyBool, "false", MLM),
    f("megatron_lm_optimizer_cpu_offload", PyBool, "false", MLM),
    f(
        "megatron_lm_use_precision_aware_optimizer",
        PyBool,
        "false",
        MLM,
    ),
    f(
        "megatron_lm_decoder_last_pipeline_num_layers",
        Int,
        "null",
        MLM,
    ),
    f("megatron_lm_pp_degree", Int, "1", MLM),
    f("megatron_lm_num_micro_batches", Int, "null", MLM),
    f("megatron_lm_sequence_parallelism", S, "null", MLM),
    f("megatron_lm_recompute_activations", S, "null", MLM),
    f("megatron_lm_use_distributed_optimizer", S, "null", MLM),
    f("megatron_lm_gradient_clipping", Float, "1.0", MLM),
    f("megatron_lm_recompute_granularity", S, "null", MLM),
    f("megatron_lm_recompute_method", S, "null", MLM),
    f("megatron_lm_recompute_num_layers", Int, "null", MLM),
    f("megatron_lm_attention_backend", S, "null", MLM),
    f("megatron_lm_expert_model_parallel_size", Int, "null", MLM),
    f("megatron_lm_context_parallel_size", Int, "null", MLM),
    f("megatron_lm_attention_dropout", Float, "null", MLM),
    f("megatron_lm_hidden_dropout", Float, "null", MLM),
    f("megatron_lm_attention_softmax_in_fp32", S, "null", MLM),
    f("megatron_lm_expert_tensor_parallel_size", Int, "null", MLM),
    f("megatron_lm_calculate_per_token_loss", S, "null", MLM),
    f("megatron_lm_use_rotary_position_embeddings", S, "null", MLM),
    c("fp8_backend", "null", &["ao", "te", "msamp"], FP8),
    f("fp8_use_autocast_during_eval", B, "false", FP8),
    f("fp8_margin", Int, "0", FP8),
    f("fp8_interval", Int, "1", FP8),
    c("fp8_format", "\"HYBRID\"", &["HYBRID", "E4M3", "E5M2"], FP8),
    f("fp8_amax_history_len", Int, "1024", FP8),
    c(
        "fp8_amax_compute_algo",
        "\"most_recent\"",
        &["max", "most_recent"],
        FP8,
    ),
    f(
        "fp8_override_linear_precision",
        Triple,
        "[false, false, false]",
        FP8,
    ),
    c("fp8_opt_level", "\"O2\"", &["O1", "O2"], FP8),
    f("fp8_enable_fsdp_float8_all_gather", StrToBool, "1", FP8),
    f("fp8_pad_inner_dim", StrToBool, "1", FP8),
    f("aws_access_key_id", S, "null", AWS),
    f("aws_secret_access_key", S, "null", AWS),
    f("mpirun_hostfile", S, "null", MPI),
    f("parallelism_config_dp_replicate_size", Int, "1", PC),
    f("parallelism_config_dp_shard_size", Int, "1", PC),
    f("parallelism_config_tp_size", Int, "1", PC),
    f("parallelism_config_cp_size", Int, "1", PC),
    c("parallelism_config_cp_backend", "\"torch\"", &["torch"], PC),
    f(
        "parallelism_config_cp_comm_strategy",
        S,
        "\"allgather\"",
        PC,
    ),
    f("parallelism_config_sp_size", Int, "1", PC),
    c(
        "parallelism_config_sp_backend",
        "\"deepspeed\"",
        &["deepspeed"],
        PC,
    ),
    f("parallelism_config_sp_seq_length", S, "null", PC),
    f(
        "parallelism_config_sp_seq_length_is_variable",
        PyBool,
        "true",
        PC,
    ),
    f(
        "parallelism_config_sp_attn_implementation",
        S,
        "\"sdpa\"",
        PC,
    ),
    f("rdzv_id", S, "null", ACCEL),
    f("nproc_per_node", Int, "null", ACCEL),
    f("log_line_prefix_template", S, "null", ACCEL),
    f("redirects", S, "\"0\"", ACCEL),
    f("local_ranks_filter", S, "\"\"", ACCEL),
    f("ranks_filter", S, "\"\"", ACCEL),
    f("shutdown_timeout", S, "null", ACCEL),
    f("preload", S, "null", ACCEL),
    f("restart_backoff", S, "null", ACCEL),
    f("restart_backoff_window", S, "null", ACCEL),
    f("health_check", S, "null", ACCEL),
    f("health_check_timeout", S, "null", ACCEL),
    f("gpu_free_timeout", S, "null", ACCEL),
];
