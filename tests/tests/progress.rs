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
/// `rdzv-server status` (text and JSON) while the job runs, with the hang
/// timeout its ranks learned.
#[test]
fn the_running_rounds_step_is_in_status() {
    let server = accel_tests::Server::start();
    let dir = scratch("progress-status");
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let agent = AgentCmd::c10d(&server.addr, "stepping")
        .nnodes(1)
        .nproc(2)
        .conf("keep_alive_interval=0.5")
        .arg("--learned-hang-timeouts")
        .flag("--hang-timeout-floor", 2)
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
    // Its steps (5 ms) learned a timeout: the floor, 2 s.
    assert!(text.contains("  hang timeout 2.0s (learned)"), "{text}");
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

/// Goodput: a 2x2 gloo DDP job that reports its steps and checkpoints
/// every 10, one rank killed at step 35. The rendezvous charges the 5 steps
/// redone (30 -> 35) to recomputation, the time from the kill to the next
/// first step to recovery, the rest to productive, start-up and waiting;
/// the categories add up to the job's wall time (the server's exactly, the
/// test's own clock within 1 %). The same numbers in `status --json`, the
/// text status, the metrics, the status page (headless Chromium) and each
/// agent's end line.
#[test]
fn a_ddp_job_killed_at_step_35_is_charged_5_recomputed_steps_and_its_recovery() {
    let _heavy = crate::heavy();
    let server = accel_tests::Server::start();
    let metrics = server.metrics.clone().expect("metrics");
    let dir = scratch("goodput-ddp");
    let (ck, out) = (dir.join("ckpt"), dir.join("out"));
    for d in [&ck, &out] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let (ck, out) = (ck.display().to_string(), out.display().to_string());
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let script = worker("ddp_train.py");
    let args = [
        &ck,
        &out,
        "--steps",
        "80",
        "--ckpt-every",
        "10",
        "--fail-at",
        "35",
        "--fail-kill",
        "--step-sleep",
        "0.1",
        "--progress",
    ];
    let started = std::time::Instant::now();
    let agents: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            AgentCmd::c10d(&server.addr, "goodput")
                .nnodes(2)
                .nproc(2)
                .max_restarts(2)
                .conf("keep_alive_interval=0.5")
                .env("PYTHONPATH", python.display())
                .program(&script, &args)
                .start(&dir, name)
        })
        .collect();
    let outs: Vec<_> = agents.into_iter().map(|a| a.wait(LIMIT)).collect();
    let observed = started.elapsed().as_secs_f64();
    for o in &outs {
        assert_eq!(o.code(), 0, "{}", o.stderr);
        assert!(
            o.stderr.contains("job time: goodput ")
                && o.stderr.contains("recomputation ")
                && o.stderr.contains("(5 steps)")
                && o.stderr.contains("(1 restart)"),
            "each agent says where the job's time went: {}",
            o.stderr
        );
    }
    let jobs = accel_tests::status_jobs(&server.addr, &[]).expect("status");
    let g = &jobs[0]["goodput"];
    let s = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("{k}: {g}"));
    let categories = [
        "productive_s",
        "recomputation_s",
        "recovery_s",
        "start_up_s",
        "waiting_s",
    ];
    let sum: f64 = categories.iter().map(|k| s(k)).sum();
    assert!((sum - s("wall_s")).abs() < 0.006, "{g}");
    assert!(
        (sum - observed).abs() <= 0.01 * observed,
        "the categories ({sum:.3} s) add up to the job's wall time ({observed:.3} s) within 1 %: {g}"
    );
    let loss = &g["losses"][0];
    assert_eq!(
        (&loss["step"], &loss["checkpoint"], &loss["lost_steps"]),
        (&35.into(), &30.into(), &5.into()),
        "{g}"
    );
    assert_eq!((&g["restarts"], &g["lost_steps"]), (&1.into(), &5.into()));
    // 5 steps of 0.1 s (and their arithmetic), but not whole seconds.
    let recomputation = s("recomputation_s");
    assert!((0.4..2.5).contains(&recomputation), "{g}");
    assert_eq!(loss["recomputation_s"].as_f64(), Some(recomputation), "{g}");
    // The new workers' start (a Python with torch, gloo, the checkpoint).
    assert!(
        s("recovery_s") > 0.5 && loss["recovery_s"].as_f64() == Some(s("recovery_s")),
        "{g}"
    );
    // 80 steps done once, 0.1 s each at least.
    assert!(s("productive_s") >= 8.0 && s("start_up_s") > 0.5, "{g}");
    // The same in the text status.
    let text = std::process::Command::new(accel_tests::bin("rdzv-server"))
        .args(["status", "--rdzv-endpoint", &server.addr])
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("  goodput ")
            && text.contains("(5 steps)")
            && text.contains("(5 steps, 30->35): worker rank "),
        "{text}"
    );
    // The same in the metrics.
    let (_, exposition) = accel_tests::http_get(&metrics, "/metrics").expect("metrics");
    for (key, category) in categories.iter().zip([
        "productive",
        "recomputation",
        "recovery",
        "start-up",
        "waiting",
    ]) {
        let series =
            format!("accel_rdzv_job_seconds{{rdzv_id=\"goodput\",category=\"{category}\"}}");
        let got = accel_tests::sample(&exposition, &series)
            .unwrap_or_else(|| panic!("{series}: {exposition}"));
        assert!((got - s(key)).abs() < 0.002, "{series} {got} vs {}", s(key));
        let total = format!("accel_rdzv_job_time_seconds_total{{category=\"{category}\"}}");
        let got = accel_tests::sample(&exposition, &total)
            .unwrap_or_else(|| panic!("{total}: {exposition}"));
        assert!((got - s(key)).abs() < 0.002, "{total} {got} vs {}", s(key));
    }
    // The same on the status page: the time bar, its totals, the restart.
    let dom = crate::status_page::dump_dom(&dir, &format!("http://{metrics}/"), 3000);
    for (key, category) in categories.iter().zip([
        "productive",
        "recomputation",
        "recovery",
        "start-up",
        "waiting",
    ]) {
        let shown = format!(
            "class=\"key key-{category}\" data-category=\"{category}\" data-ms=\"{}\"",
            (s(key) * 1000.0).round()
        );
        assert!(dom.contains(&shown), "{shown}: {dom}");
    }
    assert!(dom.contains("class=\"seg seg-recomputation\""), "{dom}");
    assert!(dom.contains("class=\"loss\" data-round=\"0\""), "{dom}");
    assert!(dom.contains("(5 steps, 30→35)"), "{dom}");
}

