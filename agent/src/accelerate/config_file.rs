//! accelerate's configuration file: where it lives and what
//! `config default` writes (reference: accelerate §1.3, §2.1, §2.5).

use std::path::{Path, PathBuf};

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
pub fn default_config(mixed_precision: &str, gpus: u32) -> String {
    let (distributed, processes, use_cpu) = match gpus {
        0 => ("NO", 1, true),
        1 => ("NO", 1, false),
        n => ("MULTI_GPU", n, false),
    };
    let config = serde_json::json!({
        "compute_environment": "LOCAL_MACHINE",
        "debug": false,
        "distributed_type": distributed,
        "downcast_bf16": false,
        "enable_cpu_affinity": false,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision,
        "num_machines": 1,
        "num_processes": processes,
        "rdzv_backend": "static",
        "same_network": false,
        "tpu_use_cluster": false,
        "tpu_use_sudo": false,
        "use_cpu": use_cpu,
    });
    // serde_json's map keeps keys sorted and pretty-prints with two spaces: the
    // same text as Python's json.dumps(indent=2, sort_keys=True).
    serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
}

/// Writes the default configuration to `path` unless a file is already there.
/// Returns the message to print (accelerate's wording).
pub fn write_default(
    path: &Path,
    mixed_precision: &str,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_follow_accelerate() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            default_location(&env(&[("HF_HOME", "/hf"), ("XDG_CACHE_HOME", "/x")])),
            Path::new("/hf/accelerate/default_config.yaml")
        );
        assert_eq!(
            default_location(&env(&[("XDG_CACHE_HOME", "/x")])),
            Path::new("/x/huggingface/accelerate/default_config.yaml")
        );
        assert_eq!(
            default_location(&env(&[("HOME", "/home/u")])),
            Path::new("/home/u/.cache/huggingface/accelerate/default_config.yaml")
        );
        assert_eq!(
            default_location(&env(&[("HOME", "/home/u"), ("HF_HOME", "~/hf")])),
            Path::new("/home/u/hf/accelerate/default_config.yaml")
        );
    }

    #[test]
    fn device_counts() {
        assert!(default_config("no", 0).contains("\"use_cpu\": true"));
        let four = default_config("bf16", 4);
        assert!(
            four.contains("\"distributed_type\": \"MULTI_GPU\"")
                && four.contains("\"num_processes\": 4")
        );
        assert!(
            four.contains("\"mixed_precision\": \"bf16\"") && four.contains("\"use_cpu\": false")
        );
        assert!(four.starts_with("{\n  \"compute_environment\": \"LOCAL_MACHINE\",\n"));
    }
}
