//! `accel tpu-config` (in progress).

/// `accel tpu-config` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct TpuArgs {
    /// accelerate's configuration file.
    #[arg(long = "config_file", alias = "config-file")]
    pub config_file: Option<std::path::PathBuf>,
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TpuError(pub String);

/// Runs the command; returns the text to print.
pub fn run(
    _args: &TpuArgs,
    _config: Option<&serde_json::Map<String, serde_json::Value>>,
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, TpuError> {
    Err(TpuError("tpu-config is not implemented yet".into()))
}
