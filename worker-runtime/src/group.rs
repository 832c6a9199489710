//! The default process group, joined exactly as PyTorch joins it, so Rust
//! and Python ranks of one job are one group.
//!
//! `torch.distributed.init_process_group("gloo")` with `env://` (torch 2.13):
//! a `TCPStore` client at `MASTER_ADDR:MASTER_PORT` (rank 0 hosts the store
//! only when `TORCHELASTIC_USE_AGENT_STORE` is not `"True"`), wrapped as
//! `PrefixStore("cpu/", PrefixStore("0/", PrefixStore("default_pg", store)))`
//! — the default group's prefix, its group name (`"0"`, the first group of
//! the process) and the backend's device — and a `ProcessGroupGloo` with the
//! default device (`GLOO_SOCKET_IFNAME`, else the host name's address).
//! [`ProcessGroup::from_env`] does the same through libtorch's own classes,
//! so every rendezvous key and every gloo message matches. A Rust program
//! must create this group before any other, as a Python program's first
//! `init_process_group` is its default group.
//!
//! Collectives block until done or until the group's timeout (PyTorch's
//! default for gloo is 30 minutes, [`DEFAULT_TIMEOUT`]). They take CPU
//! tensors only: gloo on CUDA tensors would copy through host memory, and
//! NCCL is not implemented yet, so a CUDA tensor is a clear error rather
//! than a slow surprise. Every rank must call the same collectives in the
//! same order, as in PyTorch; a `ProcessGroup` is `Send` but not `Sync`, so
//! one thread at a time issues them.

use std::ffi::CString;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tch::{Device, Tensor};

use crate::env::WorkerEnv;
use crate::error::GroupError;
use crate::ffi::{self, RawGroup};

/// PyTorch's default process-group timeout for gloo (`default_pg_timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How to combine tensors across ranks (`torch.distributed.ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean. torch 2.13's gloo supports it natively (no sum
    /// plus divide here), so Rust ranks get what Python ranks'
    /// `ReduceOp.AVG` gives; gloo rejects it for integer tensors.
    Avg,
    /// Element-wise product.
    Product,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
}

impl ReduceOp {
    /// The shim's code, c10d's `RedOpType` order.
    fn code(self) -> i32 {
        match self {
            Self::Sum => 0,
            Self::Avg => 1,
            Self::Product => 2,
            Self::Min => 3,
            Self::Max => 4,
        }
    }
}

/// Where and how to join a group; [`ProcessGroup::from_env`] fills it from
/// the worker environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOptions {
    /// Store host (`MASTER_ADDR`).
    pub master_addr: String,
    /// Store port (`MASTER_PORT`).
    pub master_port: u16,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Host the store in this process (rank 0 without an agent store).
    pub host_store: bool,
    /// Bound on joining and on every collective.
    pub timeout: Duration,
}

/// A joined c10d process group (gloo backend). At most one lives in a
/// process at a time (see [`ProcessGroup::join`]).
pub struct ProcessGroup {
    raw: NonNull<RawGroup>,
    rank: usize,
    world_size: usize,
    _live: Live,
}

/// Set while a group lives. Its store keys (`default_pg/0/cpu/…`) are those
/// of a process's first group, so two at once would read each other's gloo
/// addresses; PyTorch likewise refuses a second default group.
static LIVE: AtomicBool = AtomicBool::new(false);

/// Holds [`LIVE`] for one group.
struct Live;

impl Live {
    fn claim() -> Option<Self> {
        LIVE.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Self)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE.store(false, Ordering::Release);
    }
}

// SAFETY: the C++ group may be used and destroyed from any thread; what it
// needs is one caller at a time, which `!Sync` gives.
unsafe impl Send for ProcessGroup {}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

impl ProcessGroup {
    /// Joins the job's default group as the worker environment describes.
    pub fn from_env(env: &WorkerEnv, timeout: Duration) -> Result<Self, GroupError> {
        Self::join(&GroupOptions {
            master_addr: env.master_addr.clone(),
            master_port: env.master_port,
            rank: env.rank,
            world_size: env.world_size,
            host_store: env.hosts_store(),
            timeout,
        })
    }

