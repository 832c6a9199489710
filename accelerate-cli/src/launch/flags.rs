//! `accel launch`'s flags: accelerate's, by table, plus accel's own.
//!
//! accelerate merges its configuration file into the parsed flags by
//! attribute name and needs to know which flags were given explicitly (its
//! `nondefault` set), so the flags are parsed into a name → value namespace
//! the way argparse does it, rather than into a fixed struct. Every
//! `--foo_bar` also answers to `--foo-bar`; the first token that is not an
//! option is the training script and everything after it is the script's.

use std::collections::{BTreeMap, BTreeSet};

use accel_input::excerpt;
use serde_json::Value;

use crate::release::Release;

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
    pub dest: Dest,
    /// How the value is read.
    pub kind: Kind,
    /// Default as a JSON literal (`null`: not given).
    pub default: &'static str,
    /// Allowed values (empty: any).
    pub choices: &'static [&'static str],
    /// Help group.
    pub group: &'static str,
}

mod table;
pub use table::{Dest, ACCEL, FLAGS};

/// Destinations that are no flag's: the configuration merge sets them as
/// accelerate does (`use_cpu` from `--cpu` or the file).
pub const MERGED: &[Dest] = &[Dest::use_cpu];

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
    /// The accelerate release whose flags and defaults these are.
    pub release: Release,
}

impl Namespace {
    /// A flag's value (`null` when it has none). For a name a configuration
    /// file may or may not bring, use [`Namespace::attr`].
    pub fn get(&self, dest: Dest) -> &Value {
        self.attr(dest.name())
    }

    /// Whether the flag has a value (Python's `is not None`).
    pub fn given(&self, dest: Dest) -> bool {
        !self.get(dest).is_null()
    }

    /// The value as an integer, if it is one.
    pub fn int(&self, dest: Dest) -> Option<i64> {
        self.get(dest).as_i64()
    }

    /// The value as Python's `str()` writes it (`None` for none): what
    /// accelerate puts in the workers' environment.
    pub fn text(&self, dest: Dest) -> String {
        crate::pyvalue::str_of(self.get(dest))
    }

    /// A value by any name, `null` when there is none: Python's
    /// `getattr(args, name, None)`, for the keys a configuration file brings
    /// beside the flags (e.g. `fsdp_ignored_modules`).
    pub fn attr(&self, name: &str) -> &Value {
        self.values.get(name).unwrap_or(&Value::Null)
    }

    /// Python truthiness of a value.
    pub fn truthy(&self, dest: Dest) -> bool {
        crate::pyvalue::truthy(self.get(dest))
    }

    /// Sets a value.
    pub fn set(&mut self, dest: Dest, v: Value) {
        self.set_attr(dest.name(), v);
    }

