//! `accel launch` (in progress).

/// A launch ready to run.
#[derive(Debug)]
pub struct LaunchPlan {
    /// The agent's configuration.
    pub config: crate::config::Config,
    /// `-q/--quiet`.
    pub quiet: bool,
    /// Printed after the job succeeds (`accel test`).
    pub on_success: Option<String>,
}

/// What `plan` decided.
#[derive(Debug)]
pub enum Planned {
    /// `--help`: print this.
    Help(String),
    /// Run the agent.
    Run(Box<LaunchPlan>),
}

/// Why a launch cannot start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LaunchError(pub String);

/// Plans `accel launch ARGS`.
pub fn plan(
    _args: &[String],
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<Planned, LaunchError> {
    Err(LaunchError("launch is not implemented yet".into()))
}
