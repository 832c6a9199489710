//! Elastic membership: MIN:MAX, last call, late joiners, lost nodes, spares.

use std::time::{Duration, Instant};

use accel_tests::{alive, eventually, records, scratch, Agent, AgentCmd, Netns, Record, Server};

const LIMIT: Duration = Duration::from_secs(60);

fn elastic_agent(
    server: &Server,
    dir: &std::path::Path,
    name: &str,
    job: &str,
    nnodes: &str,
    conf: &str,
    env: &[(&str, &str)],
) -> Agent {
    AgentCmd::c10d(&server.addr, job)
        .nnodes(nnodes)
        .nproc(2)
        .conf(conf)
        .recording(dir, name)
        .env("RECORD_EACH_ROUND", "1")
        .envs(env)
        .start(dir, name)
}

fn with_world(recs: &[Record], world: u32) -> Vec<&Record> {
    recs.iter()
        .filter(|r| r.var("WORLD_SIZE") == world.to_string())
        .collect()
}

/// torch 2.15's rdzv_conf key `cas_backoff_max_seconds` is taken (here:
/// the longest wait between attempts to reach the rendezvous) and a job
/// runs with it.
#[test]
fn a_job_runs_with_torch_2_15s_cas_backoff_max_seconds() {
    let server = Server::start();
    let dir = scratch("cas-backoff");
    let agents: Vec<Agent> = ["a", "b"]
        .iter()
        .map(|n| {
            AgentCmd::c10d(&server.addr, "cas")
                .nnodes("2")
                .nproc(1)
                .conf("cas_backoff_max_seconds=0.5")
                .recording(&dir, n)
                .start(&dir, n)
        })
        .collect();
    for a in agents {
        let out = a.wait(Duration::from_secs(60));
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    assert_eq!(records(&dir).len(), 2);
}

#[test]
fn a_late_joiner_scales_the_job_up_without_spending_restarts() {
    let server = Server::start();
    let dir = scratch("late");
    let conf = "last_call_timeout=1";
    let env = [("RUN_FOR", "6")];
    let a = elastic_agent(&server, &dir, "a", "late", "2:3", conf, &env);
    let b = elastic_agent(&server, &dir, "b", "late", "2:3", conf, &env);
    // Two nodes are enough once the last call closes.
    assert!(
        eventually(Duration::from_secs(20), || with_world(&records(&dir), 4)
            .len()
            == 4),
        "ran with 2 nodes"
    );
    let c = elastic_agent(&server, &dir, "c", "late", "2:3", conf, &env);
    for agent in [a, b, c] {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    let big = with_world(&recs, 6);
    assert_eq!(big.len(), 6, "the next round ran with 3 nodes");
    assert!(
        recs.iter()
            .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "0"),
        "membership changes are free"
    );
    let mut ranks: Vec<u32> = big.iter().map(|r| r.rank).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3, 4, 5]);
    // The newcomer follows the nodes that were there.
    assert!(big
        .iter()
        .filter(|r| r.var("AGENT_TAG") == "c")
        .all(|r| r.var("GROUP_RANK") == "2"));
}

#[test]
fn a_killed_node_is_removed_and_the_rest_re_form_at_once() {
    let server = Server::start();
    let dir = scratch("lost");
    let conf = "last_call_timeout=1,keep_alive_interval=0.3,keep_alive_max_attempt=2";
    let env = [("RUN_FOR", "5")];
    let agents: Vec<Agent> = ["a", "b", "c"]
        .iter()
        .map(|n| elastic_agent(&server, &dir, n, "lost", "2:3", conf, &env))
        .collect();
    assert!(
        eventually(Duration::from_secs(20), || with_world(&records(&dir), 6)
            .len()
            == 6),
        "ran with 3 nodes"
    );
    let mut agents = agents.into_iter();
    let (a, b, c) = (
        agents.next().expect("a"),
        agents.next().expect("b"),
        agents.next().expect("c"),
    );
    let killed = Instant::now();
    c.signal("KILL");
    let _ = c.wait(LIMIT);
    assert!(
        eventually(Duration::from_secs(10), || with_world(&records(&dir), 4)
            .len()
            == 4),
        "re-formed with 2 nodes"
    );
    let reformed = killed.elapsed();
    assert!(
        reformed < Duration::from_secs(8),
        "survivors running again {reformed:?} after the kill"
    );
    for agent in [a, b] {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    assert!(with_world(&recs, 4)
        .iter()
        .all(|r| r.var("AGENT_TAG") != "c"));
    assert!(recs
        .iter()
        .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "0"));
}

