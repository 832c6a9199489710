//! Input that once crashed a binary or exhausted a resource, given to the real
//! binaries as a user (or a hostile configuration file) would: each is a
//! clear usage error now, and a full log disk costs the logs, not the job.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use accel_tests::{
    bin, poll_until, run_agent, run_logged, scratch, status_jobs, wait_for_address_file, Finished,
};

const LIMIT: Duration = Duration::from_secs(60);

/// A usage error: exit code `code`, one clear message, no panic.
fn assert_refused(out: &Finished, code: i32, expected: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit status {:?} (a crash is 101 in debug builds, 134 in release)\nstderr:\n{}",
        out.status,
        out.stderr
    );
    assert!(out.stderr.contains(expected), "stderr:\n{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "stderr:\n{}", out.stderr);
}

#[test]
fn huge_agent_durations_are_usage_errors() {
    let dir = scratch("huge-durations");
    let cases: [&[&str]; 4] = [
        &["--monitor-interval", "100000000000000000000"],
        &["--rdzv-conf", "join_timeout=10000000000000000000"],
        // Once accepted, then aborted the agent after its job had succeeded.
        &["--exit-barrier-timeout", "10000000000000000000"],
        &["--shutdown-timeout", "1e20"],
    ];
    for (i, flags) in cases.iter().enumerate() {
        let mut args = flags.to_vec();
        args.extend(["--no-python", "true"]);
        let out = run_agent(&dir, &format!("case{i}"), &args, &[], LIMIT);
        assert_refused(&out, 2, "is too long; at most 10 years");
        assert!(
            out.stderr.contains(flags[0]),
            "names the flag: {}",
            out.stderr
        );
    }
    // The environment fallback goes through the same parser.
    let out = run_agent(
        &dir,
        "env",
        &["--no-python", "true"],
        &[("PET_MONITOR_INTERVAL", "1e300")],
        LIMIT,
    );
    assert_refused(
        &out,
        2,
        "invalid value for --monitor-interval: '1e300' is too long",
    );
}

#[test]
fn the_longest_durations_run_a_job() {
    // Every deadline the agent computes from these still fits in the clock.
    let dir = scratch("longest-durations");
    let out = run_agent(
        &dir,
        "agent",
        &[
            "--monitor-interval",
            "315576000",
            "--exit-barrier-timeout",
            "87660h",
            "--shutdown-timeout",
            "315576000",
            "--rdzv-conf",
            "join_timeout=315576000,last_call_timeout=315576000,read_timeout=315576000,\
             keep_alive_interval=315576000,keep_alive_max_attempt=4294967295,\
             reconnect_grace=315576000",
            "--nproc-per-node",
            "2",
            "--no-python",
            "true",
        ],
        &[],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
}

#[test]
fn huge_server_ttl_is_a_usage_error_and_the_longest_serves_a_job() {
    let dir = scratch("server-ttl");
    let server = || {
        let mut c = Command::new(bin("rdzv-server"));
        c.args(["--bind", "127.0.0.1:0"]);
        c.env("RDZV_METRICS_BIND", "127.0.0.1:0");
        c
    };
    let mut cmd = server();
    cmd.args(["--finished-job-ttl", "100000000000000000000"]);
    let out = run_logged(cmd, &dir, "huge", LIMIT);
    assert_refused(
        &out,
        2,
        "invalid value for --finished-job-ttl: '100000000000000000000' is too long; at most 10 years",
    );
    let mut cmd = server();
    cmd.env("RDZV_FINISHED_JOB_TTL", "1e20");
    let out = run_logged(cmd, &dir, "huge-env", LIMIT);
    assert_refused(&out, 2, "is too long; at most 10 years");
    // Ten years: a job finishes on it and the server outlives the job.
    let stderr = dir.join("ok.stderr");
    let address_file = dir.join("ok.addresses");
    let mut server = server()
        .args(["--finished-job-ttl", "315576000"])
        .arg("--address-file")
        .arg(&address_file)
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&stderr).expect("stderr"))
        .spawn()
        .expect("start rdzv-server");
    let (addr, _) = wait_for_address_file(&address_file, &mut server, &|| {
        std::fs::read_to_string(&stderr).unwrap_or_default()
    });
    let out = run_agent(
        &dir,
        "agent",
        &[
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            &addr,
            "--rdzv-id",
            "ttl",
            "--no-python",
            "true",
        ],
        &[],
        LIMIT,
    );
    assert_eq!(out.code(), 0, "{}", out.stderr);
    // The server has taken the job's end (and set its ten-year deadline)
    // when it reports the job succeeded; then it must still be there.
    poll_until("the server reports the job's end", LIMIT, || {
        if let Ok(Some(status)) = server.try_wait() {
            return Ok(format!("exited: {status}"));
        }
        let jobs = status_jobs(&addr, &[])?;
        match jobs.iter().find(|j| j["job_id"] == "ttl") {
            Some(j) if j["phase"] == "succeeded" => Ok(String::new()),
            _ => Err(format!("{jobs:?}")),
        }
    });
    let alive = server.try_wait().expect("try_wait").is_none();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        alive,
        "the server outlived the finished job: {}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
}

