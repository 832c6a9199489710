//! Running one node to completion from a binary's `main`: shared by
//! `accel-agent` and `accel launch`, so both start the agent the same way.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::Config;
use crate::{AgentError, Outcome};
use accel_process::guard::Guard;

/// Makes any panic end the process at once, in every build profile (the
/// release profile already aborts). A supervisor that lost a task to a panic
/// would otherwise run on half-alive: tokio keeps the runtime going, and a
/// job whose fork-server or signal task died would never stop. Aborted, the
/// agent's guard kills its workers and the rendezvous drops the node.
/// Binaries call it first; a library caller keeps its own policy.
pub fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}

/// Writes `line` to stderr, or nowhere if stderr is gone (`eprintln!`
/// would panic on a pipe whose reader exited).
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Installs the log subscriber (`ACCEL_LOG` overrides `default_filter`),
/// unless the program already has one.
pub fn init_tracing(default_filter: &str) {
    init_logs(accel_telemetry::logging::LogFormat::Text, default_filter);
}

/// [`init_tracing`] in `format` (`--log-format`).
pub fn init_logs(format: accel_telemetry::logging::LogFormat, default_filter: &str) {
    accel_telemetry::logging::init(format, "ACCEL_LOG", default_filter, false);
}

/// The default log filter: the agent's own progress, others' warnings. The
/// agent's own crates (process control, the worker store, the rendezvous
/// client) log at `info` as the agent does; the client's `auth` is quiet, as
/// the server's was when it lived there.
pub const DEFAULT_LOG_FILTER: &str = "warn,accel_agent=info,accel_process=info,accel_worker_store=info,accel_rdzv_client=info,accel_wire::auth=error,rendezvous_server=error,rendezvous_server::ha=info";

/// Runs the agent for `cfg` and returns the process's exit code. Call it
/// while the process has one thread: it hides the process's secrets
/// ([`protect_secrets`]) and forks the guard first. `prog` prefixes error
/// messages.
pub fn run(cfg: Config, prog: &str) -> ExitCode {
    protect_secrets();
    // As a container's PID 1, a first process of its own reaps orphans and
    // passes signals on; the agent goes on in its child.
    match accel_process::init::reap_as_pid1() {
        Ok(true) => {
            tracing::debug!("PID 1: a first process reaps orphans; the agent runs as its child")
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "this agent is PID 1 and cannot fork a reaper; orphans of its workers will stay zombies")
        }
    }
    match execute(cfg) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(e) => {
            say(&format!("{prog}: error: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Keeps the rendezvous token, read into `cfg` by now, from the processes
/// of the agent's user, workers included (SECURITY.md, "The token in the
/// agent's process"):
/// - the process is made non-dumpable (`PR_SET_DUMPABLE` 0), so another
///   process of its user can neither read its `/proc/PID/environ` or
///   memory nor trace it;
/// - the token's variables (`SECRET_VARIABLES`) are removed from its
///   environment, and their entries blanked in the raw environment block
///   the kernel shows as `/proc/PID/environ` (root can still read it).
///
/// For the binaries (`accel-agent`, `accel launch`) before anything else:
/// call it while the process has one thread (nothing is changed otherwise,
/// with a warning). [`execute`] does not call it: a program that runs the
/// agent as a library (worker-runtime's launcher) is the user's own, and
/// its standalone job needs no token.
pub fn protect_secrets() {
    if let Err(e) = accel_process::sys::not_dumpable() {
        tracing::warn!(error = %e, "cannot make the agent non-dumpable (PR_SET_DUMPABLE); processes of its user may read its environment and memory");
    }
    match accel_process::sys::scrub_environment(&crate::supervisor::SECRET_VARIABLES) {
        Ok(n) => tracing::debug!(entries = n, "secret variables removed from the environment"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot remove the rendezvous token from the agent's environment")
        }
    }
}

/// The first step of [`protect_secrets`], for the very start of `main`:
/// the process becomes non-dumpable before the configuration (which reads
/// the token and may run `nvidia-smi` for a few seconds) is built. Silent:
/// [`protect_secrets`] warns if it cannot.
pub fn hide_early() {
    let _ = accel_process::sys::not_dumpable();
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
    if let Some(plan) = &cfg.numa_binding {
        let ranks: Vec<String> = plan
            .iter()
            .enumerate()
            .map(|(rank, cpus)| format!("local rank {rank}: CPUs {cpus}"))
            .collect();
        tracing::info!("--numa-binding: {}", ranks.join("; "));
    }
    // Checked before this process opens anything, so the number still
    // names the socket the parent passed (see `sys::take_inherited_socket`).
    if let Some(fd) = cfg.fork_server_fd {
        accel_process::sys::check_inherited_socket(fd)
            .map_err(|e| AgentError::Config(format!("--fork-server-fd {fd}: {e}")))?;
    }
    // Forked before any thread exists; see the guard module.
    // A frozen agent's workers are killed after the job's drop limit (in
    // an agent-only rendezvous, before its presence lease can end).
    // (Never with the test-only switch that turns fencing off: `testing`.)
    let limit = Some(crate::config::conflicts::frozen_limit(
        &cfg.rendezvous,
        &cfg.rdzv,
    ))
    .filter(|d| !d.is_zero() && !crate::testing::fence_broken());
    if crate::testing::fence_broken() {
        tracing::warn!("ACCEL_TEST_BREAK_FENCE=1 (a debug build's test-only switch): this node never fences its workers");
    }
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
    let guard_pid = guard.as_ref().map(|g| g.pid());
    let result = runtime.block_on(crate::agent::run(cfg, guard));
    // Every handle to the guard's pipe goes with the runtime's tasks; the
    // guard sees the end and exits, and is reaped here rather than left a
    // zombie in this process group.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    if let Some(pid) = guard_pid {
        if !accel_process::guard::reap(pid, std::time::Duration::from_secs(1)) {
            tracing::debug!(%pid, "the guard process did not exit within 1 s; leaving it");
        }
    }
    result
}
