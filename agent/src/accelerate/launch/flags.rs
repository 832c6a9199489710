//! `accel launch`'s flags: accelerate's, by table, plus accel's own.
//!
//! accelerate merges its configuration file into the parsed flags by
//! attribute name and needs to know which flags were given explicitly (its
//! `nondefault` set), so the flags are parsed into a name → value namespace
//! the way argparse does it, rather than into a fixed struct. Every
//! `--foo_bar` also answers to `--foo-bar`; the first token that is not an
//! option is the training script and everything after it is the script's.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// How a flag's value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Str,
    /// An integer.
    Int,
    /// A float.
    Float,
    /// `store_true`: no value.
    Flag,
    /// Repeatable; values collected in a list.
    Append,
    /// Python `bool(str)`: any non-empty text is true.
    PyBool,
    /// accelerate's `str_to_bool`: yes/no words to 1/0.
    StrToBool,
    /// Three comma-separated `str_to_bool` values.
    Triple,
    /// `--no_tpu_cluster`: sets its destination to `true`.
    SetTrue,
}

/// One flag.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// Long name with underscores, without dashes.
    pub name: &'static str,
    /// Where the value goes.
    pub dest: &'static str,
    /// How the value is read.
    pub kind: Kind,
    /// Default as a JSON literal (`null`: not given).
    pub default: &'static str,
    /// Allowed values (empty: any).
    pub choices: &'static [&'static str],
    /// Help group.
    pub group: &'static str,
}

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
        &["no", "fp16", "bf16", "fp8"],
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
        &[
            "no",
            "eager",
            "aot_eager",
            "inductor",
            "aot_ts_nvfuser",
            "nvprims_nvfuser",
            "cudagraphs",
            "ofi",
            "fx2trt",
            "onnxrt",
            "tensorrt",
            "aot_torchxla_trace_once",
            "torhchxla_trace_once",
            "tvm",
        ],
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
];

/// Short options and the long flag each stands for.
const SHORT: &[(&str, &str)] = &[("-q", "quiet"), ("-m", "module"), ("-t", "tee")];

/// Parsed `accel launch` arguments: accelerate's `Namespace`.
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    /// Destination → value (defaults included).
    pub values: BTreeMap<String, Value>,
    /// Destinations given on the command line.
    pub nondefault: BTreeSet<String>,
    /// The training script (or program with `--no_python`).
    pub script: String,
    /// Its arguments.
    pub script_args: Vec<String>,
}

impl Namespace {
    /// A value (`null` when unset).
    pub fn get(&self, dest: &str) -> &Value {
        self.values.get(dest).unwrap_or(&Value::Null)
    }

    /// Python truthiness of a value.
    pub fn truthy(&self, dest: &str) -> bool {
        match self.get(dest) {
            Value::Null | Value::Bool(false) => false,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            Value::Bool(true) => true,
        }
    }

    /// Sets a value.
    pub fn set(&mut self, dest: &str, v: Value) {
        self.values.insert(dest.to_owned(), v);
    }
}

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// `-h/--help`.
    Help,
    /// A launch.
    Launch(Namespace),
}

/// Words that mean yes or no: given after an on/off flag they are a mistake
/// (accelerate would take `false` for the training script).
const BOOL_WORDS: &[&str] = &[
    "true", "false", "yes", "no", "on", "off", "1", "0", "y", "n",
];

