//! `--preload`: workers forked from a zygote that imported torch. What a
//! script sees is compared with a cold start; what makes forking unsafe
//! falls back to cold starts; a zygote that dies is replaced. (The
//! environment against torchrun's and the DDP resume are in `torch`.)

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use accel_tests::{
    poll_until, read_json, run_logged, scratch, venv_path, worker, AgentCmd, Finished,
};
use serde_json::Value;

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(240);

/// Runs `cmd` with the venv first on `PATH`, expecting success.
fn run_ok(cmd: &AgentCmd, dir: &Path, name: &str) -> Finished {
    let mut c = cmd.command();
    c.env("PATH", venv_path()).current_dir(dir);
    let out = run_logged(c, dir, name, LIMIT);
    assert!(out.status.success(), "{name} failed:\n{}", out.stderr);
    out
}

fn facts(dir: &Path, rank: u32) -> BTreeMap<String, Value> {
    serde_json::from_value(read_json(&dir.join(format!("intro_{rank}.json")))).expect("facts")
}

#[test]
fn a_hot_started_script_sees_what_a_cold_one_sees() {
    let _heavy = heavy();
    let root = scratch("hot-intro");
    let script = worker("introspect.py");
    // The module form runs from a directory holding the module.
    let pkg = root.join("pkg");
    std::fs::create_dir_all(&pkg).expect("pkg");
    std::fs::copy(&script, pkg.join("intro_mod.py")).expect("copy");
    let hot: &[&str] = &["--preload", "torch"];
    for (form, nproc, dir) in [("script", 2, root.clone()), ("module", 1, pkg.clone())] {
        // Separate output directories: a hot run that never ran the script
        // cannot pass on the cold run's files.
        let run = |tag: &str, flags: &[&str]| {
            let out = root.join(format!("{form}-{tag}"));
            std::fs::create_dir_all(&out).expect("out");
            let o = out.to_str().expect("path");
            let c = AgentCmd::standalone().nproc(nproc).flags(flags);
            let job = match form {
                "script" => c.program(&script, &[o, "x", "${local_rank}"]),
                _ => c.flags(&["-m", "intro_mod", o, "y"]),
            };
            let stderr = run_ok(&job, &dir, &format!("{form}-{tag}")).stderr;
            let facts: Vec<_> = (0..nproc)
                .map(|r| {
                    let mut f = facts(&out, r);
                    let argv = f.remove("argv").expect("argv");
                    assert_eq!(argv[0], o, "the script's own arguments");
                    f.insert(
                        "args".into(),
                        Value::from(argv.as_array().expect("list")[1..].to_vec()),
                    );
                    let kept = std::fs::read_to_string(out.join(format!("kept_{r}.txt")));
                    f.insert("kept".into(), Value::from(kept.unwrap_or_default()));
                    f
                })
                .collect();
            (stderr, facts)
        };
        let (_, cold) = run("cold", &[]);
        let (stderr, hot) = run("hot", hot);
        assert!(
            stderr.contains("zygote ready") && !stderr.contains("start cold"),
            "{stderr}"
        );
        assert_eq!(hot, cold, "{form}: what the script sees");
        assert_eq!(hot[0]["name"], "__main__");
        assert_eq!(hot[0]["main_is_this"], true);
        assert_eq!(hot[0]["atexit_ran"], true, "atexit handlers run");
        assert_eq!(hot[0]["pickles_main_class"], "Here");
        assert_eq!(
            hot[0]["annotation"], "<class 'int'>",
            "the script's own future flags"
        );
        assert_eq!(
            hot[0]["kept"], "flushed at exit",
            "open files are flushed at exit"
        );
    }
}

#[test]
fn preload_that_starts_a_thread_or_fails_falls_back_to_cold_starts() {
    let _heavy = heavy();
    let root = scratch("hot-unsafe");
    let script = worker("hot_once.py");
    let workers = worker("starts_thread.py");
    let workers = workers.parent().expect("dir").to_str().expect("path");
    for (module, why) in [
        (
            "starts_thread",
            "started 1 thread(s) besides the main one (importer)",
        ),
        (
            "no_such_module_here",
            "No module named 'no_such_module_here'",
        ),
    ] {
        let job = AgentCmd::standalone()
            .nproc(2)
            .max_restarts(1)
            .flag("--preload", module)
            .env("PYTHONPATH", workers)
            .program(&script, &["0", "3"]);
        let Finished { stdout, stderr, .. } = run_ok(&job, &root, module);
        assert!(
            stderr.contains("workers start cold") && stderr.contains(why),
            "{module}: the reason is given:\n{stderr}"
        );
        assert_eq!(
            stderr.matches("workers start cold").count(),
            1,
            "said once, not per round:\n{stderr}"
        );
        assert!(
            stdout.contains("forked=False") && !stdout.contains("forked=True"),
            "{stdout}"
        );
    }
}

#[test]
fn a_zygote_that_dies_is_replaced_and_the_job_goes_on() {
    let _heavy = heavy();
    let dir = scratch("hot-replaced");
    let script = worker("hot_once.py");
    let job = AgentCmd::standalone()
        .nproc(2)
        .max_restarts(2)
        .tee(3)
        .flag("--preload", "torch")
        .env("PATH", venv_path())
        .program(&script, &["120"]);
    let agent = job.start(&dir, "agent");
    // Its workers run (forked) in the first attempt; then the zygote is killed.
    let pid: u32 = poll_until("the zygote and its forks", LIMIT, || {
        let err = std::fs::read_to_string(&agent.stderr).unwrap_or_default();
        let out = std::fs::read_to_string(&agent.stdout).unwrap_or_default();
        let pid = err
            .lines()
            .find(|l| l.contains("zygote ready"))
            .and_then(|l| l.split("pid=").nth(1))
            .and_then(|p| p.split_whitespace().next())
            .and_then(|p| p.parse().ok());
        match pid {
            Some(p) if out.matches("attempt 0 forked=True").count() == 2 => Ok(p),
            _ => Err(err),
        }
    });
    accel_tests::signal(pid, "KILL");
    let done = agent.wait(LIMIT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains("the zygote ended; preparing another"),
        "{}",
        done.stderr
    );
    // Its forks died with it (a failure, restarted); the restart waited
    // for the new zygote and its workers are forks of it.
    assert_eq!(
        done.stdout.matches("attempt 1 forked=True").count(),
        2,
        "{}",
        done.stdout
    );
    assert_eq!(
        done.stderr.matches("zygote ready").count(),
        2,
        "{}",
        done.stderr
    );
}
