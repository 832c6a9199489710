//! torchrun's command line, read from the pinned venv's live `torchrun
//! --help`: every long flag (and its other spelling) must be one
//! `accel-agent` accepts, taking a value exactly when torchrun's does, so a
//! new torchrun release shows up here first. And the logging flags that
//! have output of their own (`--duplicate-std*-filters`,
//! `--event-log-handler console`) are compared with torchrun's on the same
//! job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use accel_agent::cli::AgentArgs;
use accel_tests::{
    bin, eventually, run_agent, run_logged, scratch, signal, venv, venv_path, with_private_hosts,
    Finished,
};
use clap::CommandFactory;
use serde_json::Value;

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(120);

/// One option of `torchrun --help`: its spellings and whether it takes a
/// value (with the choices argparse lists, if any).
#[derive(Debug)]
struct TorchrunOption {
    names: Vec<String>,
    value: Option<Vec<String>>,
}

/// The options section of argparse's help: each option's invocation is on
/// a line of its own starting with two spaces and a dash (`  -r REDIRECTS,
/// --redirects REDIRECTS`), help text after two or more spaces.
fn torchrun_options(help: &str) -> Vec<TorchrunOption> {
    let mut options = Vec::new();
    let mut in_options = false;
    for line in help.lines() {
        if line == "options:" || line == "optional arguments:" {
            in_options = true;
            continue;
        }
        if !in_options || !line.starts_with("  -") {
            continue;
        }
        let invocation = line[2..].split("  ").next().unwrap_or_default();
        let mut names = Vec::new();
        let mut value = None;
        for part in invocation.split(", ") {
            let mut words = part.split(' ');
            names.push(words.next().unwrap_or_default().to_owned());
            if let Some(metavar) = words.next() {
                value = Some(
                    match metavar.strip_prefix('{').and_then(|m| m.strip_suffix('}')) {
                        Some(choices) => choices.split(',').map(str::to_owned).collect(),
                        None => Vec::new(),
                    },
                );
            }
        }
        options.push(TorchrunOption { names, value });
    }
    options
}

/// A long flag's other spelling (`--nproc-per-node` ↔ `--nproc_per_node`).
fn respelled(flag: &str) -> String {
    let body = &flag[2..];
    let swapped: String = if body.contains('_') {
        body.replace('_', "-")
    } else {
        body.replace('-', "_")
    };
    format!("--{swapped}")
}

/// On every torch release tested: a flag torchrun has and accel-agent
/// lacks (or takes differently) fails here.
#[test]
fn every_torchrun_flag_is_accepted_in_both_spellings() {
    for (version, venv) in accel_tests::tested_torch() {
        torchrun_flags_are_accepted(&version, &venv);
    }
}

