//! `--health-check-storage PATH`: the filesystem the job checkpoints to
//! takes a write.
//!
//! A full, read-only, or hung filesystem (an NFS server gone, a FUSE mount
//! whose daemon died) fails the job at its next checkpoint, after hours of
//! training are lost. The check writes [`PROBE_BYTES`] to a new file in
//! `PATH` (`.accel-health-HOST-PID-RANDOM`, created exclusively, never
//! following a link), `fsync`s it, reads it back through the same
//! descriptor, compares, and deletes it. Any error names the path and the
//! step that failed. The read-back proves the write path (a filesystem that
//! takes writes and returns them), not the media under a cache.
//!
//! The file system calls run on a blocking thread, which a hung mount can
//! hold for ever: the check's timeout ends the wait, not the thread. While
//! that thread is still stuck the next check does not start another one (at
//! most one per path at a time) and fails at once, saying how long the
//! last has been blocked: a hung mount keeps failing without piling up
//! threads.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// How much each check writes: enough to need a block of its own, little
/// enough to run every few seconds on a shared checkpoint filesystem.
pub const PROBE_BYTES: usize = 64 << 10;

/// Paths whose last check is still blocked, and since when.
fn blocked() -> &'static Mutex<Vec<(PathBuf, Instant)>> {
    static BLOCKED: OnceLock<Mutex<Vec<(PathBuf, Instant)>>> = OnceLock::new();
    BLOCKED.get_or_init(Mutex::default)
}

/// Checks `dir` (the caller bounds the wait).
pub async fn check(dir: PathBuf) -> Result<(), String> {
    {
        let mut b = blocked().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, since)) = b.iter().find(|(p, _)| *p == dir) {
            return Err(format!(
                "storage {}: the last check is still blocked after {:.0} s (a hung or very slow filesystem)",
                dir.display(),
                since.elapsed().as_secs_f64()
            ));
        }
        b.push((dir.clone(), Instant::now()));
    }
    // Unmarked when the thread is done, whether or not anyone still waits.
    let done = Unblock(dir.clone());
    let joined = tokio::task::spawn_blocking(move || {
        let r = round_trip(&done.0);
        drop(done);
        r
    })
    .await;
    match joined {
        Ok(r) => r.map_err(|e| format!("storage {}: {e}", dir.display())),
        Err(e) => Err(format!("storage {}: the check failed: {e}", dir.display())),
    }
}

/// Removes its path from the blocked list when dropped.
struct Unblock(PathBuf);

impl Drop for Unblock {
    fn drop(&mut self) {
        let mut b = blocked().lock().unwrap_or_else(|e| e.into_inner());
        b.retain(|(p, _)| *p != self.0);
    }
}

/// Write, fsync, read back, compare, delete, all through one descriptor.
fn round_trip(dir: &Path) -> Result<(), String> {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
        .replace(['/', '\0'], "_");
    // Random: agents of one host name and pid (containers, pid 1) may share
    // the filesystem.
    let path = dir.join(format!(
        ".accel-health-{host}-{}-{:016x}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let data: Vec<u8> = (0..PROBE_BYTES)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot create a test file: {e}"))?;
    // Ours from here: removed on any early return.
    let removed = RemoveOnDrop(path);
    f.write_all(&data)
        .map_err(|e| format!("cannot write {} KiB: {e}", PROBE_BYTES / 1024))?;
    f.sync_all().map_err(|e| format!("cannot fsync: {e}"))?;
    let mut back = Vec::with_capacity(PROBE_BYTES);
    f.seek(SeekFrom::Start(0))
        .and_then(|_| (&mut f).take(PROBE_BYTES as u64 + 1).read_to_end(&mut back))
        .map_err(|e| format!("cannot read the test file back: {e}"))?;
    if back != data {
        return Err(format!(
            "the test file read back differs from what was written ({} of {} bytes)",
            back.len(),
            data.len()
        ));
    }
    drop(f);
    std::fs::remove_file(&removed.0).map_err(|e| format!("cannot delete the test file: {e}"))?;
    std::mem::forget(removed);
    Ok(())
}

/// Deletes a half-written test file on an early return.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether a check of `dir` is blocked now.
#[cfg(test)]
fn is_blocked(dir: &Path) -> bool {
    blocked()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|(p, _)| p == dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_writable_directory_passes_and_keeps_nothing() {
        let d = tempfile::tempdir().expect("dir");
        assert_eq!(check(d.path().into()).await, Ok(()));
        assert_eq!(std::fs::read_dir(d.path()).expect("list").count(), 0);
        assert!(!is_blocked(d.path()));
    }

    #[tokio::test]
    async fn a_missing_or_unwritable_path_is_named() {
        let d = tempfile::tempdir().expect("dir");
        let missing = d.path().join("gone");
        let e = check(missing.clone()).await.expect_err("missing");
        assert!(
            e.starts_with(&format!(
                "storage {}: cannot create a test file",
                missing.display()
            )),
            "{e}"
        );
        // procfs takes no new file.
        let e = check("/proc/self".into()).await.expect_err("procfs");
        assert!(e.contains("storage /proc/self:"), "{e}");
    }
}
