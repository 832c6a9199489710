//! The flag table: accelerate's `launch` flags in its order (1.15's, plus
//! `--use_xpu` and `--mpirun_ccl`, which 1.13 removed; which release lacks
//! which flag is `crate::release`'s table), then accel's own, and [`Dest`],
//! their destinations. Defaults are JSON literals
//! of what argparse leaves when a flag is not given (`null` for None).

use super::{Flag, Kind};

use Dest as D;

/// Declares [`Dest`] from the destinations, in the table's order.
macro_rules! destinations {
    ($($d:ident),* $(,)?) => {
        /// Where a flag's value goes: accelerate's argparse destination,
        /// spelt as accelerate spells it (so a search for a flag finds its
        /// reads). The launcher reads the namespace only by these, so a
        /// misspelt name does not compile.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Dest {
            $(
                #[allow(missing_docs)]
                $d,
            )*
        }

        impl Dest {
            /// Every destination, in the table's order.
            pub const ALL: &'static [Dest] = &[$(Dest::$d),*];

            /// The attribute name (`num_processes`).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Dest::$d => stringify!($d),)*
                }
            }
        }
    };
}

destinations! {
    config_file,
    quiet,
    module,
    no_python,
    debug,
    cpu,
    multi_gpu,
    tpu,
    mixed_precision,
    num_processes,
    num_machines,
    num_cpu_threads_per_process,
    enable_cpu_affinity,
    dynamo_backend,
    dynamo_mode,
    dynamo_use_fullgraph,
    dynamo_use_dynamic,
    dynamo_use_regional_compilation,
    use_deepspeed,
    use_fsdp,
    use_parallelism_config,
    use_megatron_lm,
    use_xpu,
    gpu_ids,
    same_network,
    machine_rank,
    main_process_ip,
    main_process_port,
    tee,
    log_dir,
    role,
    rdzv_backend,
    rdzv_conf,
    max_restarts,
    monitor_interval,
    tpu_use_cluster,
    tpu_use_sudo,
    vm,
    env,
    main_training_function,
    downcast_bf16,
    deepspeed_config_file,
    zero_stage,
    offload_optimizer_device,
    offload_param_device,
    offload_optimizer_nvme_path,
    offload_param_nvme_path,
    gradient_accumulation_steps,
    gradient_clipping,
    zero3_init_flag,
    zero3_save_16bit_model,
    deepspeed_hostfile,
    deepspeed_exclusion_filter,
    deepspeed_inclusion_filter,
    deepspeed_multinode_launcher,
    deepspeed_moe_layer_cls_names,
    fsdp_version,
    fsdp_offload_params,
    fsdp_min_num_params,
    fsdp_sharding_strategy,
    fsdp_reshard_after_forward,
    fsdp_auto_wrap_policy,
    fsdp_transformer_layer_cls_to_wrap,
    fsdp_backward_prefetch,
    fsdp_state_dict_type,
    fsdp_forward_prefetch,
    fsdp_use_orig_params,
    fsdp_cpu_ram_efficient_loading,
    fsdp_sync_module_states,
    fsdp_activation_checkpointing,
    fsdp_activation_checkpointing_offload,
    megatron_lm_tp_degree,
    megatron_lm_use_custom_fsdp,
    megatron_lm_no_load_optim,
    megatron_lm_eod_mask_loss,
    megatron_lm_overlap_cpu_optimizer_d2h_h2d,
    megatron_lm_no_save_optim,
    megatron_lm_optimizer_cpu_offload,
    megatron_lm_use_precision_aware_optimizer,
    megatron_lm_decoder_last_pipeline_num_layers,
    megatron_lm_pp_degree,
    megatron_lm_num_micro_batches,
    megatron_lm_sequence_parallelism,
    megatron_lm_recompute_activations,
    megatron_lm_use_distributed_optimizer,
    megatron_lm_gradient_clipping,
    megatron_lm_recompute_granularity,
    megatron_lm_recompute_method,
    megatron_lm_recompute_num_layers,
    megatron_lm_attention_backend,
    megatron_lm_expert_model_parallel_size,
    megatron_lm_context_parallel_size,
    megatron_lm_attention_dropout,
    megatron_lm_hidden_dropout,
    megatron_lm_attention_softmax_in_fp32,
    megatron_lm_expert_tensor_parallel_size,
    megatron_lm_calculate_per_token_loss,
    megatron_lm_use_rotary_position_embeddings,
    fp8_backend,
    fp8_use_autocast_during_eval,
    fp8_margin,
    fp8_interval,
    fp8_format,
    fp8_amax_history_len,
    fp8_amax_compute_algo,
    fp8_override_linear_precision,
    fp8_opt_level,
    fp8_enable_fsdp_float8_all_gather,
    fp8_pad_inner_dim,
    aws_access_key_id,
    aws_secret_access_key,
    mpirun_hostfile,
    mpirun_ccl,
    parallelism_config_dp_replicate_size,
    parallelism_config_dp_shard_size,
    parallelism_config_tp_size,
    parallelism_config_cp_size,
    parallelism_config_cp_backend,
    parallelism_config_cp_comm_strategy,
    parallelism_config_sp_size,
    parallelism_config_sp_backend,
    parallelism_config_sp_seq_length,
    parallelism_config_sp_seq_length_is_variable,
    parallelism_config_sp_attn_implementation,
    rdzv_id,
    nproc_per_node,
    log_line_prefix_template,
    redirects,
    local_ranks_filter,
    ranks_filter,
    shutdown_timeout,
    preload,
    restart_backoff,
    restart_backoff_window,
    health_check,
    health_check_timeout,
    gpu_free_timeout,
    use_cpu,
}

