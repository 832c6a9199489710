//! A control-plane outage costs no training: while the rendezvous is paused,
//! killed or gone, a round whose nodes still hear each other (through the
//! round's peer hub) keeps every worker; the job is running again as soon
//! as the rendezvous is back, and a worker failure during the outage
//! restarts the job exactly once then.
//!
//! The jobs use a 4 s drop limit (`keep_alive_interval=1`, four attempts),
//! so an outage of 10 s is more than two drop limits: without the peer hub
//! every node would have fenced its workers twice over.

use std::time::{Duration, Instant};

use accel_tests::{
    alive, all_alive_for, eventually, job_running, records, scratch, Agent, AgentCmd, Record,
    Server,
};

const LIMIT: Duration = Duration::from_secs(90);
const CONF: &str = "keep_alive_interval=1,keep_alive_max_attempt=4";
const OUTAGE: Duration = Duration::from_secs(10);

fn agents(server: &str, dir: &std::path::Path, job: &str, env: &[(&str, &str)]) -> Vec<Agent> {
    ["a", "b"]
        .iter()
        .map(|n| {
            AgentCmd::c10d(server, job)
                .nnodes("2")
                .nproc(2)
                .max_restarts(3)
                .conf(CONF)
                .recording(dir, n)
                .env("RECORD_EACH_ROUND", "1")
                .envs(env)
                .start(dir, n)
        })
        .collect()
}

/// The job's four workers, once they run.
fn running(dir: &std::path::Path) -> Vec<Record> {
    assert!(
        eventually(Duration::from_secs(30), || records(dir).len() == 4),
        "the job runs"
    );
    records(dir)
}

/// How long after `back` the rendezvous at `endpoint` (with `env`: its
/// token) reports `job` running round `round` with `nodes` nodes again.
fn running_again(
    endpoint: &str,
    env: &[(&str, &str)],
    job: &str,
    round: u64,
    nodes: usize,
    back: Instant,
) -> Duration {
    assert!(
        eventually(Duration::from_secs(20), || job_running(
            endpoint, env, job, round, nodes
        )),
        "the job is running again in `rdzv-server status`"
    );
    back.elapsed()
}

#[test]
fn a_paused_rendezvous_stops_no_worker() {
    let server = Server::start();
    let dir = scratch("outage-pause");
    let agents = agents(&server.addr, &dir, "pause", &[("RUN_FOR", "60")]);
    let first = running(&dir);
    server.signal("STOP");
    all_alive_for(&first, OUTAGE);
    server.signal("CONT");
    let back = Instant::now();
    let took = running_again(&server.addr, &[], "pause", 0, 2, back);
    assert!(
        took < Duration::from_secs(2),
        "running again after {took:?}"
    );
    assert_eq!(records(&dir).len(), 4, "no worker was started again");
    drop(agents);
    eprintln!("paused {OUTAGE:?}: 0 workers stopped; running again {took:?} after the server woke");
}

#[test]
fn a_killed_rendezvous_restarted_empty_stops_no_worker() {
    let port = accel_tests::Port::lease();
    let addr = port.loopback();
    let server = Server::start_at(&addr);
    let dir = scratch("outage-kill");
    let agents = agents(&server.addr, &dir, "kill", &[("RUN_FOR", "60")]);
    let first = running(&dir);
    server.signal("KILL");
    all_alive_for(&first, OUTAGE);
    let restarted = Server::start_at(&addr);
    let back = Instant::now();
    let took = running_again(&restarted.addr, &[], "kill", 0, 2, back);
    assert!(
        took < Duration::from_secs(2),
        "running again after {took:?}"
    );
    all_alive_for(&first, Duration::from_secs(2));
    assert_eq!(records(&dir).len(), 4, "no worker was started again");
    drop(agents);
    eprintln!("killed, restarted empty after {OUTAGE:?}: 0 workers stopped; running again {took:?} after the restart");
}

