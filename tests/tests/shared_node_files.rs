//! Shared nodes, files: what a job writes is private to its user whatever
//! the umask (directories 0700, files 0600), nothing is written through a
//! link someone planted, and a worker's error file that is not a regular
//! file (a FIFO) neither freezes the agent nor is read.
//!
//! The job runs as root (the test process); [`accel_tests::OTHER_USER`]
//! plays the other user of the node. The scratch directories are made 0755
//! so that only the modes the agent sets keep that user out.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use accel_tests::{as_other_user, other_user, run_logged, scratch, AgentCmd, Finished};

const LIMIT: Duration = Duration::from_secs(90);
const SECRET: &str = "HF_TOKEN=hf_sharednodesecret";

/// A scratch directory the other user may enter and list.
fn open_scratch(name: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// Runs `job` as root under umask 000, output in `dir/<name>.*`.
fn run_umask_000(job: &AgentCmd, dir: &Path, name: &str) -> Finished {
    let cmd = job.command_with(&["sh", "-c", "umask 000; exec \"$0\" \"$@\""]);
    run_logged(cmd, dir, name, LIMIT)
}

/// Everything below `root` (not `root` itself), depth first.
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root).expect("read_dir") {
        let path = entry.expect("entry").path();
        let meta = path.symlink_metadata().expect("lstat");
        out.push(path.clone());
        if meta.is_dir() {
            out.extend(tree(&path));
        }
    }
    out
}

/// The job of the privacy tests: a worker printing a secret to both streams
/// (tee'd, and copied to the filtered file) and writing its error file, then
/// failing; the agent writes the parent's error file `parent_error`.
fn secret_job(parent_error: &Path) -> AgentCmd {
    AgentCmd::new()
        .tee(3)
        .flag("--duplicate-stdout-filters", "HF_TOKEN")
        .env("TORCHELASTIC_ERROR_FILE", parent_error.display())
        .no_python(
            "sh",
            &[
                "-c",
                &format!(
                    "echo {SECRET}; echo {SECRET} >&2; \
                     printf '{{\"message\": \"{SECRET}\"}}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3"
                ),
            ],
        )
}

/// Asserts that `root`'s tree is the agent's (directories 0700, the files
/// the agent makes 0600: the worker's own error file has the worker's
/// umask, and is kept private by its directory) and that the other user can
/// neither list nor read any of it.
fn assert_private(root: &Path, worker_files: &[&str]) {
    let paths = tree(root);
    let logs: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(".log"))
        })
        .collect();
    assert!(
        logs.len() >= 3,
        "stdout.log, stderr.log, filtered_stdout.log: {paths:?}"
    );
    for p in &paths {
        let meta = p.symlink_metadata().expect("lstat");
        let mode = meta.permissions().mode() & 0o7777;
        let name = p.file_name().expect("name").to_string_lossy();
        if meta.is_dir() {
            assert_eq!(mode, 0o700, "{} is a directory the agent made", p.display());
        } else if !worker_files.contains(&name.as_ref()) {
            assert_eq!(mode, 0o600, "{} is a file the agent made", p.display());
        }
        let tool = if meta.is_dir() { "ls" } else { "cat" };
        let out = as_other_user(&mut Command::new(tool))
            .arg(p)
            .output()
            .expect("run as the other user");
        assert!(
            !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains(SECRET),
            "{} {} as {}: {out:?}",
            tool,
            p.display(),
            accel_tests::OTHER_USER
        );
    }
    let error_files = paths
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "error.json"))
        .count();
    assert_eq!(error_files, 1, "the worker wrote its error file: {paths:?}");
}

fn assert_failed_with_secret_logged(out: &Finished) {
    assert_eq!(out.code(), 1, "the worker failed: {}", out.stderr);
    assert!(out.stdout.contains(SECRET), "tee'd: {}", out.stdout);
}

/// The parent's error file, written by the agent: 0600 and unreadable.
fn assert_parent_error_private(parent_error: &Path) {
    let meta = std::fs::metadata(parent_error).expect("the agent wrote the parent's error file");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    let out = as_other_user(&mut Command::new("cat"))
        .arg(parent_error)
        .output()
        .expect("cat");
    assert!(!out.status.success(), "{out:?}");
}

