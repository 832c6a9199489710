//! `--health-check` run by a real agent: what a hostile or sloppy check
//! can do to the agent's log and to the node.

use std::time::{Duration, Instant};

use accel_tests::{poll_until, scratch, AgentCmd};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_failing_checks_reason_is_its_escaped_tail_and_its_setsid_child_is_killed() {
    let dir = scratch("health-tail");
    let pid_file = dir.join("escaped.pid");
    // 100 KB of noise, then the reason, wrapped in terminal escapes; and a
    // child that leaves the check's process group holding its output.
    let check = format!(
        "setsid sleep 300 & echo $! > {}; head -c 100000 /dev/zero | tr '\\0' x; \
         printf '\\033[2Jthe fan \\033]0;pwned\\007failed\\n' >&2; exit 1",
        pid_file.display()
    );
    let agent = AgentCmd::standalone()
        .nproc(1)
        .flag("--health-check", &check)
        .no_python("true", &[])
        .start(&dir, "agent");
    let stderr = || std::fs::read_to_string(dir.join("agent.stderr")).unwrap_or_default();
    poll_until("the unhealthy node's reason", LIMIT, || {
        let text = stderr();
        if text.contains("this node is unhealthy") {
            Ok(())
        } else {
            Err(text)
        }
    });
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("the check's child's pid")
        .trim()
        .parse()
        .expect("a pid");
    let running = || accel_tests::alive(pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    while running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone = !running();
    agent.signal("TERM");
    let out = agent.wait(LIMIT);
    assert!(gone, "the check's setsid child {pid} outlived it");
    assert!(
        out.stderr.contains("the fan \\u{1b}]0;pwned\\u{7}failed"),
        "the end of the output, escaped:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("exited with code 1: …x"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains('\u{1b}') && !out.stderr.contains('\u{7}'),
        "no raw escape reaches the log"
    );
    let longest = out.stderr.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4000, "a line of {longest} bytes");
}

/// Issue 50, B8: an agent killed (`kill -9`) while its health check runs
/// leaves none of the check's processes behind: not the check, not its
/// background child, not a child that left for a session of its own.
#[test]
fn an_agent_killed_mid_check_leaves_none_of_its_processes() {
    let dir = scratch("health-kill");
    let pids = dir.join("check.pids");
    let check = format!(
        "sleep 300 & echo $! >> {p}; setsid sleep 300 & echo $! >> {p}; echo $$ >> {p}; \
         exec sleep 300",
        p = pids.display()
    );
    let agent = AgentCmd::standalone()
        .nproc(1)
        .flag("--health-check", &check)
        .flag("--health-check-timeout", "10m")
        .no_python("true", &[])
        .start(&dir, "agent");
    let pids: Vec<u32> = poll_until("the check's three processes", LIMIT, || {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let found: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        match found.len() {
            3 => Ok(found),
            n => Err(format!("{n} pids: {text:?}")),
        }
    });
    for pid in &pids {
        assert!(accel_tests::alive(*pid), "{pid} runs while the check does");
    }
    agent.signal("KILL");
    let out = agent.wait(LIMIT);
    assert!(out.status.code().is_none(), "killed: {:?}", out.status);
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| accel_tests::alive(*p))
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever failed the test, leave nothing running.
    for p in &left {
        accel_tests::signal(*p, "KILL");
    }
    assert!(
        left.is_empty(),
        "the check's processes {left:?} (of {pids:?}) outlived the killed agent"
    );
}
