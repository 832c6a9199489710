//! Before a round's workers start on a GPU node, the agent waits until the
//! previous round's processes no longer hold the node's GPUs: a fast
//! restart must not meet the memory of the processes it replaced (the
//! driver frees it a moment after they die, or later for a process stuck
//! in the driver).
//!
//! A node is a GPU node when `nvidia-smi` is on `PATH` (an executable file;
//! with `PATH` unset, in `/bin` or `/usr/bin`, as `execvp` would run it). Its
//! `--query-compute-apps=pid` list is polled; a listed process counts as
//! the previous round's if it is one of its workers (alive or already
//! gone: an exited worker whose memory the driver has not freed yet) or in
//! one of their process groups (a DataLoader worker). Other processes on
//! the GPUs, and pids from another pid namespace, are not the agent's
//! business. After
//! `--gpu-free-timeout` the workers start anyway, with a warning.

use std::path::PathBuf;
use std::time::Duration;

use tracing::{info, warn};

/// How often the GPUs are polled.
const POLL: Duration = Duration::from_millis(100);

/// How long one `nvidia-smi` call may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The processes in `listed` (`nvidia-smi`'s CSV of pids) that belong to
/// the previous round: one of `prev` (its workers, which led their process
/// groups) or in one of their groups. `pgid_of` is `None` for a pid that
/// no longer exists.
pub(crate) fn held_by_previous(
    listed: &str,
    prev: &[i32],
    pgid_of: impl Fn(i32) -> Option<i32>,
) -> Vec<i32> {
    listed
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter(|pid| *pid > 0)
        .filter(|pid| prev.contains(pid) || pgid_of(*pid).is_some_and(|pgid| prev.contains(&pgid)))
        .collect()
}

/// `nvidia-smi` on `PATH`, if this is a GPU node.
pub(crate) fn nvidia_smi() -> Option<PathBuf> {
    crate::probe::program("nvidia-smi")
}

fn pgid_of(pid: i32) -> Option<i32> {
    nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid)))
        .ok()
        .map(|p| p.as_raw())
}

async fn query(smi: &PathBuf) -> Result<String, String> {
    let run = tokio::process::Command::new(smi)
        .args(["--query-compute-apps=pid", "--format=csv,noheader,nounits"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(QUERY_TIMEOUT, run).await {
        Ok(Ok(out)) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into()),
        Ok(Ok(out)) => Err(format!(
            "nvidia-smi failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(Err(e)) => Err(format!("cannot run nvidia-smi: {e}")),
        Err(_) => Err("nvidia-smi did not answer".into()),
    }
}

/// Waits until the previous round's processes (`prev`, its workers) hold
/// no GPU, for at most `timeout`.
pub(crate) async fn wait_released(prev: &[i32], timeout: Duration) {
    if prev.is_empty() {
        return;
    }
    let Some(smi) = nvidia_smi() else {
        return;
    };
    let started = tokio::time::Instant::now();
    let mut said = false;
    loop {
        let held = match query(&smi).await {
            Ok(listed) => held_by_previous(&listed, prev, pgid_of),
            Err(why) => {
                warn!(%why, "cannot tell whether the last round's processes released the GPUs; starting the workers");
                return;
            }
        };
        if held.is_empty() {
            if said {
                info!(
                    waited_s = format!("{:.2}", started.elapsed().as_secs_f64()),
                    "the GPUs are free; starting the workers"
                );
            }
            return;
        }
        if started.elapsed() >= timeout {
            warn!(pids = ?held, timeout_s = timeout.as_secs_f64(), "the last round's processes still hold GPUs after --gpu-free-timeout; starting the workers anyway");
            return;
        }
        if !said {
            info!(pids = ?held, "waiting for the last round's processes to release the GPUs");
            said = true;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_previous_rounds_processes_count() {
        // 100 and 200 led the last round's groups; 101 is 100's DataLoader
        // worker; 300 is somebody else's; 400 is gone (or another
        // namespace's); 200 has exited but is still listed.
        let pgid = |pid: i32| match pid {
            100 | 101 => Some(100),
            200 => Some(200),
            300 => Some(300),
            _ => None,
        };
        let listed = "100\n101\n300\n400\n200\nnot a pid\n\n";
        let gone_200 = |pid: i32| if pid == 200 { None } else { pgid(pid) };
        assert_eq!(
            held_by_previous(listed, &[100, 200], gone_200),
            [100, 101, 200]
        );
        assert!(held_by_previous("300\n", &[100, 200], pgid).is_empty());
        assert!(held_by_previous("", &[100], pgid).is_empty());
    }
}
