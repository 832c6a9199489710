//! `--no-restart-exit-code`: a worker exiting with that code ends the job at
//! once, whatever restart budget is left, and every agent exits with it.

use std::time::Duration;

use accel_tests::{records, scratch, AgentCmd, Server};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_no_restart_exit_code_ends_the_job_with_that_code_on_every_node() {
    let server = Server::start();
    let dir = scratch("no-restart");
    let agents: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            AgentCmd::c10d(&server.addr, "no-restart")
                .nnodes(2)
                .nproc(2)
                .flag("--max-restarts", 3)
                .flag("--no-restart-exit-code", 93)
                .recording(&dir, name)
                // Global rank 3 exits 93 (after every worker has started
                // and recorded itself); the others would run for a minute.
                .env("FAIL_RANKS", "3")
                .env("FAIL_CODE", "93")
                .env("FAIL_AFTER", "3")
                .env("RUN_FOR", "60")
                .start(&dir, name)
        })
        .collect();
    for agent in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 93, "{}", out.stderr);
        assert!(
            out.stderr.contains("--no-restart-exit-code"),
            "{}",
            out.stderr
        );
    }
    let recs = records(&dir);
    assert_eq!(recs.len(), 4, "one round, no restart: {recs:#?}");
    assert!(recs.iter().all(|r| r.restart == 0));
}

#[test]
fn other_codes_restart_a_one_node_job_ends_with_the_code_and_zero_is_refused() {
    let dir = scratch("no-restart-one");
    // Exit 3 is not the code: the job restarts (budget 1) and succeeds.
    let out = AgentCmd::standalone()
        .nproc(2)
        .flag("--max-restarts", 1)
        .flag("--no-restart-exit-code", 93)
        .recording(&dir, "one")
        .env("FAIL_RANKS", "1")
        .env("FAIL_CODE", "3")
        .env("FAIL_UNTIL", "1")
        .env("RUN_FOR", "0.2")
        .start(&dir, "one")
        .wait(LIMIT);
    assert_eq!(
        out.code(),
        0,
        "exit 3 restarted, then the job succeeded: {}",
        out.stderr
    );
    let one = AgentCmd::standalone()
        .nproc(2)
        .flag("--max-restarts", 3)
        .flag("--no-restart-exit-code", 93)
        .recording(&dir, "ninety-three")
        .env("FAIL_RANKS", "0")
        .env("FAIL_CODE", "93")
        .env("RUN_FOR", "60")
        .start(&dir, "ninety-three")
        .wait(LIMIT);
    assert_eq!(one.code(), 93, "{}", one.stderr);
    let bad = AgentCmd::standalone()
        .nproc(1)
        .flag("--no-restart-exit-code", 0)
        .no_python("true", &[])
        .start(&dir, "zero")
        .wait(LIMIT);
    assert_eq!(bad.code(), 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("--no-restart-exit-code"),
        "{}",
        bad.stderr
    );
}