#[test]
fn under_umask_000_a_log_dir_job_is_private_to_its_user() {
    other_user();
    let dir = open_scratch("private-logdir");
    let logs = dir.join("logs");
    std::fs::create_dir(&logs).expect("mkdir");
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let parent_error = dir.join("parent_error.json");
    let out = run_umask_000(&secret_job(&parent_error).log_dir(&logs), &dir, "agent");
    assert_failed_with_secret_logged(&out);
    assert_private(&logs, &["error.json"]);
    assert_parent_error_private(&parent_error);
}

#[test]
fn under_umask_000_a_default_temp_dir_job_is_private_to_its_user() {
    other_user();
    let dir = open_scratch("private-tmpdir");
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let parent_error = dir.join("parent_error.json");
    let out = run_umask_000(
        &secret_job(&parent_error).env("TMPDIR", tmp.display()),
        &dir,
        "agent",
    );
    assert_failed_with_secret_logged(&out);
    let made: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(made.len(), 1, "one torchelastic_* directory: {made:?}");
    assert!(made[0]
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("torchelastic_")));
    // The torchelastic_* directory itself is the agent's too.
    assert_private(&tmp, &["error.json"]);
    assert_parent_error_private(&parent_error);
}

/// A job that would write a log and an error file if it ran.
fn harmless_job() -> AgentCmd {
    AgentCmd::new()
        .redirects(3)
        .no_python("sh", &["-c", "echo hello"])
}

fn assert_empty(dir: &Path) {
    let left: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(left.is_empty(), "nothing is written there: {left:?}");
}

#[test]
fn a_symlinked_log_dir_is_refused_and_its_target_untouched() {
    let dir = scratch("logdir-link");
    let target = dir.join("target");
    std::fs::create_dir(&target).expect("mkdir");
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let out = harmless_job().log_dir(&link).run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 2, "refused as a bad flag: {}", out.stderr);
    assert!(
        out.stderr.contains("--log-dir")
            && out.stderr.contains("symbolic link")
            && out.stderr.contains("realpath"),
        "names the flag, the problem and the fix: {}",
        out.stderr
    );
    assert!(!out.stdout.contains("hello"), "no worker ran");
    assert_empty(&target);
}

#[test]
fn a_root_agent_refuses_a_log_dir_another_user_owns() {
    let (uid, gid) = other_user();
    let dir = open_scratch("logdir-foreign");
    let theirs = dir.join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    std::os::unix::fs::chown(&theirs, Some(uid), Some(gid)).expect("chown");
    let out = harmless_job().log_dir(&theirs).run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("--log-dir") && out.stderr.contains(&format!("belongs to user {uid}")),
        "{}",
        out.stderr
    );
    assert_empty(&theirs);
    // A directory others may write without the sticky bit: refused too.
    let open = dir.join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = harmless_job().log_dir(&open).run(&dir, "open", LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(out.stderr.contains("sticky"), "{}", out.stderr);
    assert_empty(&open);
}

#[test]
fn a_run_dir_swapped_for_a_link_between_rounds_receives_nothing_at_the_target() {
    // The first round's worker, as root (as someone with write access to the
    // log directory), renames the run directory and plants a link to
    // `target` in its place as its last act, then fails; the second round's
    // files must still land in the renamed directory.
    let dir = scratch("run-dir-swap");
    let logs = dir.join("logs");
    let target = dir.join("target");
    std::fs::create_dir(&target).expect("mkdir");
    let script = format!(
        "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then \
           run=$(dirname \"$(dirname \"$(dirname \"$TORCHELASTIC_ERROR_FILE\")\")\"); \
           mv \"$run\" \"$run.moved\" && ln -s {target} \"$run\" && exit 1; \
           exit 9; \
         fi; echo round-two",
        target = target.display()
    );
    let out = AgentCmd::new()
        .max_restarts(1)
        .redirects(3)
        .log_dir(&logs)
        .no_python("sh", &["-c", &script])
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "the second round succeeds: {}", out.stderr);
    assert_empty(&target);
    let moved: Vec<PathBuf> = std::fs::read_dir(&logs)
        .expect("logs")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".moved"))
        .collect();
    assert_eq!(
        moved.len(),
        1,
        "the worker moved the run dir: {}",
        out.stderr
    );
    assert_eq!(
        std::fs::read_to_string(moved[0].join("attempt_1/0/stdout.log")).expect("round 2's log"),
        "round-two\n"
    );
}

