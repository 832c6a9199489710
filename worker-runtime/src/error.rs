//! Errors of the process group.
//!
//! c10d reports failures as C++ exceptions; the shim catches every one and
//! hands back its class (as [`FailureKind`]) and message, so a dead peer or a
//! store timeout is an `Err` the program can log, write to
//! `TORCHELASTIC_ERROR_FILE` and exit on — never an abort.

use std::fmt;
use std::time::Duration;

/// Which part of c10d failed, from the C++ exception's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// `c10::DistStoreError`: the TCPStore (unreachable, key wait timed out).
    Store,
    /// `c10::DistNetworkError` or `gloo::IoException`: a connection between
    /// ranks (a peer crashed or stopped answering).
    Network,
    /// `c10::DistBackendError` or another `gloo::Exception`: gloo itself.
    Backend,
    /// Any other `c10::Error`: bad arguments, `Work::wait` timing out.
    Torch,
    /// A C++ standard exception (`std::runtime_error`, `std::bad_alloc`, …).
    Cpp,
    /// Something thrown that is not an exception class.
    Unknown,
}

impl FailureKind {
    pub(crate) fn from_status(status: i32) -> Self {
        match status {
            1 => Self::Store,
            2 => Self::Network,
            3 => Self::Backend,
            4 => Self::Torch,
            5 => Self::Cpp,
            _ => Self::Unknown,
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Store => "store error",
            Self::Network => "network error",
            Self::Backend => "gloo error",
            Self::Torch => "torch error",
            Self::Cpp => "C++ error",
            Self::Unknown => "unknown C++ exception",
        })
    }
}

/// A failed process-group operation.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// Joining failed: the store was unreachable, or gloo could not connect
    /// every pair of ranks within the timeout.
    #[error(
        "rank {rank} of {world_size} could not join the process group at \
         {addr}:{port} within {timeout:?} ({kind}): {message}"
    )]
    Join {
        /// Store host.
        addr: String,
        /// Store port.
        port: u16,
        /// This rank.
        rank: usize,
        /// Group size.
        world_size: usize,
        /// The timeout it had.
        timeout: Duration,
        /// Which part failed.
        kind: FailureKind,
        /// c10d's message.
        message: String,
    },
    /// A collective failed (a peer died or timed out, or c10d rejected the
    /// arguments). The group should be considered broken afterwards, as in
    /// PyTorch: ranks may disagree about which collectives completed.
    #[error("{op} failed on rank {rank} ({kind}): {message}")]
    Collective {
        /// The collective (`all_reduce`, …).
        op: &'static str,
        /// This rank.
        rank: usize,
        /// Which part failed.
        kind: FailureKind,
        /// c10d's message.
        message: String,
    },
    /// The tensor is not on the CPU.
    #[error(
        "{op}: the tensor is on {device:?}, but this process group is gloo on \
         CPU only (NCCL is not implemented yet); move it with \
         `.to_device(tch::Device::Cpu)`"
    )]
    UnsupportedDevice {
        /// The collective.
        op: &'static str,
        /// Where the tensor lives.
        device: tch::Device,
    },
    /// The arguments cannot be used (caught before reaching c10d).
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The collective.
        op: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A tch call on the arguments failed (e.g. allocating outputs).
    #[error("{op}: {source}")]
    Tensor {
        /// The collective.
        op: &'static str,
        /// tch's error.
        source: tch::TchError,
    },
}
