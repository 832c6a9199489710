//! accelerate's configuration file: where it lives, how it is read and
//! written, and what `config default` writes (reference: accelerate §1.3,
//! §2.1–§2.5).
//!
//! A file is read as accelerate reads it: YAML in PyYAML's dialect (or JSON
//! when the name ends in `.json`), legacy keys migrated, defaults filled in,
//! unknown keys rejected by name. [`AccelerateConfig`] keeps every field of
//! accelerate's `ClusterConfig` (or `SageMakerConfig`) with its value, so
//! `launch` can apply accelerate's precedence rules field by field and
//! `config update` can write the file back the way accelerate does.

use std::path::{Path, PathBuf};

use accel_input::excerpt;
use serde_json::{json, Map, Value};

use super::yaml;
use crate::vocab::{DistributedType, DynamoBackend, MixedPrecision};

mod read;
mod schema;
use read::read_bounded;
pub use read::MAX_CONFIG_BYTES;
pub use schema::{CLUSTER_FIELDS, SAGEMAKER_FIELDS};

/// Why the file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the accelerate configuration at {path}: {source}")]
pub struct ConfigFileError {
    /// The file.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

/// accelerate's default file: `$HF_HOME/accelerate/default_config.yaml`, with
/// HF_HOME defaulting to `$XDG_CACHE_HOME/huggingface`, then `~/.cache/huggingface`.
pub fn default_location(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let home = || env("HOME").unwrap_or_default();
    let expand = |p: String| match p.strip_prefix('~') {
        Some(rest) => format!("{}{rest}", home()),
        None => p,
    };
    let hf_home = match env("HF_HOME") {
        Some(h) => expand(h),
        None => {
            let cache = env("XDG_CACHE_HOME").unwrap_or_else(|| "~/.cache".into());
            format!("{}/huggingface", expand(cache))
        }
    };
    Path::new(&hf_home)
        .join("accelerate")
        .join("default_config.yaml")
}

/// The configuration `config default` writes for a machine with `gpus` CUDA
/// devices: JSON text (also in a `.yaml` file, as accelerate writes it).
pub fn default_config(mixed_precision: MixedPrecision, gpus: u32) -> String {
    let (distributed, processes, use_cpu) = match gpus {
        0 => (DistributedType::No, 1, true),
        1 => (DistributedType::No, 1, false),
        n => (DistributedType::MultiGpu, n, false),
    };
    let config = serde_json::json!({
        "compute_environment": "LOCAL_MACHINE",
        "debug": false,
        "distributed_type": distributed.name(),
        "downcast_bf16": false,
        "enable_cpu_affinity": false,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision.name(),
        "num_machines": 1,
        "num_processes": processes,
        "rdzv_backend": "static",
        "same_network": false,
        "tpu_use_cluster": false,
        "tpu_use_sudo": false,
        "use_cpu": use_cpu,
    });
    // Sorted and pretty-printed with two spaces: the same text as Python's
    // json.dumps(indent=2, sort_keys=True).
    serde_json::to_string_pretty(&sorted(&config)).unwrap_or_default() + "\n"
}

/// Writes the default configuration to `path` unless a file is already there.
/// Returns the message to print (accelerate's wording).
pub fn write_default(
    path: &Path,
    mixed_precision: MixedPrecision,
    gpus: u32,
) -> Result<String, ConfigFileError> {
    if path.exists() {
        return Ok(format!(
            "Configuration already exists at {}, will not override. Edit it, or pass a different --config_file.",
            path.display()
        ));
    }
    let err = |source| ConfigFileError {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::write(path, default_config(mixed_precision, gpus)).map_err(err)?;
    Ok(format!(
        "accelerate configuration saved at {}",
        path.display()
    ))
}

/// Why a configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// An explicit `--config_file` that is not there.
    #[error("the configuration file {0} does not exist; pass an existing file with --config_file, or create the default one with `accel config`")]
    Missing(PathBuf),
    /// Unreadable file.
    #[error("cannot read the configuration file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Larger than [`MAX_CONFIG_BYTES`]; refused before parsing.
    #[error(
        "the configuration file {path} is {}; a configuration file may be at most 1 MiB \
         (accelerate's are a few hundred bytes): check that --config_file names the right file",
        read::size_text(*.size)
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size from its metadata; `None` when it said less than it held
        /// (a file still growing).
        size: Option<u64>,
    },
    /// Not YAML (or not JSON, for `.json`).
    #[error("the configuration file {path} is not valid {format}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// YAML or JSON.
        format: &'static str,
        /// The parser's message.
        message: String,
    },
    /// Anything else wrong with its content.
    #[error("the configuration file {path}: {message}")]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// A loaded configuration: every field of accelerate's config class.
