//! `accel-agent`: launches and supervises one node's training processes.

use std::process::ExitCode;

use accel_agent::cli::AgentArgs;
use accel_agent::config::LaunchOptions;
use accel_agent::node;

fn main() -> ExitCode {
    // Usage errors exit 2 and quote only excerpts of the values.
    let args: AgentArgs = rendezvous_server::input::parse_or_exit();
    node::init_logs(args.log_format, node::DEFAULT_LOG_FILTER);
    match LaunchOptions::from(args).build(&|k| std::env::var(k).ok()) {
        Ok(cfg) => node::run(cfg, "accel-agent"),
        Err(e) => {
            eprintln!("accel-agent: error: {e}");
            ExitCode::from(2)
        }
    }
}