const fn f(dest: Dest, kind: Kind, default: &'static str, group: &'static str) -> Flag {
    Flag {
        name: dest.name(),
        dest,
        kind,
        default,
        choices: &[],
        group,
    }
}

const fn c(
    dest: Dest,
    default: &'static str,
    choices: &'static [&'static str],
    group: &'static str,
) -> Flag {
    Flag {
        name: dest.name(),
        dest,
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
    f(D::config_file, S, "null", G),
    f(D::quiet, B, "false", G),
    f(D::module, B, "false", G),
    f(D::no_python, B, "false", G),
    f(D::debug, B, "false", G),
    f(D::cpu, B, "false", HW),
    f(D::multi_gpu, B, "false", HW),
    f(D::tpu, B, "false", HW),
    c(
        D::mixed_precision,
        "null",
        &crate::vocab::MixedPrecision::CHOICES,
        RES,
    ),
    f(D::num_processes, Int, "null", RES),
    // An integer in accelerate; accel also takes MIN:MAX.
    f(D::num_machines, S, "null", RES),
    f(D::num_cpu_threads_per_process, Int, "null", RES),
    f(D::enable_cpu_affinity, B, "false", RES),
    c(
        D::dynamo_backend,
        "null",
        &crate::vocab::DynamoBackend::LAUNCH_CHOICES,
        RES,
    ),
    c(
        D::dynamo_mode,
        "\"default\"",
        &["default", "reduce-overhead", "max-autotune"],
        RES,
    ),
    f(D::dynamo_use_fullgraph, B, "false", RES),
    f(D::dynamo_use_dynamic, B, "false", RES),
    f(D::dynamo_use_regional_compilation, B, "false", RES),
    f(D::use_deepspeed, B, "false", PAR),
    f(D::use_fsdp, B, "false", PAR),
    f(D::use_parallelism_config, B, "false", PAR),
    f(D::use_megatron_lm, B, "false", PAR),
    // Deprecated and ignored until 1.13 removed it.
    f(D::use_xpu, B, "null", PAR),
    f(D::gpu_ids, S, "null", DIST),
    f(D::same_network, B, "false", DIST),
    f(D::machine_rank, Int, "null", DIST),
    f(D::main_process_ip, S, "null", DIST),
    f(D::main_process_port, Int, "null", DIST),
    f(D::tee, S, "\"0\"", DIST),
    f(D::log_dir, S, "null", DIST),
    f(D::role, S, "\"default\"", DIST),
    f(D::rdzv_backend, S, "\"static\"", DIST),
    f(D::rdzv_conf, S, "\"\"", DIST),
    f(D::max_restarts, Int, "0", DIST),
    f(D::monitor_interval, Float, "0.1", DIST),
    Flag {
        name: "tpu_cluster",
        dest: D::tpu_use_cluster,
        kind: B,
        default: "false",
        choices: &[],
        group: TPU,
    },
    Flag {
        name: "no_tpu_cluster",
        dest: D::tpu_use_cluster,
        kind: Kind::SetTrue,
        default: "false",
        choices: &[],
        group: TPU,
    },
    f(D::tpu_use_sudo, B, "false", TPU),
    f(D::vm, Append, "null", TPU),
    f(D::env, Append, "null", TPU),
    f(D::main_training_function, S, "null", TPU),
    f(D::downcast_bf16, B, "false", TPU),
    f(D::deepspeed_config_file, S, "null", DS),
    f(D::zero_stage, Int, "null", DS),
    f(D::offload_optimizer_device, S, "null", DS),
    f(D::offload_param_device, S, "null", DS),
    f(D::offload_optimizer_nvme_path, S, "null", DS),
    f(D::offload_param_nvme_path, S, "null", DS),
    f(D::gradient_accumulation_steps, Int, "null", DS),
    f(D::gradient_clipping, Float, "null", DS),
    f(D::zero3_init_flag, S, "null", DS),
    f(D::zero3_save_16bit_model, S, "null", DS),
    f(D::deepspeed_hostfile, S, "null", DS),
    f(D::deepspeed_exclusion_filter, S, "null", DS),
    f(D::deepspeed_inclusion_filter, S, "null", DS),
    f(D::deepspeed_multinode_launcher, S, "null", DS),
    f(D::deepspeed_moe_layer_cls_names, S, "null", DS),
    c(D::fsdp_version, "\"1\"", &["1", "2"], FSDP),
    f(D::fsdp_offload_params, S, "\"false\"", FSDP),
    f(D::fsdp_min_num_params, Int, "100000000", FSDP),
    f(D::fsdp_sharding_strategy, S, "\"FULL_SHARD\"", FSDP),
    f(D::fsdp_reshard_after_forward, S, "\"true\"", FSDP),
    f(D::fsdp_auto_wrap_policy, S, "null", FSDP),
    f(D::fsdp_transformer_layer_cls_to_wrap, S, "null", FSDP),
    f(D::fsdp_backward_prefetch, S, "null", FSDP),
    f(D::fsdp_state_dict_type, S, "null", FSDP),
    f(D::fsdp_forward_prefetch, S, "\"false\"", FSDP),
    f(D::fsdp_use_orig_params, S, "\"true\"", FSDP),
    f(D::fsdp_cpu_ram_efficient_loading, S, "\"true\"", FSDP),
    f(D::fsdp_sync_module_states, S, "\"true\"", FSDP),
    f(D::fsdp_activation_checkpointing, S, "\"false\"", FSDP),
    f(
        D::fsdp_activation_checkpointing_offload,
        S,
        "\"false\"",
        FSDP,
    ),
    f(D::megatron_lm_tp_degree, Int, "1", MLM),
    f(D::megatron_lm_use_custom_fsdp, PyBool, "false", MLM),
    f(D::megatron_lm_no_load_optim, PyBool, "false", MLM),
    f(D::megatron_lm_eod_mask_loss, PyBool, "false", MLM),
    f(
        D::megatron_lm_overlap_cpu_optimizer_d2h_h2d,
        PyBool,
        "false",
        MLM,
    ),
    f(D::megatron_lm_no_save_optim, PyBool, "false", MLM),
    f(D::megatron_lm_optimizer_cpu_offload, PyBool, "false", MLM),
    f(
        D::megatron_lm_use_precision_aware_optimizer,
        PyBool,
        "false",
        MLM,
    ),
    f(
        D::megatron_lm_decoder_last_pipeline_num_layers,
        Int,
        "null",
        MLM,
    ),
    f(D::megatron_lm_pp_degree, Int, "1", MLM),
    f(D::megatron_lm_num_micro_batches, Int, "null", MLM),
    f(D::megatron_lm_sequence_parallelism, S, "null", MLM),
    f(D::megatron_lm_recompute_activations, S, "null", MLM),
    f(D::megatron_lm_use_distributed_optimizer, S, "null", MLM),
    f(D::megatron_lm_gradient_clipping, Float, "1.0", MLM),
    f(D::megatron_lm_recompute_granularity, S, "null", MLM),
    f(D::megatron_lm_recompute_method, S, "null", MLM),
    f(D::megatron_lm_recompute_num_layers, Int, "null", MLM),
    f(D::megatron_lm_attention_backend, S, "null", MLM),
    f(D::megatron_lm_expert_model_parallel_size, Int, "null", MLM),
    f(D::megatron_lm_context_parallel_size, Int, "null", MLM),
    f(D::megatron_lm_attention_dropout, Float, "null", MLM),
    f(D::megatron_lm_hidden_dropout, Float, "null", MLM),
    f(D::megatron_lm_attention_softmax_in_fp32, S, "null", MLM),
    f(D::megatron_lm_expert_tensor_parallel_size, Int, "null", MLM),
    f(D::megatron_lm_calculate_per_token_loss, S, "null", MLM),
    f(
        D::megatron_lm_use_rotary_position_embeddings,
        S,
        "null",
        MLM,
    ),
    c(D::fp8_backend, "null", &["ao", "te", "msamp"], FP8),
    f(D::fp8_use_autocast_during_eval, B, "false", FP8),
    f(D::fp8_margin, Int, "0", FP8),
    f(D::fp8_interval, Int, "1", FP8),
    c(
        D::fp8_format,
        "\"HYBRID\"",
        &["HYBRID", "E4M3", "E5M2"],
        FP8,
    ),
    f(D::fp8_amax_history_len, Int, "1024", FP8),
    c(
        D::fp8_amax_compute_algo,
        "\"most_recent\"",
        &["max", "most_recent"],
        FP8,
    ),
    f(
        D::fp8_override_linear_precision,
        Triple,
        "[false, false, false]",
        FP8,
    ),
    c(D::fp8_opt_level, "\"O2\"", &["O1", "O2"], FP8),
    f(D::fp8_enable_fsdp_float8_all_gather, StrToBool, "1", FP8),
    f(D::fp8_pad_inner_dim, StrToBool, "1", FP8),
    f(D::aws_access_key_id, S, "null", AWS),
    f(D::aws_secret_access_key, S, "null", AWS),
    f(D::mpirun_hostfile, S, "null", MPI),
    // Until 1.13; accel starts no mpirun either way.
    f(D::mpirun_ccl, Int, "1", MPI),
    f(D::parallelism_config_dp_replicate_size, Int, "1", PC),
    f(D::parallelism_config_dp_shard_size, Int, "1", PC),
    f(D::parallelism_config_tp_size, Int, "1", PC),
    f(D::parallelism_config_cp_size, Int, "1", PC),
    c(
        D::parallelism_config_cp_backend,
        "\"torch\"",
        &["torch"],
        PC,
    ),
    f(
        D::parallelism_config_cp_comm_strategy,
        S,
        "\"allgather\"",
        PC,
    ),
    f(D::parallelism_config_sp_size, Int, "1", PC),
    c(
        D::parallelism_config_sp_backend,
        "\"deepspeed\"",
        &["deepspeed"],
        PC,
    ),
    f(D::parallelism_config_sp_seq_length, S, "null", PC),
    f(
        D::parallelism_config_sp_seq_length_is_variable,
        PyBool,
        "true",
        PC,
    ),
    f(
        D::parallelism_config_sp_attn_implementation,
        S,
        "\"sdpa\"",
        PC,
    ),
    f(D::rdzv_id, S, "null", ACCEL),
    f(D::nproc_per_node, Int, "null", ACCEL),
    f(D::log_line_prefix_template, S, "null", ACCEL),
    f(D::redirects, S, "\"0\"", ACCEL),
    f(D::local_ranks_filter, S, "\"\"", ACCEL),
    f(D::ranks_filter, S, "\"\"", ACCEL),
    f(D::shutdown_timeout, S, "null", ACCEL),
    f(D::preload, S, "null", ACCEL),
    f(D::restart_backoff, S, "null", ACCEL),
    f(D::restart_backoff_window, S, "null", ACCEL),
    f(D::health_check, S, "null", ACCEL),
    f(D::health_check_timeout, S, "null", ACCEL),
    f(D::gpu_free_timeout, S, "null", ACCEL),
];
