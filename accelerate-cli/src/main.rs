//! `accel`: accelerate's command set on accel's agent (see the `accel_cli` library).

use std::io::Write;
use std::process::ExitCode;

use accel_agent::node;
use accel_cli::{run, AccelArgs, Action};

fn main() -> ExitCode {
    node::abort_on_panic();
    // Before anything reads the token or runs a probe (nvidia-smi while the
    // configuration is built): other processes of this user cannot read
    // this one's environment or memory from here on. The token's variables
    // are removed once it is read (`node::run`).
    node::hide_early();
    if let Some(code) = accel_input::generated::<AccelArgs>() {
        return code;
    }
    // Usage errors exit 2 and quote only excerpts of the values.
    let args: AccelArgs = accel_input::parse_or_exit();
    match run(args, &|k| std::env::var(k).ok()) {
        Ok(Action::Print(message)) => {
            // A closed pipe (`accel launch --help | head`) is not an error.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{message}").and_then(|()| out.flush());
            ExitCode::SUCCESS
        }
        Ok(Action::Launch(plan)) => {
            node::init_tracing(if plan.quiet {
                "error"
            } else {
                node::DEFAULT_LOG_FILTER
            });
            let code = node::run(plan.config, "accel launch");
            if let (Some(message), true) = (&plan.on_success, code == ExitCode::SUCCESS) {
                let _ = writeln!(std::io::stdout().lock(), "{message}");
            }
            code
        }
        Err(e) => {
            node::say(&format!("accel: error: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}
