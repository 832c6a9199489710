//! `accel`: accelerate's command set on accel's agent (see the `accel_cli` library).

use std::io::Write;
use std::process::ExitCode;

use accel_agent::node;
use accel_cli::{run, AccelArgs, Action};

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