#[derive(Debug, Clone, PartialEq)]
pub struct AccelerateConfig {
    /// Where it was read from.
    pub path: PathBuf,
    /// `true` for `compute_environment: AMAZON_SAGEMAKER`.
    pub sagemaker: bool,
    /// Field name → value; absent fields hold their class defaults.
    pub fields: Map<String, Value>,
}

impl AccelerateConfig {
    /// A field's value (`null` when unknown).
    pub fn get(&self, key: &str) -> &Value {
        self.fields.get(key).unwrap_or(&Value::Null)
    }

    /// A dictionary field (`fsdp_config`, ...); empty when absent.
    pub fn dict(&self, key: &str) -> Map<String, Value> {
        self.get(key).as_object().cloned().unwrap_or_default()
    }

    /// accelerate's `to_dict()`: what gets written back.
    pub fn to_dict(&self) -> Map<String, Value> {
        to_dict(&self.fields)
    }
}

/// accelerate's `to_dict()` rules: `None` values and empty dictionaries are
/// dropped at the top level; an empty dictionary nested in another becomes
/// `null`.
pub fn to_dict(fields: &Map<String, Value>) -> Map<String, Value> {
    fn nested(v: &Value) -> Value {
        match v {
            Value::Object(m) if m.is_empty() => Value::Null,
            Value::Object(m) => {
                Value::Object(m.iter().map(|(k, v)| (k.clone(), nested(v))).collect())
            }
            other => other.clone(),
        }
    }
    fields
        .iter()
        .filter_map(|(k, v)| match nested(v) {
            Value::Null => None,
            v => Some((k.clone(), v)),
        })
        .collect()
}

