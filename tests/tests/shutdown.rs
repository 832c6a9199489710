//! Signals and orphans: SIGTERM reaches workers before SIGKILL; a killed
//! agent leaves no worker (nor a worker's child) alive.

use std::time::{Duration, Instant};

use accel_tests::{
    alive, ensure_quiet_for, eventually, records, scratch, signal, Agent, AgentCmd, Server,
};

const LIMIT: Duration = Duration::from_secs(60);

/// A one-node job of two recording workers that run for ten minutes.
fn one_node(dir: &std::path::Path) -> AgentCmd {
    AgentCmd::new()
        .nproc(2)
        .recording(dir, "t")
        .env("RUN_FOR", "600")
}

fn wait_records(dir: &std::path::Path, n: usize) {
    assert!(
        eventually(Duration::from_secs(30), || records(dir).len() >= n),
        "workers started"
    );
}

#[test]
fn sigterm_reaches_workers_before_sigkill() {
    let dir = scratch("sigterm");
    let agent = one_node(&dir)
        .env("ON_SIGTERM", "exit")
        .start(&dir, "agent");
    wait_records(&dir, 2);
    agent.signal("TERM");
    let out = agent.wait(LIMIT);
    assert_eq!(
        out.code(),
        128 + 15,
        "exit code follows 128+signo: {}",
        out.stderr
    );
    let recs = records(&dir);
    assert_eq!(recs.len(), 2);
    for r in &recs {
        assert_eq!(r.signal, Some(15), "rank {} got SIGTERM", r.rank);
        assert!(!alive(r.pid));
    }
}

#[test]
fn workers_ignoring_sigterm_get_sigkill_after_the_shutdown_timeout() {
    let dir = scratch("sigkill");
    let agent = one_node(&dir)
        .flag("--shutdown-timeout", "1")
        .env("ON_SIGTERM", "ignore")
        .start(&dir, "agent");
    wait_records(&dir, 2);
    let sent = Instant::now();
    agent.signal("INT");
    let out = agent.wait(LIMIT);
    let took = sent.elapsed();
    assert_eq!(out.code(), 128 + 2, "{}", out.stderr);
    assert!(
        took >= Duration::from_millis(900),
        "the grace period was honoured ({took:?})"
    );
    assert!(
        took < Duration::from_secs(15),
        "then SIGKILL ended it ({took:?})"
    );
    for r in records(&dir) {
        assert_eq!(r.signal, Some(2), "SIGINT is forwarded as SIGINT");
        assert!(!alive(r.pid), "rank {} was killed", r.rank);
    }
}

#[test]
fn kill_9_of_an_agent_leaves_no_worker_alive() {
    let dir = scratch("kill9");
    let agent = one_node(&dir).env("SPAWN_CHILD", "1").start(&dir, "agent");
    wait_records(&dir, 2);
    let recs = records(&dir);
    let pids: Vec<u32> = recs
        .iter()
        .flat_map(|r| std::iter::once(r.pid).chain(r.children.clone()))
        .collect();
    assert_eq!(pids.len(), 4, "two workers and their two children");
    assert!(pids.iter().all(|p| alive(*p)));
    agent.signal("KILL");
    let _ = agent.wait(LIMIT);
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))),
        "still alive: {:?}",
        pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
}

#[test]
fn kill_9_of_one_node_stops_the_other_nodes_workers_too() {
    let server = Server::start();
    let dir = scratch("kill9-node");
    let job = AgentCmd::c10d(&server.addr, "kill9-node")
        .nnodes(2)
        .nproc(2)
        .conf("join_timeout=3");
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let tag = format!("n{i}");
            job.clone()
                .recording(&dir, &tag)
                .env("RUN_FOR", "600")
                .env("SPAWN_CHILD", "1")
                .start(&dir, &tag)
        })
        .collect();
    wait_records(&dir, 4);
    let recs = records(&dir);
    let mut agents = agents.into_iter();
    let (first, second) = (agents.next().expect("a0"), agents.next().expect("a1"));
    first.signal("KILL");
    let _ = first.wait(LIMIT);
    // The survivor's workers are stopped at once (membership restart), then it
    // waits for a replacement until join_timeout and exits non-zero.
    assert!(
        eventually(Duration::from_secs(5), || recs.iter().all(|r| !alive(
            r.pid
        ) && r
            .children
            .iter()
            .all(|c| !alive(*c)))),
        "every worker of both nodes is gone"
    );
    let out = second.wait(LIMIT);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("did not form"), "{}", out.stderr);
}

