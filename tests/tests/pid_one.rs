//! The agent as PID 1 of a PID namespace, as in a container without an
//! init: orphans its workers leave are reaped, round after round, and a
//! stop signal sent to PID 1 from outside reaches the agent.

use std::time::Duration;

use accel_tests::{descendants, poll_until, scratch, AgentCmd};

const LIMIT: Duration = Duration::from_secs(60);

/// The one-letter state of process `pid` (`Z`: a zombie), if it exists.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses, which may hold spaces.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[test]
fn as_pid_one_the_agent_reaps_its_workers_orphans_across_restarts() {
    let dir = scratch("pid-one");
    // Each worker starts a background sleep in its process group; local
    // rank 0 fails in attempts 0-2. When a round ends the sweep kills the
    // sleeps, whose shells are gone: orphans of PID 1.
    let script = "sleep 300 & \
                  if [ $LOCAL_RANK = 0 ] && [ $TORCHELASTIC_RESTART_COUNT -lt 3 ]; then sleep 0.2; exit 1; fi; \
                  sleep 300";
    let agent = AgentCmd::standalone()
        .nproc(2)
        .max_restarts(3)
        .no_python("sh", &["-c", script])
        .start_with(
            &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"],
            &dir,
            "pid1",
        );
    let unshare = agent.pid();
    poll_until("the fourth round runs", LIMIT, || {
        let log = std::fs::read_to_string(&agent.stderr).unwrap_or_default();
        match log.contains("restart_count=3") {
            true => Ok(()),
            false => Err(log),
        }
    });
    // Three rounds ended, each leaving orphans: none stays a zombie (the
    // last sweep's are given a moment).
    let procs = poll_until(
        "no zombies in the namespace",
        Duration::from_secs(5),
        || {
            let procs = descendants(unshare);
            let z: Vec<u32> = procs
                .iter()
                .copied()
                .filter(|p| state(*p) == Some('Z'))
                .collect();
            match z.is_empty() && procs.len() >= 4 {
                true => Ok(procs),
                false => Err(format!("zombies {z:?} of {procs:?}")),
            }
        },
    );
    // PID 1 of the namespace (unshare's child) passes SIGTERM on: the agent
    // stops its workers and exits 128 + 15, which PID 1 exits with.
    let pid1 = *procs.first().expect("the namespace's first process");
    // SAFETY: kill takes plain integers and touches no memory.
    let sent = unsafe { libc::kill(pid1 as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM to {pid1}");
    let out = agent.wait(LIMIT);
    assert_eq!(out.code(), 128 + 15, "{}", out.stderr);
}