#[test]
fn a_sub_second_drop_limit_keeps_running_agents_workers_alive() {
    // 0.1 s × 2: shorter than the guard's default beat; the agents beat
    // faster, so no guard takes a running agent for a frozen one.
    let server = Server::start();
    let dir = scratch("sub-second");
    let conf = "keep_alive_interval=0.1,keep_alive_max_attempt=2";
    let env = [("RUN_FOR", "2")];
    let agents: Vec<Agent> = ["a", "b"]
        .iter()
        .map(|n| elastic_agent(&server, &dir, n, "sub-second", "2", conf, &env))
        .collect();
    for agent in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert!(!out.stderr.contains("accel-guard"), "{}", out.stderr);
    }
    let recs = records(&dir);
    assert_eq!(recs.len(), 4, "one attempt of four workers");
    assert!(recs.iter().all(|r| r.end.is_some()), "each ran its 2 s");
}

#[test]
fn a_spare_takes_over_a_freed_slot() {
    let server = Server::start();
    let dir = scratch("spare");
    let conf = "keep_alive_interval=0.3,keep_alive_max_attempt=2";
    let env = [("RUN_FOR", "5")];
    let a = elastic_agent(&server, &dir, "a", "spare", "2", conf, &env);
    let b = elastic_agent(&server, &dir, "b", "spare", "2", conf, &env);
    assert!(
        eventually(Duration::from_secs(20), || records(&dir).len() == 4),
        "ran with 2 nodes"
    );
    let spare = elastic_agent(&server, &dir, "s", "spare", "2", conf, &env);
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(
            &spare.stderr
        )
        .unwrap_or_default()
        .contains("waiting as a spare")),
        "the third node says it waits as a spare"
    );
    assert_eq!(
        records(&dir).len(),
        4,
        "the spare does not disturb the running round"
    );
    b.signal("KILL");
    let _ = b.wait(LIMIT);
    for agent in [a, spare] {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    let spare_ranks: Vec<&Record> = recs.iter().filter(|r| r.var("AGENT_TAG") == "s").collect();
    assert_eq!(spare_ranks.len(), 2, "the spare ran in the freed slot");
    assert!(spare_ranks.iter().all(|r| r.var("GROUP_RANK") == "1"));
}

#[test]
fn min_never_reached_names_who_joined_and_what_is_missing() {
    let server = Server::start();
    let dir = scratch("min");
    let a = elastic_agent(&server, &dir, "a", "min", "2:3", "join_timeout=2", &[]);
    let out = a.wait(LIMIT);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("did not form"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("1 of 2..3 nodes ready, waiting for 1 more to join"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("joined: "), "{}", out.stderr);
}

#[test]
fn a_restarted_rdzv_server_relearns_the_job_without_restarting_workers() {
    // The restarted server binds the same address: a port known before.
    let port = accel_tests::Port::lease();
    let addr = port.loopback();
    let server = Server::start_at(&addr);
    let dir = scratch("relearn");
    let conf = "keep_alive_interval=2,reconnect_grace=20";
    let env = [("RUN_FOR", "8")];
    let agents: Vec<Agent> = ["a", "b"]
        .iter()
        .map(|n| elastic_agent(&server, &dir, n, "relearn", "2", conf, &env))
        .collect();
    assert!(
        eventually(Duration::from_secs(20), || records(&dir).len() == 4),
        "running"
    );
    server.signal("TERM");
    assert!(server.wait(Duration::from_secs(10)).success());
    let restarted = Server::start_at(&addr);
    for agent in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
        assert!(
            out.stderr
                .contains("reconnected; the round is still current"),
            "{}",
            out.stderr
        );
    }
    let recs = records(&dir);
    assert_eq!(recs.len(), 4, "no worker was restarted: {recs:#?}");
    assert!(recs
        .iter()
        .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "0"));
    drop(restarted);
}

