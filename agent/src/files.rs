//! Per-job and per-attempt worker files, in torchrun's layout:
//! `<log_dir>/<run_id>_<random>/attempt_<N>/<local_rank>/error.json`, where
//! `<log_dir>` defaults to a new `torchelastic_*` directory under the system
//! temporary directory and `N` is the job-wide restart count (see
//! [`attempt_dir`] for rounds that share one).

use std::path::{Path, PathBuf};

use crate::error::AgentError;

/// Creates this agent's run directory under `log_dir` (or a new temporary one).
pub fn run_dir(log_dir: Option<&Path>, run_id: &str) -> Result<PathBuf, AgentError> {
    let base = match log_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| {
                AgentError::io(format!("cannot create --log-dir {}", d.display()), e)
            })?;
            d.to_path_buf()
        }
        None => fresh_dir(&std::env::temp_dir(), "torchelastic_")?,
    };
    let safe: String = run_id
        .chars()
        .map(|c| if c == '/' { '_' } else { c })
        .collect();
    fresh_dir(&base, &format!("{safe}_"))
}

/// A new directory for one round's worker files: `attempt_<N>` for the first
/// round with restart count N, then `attempt_<N>.1`, `attempt_<N>.2`, … for
/// rounds that re-formed without a counted restart (membership changes).
/// An existing attempt directory is never reused, emptied or deleted.
pub fn attempt_dir(run_dir: &Path, attempt: u32) -> Result<PathBuf, AgentError> {
    let names = (0u32..).map(|k| match k {
        0 => format!("attempt_{attempt}"),
        k => format!("attempt_{attempt}.{k}"),
    });
    create_first_free(run_dir, names)
}

/// The directory of `local_rank` in an attempt, created.
pub fn rank_dir(attempt_dir: &Path, local_rank: u32) -> Result<PathBuf, AgentError> {
    let dir = attempt_dir.join(local_rank.to_string());
    std::fs::create_dir_all(&dir)
        .map_err(|e| AgentError::io(format!("cannot create {}", dir.display()), e))?;
    Ok(dir)
}

/// A new directory `<parent>/<prefix><random>` that did not exist before
/// (created as Python's `tempfile.mkdtemp` creates torchrun's: mode 0700, a
/// name nobody else holds). It is kept: the worker files outlive the agent.
fn fresh_dir(parent: &Path, prefix: &str) -> Result<PathBuf, AgentError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .rand_bytes(8)
        .tempdir_in(parent)
        .map(tempfile::TempDir::keep)
        .map_err(|e| {
            AgentError::io(
                format!(
                    "cannot create a directory {prefix}* in {}",
                    parent.display()
                ),
                e,
            )
        })
}

/// Creates the first of `names` under `parent` that does not exist yet.
fn create_first_free(
    parent: &Path,
    names: impl Iterator<Item = String>,
) -> Result<PathBuf, AgentError> {
    for name in names {
        let dir = parent.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(AgentError::io(
                    format!("cannot create {}", dir.display()),
                    e,
                ))
            }
        }
    }
    Err(AgentError::io(
        format!("cannot create a fresh directory in {}", parent.display()),
        std::io::Error::from(std::io::ErrorKind::AlreadyExists),
    ))
}
