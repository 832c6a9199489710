//! `accel estimate-memory` (in progress).

/// `accel estimate-memory` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct EstimateArgs {
    /// Model: a local folder, or a Hub id.
    pub model_name: String,
}

/// Why the estimate failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EstimateError(pub String);

/// Runs the command; returns the text to print.
pub fn run(
    args: &EstimateArgs,
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, EstimateError> {
    Err(EstimateError(format!(
        "estimate-memory is not implemented yet ({})",
        args.model_name
    )))
}
