//! The chaos run checks itself: with fencing switched off (the debug
//! build's test-only `ACCEL_TEST_BREAK_FENCE=1`), a fixed schedule that
//! cuts off the node holding rank 0 and then pauses its agent, each for
//! longer than the drop limit, must be reported as a violation of
//! invariant (a) (two live workers holding one rank); the same schedule
//! with fencing on must not (only (a) is asserted there: the schedule is
//! about fencing). A harness that cannot catch this would pass anything.
//!
//! Needs root (network namespaces, nftables, a tmpfs); the run itself is
//! `chaos` (tests/src/bin/chaos.rs), in a private mount namespace.

use std::time::Duration;

use accel_tests::{bin, run_logged, scratch, with_private_hosts};

/// Runs the fence schedule; the run's output.
fn fence_run(name: &str, broken: bool) -> (i32, String) {
    scenario_run(name, "fence", "24", broken)
}

/// Runs fixed scenario `scenario` for `seconds` (without the DDP job); the
/// run's exit code and output.
fn scenario_run(name: &str, scenario: &str, seconds: &str, broken: bool) -> (i32, String) {
    let dir = scratch(name);
    let chaos = bin("chaos");
    let run_dir = dir.join("run");
    let mut argv = vec![
        chaos.to_str().expect("path"),
        seconds,
        "--scenario",
        scenario,
        "--no-ddp",
        "--dir",
        run_dir.to_str().expect("path"),
    ];
    if broken {
        argv.push("--break-fence");
    }
    let mut cmd = with_private_hosts(&dir, &argv);
    if let Some(v) = std::env::var_os("ACCEL_VENV") {
        cmd.env("ACCEL_VENV", v);
    }
    let out = run_logged(cmd, &dir, "chaos", Duration::from_secs(240));
    eprintln!("{}", out.stdout);
    let code = out.status.code().unwrap_or(-1);
    (code, out.stdout)
}

#[test]
fn a_broken_fence_is_caught_by_invariant_a() {
    let (code, out) = fence_run("chaos-broken-fence", true);
    assert_eq!(code, 1, "the run reports a violation:\n{out}");
    assert!(
        out.contains("violation (a): two live workers held rank"),
        "invariant (a) caught the unfenced workers:\n{out}"
    );
    assert!(out.contains("| isolate host | 1 | 0 |"), "{out}");
    assert!(out.contains("| SIGSTOP agent | 1 | 0 |"), "{out}");
}

#[test]
fn a_working_fence_holds_when_a_node_is_cut_off_or_its_agent_paused() {
    let (_, out) = fence_run("chaos-fence", false);
    assert!(out.contains("| isolate host | 1 | 0 |"), "{out}");
    assert!(out.contains("| SIGSTOP agent | 1 | 0 |"), "{out}");
    assert!(
        !out.contains("violation (a)"),
        "with fencing on, no two workers held one rank:\n{out}"
    );
}

/// A worker fails on a node cut off from the rendezvous, within the drop
/// limit: the node's other worker must still be stopped before the job
/// re-forms without the node (the failure report to an unreachable
/// rendezvous must not hold the stop back).
#[test]
fn a_failure_on_a_cut_off_node_stops_its_other_workers_before_the_job_re_forms() {
    let (_, out) = scenario_run(
        "chaos-cut-off-failure",
        "failure-while-cut-off",
        "12",
        false,
    );
    assert!(out.contains("| kill -9 worker | 1 | 0 |"), "{out}");
    assert!(
        !out.contains("violation (a)"),
        "no two workers held one rank:\n{out}"
    );
}

/// Faults shorter than the drop limit, aimed at the two ways a node's
/// ranks could run twice without one: a node that gives up a silent
/// server (cut off, or its packets to the node dropped, for 1.5 s) must
/// not end its connection, which the server would read as the node's
/// death once the link heals and re-form the job while the node's workers
/// still run; and a paused agent's guard must kill its workers before the
/// server may drop the node (counted from its last keep-alive, up to a
/// keep-alive interval before the agent's last beat), not a full drop
/// limit after that beat. Both broke invariant (a) in a 600 s run.
#[test]
fn faults_shorter_than_the_drop_limit_never_leave_a_rank_running_twice() {
    let (code, out) = scenario_run("chaos-short-faults", "short-faults", "42", false);
    assert!(out.contains("| isolate host | 1 | 0 |"), "{out}");
    assert!(out.contains("| partition one-way | 2 | 0 |"), "{out}");
    assert!(out.contains("| SIGSTOP agent | 4 | 0 |"), "{out}");
    assert!(
        !out.contains("violation (a)"),
        "no two workers held one rank:\n{out}"
    );
    assert_eq!(code, 0, "no invariant broke:\n{out}");
}
