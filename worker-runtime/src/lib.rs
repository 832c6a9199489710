//! Runtime for Rust training workers built on `tch` (libtorch): they start
//! under `accel-agent` (or `torchrun`) like any PyTorch script and join the
//! **same** c10d process group as Python ranks of the job.
//!
//! Why a runtime and not just `tch`: tch binds tensors and autograd but not
//! `torch.distributed`. A Rust rank needs three things a Python rank gets
//! from `torch.distributed`:
//!
//! 1. the launcher's environment contract, read and validated once
//!    ([`env`](mod@env): `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, …, with errors that
//!    name the variable and the fix);
//! 2. the rendezvous PyTorch's default group performs — the same store
//!    client, the same key prefixes, the same gloo setup — so a mixed job's
//!    ranks find each other ([`group`]);
//! 3. collectives on tensors (`all_reduce`, `broadcast`, `all_gather`,
//!    `reduce_scatter`, `barrier`) that fail with a typed error instead of
//!    aborting the process.
//!
//! The process group is libtorch's own `TCPStore`, `PrefixStore` and
//! `ProcessGroupGloo`, reached through a small C++ shim
//! (`csrc/c10d_shim.cpp`) compiled against the libtorch `tch` links. Using
//! libtorch's classes rather than re-implementing gloo's wire protocol is
//! what makes Rust and Python ranks interoperate by construction.
//!
//! ```no_run
//! use worker_runtime::{ProcessGroup, ReduceOp, WorkerEnv, DEFAULT_TIMEOUT};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = WorkerEnv::from_process()?;
//! let group = ProcessGroup::from_env(&env, DEFAULT_TIMEOUT)?;
//! let mut grad = tch::Tensor::from_slice(&[1.0f32, 2.0]);
//! group.all_reduce(&mut grad, ReduceOp::Avg)?;
//! # Ok(())
//! # }
//! ```
//!
//! A rank reports training progress to the agent as Python's
//! `accel.progress(step)` does with [`Progress`] (`Progress::from_env()`,
//! then `step(n)` and `checkpointed(n)`), for `--max-no-progress-restarts`.
//!
//! A program can also start its own ranks: [`Launcher`] runs a function in
//! N processes of the current binary through accel's agent code (the
//! counterpart of accelerate's `notebook_launcher`; [`debug_launch`] is its
//! `debug_launcher`).
//!
//! Building: `tch` needs libtorch 2.13 (`LIBTORCH_USE_PYTORCH=1` with the
//! pinned venv's `python3` first on `PATH`), and the shim needs gloo's
//! headers (`libgloo-dev`). This crate's own tests and examples carry an
//! rpath to libtorch; a dependent binary gets the directory as
//! `DEP_WORKER_RUNTIME_LIBTORCH_LIB` in its build script, for
//! `cargo:rustc-link-arg=-Wl,-rpath,<dir>`.

pub mod env;
mod error;
pub mod error_file;
mod ffi;
pub mod group;
pub mod launcher;
pub mod progress;
pub mod timer;

pub use env::{EnvError, Topology, WorkerEnv};
pub use error::{FailureKind, GroupError};
pub use error_file::record_error;
pub use group::{GroupOptions, ProcessGroup, ReduceOp, DEFAULT_TIMEOUT};
pub use launcher::{debug_launch, LaunchError, Launcher};
pub use progress::Progress;
pub use timer::{FileTimer, TimerError};