/// The server is gone for longer than the job's drop limit (1 s): both
/// nodes stop their workers (fencing), and when it is back (relearning the
/// job from them, its round still current) they say so and the job re-forms
/// as for a membership change, without spending its restart budget of 0.
#[test]
fn workers_fenced_while_the_server_was_away_re_form_without_spending_restarts() {
    // The restarted server binds the same address: a port known before.
    let port = accel_tests::Port::lease();
    let addr = port.loopback();
    let server = Server::start_at(&addr);
    let dir = scratch("fenced");
    let conf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,reconnect_grace=30";
    // Long enough that the first round's workers are fenced before they end.
    let env = [("RUN_FOR", "5")];
    let agents: Vec<Agent> = ["a", "b"]
        .iter()
        .map(|n| elastic_agent(&server, &dir, n, "fenced", "2", conf, &env))
        .collect();
    assert!(
        eventually(Duration::from_secs(20), || records(&dir).len() == 4),
        "running"
    );
    let first: Vec<Record> = records(&dir);
    server.signal("KILL");
    let _ = server.wait(Duration::from_secs(10));
    // Both nodes fence their workers within the drop limit of the loss.
    assert!(
        eventually(Duration::from_secs(10), || first
            .iter()
            .all(|r| !alive(r.pid))),
        "the first round's workers were stopped without a rendezvous"
    );
    let restarted = Server::start_at(&addr);
    for agent in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(
            out.code(),
            0,
            "--max-restarts 0, yet the job finished\n{}",
            out.stderr
        );
    }
    let recs = records(&dir);
    assert_eq!(recs.len(), 8, "one more round of 4 workers: {recs:#?}");
    for r in &first {
        let again = recs.iter().find(|x| x.pid == r.pid).expect("its record");
        assert!(
            again.end.is_none(),
            "rank {} was killed, not finished",
            r.rank
        );
    }
    let second: Vec<&Record> = recs
        .iter()
        .filter(|r| first.iter().all(|f| f.pid != r.pid))
        .collect();
    let mut ranks: Vec<u32> = second.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3]);
    assert!(second
        .iter()
        .all(|r| r.end.is_some() && r.var("WORLD_SIZE") == "4"));
    assert!(
        recs.iter()
            .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "0"),
        "the fence spent no restart"
    );
    drop(restarted);
}

/// Three hosts in their own network namespaces; one host's link is cut (no
/// reset, packets just stop). The server drops it after the keep-alive limit
/// and the others re-form; the cut host cannot rejoin and stops its workers
/// when its reconnect grace expires.
#[test]
fn a_cut_host_is_dropped_and_stops_its_workers_after_its_grace() {
    let hosts: Vec<Netns> = (0..3).map(|_| Netns::create()).collect();
    // A server on a routable address needs a token; the agents present it.
    let token = "elastic-test-token-0123456789";
    let server = Server::start_with("0.0.0.0:0", &[], &[("RDZV_TOKEN", token)]);
    let port = server.addr.rsplit(':').next().expect("port").to_owned();
    let dir = scratch("netns");
    let conf =
        "last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=2,reconnect_grace=3,outage_timeout=3";
    let agents: Vec<Agent> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let tag = format!("h{i}");
            let endpoint = format!("{}:{port}", h.gateway);
            AgentCmd::c10d(&endpoint, "netns")
                .local_addr(&h.addr)
                .nnodes("2:3")
                .nproc(2)
                .conf(conf)
                .recording(&dir, &tag)
                .env("RECORD_EACH_ROUND", "1")
                .env("RUN_FOR", "10")
                .env("ACCEL_RDZV_TOKEN", token)
                .start_with(&h.exec(), &dir, &tag)
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(20), || with_world(&records(&dir), 6)
            .len()
            == 6),
        "ran on 3 hosts"
    );
    let cut_at = Instant::now();
    hosts[2].cut();
    assert!(
        eventually(Duration::from_secs(15), || with_world(&records(&dir), 4)
            .len()
            == 4),
        "the other two re-formed"
    );
    let reformed = cut_at.elapsed();
    let mut agents = agents.into_iter();
    let (a, b, cut) = (
        agents.next().expect("h0"),
        agents.next().expect("h1"),
        agents.next().expect("h2"),
    );
    let out = cut.wait(LIMIT);
    let stopped = cut_at.elapsed();
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("could not rejoin within 3 s"),
        "{}",
        out.stderr
    );
    // Fenced at the drop limit (1 s without a rendezvous), before the grace.
    assert!(
        out.stderr
            .contains("no rendezvous reached within the drop limit"),
        "{}",
        out.stderr
    );
    let recs = records(&dir);
    for r in recs.iter().filter(|r| r.var("AGENT_TAG") == "h2") {
        assert!(!alive(r.pid), "the cut host's worker {} is gone", r.rank);
        assert!(r.end.is_none(), "it was stopped before finishing its work");
    }
    assert!(with_world(&recs, 4)
        .iter()
        .all(|r| r.var("AGENT_TAG") != "h2"));
    for agent in [a, b] {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    eprintln!("cut link: survivors running again after {reformed:?}; cut host's workers stopped after {stopped:?}");
}

