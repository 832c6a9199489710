//! Hang detection for Rust ranks: the client side of torchrun's `FileTimer`
//! protocol, which `accel-agent` (and torchrun) serve when
//! `TORCHELASTIC_ENABLE_FILE_TIMER=1`. The counterpart of
//! `torch.distributed.elastic.timer.expires(after=...)` with a
//! `FileTimerClient`: arm a timer around a step; if the step does not end
//! in time, the agent records the rank's stacks and stops it, and the job
//! restarts.
//!
//! ```no_run
//! use std::time::Duration;
//! # fn step() {}
//! if let Some(timer) = worker_runtime::FileTimer::from_env() {
//!     let _armed = timer.expires("train_step", Duration::from_secs(60))?;
//!     step();
//! } // released when `_armed` drops
//! # Ok::<(), worker_runtime::TimerError>(())
//! ```
//!
//! Each request is one JSON line, written to the named pipe in one `write`
//! no longer than `PIPE_BUF` so requests of several ranks never interleave;
//! the pipe is opened non-blocking, so a missing server is an error, not a
//! hang.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest request (POSIX `PIPE_BUF` on Linux).
const PIPE_BUF: usize = 4096;

/// A request could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum TimerError {
    /// The pipe is not there or nobody reads it (no agent serves timers).
    #[error("cannot reach the FileTimer server at {path}: {source}; is TORCHELASTIC_ENABLE_FILE_TIMER=1 set for the agent?")]
    Unreachable {
        /// The pipe.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The scope makes a request longer than `PIPE_BUF`.
    #[error("a FileTimer request for scope '{0}…' is over {PIPE_BUF} bytes; use a shorter scope")]
    TooLong(String),
}

/// The agent's timer server, at `TORCHELASTIC_TIMER_FILE`.
#[derive(Debug, Clone)]
pub struct FileTimer {
    path: PathBuf,
    signal: i32,
}

impl FileTimer {
    /// The server the launcher named in `TORCHELASTIC_TIMER_FILE`, if any.
    pub fn from_env() -> Option<Self> {
        std::env::var_os("TORCHELASTIC_TIMER_FILE")
            .filter(|p| !p.is_empty())
            .map(|p| Self::new(PathBuf::from(p)))
    }

    /// The server at `path`; expired timers are answered with SIGKILL, as
    /// torch's client does by default.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            signal: 9,
        }
    }

    /// The signal the agent sends when a timer expires (≤ 0: none).
    pub fn with_signal(mut self, signal: i32) -> Self {
        self.signal = signal;
        self
    }

    /// The pipe.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Arms timer `scope` to expire `after` from now; it is released when
    /// the returned guard drops.
    pub fn expires(&self, scope: &str, after: Duration) -> Result<Armed<'_>, TimerError> {
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
            + after.as_secs_f64();
        self.send(scope, at, self.signal)?;
        Ok(Armed {
            timer: self,
            scope: scope.to_owned(),
        })
    }

    /// Releases timer `scope`.
    pub fn release(&self, scope: &str) -> Result<(), TimerError> {
        self.send(scope, -1.0, 0)
    }

    fn send(&self, scope: &str, expiration_time: f64, signal: i32) -> Result<(), TimerError> {
        let mut line = serde_json::json!({
            "version": 1,
            "pid": std::process::id(),
            "scope_id": scope,
            "expiration_time": expiration_time,
            "signal": signal,
        })
        .to_string();
        line.push('\n');
        if line.len() > PIPE_BUF {
            return Err(TimerError::TooLong(scope.chars().take(40).collect()));
        }
        let unreachable = |source| TimerError::Unreachable {
            path: self.path.clone(),
            source,
        };
        let mut pipe = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&self.path)
            .map_err(unreachable)?;
        pipe.write_all(line.as_bytes()).map_err(unreachable)
    }
}

/// An armed timer; dropping it releases the timer.
#[derive(Debug)]
pub struct Armed<'a> {
    timer: &'a FileTimer,
    scope: String,
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        // A server gone by now cannot act on the timer either.
        let _ = self.timer.release(&self.scope);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    #[test]
    fn requests_are_what_the_agents_server_reads() {
        let dir = std::env::temp_dir().join(format!("wr-timer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("pipe");
        let _ = std::fs::remove_file(&path);
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let timer = FileTimer::new(&path);
        // Nobody reads: an error naming the path, not a hang.
        let e = timer.release("x").expect_err("no reader");
        assert!(e.to_string().contains("pipe"), "{e}");
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("reader");
        {
            let _armed = timer
                .expires("train_step", Duration::from_secs(30))
                .expect("armed");
        }
        let mut lines = BufReader::new(reader).lines();
        let armed =
            accel_agent::file_timer::parse(lines.next().expect("line").expect("read").as_bytes())
                .expect("the agent parses it");
        assert_eq!(armed.pid, std::process::id() as i32);
        assert_eq!(armed.scope, "train_step");
        assert_eq!(armed.signal, 9);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        assert!((armed.expires - now - 30.0).abs() < 5.0);
        let released =
            accel_agent::file_timer::parse(lines.next().expect("line").expect("read").as_bytes())
                .expect("parses");
        assert!(released.expires < 0.0, "dropping the guard releases");
        assert!(matches!(
            timer.expires(&"s".repeat(5000), Duration::ZERO),
            Err(TimerError::TooLong(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
