//! Whether a file changed since it was last read, without reading it.
//!
//! Files a server re-reads while it runs (its tokens, its TLS certificate
//! and key) are looked at, not read, on the hot path: size, modification
//! time and inode. The inode matters because the usual ways to replace a
//! secret (Kubernetes' atomic symlink swap of a mounted Secret, a
//! `mv` of a file written beside it) make a new file whose size and
//! modification time may match the old one's.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::SystemTime;

/// What a file looked like when it was last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl Stamp {
    /// The file at `path` now (links followed, as a reader sees it).
    pub(crate) fn of(path: &Path) -> std::io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Ok(Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        })
    }
}

/// The lock of a file's last look, unless another caller is looking now
/// (`None`): one caller looks at a file at a time, and a file system that
/// hangs holds that caller, never the others.
pub(crate) fn lock_unless_busy<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}