#[test]
fn a_node_failing_its_health_check_stays_out_and_the_job_runs_without_it() {
    let server = Server::start();
    let dir = scratch("health");
    let sick = dir.join("sick");
    let sick_s = sick.to_str().expect("path");
    let job = |check: Option<String>| {
        let c = AgentCmd::c10d(&server.addr, "health")
            .nnodes("1:2")
            .nproc(1)
            .max_restarts(1)
            .conf("last_call_timeout=1")
            .env("SICK", sick_s);
        let c = match check {
            Some(cmd) => c.flag("--health-check", cmd),
            None => c,
        };
        c.no_python(accel_tests::worker("sick_node.sh"), &[])
    };
    // A node that is unhealthy from the start never joins: it waits as a spare.
    let never = job(Some("exit 3".into())).start(&dir, "never");
    // This one is healthy until the first attempt's failure makes it sick;
    // the other has no check.
    let check = format!("if [ -e {sick_s} ]; then echo fan failure >&2; exit 1; fi");
    let b = job(Some(check)).start(&dir, "b");
    let a = job(None).start(&dir, "a");
    let out = a.wait(LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let log = std::fs::read_to_string(dir.join("sick.log")).expect("the restarted round ran");
    assert_eq!(
        log.trim(),
        "world 1 attempt 1",
        "the restart ran without the sick node"
    );
    // The sick node left the job and checks again; it is stopped here.
    b.signal("TERM");
    let out = b.wait(LIMIT);
    assert!(
        out.stderr.contains("failed its health check") && out.stderr.contains("fan failure"),
        "{}",
        out.stderr
    );
    never.signal("TERM");
    let out = never.wait(LIMIT);
    assert!(
        out.stderr.contains("this node is unhealthy") && out.stderr.contains("exited with code 3"),
        "{}",
        out.stderr
    );
    assert_eq!(
        out.stderr.matches("this node is unhealthy").count(),
        1,
        "an unchanged reason is said once:\n{}",
        out.stderr
    );
    assert!(!out.stderr.contains("round formed"), "{}", out.stderr);
}

/// F8 of the chaos run: a spare cut off from the rendezvous (here: paused
/// past the drop limit, so the server drops it) while the job succeeds comes
/// back to a job that is over. It belonged to the job, so it is told the
/// outcome and exits 0 at once (it used to exit 1, "has already
/// succeeded"). Agents started before the end that join after it (held back
/// by a slow health check): one on the job's host exits 0, told the outcome;
/// one of another host is refused, with the outcome and the fix. Agents
/// started after the end (the same command typed again) run the job anew.
#[test]
fn a_spare_cut_off_when_the_job_succeeded_exits_0_and_a_stranger_is_refused() {
    let server = Server::start();
    let dir = scratch("tomb-spare");
    let conf = "keep_alive_interval=0.5,keep_alive_max_attempt=2,reconnect_grace=30";
    let env = [("RUN_FOR", "4")];
    let agent = |name: &str| {
        AgentCmd::c10d(&server.addr, "tomb")
            .nnodes("2")
            .nproc(1)
            .conf(conf)
            .recording(&dir, name)
            .envs(&env)
    };
    // Started now, joining once `go` exists: late nodes of this run.
    let go = dir.join("go");
    let slow = format!("while [ ! -e {} ]; do sleep 0.1; done", go.display());
    let late = agent("d").flag("--health-check", &slow).start(&dir, "d");
    let stranger =
        agent("e")
            .flag("--health-check", &slow)
            .start_with(&accel_tests::STRANGER_HOST, &dir, "e");
    let a = agent("a").start(&dir, "a");
    let b = agent("b").start(&dir, "b");
    assert!(
        eventually(Duration::from_secs(30), || records(&dir).len() == 2),
        "the round of two runs"
    );
    let spare = agent("c").start(&dir, "c");
    let said =
        |a: &Agent, what: &str| std::fs::read_to_string(&a.stderr).is_ok_and(|t| t.contains(what));
    assert!(
        eventually(Duration::from_secs(10), || said(&spare, "spare")),
        "the third agent waits as a spare"
    );
    spare.signal("STOP");
    for (n, out) in [("a", a.wait(LIMIT)), ("b", b.wait(LIMIT))] {
        assert_eq!(out.code(), 0, "{n}: {}", out.stderr);
    }
    let back = Instant::now();
    spare.signal("CONT");
    let out = spare.wait(Duration::from_secs(30));
    assert_eq!(
        out.code(),
        0,
        "the spare belonged to the job: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("job 'tomb' already succeeded at")
            && out.stderr.contains("nothing to do"),
        "{}",
        out.stderr
    );
    assert!(
        back.elapsed() < Duration::from_secs(15),
        "told at once, not after a timeout"
    );
    assert_eq!(records(&dir).len(), 2, "no worker started again");

    std::fs::write(&go, b"").expect("go");
    // A late agent of a host of the job (a new node id, same host).
    let out = late.wait(Duration::from_secs(30));
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(out.stderr.contains("nothing to do"), "{}", out.stderr);

    // Another host (its own UTS namespace) never belonged: refused.
    let out = stranger.wait(Duration::from_secs(30));
    assert_ne!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("job 'tomb' already succeeded at")
            && out.stderr.contains("took no part")
            && out.stderr.contains("another --rdzv-id"),
        "{}",
        out.stderr
    );
    assert_eq!(records(&dir).len(), 2, "no worker started again");

    // The same command again, on this host and another: a new run.
    let first: Vec<u32> = records(&dir).iter().map(|r| r.pid).collect();
    let f = agent("f").start(&dir, "f");
    let g = agent("g").start_with(&accel_tests::STRANGER_HOST, &dir, "g");
    for (n, out) in [("f", f.wait(LIMIT)), ("g", g.wait(LIMIT))] {
        assert_eq!(out.code(), 0, "{n}: {}", out.stderr);
        assert!(
            out.stderr.contains("job 'tomb' succeeded at")
                && out.stderr.contains("starting a new run"),
            "{n}: {}",
            out.stderr
        );
    }
    let again = records(&dir);
    assert!(
        again.len() == 2 && again.iter().all(|r| !first.contains(&r.pid)),
        "the new run's two workers ran (the earlier run's were {first:?}): {:?}",
        again.iter().map(|r| r.pid).collect::<Vec<_>>()
    );
}

