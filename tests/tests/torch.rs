//! Conformance with real PyTorch (CPU, gloo) from the pinned venv, side by
//! side with torchrun where that makes the comparison.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use accel_tests::{
    path_with, read_json, run_logged, scratch, tested_torch, venv, venv_path, with_private_hosts,
    worker, AgentCmd, Finished, Port, PINNED_TORCH,
};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(240);

use crate::heavy;

/// `accel-agent` as `cmd` says, with the venv first on `PATH`.
fn accel(cmd: &AgentCmd) -> Command {
    accel_in(cmd, &venv())
}

/// The same with `venv` (another torch release's) first on `PATH`.
fn accel_in(cmd: &AgentCmd, venv: &Path) -> Command {
    let mut c = cmd.command();
    c.env("PATH", path_with(venv));
    c
}

/// Runs `nnodes` processes built by `make(node)` at once and waits for all.
fn run_nodes(
    dir: &Path,
    tag: &str,
    nnodes: usize,
    make: impl Fn(usize) -> Command,
) -> Vec<Finished> {
    let handles: Vec<_> = (0..nnodes)
        .map(|i| {
            let (cmd, dir, name) = (make(i), dir.to_path_buf(), format!("{tag}{i}"));
            std::thread::spawn(move || run_logged(cmd, &dir, &name, LIMIT))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("node thread"))
        .collect()
}

fn assert_all_ok(outs: &[Finished], what: &str) {
    for (i, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "{what} node {i} failed ({:?}):\n{}",
            o.status,
            o.stderr
        );
    }
}

/// Two accel agents (static rendezvous) × 2 workers, each node's command
/// line completed by `job` (its program, further flags, environment).
fn accel_2x2(dir: &Path, tag: &str, job: impl Fn(AgentCmd) -> AgentCmd) -> Vec<Finished> {
    accel_2x2_in(&venv(), dir, tag, job)
}

/// The same with `venv`'s python.
fn accel_2x2_in(
    venv: &Path,
    dir: &Path,
    tag: &str,
    job: impl Fn(AgentCmd) -> AgentCmd,
) -> Vec<Finished> {
    let port = Port::lease();
    run_nodes(dir, tag, 2, |node| {
        accel_in(
            &job(AgentCmd::static_node(&port, node).nnodes(2).nproc(2)),
            venv,
        )
    })
}

/// On the oldest and the newest torch tested (the pinned one is compared
/// with torchrun above): a DDP job whose rank fails at step 17 restarts
/// once, job-wide, resumes from the step-15 checkpoint with the same
/// parameters on every rank, and ends where the uninterrupted job does.
#[test]
fn ddp_job_restarts_from_its_checkpoint_on_the_oldest_and_newest_torch() {
    let _heavy = heavy();
    let script = worker("ddp_train.py");
    for (version, tv) in tested_torch()
        .into_iter()
        .filter(|(v, _)| v != PINNED_TORCH)
    {
        let root = scratch(&format!("ddp-torch{version}"));
        let (ck, out) = dirs(&root, "fail");
        let outs = accel_2x2_in(&tv, &root, "fail", |c| {
            c.max_restarts(1)
                .program(&script, &[&ck, &out, "--fail-at", "17"])
        });
        assert_all_ok(&outs, &format!("torch {version} (failing)"));
        let resumed = final_states(Path::new(&out));
        let (ck, out) = dirs(&root, "clean");
        let outs = accel_2x2_in(&tv, &root, "clean", |c| c.program(&script, &[&ck, &out]));
        assert_all_ok(&outs, &format!("torch {version} (clean)"));
        let clean = final_states(Path::new(&out));
        for r in &resumed {
            assert_eq!(r["restart"], 1, "torch {version}: one job-wide restart");
            assert_eq!(r["start"], 15, "torch {version}: resumed at step 15");
            assert_eq!(
                r["params"], resumed[0]["params"],
                "torch {version}: parameters identical on every rank"
            );
        }
        let (l_resumed, l_clean) = (
            resumed[0]["loss"].as_f64().expect("loss"),
            clean[0]["loss"].as_f64().expect("loss"),
        );
        assert!(
            (l_resumed - l_clean).abs() < 1e-5,
            "torch {version}: final loss {l_resumed} vs uninterrupted {l_clean}"
        );
    }
}

