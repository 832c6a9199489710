//! Running one node to completion from a binary's `main`: shared by
//! `accel-agent` and `accel launch`, so both start the agent the same way.

use std::process::ExitCode;
use std::sync::Arc;

use crate::config::Config;
use crate::guard::Guard;
use crate::{AgentError, Outcome};

/// Installs the log subscriber (`ACCEL_LOG` overrides `default_filter`),
/// unless the program already has one.
pub fn init_tracing(default_filter: &str) {
    init_logs(accel_telemetry::logging::LogFormat::Text, default_filter);
}

/// [`init_tracing`] in `format` (`--log-format`).
pub fn init_logs(format: accel_telemetry::logging::LogFormat, default_filter: &str) {
    accel_telemetry::logging::init(format, "ACCEL_LOG", default_filter, false);
}

/// The default log filter: the agent's own progress, others' warnings.
pub const DEFAULT_LOG_FILTER: &str =
    "warn,accel_agent=info,rendezvous_server=error,rendezvous_server::ha=info";

/// Runs the agent for `cfg` and returns the process's exit code. Call it
/// while the process has one thread: it forks the guard first. `prog`
/// prefixes error messages.
pub fn run(cfg: Config, prog: &str) -> ExitCode {
    match execute(cfg) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(e) => {
            eprintln!("{prog}: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs the agent for `cfg` to its outcome, on a runtime of its own. Call it
/// while the process has one thread: it forks the guard first.
pub fn execute(cfg: Config) -> Result<Outcome, AgentError> {
    if crate::raise_open_file_limit().is_none() {
        tracing::debug!("cannot read or raise the open-file limit");
    }
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    // Checked before this process opens anything, so the number still
    // names the socket the parent passed (see `sys::take_inherited_socket`).
    if let Some(fd) = cfg.fork_server_fd {
        crate::sys::check_inherited_socket(fd)
            .map_err(|e| AgentError::Config(format!("--fork-server-fd {fd}: {e}")))?;
    }
    // Forked before any thread exists; see the guard module.
    // A frozen agent's workers are killed after the job's drop limit.
    let limit = Some(cfg.rdzv.dead_after()).filter(|d| !d.is_zero());
    let guard = match Guard::start(limit) {
        Ok(g) => Some(Arc::new(g)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the guard process; workers may outlive a crashed agent");
            None
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AgentError::io("cannot start the async runtime", e))?;
    runtime.block_on(crate::agent::run(cfg, guard))
}
