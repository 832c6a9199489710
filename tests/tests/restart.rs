//! Job-wide restarts: one node's failure restarts every node; a spent budget
//! fails every node; jobs on one server are isolated.

use std::time::Duration;

use accel_tests::{records, scratch, Agent, AgentCmd, Server};

use crate::check_layout;

const LIMIT: Duration = Duration::from_secs(60);

fn c10d_agents(
    server: &Server,
    dir: &std::path::Path,
    job: &str,
    n: usize,
    max_restarts: &str,
    env: &[(&str, &str)],
) -> Vec<Agent> {
    let cmd = AgentCmd::c10d(&server.addr, job)
        .nnodes(n)
        .nproc(2)
        .max_restarts(max_restarts);
    (0..n)
        .map(|i| {
            let tag = format!("{job}-{i}");
            cmd.clone().recording(dir, &tag).envs(env).start(dir, &tag)
        })
        .collect()
}

#[test]
fn one_failure_restarts_every_node_with_the_same_count() {
    let server = Server::start();
    let dir = scratch("restart");
    // Global rank 3 (node 1) fails in the first attempt only.
    let agents = c10d_agents(
        &server,
        &dir,
        "restart-job",
        2,
        "3",
        &[("FAIL_RANKS", "3"), ("FAIL_UNTIL", "1"), ("RUN_FOR", "3")],
    );
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    check_layout(&recs, 2, 2, 0, 3);
    check_layout(&recs, 2, 2, 1, 3);
    assert!(recs.iter().all(|r| r.restart <= 1), "exactly one restart");
    // The second attempt started on both nodes after the first attempt's failure,
    // well before the healthy workers of the first attempt would have finished.
    let failed_start = recs
        .iter()
        .find(|r| r.restart == 0 && r.rank == 3)
        .expect("rank 3")
        .start;
    for r in recs.iter().filter(|r| r.restart == 1) {
        assert!(
            r.start > failed_start,
            "rank {} restarted after the failure",
            r.rank
        );
        assert!(
            r.start < failed_start + 2.5,
            "rank {} restarted promptly (did not wait for RUN_FOR)",
            r.rank
        );
    }
    // The restart reason names the failed rank, on every node.
    let _ = server;
}

#[test]
fn spent_budget_fails_every_agent() {
    let server = Server::start();
    let dir = scratch("budget");
    let agents = c10d_agents(
        &server,
        &dir,
        "budget-job",
        2,
        "1",
        &[("FAIL_RANKS", "0"), ("FAIL_CODE", "7"), ("RUN_FOR", "30")],
    );
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 1, "every agent exits non-zero: {}", out.stderr);
        assert!(
            out.stderr.contains("restart budget is spent"),
            "{}",
            out.stderr
        );
        assert!(
            out.stderr.contains("worker rank 0"),
            "names the failed rank: {}",
            out.stderr
        );
        assert!(out.stderr.contains("exited with code 7"), "{}", out.stderr);
    }
    let recs = records(&dir);
    check_layout(&recs, 2, 2, 0, 1);
    check_layout(&recs, 2, 2, 1, 1);
    assert!(
        recs.iter().all(|r| r.restart <= 1),
        "no attempt beyond the budget"
    );
}

#[test]
fn a_second_job_on_the_server_does_not_disturb_the_first() {
    let server = Server::start();
    let dir_a = scratch("job-a");
    let dir_b = scratch("job-b");
    let a = c10d_agents(&server, &dir_a, "job-a", 2, "0", &[("RUN_FOR", "2")]);
    let b = c10d_agents(
        &server,
        &dir_b,
        "job-b",
        2,
        "0",
        &[("FAIL_RANKS", "1"), ("RUN_FOR", "30")],
    );
    for agent in b {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 1, "job b fails: {}", out.stderr);
    }
    for agent in a {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "job a is untouched: {}", out.stderr);
    }
    let recs = records(&dir_a);
    check_layout(&recs, 2, 2, 0, 0);
    assert!(recs.iter().all(|r| r.restart == 0), "job a never restarted");
    assert!(recs.iter().all(|r| r.var("TORCHELASTIC_RUN_ID") == "job-a"));
}

