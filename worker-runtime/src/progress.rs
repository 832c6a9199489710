//! Training progress for the agent, as Python's `accel.progress(step)` and
//! `accel.checkpointed(step)` send it: one datagram (`p STEP`, `c STEP`) to
//! the Unix socket named by `ACCEL_PROGRESS_SOCKET`, sent without waiting.
//! A full queue drops it, and outside accel (no such variable) nothing is
//! sent, so reporting never slows or fails a step. The agent sums the
//! reports up for the rendezvous (`--max-no-progress-restarts`).

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Step reports closer together than this are folded into the next one
/// (as Python's `accel.progress`): at most 100 a second whatever the step
/// rate, as a system call in the middle of a step costs it more than the
/// call. A checkpoint report is sent at once, after the step held back; a
/// held step is sent on [`Progress::flush`] and on drop.
pub const GAP: Duration = Duration::from_millis(10);

/// Where reports go: the agent's socket, if the process has one.
#[derive(Debug)]
pub struct Progress {
    socket: Option<(UnixDatagram, PathBuf)>,
    /// When a step report was last sent, and one held back since.
    steps: Mutex<(Option<Instant>, Option<String>)>,
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
        Self {
            socket,
            steps: Mutex::default(),
        }
    }

    /// Training step `step` is done.
    pub fn step(&self, step: u64) {
        self.step_report(format!("p {step}"));
    }

    /// Training step `step` is done, `samples` samples seen so far.
    pub fn step_with_samples(&self, step: u64, samples: u64) {
        self.step_report(format!("p {step} {samples}"));
    }

    /// Training step `step` is done, `own` of it this rank's own work
    /// (before it waited for the others): where ranks wait for each other
    /// every step, the rendezvous tells a straggler by this.
    pub fn step_with_compute(&self, step: u64, own: std::time::Duration) {
        let us = u64::try_from(own.as_micros()).unwrap_or(u64::MAX);
        self.step_report(format!("p {step} w={us}"));
    }

    /// A checkpoint of step `step` is saved (after the step held back, if
    /// one is).
    pub fn checkpointed(&self, step: u64) {
        self.flush();
        self.send(&format!("c {step}"));
    }

    /// Sends the step report held back, if one is (also done on drop).
    pub fn flush(&self) {
        let held = self.lock().1.take();
        if let Some(text) = held {
            self.send(&text);
        }
    }

    fn step_report(&self, text: String) {
        if self.socket.is_none() {
            return;
        }
        let now = Instant::now();
        let mut steps = self.lock();
        if steps.0.is_some_and(|last| now.duration_since(last) < GAP) {
            steps.1 = Some(text);
            return;
        }
        *steps = (Some(now), None);
        drop(steps);
        self.send(&text);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<Instant>, Option<String>)> {
        self.steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

impl Drop for Progress {
    fn drop(&mut self) {
        self.flush();
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
            steps: Mutex::default(),
        };
        p.step(7);
        p.step_with_samples(8, 256);
        p.checkpointed(8);
        std::thread::sleep(std::time::Duration::from_millis(20));
        p.step_with_compute(9, std::time::Duration::from_micros(12_300));
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        for _ in 0..4 {
            let n = agent.recv(&mut buf).expect("recv");
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert_eq!(got, ["p 7", "p 8 256", "c 8", "p 9 w=12300"]);
        // A thousand steps at once: the first is sent, the rest folded
        // into the last, which is sent when the reporter goes.
        for step in 10..1010 {
            p.step(step);
        }
        drop(p);
        agent.set_nonblocking(true).expect("nonblocking");
        let mut folded = Vec::new();
        while let Ok(n) = agent.recv(&mut buf) {
            folded.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        // One per 10 ms at most (a slow machine may take a few).
        assert!(folded.len() < 20, "{folded:?}");
        assert_eq!(
            folded.last().map(String::as_str),
            Some("p 1009"),
            "the last, sent on drop"
        );
        let silent = Progress {
            socket: None,
            steps: Mutex::default(),
        };
        silent.step(1);
        assert!(!silent.reporting());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
