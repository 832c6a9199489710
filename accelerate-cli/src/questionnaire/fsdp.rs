//! The FSDP questions (accelerator types; a "yes" makes the type `FSDP`),
//! the parallelism config (FSDP2 only) and Megatron-LM (multi-GPU only),
//! with accelerate's key names (`fsdp_*`, `parallelism_config_*`,
//! `megatron_lm_*`).

use serde_json::{json, Map, Value};

use super::cluster::Dist;
use super::prompt::Prompter;
use super::QuestionnaireError;

const SHARDING: [&str; 5] = [
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
];
const WRAP: [&str; 3] = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"];
const PREFETCH: [&str; 3] = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"];
const STATE_DICT_V1: [&str; 3] = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"];
const STATE_DICT_V2: [&str; 2] = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"];
const INTEGER: Option<&str> = Some("Please enter an integer.");

/// Asks whether to use FSDP and, if so, how; returns `fsdp_config`.
pub(super) fn ask(
    p: &mut Prompter<'_>,
    dist: &mut Dist,
) -> Result<Map<String, Value>, QuestionnaireError> {
    let mut c = Map::new();
    if !p.yes_no(
        "Do you want to use FullyShardedDataParallel? [yes/NO]: ",
        false,
    )? {
        return Ok(c);
    }
    if *dist == Dist::MultiNeuron {
        return Err(QuestionnaireError::Refused(
            "FSDP is not currently supported on Neuron devices (accelerate refuses it too): answer `no` to FullyShardedDataParallel",
        ));
    }
    *dist = Dist::Fsdp;
    let v1 = p.choose("What should be your FSDP version? [2]: ", &["1", "2"], 1)? == 0;
    c.insert("fsdp_version".into(), json!(if v1 { 1 } else { 2 }));
    let reshard = if v1 {
        json!(SHARDING[p.choose("What should be your sharding strategy?", &SHARDING, 0)?])
    } else {
        json!(p.yes_no(
            "Do you want to enable resharding after forward? [YES/no]: ",
            true
        )?)
    };
    c.insert("fsdp_reshard_after_forward".into(), reshard);
    let offload = p.yes_no(
        "Do you want to offload parameters and gradients to CPU? [yes/NO]: ",
        false,
    )?;
    c.insert("fsdp_offload_params".into(), json!(offload));
    let wrap = p.choose("What should be your auto wrap policy?", &WRAP, 0)?;
    c.insert("fsdp_auto_wrap_policy".into(), json!(WRAP[wrap]));
    if wrap == 0 {
        if !p.yes_no("Do you want to use the model's `_no_split_modules` to wrap. Only applicable for 🤗 Transformers [yes/NO]: ", false)? {
            let classes = p.text("Specify the comma-separated list of transformer layer class names (case-sensitive) to wrap ,e.g, :`BertLayer`, `GPTJBlock`, `T5Block`, `BertLayer,BertEmbeddings,BertSelfOutput` ...? : ", None)?;
            c.insert("fsdp_transformer_layer_cls_to_wrap".into(), json!(classes));
        }
    } else if wrap == 1 {
        let min = p.int("What should be your FSDP's minimum number of parameters for Default Auto Wrapping Policy? [1e8]: ", Some(100_000_000), None)?;
        c.insert("fsdp_min_num_params".into(), json!(min));
    }
    if v1 {
        let prefetch = p.choose(
            "What should be your FSDP's backward prefetch policy?",
            &PREFETCH,
            0,
        )?;
        c.insert("fsdp_backward_prefetch".into(), json!(PREFETCH[prefetch]));
    }
    let types: &[&str] = if v1 { &STATE_DICT_V1 } else { &STATE_DICT_V2 };
    let state = types[p.choose("What should be your FSDP's state dict type?", types, 0)?];
    c.insert("fsdp_state_dict_type".into(), json!(state));
    if v1 {
        let forward = p.yes_no(
            "Do you want to enable FSDP's forward prefetch policy? [yes/NO]: ",
            false,
        )?;
        c.insert("fsdp_forward_prefetch".into(), json!(forward));
        let orig = p.yes_no(
            "Do you want to enable FSDP's `use_orig_params` feature? [YES/no]: ",
            true,
        )?;
        c.insert("fsdp_use_orig_params".into(), json!(orig));
    }
    let ram = p.yes_no("Do you want to enable CPU RAM efficient model loading? Only applicable for 🤗 Transformers models. [YES/no]: ", true)?;
    c.insert("fsdp_cpu_ram_efficient_loading".into(), json!(ram));
    if v1 {
        // Efficient loading needs the broadcast, so accelerate only asks without it.
        let sync = ram || p.yes_no("Do you want each individually wrapped FSDP unit to broadcast module parameters from rank 0 at the start? [YES/no]: ", true)?;
        c.insert("fsdp_sync_module_states".into(), json!(sync));
    }
    let checkpointing = p.yes_no(
        "Do you want to enable FSDP activation checkpointing? [yes/NO]: ",
        false,
    )?;
    c.insert("fsdp_activation_checkpointing".into(), json!(checkpointing));
    Ok(c)
}

