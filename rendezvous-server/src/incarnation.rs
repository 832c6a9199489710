//! Whether this `rdzv-server` follows an earlier one that may have left
//! workers running: a marker file in the server's state directory.
//!
//! A server without a job store forgets every job when it stops. Nodes of a
//! job that ran on it keep their workers while they reconnect (as long as
//! their round hears each other, up to `outage_timeout`), and relearn the job
//! into the new server when they reach it. But a node that joins *afresh*
//! (a restarted agent, a spare) could make the new server form the job
//! anew, and give ranks that earlier workers still hold to others. So a
//! server that follows an earlier one forms no round of a job it creates
//! afresh for one drop limit from its start (`Registry::holding_fresh_jobs`):
//! the earlier nodes that can reach it are back by then.
//!
//! The server cannot tell a first start from a restart by itself. The marker
//! `running-PORT` in its state directory tells it: written when a server on
//! that port starts, and left there, so every later start on the port is a
//! restart and holds (killed, crashed or stopped, the server may have left
//! jobs running; the hold costs a job that joins in that while at most one
//! drop limit). Without a state directory (`--state-dir`, or systemd's
//! `StateDirectory=`) nothing is known and nothing is held.

use std::io;
use std::path::{Path, PathBuf};

/// The marker of one server's life.
#[derive(Debug)]
pub struct Marker {
    path: PathBuf,
}

impl Marker {
    /// Checks that `dir` can be the state directory (created if missing):
    /// a directory only this user may write, since whoever deletes the
    /// marker makes a restart look like a first start. A configuration
    /// error, for the operator to fix.
    pub fn usable(dir: &Path) -> io::Result<()> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            let mode = std::fs::metadata(dir)?.permissions().mode();
            if mode & 0o022 != 0 {
                return Err(io::Error::other(format!(
                    "{} is writable by other users (mode {:o}): give rdzv-server a state directory only it writes",
                    dir.display(),
                    mode & 0o777
                )));
            }
        }
        #[cfg(not(unix))]
        std::fs::create_dir_all(dir)?;
        Ok(())
    }

    /// Takes the marker of a server on `port` in `dir` ([`Marker::usable`]):
    /// the marker, and whether an earlier server left one. An error writing
    /// it (a full or read-only disk) is the caller's to weigh.
    pub fn take(dir: &Path, port: u16) -> io::Result<(Self, bool)> {
        Self::usable(dir)?;
        let path = dir.join(format!("running-{port}"));
        let earlier = path.try_exists()?;
        let tmp = dir.join(format!(".running-{port}.{}", std::process::id()));
        std::fs::write(&tmp, format!("pid={}\n", std::process::id()))?;
        std::fs::rename(&tmp, &path)?;
        Ok((Self { path }, earlier))
    }

    /// Where the marker is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_left_behind_says_a_server_came_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let (first, earlier) = Marker::take(&state, 29400).expect("take");
        assert!(!earlier, "a first start");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&state)
                .expect("state dir")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "created for this user alone");
        }
        assert!(first.path().ends_with("running-29400"));
        // Killed, crashed or stopped: the marker stays.
        drop(first);
        let (_, earlier) = Marker::take(&state, 29400).expect("take");
        assert!(earlier, "a restart");
        // Another port is another server.
        let (_, other) = Marker::take(&state, 29401).expect("take");
        assert!(!other);
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let e = Marker::take(dir.path(), 1).expect_err("refused");
        assert!(e.to_string().contains("writable by other users"), "{e}");
    }
}