#[test]
fn gloo_all_reduce_two_agents_two_workers() {
    let _heavy = heavy();
    let dir = scratch("gloo");
    let rec = dir.to_string_lossy().to_string();
    let outs = accel_2x2(&dir, "node", |c| {
        c.script(worker("allreduce.py")).env("RECORD_DIR", &rec)
    });
    assert_all_ok(&outs, "accel");
    for rank in 0..4 {
        let v = read_json(&dir.join(format!("allreduce_{rank}.json")));
        assert_eq!(v["world"], 4);
        assert_eq!(v["sum"], 10.0, "1+2+3+4 on rank {rank}");
    }
}

fn final_states(out: &Path) -> Vec<Value> {
    (0..4)
        .map(|r| read_json(&out.join(format!("final_{r}.json"))))
        .collect()
}

fn dirs(root: &Path, name: &str) -> (String, String) {
    let (ck, out) = (root.join(name).join("ckpt"), root.join(name).join("out"));
    std::fs::create_dir_all(&ck).expect("ckpt dir");
    std::fs::create_dir_all(&out).expect("out dir");
    (
        ck.to_string_lossy().into_owned(),
        out.to_string_lossy().into_owned(),
    )
}

#[test]
fn ddp_job_restarts_from_its_checkpoint_like_torchrun() {
    let _heavy = heavy();
    let root = scratch("ddp");
    let script = worker("ddp_train.py");
    // accel, one worker failing at step 17 of 30, checkpoints every 5 steps.
    let (ck, out) = dirs(&root, "accel-fail");
    let outs = accel_2x2(&root, "accel-fail", |c| {
        c.max_restarts(1)
            .program(&script, &[&ck, &out, "--fail-at", "17"])
    });
    assert_all_ok(&outs, "accel (failing)");
    let resumed = final_states(Path::new(&out));
    // accel with hot restart: the same failing job, workers forked from a
    // zygote that preloaded torch.
    let (ck, out) = dirs(&root, "accel-hot");
    let outs = accel_2x2(&root, "accel-hot", |c| {
        c.max_restarts(1)
            .flag("--preload", "torch")
            .program(&script, &[&ck, &out, "--fail-at", "17"])
    });
    assert_all_ok(&outs, "accel --preload torch (failing)");
    for o in &outs {
        assert!(
            o.stderr.contains("zygote ready") && !o.stderr.contains("start cold"),
            "workers were forked from the zygote:\n{}",
            o.stderr
        );
    }
    let hot = final_states(Path::new(&out));
    // accel, uninterrupted.
    let (ck, out) = dirs(&root, "accel-clean");
    assert_all_ok(
        &accel_2x2(&root, "accel-clean", |c| c.program(&script, &[&ck, &out])),
        "accel (clean)",
    );
    let clean = final_states(Path::new(&out));
    // torchrun, the same failing job. It restarts only without its shared store (PyTorch #135712).
    // torchrun counts restarts per agent and restarts each node on its own,
    // which races under load (a node can spend its budget on the cascade and
    // leave its peer waiting): a failed torchrun run is run again, up to three
    // times, each with fresh directories. Only torchrun gets this allowance.
    let torchrun_bin = venv().join("bin/torchrun");
    let mut torchrun_out = None;
    for attempt in 0..3 {
        let name = format!("torchrun-fail-{attempt}");
        let (ck, out) = dirs(&root, &name);
        let port = Port::lease();
        let outs = run_nodes(&root, &name, 2, |_| {
            let endpoint = format!("localhost:{port}");
            let mut c = with_private_hosts(
                &root,
                &[
                    torchrun_bin.to_str().expect("path"),
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    &endpoint,
                    "--rdzv-id",
                    "ddp",
                    "--rdzv-conf",
                    "join_timeout=60",
                    "--max-restarts",
                    "1",
                    script.to_str().expect("path"),
                    &ck,
                    &out,
                    "--fail-at",
                    "17",
                ],
            );
            c.env("PATH", venv_path())
                .env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1");
            c
        });
        if outs.iter().all(|o| o.status.success()) {
            torchrun_out = Some(out);
            break;
        }
        eprintln!("torchrun attempt {attempt} failed; see {}", root.display());
    }
    let out = torchrun_out.expect("torchrun completed the failing job in one of three attempts");
    let torchrun = final_states(Path::new(&out));

    for r in &resumed {
        assert_eq!(r["restart"], 1, "one job-wide restart");
        assert_eq!(r["start"], 15, "resumed from the step-15 checkpoint");
        assert_eq!(
            r["params"], resumed[0]["params"],
            "parameters identical on every rank"
        );
    }
    for (h, c) in hot.iter().zip(&resumed) {
        assert_eq!((&h["restart"], &h["start"]), (&c["restart"], &c["start"]));
        assert_eq!(
            h["params"], c["params"],
            "hot restart ends bit-identical to the cold one (rank {})",
            c["rank"]
        );
        assert_eq!(h["loss"], c["loss"]);
    }
    for (a, t) in resumed.iter().zip(&torchrun) {
        assert_eq!(t["start"], 15);
        assert_eq!(
            a["params"], t["params"],
            "bit-identical to torchrun's resumed run (rank {})",
            a["rank"]
        );
    }
    let (l_resumed, l_clean) = (
        resumed[0]["loss"].as_f64().expect("loss"),
        clean[0]["loss"].as_f64().expect("loss"),
    );
    assert!(
        (l_resumed - l_clean).abs() < 1e-5,
        "final loss {l_resumed} vs uninterrupted {l_clean}"
    );
}

