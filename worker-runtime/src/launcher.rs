//! Running a function in N processes of the current program: the Rust
//! counterpart of accelerate's `notebook_launcher` and `debug_launcher`.
//!
//! The calling program is started again N times by accel's own agent code
//! (the `accel-agent` crate, in this process: the same embedded rendezvous,
//! worker store, supervision, restarts and orphan guard as
//! `accel-agent --standalone`). Each copy gets torchrun's environment plus a
//! marker variable; when a copy reaches the same [`Launcher::run`] call it
//! sees the marker, runs the function as that rank and exits with its result.
//! So the function must be reached the same way in every process: call the
//! launcher from `main`, before anything that should happen only once.
//!
//! As accelerate warns for its launchers, the calling process must not have
//! created a process group itself before launching: the workers create their
//! own. That is checked ([`LaunchError::AlreadyInitialized`]). accelerate
//! also refuses to launch after CUDA was initialised, because its workers are
//! `fork`ed copies that cannot re-initialise it; accel's workers are new
//! processes (the program is executed again), so a parent that used CUDA is
//! not an error here, only a parent holding GPU memory its workers may want.
//! The agent forks a guard process, so call it while the program has one
//! thread (before starting thread pools of its own).

use std::sync::atomic::{AtomicBool, Ordering};

use accel_agent::config::{Config, LaunchOptions, Nproc};
use accel_agent::Outcome;

use crate::env::WorkerEnv;

/// Set in the processes the launcher starts, so they run the function.
pub const CHILD_VAR: &str = "ACCEL_FUNCTION_LAUNCH";

/// Set (to `1`) in the processes of a debug launch: CPU and gloo only.
pub const DEBUG_VAR: &str = "ACCEL_DEBUG_LAUNCH";

static GROUP_CREATED: AtomicBool = AtomicBool::new(false);

/// Records that this process created a process group (see the module doc).
pub(crate) fn note_group_created() {
    GROUP_CREATED.store(true, Ordering::SeqCst);
}

/// Why a launch did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The caller already has a process group.
    #[error("this process already created a process group; launch the function before creating one (each launched process creates its own)")]
    AlreadyInitialized,
    /// Zero processes.
    #[error("the number of processes must be at least 1")]
    NoProcesses,
    /// The program's own path is unknown.
    #[error("cannot find this program's path to start it again: {0}")]
    NoExecutable(std::io::Error),
    /// The agent refused the settings.
    #[error("invalid launch settings: {0}")]
    Config(String),
    /// The agent could not run the job.
    #[error(transparent)]
    Agent(#[from] accel_agent::AgentError),
    /// The job failed after its restarts.
    #[error("the launched function failed: {0}")]
    Failed(String),
    /// The launch was stopped by a signal.
    #[error("the launch was stopped by signal {0}")]
    Signaled(String),
}

/// A launch of a function in several processes.
#[derive(Debug, Clone)]
pub struct Launcher {
    num_processes: u32,
    max_restarts: u32,
    debug: bool,
}

impl Launcher {
    /// `num_processes` processes, no restarts.
    pub fn new(num_processes: u32) -> Self {
        Self {
            num_processes,
            max_restarts: 0,
            debug: false,
        }
    }

    /// Restart every process up to `n` times after a failure (the function
    /// sees `TORCHELASTIC_RESTART_COUNT` in [`WorkerEnv`]).
    pub fn max_restarts(mut self, n: u32) -> Self {
        self.max_restarts = n;
        self
    }

    /// Debug mode, as accelerate's `debug_launcher`: no GPUs are visible
    /// (`CUDA_VISIBLE_DEVICES` empty), gloo on the loopback interface.
    pub fn debug(mut self, on: bool) -> Self {
        self.debug = on;
        self
    }

    /// Runs `f` as every rank. In the launching process this returns when
    /// all processes have finished; in a launched process it runs `f` and
    /// exits the process (status 0 when `f` returns `Ok`, 1 otherwise).
    pub fn run<E: std::fmt::Display>(
        self,
        f: impl FnOnce(&WorkerEnv) -> Result<(), E>,
    ) -> Result<(), LaunchError> {
        if std::env::var_os(CHILD_VAR).is_some() {
            run_child(f)
        }
        self.launch()
    }

    fn launch(self) -> Result<(), LaunchError> {
        if GROUP_CREATED.load(Ordering::SeqCst) {
            return Err(LaunchError::AlreadyInitialized);
        }
        let cfg = self.config(&|k| std::env::var(k).ok())?;
        accel_agent::node::init_tracing(accel_agent::node::DEFAULT_LOG_FILTER);
        match accel_agent::node::execute(cfg)? {
            Outcome::Succeeded => Ok(()),
            Outcome::Failed(why) => Err(LaunchError::Failed(why)),
            Outcome::NoRestart { reason, code } => Err(LaunchError::Failed(format!(
                "{reason} (the agent exits with {code})"
            ))),
            Outcome::Signaled(s) => Err(LaunchError::Signaled(s.to_string())),
        }
    }

    /// The agent configuration for this launch.
    pub fn config(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, LaunchError> {
        if self.num_processes == 0 {
            return Err(LaunchError::NoProcesses);
        }
        let exe = std::env::current_exe().map_err(LaunchError::NoExecutable)?;
        let mut options = LaunchOptions::new(exe.display().to_string());
        options.standalone = true;
        options.nproc_per_node = Nproc::Count(self.num_processes);
        options.max_restarts = self.max_restarts;
        options.no_python = true;
        options.training_script_args = std::env::args().skip(1).collect();
        options.base_env.push((CHILD_VAR.into(), "1".into()));
        if self.debug {
            options.base_env.push((DEBUG_VAR.into(), "1".into()));
            options
                .base_env
                .push(("CUDA_VISIBLE_DEVICES".into(), String::new()));
            options
                .base_env
                .push(("GLOO_SOCKET_IFNAME".into(), "lo".into()));
        }
        let cfg = options
            .build(env)
            .map_err(|e| LaunchError::Config(e.to_string()))?;
        Ok(cfg)
    }
}

/// In a launched process: run the function as this rank and exit.
fn run_child<E: std::fmt::Display>(f: impl FnOnce(&WorkerEnv) -> Result<(), E>) -> ! {
    let code = match WorkerEnv::from_process() {
        Ok(env) => match f(&env) {
            Ok(()) => 0,
            Err(e) => {
                let message = e.to_string();
                eprintln!("rank {}: {message}", env.rank);
                // The launcher's failure summary shows it as the root cause.
                if let Err(io) = crate::record_error(&env, &message, "") {
                    eprintln!("rank {}: cannot write the error file: {io}", env.rank);
                }
                1
            }
        },
        Err(e) => {
            eprintln!("launched process: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// accelerate's `debug_launcher`: `f` in `num_processes` CPU-only processes.
pub fn debug_launch<E: std::fmt::Display>(
    num_processes: u32,
    f: impl FnOnce(&WorkerEnv) -> Result<(), E>,
) -> Result<(), LaunchError> {
    Launcher::new(num_processes).debug(true).run(f)
}