/// Parses `argv` (the words after `launch`). `on_path` tells whether a
/// program name is on `PATH` (an on/off flag followed by `true` is a mistake
/// unless `--no_python` makes `true` the program).
pub fn parse(argv: &[String], on_path: &dyn Fn(&str) -> bool) -> Result<Parsed, String> {
    let mut ns = Namespace {
        values: FLAGS
            .iter()
            .map(|f| {
                (
                    f.dest.to_owned(),
                    serde_json::from_str(f.default).unwrap_or(Value::Null),
                )
            })
            .collect(),
        nondefault: BTreeSet::new(),
        script: String::new(),
        script_args: Vec::new(),
    };
    let mut i = 0;
    while i < argv.len() {
        let tok = &argv[i];
        if tok == "-h" || tok == "--help" {
            return Ok(Parsed::Help);
        }
        if tok == "--" {
            i += 1;
            break;
        }
        if !tok.starts_with('-') || tok == "-" {
            break;
        }
        let (name, inline) = match tok.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (tok.as_str(), None),
        };
        let flag = lookup(name).ok_or_else(|| unknown(name))?;
        i += 1;
        let value = match flag.kind {
            Kind::Flag | Kind::SetTrue => {
                if let Some(v) = inline {
                    return Err(format!(
                        "{name} is an on/off flag and takes no value (got '{v}'): write {name} to turn it on, or leave it out"
                    ));
                }
                if let Some(next) = argv.get(i) {
                    let word = BOOL_WORDS.contains(&next.to_lowercase().as_str());
                    let program = ns.truthy("no_python") && on_path(next);
                    if word && !program {
                        return Err(format!(
                            "{name} is an on/off flag and takes no value (got '{next}', which would otherwise be taken for the training script): write {name} to turn it on, or leave it out"
                        ));
                    }
                }
                Value::Bool(true)
            }
            _ => {
                let raw = match inline {
                    Some(v) => v,
                    None => {
                        let next = argv
                            .get(i)
                            .filter(|n| !looks_like_option(n))
                            .ok_or_else(|| format!("{name} expects a value"))?;
                        i += 1;
                        next.clone()
                    }
                };
                convert(flag, name, &raw, ns.get(flag.dest))?
            }
        };
        ns.set(flag.dest, value);
        ns.nondefault.insert(flag.dest.to_owned());
    }
    match argv.get(i) {
        Some(script) => {
            ns.script = script.clone();
            ns.script_args = argv[i + 1..].to_vec();
            ns.nondefault.insert("training_script".into());
            Ok(Parsed::Launch(ns))
        }
        None => Err(
            "the following arguments are required: training_script (usage: accel launch [flags] SCRIPT [ARGS...])"
                .into(),
        ),
    }
}

fn looks_like_option(s: &str) -> bool {
    s.starts_with('-') && s.len() > 1 && s.parse::<f64>().is_err()
}

/// The flag a command-line name means (`--foo_bar`, `--foo-bar`, `-t`).
pub fn lookup(name: &str) -> Option<&'static Flag> {
    let long = match SHORT.iter().find(|(s, _)| *s == name) {
        Some((_, l)) => (*l).to_owned(),
        None => name.strip_prefix("--")?.replace('-', "_"),
    };
    FLAGS.iter().find(|f| f.name == long)
}

fn unknown(name: &str) -> String {
    let wanted = name.trim_start_matches('-').replace('-', "_");
    let limit = (wanted.len() / 4).max(2);
    let close = FLAGS
        .iter()
        .filter(|f| {
            let prefix = f
                .name
                .chars()
                .zip(wanted.chars())
                .take_while(|(a, b)| a == b)
                .count();
            f.name.contains(&wanted)
                || wanted.contains(f.name)
                || prefix >= 6
                || distance(f.name, &wanted) <= limit
        })
        .map(|f| format!("--{}", f.name))
        .take(3)
        .collect::<Vec<_>>();
    let hint = if close.is_empty() {
        "see `accel launch --help`; a script's own flags go after the script path".to_owned()
    } else {
        format!("did you mean {}?", close.join(" or "))
    };
    format!("unrecognized argument {name}: {hint}")
}