    /// Joins a group. Blocks until every rank has joined or the timeout
    /// passes. Fails while another `ProcessGroup` of this process is alive.
    pub fn join(opts: &GroupOptions) -> Result<Self, GroupError> {
        let invalid = |reason: String| GroupError::InvalidArgument { op: "join", reason };
        let host = CString::new(opts.master_addr.as_str()).map_err(|_| {
            invalid(format!(
                "MASTER_ADDR {:?} contains a NUL byte",
                opts.master_addr
            ))
        })?;
        let rank = i32::try_from(opts.rank)
            .map_err(|_| invalid(format!("rank {} is too large", opts.rank)))?;
        let size = i32::try_from(opts.world_size)
            .map_err(|_| invalid(format!("world size {} is too large", opts.world_size)))?;
        if opts.rank >= opts.world_size {
            return Err(invalid(format!(
                "rank {} is not below the world size {}",
                opts.rank, opts.world_size
            )));
        }
        let timeout_ms = i64::try_from(opts.timeout.as_millis())
            .ok()
            .filter(|ms| *ms > 0)
            .ok_or_else(|| {
                invalid(format!(
                    "timeout {:?} must be between 1 ms and i64::MAX ms",
                    opts.timeout
                ))
            })?;
        let live = Live::claim().ok_or_else(|| {
            invalid(
                "this process already has a live process group; drop it first \
                 (its store keys are the ones a new default group would use)"
                    .to_owned(),
            )
        })?;

        let mut raw: *mut RawGroup = ptr::null_mut();
        let joined = ffi::checked(|err| {
            // SAFETY: `host` outlives the call; `raw` and `err` are valid out-slots.
            unsafe {
                ffi::wr_group_new(
                    host.as_ptr(),
                    opts.master_port,
                    i32::from(opts.host_store),
                    rank,
                    size,
                    timeout_ms,
                    &mut raw,
                    err,
                )
            }
        });
        let join_error = |kind, message| GroupError::Join {
            addr: opts.master_addr.clone(),
            port: opts.master_port,
            rank: opts.rank,
            world_size: opts.world_size,
            timeout: opts.timeout,
            kind,
            message,
        };
        joined.map_err(|f| join_error(f.kind, f.message))?;
        crate::launcher::note_group_created();
        let raw = NonNull::new(raw).ok_or_else(|| {
            join_error(
                crate::error::FailureKind::Unknown,
                "the shim returned no group".to_owned(),
            )
        })?;
        Ok(Self {
            raw,
            rank: opts.rank,
            world_size: opts.world_size,
            _live: live,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Reduces `tensor` across all ranks in place; every rank gets the result.
    pub fn all_reduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), GroupError> {
        const OP: &str = "all_reduce";
        check_tensor(OP, tensor)?;
        let ptr = tensor.as_mut_ptr();
        // SAFETY: `ptr` is a live tensor handle for the duration of the call.
        self.run(OP, |raw, err| unsafe {
            ffi::wr_all_reduce(raw, ptr, op.code(), err)
        })
    }

    /// Copies rank `root`'s `tensor` into every rank's `tensor`.
    pub fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), GroupError> {
        const OP: &str = "broadcast";
        check_tensor(OP, tensor)?;
        let root = self.check_root(OP, root)?;
        let ptr = tensor.as_mut_ptr();
        // SAFETY: as in all_reduce.
        self.run(OP, |raw, err| unsafe {
            ffi::wr_broadcast(raw, ptr, root, err)
        })
    }

    /// Gathers every rank's `tensor` (same shape and dtype on all ranks);
    /// element `i` of the result is rank `i`'s.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, GroupError> {
        const OP: &str = "all_gather";
        check_tensor(OP, tensor)?;
        let outputs = (0..self.world_size)
            .map(|_| tensor.f_empty_like())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| GroupError::Tensor { op: OP, source })?;
        let ptrs: Vec<_> = outputs.iter().map(Tensor::as_ptr).collect();
        let n = self.size_i32();
        let input = tensor.as_ptr();
        // SAFETY: `input` and every output handle outlive the call; `ptrs` holds `n` of them.
        self.run(OP, |raw, err| unsafe {
            ffi::wr_all_gather(raw, input, ptrs.as_ptr(), n, err)
        })?;
        Ok(outputs)
    }

    /// Reduces `inputs[i]` over all ranks into rank `i`'s `output`: one input
    /// per rank, each shaped like `output`.
    pub fn reduce_scatter(
        &self,
        output: &mut Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
    ) -> Result<(), GroupError> {
        const OP: &str = "reduce_scatter";
        check_tensor(OP, output)?;
        if inputs.len() != self.world_size {
            return Err(GroupError::InvalidArgument {
                op: OP,
                reason: format!(
                    "{} inputs given, one per rank is {}",
                    inputs.len(),
                    self.world_size
                ),
            });
        }
        let (size, kind) = (
            output.size(),
            output
                .f_kind()
                .map_err(|source| GroupError::Tensor { op: OP, source })?,
        );
        for (i, input) in inputs.iter().enumerate() {
            check_tensor(OP, input)?;
            let input_kind = input
                .f_kind()
                .map_err(|source| GroupError::Tensor { op: OP, source })?;
            if input.size() != size || input_kind != kind {
                return Err(GroupError::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "input {i} is {input_kind:?}{:?}, the output is {kind:?}{size:?}; they must match",
                        input.size()
                    ),
                });
            }
        }
        let ptrs: Vec<_> = inputs.iter().map(Tensor::as_ptr).collect();
        let n = self.size_i32();
        let out = output.as_mut_ptr();
        // SAFETY: `out` and every input handle outlive the call; `ptrs` holds `n` of them.
        self.run(OP, |raw, err| unsafe {
            ffi::wr_reduce_scatter(raw, out, ptrs.as_ptr(), n, op.code(), err)
        })
    }

    /// Blocks until every rank has reached the barrier.
    pub fn barrier(&self) -> Result<(), GroupError> {
        // SAFETY: only the group handle is passed.
        self.run("barrier", |raw, err| unsafe { ffi::wr_barrier(raw, err) })
    }

    fn run(
        &self,
        op: &'static str,
        f: impl FnOnce(*mut RawGroup, *mut *mut std::ffi::c_char) -> i32,
    ) -> Result<(), GroupError> {
        ffi::checked(|err| f(self.raw.as_ptr(), err)).map_err(|e| GroupError::Collective {
            op,
            rank: self.rank,
            kind: e.kind,
            message: e.message,
        })
    }

    fn check_root(&self, op: &'static str, root: usize) -> Result<i32, GroupError> {
        i32::try_from(root)
            .ok()
            .filter(|_| root < self.world_size)
            .ok_or_else(|| GroupError::InvalidArgument {
                op,
                reason: format!(
                    "root {root} is not a rank of this group of {}",
                    self.world_size
                ),
            })
    }

    fn size_i32(&self) -> i32 {
        // Checked in `join`.
        i32::try_from(self.world_size).unwrap_or(i32::MAX)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: `raw` came from wr_group_new and is freed exactly once.
        unsafe { ffi::wr_group_free(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests;

/// Rejects what gloo cannot take, with a message that says what to do.
fn check_tensor(op: &'static str, tensor: &Tensor) -> Result<(), GroupError> {
    if !tensor.defined() {
        return Err(GroupError::InvalidArgument {
            op,
            reason: "the tensor is undefined".to_owned(),
        });
    }
    let device = tensor.device();
    if device != Device::Cpu {
        return Err(GroupError::UnsupportedDevice { op, device });
    }
    if !tensor.is_contiguous() {
        return Err(GroupError::InvalidArgument {
            op,
            reason: "the tensor is not contiguous; pass `tensor.contiguous()` \
                     (and copy the result back if it must land in place)"
                .to_owned(),
        });
    }
    Ok(())
}