#[test]
fn long_values_are_quoted_as_excerpts() {
    let dir = scratch("long-values");
    let long = "9".repeat(100_000);
    let conf = format!("join_timeout={long}");
    let key = format!("{}=1", "k".repeat(100_000));
    let cases: [(&[&str], &str); 4] = [
        // clap's own message, clipped.
        (
            &["--max-restarts", &long],
            "for '--max-restarts <MAX_RESTARTS>'",
        ),
        (
            &["--monitor-interval", &long],
            "is too long; at most 10 years",
        ),
        (&["--rdzv-conf", &conf], "is too long; at most 10 years"),
        (&["--rdzv-conf", &key], "--rdzv-conf: unknown key 'kkkk"),
    ];
    for (i, (flags, expected)) in cases.iter().enumerate() {
        let mut args = flags.to_vec();
        args.extend(["--no-python", "true"]);
        let out = run_agent(&dir, &format!("case{i}"), &args, &[], LIMIT);
        assert_refused(&out, 2, expected);
        assert!(
            out.stderr.len() < 1500 && out.stderr.contains("… (1000"),
            "{} bytes of stderr:\n{}",
            out.stderr.len(),
            out.stderr
        );
    }
}

/// "Billion laughs": nine lines, each a list of nine of the previous line's.
fn alias_bomb() -> String {
    let mut text = String::from("distributed_type: 'NO'\nl0: &l0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
    for i in 1..9 {
        let refs = vec![format!("*l{}", i - 1); 9].join(",");
        text.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
    }
    text
}

/// `accel ARGS` with its address space capped, so a file that expands in
/// memory fails the test instead of the machine.
fn accel_capped(dir: &Path, name: &str, args: &[&str]) -> (Finished, Duration) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 1048576 && exec \"$@\"")
        .arg("sh")
        .arg(bin("accel"))
        .args(args)
        .env("HF_HOME", dir.join("hf"));
    let started = Instant::now();
    let out = run_logged(cmd, dir, name, LIMIT);
    (out, started.elapsed())
}

#[test]
fn a_yaml_alias_bomb_is_refused_at_once() {
    let dir = scratch("alias-bomb");
    let file = dir.join("bomb.yaml");
    std::fs::write(&file, alias_bomb()).expect("write");
    let path = file.to_str().expect("path");
    let (out, took) = accel_capped(
        &dir,
        "launch",
        &["launch", "--config_file", path, "--no_python", "true"],
    );
    assert_refused(
        &out,
        1,
        "is not valid YAML: line 2: YAML anchors (&name) and aliases (*name) are not accepted",
    );
    assert!(took < Duration::from_secs(5), "refused in {took:?}");
    let (out, _) = accel_capped(&dir, "update", &["config", "update", "--config_file", path]);
    assert_refused(&out, 1, "aliases (*name) are not accepted");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        alias_bomb(),
        "the file is left as it was"
    );
}

#[test]
fn a_2_mib_config_file_is_refused_unparsed() {
    let dir = scratch("big-config");
    let file = dir.join("big.yaml");
    // Valid YAML (a long comment), so only its size can refuse it.
    let text = format!("distributed_type: 'NO'\n#{}\n", "x".repeat(2 << 20));
    std::fs::write(&file, &text).expect("write");
    let path = file.to_str().expect("path");
    let size = text.len();
    for (name, args) in [
        (
            "launch",
            vec!["launch", "--config_file", path, "--no_python", "true"],
        ),
        ("update", vec!["config", "update", "--config_file", path]),
        ("env", vec!["env", "--config_file", path]),
    ] {
        let (out, _) = accel_capped(&dir, name, &args);
        assert_refused(
            &out,
            1,
            &format!("is {size} bytes; a configuration file may be at most 1 MiB"),
        );
    }
}

/// Runs `accel-agent ARGS` with `--log-dir` on a 64 KiB tmpfs that is
/// nearly full, in a private mount namespace (needs root). Afterwards rank
/// 0's stdout.log is copied to `dir/rank0-stdout.log`.
fn agent_on_full_disk(dir: &Path, name: &str, args: &[&str]) -> Finished {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).expect("logs dir");
    let script = "mount -t tmpfs -o size=64k accel-full \"$0\" || exit 90; \
                  head -c 57344 /dev/zero > \"$0/fill\"; \
                  \"$@\"; rc=$?; \
                  cat \"$0\"/*/attempt_0/0/stdout.log > \"$COPY\" 2>/dev/null; \
                  exit $rc";
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", script])
        .arg(&logs)
        .arg(bin("accel-agent"))
        .args(["--log-dir", logs.to_str().expect("path")])
        .args(args)
        .env("COPY", dir.join("rank0-stdout.log"))
        .env("ACCEL_LOG", "info");
    let out = run_logged(cmd, dir, name, LIMIT);
    assert_ne!(
        out.status.code(),
        Some(90),
        "cannot mount a tmpfs: {}",
        out.stderr
    );
    out
}

