//! `--health-check CMD`: the user's own check, a shell command.
//!
//! The command runs with `sh -c`, the agent's environment (without the
//! rendezvous token) and no stdin; it passes by exiting 0 within
//! `--health-check-timeout`. It runs under a *keeper*
//! (`accel_process::sys::keeper`): a process of the agent's that leads a
//! session and a process group of its own and is a child subreaper, so
//! every process the check starts stays below it, even one that leaves the
//! group or the session (`setsid`). When the check is over (it exited,
//! timed out, or a signal cancelled it: the keeper gets SIGTERM) and when
//! the agent dies, however it dies (`kill -9` included: the keeper's
//! parent-death signal), the keeper kills all of them, so nothing the
//! check started outlives it. As a second net, a process still holding the
//! check's output is found by its pipe and killed too; the output is read
//! for at most `OUTPUT_AFTER_EXIT` after the check exits, so such a process
//! never holds the agent up.
//!
//! A failure quotes the end of the output (the last `OUTPUT_TAIL`
//! characters of the last 64 KiB of each stream: the reason is usually
//! last), with control characters escaped, so a check cannot drive the
//! terminal or forge log lines.

use std::process::Stdio;
use std::time::Duration;

use std::os::fd::AsFd;

use tokio::io::AsyncReadExt;

/// How long the output is still read after the check exited.
const OUTPUT_AFTER_EXIT: Duration = Duration::from_secs(1);

/// How much of the command's output a failure quotes, in characters.
const OUTPUT_TAIL: usize = 2000;

/// How much of each of the command's streams is kept: the last bytes.
const OUTPUT_KEPT: usize = 64 * 1024;

/// Runs `command` once, for at most `timeout`: `Err` says why the node is
/// unhealthy.
pub async fn run(command: &str, timeout: Duration) -> Result<(), String> {
    Command { command, timeout }.run().await
}

struct Command<'a> {
    command: &'a str,
    timeout: Duration,
}