/// Kubernetes node loss, as far as one host can play it: a node of a
/// fixed-size job goes silent (its kubelet and pod unreachable: the agent is
/// frozen with SIGSTOP), and a replacement agent joins under a new node id
/// (the pod the Job starts once the old one is gone). The frozen node's
/// worker is dead (killed by its guard) before the replacement's starts, so
/// no rank runs twice; the job goes on with the replacement without
/// spending its restart budget (it has none); and when the frozen pod is
/// finally removed (SIGKILL), nothing changes.
#[test]
fn a_frozen_node_s_replacement_takes_its_place_and_no_rank_runs_twice() {
    let server = Server::start();
    let dir = scratch("node-loss");
    // A 1 s drop limit; the survivors wait up to 120 s for a replacement.
    let conf = "keep_alive_interval=0.25,keep_alive_max_attempt=4,join_timeout=120";
    let agent = |name: &str| {
        AgentCmd::c10d(&server.addr, "node-loss")
            .nnodes("2")
            .nproc(1)
            .max_restarts(0)
            .conf(conf)
            .recording(&dir, name)
            .env("RECORD_EACH_ROUND", "1")
            .env("RUN_FOR", "600")
    };
    let of = |tag: &str| -> Vec<Record> {
        records(&dir)
            .into_iter()
            .filter(|r| r.var("AGENT_TAG") == tag)
            .collect()
    };
    let a = agent("a").start(&dir, "a");
    let b = agent("b").start(&dir, "b");
    assert!(
        eventually(Duration::from_secs(60), || of("a").len() == 1
            && of("b").len() == 1),
        "the round of two runs: {:?}",
        records(&dir)
    );
    let frozen: Vec<u32> = of("b")
        .iter()
        .flat_map(|r| std::iter::once(r.pid).chain(r.children.clone()))
        .collect();
    // When the frozen node's processes were last seen alive, watched from
    // another thread while the replacement comes.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (frozen, watching) = (frozen.clone(), watching.clone());
        std::thread::spawn(move || {
            let mut last_alive = None;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                if frozen.iter().any(|p| alive(*p)) {
                    last_alive = Some(std::time::SystemTime::now());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            last_alive
        })
    };
    b.signal("STOP");
    let replacement = agent("b2").start(&dir, "b2");
    assert!(
        eventually(Duration::from_secs(60), || of("b2").len() == 1
            && of("a").len() == 2),
        "the job re-forms with the replacement: {:?}",
        records(&dir)
    );
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let last_alive = watcher.join().expect("watcher").expect("seen alive");
    let last_alive = last_alive
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs_f64();
    let started = of("b2")[0].start;
    assert!(
        last_alive < started,
        "the frozen node's worker was alive at {last_alive}, after the replacement's started at {started}"
    );
    // One world of two ranks, each once; nothing of the budget spent.
    let round: Vec<Record> = of("b2")
        .into_iter()
        .chain(
            of("a")
                .into_iter()
                .max_by(|x, y| x.start.total_cmp(&y.start)),
        )
        .collect();
    let mut ranks: Vec<u32> = round.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1], "{round:?}");
    assert!(
        round
            .iter()
            .all(|r| r.restart == 0 && r.var("WORLD_SIZE") == "2"),
        "{round:?}"
    );
    // The frozen pod removed at last: the job runs on, as it was.
    b.signal("KILL");
    let _ = b.wait(LIMIT);
    std::thread::sleep(Duration::from_secs(2));
    let jobs = accel_tests::status_jobs(&server.addr, &[]).expect("status");
    assert_eq!(jobs[0]["phase"], "running", "{jobs:?}");
    assert_eq!(jobs[0]["restart_count"], 0, "{jobs:?}");
    // a's two rounds, b's first, b2's.
    assert_eq!(records(&dir).len(), 4, "no worker started again");
    for x in [a, replacement] {
        x.signal("TERM");
        let _ = x.wait(LIMIT);
    }
}

