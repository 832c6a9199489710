//! accel's per-node agent: a drop-in for `torchrun`.
//!
//! # Theory of operation
//! [`node::execute`] (from `accel-agent`'s `main`, `accel launch`, or
//! worker-runtime's function launcher) forks the [`guard`](accel_process::guard) while the process
//! has one thread, then starts the async runtime and calls [`agent::run`]:
//! 1. signal handlers are installed first, so a stop signal is honoured at any
//!    point, even while waiting for other nodes;
//! 2. the rendezvous is located, and served in-process when this node hosts
//!    it (standalone, static node rank 0, c10d `is_host`): one state machine
//!    (the `rendezvous-server` crate) serves every mode;
//! 3. the agent joins and keeps one event stream open; for each round it
//!    stops its workers, says it is ready (offering a listener it has bound
//!    for the workers' store), waits for the round to form, serves a fresh
//!    worker store (the `accel-worker-store` crate) on that listener if it
//!    is node rank 0, and starts the workers
//!    with torchrun's environment (`worker_env`);
//! 4. `supervisor` reports each worker exit as it happens: a failure is
//!    reported to the server at once, which restarts every node (while the
//!    job-wide budget lasts) or fails the job; when all workers of all nodes
//!    succeed, the server ends the job and every agent exits 0;
//! 5. if the rendezvous is lost (stream ends, keep-alives unanswered), the
//!    workers keep running for `reconnect_grace` while the agent rejoins:
//!    it resumes if its round is still current, otherwise it stops them.
//!
//! Shutdown has one path: whatever ends a round (restart, failure, signal,
//! lost rendezvous) calls `supervisor::WorkerGroup::stop`, which signals
//! the workers' process groups, waits `--shutdown-timeout`, SIGKILLs the
//! rest and sweeps the groups. The [`guard`](accel_process::guard) covers the agent's own death.
//!
//! # Layout
//! [`node`] running a node from a binary's `main` · [`cli`] flags ·
//! [`config`] validation · [`agent`] joining, the node's state machine
//! ([`agent::machine`], its vocabulary in [`agent::round`]) and the driver that does its I/O · `rendezvous` locating or hosting it ·
//! `supervisor` worker processes · [`numa`] `--numa-binding`'s CPUs · `worker_env` the environment contract ·
//! [`logs`] tee, redirects,
//! prefixes, filtered copies · `events` torchelastic's status events
//! (`--event-log-handler`) · `failure` error files and failure summaries · `files`
//! per-attempt directories · `signal` stop
//! signals · `sys` CPU affinity and the host-name lookup (`unsafe`). Process
//! control (spawn hooks, process groups, the guard against orphans, the fork
//! server and the zygote, the agent's hardening) is its own crate,
//! `accel-process`, which knows nothing of rounds or logs. The workers' TCPStore-compatible
//! store is its own crate, `accel-worker-store`, which knows nothing of the
//! agent; so is the rendezvous client (the calls, leader following, TLS files,
//! the token), `accel-rdzv-client`, shared with `rdzv-server status`. Accelerate's command set (`accel`)
//! is its own crate, `accel-cli`, on this library.
#![deny(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod config;
mod deadline;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod failure;
pub mod file_timer;
pub(crate) mod files;
pub(crate) mod gpu;
pub mod hang;
pub mod health;
pub mod logs;
pub(crate) mod metrics;
pub mod node;
pub mod numa;
pub mod peers;
pub mod probe;
pub mod progress;
mod rendezvous;
pub(crate) mod signal;
pub mod stacks;
pub(crate) mod supervisor;
mod sys;
pub mod testing;
pub(crate) mod worker_env;

pub use accel_process::Ended;
pub use error::{AgentError, Outcome};

/// Raises the open-file limit to the hard limit: the node-rank-0 agent's
/// worker store holds one connection per worker client, and a soft limit of
/// 1,024 would refuse the rest of a large job. Call once at start-up;
/// returns the limit now in force. (The rendezvous client's, shared with
/// the server.)
pub fn raise_open_file_limit() -> Option<u64> {
    accel_wire::raise_open_file_limit()
}