/// Loads `explicit`, or the default file if it exists. `Ok(None)`: no
/// explicit file and no default one.
pub fn load_optional(
    explicit: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<AccelerateConfig>, LoadError> {
    match explicit {
        Some(p) if !p.is_file() => Err(LoadError::Missing(p.to_path_buf())),
        Some(p) => load(p).map(Some),
        None => {
            let p = default_location(env);
            if p.is_file() {
                load(&p).map(Some)
            } else {
                Ok(None)
            }
        }
    }
}

/// Reads and checks one file.
pub fn load(path: &Path) -> Result<AccelerateConfig, LoadError> {
    let text = read_bounded(path)?;
    let json = path.extension().is_some_and(|e| e == "json");
    let parsed = if json {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        yaml::load(&text).map_err(|e| e.to_string())
    };
    let value = parsed.map_err(|message| LoadError::Syntax {
        path: path.to_path_buf(),
        format: if json { "JSON" } else { "YAML" },
        message,
    })?;
    process(value)
        .map_err(|message| LoadError::Content {
            path: path.to_path_buf(),
            message,
        })
        .map(|(sagemaker, fields)| AccelerateConfig {
            path: path.to_path_buf(),
            sagemaker,
            fields,
        })
}

/// accelerate's `process_config` and class checks on a parsed document.
pub fn process(value: Value) -> Result<(bool, Map<String, Value>), String> {
    let Value::Object(mut d) = value else {
        return Err("it must be a mapping of keys to values (as `accel config` writes)".into());
    };
    let env = d
        .entry("compute_environment")
        .or_insert_with(|| json!("LOCAL_MACHINE"))
        .clone();
    let sagemaker = match env.as_str() {
        Some("LOCAL_MACHINE") => false,
        Some("AMAZON_SAGEMAKER") => true,
        _ => {
            return Err(format!(
                "compute_environment is {}; use LOCAL_MACHINE or AMAZON_SAGEMAKER",
                excerpt(&env.to_string())
            ))
        }
    };
    let Some(kind) = d.get("distributed_type").cloned() else {
        return Err(
            "a `distributed_type` must be specified (for one process: distributed_type: 'NO')"
                .into(),
        );
    };
    let cluster: Vec<&str> = DistributedType::ALL.map(DistributedType::name).to_vec();
    let allowed = if sagemaker {
        schema::SAGEMAKER_DISTRIBUTED_TYPES
    } else {
        &cluster[..]
    };
    match &kind {
        Value::String(s) if allowed.contains(&s.as_str()) => {}
        Value::Bool(false) => {
            return Err("distributed_type is the boolean false: unquoted NO is a boolean in YAML 1.1, as accelerate reads it; write distributed_type: 'NO'".into())
        }
        other => {
            return Err(format!(
                "distributed_type {} is not one of {}",
                excerpt(&other.to_string()),
                allowed.join(", ")
            ))
        }
    }
    // SageMaker's class has no num_processes; accelerate adds it anyway and
    // then rejects its own key (a known defect), so only local configs get it.
    if !sagemaker && kind == DistributedType::No.name() && !d.contains_key("num_processes") {
        d.insert("num_processes".into(), json!(1));
    }
    if !d.contains_key("mixed_precision") {
        let legacy = d.get("fp16").is_some_and(super::pyvalue::truthy);
        d.insert(
            "mixed_precision".into(),
            if legacy { json!("fp16") } else { Value::Null },
        );
    }
    d.remove("fp16");
    if let Some(backend) = d.remove("dynamo_backend") {
        let dynamo = if backend == DynamoBackend::No.name() {
            json!({})
        } else {
            json!({ "dynamo_backend": backend })
        };
        d.insert("dynamo_config".into(), dynamo);
    }
    for key in ["use_cpu", "debug", "enable_cpu_affinity"] {
        d.entry(key).or_insert(Value::Bool(false));
    }
    let fields = if sagemaker {
        SAGEMAKER_FIELDS
    } else {
        CLUSTER_FIELDS
    };
    let unknown: Vec<&String> = d
        .keys()
        .filter(|k| !fields.iter().any(|(f, _)| f == k))
        .collect();
    if !unknown.is_empty() {
        // A few names, each excerpted: a file may hold thousands of keys.
        let mut names: Vec<String> = unknown
            .iter()
            .take(10)
            .map(|k| format!("'{}'", excerpt(k)))
            .collect();
        if unknown.len() > names.len() {
            names.push(format!("and {} more", unknown.len() - names.len()));
        }
        return Err(format!(
            "unknown keys ([{}]); remove them or fix their spelling (the keys accelerate knows: {})",
            names.join(", "),
            fields.iter().map(|(f, _)| *f).collect::<Vec<_>>().join(", ")
        ));
    }
    let mut out = Map::new();
    let mut missing = Vec::new();
    for (name, default) in fields {
        let v = match (d.remove(*name), default) {
            // A required key set to null has no value: accelerate would take
            // it, then write a file (`config update` drops nulls) it refuses.
            // Not mixed_precision: a missing one is filled with null above,
            // so its null survives the round trip.
            (Some(Value::Null), schema::FieldDefault::Required) if *name != "mixed_precision" => {
                missing.push(*name);
                continue;
            }
            (Some(v), _) => v,
            (None, schema::FieldDefault::Value(lit)) => {
                serde_json::from_str(lit).unwrap_or(Value::Null)
            }
            (None, schema::FieldDefault::Required) => {
                missing.push(*name);
                continue;
            }
        };
        // The dictionaries accelerate fills in when they are None.
        let v = match v {
            Value::Null if default == &schema::FieldDefault::Value("{}") => json!({}),
            v => v,
        };
        out.insert((*name).to_owned(), v);
    }
    if !missing.is_empty() {
        return Err(format!("missing required keys: {}", missing.join(", ")));
    }
    Ok((sagemaker, out))
}

/// `v` with every mapping's keys sorted (Python's `sort_keys=True`); maps
/// otherwise keep the file's order, which accelerate reports in places.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Writes `fields` (after [`to_dict`]) as accelerate does: JSON when the
/// name ends in `.json`, else YAML. Creates the parent directory.
pub fn save(path: &Path, fields: &Map<String, Value>) -> Result<(), ConfigFileError> {
    let dict = Value::Object(to_dict(fields));
    let text = if path.extension().is_some_and(|e| e == "json") {
        serde_json::to_string_pretty(&sorted(&dict)).unwrap_or_default() + "\n"
    } else {
        yaml::dump(&dict)
    };
    let err = |source| ConfigFileError {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::write(path, text).map_err(err)
}

/// `accel config update`: reads the file through the full pipeline and
/// writes it back (legacy keys migrated, defaults materialised).
pub fn update(
    explicit: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, UpdateError> {
    let path = explicit.map_or_else(|| default_location(env), Path::to_path_buf);
    if !path.is_file() {
        return Err(UpdateError::Load(LoadError::Missing(path)));
    }
    let config = load(&path)?;
    save(&path, &config.fields)?;
    Ok(format!(
        "Successfully updated the configuration file at {}.",
        path.display()
    ))
}

/// Why `config update` failed.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The file could not be read.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The file could not be written.
    #[error(transparent)]
    Save(#[from] ConfigFileError),
}

#[cfg(test)]
mod tests;