/// `--nnodes 2:8 --nnodes-multiple-of 2` with five agents: the round takes
/// four (world 8) and the fifth waits as a ready spare; killing one of the
/// four re-forms a round of four with the spare at once, spending nothing
/// of the restart budget. The spare waits longer than `join_timeout` first:
/// a spare of a running round is not late, and stays.
#[test]
fn rounds_take_a_multiple_of_k_nodes_and_a_ready_spare_fills_a_lost_place() {
    let server = Server::start();
    let dir = scratch("multiple-of");
    let conf =
        "last_call_timeout=1,keep_alive_interval=0.3,keep_alive_max_attempt=2,join_timeout=5";
    let env = [("RUN_FOR", "14")];
    let tags = ["a", "b", "c", "d", "e"];
    let agents: Vec<Agent> = tags
        .iter()
        .map(|n| {
            AgentCmd::c10d(&server.addr, "pairs")
                .nnodes("2:8")
                .flag("--nnodes-multiple-of", 2)
                .nproc(2)
                .conf(conf)
                .recording(&dir, n)
                .env("RECORD_EACH_ROUND", "1")
                .envs(&env)
                .start(&dir, n)
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(30), || with_world(&records(&dir), 8)
            .len()
            == 8),
        "ran with 4 nodes"
    );
    let recs = records(&dir);
    let running: std::collections::BTreeSet<&str> =
        recs.iter().map(|r| r.var("AGENT_TAG")).collect();
    assert_eq!(running.len(), 4, "four nodes run: {running:?}");
    assert!(
        recs.iter().all(|r| r.var("WORLD_SIZE") == "8"),
        "no other world ran"
    );
    let spare = *tags
        .iter()
        .find(|t| !running.contains(**t))
        .expect("a fifth agent waits");
    let mut agents: std::collections::BTreeMap<&str, Agent> =
        tags.iter().copied().zip(agents).collect();
    let spare_agent = &agents[spare];
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(
            &spare_agent.stderr
        )
        .unwrap_or_default()
        .contains("waiting as a spare")),
        "the fifth says it waits as a spare"
    );
    // Past join_timeout (5 s) since the round formed: the spare is still there.
    std::thread::sleep(Duration::from_secs(7));
    let spare_agent = agents.get_mut(spare).expect("the spare");
    assert!(
        spare_agent.running(),
        "the spare left after join_timeout: {}",
        std::fs::read_to_string(&spare_agent.stderr).unwrap_or_default()
    );
    let victim = *running.iter().next().expect("a running node");
    let killed = Instant::now();
    agents.remove(victim).expect("victim").signal("KILL");
    assert!(
        eventually(Duration::from_secs(10), || records(&dir)
            .iter()
            .any(|r| r.var("AGENT_TAG") == spare)),
        "the spare runs in the lost node's place"
    );
    let took = killed.elapsed();
    eprintln!("multiple-of: the spare's workers ran {took:?} after the kill");
    assert!(
        took < Duration::from_secs(3),
        "the spare took over in {took:?}"
    );
    for (_, agent) in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    assert!(
        recs.iter().all(|r| r.var("WORLD_SIZE") == "8"),
        "every round ran with four nodes"
    );
    assert!(
        recs.iter()
            .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "0"),
        "no restart counted"
    );
}

