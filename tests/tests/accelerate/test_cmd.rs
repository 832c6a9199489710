//! `accel test-worker`, the check `accel test` launches when no Python
//! environment has accelerate: run N-way by the agent (torchrun's
//! environment, the agent's store), against PyTorch's own TCPStore server,
//! and alone with a bad environment; and `accel test` itself, both ways.

use std::process::Command;
use std::time::{Duration, Instant};

use accel_tests::{bin, run_logged, scratch, venv, with_private_hosts, AgentCmd};

const LIMIT: Duration = Duration::from_secs(120);

fn worker_lines(stdout: &str, world: usize) -> Vec<String> {
    let mut lines: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.find("rank ").map(|i| l[i..].to_owned()))
        .filter(|l| l.contains("processes reached each other"))
        .collect();
    lines.sort();
    assert_eq!(lines.len(), world, "one line per rank:\n{stdout}");
    lines
}

#[test]
fn test_worker_passes_when_launched_three_way_by_the_agent() {
    let dir = scratch("accel-test-worker");
    let accel = bin("accel");
    let out = AgentCmd::new()
        .nproc(3)
        .no_python(&accel, &["test-worker"])
        .run(&dir, "agent", LIMIT);
    assert_eq!(
        out.code(),
        0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    let lines = worker_lines(&out.stdout, 3);
    for (r, line) in lines.iter().enumerate() {
        assert!(
            line.starts_with(&format!(
                "rank {r} of 3: all 3 processes reached each other through the store at 127.0.0.1:"
            )),
            "{line}"
        );
    }
}

#[test]
fn test_worker_speaks_pytorchs_tcpstore_protocol() {
    // PyTorch's own server (libuv backend) instead of the agent's store.
    let dir = scratch("accel-test-worker-torch");
    let script = r#"
import os, subprocess, sys
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE="2")
procs = [subprocess.Popen([sys.argv[1], "test-worker"], env=dict(env, RANK=str(r)))
         for r in range(2)]
codes = [p.wait(timeout=90) for p in procs]
print("codes", codes)
sys.exit(max(codes))
"#;
    let python = venv().join("bin/python");
    let accel = bin("accel");
    let cmd = with_private_hosts(
        &dir,
        &[
            python.to_str().expect("path"),
            "-c",
            script,
            accel.to_str().expect("path"),
        ],
    );
    let out = run_logged(cmd, &dir, "torch-store", LIMIT);
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    worker_lines(&out.stdout, 2);
}

fn worker_alone(name: &str, env: &[(&str, &str)]) -> (String, Duration) {
    let dir = scratch(name);
    let mut c = Command::new(bin("accel"));
    c.arg("test-worker");
    for k in [
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "ACCEL_TEST_TIMEOUT",
    ] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    let start = Instant::now();
    let out = run_logged(c, &dir, "worker", LIMIT);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", out.stdout);
    (out.stderr, start.elapsed())
}

#[test]
fn test_worker_with_a_bad_environment_fails_clearly() {
    let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29999")];

    let (err, _) = worker_alone("tw-no-addr", &base);
    assert!(
        err.starts_with(
            "accel: error: MASTER_ADDR is not set; `accel test-worker` runs inside a launch"
        ),
        "{err}"
    );

    let mut bad_host = base.to_vec();
    bad_host.push(("MASTER_ADDR", "no-such-host.invalid"));
    let (err, took) = worker_alone("tw-bad-host", &bad_host);
    assert!(
        err.contains("rank 0 of 2: cannot resolve the store address no-such-host.invalid:29999"),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(30),
        "no retries for a bad name: {took:?}"
    );

    // Nothing listens on the port: retried for ACCEL_TEST_TIMEOUT, then an error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
        .to_string();
    let refused = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port.as_str()),
        ("ACCEL_TEST_TIMEOUT", "1"),
    ];
    let (err, took) = worker_alone("tw-refused", &refused);
    assert!(
        err.contains(&format!(
            "rank 1 of 2: cannot connect to the store at 127.0.0.1:{port} within 1s"
        )),
        "{err}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");

    let mut bad_port = base.to_vec();
    bad_port.retain(|(k, _)| *k != "MASTER_PORT");
    bad_port.extend([("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "none")]);
    let (err, _) = worker_alone("tw-bad-port", &bad_port);
    assert!(err.contains("MASTER_PORT is \"none\""), "{err}");
}

/// Runs `accel test ARGS` with `env`; HF_HOME is a fresh directory.
fn accel_test(name: &str, args: &[&str], env: &[(&str, &str)]) -> accel_tests::Finished {
    let dir = scratch(name);
    let mut c = Command::new(bin("accel"));
    c.arg("test")
        .args(args)
        .current_dir(&dir)
        .env("HF_HOME", dir.join("hf"))
        .env_remove("PYTHON_EXEC")
        .envs(env.iter().copied());
    run_logged(c, &dir, "accel-test", LIMIT)
}

#[test]
fn accel_test_without_python_launches_the_builtin_check() {
    let out = accel_test(
        "accel-test-builtin",
        &[],
        &[("PYTHON_EXEC", "/nonexistent/python")],
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    worker_lines(&out.stdout, 2);
    assert_eq!(
        out.stdout.lines().last(),
        Some("Test is a success! You are ready for your distributed training!")
    );

    // The configuration's process count, when it has more.
    let dir = scratch("accel-test-builtin-config");
    let cfg = dir.join("cfg.yaml");
    std::fs::write(&cfg, "distributed_type: MULTI_GPU\nnum_processes: 3\n").expect("write");
    let out = accel_test(
        "accel-test-builtin-3",
        &["--config_file", cfg.to_str().expect("path")],
        &[("PYTHON_EXEC", "/nonexistent/python")],
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    worker_lines(&out.stdout, 3);

    // A configuration file that does not exist stops it before any launch.
    let out = accel_test(
        "accel-test-missing",
        &["--config_file", "/nonexistent/cfg.yaml"],
        &[("PYTHON_EXEC", "/nonexistent/python")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("/nonexistent/cfg.yaml"),
        "{}",
        out.stderr
    );
    assert!(!out.stdout.contains("success"), "{}", out.stdout);
}

#[test]
fn accel_test_runs_accelerates_test_script_when_python_has_accelerate() {
    let dir = scratch("accel-test-script-config");
    let cfg = dir.join("cpu2.yaml");
    std::fs::write(
        &cfg,
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n\
         use_cpu: true\nmixed_precision: 'no'\nnum_machines: 1\nmachine_rank: 0\n",
    )
    .expect("write");
    let path = accel_tests::venv_path();
    let run = || {
        accel_test(
            "accel-test-script",
            &["--config_file", cfg.to_str().expect("path")],
            &[("PATH", path.as_str())],
        )
    };
    // torch 2.13's CPU build sometimes aborts a gloo process at interpreter
    // exit, after the script's last check ("terminate called without an
    // active exception"); plain torchrun shows it as often (3 of 16 runs of
    // this script). Only that failure is retried.
    let mut out = run();
    for _ in 0..2 {
        if out.status.success()
            || !out
                .stderr
                .contains("terminate called without an active exception")
        {
            break;
        }
        out = run();
    }
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    // accelerate's script ran on both processes, to its last check.
    assert_eq!(
        out.stdout.matches("Num processes: 2").count(),
        2,
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("**Breakpoint trigger test**"),
        "{}",
        out.stdout
    );
    assert_eq!(
        out.stdout.lines().last(),
        Some("Test is a success! You are ready for your distributed training!")
    );
}
