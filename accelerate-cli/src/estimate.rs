//! `accel estimate-memory`: how much memory a model needs to load and to
//! train, printed as `accelerate estimate-memory` prints it (reference:
//! accelerate §1.7, §4.3).
//!
//! accelerate builds the model on PyTorch's meta device from the Hub's
//! `config.json` (with transformers or timm) and walks its modules. accel has
//! no Python model code, so it reads the shapes from the model's safetensors
//! headers instead: from a local folder (`model.safetensors`, or
//! `model.safetensors.index.json` and its shards; a single `.safetensors` file
//! or index may also be given), or, for a Hub id, from the headers the Hub
//! serves (module `hub`). Only headers are read, never weights. A path that
//! exists is always taken as local, even if it also reads as a Hub id.
//!
//! The numbers are accelerate's: every element counts 4 bytes (accelerate
//! measures a float32 model, whatever dtype the files store); the largest
//! layer is the largest module without child modules, with tensors directly
//! at the top level counting as layers of their own and tensors held by a
//! module that also has child modules counting toward no layer, as in
//! accelerate's `calculate_maximum_sizes`; and each dtype row divides by 1, 2,
//! 4 or 8, with "Training using Adam" at 4× the float32 total for float32 and
//! 2× for float16 (`N/A` for int8 and int4). Rows follow the order given to
//! `--dtypes`. The table is accelerate's, character for character
//! (module `table`).
//!
//! Where the count can differ from accelerate's meta-model walk:
//! - the checkpoint holds the class it was saved from, often with a task head
//!   (`BertForMaskedLM`'s `cls.*`), while accelerate builds the bare
//!   `AutoModel` unless the config's `auto_map` names another class;
//! - tied weights (an `lm_head` sharing the embedding) are stored once, and
//!   accelerate counts them once too, so totals agree; but accelerate may
//!   then see the tying module as empty or as the embedding's owner, which
//!   can change which module is the largest layer;
//! - buffers: persistent buffers are in the files and counted; non-persistent
//!   ones (rotary tables, `position_ids` in recent transformers) are not in
//!   the files, while accelerate counts them at their own dtype (int64 ids at
//!   8 bytes: bert-base-cased's two 512-id buffers are 8 KB of its 413.18 MB);
//! - quantized checkpoints (packed int4/int8 tensors) are counted per stored
//!   element at 4 bytes, while accelerate builds the unquantized model;
//! - a module class listed in a transformers model's `_no_split_modules` is a
//!   single layer for accelerate even though it has children; the headers do
//!   not say which classes those are, so accel's largest layer can be smaller;
//! - `--library_name` and `--trust_remote_code` are accepted for
//!   compatibility and change nothing, since no model code runs.

use std::path::{Path, PathBuf};

use clap::ValueEnum;

mod hub;
mod safetensors;
mod table;

use safetensors::Tensors;
use table::{ascii_table, convert_bytes, Bytes};

/// `accel estimate-memory` arguments (accelerate's spellings).
#[derive(Debug, Clone, clap::Args)]
pub struct EstimateArgs {
    /// The model: a local folder with safetensors weights (or a `.safetensors`
    /// file or `.safetensors.index.json`), or a Hugging Face Hub id.
    pub model_name: String,
    /// The library the model belongs to; accepted for compatibility (accel
    /// reads the safetensors headers whatever the library).
    #[arg(long = "library_name", alias = "library-name", value_enum)]
    pub library_name: Option<Library>,
    /// The dtypes to show, in this order.
    #[arg(long, value_enum, num_args = 1.., action = clap::ArgAction::Set,
          overrides_with = "dtypes", default_values = ["float32", "float16", "int8", "int4"])]
    pub dtypes: Vec<Dtype>,
    /// Accepted for compatibility: accel runs no model code.
    #[arg(long = "trust_remote_code", alias = "trust-remote-code")]
    pub trust_remote_code: bool,
}

/// `--library_name` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Library {
    /// PyTorch Image Models.
    Timm,
    /// Hugging Face transformers.
    Transformers,
}

/// `--dtypes` choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    /// 4 bytes per parameter.
    Float32,
    /// 2 bytes per parameter.
    Float16,
    /// 1 byte per parameter.
    Int8,
    /// Half a byte per parameter.
    Int4,
}