/// Edit distance, for suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// accelerate's `str_to_bool`.
pub fn str_to_bool(s: &str) -> Option<bool> {
    match s.to_lowercase().as_str() {
        "y" | "yes" | "t" | "true" | "on" | "1" => Some(true),
        "n" | "no" | "f" | "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

fn convert(flag: &Flag, name: &str, raw: &str, current: &Value) -> Result<Value, String> {
    if !flag.choices.is_empty() && !flag.choices.contains(&raw) {
        return Err(format!(
            "{name}: invalid choice '{raw}' (choose from {})",
            flag.choices.join(", ")
        ));
    }
    let bad = |what: &str| format!("{name}: invalid {what} value '{raw}'");
    Ok(match flag.kind {
        Kind::Str | Kind::Flag | Kind::SetTrue => Value::String(raw.to_owned()),
        Kind::Int => Value::from(raw.trim().parse::<i64>().map_err(|_| bad("int"))?),
        Kind::Float => {
            let f: f64 = raw.trim().parse().map_err(|_| bad("float"))?;
            serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
        }
        Kind::Append => {
            let mut items = current.as_array().cloned().unwrap_or_default();
            items.push(Value::String(raw.to_owned()));
            Value::Array(items)
        }
        Kind::PyBool => Value::Bool(!raw.is_empty()),
        Kind::StrToBool => Value::from(u8::from(str_to_bool(raw).ok_or_else(|| bad("boolean"))?)),
        Kind::Triple => {
            let parts: Option<Vec<Value>> = raw
                .split(',')
                .map(|p| str_to_bool(p).map(|b| Value::from(u8::from(b))))
                .collect();
            Value::Array(parts.ok_or_else(|| bad("boolean list"))?)
        }
    })
}

/// `accel launch --help`.
pub fn help() -> String {
    let mut out = String::from(
        "usage: accel launch [flags] SCRIPT [SCRIPT ARGS...]\n\n\
         Launches SCRIPT on accel's agent with accelerate's configuration and flags.\n\
         Every --foo_bar flag is also accepted as --foo-bar.\n",
    );
    let mut group = "";
    for f in FLAGS {
        if f.group != group {
            group = f.group;
            out.push_str(&format!("\n{group}:\n"));
        }
        let value = match f.kind {
            Kind::Flag | Kind::SetTrue => String::new(),
            Kind::Int => " INT".into(),
            Kind::Float => " FLOAT".into(),
            _ if !f.choices.is_empty() => format!(" {{{}}}", f.choices.join(",")),
            _ => " VALUE".into(),
        };
        let short = SHORT
            .iter()
            .find(|(_, l)| *l == f.name)
            .map(|(s, _)| format!("{s}, "))
            .unwrap_or_default();
        let default = match f.default {
            "null" | "false" | "\"\"" => String::new(),
            d => format!(" (default {})", d.trim_matches('"')),
        };
        out.push_str(&format!("  {short}--{}{value}{default}\n", f.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn ns(s: &str) -> Namespace {
        match parse(&args(s), &|_| false).expect("parses") {
            Parsed::Launch(ns) => ns,
            Parsed::Help => panic!("help"),
        }
    }

    #[test]
    fn both_spellings_values_and_remainder() {
        let n = ns(
            "--num-processes 4 --mixed_precision=bf16 -m --fsdp-version 2 pkg.train --lr 3 --cpu",
        );
        assert_eq!(n.get("num_processes"), &Value::from(4));
        assert_eq!(n.get("mixed_precision"), "bf16");
        assert_eq!(n.get("module"), &Value::Bool(true));
        assert_eq!(n.get("fsdp_version"), "2");
        assert_eq!(n.script, "pkg.train");
        assert_eq!(n.script_args, args("--lr 3 --cpu"));
        assert_eq!(n.get("cpu"), &Value::Bool(false));
        assert!(n.nondefault.contains("num_processes") && !n.nondefault.contains("cpu"));
    }

    #[test]
    fn typed_values() {
        let n = ns(
            "--vm a --vm b --megatron_lm_use_custom_fsdp False --fp8_pad_inner_dim no \
                    --fp8_override_linear_precision true,false,1 -t 3 s.py",
        );
        assert_eq!(n.get("vm"), &serde_json::json!(["a", "b"]));
        assert_eq!(n.get("megatron_lm_use_custom_fsdp"), &Value::Bool(true));
        assert_eq!(n.get("fp8_pad_inner_dim"), &Value::from(0));
        assert_eq!(
            n.get("fp8_override_linear_precision"),
            &serde_json::json!([1, 0, 1])
        );
        assert_eq!(n.get("tee"), "3");
        assert_eq!(n.get("fp8_enable_fsdp_float8_all_gather"), &Value::from(1));
    }

    #[test]
    fn mistakes_are_errors() {
        let err = |s: &str| parse(&args(s), &|p| p == "true").expect_err(s);
        assert!(err("--same_network false train.py").contains("on/off flag"));
        assert!(err("--same_network=true train.py").contains("takes no value"));
        assert!(err("--num_processes x train.py").contains("invalid int"));
        assert!(err("--mixed_precision fp32 t.py").contains("invalid choice"));
        assert!(err("--num_procs 2 t.py").contains("unrecognized"));
        assert!(err("--num_processes").contains("expects a value"));
        assert!(err("--cpu").contains("training_script"));
        // With --no_python, a program named `true` is a program.
        let ok = parse(&args("--no_python --cpu true"), &|p| p == "true").expect("program");
        assert!(matches!(ok, Parsed::Launch(n) if n.script == "true"));
        assert_eq!(parse(&args("--cpu --help"), &|_| false), Ok(Parsed::Help));
    }

    #[test]
    fn help_lists_every_flag() {
        let h = help();
        for f in FLAGS {
            assert!(h.contains(&format!("--{}", f.name)), "{}", f.name);
        }
    }
}