/// The parallelism-config questions (after choosing FSDP2).
pub(super) fn parallelism(p: &mut Prompter<'_>) -> Result<Map<String, Value>, QuestionnaireError> {
    let mut c = Map::new();
    if !p.yes_no(
        "Do you want to use the parallelism config? [yes/NO]: ",
        false,
    )? {
        return Ok(c);
    }
    let mut cp = 1;
    for (key, question) in [
        (
            "dp_replicate_size",
            "What is the data parallelism replicate size? [1]: ",
        ),
        ("dp_shard_size", "What is the FSDP shard size? [1]: "),
        ("tp_size", "What is the tensor parallelism size? [1]: "),
        ("cp_size", "What is the context parallelism size? [1]: "),
    ] {
        let size = p.int(question, Some(1), INTEGER)?;
        c.insert(format!("parallelism_config_{key}"), json!(size));
        cp = size;
    }
    if cp > 1 {
        let strategies = ["allgather", "alltoall"];
        let s = p.choose(
            "What is the compute parallelism communication strategy?",
            &strategies,
            0,
        )?;
        c.insert(
            "parallelism_config_cp_comm_strategy".into(),
            json!(strategies[s]),
        );
    }
    Ok(c)
}

/// The Megatron-LM questions (multi-GPU); a "yes" makes the type `MEGATRON_LM`.
pub(super) fn megatron(
    p: &mut Prompter<'_>,
    dist: &mut Dist,
) -> Result<Map<String, Value>, QuestionnaireError> {
    let mut c = Map::new();
    if !p.yes_no("Do you want to use Megatron-LM ? [yes/NO]: ", false)? {
        return Ok(c);
    }
    *dist = Dist::MegatronLm;
    let tp = p.int(
        "What is the Tensor Parallelism degree/size? [1]:",
        Some(1),
        INTEGER,
    )?;
    c.insert("megatron_lm_tp_degree".into(), json!(tp));
    if tp > 1 {
        let sp = p.yes_no(
            "Do you want to enable Sequence Parallelism? [YES/no]: ",
            true,
        )?;
        c.insert("megatron_lm_sequence_parallelism".into(), json!(sp));
    }
    let pp = p.int(
        "What is the Pipeline Parallelism degree/size? [1]:",
        Some(1),
        INTEGER,
    )?;
    c.insert("megatron_lm_pp_degree".into(), json!(pp));
    if pp > 1 {
        let micro = p.int(
            "What is the number of micro-batches? [1]:",
            Some(1),
            INTEGER,
        )?;
        c.insert("megatron_lm_num_micro_batches".into(), json!(micro));
    }
    let recompute = p.yes_no(
        "Do you want to enable selective activation recomputation? [YES/no]: ",
        true,
    )?;
    c.insert("megatron_lm_recompute_activations".into(), json!(recompute));
    let distributed = p.yes_no("Do you want to use distributed optimizer which shards optimizer state and gradients across data parallel ranks? [YES/no]: ", true)?;
    c.insert(
        "megatron_lm_use_distributed_optimizer".into(),
        json!(distributed),
    );
    let clip = p.float(
        "What is the gradient clipping value based on global L2 Norm (0 to disable)? [1.0]: ",
        1.0,
    )?;
    c.insert("megatron_lm_gradient_clipping".into(), json!(clip));
    Ok(c)
}