/// `--nnodes 2:4 --scale-up-settle 3`: a round of two runs; two more nodes
/// arrive a second apart; the round re-forms once, to four nodes, about
/// three seconds after the first of them (without the settle time, each
/// arrival re-forms it: 2, 3, then 4 nodes), and nothing is spent.
#[test]
fn nodes_that_arrive_one_by_one_cost_one_re_form_with_a_settle_time() {
    let server = Server::start();
    let dir = scratch("settle");
    let conf = "last_call_timeout=1,keep_alive_interval=0.3,keep_alive_max_attempt=2";
    let start = |tag: &str| {
        AgentCmd::c10d(&server.addr, "settle")
            .nnodes("2:4")
            .flag("--scale-up-settle", 3)
            .nproc(2)
            .conf(conf)
            .recording(&dir, tag)
            .env("RECORD_EACH_ROUND", "1")
            .env("RUN_FOR", "10")
            .start(&dir, tag)
    };
    let mut agents = vec![start("a"), start("b")];
    assert!(
        eventually(Duration::from_secs(30), || with_world(&records(&dir), 4)
            .len()
            == 4),
        "a round of two runs"
    );
    let first = Instant::now();
    agents.push(start("c"));
    std::thread::sleep(Duration::from_secs(1));
    agents.push(start("d"));
    assert!(
        eventually(Duration::from_secs(15), || with_world(&records(&dir), 8)
            .len()
            == 8),
        "the round grew to four nodes"
    );
    let took = first.elapsed();
    eprintln!("settle: the round of four ran {took:?} after the first newcomer");
    assert!(
        took >= Duration::from_secs(3),
        "grew only after the settle time: {took:?}"
    );
    for agent in agents {
        let out = agent.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    assert!(with_world(&recs, 6).is_empty(), "never a round of three");
    assert!(
        recs.iter()
            .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "0"),
        "nothing spent"
    );
    // One re-form: the first round's four workers and the second's eight.
    assert_eq!(
        (
            with_world(&recs, 4).len(),
            with_world(&recs, 8).len(),
            recs.len()
        ),
        (4, 8, 12)
    );
}