#[test]
fn a_worker_error_file_replaced_by_a_fifo_neither_freezes_the_agent_nor_is_read() {
    // Every round's worker puts a named pipe where its error file goes and
    // fails: the agent must not block opening it (no writer ever comes), so
    // the job ends with its failure, warned about once for three rounds.
    let dir = scratch("error-fifo");
    let started = Instant::now();
    let out = AgentCmd::new()
        .max_restarts(2)
        .no_python(
            "sh",
            &[
                "-c",
                "rm -f \"$TORCHELASTIC_ERROR_FILE\"; mkfifo \"$TORCHELASTIC_ERROR_FILE\"; exit 3",
            ],
        )
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 1, "the job failed: {}", out.stderr);
    assert!(
        out.stderr.contains("exitcode  : 3") || out.stderr.contains("exitcode: 3"),
        "the worker's exit code is reported: {}",
        out.stderr
    );
    let warnings = out.stderr.matches("not a regular file").count();
    assert_eq!(warnings, 1, "one warning, not one a round: {}", out.stderr);
    assert!(out.stderr.contains("named pipe"), "{}", out.stderr);
    assert!(
        started.elapsed() < LIMIT,
        "ended by itself within {LIMIT:?}"
    );
}

#[test]
fn an_agent_stays_responsive_after_a_worker_error_file_was_a_fifo() {
    // The first round's worker leaves a FIFO as its error file and fails;
    // the second round's worker runs on. A SIGTERM to the agent then ends
    // the job promptly: its runtime is not stuck in an open().
    let dir = scratch("error-fifo-term");
    let logs = dir.join("logs");
    let agent = AgentCmd::new()
        .max_restarts(1)
        .log_dir(&logs)
        .no_python(
            "sh",
            &[
                "-c",
                "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then rm -f \"$TORCHELASTIC_ERROR_FILE\"; \
                 mkfifo \"$TORCHELASTIC_ERROR_FILE\"; exit 3; fi; exec sleep 600",
            ],
        )
        .start(&dir, "agent");
    accel_tests::poll_until("the second round started", LIMIT, || {
        let run = std::fs::read_dir(&logs)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(Result::ok)
            .map(|e| e.path());
        match run {
            Some(run) if run.join("attempt_1/0").is_dir() => Ok(()),
            _ => Err(std::fs::read_to_string(&agent.stderr).unwrap_or_default()),
        }
    });
    let sent = Instant::now();
    agent.signal("TERM");
    let out = agent.wait(LIMIT);
    assert_eq!(out.code(), 128 + 15, "{}", out.stderr);
    assert!(out.stderr.contains("named pipe"), "{}", out.stderr);
    assert!(
        sent.elapsed() < Duration::from_secs(60),
        "{:?}",
        sent.elapsed()
    );
}

/// A root agent given a `--topology-file` in a directory others share: a
/// link another user planted there (pointing at a root-only secret) is not
/// followed, and a file another user owns (and could rewrite) is not read;
/// the secret never appears in what the agent prints.
#[test]
fn a_root_agent_refuses_a_topology_file_another_user_planted_or_owns() {
    let dir = scratch("topology-planted");
    // A shared directory, as /tmp is: anyone may create in it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let secret = dir.join("token");
    std::fs::write(&secret, "0123456789abcdef-topology-secret\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let link = dir.join("topology");
    let theirs = dir.join("theirs");
    let planted = as_other_user(&mut Command::new("sh"))
        .args([
            "-c",
            "ln -s \"$0\" \"$1\" && echo dc/rack-1 > \"$2\"",
            &secret.display().to_string(),
            &link.display().to_string(),
            &theirs.display().to_string(),
        ])
        .status()
        .expect("run as the other user");
    assert!(planted.success(), "the other user planted the files");
    for (name, file, says) in [
        ("link", &link, "symbolic link"),
        ("theirs", &theirs, "not this agent's user or root"),
    ] {
        let out = harmless_job()
            .flag("--topology-file", file.display())
            .run(&dir, name, LIMIT);
        assert_ne!(out.code(), 0, "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains("--topology-file") && out.stderr.contains(says),
            "{name}: names the flag and the problem: {}",
            out.stderr
        );
        assert!(
            !out.stderr.contains("topology-secret") && !out.stdout.contains("topology-secret"),
            "{name}: the secret stays out of the output"
        );
        assert!(!out.stdout.contains("hello"), "{name}: no worker ran");
    }
}
