//! Node health (`--health-check CMD`): a command the agent runs before its
//! node offers itself for a round, so a node with a broken GPU or NIC does
//! not join every round only to fail it.
//!
//! The command runs with `sh -c`, the agent's environment (without the
//! rendezvous token) and no stdin; it
//! passes by exiting 0 within `--health-check-timeout`. It runs in its own
//! process group, which is killed when the check is over (or cancelled by
//! a signal), so nothing it started outlives it. A node that fails
//! it before joining waits as a spare, re-checking with a doubling wait
//! ([`RECHECK_FIRST`] to [`RECHECK_MAX`]); a node that fails it between
//! rounds leaves the job first, so an elastic (`MIN:MAX`) job re-forms
//! without it, and joins again once the check passes.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// How long a check may run unless `--health-check-timeout` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The first wait before checking an unhealthy node again.
pub const RECHECK_FIRST: Duration = Duration::from_secs(1);

/// The longest wait between checks.
pub const RECHECK_MAX: Duration = Duration::from_secs(30);

/// How long the output is still read after the check exited.
const OUTPUT_AFTER_EXIT: Duration = Duration::from_secs(1);

/// How much of the command's output a failure quotes.
const OUTPUT_TAIL: usize = 2000;

/// The check a node passes before each round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The shell command.
    pub command: String,
    /// How long it may run.
    pub timeout: Duration,
}

impl HealthCheck {
    /// Runs the check once: `Err` says why the node is unhealthy.
    pub async fn run(&self) -> Result<(), String> {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        // The rendezvous token is the agent's, not the check's.
        for secret in crate::supervisor::SECRET_VARIABLES {
            cmd.env_remove(secret);
        }
        let mut child = cmd
            .arg("-c")
            .arg(&self.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run the health check: {e}"))?;
        // The check and whatever it started go when the check is over, or
        // when a signal drops it half-way.
        let _group = child.id().map(|p| KillGroup(p as i32));
        // Both streams at once (a check that fills one pipe while the other
        // is read would block); past the cap the output is read and dropped.
        let (out, err) = (child.stdout.take(), child.stderr.take());
        // Read into buffers that outlive the reads: a read given up on
        // keeps what it had.
        let (mut text, mut more) = (Vec::new(), Vec::new());
        let collect = async {
            let drains = async { tokio::join!(drain(out, &mut text), drain(err, &mut more)) };
            tokio::pin!(drains);
            let mut drained = false;
            let status = tokio::select! {
                status = child.wait() => status,
                _ = &mut drains => {
                    drained = true;
                    child.wait().await
                }
            };
            // A background process of a finished check may hold the pipes.
            if !drained {
                let _ = tokio::time::timeout(OUTPUT_AFTER_EXIT, drains).await;
            }
            status
        };
        let status = tokio::time::timeout(self.timeout, collect).await;
        text.extend_from_slice(&more);
        match status {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(format!(
                "the health check {}{}",
                crate::Ended::from(status),
                tail(&text)
            )),
            Ok(Err(e)) => Err(format!("cannot wait for the health check: {e}")),
            Err(_) => Err(format!(
                "the health check did not finish within {:.0} s (--health-check-timeout)",
                self.timeout.as_secs_f64()
            )),
        }
    }
}

/// Kills a process group when dropped.
struct KillGroup(i32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        crate::sys::killpg(self.0, nix::sys::signal::Signal::SIGKILL);
    }
}

/// Reads a pipe to its end into `kept`, keeping the first 64 KiB.
async fn drain(pipe: Option<impl tokio::io::AsyncRead + Unpin>, kept: &mut Vec<u8>) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = (64 * 1024usize).saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// `: <last output>` of a failed check, if it printed anything.
fn tail(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let start = text
        .char_indices()
        .rev()
        .nth(OUTPUT_TAIL)
        .map_or(0, |(i, _)| i);
    format!(": {}", text[start..].replace('\n', " | "))
}

/// The wait before check number `failed + 1` after `failed` failures.
pub fn recheck_after(failed: u32) -> Duration {
    RECHECK_FIRST
        .saturating_mul(1u32 << failed.saturating_sub(1).min(16))
        .min(RECHECK_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cmd: &str, timeout: Duration) -> HealthCheck {
        HealthCheck {
            command: cmd.into(),
            timeout,
        }
    }

    #[tokio::test]
    async fn exit_zero_passes_anything_else_says_why() {
        let long = Duration::from_secs(10);
        assert_eq!(check("true", long).run().await, Ok(()));
        let e = check("echo GPU 3 has fallen off the bus >&2; exit 4", long)
            .run()
            .await
            .expect_err("unhealthy");
        assert!(
            e.contains("exited with code 4") && e.contains("GPU 3 has fallen off the bus"),
            "{e}"
        );
        let e = check("sleep 30", Duration::from_millis(200))
            .run()
            .await
            .expect_err("too slow");
        assert!(e.contains("did not finish within"), "{e}");
    }

    #[tokio::test]
    async fn a_passing_check_that_leaves_a_process_behind_passes_and_takes_it_along() {
        let dir = tempfile::tempdir().expect("dir");
        let pid_file = dir.path().join("pid");
        let cmd = format!("sleep 300 & echo $! > {}; echo started", pid_file.display());
        let t = std::time::Instant::now();
        assert_eq!(check(&cmd, Duration::from_secs(20)).run().await, Ok(()));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("pid")
            .trim()
            .parse()
            .expect("a pid");
        // Gone (or a zombie of this test process's reaper, never running).
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!alive(), "the check's background process was killed");
    }

    #[tokio::test]
    async fn a_failing_check_that_leaves_a_process_behind_still_says_why() {
        let e = check(
            "sleep 300 & echo the NIC is down; exit 3",
            Duration::from_secs(20),
        )
        .run()
        .await
        .expect_err("unhealthy");
        assert!(
            e.contains("exited with code 3") && e.contains("the NIC is down"),
            "{e}"
        );
    }

    #[test]
    fn rechecks_back_off_to_a_bound() {
        assert_eq!(recheck_after(1), Duration::from_secs(1));
        assert_eq!(recheck_after(2), Duration::from_secs(2));
        assert_eq!(recheck_after(3), Duration::from_secs(4));
        assert_eq!(recheck_after(100), RECHECK_MAX);
    }
}
