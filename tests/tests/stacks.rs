//! Job-wide stacks: `rdzv-server stacks JOB` asks every node of a running
//! job for its workers' Python stacks (`py-spy dump`) and groups identical
//! ones, the odd rank out first; a FileTimer hang puts the same grouping in
//! the failure report before the hung worker is stopped.
//!
//! The job is 2 nodes x 2 workers, each node its own host (a UTS namespace):
//! rank 3 sleeps inside a function, ranks 0-2 wait for it in a barrier.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use accel_tests::{as_host, bin, poll_until, scratch, worker, Agent, AgentCmd, Server};

use crate::heavy;

const LIMIT: Duration = Duration::from_secs(120);

fn two_by_two(server: &Server, job: &str, dir: &Path, env: &[(&str, &str)]) -> Vec<Agent> {
    ["node-a", "node-b"]
        .iter()
        .map(|host| {
            let prefix = as_host(host);
            let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
            AgentCmd::c10d(&server.addr, job)
                .nnodes(2)
                .nproc(2)
                .max_restarts(0)
                .envs(env)
                .script(worker("stacks_job.py"))
                .start_with(&prefix, dir, host)
        })
        .collect()
}

fn stacks(server: &Server, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin("rdzv-server"))
        .arg("stacks")
        .args(args)
        .args(["--rdzv-endpoint", &server.addr])
        .output()
        .expect("rdzv-server stacks");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ranks(group: &Value) -> Vec<u64> {
    group["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| r["rank"].as_u64().expect("rank"))
        .collect()
}

#[test]
fn rdzv_server_stacks_groups_the_sleeping_rank_apart_from_the_three_in_the_barrier() {
    let _heavy = heavy();
    let server = Server::start();
    let dir = scratch("stacks");
    let place = dir.join("place");
    std::fs::create_dir_all(&place).expect("place dir");
    let place_s = place.to_str().expect("path").to_owned();
    let agents = two_by_two(&server, "stacks-job", &dir, &[("PLACE_DIR", &place_s)]);
    poll_until("every rank is in place", LIMIT, || {
        let n = std::fs::read_dir(&place).map_or(0, Iterator::count);
        if n == 4 {
            Ok(())
        } else {
            Err(format!("{n} of 4 ranks in place"))
        }
    });
    // The ranks print before they enter the barrier or the sleep: give
    // them a moment to be there.
    std::thread::sleep(Duration::from_millis(500));

    let (ok, out, err) = stacks(&server, &["stacks-job", "--json"]);
    assert!(ok, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(doc["nodes_asked"], 2, "{doc}");
    assert_eq!(doc["nodes_answered"], 2, "{doc}");
    let groups = doc["groups"].as_array().expect("groups");
    assert_eq!(
        groups.len(),
        2,
        "one group for the sleeper, one for the barrier:\n{out}"
    );
    assert_eq!(ranks(&groups[0]), [3], "{out}");
    let sleeper = groups[0]["stack"].as_str().expect("stack");
    assert!(
        sleeper.contains("sleeps_inside_a_function (stacks_job.py:"),
        "{sleeper}"
    );
    assert_eq!(groups[0]["ranks"][0]["host"], "node-b", "{out}");
    assert_eq!(ranks(&groups[1]), [0, 1, 2], "{out}");
    let waiting = groups[1]["stack"].as_str().expect("stack");
    assert!(waiting.contains("barrier ("), "{waiting}");
    assert!(!waiting.contains("sleeps_inside_a_function"), "{waiting}");

    // The text: the odd rank out first, then the three, with their hosts.
    let (ok, text, err) = stacks(&server, &["stacks-job"]);
    assert!(ok, "{err}");
    assert!(
        text.starts_with(
            "job stacks-job, round 0: stacks of 4 ranks from 2 of 2 nodes, 2 distinct"
        ),
        "{text}"
    );
    let one = text
        .find("== 1 rank: 3  [node-b: 3]")
        .unwrap_or_else(|| panic!("{text}"));
    let three = text
        .find("== 3 ranks: 0-2  [node-a: 0-1; node-b: 2]")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(one < three, "{text}");

    // Dumping stopped nothing: every worker still runs.
    for a in &agents {
        assert!(
            Path::new(&format!("/proc/{}", a.pid())).exists(),
            "an agent exited"
        );
    }
    // An unknown job: a clear error, not an empty answer.
    let (ok, _, err) = stacks(&server, &["no-such-job"]);
    assert!(!ok);
    assert!(err.contains("no job 'no-such-job'"), "{err}");
    for a in agents {
        a.signal("TERM");
        let _ = a.wait(LIMIT);
    }
}

#[test]
fn a_file_timer_hang_reports_every_ranks_stacks_grouped() {
    let _heavy = heavy();
    let server = Server::start();
    let dir = scratch("stacks-hang");
    // Rank 3 arms a 3 s FileTimer around its sleep: its agent takes it for
    // hung, asks the job's stacks, then stops it; the job has no restarts.
    let agents = two_by_two(
        &server,
        "stacks-hang",
        &dir,
        &[("TORCHELASTIC_ENABLE_FILE_TIMER", "1"), ("HANG_AFTER", "3")],
    );
    let out: Vec<_> = agents.into_iter().map(|a| a.wait(LIMIT)).collect();
    for o in &out {
        assert_eq!(o.status.code(), Some(1), "{}", o.stderr);
    }
    // The node that hosts rank 3 says so, and the failure summary (printed
    // by every agent) carries the hung rank's stack and every rank's,
    // grouped: 1 + 3.
    let all: String = out.iter().map(|o| o.stderr.as_str()).collect();
    assert!(all.contains("a FileTimer expired"), "{all}");
    for o in &out {
        let e = &o.stderr;
        assert!(e.contains("FileTimer 'step' expired: rank 3"), "{e}");
        assert!(
            e.contains("Every rank's stacks when rank 3 hung, grouped"),
            "{e}"
        );
        let one = e
            .find("== 1 rank: 3  [node-b: 3]")
            .unwrap_or_else(|| panic!("{e}"));
        let three = e
            .find("== 3 ranks: 0-2  [node-a: 0-1; node-b: 2]")
            .unwrap_or_else(|| panic!("{e}"));
        assert!(one < three, "{e}");
        assert!(
            e.contains("sleeps_inside_a_function (stacks_job.py:"),
            "{e}"
        );
    }
}

/// `rdzv-server status` (or `stacks`) into a reader that went away, as
/// `| head` does: exit 0, no panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let server = accel_tests::Server::start();
    let bin = accel_tests::bin("rdzv-server");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "'{}' status --rdzv-endpoint '{}' | (exec 0<&-; sleep 1); echo \"rc=${{PIPESTATUS[0]}}\"",
            bin.display(),
            server.addr
        ))
        .output()
        .expect("bash");
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("rc=0"), "{said} {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A worker cannot forge what `rdzv-server stacks` prints: a function
/// name holding a newline and a fake group header stays inside its own
/// group's indented stack, and a right-to-left override is escaped.
#[test]
fn a_frame_name_cannot_pass_for_a_group_header_or_turn_text_around() {
    let _heavy = heavy();
    let server = Server::start();
    let dir = scratch("stacks-forged");
    let place = dir.join("place");
    std::fs::create_dir_all(&place).expect("place dir");
    let agent = AgentCmd::c10d(&server.addr, "forged")
        .nnodes(1)
        .nproc(2)
        .env("PLACE_DIR", place.display())
        .script(worker("forged_stacks.py"))
        .start(&dir, "agent");
    poll_until("both ranks asleep", LIMIT, || {
        let n = std::fs::read_dir(&place).map_or(0, Iterator::count);
        if n == 2 {
            Ok(())
        } else {
            Err(format!("{n} of 2"))
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let (ok, text, err) = stacks(&server, &["forged"]);
    assert!(ok, "{err}");
    let headers: Vec<&str> = text.lines().filter(|l| l.starts_with("==")).collect();
    assert_eq!(
        headers.len(),
        2,
        "one header per rank, none forged:\n{text}"
    );
    assert!(
        headers.iter().all(|h| h.starts_with("== 1 rank: ")),
        "{headers:?}\n{text}"
    );
    assert!(
        !text.contains('\u{202e}'),
        "the override is escaped:\n{text}"
    );
    assert!(
        text.contains("healthy-node"),
        "the forged text is still shown, as data:\n{text}"
    );
    agent.signal("TERM");
    let _ = agent.wait(LIMIT);
}
