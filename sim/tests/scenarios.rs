//! Runs every scenario script in `sim/scenarios/` (each a port of an
//! end-to-end test's logic; see `sim/scenarios/README.md`), compares what
//! each run decided with its recorded output (`NAME.out`), and shows that
//! the planted bugs' scripts fail on their invariants (fencing, quarantine,
//! durability).

use std::path::{Path, PathBuf};

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("sim/scenarios")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sim"))
        .collect();
    files.sort();
    files
}

fn run(path: &Path) -> Result<accel_sim::World, Box<accel_sim::script::ScriptError>> {
    let text = std::fs::read_to_string(path).expect("a script");
    let name = format!(
        "sim/scenarios/{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    accel_sim::script::run(&name, &text)
}

#[test]
fn every_scenario_script_passes() {
    let files = scenarios();
    assert!(files.len() >= 15, "the scripts are there: {files:?}");
    let mut failed = Vec::new();
    let known = |p: &PathBuf| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("known_"))
    };
    let record = std::env::var_os("ACCEL_SIM_RECORD").is_some();
    for path in files.iter().filter(|p| {
        !p.ends_with("planted_fence.sim")
            && !p.ends_with("planted_quarantine.sim")
            && !p.ends_with("planted_commit.sim")
            && !known(p)
    }) {
        match run(path) {
            Err(e) => failed.push(e.to_string()),
            Ok(world) => {
                if let Err(e) = recorded(path, &world.decisions, record) {
                    failed.push(e);
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Compares what a script's run decided with its recorded output
/// (`NAME.out` beside it), as etcd raft's data-driven tests do; with
/// `record`, writes it instead (`ACCEL_SIM_RECORD=1 cargo test -p
/// accel-sim --test scenarios`, then read the diff).
fn recorded(script: &Path, decisions: &[String], record: bool) -> Result<(), String> {
    let out = script.with_extension("out");
    let got = decisions.join("\n") + "\n";
    if record {
        std::fs::write(&out, &got).map_err(|e| format!("{}: {e}", out.display()))?;
        return Ok(());
    }
    let want = std::fs::read_to_string(&out).map_err(|e| {
        format!(
            "{}: {e}; record it with ACCEL_SIM_RECORD=1 cargo test -p accel-sim --test scenarios",
            out.display()
        )
    })?;
    if want == got {
        return Ok(());
    }
    let first = want
        .lines()
        .zip(got.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
    Err(format!(
        "{}: the run decided otherwise than recorded, from line {}:\n  recorded: {}\n  now:      {}\n(if the change is meant, record again: ACCEL_SIM_RECORD=1 cargo test -p accel-sim --test scenarios)",
        out.display(),
        first + 1,
        want.lines().nth(first).unwrap_or("(end)"),
        got.lines().nth(first).unwrap_or("(end)")
    ))
}

#[test]
fn the_planted_fence_bug_is_caught_by_a_script() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let err = match run(&dir.join("planted_fence.sim")) {
        Ok(_) => panic!("a node that keeps its ranks while the job re-forms went unnoticed"),
        Err(e) => e,
    };
    assert!(err.why.starts_with("invariant (a)"), "{err}");
    assert!(err.why.contains("fencing"), "{err}");
    // The same script with fencing on passes.
    let text = std::fs::read_to_string(dir.join("planted_fence.sim"))
        .expect("the script")
        .replace("add-node broken-fence", "add-node");
    if let Err(e) = accel_sim::script::run("planted_fence.sim (fenced)", &text) {
        panic!("{e}");
    }
}

#[test]
fn the_planted_quarantine_bug_is_caught_by_a_script() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let err = match run(&dir.join("planted_quarantine.sim")) {
        Ok(_) => panic!("a round that placed a benched host went unnoticed"),
        Err(e) => e,
    };
    assert!(err.why.starts_with("invariant (f)"), "{err}");
    assert!(err.why.contains("benched host 'n2'"), "{err}");
    // The same script with the server's benches kept passes.
    let text = std::fs::read_to_string(dir.join("planted_quarantine.sim"))
        .expect("the script")
        .replace(" broken-quarantine", "");
    if let Err(e) = accel_sim::script::run("planted_quarantine.sim (kept)", &text) {
        panic!("{e}");
    }
}

#[test]
fn the_planted_commit_bug_is_caught_by_a_script() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let err = match run(&dir.join("planted_commit.sim")) {
        Ok(_) => panic!("a restart sent before the store held it went unnoticed"),
        Err(e) => e,
    };
    assert!(err.why.starts_with("invariant (i)"), "{err}");
    assert!(err.why.contains("told of round 1"), "{err}");
    // The same run without the bug is `commit.sim`, which passes.
    let text = std::fs::read_to_string(dir.join("planted_commit.sim"))
        .expect("the script")
        .replace(" broken-commit", "");
    if let Err(e) = accel_sim::script::run("planted_commit.sim (durable)", &text) {
        panic!("{e}");
    }
}

#[test]
fn a_failing_expect_names_the_file_the_line_and_recent_events() {
    let text = "job nnodes=2 nproc=1\nadd-nodes 2\ntick 1s\nexpect round 7\n";
    let err = match accel_sim::script::run("x.sim", text) {
        Ok(_) => panic!("round 7 is wrong"),
        Err(e) => e,
    };
    let shown = err.to_string();
    assert!(shown.starts_with("x.sim:4: `expect round 7`"), "{shown}");
    assert!(shown.contains("want =\"7\", got \"0\""), "{shown}");
    assert!(shown.contains("round 0 complete"), "{shown}");
}

/// Scripts named `known_*.sim` reproduce issues the simulator found and
/// that are not fixed yet (sim/scenarios/README.md): each must still fail
/// (an invariant, or an `expect` a fix would meet). When one passes, its
/// issue is fixed: rename it.
#[test]
fn known_issues_still_reproduce() {
    for path in scenarios().iter().filter(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("known_"))
    }) {
        match run(path) {
            Ok(_) => panic!(
                "{} passes: its issue is fixed; drop the `known_` prefix",
                path.display()
            ),
            Err(e) => eprintln!("{}: still fails: {}", path.display(), e.why),
        }
    }
}
