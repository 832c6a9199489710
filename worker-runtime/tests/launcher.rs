//! The function and debug launchers (`wr-launch`, this crate's test
//! program), and the example training program resumed from a checkpoint
//! after an injected failure, under two real `accel-agent`s. Needs root
//! (private `/etc/hosts`) and the agent binaries (`cargo build`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use accel_tests::{bin, read_json, run_logged, scratch, with_private_hosts, Finished, Port};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(240);

fn heavy() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn launch(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Finished {
    let mut argv = vec![env!("CARGO_BIN_EXE_wr-launch")];
    argv.extend_from_slice(args);
    let mut cmd = with_private_hosts(dir, &argv);
    cmd.envs(env.iter().copied())
        .env_remove("CUDA_VISIBLE_DEVICES");
    run_logged(cmd, dir, name, LIMIT)
}

fn records(dir: &Path) -> Vec<Value> {
    let mut recs: Vec<(String, Value)> = fs::read_dir(dir)
        .expect("records")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                read_json(&e.path()),
            )
        })
        .collect();
    recs.sort_by(|a, b| a.0.cmp(&b.0));
    recs.into_iter().map(|(_, v)| v).collect()
}

#[test]
fn function_launcher_runs_ranks_and_restarts_them() {
    let _heavy = heavy();
    let dir = scratch("wr-launch");
    let out = dir.join("out");
    fs::create_dir_all(&out).expect("out");
    let o = out.to_str().expect("path");
    let done = launch(&dir, "run", &["run", "3", o], &[("FAIL_RANK", "1")]);
    assert!(done.status.success(), "{}", done.stderr);
    let recs = records(&out);
    assert_eq!(
        recs.len(),
        3,
        "one record per rank of the restarted attempt: {recs:?}"
    );
    for (r, rec) in recs.iter().enumerate() {
        assert_eq!(rec["rank"], r, "{rec}");
        assert_eq!(rec["world"], 3);
        assert_eq!(rec["sum"], 6.0, "1 + 2 + 3 across the group");
        assert_eq!(
            rec["restart"], 1,
            "rank 1 failed the first attempt; the job restarted"
        );
        assert_eq!(rec["debug"], "");
        assert_eq!(rec["cuda_visible"], Value::Null);
    }
    assert!(done.stderr.contains("injected failure"), "{}", done.stderr);
}

#[test]
fn a_failed_function_is_the_root_cause_in_the_summary() {
    let _heavy = heavy();
    let dir = scratch("wr-launch-fail");
    let out = dir.join("out");
    fs::create_dir_all(&out).expect("out");
    let done = launch(
        &dir,
        "fail",
        &["run", "2", out.to_str().expect("path")],
        &[("FAIL_RANK", "1"), ("FAIL_ALWAYS", "1")],
    );
    assert_eq!(
        done.code(),
        1,
        "the job fails after its one restart: {}",
        done.stderr
    );
    let err = &done.stderr;
    assert!(err.contains("Root Cause"), "{err}");
    assert!(
        err.contains("traceback : injected failure on attempt 1"),
        "the rank's own error, read from its error file: {err}"
    );
    assert!(
        !err.contains("error_file: <N/A>\n  traceback : injected"),
        "{err}"
    );
}

#[test]
fn debug_launcher_hides_gpus() {
    let _heavy = heavy();
    let dir = scratch("wr-debug");
    let out = dir.join("out");
    fs::create_dir_all(&out).expect("out");
    let done = launch(
        &dir,
        "debug",
        &["debug", "2", out.to_str().expect("path")],
        &[],
    );
    assert!(done.status.success(), "{}", done.stderr);
    let recs = records(&out);
    assert_eq!(recs.len(), 2, "{recs:?}");
    for rec in &recs {
        assert_eq!(rec["sum"], 3.0);
        assert_eq!(rec["debug"], "1");
        assert_eq!(
            rec["cuda_visible"], "",
            "no GPU is visible in a debug launch"
        );
    }
}

#[test]
fn launching_after_creating_a_group_is_refused() {
    let dir = scratch("wr-after-group");
    let done = launch(&dir, "after", &["after-group"], &[]);
    assert_eq!(done.code(), 1, "{}", done.stderr);
    assert!(
        done.stderr.contains("already created a process group"),
        "{}",
        done.stderr
    );
}

fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let debug = exe.parent().and_then(Path::parent).expect("target dir");
    let path = debug.join("examples/ddp_train");
    assert!(
        path.exists(),
        "{} is missing: cargo build -p worker-runtime --examples",
        path.display()
    );
    path
}

/// Two agents × two Rust ranks train the example; returns each rank's final
/// parameters.
fn train(dir: &Path, name: &str, fail: bool) -> Vec<String> {
    // Leased for the whole test (see accel_tests::lease).
    let leased = Port::lease();
    let port = leased.to_string();
    let ckpt = dir.join(format!("{name}-checkpoints"));
    let out = dir.join(format!("{name}-out"));
    let example = example();
    let agent = bin("accel-agent");
    let handles: Vec<_> = (0..2)
        .map(|node| {
            let node_rank = node.to_string();
            let argv = [
                agent.to_str().expect("path"),
                "--nnodes",
                "2",
                "--node-rank",
                &node_rank,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "1",
                "--no-python",
                example.to_str().expect("path"),
            ];
            let mut cmd = with_private_hosts(dir, &argv);
            cmd.env("CHECKPOINT_DIR", &ckpt).env("OUT_DIR", &out);
            if fail {
                cmd.env("FAIL_AT_STEP", "17").env("FAIL_RANK", "3");
            }
            let dir = dir.to_path_buf();
            let log = format!("{name}-node{node}");
            std::thread::spawn(move || run_logged(cmd, &dir, &log, LIMIT))
        })
        .collect();
    let mut logs = String::new();
    for h in handles {
        let done = h.join().expect("node");
        assert!(done.status.success(), "{name}: {}", done.stderr);
        logs.push_str(&done.stdout);
        logs.push_str(&done.stderr);
    }
    if fail {
        assert!(logs.contains("injected failure at step 17"), "{logs}");
        assert!(logs.contains("resuming from step 15 (attempt 1)"), "{logs}");
    }
    (0..4)
        .map(|r| fs::read_to_string(out.join(format!("rank{r}.params"))).expect("params"))
        .collect()
}

#[test]
fn example_resumes_from_its_checkpoint_after_a_failure() {
    let _heavy = heavy();
    let dir = scratch("wr-train");
    let clean = train(&dir, "clean", false);
    let resumed = train(&dir, "resumed", true);
    for r in 1..4 {
        assert_eq!(clean[r], clean[0], "every rank holds the same parameters");
        assert_eq!(resumed[r], resumed[0]);
    }
    assert_eq!(
        resumed[0], clean[0],
        "resuming from step 15 reproduces the uninterrupted run bit for bit"
    );
}
