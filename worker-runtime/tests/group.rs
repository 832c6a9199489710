//! Rust ranks under the real `accel-agent`, alone and in one process group
//! with Python ranks (real torch 2.13, gloo, CPU).
//!
//! The worker is this crate's `wr-collectives` binary; `workers/mixed.py` is
//! its Python twin. Both record what every collective returned; the tests
//! compare the records with values computed here. Needs root (private
//! `/etc/hosts`, see accel-tests) and `ACCEL_VENV`; the agent binaries must
//! be built first (`cargo build`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use accel_tests::{
    bin, read_json, run_logged, scratch, venv_path, with_private_hosts, Finished, Port, Server,
};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(240);

/// One multi-process job at a time: the machine may have two cores.
fn heavy() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn rust_worker() -> &'static str {
    env!("CARGO_BIN_EXE_wr-collectives")
}

fn python_worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/mixed.py")
}

/// What `wr-collectives check` and `mixed.py` must record on rank `r` of `n`.
fn expected(r: usize, n: usize) -> Value {
    let (rf, nf) = (r as f64, n as f64);
    let ranks_plus_one: f64 = (1..=n).map(|k| k as f64).sum();
    let ranks: f64 = (0..n).map(|k| k as f64).sum();
    let last = 100.0 * (nf - 1.0);
    let gathered: Vec<Value> = (0..n).map(|k| json!([k as f64, (k * k) as f64])).collect();
    json!({
        "sum": [ranks_plus_one, 0.5 * ranks_plus_one],
        "avg": [ranks_plus_one / nf, 10.0 * ranks_plus_one / nf],
        "min": [1.0, -nf],
        "max": [nf, -1.0],
        "broadcast_first": [1.0, 2.0],
        "broadcast_last": [last + 1.0, last + 2.0],
        "all_gather": gathered,
        "reduce_scatter": [10.0 * ranks + nf * rf, nf * rf - ranks],
    })
}

/// Checks every rank's record; `kinds[r]` is the language of rank `r`.
fn check_records(dir: &Path, kinds: &[&str]) {
    let n = kinds.len();
    for (r, kind) in kinds.iter().enumerate() {
        let rec = read_json(&dir.join(format!("rank{r}.json")));
        assert_eq!(rec["kind"], *kind, "rank {r}");
        assert_eq!(rec["world"], n, "rank {r}");
        assert_eq!(rec["results"], expected(r, n), "rank {r} ({kind})");
    }
}

fn agent(dir: &Path, args: &[&str]) -> Command {
    let agent = bin("accel-agent");
    let mut argv = vec![agent.to_str().expect("path")];
    argv.extend_from_slice(args);
    let mut cmd = with_private_hosts(dir, &argv);
    cmd.env("PATH", venv_path())
        .env("RECORD_DIR", dir)
        .env("ACCEL_LOG", "info");
    cmd
}

/// Runs the commands at once and waits for all.
fn run_all(dir: &Path, cmds: Vec<Command>) -> Vec<Finished> {
    let handles: Vec<_> = cmds
        .into_iter()
        .enumerate()
        .map(|(i, cmd)| {
            let dir = dir.to_path_buf();
            std::thread::spawn(move || run_logged(cmd, &dir, &format!("node{i}"), LIMIT))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("node thread"))
        .collect()
}

fn assert_ok(outs: &[Finished]) {
    for (i, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "node {i}: {:?}\n{}", o.status, o.stderr);
    }
}

#[test]
fn four_rust_ranks_on_one_agent() {
    let _heavy = heavy();
    let dir = scratch("wr-four");
    let cmd = agent(
        &dir,
        &[
            "--nproc-per-node",
            "4",
            "--no-python",
            rust_worker(),
            "check",
        ],
    );
    assert_ok(&run_all(&dir, vec![cmd]));
    check_records(&dir, &["rust"; 4]);
}

#[test]
fn rust_ranks_on_two_agents_through_rdzv_server() {
    let _heavy = heavy();
    let dir = scratch("wr-c10d");
    let server = Server::start();
    let cmds = (0..2)
        .map(|_| {
            agent(
                &dir,
                &[
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    &server.addr,
                    "--rdzv-id",
                    "wr-c10d",
                    "--local-addr",
                    "127.0.0.1",
                    "--no-python",
                    rust_worker(),
                    "check",
                ],
            )
        })
        .collect();
    assert_ok(&run_all(&dir, cmds));
    check_records(&dir, &["rust"; 4]);
}