#[test]
fn rdzv_server_status_lists_jobs_nodes_and_restarts() {
    let server = Server::start();
    let dir = scratch("status");
    let agents = c10d_agents(
        &server,
        &dir,
        "status-job",
        2,
        "2",
        &[("FAIL_RANKS", "1"), ("FAIL_UNTIL", "1"), ("RUN_FOR", "30")],
    );
    assert!(accel_tests::eventually(
        Duration::from_secs(30),
        || records(&dir).iter().filter(|r| r.restart == 1).count() == 4
    ));
    let out = std::process::Command::new(accel_tests::bin("rdzv-server"))
        .args(["status", "--rdzv-endpoint", &server.addr])
        .output()
        .expect("run rdzv-server status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("job status-job  phase running  round 1  restarts 1/2  nnodes 2  members 2"),
        "{text}"
    );
    assert!(
        text.contains("last failure: worker rank 1 (local rank 1)"),
        "{text}"
    );
    assert_eq!(text.matches("  node ").count(), 2, "{text}");
    assert!(
        text.contains("rank 0  running") && text.contains("rank 1  running"),
        "{text}"
    );
    for a in agents {
        a.signal("TERM");
        assert_eq!(a.wait(LIMIT).code(), 128 + 15);
    }
}

#[test]
fn a_crash_loop_backs_off_and_a_zero_backoff_does_not() {
    let dir = scratch("crashloop");
    // Two agents of one job, every worker failing at once, three restarts.
    let server = Server::start();
    let run = |job: &str, backoff: &str| {
        let cmd = AgentCmd::c10d(&server.addr, job)
            .nnodes(2)
            .nproc(1)
            .max_restarts(3)
            .flag("--restart-backoff", backoff)
            .no_python("/bin/false", &[]);
        let started = std::time::Instant::now();
        let agents: Vec<Agent> = (0..2)
            .map(|i| cmd.start(&dir, &format!("{job}-{i}")))
            .collect();
        let done: Vec<_> = agents.into_iter().map(|a| a.wait(LIMIT)).collect();
        (done, started.elapsed())
    };
    let (done, took) = run("looping", "400ms:10");
    for d in &done {
        assert_eq!(d.code(), 1, "the budget is spent: {}", d.stderr);
        // The first restart is at once; the second and third wait 0.4 s and 0.8 s.
        let waits: Vec<&str> = d
            .stderr
            .lines()
            .filter(|l| l.contains("crash loop"))
            .filter_map(|l| l.split("wait_s=").nth(1))
            .filter_map(|w| w.split_whitespace().next())
            .collect();
        assert_eq!(waits, ["0.4", "0.8"], "{}", d.stderr);
    }
    assert!(took >= Duration::from_millis(1200), "{took:?}");
    let (done, _) = run("eager", "0");
    for d in &done {
        assert_eq!(d.code(), 1);
        assert!(!d.stderr.contains("crash loop"), "{}", d.stderr);
        assert!(d.stderr.contains("3 of --max-restarts 3"), "{}", d.stderr);
    }
}

#[test]
fn a_restart_on_a_gpu_node_waits_for_the_last_round_to_release_the_gpus() {
    let dir = scratch("gpu-free");
    let fake = accel_tests::worker("fake-gpu");
    let path = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |tag: &str, hold: &str, timeout: &str| {
        let apps = dir.join(format!("{tag}.apps"));
        let cmd = AgentCmd::standalone()
            .nproc(2)
            .max_restarts(1)
            .flag("--gpu-free-timeout", timeout)
            .env("PATH", &path)
            .env("GPU_APPS", apps.display())
            .env("GPU_HOLD", hold)
            .no_python(accel_tests::worker("gpu_worker.sh"), &[]);
        let out = cmd.start(&dir, tag).wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        out.stderr
    };
    // The failed workers "hold" the GPUs for 2 s after they exit: the
    // restart waits, then starts.
    let err = run("released", "2", "30");
    assert!(
        err.contains("waiting for the last round's processes to release the GPUs"),
        "{err}"
    );
    let waited: f64 = err
        .lines()
        .find(|l| l.contains("the GPUs are free"))
        .and_then(|l| l.split("waited_s=\"").nth(1))
        .and_then(|w| w.split('"').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("a wait was logged: {err}"));
    assert!(waited >= 0.5, "waited {waited} s: {err}");
    // Held for good: after --gpu-free-timeout the workers start anyway.
    let err = run("stuck", "1000", "1");
    assert!(err.contains("after --gpu-free-timeout"), "{err}");
}
