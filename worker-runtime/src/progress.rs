//! Training progress for the agent, as Python's `accel.progress(step)` and
//! `accel.checkpointed(step)` send it: one datagram (`p STEP`, `c STEP`) to
//! the Unix socket named by `ACCEL_PROGRESS_SOCKET`, sent without waiting.
//! A full queue drops it, and outside accel (no such variable) nothing is
//! sent, so reporting never slows or fails a step. The agent sums the
//! reports up for the rendezvous (`--max-no-progress-restarts`).

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

/// Where reports go: the agent's socket, if the process has one.
#[derive(Debug)]
pub struct Progress {
    socket: Option<(UnixDatagram, PathBuf)>,
}

impl Progress {
    /// The reporter of this process: `ACCEL_PROGRESS_SOCKET`'s socket, or
    /// one that sends nothing when the variable is unset (not under accel)
    /// or no socket can be made.
    pub fn from_env() -> Self {
        let socket = std::env::var_os("ACCEL_PROGRESS_SOCKET")
            .filter(|p| !p.is_empty())
            .and_then(|path| {
                let s = UnixDatagram::unbound().ok()?;
                s.set_nonblocking(true).ok()?;
                Some((s, PathBuf::from(path)))
            });
        Self { socket }
    }

    /// Training step `step` is done.
    pub fn step(&self, step: u64) {
        self.send(&format!("p {step}"));
    }

    /// Training step `step` is done, `samples` samples seen so far.
    pub fn step_with_samples(&self, step: u64, samples: u64) {
        self.send(&format!("p {step} {samples}"));
    }

    /// A checkpoint of step `step` is saved.
    pub fn checkpointed(&self, step: u64) {
        self.send(&format!("c {step}"));
    }

    /// Whether reports reach an agent's socket.
    pub fn reporting(&self) -> bool {
        self.socket.is_some()
    }

    fn send(&self, text: &str) {
        if let Some((s, path)) = &self.socket {
            // Best effort: a full queue or a gone agent drops the report.
            let _ = s.send_to(text.as_bytes(), path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_datagrams_on_the_named_socket() {
        let dir = std::env::temp_dir().join(format!("wr-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        let agent = UnixDatagram::bind(&path).expect("bind");
        let p = Progress {
            socket: Some((UnixDatagram::unbound().expect("socket"), path.clone())),
        };
        p.step(7);
        p.step_with_samples(8, 256);
        p.checkpointed(8);
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        for _ in 0..3 {
            let n = agent.recv(&mut buf).expect("recv");
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert_eq!(got, ["p 7", "p 8 256", "c 8"]);
        let silent = Progress { socket: None };
        silent.step(1);
        assert!(!silent.reporting());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