impl Command<'_> {
    async fn run(&self) -> Result<(), String> {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        // The rendezvous token is the agent's, not the check's.
        for secret in crate::supervisor::SECRET_VARIABLES {
            cmd.env_remove(secret);
        }
        cmd.arg("-c")
            .arg(self.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Not killed on drop: SIGKILL would keep the keeper from taking the
        // check's processes along (`Leftovers` stops it with SIGTERM).
        accel_process::sys::run_under_keeper(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run the health check: {e}"))?;
        // Both streams at once (a check that fills one pipe while the other
        // is read would block); past the cap the oldest output is dropped.
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let pipes: Vec<u64> = [
            out.as_ref()
                .and_then(|p| accel_process::sys::pipe_inode(p.as_fd())),
            err.as_ref()
                .and_then(|p| accel_process::sys::pipe_inode(p.as_fd())),
        ]
        .into_iter()
        .flatten()
        .collect();
        // The check and whatever it started go when the check is over (the
        // keeper sees to it), or when it is dropped half-way (the agent
        // stopped mid-check: the keeper is told), and so does whatever
        // still holds its output.
        let mut leftovers = Leftovers {
            keeper: child.id().map(|p| p as i32),
            pipes,
            output_ended: false,
        };
        // Read into buffers that outlive the reads: a read given up on
        // keeps what it had.
        let (mut text, mut more) = (Vec::new(), Vec::new());
        let mut ended = false;
        let collect = async {
            let drains = async { tokio::join!(drain(out, &mut text), drain(err, &mut more)) };
            tokio::pin!(drains);
            let status = tokio::select! {
                status = child.wait() => status,
                _ = &mut drains => {
                    ended = true;
                    child.wait().await
                }
            };
            if status.is_ok() {
                // The keeper exited, its subtree gone, and was reaped: its
                // pid may be another process's by now, even if the rest of
                // the output outlasts the timeout or this run is dropped.
                leftovers.keeper = None;
            }
            // A background process of a finished check may hold the pipes.
            if !ended {
                ended = tokio::time::timeout(OUTPUT_AFTER_EXIT, drains)
                    .await
                    .is_ok();
            }
            status
        };
        let status = tokio::time::timeout(self.timeout, collect).await;
        leftovers.output_ended = ended;
        drop(leftovers);
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

/// What a check leaves behind, stopped when dropped: its keeper, if it
/// still runs (told with SIGTERM, it kills every process below it and
/// exits), and, unless its output was read to the end, whatever still
/// holds that output.
struct Leftovers {
    keeper: Option<i32>,
    pipes: Vec<u64>,
    output_ended: bool,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if let Some(k) = self.keeper {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(k),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if !self.output_ended {
            let killed = accel_process::sys::kill_pipe_holders(&self.pipes);
            if !killed.is_empty() {
                tracing::debug!(pids = ?killed, "killed processes the health check left outside its process group");
            }
        }
    }
}

/// Reads a pipe to its end into `kept`, keeping the last [`OUTPUT_KEPT`]
/// bytes.
async fn drain(pipe: Option<impl tokio::io::AsyncRead + Unpin>, kept: &mut Vec<u8>) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        keep_last(kept, &buf[..n], OUTPUT_KEPT);
    }
}

/// Appends `more` to `kept`, then drops the oldest bytes beyond `cap`.
fn keep_last(kept: &mut Vec<u8>, more: &[u8], cap: usize) {
    kept.extend_from_slice(more);
    if kept.len() > cap {
        kept.drain(..kept.len() - cap);
    }
}

/// `: <last output>` of a failed check, if it printed anything: its last
/// `OUTPUT_TAIL` characters on one line (`|` between lines), control
/// characters escaped.
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
    let more = if start > 0 { "…" } else { "" };
    let text = text[start..].replace('\n', " | ");
    format!(": {more}{}", accel_wire::limits::printable(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(command: &str, timeout: Duration) -> Command<'_> {
        Command { command, timeout }
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
    async fn the_keeper_ends_as_the_check_did() {
        let long = Duration::from_secs(10);
        let e = check("kill -USR1 $$", long)
            .run()
            .await
            .expect_err("killed");
        assert!(e.contains("was killed by SIGUSR1 (exit code 138)"), "{e}");
        let e = check("exit 255", long).run().await.expect_err("failed");
        assert!(e.contains("exited with code 255"), "{e}");
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
        let alive = || running(pid);
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

    /// Whether `pid` runs (a zombie, waiting for its reaper, does not).
    fn running(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    async fn gone_within(pid: i32, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while running(pid) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !running(pid)
    }

    fn read_pid(path: &std::path::Path) -> i32 {
        std::fs::read_to_string(path)
            .expect("pid")
            .trim()
            .parse()
            .expect("a pid")
    }

    #[tokio::test]
    async fn a_setsid_child_holding_the_output_neither_holds_up_the_agent_nor_outlives_the_check() {
        let dir = tempfile::tempdir().expect("dir");
        let pid_file = dir.path().join("pid");
        for (cmd, passes) in [
            (
                format!(
                    "setsid sleep 300 & echo $! > {}; echo ok",
                    pid_file.display()
                ),
                true,
            ),
            (
                format!(
                    "setsid sleep 300 & echo $! > {}; echo the disk is full; exit 3",
                    pid_file.display()
                ),
                false,
            ),
        ] {
            let t = std::time::Instant::now();
            let r = check(&cmd, Duration::from_secs(20)).run().await;
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            if passes {
                assert_eq!(r, Ok(()));
            } else {
                let e = r.expect_err("unhealthy");
                assert!(
                    e.contains("exited with code 3") && e.contains("the disk is full"),
                    "{e}"
                );
            }
            let pid = read_pid(&pid_file);
            assert!(
                gone_within(pid, Duration::from_secs(5)).await,
                "the setsid child {pid} was killed"
            );
        }
    }

    #[tokio::test]
    async fn a_check_that_times_out_is_killed_with_its_whole_group_and_its_setsid_child() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let cmd = format!(
            "sleep 300 & echo $! > {}; setsid sleep 300 & echo $! > {}; sleep 300",
            a.display(),
            b.display()
        );
        let t = std::time::Instant::now();
        let e = check(&cmd, Duration::from_millis(500))
            .run()
            .await
            .expect_err("too slow");
        assert!(e.contains("did not finish within"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        for f in [&a, &b] {
            let pid = read_pid(f);
            assert!(
                gone_within(pid, Duration::from_secs(5)).await,
                "{pid} of {}",
                f.display()
            );
        }
    }

    #[tokio::test]
    async fn a_check_that_signals_its_own_group_is_not_taken_for_cancelled() {
        // `kill 0` reaches the check's process group, not its keeper (which
        // would take the SIGTERM for the agent's and end the check).
        let long = Duration::from_secs(20);
        assert_eq!(
            check("trap '' TERM; sleep 300 & kill 0; exit 0", long)
                .run()
                .await,
            Ok(())
        );
        assert_eq!(
            check("trap '' TERM; kill -- -$$ && exit 0", long)
                .run()
                .await,
            Ok(()),
            "the check leads its process group"
        );
    }

    #[tokio::test]
    async fn a_process_whose_main_thread_ended_does_not_outlive_the_check() {
        // Such a process shows as a zombie in /proc while its other
        // threads run.
        let dir = tempfile::tempdir().expect("dir");
        let pid_file = dir.path().join("pid");
        let cmd = format!(
            "command -v python3 >/dev/null || exit 0
             python3 -c 'import ctypes, os, sys, threading, time
def later():
    time.sleep(0.2)
    open(sys.argv[1], \"w\").write(str(os.getpid()))
    time.sleep(300)
threading.Thread(target=later).start()
ctypes.CDLL(None).pthread_exit(None)' {p} &
             until [ -s {p} ]; do sleep 0.05; done",
            p = pid_file.display()
        );
        assert_eq!(check(&cmd, Duration::from_secs(20)).run().await, Ok(()));
        if !pid_file.exists() {
            eprintln!("no python3: skipped");
            return;
        }
        let pid = read_pid(&pid_file);
        let runs = || {
            std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
                tasks.flatten().any(|t| {
                    std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                        !s.rsplit(')')
                            .next()
                            .unwrap_or("")
                            .trim_start()
                            .starts_with('Z')
                    })
                })
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while runs() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!runs(), "a thread of {pid} still runs");
    }

    #[tokio::test]
    async fn a_check_dropped_half_way_takes_its_setsid_child_with_it() {
        // The agent stopped mid-check (a signal ends its run): the check's
        // future is dropped, and what it started goes, outside its group too.
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let cmd = format!(
            "sleep 300 & echo $! > {}; setsid sleep 300 & echo $! > {}; sleep 300",
            a.display(),
            b.display()
        );
        let c = check(&cmd, Duration::from_secs(60));
        let started = tokio::time::timeout(Duration::from_secs(1), c.run()).await;
        assert!(started.is_err(), "still running when dropped");
        for f in [&a, &b] {
            let pid = read_pid(f);
            assert!(
                gone_within(pid, Duration::from_secs(5)).await,
                "{pid} of {}",
                f.display()
            );
        }
    }

    #[test]
    fn a_check_whose_agent_dies_half_way_takes_its_setsid_child_with_it() {
        // As `kill -9` of the agent: no destructor runs; the thread that
        // spawned the check ends, and the keeper's parent-death signal
        // is all that is left.
        let dir = tempfile::tempdir().expect("dir");
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        let cmd = format!(
            "sleep 300 & echo $! > {}; setsid sh -c '(setsid sleep 300 & echo $! > {}); sleep 300' & \
             echo $$ > {}; sleep 300",
            a.display(),
            b.display(),
            c.display()
        );
        let started = std::thread::spawn(move || {
            let check = check(&cmd, Duration::from_secs(60));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let mut run = Box::pin(check.run());
            let done = rt.block_on(async {
                for _ in 0..100 {
                    if tokio::time::timeout(Duration::from_millis(50), &mut run)
                        .await
                        .is_ok()
                    {
                        return true;
                    }
                    if b.exists() && std::fs::read_to_string(&b).is_ok_and(|t| t.ends_with('\n')) {
                        return false;
                    }
                }
                true
            });
            std::mem::forget(run);
            done
        })
        .join()
        .expect("the thread");
        assert!(!started, "still running when its thread ended");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        for f in [
            &dir.path().join("a"),
            &dir.path().join("b"),
            &dir.path().join("c"),
        ] {
            let pid = read_pid(f);
            assert!(
                rt.block_on(gone_within(pid, Duration::from_secs(5))),
                "{pid} of {}",
                f.display()
            );
        }
    }

    #[tokio::test]
    async fn a_long_output_is_quoted_by_its_end() {
        // 100 KiB of noise on each stream, then the reason.
        let cmd = "head -c 102400 /dev/zero | tr '\\0' x; echo; \
                   head -c 102400 /dev/zero | tr '\\0' y >&2; echo >&2; \
                   echo the real reason >&2; exit 1";
        let e = check(cmd, Duration::from_secs(20))
            .run()
            .await
            .expect_err("unhealthy");
        assert!(
            e.ends_with("the real reason"),
            "{}",
            &e[e.len().saturating_sub(200)..]
        );
        assert!(e.contains(": …"), "marked as cut");
        assert!(
            e.chars().count() < OUTPUT_TAIL + 100,
            "{} characters",
            e.chars().count()
        );
    }

    #[tokio::test]
    async fn control_characters_in_the_output_are_escaped() {
        let cmd =
            "printf '\\033[2J\\033]0;owned\\007GPU 3\\r\\n2026-01-01 INFO fake line\\n'; exit 2";
        let e = check(cmd, Duration::from_secs(20))
            .run()
            .await
            .expect_err("unhealthy");
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(
            e.contains("\\u{1b}[2J") && e.contains("\\u{7}GPU 3\\r | 2026-01-01 INFO fake line"),
            "{e}"
        );
    }

    #[test]
    fn the_last_bytes_are_kept() {
        let mut kept = Vec::new();
        keep_last(&mut kept, b"abcdef", 4);
        assert_eq!(kept, b"cdef");
        keep_last(&mut kept, b"gh", 4);
        assert_eq!(kept, b"efgh");
        keep_last(&mut kept, b"", 4);
        assert_eq!(kept, b"efgh");
    }
}