/// Two agents, static rendezvous: node 0 runs `first`, node 1 runs `second`.
fn mixed_job(dir: &Path, first: &str, second: &str) {
    // Leased for the whole test (see accel_tests::lease).
    let leased = Port::lease();
    let port = leased.to_string();
    let python = python_worker();
    let cmds = [first, second]
        .iter()
        .enumerate()
        .map(|(node, kind)| {
            let node_rank = node.to_string();
            let mut args = vec![
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                &node_rank,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
            ];
            match *kind {
                "rust" => args.extend(["--no-python", rust_worker(), "check"]),
                _ => args.push(python.to_str().expect("path")),
            }
            agent(dir, &args)
        })
        .collect();
    assert_ok(&run_all(dir, cmds));
}

#[test]
fn python_and_rust_ranks_share_one_group() {
    let _heavy = heavy();
    // Python holds ranks 0-1 (and the first broadcast root), Rust 2-3.
    let dir = scratch("wr-mixed-py-first");
    mixed_job(&dir, "python", "rust");
    check_records(&dir, &["python", "python", "rust", "rust"]);
    // And the other way round: Rust is rank 0.
    let dir = scratch("wr-mixed-rust-first");
    mixed_job(&dir, "rust", "python");
    check_records(&dir, &["rust", "rust", "python", "python"]);
}

/// Runs `wr-collectives` directly with exactly `vars` as its environment.
fn direct(dir: &Path, name: &str, vars: &[(&str, &str)], args: &[&str]) -> Finished {
    let mut cmd = Command::new(rust_worker());
    cmd.env_clear().envs(vars.iter().copied()).args(args);
    cmd.env("RECORD_DIR", dir);
    run_logged(cmd, dir, name, LIMIT)
}

#[test]
fn bad_environment_names_the_variable() {
    let dir = scratch("wr-env");
    let out = direct(&dir, "empty", &[], &["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("WORLD_SIZE is not set") && out.stderr.contains("accel-agent"),
        "{}",
        out.stderr
    );

    let base = [
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];
    let mut vars = base.to_vec();
    vars.push(("RANK", "4"));
    let out = direct(&dir, "rank", &vars, &["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("RANK=\"4\" is invalid: must be below WORLD_SIZE=4"),
        "{}",
        out.stderr
    );

    let mut vars = base.to_vec();
    vars.extend([("RANK", "0"), ("MASTER_PORT", "http")]);
    let out = direct(&dir, "port", &vars, &["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("MASTER_PORT=\"http\" is invalid"),
        "{}",
        out.stderr
    );
}

#[test]
fn unreachable_store_is_an_error_not_an_abort() {
    let dir = scratch("wr-unreachable");
    // Leased for the whole test (see accel_tests::lease).
    let leased = Port::lease();
    let port = leased.to_string();
    let vars = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port.as_str()),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("WR_TIMEOUT_MS", "1000"),
    ];
    let out = direct(&dir, "client", &vars, &["check"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{:?}\n{}",
        out.status,
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "rank 1 of 2 could not join the process group at 127.0.0.1:{port}"
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn dead_peer_is_an_error_not_an_abort() {
    let _heavy = heavy();
    let dir = scratch("wr-dead-peer");
    // Leased for the whole test (see accel_tests::lease).
    let leased = Port::lease();
    let port = leased.to_string();
    // No agent: rank 0 hosts the store itself, as PyTorch's env:// does
    // without TORCHELASTIC_USE_AGENT_STORE. Rank 1 joins and exits at once.
    let vars = |rank: &'static str| {
        vec![
            ("RANK", rank),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", rank),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", port.as_str()),
            ("WR_TIMEOUT_MS", "60000"),
        ]
    };
    let cmds = [("0", "check"), ("1", "leave")]
        .into_iter()
        .map(|(rank, mode)| {
            let mut cmd = Command::new(rust_worker());
            cmd.env_clear().envs(vars(rank)).arg(mode);
            cmd
        })
        .collect();
    let outs = run_all(&dir, cmds);
    assert!(outs[1].status.success(), "leaver: {}", outs[1].stderr);
    let survivor = &outs[0];
    assert_eq!(
        survivor.status.code(),
        Some(1),
        "{:?}\n{}",
        survivor.status,
        survivor.stderr
    );
    assert!(
        survivor
            .stderr
            .contains("all_reduce failed on rank 0 (network error)"),
        "{}",
        survivor.stderr
    );
}
