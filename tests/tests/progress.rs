//! Training progress (`accel.progress(step)` in real Python workers) and
//! the no-progress verdict (`--max-no-progress-restarts`).

use std::path::Path;
use std::time::Duration;

use accel_tests::{scratch, worker, AgentCmd};

const LIMIT: Duration = Duration::from_secs(120);

/// A two-worker job whose rank 0 fails at `fail_at` (plus `stride` per
/// restart) and resumes from its step-`10k` checkpoint.
fn job(dir: &Path, fail_at: u32, stride: u32) -> AgentCmd {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    AgentCmd::new()
        .nproc(2)
        .max_restarts(5)
        .flag("--no-restart-exit-code", 42)
        .flag("--max-no-progress-restarts", 2)
        .env("CKPT_DIR", dir.display())
        .env("FAIL_AT", fail_at)
        .env("FAIL_STRIDE", stride)
        .env("PYTHONPATH", python.display())
        .script(worker("progress_job.py"))
}

fn attempts(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("attempt-"))
        })
        .count()
}

/// Dying at step 40 after every restart from the step-30 checkpoint: the
/// job ends after two restarts that did not pass step 40, with the
/// no-restart code, and says at which step.
#[test]
fn a_job_that_dies_at_the_same_step_ends_after_the_no_progress_limit() {
    let dir = scratch("no-progress");
    let out = job(&dir, 40, 0).run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 42, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("no progress: the job reached step 40 at best")
            && out.stderr.contains("--max-no-progress-restarts 2")
            && out.stderr.contains("3 of --max-restarts 5 left unused"),
        "{}",
        out.stderr
    );
    assert_eq!(attempts(&dir), 3, "the first run and 2 restarts");
}

/// Dying at a later step each time is progress: the job spends its whole
/// restart budget, as without the flag.
#[test]
fn a_job_that_gets_further_each_time_keeps_its_restarts() {
    let dir = scratch("some-progress");
    let out = job(&dir, 40, 10).run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(!out.stderr.contains("no progress"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("restart budget is spent (5 of --max-restarts 5)"),
        "{}",
        out.stderr
    );
    assert_eq!(attempts(&dir), 6);
}

/// The running round's step, as the workers report it, is in
/// `rdzv-server status` (text and JSON) while the job runs.
#[test]
fn the_running_rounds_step_is_in_status() {
    let server = accel_tests::Server::start();
    let dir = scratch("progress-status");
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let agent = AgentCmd::c10d(&server.addr, "stepping")
        .nnodes(1)
        .nproc(2)
        .conf("keep_alive_interval=0.5")
        .env("CKPT_DIR", dir.display())
        .env("FAIL_AT", 1_000_000)
        .env("STEPS", 1_000_000)
        .env("PYTHONPATH", python.display())
        .script(worker("progress_job.py"))
        .start(&dir, "agent");
    accel_tests::poll_until("status shows the step", LIMIT, || {
        let jobs = accel_tests::status_jobs(&server.addr, &[])?;
        match jobs.first().and_then(|j| j["step"].as_u64()) {
            Some(s) if s >= 20 => Ok(()),
            other => Err(format!("{other:?}: {jobs:?}")),
        }
    });
    let text = std::process::Command::new(accel_tests::bin("rdzv-server"))
        .args(["status", "--rdzv-endpoint", &server.addr])
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("  step ") && text.contains("best before -"),
        "{text}"
    );
    agent.signal("TERM");
    let _ = agent.wait(LIMIT);
}

/// Without a code change: the agent reads the checkpoint-iteration file the
/// script writes (`--checkpoint-iteration-file`), and a job that never
/// checkpoints past step 30 ends after the no-progress limit.
#[test]
fn a_checkpoint_iteration_file_is_progress_without_a_code_change() {
    let dir = scratch("no-progress-file");
    let out = job(&dir, 40, 0)
        .env("REPORT", 0)
        .flag("--checkpoint-iteration-file", dir.join("step").display())
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 42, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("no progress: the job reached step 30 at best"),
        "{}",
        out.stderr
    );
    assert_eq!(attempts(&dir), 3);
}
