//! `accel-agent`: launches and supervises one node's training processes.

use std::process::ExitCode;
use std::sync::Arc;

use accel_agent::cli::AgentArgs;
use accel_agent::config::Config;
use accel_agent::guard::Guard;
use clap::Parser;

fn main() -> ExitCode {
    let args = AgentArgs::parse();
    init_tracing();
    let cfg = match Config::from_args(&args, &|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("accel-agent: error: {e}");
            return ExitCode::from(2);
        }
    };
    if accel_agent::raise_open_file_limit().is_none() {
        tracing::debug!("cannot read or raise the open-file limit");
    }
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    // Forked before any thread exists; see the guard module.
    let guard = match Guard::start() {
        Ok(g) => Some(Arc::new(g)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the guard process; workers may outlive a crashed agent");
            None
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("accel-agent: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(accel_agent::agent::run(cfg, guard)) {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(e) => {
            eprintln!("accel-agent: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ACCEL_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,accel_agent=info,rendezvous_server=error")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