#[test]
fn a_worker_failure_during_the_outage_restarts_the_job_once_when_it_is_back() {
    let port = accel_tests::Port::lease();
    let addr = port.loopback();
    let server = Server::start_at(&addr);
    let dir = scratch("outage-failure");
    // Rank 3 fails 4 s into its first attempt (while the server is gone);
    // the second attempt runs to its end.
    let env = [
        ("RUN_FOR", "30"),
        ("FAIL_RANKS", "3"),
        ("FAIL_UNTIL", "1"),
        ("FAIL_AFTER", "4"),
    ];
    let agents = agents(&server.addr, &dir, "failure", &env);
    let first = running(&dir);
    server.signal("KILL");
    assert!(
        eventually(OUTAGE, || first
            .iter()
            .any(|r| r.rank == 3 && !alive(r.pid))),
        "rank 3 failed"
    );
    // The failing node stops its own other worker; the other node's keep
    // running: nobody can restart the job until the rendezvous is back.
    let other: Vec<&Record> = first.iter().filter(|r| r.rank < 2).collect();
    std::thread::sleep(OUTAGE / 2);
    assert!(
        other.iter().all(|r| alive(r.pid)),
        "node 0's workers still run"
    );
    let restarted = Server::start_at(&addr);
    let back = Instant::now();
    let took = running_again(&restarted.addr, &[], "failure", 1, 2, back);
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    assert_eq!(recs.len(), 8, "one restart of the four workers: {recs:#?}");
    assert!(
        recs.iter()
            .filter(|r| first.iter().all(|f| f.pid != r.pid))
            .all(|r| r.var("TORCHELASTIC_RESTART_COUNT") == "1"),
        "the failure spent the budget once"
    );
    eprintln!("a failure while the rendezvous was down: restarted once, running again {took:?} after it came back");
}

/// Three hosts on one segment; one host's packets to the rendezvous are
/// dropped (its peers still reach it, and it reaches them): its workers run
/// on, vouched for by its peers' keep-alives, and it resumes when the path
/// heals. (A host cut off from everything is fenced: `elastic.rs`.)
#[test]
fn a_node_cut_off_from_the_rendezvous_alone_keeps_its_workers() {
    let lan = accel_tests::Lan::create();
    let hosts: Vec<accel_tests::Netns> = (2..5).map(|i| lan.host(i)).collect();
    let token = "outage-test-token-0123456789";
    let server = Server::start_with(&format!("{}:0", lan.gateway), &[], &[("RDZV_TOKEN", token)]);
    let port = server.addr.rsplit(':').next().expect("port").to_owned();
    let dir = scratch("outage-one-cut");
    let agents: Vec<Agent> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let tag = format!("h{i}");
            AgentCmd::c10d(&server.addr, "one-cut")
                .local_addr(&h.addr)
                .nnodes("3")
                .nproc(1)
                .conf(CONF)
                .recording(&dir, &tag)
                .env("RECORD_EACH_ROUND", "1")
                .env("RUN_FOR", "60")
                .env("ACCEL_RDZV_TOKEN", token)
                .start_with(&h.exec(), &dir, &tag)
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(30), || records(&dir).len() == 3),
        "the job runs"
    );
    let first = records(&dir);
    let cut = &hosts[2];
    cut.nft(&format!(
        "table inet accel_cut {{\n  chain out {{\n    type filter hook output priority 0;\n    ip daddr {} tcp dport {port} drop\n  }}\n}}\n",
        lan.gateway
    ));
    all_alive_for(&first, OUTAGE);
    cut.nft("delete table inet accel_cut\n");
    let back = Instant::now();
    let took = running_again(
        &server.addr,
        &[("ACCEL_RDZV_TOKEN", token)],
        "one-cut",
        0,
        3,
        back,
    );
    assert_eq!(records(&dir).len(), 3, "no worker was started again");
    all_alive_for(&first, Duration::from_secs(1));
    drop(agents);
    eprintln!("one host cut off from the rendezvous for {OUTAGE:?}: 0 workers stopped; running again {took:?} after the path healed");
}