    /// Sets a value by any name: Python's `setattr(args, name, v)`, for the
    /// configuration file's keys, flags or not.
    pub fn set_attr(&mut self, name: &str, v: Value) {
        self.values.insert(name.to_owned(), v);
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
///
/// `release` decides which flags exist (one the installed accelerate lacks
/// is refused, naming the release) and two defaults that changed.
pub fn parse(
    argv: &[String],
    on_path: &dyn Fn(&str) -> bool,
    release: Release,
) -> Result<Parsed, String> {
    let mut ns = Namespace {
        values: FLAGS
            .iter()
            .filter(|f| release.has_flag(f.dest))
            .map(|f| (f.dest.name().to_owned(), default_of(f, release)))
            .collect(),
        nondefault: BTreeSet::new(),
        script: String::new(),
        script_args: Vec::new(),
        release,
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
        if !release.has_flag(flag.dest) {
            return Err(format!(
                "{name} is not a flag of accelerate {} (the release installed for the script's Python); leave it out, or install the accelerate release that has it",
                release.name()
            ));
        }
        i += 1;
        let value = match flag.kind {
            Kind::Flag | Kind::SetTrue => {
                if let Some(v) = inline {
                    return Err(format!(
                        "{name} is an on/off flag and takes no value (got '{}'): write {name} to turn it on, or leave it out",
                        excerpt(&v)
                    ));
                }
                if let Some(next) = argv.get(i) {
                    let word = BOOL_WORDS.contains(&next.to_lowercase().as_str());
                    let no_python = flag.dest == Dest::no_python || ns.truthy(Dest::no_python);
                    let program = no_python && on_path(next);
                    if word && !program {
                        return Err(format!(
                            "{name} is an on/off flag and takes no value (got '{}', which would otherwise be taken for the training script): write {name} to turn it on, or leave it out",
                            excerpt(next)
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
        ns.nondefault.insert(flag.dest.name().to_owned());
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

/// A flag's default in `release`: the table's, except where the release
/// changed it.
fn default_of(f: &Flag, release: Release) -> Value {
    let b = release.behaviour;
    match f.dest {
        Dest::dynamo_use_dynamic if b.dynamo_dynamic_optional => Value::Null,
        // argparse's `default=1e8`: a float, exported as `100000000.0`.
        Dest::fsdp_min_num_params if b.fsdp_min_num_params_float => serde_json::json!(1e8),
        _ => serde_json::from_str(f.default).unwrap_or(Value::Null),
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
    // The edit distance costs length × length: no suggestion for a word far
    // longer than any flag (a 100 KiB one took seconds).
    let plausible = wanted.len() <= 100;
    let close = FLAGS
        .iter()
        .filter(|_| plausible)
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
    format!("unrecognized argument {}: {hint}", excerpt(name))
}

/// Edit distance (Levenshtein), for suggestions.
fn distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
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
            "{name}: invalid choice '{}' (choose from {})",
            excerpt(raw),
            flag.choices.join(", ")
        ));
    }
    let bad = |what: &str| format!("{name}: invalid {what} value '{}'", excerpt(raw));
    Ok(match flag.kind {
        Kind::Str | Kind::Flag | Kind::SetTrue => Value::String(raw.to_owned()),
        Kind::Int => Value::from(raw.trim().parse::<i64>().map_err(|_| bad("int"))?),
        Kind::Float => {
            // nan and inf parse, but no setting means them (and JSON holds neither).
            let f: f64 = raw.trim().parse().map_err(|_| bad("float"))?;
            let n = serde_json::Number::from_f64(f).ok_or_else(|| bad("(finite) float"))?;
            Value::Number(n)
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

/// `accel launch --help`: the flags `release` has.
pub fn help(release: Release) -> String {
    let mut out = String::from(
        "usage: accel launch [flags] SCRIPT [SCRIPT ARGS...]\n\n\
         Launches SCRIPT on accel's agent with accelerate's configuration and flags.\n\
         Every --foo_bar flag is also accepted as --foo-bar.\n",
    );
    let mut group = "";
    for f in FLAGS.iter().filter(|f| release.has_flag(f.dest)) {
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
        let default = match default_of(f, release) {
            Value::Null | Value::Bool(false) => String::new(),
            Value::String(d) if d.is_empty() => String::new(),
            Value::String(d) => format!(" (default {d})"),
            d => format!(" (default {d})"),
        };
        let line = format!("  {short}--{}{value}{default}", f.name);
        match describe(f.name) {
            Some(d) if line.len() < 40 => out.push_str(&format!("{line:<40}{d}\n")),
            Some(d) => out.push_str(&format!("{line}\n{:40}{d}\n", "")),
            None => out.push_str(&format!("{line}\n")),
        }
    }
    out.push_str(
        "\nThe DeepSpeed, FSDP, Megatron-LM, FP8 and ParallelismConfig flags reach the script as\n\
         accelerate's variables (ACCELERATE_DEEPSPEED_*, FSDP_*, MEGATRON_LM_*, ACCELERATE_FP8_*,\n\
         PARALLELISM_CONFIG_*); their meaning is accelerate's.\n",
    );
    out
}

/// One line on what a flag does (the main ones).
fn describe(name: &str) -> Option<&'static str> {
    Some(match name {
        "config_file" => "accelerate's configuration file (default: the one `accel config` writes)",
        "quiet" => "only errors from accel itself",
        "module" => "run SCRIPT as a Python module (python -m)",
        "no_python" => "SCRIPT is a program, not a Python script",
        "debug" => "ACCELERATE_DEBUG_MODE=true: accelerate checks every collective",
        "cpu" => "CPU only (gloo)",
        "multi_gpu" => "one process per GPU (on a CPU-only machine: one gloo process each)",
        "tpu" => "not supported by accel (an error)",
        "mixed_precision" => "the script's mixed precision",
        "num_processes" => "processes in total, over all machines",
        "num_machines" => "machines, N or MIN:MAX (elastic, with --rdzv_backend c10d)",
        "num_cpu_threads_per_process" => "OMP_NUM_THREADS for each process",
        "enable_cpu_affinity" => "ACCELERATE_CPU_AFFINITY=1",
        "gpu_ids" => "GPUs to use, e.g. 0,1 (CUDA_VISIBLE_DEVICES), or all",
        "same_network" => "machines share a network (no effect on accel's rendezvous)",
        "machine_rank" => "this machine's rank (0 on the main machine)",
        "main_process_ip" => "address of machine rank 0, or of the c10d rendezvous",
        "main_process_port" => "its port (default 29500)",
        "tee" => "copy worker output to the console (0-3, or rank:value,...)",
        "log_dir" => "write each worker's output under this directory",
        "role" => "ROLE_NAME for the workers",
        "rdzv_backend" => "static or c10d (the configuration file's value counts)",
        "rdzv_conf" => "rendezvous settings key=value,...",
        "max_restarts" => "restarts of the whole job after a failure (job-wide budget)",
        "monitor_interval" => "seconds between worker checks",
        "rdzv_id" => "job id: launches with the same id on one rendezvous form one job",
        "nproc_per_node" => "processes per machine (instead of num_processes / num_machines)",
        "log_line_prefix_template" => "prefix for console lines, e.g. [${rank}]",
        "redirects" => "send worker output to files under --log_dir (0-3)",
        "local_ranks_filter" => "local ranks shown on the console",
        "ranks_filter" => "global ranks shown on the console",
        "shutdown_timeout" => "grace between SIGTERM and SIGKILL when stopping workers",
        "preload" => {
            "hot restart: fork workers from an interpreter that imported these modules, e.g. torch"
        }
        "restart_backoff" => {
            "crash-loop wait BASE[:MAX] between quick failures (default 1:30; 0: none)"
        }
        "restart_backoff_window" => {
            "a failure this soon after its round started is a quick one (default 60)"
        }
        "health_check" => "shell command this machine passes before each round, or sits out",
        "health_check_timeout" => "how long the health checks may run, together (default 60)",
        "health_check_nic" => {
            "check the links NCCL/gloo use (sysfs): `auto` or names like eth0,mlx5_0"
        }
        "health_check_storage" => "check a write, fsync and read-back of a file in this directory",
        "health_check_gpu" => {
            "check every GPU with nvidia-smi (ECC errors, pending retirements) and the kernel log's XIDs"
        }
        "health_check_kernel_log" => "where --health_check_gpu reads XIDs: /dev/kmsg, a file, or none",
        "health_check_sysfs" => "where sysfs is mounted, for --health_check_nic (default /sys)",
        "nnodes_multiple_of" => {
            "with --num_machines MIN:MAX, rounds run with a multiple of K machines; the rest wait as spares"
        }
        "scale_up_settle" => {
            "with --num_machines MIN:MAX, how long newcomers wait before a running round grows (default 0)"
        }
        "health_check_endpoint" => {
            "ask a node health daemon: unix:/path.sock or http://host:port/path"
        }
        "health_check_interval" => {
            "run the health checks this often while training; a failing machine leaves the job"
        }
        "gpu_free_timeout" => {
            "how long a restart waits for the last round's GPU processes (default 30)"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
