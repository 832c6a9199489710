//! `accel env` (in progress).

use std::path::Path;

/// Why `accel env` failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EnvError(pub String);

/// Returns the text to print.
pub fn run(
    _config_file: Option<&Path>,
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, EnvError> {
    Err(EnvError("accel env is not implemented yet".into()))
}