#[test]
fn rdzv_server_sigterm_exits_cleanly_and_agents_stop_after_their_grace() {
    let server = Server::start();
    let dir = scratch("server-term");
    let job = AgentCmd::c10d(&server.addr, "server-term")
        .nnodes(2)
        .nproc(1)
        .conf("reconnect_grace=1");
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let tag = format!("n{i}");
            job.clone()
                .recording(&dir, &tag)
                .env("RUN_FOR", "600")
                .start(&dir, &tag)
        })
        .collect();
    wait_records(&dir, 2);
    server.signal("TERM");
    assert!(
        server.wait(Duration::from_secs(10)).success(),
        "rdzv-server exits 0 on SIGTERM"
    );
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 1, "{}", out.stderr);
        assert!(
            out.stderr.contains("shutting down"),
            "the agent says why: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("could not rejoin within 1 s"),
            "{}",
            out.stderr
        );
    }
    for r in records(&dir) {
        assert!(!alive(r.pid), "rank {}'s worker was stopped", r.rank);
    }
}

#[test]
fn a_second_signal_skips_the_grace_period() {
    let dir = scratch("second-signal");
    let agent = one_node(&dir)
        .flag("--shutdown-timeout", "30")
        .env("ON_SIGTERM", "ignore")
        .start(&dir, "agent");
    wait_records(&dir, 2);
    let sent = Instant::now();
    agent.signal("TERM");
    assert!(eventually(Duration::from_secs(10), || records(&dir)
        .iter()
        .all(|r| r.signal == Some(15))));
    agent.signal("TERM");
    let out = agent.wait(LIMIT);
    assert_eq!(out.code(), 128 + 15, "{}", out.stderr);
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "did not wait the 30 s grace ({:?})",
        sent.elapsed()
    );
    for r in records(&dir) {
        assert!(!alive(r.pid), "rank {} was killed", r.rank);
    }
}

#[test]
fn a_frozen_agents_workers_are_killed_by_the_guard_by_its_fence_deadline() {
    let dir = scratch("frozen");
    // Drop limit: 0.5 s x 2 = 1 s.
    let agent = one_node(&dir)
        .env("SPAWN_CHILD", "1")
        .conf("keep_alive_interval=0.5,keep_alive_max_attempt=2")
        .start(&dir, "agent");
    wait_records(&dir, 2);
    let recs = records(&dir);
    let pids: Vec<u32> = recs
        .iter()
        .flat_map(|r| std::iter::once(r.pid).chain(r.children.clone()))
        .collect();
    assert_eq!(pids.len(), 4, "two workers and their two children");
    // Alive agents beat: the workers outlive several limits. Nothing marks
    // "the guard would have fired by now", so the workers are watched
    // alive over three drop limits.
    ensure_quiet_for(
        "a running agent keeps its workers",
        Duration::from_secs(3),
        || match pids.iter().find(|p| !alive(**p)) {
            Some(p) => Err(format!("pid {p} died")),
            None => Ok(()),
        },
    );
    let frozen = Instant::now();
    agent.signal("STOP");
    assert!(
        eventually(Duration::from_secs(10), || pids.iter().all(|p| !alive(*p))),
        "still alive: {:?}",
        pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
    // The guard kills by the fence deadline its last beat carried: the
    // last answered keep-alive's send time (every 0.5 s, so up to 0.5 s
    // before the freeze) plus the 1 s drop limit, less 50 ms, and not
    // before two beats (2 × 125 ms) went missing.
    let killed = frozen.elapsed();
    assert!(
        killed >= Duration::from_millis(300) && killed < Duration::from_millis(1200),
        "by the fence deadline, within the drop limit: {killed:?}"
    );
    agent.signal("CONT");
    // Woken, the agent hears from the guard that it fenced the workers:
    // their exits are not a failure.
    let stderr = agent.stderr.clone();
    let read = || std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(10), || read()
            .contains("its guard killed the workers")),
        "{}",
        read()
    );
    assert!(!read().contains("worker failed"), "{}", read());
    agent.signal("KILL");
    let out = agent.wait(LIMIT);
    assert!(
        out.stderr.contains("accel-guard: the agent has not run"),
        "{}",
        out.stderr
    );
    eprintln!("frozen agent: workers killed {killed:?} after SIGSTOP");
}

/// An agent whose stderr reader went away (the notebook kernel or SSH
/// session that started it died) runs and stops as any other: a log line
/// with nowhere to go is dropped, not a reason to stop supervising.
#[test]
fn an_agent_whose_log_reader_is_gone_still_runs_and_stops_in_order() {
    let dir = scratch("deaf");
    let mut child = one_node(&dir)
        .env("ON_SIGTERM", "exit")
        .env("ACCEL_LOG", "info")
        .command()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start accel-agent");
    // Every line it logs from now on fails with EPIPE.
    drop(child.stderr.take());
    wait_records(&dir, 2);
    signal(child.id(), "TERM");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("the agent did not stop within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    for r in &records(&dir) {
        assert_eq!(r.signal, Some(15), "rank {} got SIGTERM", r.rank);
        assert!(!alive(r.pid));
    }
}

