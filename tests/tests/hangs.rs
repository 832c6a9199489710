//! Hang detection: torchrun's `FileTimer` protocol served by the agent. An
//! unmodified script's expired `expires(after=...)` is a worker failure
//! whose report carries the hung worker's Python stacks.

use std::time::Duration;

use accel_tests::{run_logged, scratch, venv, venv_path, worker, AgentCmd, Finished};

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(120);

fn run(tag: &str, max_restarts: u32, path: &str, flags: &[&str]) -> Finished {
    run_with(tag, max_restarts, path, flags, &[])
}

fn run_with(
    tag: &str,
    max_restarts: u32,
    path: &str,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Finished {
    let dir = scratch(tag);
    let python = venv().join("bin/python");
    let job = AgentCmd::standalone()
        .nproc(2)
        .max_restarts(max_restarts)
        .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        .env("PYTHON_EXEC", python.to_str().expect("path"))
        .envs(env)
        .flags(flags)
        .script(worker("hang_timer.py"));
    let mut c = job.command();
    c.env("PATH", path);
    run_logged(c, &dir, tag, LIMIT)
}

#[test]
fn an_expired_file_timer_restarts_the_job_and_the_summary_shows_the_stack() {
    let _heavy = heavy();
    // Restarted: the hung rank is stopped and the next attempt finishes.
    let out = run("timer-restart", 1, &venv_path(), &[]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("a FileTimer expired"), "{}", out.stderr);
    assert!(
        out.stdout.contains("rank 1 attempt 1 done"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("rank 1 attempt 0 done"),
        "{}",
        out.stdout
    );
    // Budget spent: the root-cause summary names the timer and shows where
    // the worker hung (py-spy's dump).
    let out = run("timer-summary", 0, &venv_path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert_rank_1_timer_fired_with_its_stack(&out.stderr);
    // Without py-spy the summary says how to get the stacks.
    let out = run("timer-no-py-spy", 0, "/usr/bin:/bin", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("py-spy is not installed"),
        "{}",
        out.stderr
    );
    // A hot-started worker (a fork of the zygote) hangs the same way and
    // its stacks are read the same way.
    let out = run("timer-hot", 0, &venv_path(), &["--preload", "torch"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("zygote ready"), "{}", out.stderr);
    assert!(
        out.stderr.contains("stuck_in_a_collective (hang_timer.py:"),
        "the hung frame of a forked worker is in the summary:\n{}",
        out.stderr
    );
}

#[test]
fn a_flood_of_foreign_timers_does_not_stop_a_workers_timer_from_firing() {
    let _heavy = heavy();
    // 5,000 far-future timers (more than the 4,096 the agent holds) for a
    // live process that is no worker's: this test's own.
    let me = std::process::id().to_string();
    let out = run_with(
        "timer-flood",
        0,
        &venv_path(),
        &[],
        &[("FLOOD_PID", &me), ("FLOOD_COUNT", "5000")],
    );
    assert!(
        out.stdout
            .contains(&format!("flooded the pipe with 5000 timers for pid {me}")),
        "{}",
        out.stdout
    );
    // The hung rank's own timer still fired, with its stacks.
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert_rank_1_timer_fired_with_its_stack(&out.stderr);
    // The flood was dropped and said so, in aggregate.
    assert!(
        out.stderr.contains(&format!(
            "for processes in no worker's process group of this node (the last for pid {me})"
        )),
        "{}",
        out.stderr
    );
    let lines = out
        .stderr
        .lines()
        .filter(|l| l.contains("dropped FileTimer requests"))
        .count();
    assert!(lines <= 2, "{lines} lines:\n{}", out.stderr);
}

/// The summary names rank 1's expired `train_step` timer and shows the frame
/// it hung in (py-spy's dump).
fn assert_rank_1_timer_fired_with_its_stack(stderr: &str) {
    assert!(
        stderr.contains("FileTimer 'train_step' expired: rank 1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("stuck_in_a_collective (hang_timer.py:"),
        "the hung frame is in the summary:\n{stderr}"
    );
}