/// The torch release in `venv` (its version without a local part).
fn torch_version(venv: &Path) -> String {
    let out = Command::new(venv.join("bin/python"))
        .args(["-c", "import torch; print(torch.__version__.split('+')[0])"])
        .output()
        .expect("run python");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn env_of(dir: &Path, rank: u32) -> BTreeMap<String, String> {
    serde_json::from_value(read_json(&dir.join(format!("env_{rank}.json")))).expect("env map")
}

/// On every torch release tested, against that release's torchrun.
#[test]
fn workers_see_the_environment_torchrun_gives() {
    for (version, venv) in tested_torch() {
        environment_matches_torchrun(&format!("envcmp-{version}"), &[], &venv);
    }
}

#[test]
fn hot_restarted_workers_see_the_environment_torchrun_gives() {
    environment_matches_torchrun("envcmp-hot", &["--preload", "torch"], &venv());
}

/// torchrun's and accel's workers of the same job (accel with `flags`
/// added), both with `venv`'s torch, see the same environment.
fn environment_matches_torchrun(name: &str, flags: &[&str], venv: &Path) {
    let _heavy = heavy();
    let root = scratch(name);
    let (a_dir, t_dir) = (root.join("accel"), root.join("torchrun"));
    std::fs::create_dir_all(&a_dir).expect("dir");
    std::fs::create_dir_all(&t_dir).expect("dir");
    let script = worker("dump_env.py");
    let job = AgentCmd::standalone()
        .nproc(2)
        .max_restarts(2)
        .flag("--role", "trainer")
        .script(&script);
    // Both launchers start in the same directory, with PWD saying so.
    // Both launchers get the same small environment and start in the same directory.
    let same_env = |cmd: &mut Command, record_dir: &Path| {
        cmd.env_clear()
            .env("PATH", path_with(venv))
            .env("HOME", std::env::var("HOME").unwrap_or_default())
            .env("LANG", "C.UTF-8")
            .env("RECORD_DIR", record_dir)
            .env("PWD", &root)
            .current_dir(&root);
    };
    let mut cmd = accel_in(&job.clone().flags(flags), venv);
    same_env(&mut cmd, &a_dir);
    let out = run_logged(cmd, &root, "accel", LIMIT);
    assert!(out.status.success(), "{}", out.stderr);
    let torchrun = venv.join("bin/torchrun");
    let args = job.args();
    let mut targs = vec![torchrun.to_str().expect("path")];
    targs.extend(args.iter().map(String::as_str));
    let mut cmd = with_private_hosts(&root, &targs);
    same_env(&mut cmd, &t_dir);
    let out = run_logged(cmd, &root, "torchrun", LIMIT);
    assert!(out.status.success(), "{}", out.stderr);

    // What torchrun of an older torch does not set yet and accel sets for
    // every torch (ignored by a torch that does not read it).
    // And what it sets otherwise: torch 2.4's torchrun has rank 0's worker
    // host the workers' store (`TORCHELASTIC_USE_AGENT_STORE=False`); accel's
    // agent always serves it, which torch 2.4's workers honour (they join
    // it as clients: the DDP test on torch 2.4 runs that way).
    let (lacks, values): (&[&str], &[(&str, &str, &str)]) = match torch_version(venv).as_str() {
        "2.4.1" => (
            &["TORCHELASTIC_SIGNALS_TO_HANDLE"],
            &[("TORCHELASTIC_USE_AGENT_STORE", "True", "False")],
        ),
        _ => (&[], &[]),
    };
    // Intended differences: per-run values (ports, run ids, paths), the test's own
    // RECORD_DIR, MASTER_ADDR of a one-node job (accel: 127.0.0.1, no name lookup),
    // and accel's progress socket (`accel.progress`; torchrun has none).
    let differ = [
        "ACCEL_PROGRESS_SOCKET",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE",
        "RECORD_DIR",
        "MASTER_ADDR",
        "_",
    ];
    for rank in 0..2 {
        let (a, t) = (env_of(&a_dir, rank), env_of(&t_dir, rank));
        let keys = |m: &BTreeMap<String, String>| {
            m.keys()
                .filter(|k| !differ.contains(&k.as_str()) && !lacks.contains(&k.as_str()))
                .cloned()
                .collect::<Vec<_>>()
        };
        for k in lacks {
            assert!(a.contains_key(*k), "accel sets {k} (rank {rank})");
            assert!(
                !t.contains_key(*k),
                "this torchrun now sets {k}: drop it from `lacks`"
            );
        }
        assert_eq!(keys(&a), keys(&t), "same variables (rank {rank})");
        for k in keys(&a) {
            if let Some((_, ours, theirs)) = values.iter().find(|(n, _, _)| *n == k) {
                assert_eq!((a[&k].as_str(), t[&k].as_str()), (*ours, *theirs), "{k}");
                continue;
            }
            assert_eq!(a[&k], t[&k], "{k} of rank {rank}");
        }
        assert_eq!(a["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(t["MASTER_ADDR"], "localhost");
        let tail = format!("/attempt_0/{rank}/error.json");
        assert!(
            a["TORCHELASTIC_ERROR_FILE"].ends_with(&tail)
                && t["TORCHELASTIC_ERROR_FILE"].ends_with(&tail)
        );
        assert_eq!(
            a["TORCHELASTIC_RUN_ID"].len(),
            t["TORCHELASTIC_RUN_ID"].len(),
            "both are UUIDs"
        );
    }
}

/// Every TCPStore command of every torch release tested (its client, and
/// its own server for the comparison).
#[test]
fn pytorch_store_client_gets_the_same_answers_from_the_agent_store() {
    let _heavy = heavy();
    for (version, venv) in tested_torch() {
        store_answers_match(&version, &venv);
    }
}

fn store_answers_match(version: &str, venv: &Path) {
    let dir = scratch(&format!("storeops-{version}"));
    let script = worker("store_ops.py");
    let python = venv.join("bin/python");
    let ours = dir.join("agent.json");
    let theirs = dir.join("torch.json");
    let out = run_logged(
        accel_in(
            &AgentCmd::new().no_python(
                &python,
                &[
                    script.to_str().expect("path"),
                    ours.to_str().expect("path"),
                    "agent",
                ],
            ),
            venv,
        ),
        &dir,
        "agent",
        LIMIT,
    );
    assert!(out.status.success(), "torch {version}: {}", out.stderr);
    let mut c = with_private_hosts(
        &dir,
        &[
            python.to_str().expect("path"),
            script.to_str().expect("path"),
            theirs.to_str().expect("path"),
            "torch",
        ],
    );
    c.env("PATH", path_with(venv));
    let out = run_logged(c, &dir, "torch", LIMIT);
    assert!(out.status.success(), "{}", out.stderr);
    let (ours, theirs) = (read_json(&ours), read_json(&theirs));
    let (ours, theirs) = (
        ours.as_array().expect("list"),
        theirs.as_array().expect("list"),
    );
    assert!(theirs.len() > 40, "torch {version}: every operation ran");
    assert_eq!(ours.len(), theirs.len());
    for (o, t) in ours.iter().zip(theirs) {
        assert_eq!(o, t, "torch {version}: operation {}", t[0]);
    }
}

#[test]
fn no_worker_reads_a_key_from_an_earlier_round() {
    let _heavy = heavy();
    let dir = scratch("hygiene");
    let rec = dir.to_string_lossy().to_string();
    let outs = accel_2x2(&dir, "node", |c| {
        c.max_restarts(1)
            .script(worker("store_hygiene.py"))
            .env("RECORD_DIR", &rec)
    });
    assert_all_ok(&outs, "accel");
    let mut ports = Vec::new();
    for rank in 0..4 {
        let first = read_json(&dir.join(format!("hygiene_0_{rank}.json")));
        assert_eq!(first["wrote"], true);
        let second = read_json(&dir.join(format!("hygiene_1_{rank}.json")));
        assert_eq!(
            second["sees_stale"],
            serde_json::json!([false, false, false, false]),
            "rank {rank}"
        );
        assert_eq!(second["sees_counter"], false);
        assert!(
            second["keys"]
                .as_array()
                .expect("keys")
                .iter()
                .all(|k| !k.as_str().unwrap_or("").starts_with("attempt0")),
            "{}",
            second["keys"]
        );
        ports.push((first["port"].clone(), second["port"].clone()));
    }
    assert!(
        ports.iter().all(|(a, b)| a != b),
        "each round has its own store"
    );
}

#[test]
fn record_errors_reach_every_node_as_the_job_wide_root_cause() {
    let _heavy = heavy();
    let server = accel_tests::Server::start();
    let dir = scratch("record");
    let script = worker("raise.py");
    let outs = run_nodes(&dir, "node", 2, |node| {
        let logs = dir.join(format!("logs{node}"));
        let parent = dir.join(format!("parent{node}.json"));
        accel(
            &AgentCmd::c10d(&server.addr, "record")
                .nnodes(2)
                .nproc(2)
                .log_dir(&logs)
                .script(&script)
                .env("FAIL_RANK", "3")
                .env("TORCHELASTIC_ERROR_FILE", parent.to_str().expect("path")),
        )
    });
    for (node, out) in outs.iter().enumerate() {
        assert_eq!(out.status.code(), Some(1), "node {node}: {}", out.stderr);
        let summary = &out.stderr[out
            .stderr
            .find(" FAILED\n")
            .unwrap_or_else(|| panic!("no summary: {}", out.stderr))..];
        let root = &summary[summary
            .find("Root Cause (first observed failure):")
            .expect("root cause")..];
        assert!(
            root.contains("  rank      : 3 (local_rank: 1)\n"),
            "node {node}: {root}"
        );
        assert!(root.contains("  exitcode  : 1 (pid: "), "{root}");
        assert!(root.contains("ValueError: boom from rank 3"), "{root}");
        assert!(root.contains("/attempt_0/1/error.json"), "{root}");
        let parent = read_json(&dir.join(format!("parent{node}.json")));
        assert_eq!(parent["message"]["errorCode"], 1, "node {node}");
        assert_eq!(parent["message"]["message"], "ValueError: boom from rank 3");
        assert!(parent["message"]["extraInfo"]["py_callstack"]
            .as_str()
            .unwrap_or("")
            .contains("raise ValueError"));
    }
    // The failing node lists its other, stopped worker; the other node has none of its own.
    assert!(
        outs[0].stderr.contains("<NO_OTHER_FAILURES>")
            ^ outs[1].stderr.contains("<NO_OTHER_FAILURES>")
    );
    let failing = if outs[0].stderr.contains("<NO_OTHER_FAILURES>") {
        &outs[1]
    } else {
        &outs[0]
    };
    assert!(
        failing
            .stderr
            .contains("  rank      : 2 (local_rank: 0)\n  exitcode  : -15"),
        "{}",
        failing.stderr
    );
    // The worker's own error file, as @record wrote it.
    let logs = dir.join("logs0").join("..");
    let found: Vec<std::path::PathBuf> = ["logs0", "logs1"]
        .iter()
        .flat_map(|l| {
            std::fs::read_dir(logs.join(l))
                .expect("logs")
                .map(|e| e.expect("e").path().join("attempt_0/1/error.json"))
        })
        .filter(|p| p.exists())
        .collect();
    assert_eq!(found.len(), 1, "only rank 3 wrote an error file: {found:?}");
    let e = read_json(&found[0]);
    assert_eq!(e["message"]["message"], "ValueError: boom from rank 3");
    assert!(e["message"]["extraInfo"]["timestamp"]
        .as_str()
        .is_some_and(|t| t.parse::<u64>().is_ok()));
}
