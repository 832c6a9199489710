//! A round's workers, as the driver uses them: getting ready to start them,
//! starting them, hearing them end, stopping them.
//!
//! Like [`Link`](super::link::Link), these traits are seams for the
//! driver's unit tests: the agent has one implementation, [`Processes`]
//! (executed or forked processes, [`WorkerGroup`]), and the tests a fake
//! whose workers end when a test says so.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::round::Exit;
use crate::logs::tee::Console;
use crate::supervisor::{SpawnError, WorkerGroup, WorkerSpec};
use accel_process::fork_server::ForkServer;
use accel_process::guard::Guard;
use accel_process::zygote::Zygote;

/// One round's running workers on this node.
pub(crate) trait Workers: Send + 'static {
    /// The next worker exit; pending forever once every worker has ended.
    /// Cancel-safe.
    fn next_exit(&mut self) -> impl Future<Output = Exit> + Send;

    /// The backstop: exits that happened but were not reported yet.
    fn check(&mut self) -> Vec<Exit>;

    /// Whether every worker has ended.
    fn all_ended(&self) -> bool;

    /// Their process ids, by local rank.
    fn pids(&self) -> Vec<i32>;

    /// `sig` to every live worker, SIGKILL after `grace`, then whatever they
    /// started; the exits seen meanwhile.
    fn stop(&mut self, sig: Signal, grace: Duration) -> impl Future<Output = Vec<Exit>> + Send;

    /// Whether the guard killed them since this was last asked (the agent
    /// did not run past its fence deadline, see `guard.rs`).
    fn fenced_by_guard(&self) -> bool {
        false
    }
}

/// Starts a round's workers.
pub(crate) trait Spawner: Send + Sync {
    /// The workers it starts.
    type Group: Workers;

    /// Waits until a round can start after the one whose workers were
    /// `previous` (preloaded imports done, GPUs released). Cancel-safe: a
    /// stop signal meanwhile starts nothing.
    fn prepare(&self, previous: &[i32]) -> impl Future<Output = ()> + Send;

    /// Starts one worker per spec; if one cannot start, the ones started
    /// are killed and the error says which.
    fn spawn(
        &self,
        specs: Vec<WorkerSpec>,
    ) -> impl Future<Output = Result<Self::Group, SpawnError>> + Send;
}

impl Workers for WorkerGroup {
    fn next_exit(&mut self) -> impl Future<Output = Exit> + Send {
        WorkerGroup::next_exit(self)
    }

    fn fenced_by_guard(&self) -> bool {
        WorkerGroup::fenced_by_guard(self)
    }

    fn check(&mut self) -> Vec<Exit> {
        WorkerGroup::check(self)
    }

    fn all_ended(&self) -> bool {
        WorkerGroup::all_ended(self)
    }

    fn pids(&self) -> Vec<i32> {
        WorkerGroup::pids(self)
    }

    fn stop(&mut self, sig: Signal, grace: Duration) -> impl Future<Output = Vec<Exit>> + Send {
        WorkerGroup::stop(self, sig, grace)
    }
}

/// The agent's workers: processes, executed, or forked by a fork server
/// (`--fork-server-fd`) or by the `--preload` zygote once it is ready.
#[derive(Clone, Default)]
pub(crate) struct Processes {
    /// Kills the workers if the agent freezes or dies.
    pub guard: Option<Arc<Guard>>,
    /// Where tee'd output goes.
    pub console: Option<Console>,
    /// Forks the workers, with `--fork-server-fd`.
    pub forks: Option<Arc<ForkServer>>,
    /// Forks the workers when it is ready, with `--preload`.
    pub zygote: Option<Arc<Zygote>>,
    /// How long a round waits for the last one's GPUs.
    pub gpu_free_timeout: Duration,
}

impl Processes {
    /// Who forks the workers, if anyone: the fork server, else the zygote
    /// (once its imports are done; `None` if it fell back to cold starts).
    async fn forks(&self) -> Option<Arc<ForkServer>> {
        match (&self.forks, &self.zygote) {
            (Some(server), _) => Some(server.clone()),
            (None, Some(zygote)) => zygote.server().await,
            (None, None) => None,
        }
    }
}

impl Spawner for Processes {
    type Group = WorkerGroup;

    async fn prepare(&self, previous: &[i32]) {
        // The first round may wait for the imports.
        self.forks().await;
        crate::gpu::wait_released(previous, self.gpu_free_timeout).await;
    }

    async fn spawn(&self, specs: Vec<WorkerSpec>) -> Result<WorkerGroup, SpawnError> {
        let forks = self.forks().await;
        WorkerGroup::spawn(
            specs,
            self.guard.clone(),
            self.console.clone(),
            forks.as_deref(),
        )
        .await
    }
}