/// The agent reaps its guard before it exits: nothing of it is left in its
/// process group (not even a zombie for whatever adopts orphans), run
/// after run.
#[test]
fn an_agent_that_returned_leaves_nothing_in_its_process_group() {
    use std::os::unix::process::CommandExt;
    let dir = scratch("guard-reaped");
    for run in 0..3 {
        let status = AgentCmd::new()
            .nproc(4)
            .no_python("true", &[])
            .command()
            .process_group(0)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .current_dir(&dir)
            .spawn()
            .map(|mut child| (child.id(), child.wait()))
            .expect("agent");
        let (pgid, exit) = status;
        assert!(exit.expect("waited").success(), "run {run}");
        let left: Vec<String> = std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // pid (comm) state ppid pgrp ...
                let rest = &stat[stat.rfind(')')? + 2..];
                let fields: Vec<&str> = rest.split(' ').collect();
                (fields.get(2)?.parse::<u32>().ok()? == pgid).then(|| stat.clone())
            })
            .collect();
        assert!(
            left.is_empty(),
            "run {run}: left in the agent's group: {left:?}"
        );
    }
}

/// A number the manifest gives: the first `value: "N"` after `- name: VAR`,
/// or `KEY: N`.
fn manifest_seconds(text: &str, key: &str) -> u64 {
    let after = |s: &str| {
        s.trim()
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .trim_end_matches(['"', ' '])
            .parse::<u64>()
    };
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if line == format!("- name: {key}") {
            let value = lines.next().expect("a value line");
            return after(value).unwrap_or_else(|e| panic!("{key}: {value}: {e}"));
        }
        if let Some(rest) = line.strip_prefix(&format!("{key}:")) {
            return after(rest).unwrap_or_else(|e| panic!("{key}: {rest}: {e}"));
        }
    }
    panic!("{key} is not in the manifest")
}

/// A drain under the training Job's settings (deploy/kubernetes/training/
/// job/job.yaml's PET_SHUTDOWN_TIMEOUT and terminationGracePeriodSeconds,
/// as the kubelet applies them: SIGTERM, then SIGKILL at the grace): workers
/// that trap SIGTERM and save for 90 s finish, and the agent exits before
/// the kubelet would kill it.
#[test]
fn a_drain_under_the_kubernetes_jobs_settings_lets_workers_save_for_90_s() {
    let job = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/kubernetes/training/job/job.yaml"),
    )
    .expect("the training Job's manifest");
    let shutdown = manifest_seconds(&job, "PET_SHUTDOWN_TIMEOUT");
    let grace = Duration::from_secs(manifest_seconds(&job, "terminationGracePeriodSeconds"));
    let dir = scratch("drain-k8s");
    let worker = dir.join("worker.sh");
    std::fs::write(
        &worker,
        "#!/bin/sh\n\
         out=\"$DRAIN_DIR/rank-$RANK\"\n\
         trap 'i=0; while [ \"$i\" -lt 90 ]; do echo \"saving $i\" >>\"$out\"; i=$((i + 1)); sleep 1; done; echo saved >>\"$out\"; exit 0' TERM\n\
         echo started >>\"$out\"\n\
         while :; do sleep 1; done\n",
    )
    .expect("worker script");
    std::fs::set_permissions(&worker, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let agent = AgentCmd::new()
        .nproc(2)
        .env("PET_SHUTDOWN_TIMEOUT", shutdown)
        .env("DRAIN_DIR", dir.display())
        .no_python(&worker, &[])
        .start(&dir, "agent");
    let read =
        |rank: u32| std::fs::read_to_string(dir.join(format!("rank-{rank}"))).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(30), || (0..2)
            .all(|r| read(r).contains("started"))),
        "workers started"
    );
    let sent = Instant::now();
    agent.signal("TERM");
    let out = agent.wait(grace + Duration::from_secs(30));
    let took = sent.elapsed();
    for r in 0..2 {
        let log = read(r);
        assert!(
            log.lines().filter(|l| l.starts_with("saving ")).count() == 90
                && log.trim_end().ends_with("saved"),
            "rank {r} did not finish saving within PET_SHUTDOWN_TIMEOUT={shutdown}:\n{log}\n{}",
            out.stderr
        );
    }
    assert!(
        took < grace,
        "the agent exited {took:?} after SIGTERM: past terminationGracePeriodSeconds ({grace:?}), the kubelet would have killed it"
    );
    assert_eq!(out.code(), 128 + 15, "{}", out.stderr);
}