/// A two-worker job of `steps` jittery steps (`STEP_S` +/- 50 %) with
/// `--learned-hang-timeouts` (a floor of 1 s).
fn jittery(dir: &Path, steps: u32, step_s: f64) -> AgentCmd {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    AgentCmd::new()
        .nproc(2)
        .max_restarts(1)
        .arg("--learned-hang-timeouts")
        .flag("--hang-timeout-floor", 1)
        .flag("--first-step-timeout", 60)
        .env("CKPT_DIR", dir.display())
        .env("STEPS", steps)
        .env("STEP_S", step_s)
        .env("PYTHONPATH", python.display())
        .script(worker("hang_job.py"))
}

/// A rank that stops making progress is caught by the timeout learned
/// from its steps (here the floor, 1 s, as 3 x its ~30 ms steps is less),
/// its stacks (py-spy's, where it sleeps) are in the failure report, and
/// the job restarts and finishes.
#[test]
fn a_rank_that_stops_stepping_is_caught_by_its_learned_timeout_and_the_job_restarts() {
    let dir = scratch("learned-hang");
    let logs = dir.join("logs");
    let out = jittery(&dir, 200, 0.02)
        .env("HANG_AT", 100)
        .log_dir(&logs)
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert_eq!(attempts(&dir), 2, "one restart: {}", out.stderr);
    let verdict = out
        .stderr
        .lines()
        .find(|l| l.contains("rank 0 made no progress for "))
        .unwrap_or_else(|| panic!("no verdict: {}", out.stderr));
    // `made no progress for S (timeout T, learned from its step times ...`
    let secs = |after: &str| -> f64 {
        let rest = &verdict[verdict.find(after).expect(after) + after.len()..];
        rest[..rest.find('s').expect("s")].parse().expect("seconds")
    };
    let (silent, timeout) = (secs("made no progress for "), secs("(timeout "));
    assert!((timeout - 1.0).abs() < 1e-9, "the floor applies: {verdict}");
    assert!(
        silent <= timeout + 0.5,
        "caught within a check or two of its timeout: {verdict}"
    );
    assert!(verdict.contains("learned from its step times"), "{verdict}");
    // The failure report (the hung rank's error file, torch's format):
    // the verdict, its stacks (py-spy's, where it sleeps), every rank's.
    let reports: Vec<String> = files_named(&logs, "error.json")
        .iter()
        .map(|f| std::fs::read_to_string(f).expect("error file"))
        .collect();
    assert!(
        reports
            .iter()
            .any(|r| r.contains("rank 0 made no progress for ")
                && r.contains("stuck_between_steps (hang_job.py:")
                && r.contains("Every rank's stacks when rank 0 hung")),
        "the hung rank's stacks are in its failure report: {reports:?}"
    );
    assert!(
        out.stdout.contains("rank 0 attempt 1 done"),
        "{}",
        out.stdout
    );
}

