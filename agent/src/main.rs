//! `accel-agent`: launches and supervises one node's training processes.

use std::process::ExitCode;

use accel_agent::cli::AgentArgs;
use accel_agent::config::{slurm, LaunchOptions};
use accel_agent::node;

/// The static (musl) builds' allocator: musl's malloc made the shipped
/// binaries slower and larger than the glibc build (BENCHMARKS.md,
/// "Shipped binaries"); glibc builds keep glibc's malloc.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Makes mimalloc return freed memory to the system at once: with its
/// default 10 ms purge delay, what a burst (every node joining) freed stayed
/// resident until the allocator's next busy moment, 9 % more memory per
/// connected agent than glibc's malloc at 10,000 agents, for no CPU saved.
/// First thing in `main`: mimalloc's options are set before any thread runs.
#[cfg(target_env = "musl")]
fn tune_allocator() {
    /// `mi_option_purge_delay` in mimalloc 2's `mi_option_t` (the crate's `v2`).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: one store into mimalloc's option table, from the only thread.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) }
}

fn main() -> ExitCode {
    #[cfg(target_env = "musl")]
    tune_allocator();
    node::abort_on_panic();
    // Before anything reads the token or runs a probe (nvidia-smi while the
    // configuration is built): other processes of this user cannot read
    // this one's environment or memory from here on. The token's variables
    // are removed once it is read (`node::run`).
    node::hide_early();
    if let Some(code) = accel_input::generated::<AgentArgs>() {
        return code;
    }
    // Usage errors exit 2 and quote only excerpts of the values.
    let (args, matches): (AgentArgs, _) = accel_input::parse_with_matches_or_exit();
    if let Some(shell) = &args.print_completion {
        return accel_input::print_completion::<AgentArgs>(shell);
    }
    node::init_logs(args.log_format, node::DEFAULT_LOG_FILTER);
    let env = |k: &str| std::env::var(k).ok();
    let given = |id: &str| {
        use clap::parser::ValueSource;
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let mut options = LaunchOptions::from(args);
    match slurm::apply(&mut options, &given, &env) {
        Ok(Some(line)) => tracing::info!("{line}"),
        Ok(None) => {}
        Err(e) => {
            node::say(&format!("accel-agent: error: {e}"));
            return ExitCode::from(2);
        }
    }
    match options.build(&env) {
        Ok(cfg) => node::run(cfg, "accel-agent"),
        Err(e) => {
            node::say(&format!("accel-agent: error: {e}"));
            ExitCode::from(2)
        }
    }
}