/// 3,000 numbered lines to stdout and to stderr; `sh -e` fails the worker
/// at the first write that fails.
const CHATTY: &str = "i=0; while [ $i -lt 3000 ]; do echo out-$LOCAL_RANK-$i; \
                      echo err-$LOCAL_RANK-$i >&2; i=$((i+1)); done";

fn warnings_per_rank(stderr: &str, ranks: u32) {
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("cannot write a worker's log file"))
        .collect();
    assert_eq!(warnings.len(), ranks as usize, "once per rank:\n{stderr}");
    for r in 0..ranks {
        let w = warnings
            .iter()
            .find(|l| l.contains(&format!("local_rank={r} ")))
            .unwrap_or_else(|| panic!("no warning for rank {r}:\n{stderr}"));
        assert!(
            w.contains("No space left on device") && w.contains(".log"),
            "names the file and the OS error: {w}"
        );
    }
    assert!(!stderr.contains("SIGPIPE"), "{stderr}");
}

#[test]
fn tee_on_a_full_disk_keeps_the_job_and_the_console() {
    let dir = scratch("full-disk-tee");
    let out = agent_on_full_disk(
        &dir,
        "agent",
        &[
            "--nproc-per-node",
            "2",
            "--tee",
            "3",
            "--no-python",
            "sh",
            "-ec",
            CHATTY,
        ],
    );
    assert_eq!(out.code(), 0, "the job succeeds:\n{}", out.stderr);
    let stdout: HashSet<&str> = out.stdout.lines().collect();
    let stderr: HashSet<&str> = out.stderr.lines().collect();
    for r in 0..2 {
        for i in 0..3000 {
            let line = format!("[default{r}]:out-{r}-{i}");
            assert!(
                stdout.contains(line.as_str()),
                "console stdout lacks {line}"
            );
            let line = format!("[default{r}]:err-{r}-{i}");
            assert!(
                stderr.contains(line.as_str()),
                "console stderr lacks {line}"
            );
        }
    }
    warnings_per_rank(&out.stderr, 2);
    // What reached the file is a clean beginning of the stream.
    let saved = std::fs::read_to_string(dir.join("rank0-stdout.log")).expect("copied log");
    let full: String = (0..3000).map(|i| format!("out-0-{i}\n")).collect();
    assert!(
        full.starts_with(&saved) && saved.len() < full.len(),
        "{} of {} bytes, a prefix",
        saved.len(),
        full.len()
    );
}

#[test]
fn redirects_on_a_full_disk_keep_the_job() {
    let dir = scratch("full-disk-redirects");
    let out = agent_on_full_disk(
        &dir,
        "agent",
        &[
            "--nproc-per-node",
            "2",
            "--redirects",
            "3",
            "--no-python",
            "sh",
            "-ec",
            CHATTY,
        ],
    );
    assert_eq!(
        out.code(),
        0,
        "the workers' writes never fail (they write to the agent):\n{}",
        out.stderr
    );
    assert!(
        !out.stdout.contains("out-0-"),
        "redirected output stays off the console"
    );
    warnings_per_rank(&out.stderr, 2);
}

#[test]
fn the_address_file_names_what_the_server_bound_and_an_unwritable_one_stops_it() {
    let dir = scratch("address-file");
    // Port 0 for both, metrics off: the file names the gRPC port only.
    let path = dir.join("addresses");
    let mut server = Command::new(bin("rdzv-server"))
        .args(["--bind", "127.0.0.1:0", "--metrics-bind", "off"])
        .arg("--address-file")
        .arg(&path)
        .stderr(std::fs::File::create(dir.join("server.stderr")).expect("stderr"))
        .spawn()
        .expect("start rdzv-server");
    let (addr, metrics) = wait_for_address_file(&path, &mut server, &|| String::new());
    let text = std::fs::read_to_string(&path).expect("read");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(text, format!("grpc={addr}\n"));
    assert_eq!(metrics, None);
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{addr}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    // A path it cannot write: a start-up error naming the flag.
    let mut cmd = Command::new(bin("rdzv-server"));
    cmd.args(["--bind", "127.0.0.1:0", "--metrics-bind", "off"])
        .env("RDZV_ADDRESS_FILE", dir.join("no/such/dir/addresses"));
    let out = run_logged(cmd, &dir, "unwritable", LIMIT);
    assert_refused(&out, 2, "cannot write --address-file");
}

/// `accel launch --machine_rank $RANK` with RANK unset takes the script for
/// the rank: a usage error, exit 2 as accelerate's argparse, naming the
/// flag; a launch that the flags parse but cannot make still exits 1.
#[test]
fn an_accel_launch_flag_of_the_wrong_type_exits_2_as_argparse() {
    let dir = scratch("launch-usage");
    let mut cmd = Command::new(bin("accel"));
    cmd.args(["launch", "--machine_rank", "train.py"]);
    let out = run_logged(cmd, &dir, "rank", LIMIT);
    assert_refused(&out, 2, "--machine_rank: invalid int value 'train.py'");
    let mut cmd = Command::new(bin("accel"));
    cmd.args(["launch", "--num_processes"]);
    let out = run_logged(cmd, &dir, "missing", LIMIT);
    assert_refused(&out, 2, "--num_processes expects a value");
}