fn torchrun_flags_are_accepted(version: &str, venv: &Path) {
    eprintln!("torchrun of torch {version}");
    let out = Command::new(venv.join("bin/torchrun"))
        .arg("--help")
        .env("PATH", accel_tests::path_with(venv))
        .output()
        .expect("run torchrun --help");
    assert!(out.status.success(), "torchrun --help: {out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    let options = torchrun_options(&help);
    // The parse itself must work: a change of argparse's layout must fail
    // here, not make an empty list pass.
    let longs: Vec<&str> = options
        .iter()
        .flat_map(|o| o.names.iter().map(String::as_str))
        .filter(|n| n.starts_with("--"))
        .collect();
    for known in [
        "--nnodes",
        "--nproc_per_node",
        "--standalone",
        "--tee",
        "--logs-specs",
    ] {
        assert!(
            longs.contains(&known),
            "{known} not found in torchrun --help:\n{help}"
        );
    }
    assert!(
        longs.len() >= 40,
        "only {} long flags parsed from:\n{help}",
        longs.len()
    );

    let mut agent = AgentArgs::command();
    agent.build();
    let find = |name: &str| {
        agent
            .get_arguments()
            .find(|a| match name.strip_prefix("--") {
                Some(long) => {
                    a.get_long() == Some(long)
                        || a.get_all_aliases().is_some_and(|al| al.contains(&long))
                }
                None => name.len() == 2 && a.get_short() == name.chars().nth(1),
            })
    };
    let mut missing = Vec::new();
    for option in &options {
        let mut spellings = option.names.clone();
        for name in &option.names {
            let other = respelled(name);
            if name.starts_with("--") && !spellings.contains(&other) {
                spellings.push(other);
            }
        }
        for name in &spellings {
            if name == "-h" || name == "--help" {
                continue;
            }
            let Some(arg) = find(name) else {
                missing.push(format!("{name}: not accepted"));
                continue;
            };
            let takes = arg.get_num_args().map_or(0, |n| n.min_values());
            match &option.value {
                None if takes > 0 => missing.push(format!(
                    "{name}: a switch in torchrun, but accel-agent requires a value"
                )),
                Some(_) if takes == 0 => missing.push(format!(
                    "{name}: takes a value in torchrun, but is a switch in accel-agent"
                )),
                _ => {}
            }
            // Every choice torchrun lists must parse.
            for choice in option.value.iter().flatten() {
                let argv = ["accel-agent", name.as_str(), choice.as_str(), "train.py"];
                if let Err(e) = AgentArgs::command().try_get_matches_from(argv) {
                    missing.push(format!("{name} {choice}: refused: {e}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "accel-agent does not take these flags of the pinned torchrun ({} options read from its --help):\n  {}",
        options.len(),
        missing.join("\n  ")
    );
}

/// How the job ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Both ranks exit 0.
    Succeeds,
    /// Rank 1 exits 3 while rank 0 still runs (so it is stopped).
    Fails,
    /// As `Fails` in the first attempt; the restart (`--max-restarts 1`)
    /// succeeds.
    FailsOnce,
}

/// The job both launchers run: two ranks printing to stdout and stderr,
/// some lines matching the filters, then ending as `ending` says.
fn job_script(dir: &Path, ending: Ending) -> PathBuf {
    let fail = "if [ \"$RANK\" = 1 ]; then sleep 1; exit 3; fi\nsleep 60\n";
    let tail = match ending {
        Ending::Succeeds => String::new(),
        Ending::Fails => fail.to_owned(),
        Ending::FailsOnce => {
            format!("if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then\n{fail}fi\n")
        }
    };
    let text = format!(
        "#!/bin/sh\n\
         echo \"rank $RANK hello\"\n\
         echo \"rank $RANK loss,acc 0.5\"\n\
         echo \"rank $RANK loss acc no comma\"\n\
         echo \"rank $RANK err plain\" >&2\n\
         echo \"rank $RANK err WARN here\" >&2\n\
         echo \"rank $RANK metric=1 ü\"\n\
         echo \"rank $RANK WARN on stdout is not a stdout filter\"\n\
         {tail}"
    );
    let path = dir.join("job.sh");
    std::fs::write(&path, text).expect("write job");
    let mut perms = std::fs::metadata(&path).expect("job").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).expect("chmod job");
    path
}

/// The flags under comparison, the same for both launchers.
fn flags(log_dir: &Path, restarts: u32) -> Vec<String> {
    [
        "--max-restarts",
        &restarts.to_string(),
        "--nproc-per-node",
        "2",
        "--log-dir",
        log_dir.to_str().expect("path"),
        "--tee",
        "3",
        "--duplicate-stdout-filters",
        "loss,,acc,metric",
        "--duplicate_stderr_filters",
        "WARN",
        "--event-log-handler",
        "console",
        "--no-python",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Runs `launcher` (torchrun or accel-agent) on the job, under the same
/// private hosts file (so both see the same host name).
fn launch(
    dir: &Path,
    name: &str,
    launcher: &Path,
    script: &Path,
    restarts: u32,
) -> (Finished, PathBuf) {
    let logs = dir.join(format!("{name}-logs"));
    let mut argv = vec![launcher.to_str().expect("path").to_owned()];
    argv.extend(flags(&logs, restarts));
    argv.push(script.to_str().expect("path").to_owned());
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut cmd = with_private_hosts(dir, &argv);
    cmd.env("PATH", venv_path()).env_remove("LOGLEVEL");
    (run_logged(cmd, dir, name, LIMIT), logs)
}

/// `<log-dir>/<run_id>_<random>/attempt_0/<file>`, and the run directory's
/// name.
fn attempt_file(logs: &Path, file: &str) -> (String, PathBuf) {
    nth_attempt_file(logs, 0, file)
}

/// `<log-dir>/<run_id>_<random>/attempt_<n>/<file>`, and the run
/// directory's name.
fn nth_attempt_file(logs: &Path, n: u32, file: &str) -> (String, PathBuf) {
    let runs: Vec<PathBuf> = std::fs::read_dir(logs)
        .unwrap_or_else(|e| panic!("{}: {e}", logs.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = runs[0]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    (run, runs[0].join(format!("attempt_{n}")).join(file))
}

/// A filtered file's lines by their prefix, in order: ranks interleave in
/// any order, each rank's own lines do not.
fn by_prefix(path: &Path) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.split_inclusive('\n') {
        let prefix = line.split_once("]:").map_or("", |(p, _)| p).to_owned();
        map.entry(prefix).or_default().push(line.to_owned());
    }
    map
}

/// The events a launcher printed on stderr, with what may differ between
/// two runs made comparable: the run id (which must name the run
/// directory `run_dir`) and pids checked for consistency and replaced,
/// durations and run time checked for type and dropped.
fn events(stderr: &str, run_dir: &str) -> Vec<Value> {
    let mut pids: BTreeMap<u64, String> = BTreeMap::new();
    let mut out = Vec::new();
    for line in stderr
        .lines()
        .filter(|l| l.starts_with("{\"name\": \"torchelastic."))
    {
        let mut e: Value = serde_json::from_str(line).unwrap_or_else(|err| panic!("{line}: {err}"));
        let md = e["metadata"].as_object_mut().expect("metadata");
        let run_id = md["run_id"].as_str().expect("run_id");
        assert!(
            run_dir.starts_with(&format!("{run_id}_")),
            "the run id names the log directory {run_dir}: {line}"
        );
        md.insert("run_id".into(), "RUN".into());
        let duration = md.remove("duration_ms").expect("duration_ms");
        let timed =
            ["RENDEZVOUS", "ASSIGN_WORKER_RANKS"].contains(&md["state"].as_str().unwrap_or(""));
        assert_eq!(
            duration.is_number(),
            timed,
            "durations only on the timed agent events: {line}"
        );
        assert!(
            md.remove("total_run_time")
                .expect("total_run_time")
                .is_u64(),
            "{line}"
        );
        // A worker's id is its pid, the same in all its events of a round.
        let rank = md["global_rank"].as_u64();
        if let (Some(rank), Some(id)) = (rank, md["worker_id"].as_str()) {
            assert!(id.parse::<u32>().is_ok(), "{line}");
            if md["state"] == "START" {
                pids.insert(rank, id.to_owned());
            }
            assert_eq!(pids.get(&rank).map(String::as_str), Some(id), "{line}");
            md.insert("worker_id".into(), "PID".into());
        }
        let inner: Value =
            serde_json::from_str(md["metadata"].as_str().expect("inner")).expect("inner json");
        let mut inner = inner.as_object().expect("inner object").clone();
        if let Some(Value::Array(pid)) = inner.get_mut("worker_pid") {
            if let Some(p) = pid[0].as_u64() {
                assert_eq!(
                    rank.and_then(|r| pids.get(&r)),
                    Some(&p.to_string()),
                    "{line}"
                );
                pid[0] = "PID".into();
            }
        }
        md.insert("metadata".into(), Value::Object(inner));
        // The key order is part of the text tools parse.
        let keys: Vec<String> = md.keys().cloned().collect();
        md.insert("keys".into(), keys.into());
        out.push(e);
    }
    out
}

fn compare_with_torchrun(name: &str, ending: Ending) {
    let _heavy = heavy();
    let dir = scratch(name);
    let script = job_script(&dir, ending);
    let restarts = u32::from(ending == Ending::FailsOnce);
    let torchrun_bin = venv().join("bin/torchrun");
    let (torchrun, tr_logs) = launch(&dir, "torchrun", &torchrun_bin, &script, restarts);
    let (accel, ac_logs) = launch(&dir, "accel", &bin("accel-agent"), &script, restarts);
    let code = if ending == Ending::Fails { 1 } else { 0 };
    assert_eq!(
        torchrun.status.code(),
        Some(code),
        "torchrun: {}",
        torchrun.stderr
    );
    assert_eq!(accel.status.code(), Some(code), "accel: {}", accel.stderr);

    for attempt in 0..=restarts {
        for file in ["filtered_stdout.log", "filtered_stderr.log"] {
            let (_, tr) = nth_attempt_file(&tr_logs, attempt, file);
            let (_, ac) = nth_attempt_file(&ac_logs, attempt, file);
            let want = by_prefix(&tr);
            assert_eq!(
                want.len(),
                2,
                "torchrun wrote both ranks' lines to attempt {attempt}'s {file}: {want:?}"
            );
            assert_eq!(
                by_prefix(&ac),
                want,
                "attempt {attempt}'s {file} differs from torchrun's ({})",
                dir.display()
            );
        }
    }

    let (tr_run, _) = attempt_file(&tr_logs, "");
    let (ac_run, _) = attempt_file(&ac_logs, "");
    let want = events(&torchrun.stderr, &tr_run);
    let got = events(&accel.stderr, &ac_run);
    // Each attempt's RENDEZVOUS, ASSIGN_WORKER_RANKS and START ×2, then the
    // final state ×2 and the agent's.
    assert_eq!(
        want.len(),
        4 * (restarts as usize + 1) + 3,
        "torchrun's events: {want:#?}"
    );
    assert_eq!(
        serde_json::to_string_pretty(&got).expect("json"),
        serde_json::to_string_pretty(&want).expect("json"),
        "accel's events differ from torchrun's ({})",
        dir.display()
    );
}

#[test]
fn filtered_logs_and_events_match_torchrun() {
    compare_with_torchrun("flags-parity", Ending::Succeeds);
}

#[test]
fn filtered_logs_and_events_of_a_failed_job_match_torchrun() {
    compare_with_torchrun("flags-parity-failed", Ending::Fails);
}

#[test]
fn filtered_logs_and_events_of_a_restarted_job_match_torchrun() {
    compare_with_torchrun("flags-parity-restarted", Ending::FailsOnce);
}

#[test]
fn torchrun_values_accel_cannot_honour_are_refused_with_the_way_out() {
    let dir = scratch("flags-refused");
    for (i, flag) in ["--logs-specs", "--logs_specs"].iter().enumerate() {
        let out = run_agent(
            &dir,
            &format!("specs{i}"),
            &[flag, "my_specs", "--no-python", "true"],
            &[],
            LIMIT,
        );
        assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
        for needed in [
            "'my_specs'",
            "runs no Python",
            "--log-dir",
            "--redirects",
            "--tee",
            "--local-ranks-filter",
        ] {
            assert!(out.stderr.contains(needed), "{needed}: {}", out.stderr);
        }
    }
    let out = run_agent(
        &dir,
        "handler",
        &["--event_log_handler", "syslog", "--no-python", "true"],
        &[],
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("'syslog'") && out.stderr.contains("console, dynamic_rendezvous, null"),
        "{}",
        out.stderr
    );
    // The environment fallback torchrun has goes through the same parser.
    let out = run_agent(
        &dir,
        "handler-env",
        &["--no-python", "true"],
        &[("PET_EVENT_LOG_HANDLER", "file")],
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("'file'"), "{}", out.stderr);
}

#[test]
fn torchrun_defaults_given_explicitly_run_the_job() {
    let dir = scratch("flags-defaults");
    let logs = dir.join("logs");
    let out = run_agent(
        &dir,
        "agent",
        &[
            "--logs_specs",
            "default",
            "--event_log_handler",
            "null",
            "--duplicate_stdout_filters",
            "",
            "--log-dir",
            logs.to_str().expect("path"),
            "--no-python",
            "sh",
            "-c",
            "echo visible",
        ],
        &[],
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        !out.stderr.contains("torchelastic."),
        "null prints no events: {}",
        out.stderr
    );
    // Given, even empty, the filter list exists (torchrun's [""]): the file
    // is made, and stays empty without --tee, as torchrun's does.
    let (_, filtered) = attempt_file(&logs, "filtered_stdout.log");
    assert_eq!(
        std::fs::read_to_string(&filtered).expect("filtered file"),
        ""
    );
    let (_, not_asked) = attempt_file(&logs, "filtered_stderr.log");
    assert!(!not_asked.exists(), "no stderr filters, no file");
}

/// Starts `launcher` with console events on a job of two `sleep 60`
/// workers, stops it with SIGTERM once both workers started, and returns
/// its stderr and run directory name.
fn signalled(dir: &Path, name: &str, launcher: &Path) -> (String, String) {
    let logs = dir.join(format!("{name}-logs"));
    let argv = [
        launcher.to_str().expect("path"),
        "--nproc-per-node",
        "2",
        "--log-dir",
        logs.to_str().expect("path"),
        "--event-log-handler",
        "console",
        "--no-python",
        "sleep",
        "60",
    ];
    let stderr = dir.join(format!("{name}.stderr"));
    let mut child = with_private_hosts(dir, &argv)
        .env("PATH", venv_path())
        .env_remove("LOGLEVEL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("spawn");
    let started = || {
        std::fs::read_to_string(&stderr)
            .unwrap_or_default()
            .matches("torchelastic.worker.status.START")
            .count()
            == 2
    };
    assert!(
        eventually(LIMIT, started),
        "{name}: no START events: {}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    // `unshare` and `sh` exec the launcher: the child's pid is its pid.
    signal(child.id(), "TERM");
    assert!(
        eventually(LIMIT, || matches!(child.try_wait(), Ok(Some(_)))),
        "{name} did not stop on SIGTERM"
    );
    let (run, _) = attempt_file(&logs, "");
    (std::fs::read_to_string(&stderr).expect("stderr"), run)
}

#[test]
fn events_of_a_signalled_agent_match_torchrun() {
    let _heavy = heavy();
    let dir = scratch("flags-parity-signalled");
    let (tr_err, tr_run) = signalled(&dir, "torchrun", &venv().join("bin/torchrun"));
    let (ac_err, ac_run) = signalled(&dir, "accel", &bin("accel-agent"));
    // torchrun's raw_error is the Python traceback of its SignalException;
    // accel's is that traceback's last line, the exception itself.
    let last_line = |mut events: Vec<Value>| {
        for e in &mut events {
            if let Some(Value::String(raw)) = e["metadata"].get_mut("raw_error") {
                let line = raw.trim_end().lines().last().unwrap_or_default().to_owned();
                let pid = line.rsplit_once("Process ").map_or("", |(_, p)| p);
                let pid = pid.split(' ').next().unwrap_or_default().to_owned();
                *raw = line.replace(&format!("Process {pid} "), "Process PID ");
            }
        }
        events
    };
    let want = last_line(events(&tr_err, &tr_run));
    let got = last_line(events(&ac_err, &ac_run));
    // RENDEZVOUS, ASSIGN_WORKER_RANKS, START ×2 and the agent's FAILED:
    // no final worker states when the agent itself is stopped.
    assert_eq!(want.len(), 5, "torchrun's events: {want:#?}");
    assert_eq!(
        want[4]["metadata"]["raw_error"],
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process PID got signal: 15"
    );
    assert_eq!(
        serde_json::to_string_pretty(&got).expect("json"),
        serde_json::to_string_pretty(&want).expect("json"),
        "accel's events differ from torchrun's ({})",
        dir.display()
    );
}
