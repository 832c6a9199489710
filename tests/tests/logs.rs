//! Worker output: tee, redirects, prefixes, filters, the log tree, odd output.

use std::path::{Path, PathBuf};
use std::time::Duration;

use accel_tests::{eventually, scratch, AgentCmd};

const LIMIT: Duration = Duration::from_secs(60);

/// The single `<run_id>_<random>` directory under a `--log-dir`.
fn run_dir(log_dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(log_dir)
        .expect("log dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

#[test]
fn tee_prefixes_every_placeholder_and_keeps_files_raw() {
    let dir = scratch("tee");
    let logs = dir.join("logs");
    let out = AgentCmd::new()
        .nproc(2)
        .tee(3)
        .flag("--role", "trainer")
        .log_dir(&logs)
        .flag(
            "--log-line-prefix-template",
            "<${role_name}|${rank}|${local_rank}|${hostname}|${node_rank}|${nope}>",
        )
        .no_python(
            "sh",
            &["-c", "echo out-$LOCAL_RANK; echo err-$LOCAL_RANK >&2"],
        )
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_owned();
    for r in 0..2 {
        let prefix = format!("<trainer|{r}|{r}|{host}|0|${{nope}}>");
        assert!(
            out.stdout.lines().any(|l| l == format!("{prefix}out-{r}")),
            "stdout: {}",
            out.stdout
        );
        assert!(
            out.stderr.lines().any(|l| l == format!("{prefix}err-{r}")),
            "stderr: {}",
            out.stderr
        );
        let rank_dir = run_dir(&logs).join("attempt_0").join(r.to_string());
        assert_eq!(
            std::fs::read_to_string(rank_dir.join("stdout.log")).expect("stdout.log"),
            format!("out-{r}\n")
        );
        assert_eq!(
            std::fs::read_to_string(rank_dir.join("stderr.log")).expect("stderr.log"),
            format!("err-{r}\n")
        );
    }
}

#[test]
fn default_prefix_and_filters() {
    let dir = scratch("filters");
    let job = AgentCmd::new()
        .nproc(3)
        .no_python("sh", &["-c", "echo line-$RANK"]);
    let teed = job.clone().tee(1);
    let all = teed.run(&dir, "all", LIMIT);
    for r in 0..3 {
        assert!(
            all.stdout.contains(&format!("[default{r}]:line-{r}\n")),
            "{}",
            all.stdout
        );
    }
    let local = teed
        .clone()
        .flag("--local-ranks-filter", "0,2")
        .run(&dir, "local", LIMIT);
    assert!(
        local.stdout.contains("[default0]:line-0") && local.stdout.contains("[default2]:line-2")
    );
    assert!(!local.stdout.contains("line-1"), "{}", local.stdout);
    let global = teed.flag("--ranks-filter", "1").run(&dir, "global", LIMIT);
    assert_eq!(global.stdout.trim(), "[default1]:line-1");
    // Without tee or redirects, a filtered rank's output is dropped (as torchrun).
    let plain = job
        .flag("--local-ranks-filter", "1")
        .run(&dir, "plain", LIMIT);
    assert_eq!(plain.stdout.trim(), "line-1");
}

#[test]
fn the_log_tree_keeps_every_attempt() {
    let dir = scratch("tree");
    let logs = dir.join("logs");
    // Local rank 1 fails in attempts 0 and 1, once rank 0 has written its
    // lines (a marker file says so: on a loaded machine rank 0's shell may
    // start after rank 1 failed, and be stopped before it wrote anything);
    // attempt 2 succeeds.
    let script = "A=$TORCHELASTIC_RESTART_COUNT; echo attempt-$A-rank-$LOCAL_RANK; echo oops >&2; \
                  if [ $LOCAL_RANK = 0 ]; then touch \"$MARKS/$A\"; fi; \
                  if [ $LOCAL_RANK = 1 ] && [ $A -lt 2 ]; then \
                    i=0; while [ ! -e \"$MARKS/$A\" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; \
                    exit 4; fi; sleep 0.3";
    let marks = dir.join("marks");
    std::fs::create_dir_all(&marks).expect("marks dir");
    let out = AgentCmd::new()
        .env("MARKS", marks.display())
        .nproc(2)
        .max_restarts(2)
        .redirects(3)
        .log_dir(&logs)
        .no_python("sh", &["-c", script])
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        !out.stdout.contains("attempt-"),
        "redirected output stays off the console: {}",
        out.stdout
    );
    let run = run_dir(&logs);
    let mut attempts: Vec<String> = std::fs::read_dir(&run)
        .expect("run dir")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .collect();
    attempts.sort();
    assert_eq!(attempts, ["attempt_0", "attempt_1", "attempt_2"]);
    for a in 0..3 {
        for r in 0..2 {
            let d = run.join(format!("attempt_{a}")).join(r.to_string());
            assert_eq!(
                std::fs::read_to_string(d.join("stdout.log")).expect("stdout"),
                format!("attempt-{a}-rank-{r}\n")
            );
            assert_eq!(
                std::fs::read_to_string(d.join("stderr.log")).expect("stderr"),
                "oops\n"
            );
        }
    }
}

#[test]
fn bytes_that_are_not_utf8_pass_through() {
    let dir = scratch("binary");
    let logs = dir.join("logs");
    let out = AgentCmd::new()
        .tee(1)
        .log_dir(&logs)
        .no_python("sh", &["-c", r"printf 'a\377\376b\nc\200'"])
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let raw = std::fs::read(out_path(&dir)).expect("agent stdout");
    assert_eq!(
        raw, b"[default0]:a\xff\xfeb\n[default0]:c\x80\n",
        "partial last line flushed, bytes kept"
    );
    let file = std::fs::read(run_dir(&logs).join("attempt_0/0/stdout.log")).expect("log");
    assert_eq!(file, b"a\xff\xfeb\nc\x80");
}

fn out_path(dir: &Path) -> PathBuf {
    dir.join("agent.stdout")
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_100_mb_line_without_newline_does_not_grow_the_agent() {
    let dir = scratch("bigline");
    let logs = dir.join("logs");
    let script = "head -c 104857600 /dev/zero | tr '\\0' x; sleep 3";
    let agent = AgentCmd::new()
        .tee(1)
        .log_dir(&logs)
        .no_python("sh", &["-c", script])
        .start(&dir, "agent");
    let pid = agent.pid();
    let log = || {
        std::fs::read_dir(&logs)
            .ok()
            .and_then(|mut d| d.next())
            .map(|e| e.expect("e").path().join("attempt_0/0/stdout.log"))
    };
    assert!(
        eventually(Duration::from_secs(40), || log()
            .and_then(|p| std::fs::metadata(p).ok())
            .is_some_and(|m| m.len() == 104_857_600)),
        "all 100 MB reached the log file"
    );
    let hwm = vm_hwm_kib(pid).expect("agent memory");
    let out = agent.wait(LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        hwm < 48 * 1024,
        "the agent's peak RSS stayed small: {hwm} KiB"
    );
    assert_eq!(
        std::fs::metadata(out_path(&dir)).expect("console").len(),
        104_857_600 + 1600 * ("[default0]:".len() as u64 + 1)
    );
}

/// What a newcomer reads of a plain one-node run: where `--log-dir` put
/// the logs (as torchrun says), and no progress line that cannot be acted
/// on (`0 of 1 nodes ready, 1 missing`).
#[test]
fn a_one_node_run_says_where_its_logs_are_and_no_idle_progress() {
    let dir = scratch("log-where");
    let logs = dir.join("logs");
    let out = AgentCmd::new()
        .nproc(2)
        .log_dir(&logs)
        .no_python("true", &[])
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let run = run_dir(&logs);
    assert!(
        out.stderr.contains("worker logs and error files go to")
            && out.stderr.contains(&run.display().to_string()),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("nodes ready"), "{}", out.stderr);
}