/// No false hang: 1,000 steps of 20 ms +/- 50 % (and checkpoints of 1.5 s,
/// longer than the floor, in `accel.section("checkpoint")`) run through
/// without a restart.
#[test]
fn a_thousand_jittery_steps_and_long_checkpoints_are_no_hang() {
    let dir = scratch("learned-no-hang");
    let out = jittery(&dir, 1000, 0.02)
        .env("CKPT_EVERY", 400)
        .env("SAVE_S", 1.5)
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!out.stderr.contains("made no progress"), "{}", out.stderr);
    assert_eq!(attempts(&dir), 1, "{}", out.stderr);
}

/// A rank that finishes (exits 0) while another goes on for longer than
/// the timeout is done, not hung.
#[test]
fn a_rank_that_finished_early_is_not_hung() {
    let dir = scratch("learned-early");
    let out = jittery(&dir, 150, 0.02)
        .env("EARLY_STEPS", 20)
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(!out.stderr.contains("made no progress"), "{}", out.stderr);
    assert_eq!(attempts(&dir), 1, "{}", out.stderr);
}

/// Every file named `name` under `dir`.
fn files_named(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| n == name) {
                found.push(p);
            }
        }
    }
    found
}

/// Two nodes of two workers, 40 steps of 0.2 s (+/- 10 %) each, reporting
/// progress every 0.25 s; `slow`: global rank 3 sleeps 40 % more per step.
/// Returns the stragglers `rdzv-server status --json` showed, polled while
/// the job ran, with the job's reported step when each was first seen.
fn straggler_run(name: &str, slow: bool) -> Vec<(serde_json::Value, u64)> {
    let server = accel_tests::Server::start();
    let dir = scratch(name);
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let agents: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| {
            AgentCmd::c10d(&server.addr, name)
                .nnodes(2)
                .nproc(2)
                .conf("keep_alive_interval=0.25")
                .env("CKPT_DIR", dir.display())
                .env("STEPS", 40)
                .env("STEP_S", 0.2)
                .env("JITTER", 0.1)
                .env("SLOW_RANK", if slow { 3 } else { -1 })
                .env("SLOW", 0.4)
                .env("PYTHONPATH", python.display())
                .script(worker("hang_job.py"))
                .start(&dir, n)
        })
        .collect();
    let mut seen: Vec<(serde_json::Value, u64)> = Vec::new();
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let jobs = accel_tests::status_jobs(&server.addr, &[]).unwrap_or_default();
        let Some(job) = jobs.first() else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let step = job["step"].as_u64().unwrap_or(0);
        for s in job["stragglers"].as_array().into_iter().flatten() {
            if !seen.iter().any(|(k, _)| k["rank"] == s["rank"]) {
                seen.push((s.clone(), step));
                // The same in the metrics and on the status page.
                let metrics = server.metrics.clone().expect("metrics");
                let (_, exposition) = accel_tests::http_get(&metrics, "/metrics").expect("metrics");
                let series = format!(
                    "accel_rdzv_straggler_slowdown{{rdzv_id=\"{name}\",host=\"{}\",rank=\"{}\"}}",
                    s["host"].as_str().unwrap_or_default(),
                    s["rank"]
                );
                assert!(
                    accel_tests::sample(&exposition, &series).is_some_and(|r| r > 1.25),
                    "{series}: {exposition}"
                );
                let dom = crate::status_page::dump_dom(&dir, &format!("http://{metrics}/"), 2500);
                assert!(
                    dom.contains(&format!("data-straggler-rank=\"{}\"", s["rank"])),
                    "{dom}"
                );
            }
        }
        if job["phase"] != "running" && job["phase"] != "forming" {
            assert_eq!(job["phase"], "succeeded", "{job}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{job}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    seen
}

/// A rank slowed by 40 % (it sleeps more per step) is flagged as a straggler,
/// with its host, within 20 steps; the same job unslowed flags none. The
/// workers step on their own (no collective): where ranks wait for each
/// other every step, a slow rank's time is in everyone's steps.
#[test]
fn a_rank_slowed_by_40_percent_is_flagged_as_a_straggler_and_an_unslowed_job_flags_none() {
    let seen = straggler_run("straggler", true);
    assert_eq!(seen.len(), 1, "only rank 3: {seen:?}");
    let (s, step) = &seen[0];
    assert_eq!(s["rank"], 3, "{s}");
    assert!(s["host"].as_str().is_some_and(|h| !h.is_empty()), "{s}");
    let ratio = s["step_us"].as_f64().unwrap_or(0.0) / s["median_us"].as_f64().unwrap_or(1.0);
    assert!((1.3..1.5).contains(&ratio), "about 1.4x: {s}");
    assert!(
        *step <= 20,
        "flagged by step {step} (the job's reported step): {s}"
    );
    assert_eq!(straggler_run("no-straggler", false), Vec::new());
}

/// `rdzv-server --quarantine-after 1 --straggler-quarantine`: a node whose
/// rank is 40 % slower is found a straggler, its host is quarantined and
/// the job re-forms at once with the spare in its place, spending nothing
/// of the budget (`--max-restarts 0`: a counted restart would end the job);
/// the job then runs to its end. Each agent runs as its own host.
#[test]
fn a_quarantined_straggler_gives_its_place_to_the_spare() {
    let server = accel_tests::Server::start_with(
        "127.0.0.1:0",
        &["--quarantine-after", "1", "--straggler-quarantine"],
        &[],
    );
    let name = "straggler-quarantine";
    let dir = scratch(name);
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let agent = |host: &str| {
        let mut cmd = AgentCmd::c10d(&server.addr, name)
            .nnodes(2)
            .nproc(2)
            .max_restarts(0)
            .conf("keep_alive_interval=0.25")
            .env("CKPT_DIR", dir.display())
            .env("STEPS", 60)
            .env("STEP_S", 0.1)
            .env("JITTER", 0.1)
            .env("SLOW", 0.4)
            .env("PYTHONPATH", python.display())
            .script(worker("hang_job.py"));
        if host == "slow" {
            cmd = cmd.env("SLOW_LOCAL_RANK", 1);
        }
        let prefix = accel_tests::as_host(host);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        cmd.start_with(&prefix, &dir, host)
    };
    let nodes = |job: &serde_json::Value| -> Vec<(String, String)> {
        job["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                let s = |k: &str| n[k].as_str().unwrap_or_default().to_owned();
                (s("hostname"), s("state"))
            })
            .collect()
    };
    let job_now = || {
        accel_tests::status_jobs(&server.addr, &[])
            .unwrap_or_default()
            .into_iter()
            .next()
    };
    let (slow, fast) = (agent("slow"), agent("fast"));
    accel_tests::poll_until("the first round runs", LIMIT, || {
        job_now()
            .filter(|j| j["phase"] == "running")
            .ok_or_else(|| format!("{:?}", job_now()))
    });
    let spare = agent("spare");
    let reformed = accel_tests::poll_until("the job re-forms", LIMIT, || {
        job_now()
            .filter(|j| j["round"].as_u64() >= Some(1) && j["phase"] == "running")
            .ok_or_else(|| format!("{:?}", job_now()))
    });
    let states = nodes(&reformed);
    assert!(
        states.contains(&("slow".into(), "quarantined".into()))
            && states.contains(&("spare".into(), "running".into()))
            && states.contains(&("fast".into(), "running".into())),
        "{reformed}"
    );
    assert_eq!(reformed["restart_count"], 0, "{reformed}");
    let (ok, list, err) = {
        let out = std::process::Command::new(accel_tests::bin("rdzv-server"))
            .args(["quarantine", "list", "--rdzv-endpoint", &server.addr])
            .output()
            .expect("quarantine list");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(ok, "{err}");
    assert!(
        list.contains("slow") && list.contains("straggler finding"),
        "{list}"
    );
    for a in [fast, spare, slow] {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        if out.stderr.contains("re-forming") || out.stderr.contains("restart") {
            assert!(
                !out.stderr.contains("restart budget"),
                "nothing spent: {}",
                out.stderr
            );
        }
    }
    let log = server.stderr();
    assert!(
        log.contains("is a straggler (1.") && log.contains("host 'slow' is quarantined"),
        "{log}"
    );
}

/// Stragglers under collectives: a 2x2 gloo DDP job whose rank 3 sleeps
/// 40 % more in each step's own work. Every rank's step waits for it at the
/// gradient all-reduce, so by time per step no rank is slower than the
/// others; with each step's own work reported (`accel.progress(step,
/// compute=...)`), rank 3 is flagged. Returns the ranks flagged while the
/// job ran.
fn ddp_stragglers(name: &str, compute: bool) -> Vec<u64> {
    let _heavy = crate::heavy();
    let server = accel_tests::Server::start();
    let dir = scratch(name);
    let (ck, out) = (dir.join("ckpt"), dir.join("out"));
    for d in [&ck, &out] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let (ck, out) = (ck.display().to_string(), out.display().to_string());
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let script = worker("ddp_train.py");
    let mut args = vec![
        ck.as_str(),
        out.as_str(),
        "--steps",
        "60",
        "--ckpt-every",
        "1000",
        "--step-sleep",
        "0.1",
        "--slow-rank",
        "3",
        "--slow",
        "0.04",
        "--progress",
    ];
    if compute {
        args.push("--compute");
    }
    let agents: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| {
            AgentCmd::c10d(&server.addr, name)
                .nnodes(2)
                .nproc(2)
                .conf("keep_alive_interval=0.25")
                .env("PYTHONPATH", python.display())
                .program(&script, &args)
                .start(&dir, n)
        })
        .collect();
    let mut flagged: Vec<u64> = Vec::new();
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let jobs = accel_tests::status_jobs(&server.addr, &[]).unwrap_or_default();
        if let Some(job) = jobs.first() {
            for s in job["stragglers"].as_array().into_iter().flatten() {
                let rank = s["rank"].as_u64().unwrap_or(u64::MAX);
                if !flagged.contains(&rank) {
                    flagged.push(rank);
                }
            }
            if job["phase"] != "running" && job["phase"] != "forming" {
                assert_eq!(job["phase"], "succeeded", "{job}");
                break;
            }
        }
        assert!(std::time::Instant::now() < deadline, "the job did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    flagged
}

#[test]
fn a_slow_ddp_rank_is_flagged_by_its_own_work_and_not_by_its_step_time() {
    assert_eq!(
        ddp_stragglers("ddp-straggler-compute", true),
        vec![3],
        "rank 3, by its own work per step"
    );
    assert_eq!(
        ddp_stragglers("ddp-straggler-steps", false),
        Vec::<u64>::new(),
        "by time per step, every DDP rank waits as long as the slowest"
    );
}