/// Why the estimate failed.
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// Neither an existing path nor a Hub id.
    #[error("`{0}` is not an existing path nor a Hugging Face Hub model id; pass the folder that holds the model's safetensors files")]
    NotFound(String),
    /// A local folder without safetensors weights where they are expected.
    #[error("{} has no model.safetensors.index.json or model.safetensors{hint}", dir.display())]
    NoWeights {
        /// The folder.
        dir: PathBuf,
        /// What it holds instead and what to do, or empty.
        hint: String,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A safetensors file whose header is not valid.
    #[error("{} is not a valid safetensors file: {reason}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A sharded model's index that is not valid.
    #[error("{} is not a valid safetensors index: {reason}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The Hub could not be reached (offline, firewalled, `HF_HUB_OFFLINE`).
    #[error("cannot reach the Hugging Face Hub to read `{model}` ({reason}). Without the Hub, download the model folder (config.json and its *.safetensors files) on a connected machine, e.g. `huggingface-cli download {model} --local-dir DIR`, and pass its path: `accel estimate-memory DIR`")]
    HubUnreachable {
        /// The Hub id.
        model: String,
        /// What failed.
        reason: String,
    },
    /// The Hub answered, but not with safetensors headers for the model.
    #[error("cannot read `{model}` from the Hugging Face Hub: {reason}")]
    Hub {
        /// The Hub id.
        model: String,
        /// What failed and what to do.
        reason: String,
    },
    /// Sizes beyond 64 bits (only from a corrupt header).
    #[error("the model's size does not fit in 64 bits; its headers are probably corrupt")]
    TooLarge,
}

/// accelerate's column headers.
const HEADERS: [&str; 4] = [
    "dtype",
    "Largest Layer",
    "Total Size",
    "Training using Adam",
];

/// Runs the command; returns the table to print.
pub fn run(
    args: &EstimateArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, EstimateError> {
    let tensors = load(&args.model_name, env)?;
    let (total, largest) = measure(&tensors)?;
    let rows = rows(&args.dtypes, total, largest)?;
    let title = format!("Memory Usage for loading `{}`", args.model_name);
    Ok(ascii_table(&HEADERS, &rows, &title))
}

/// The model's tensors, from a local path or else the Hub.
fn load(model: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Tensors, EstimateError> {
    let path = Path::new(model);
    if path.exists() {
        safetensors::read_model(path)
    } else if hub::looks_like_repo_id(model) {
        hub::fetch(model, env)
    } else {
        Err(EstimateError::NotFound(model.to_owned()))
    }
}

/// Bytes per element: accelerate measures a float32 model.
const ELEMENT_BYTES: u64 = 4;

/// The model's total size and its largest layer's, in bytes at float32.
fn measure(tensors: &Tensors) -> Result<(u64, u64), EstimateError> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut total: u64 = 0;
    let mut largest: u64 = 0;
    let mut modules: BTreeMap<&str, u64> = BTreeMap::new();
    let mut with_children: BTreeSet<&str> = BTreeSet::new();
    for (name, numel) in tensors {
        let bytes = numel
            .checked_mul(ELEMENT_BYTES)
            .ok_or(EstimateError::TooLarge)?;
        total = total.checked_add(bytes).ok_or(EstimateError::TooLarge)?;
        match name.rsplit_once('.') {
            // A tensor of the model itself is a layer of its own.
            None => largest = largest.max(bytes),
            Some((module, _)) => {
                // Never overflows: each module's sum is at most the total.
                *modules.entry(module).or_default() += bytes;
                let mut child = module;
                while let Some((parent, _)) = child.rsplit_once('.') {
                    with_children.insert(parent);
                    child = parent;
                }
            }
        }
    }
    let leaves = modules
        .iter()
        .filter(|(module, _)| !with_children.contains(*module))
        .map(|(_, bytes)| *bytes);
    Ok((total, leaves.fold(largest, u64::max)))
}

/// One table row per dtype, in the given order, as accelerate computes them.
fn rows(dtypes: &[Dtype], total: u64, largest: u64) -> Result<Vec<Vec<String>>, EstimateError> {
    let fraction = |n: u64, by: f64| convert_bytes(Bytes::Fraction(n as f64 / by));
    let training = |times: u64| {
        total
            .checked_mul(times)
            .map(|n| convert_bytes(Bytes::Whole(n)))
            .ok_or(EstimateError::TooLarge)
    };
    dtypes
        .iter()
        .map(|dtype| {
            let (name, layer, size, adam) = match dtype {
                Dtype::Float32 => (
                    "float32",
                    convert_bytes(Bytes::Whole(largest)),
                    convert_bytes(Bytes::Whole(total)),
                    training(4)?,
                ),
                Dtype::Float16 => (
                    "float16",
                    fraction(largest, 2.0),
                    fraction(total, 2.0),
                    training(2)?,
                ),
                Dtype::Int8 => (
                    "int8",
                    fraction(largest, 4.0),
                    fraction(total, 4.0),
                    "N/A".into(),
                ),
                Dtype::Int4 => (
                    "int4",
                    fraction(largest, 8.0),
                    fraction(total, 8.0),
                    "N/A".into(),
                ),
            };
            Ok(vec![name.to_owned(), layer, size, adam])
        })
        .collect()
}

#[cfg(test)]
mod tests;
