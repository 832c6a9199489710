//! Bad input gets a clear error: bad flags exit 2 naming them; nodes that
//! disagree are rejected naming both values; an unreachable endpoint is
//! retried until join_timeout.

use std::time::Duration;

use accel_tests::{poll_until, run_agent, scratch, status_jobs, AgentCmd, Port, Server};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let dir = scratch("flags");
    let cases: &[(&[&str], &str)] = &[
        (&["--nproc-per-node", "many", "t.py"], "--nproc-per-node"),
        (&["--nnodes", "2:1", "t.py"], "--nnodes"),
        (&["--max-restarts", "-1", "t.py"], "--max-restarts"),
        (&["--rdzv-conf", "join_timout=5", "t.py"], "join_timout"),
        (
            &["--rdzv-backend", "zk", "--nnodes", "2", "t.py"],
            "--rdzv-backend",
        ),
        (&["--no-such-flag", "t.py"], "--no-such-flag"),
        (
            &["--monitor-interval", "soon", "t.py"],
            "--monitor-interval",
        ),
        (&["--no-python", "-m", "t"], "--no-python"),
    ];
    for (i, (args, needle)) in cases.iter().enumerate() {
        let out = run_agent(&dir, &format!("c{i}"), args, &[], LIMIT);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(needle),
            "{args:?} should name {needle}: {}",
            out.stderr
        );
    }
}

#[test]
fn agents_that_disagree_on_nnodes_or_nproc_are_rejected() {
    let server = Server::start();
    let dir = scratch("mismatch");
    let base = AgentCmd::c10d_no_local_addr(&server.addr, "mm").no_python("true", &[]);
    let first = base.clone().nnodes(2).nproc(2).start(&dir, "first");
    // The job's size is the first node's: the others come once it joined.
    poll_until("the first node joined", LIMIT, || {
        let jobs = status_jobs(&server.addr, &[])?;
        match jobs.iter().find(|j| j["job_id"] == "mm") {
            Some(j) if j["node_count"] == 1 => Ok(()),
            _ => Err(format!("{jobs:?}")),
        }
    });
    for (name, (nnodes, nproc), want) in [
        ("nnodes", (3, 2), ["--nnodes 2", "--nnodes 3"]),
        (
            "nproc",
            (2, 4),
            ["--nproc-per-node 2", "--nproc-per-node 4"],
        ),
    ] {
        let out = base
            .clone()
            .nnodes(nnodes)
            .nproc(nproc)
            .run(&dir, name, LIMIT);
        assert_eq!(out.code(), 2, "{}", out.stderr);
        for w in want {
            assert!(out.stderr.contains(w), "message names {w}: {}", out.stderr);
        }
    }
    first.signal("TERM");
    assert_eq!(first.wait(LIMIT).code(), 128 + 15);
}

#[test]
fn a_duplicate_static_node_rank_is_rejected_by_name() {
    let dir = scratch("duprank");
    let port = Port::lease();
    let node = |rank: u32| {
        AgentCmd::static_node(&port, rank)
            .nnodes(3)
            .master_addr("127.0.0.1")
            .no_python("true", &[])
    };
    let host = node(0).start(&dir, "rank0");
    let one = node(1).start(&dir, "rank1");
    // Rank 1 holds its rank in node rank 0's rendezvous before the duplicate comes.
    poll_until("node ranks 0 and 1 joined", LIMIT, || {
        let jobs = status_jobs(&port.loopback(), &[])?;
        match jobs.as_slice() {
            [j] if j["node_count"] == 2 => Ok(()),
            _ => Err(format!("{jobs:?}")),
        }
    });
    let out = node(1).run(&dir, "dup", LIMIT);
    assert_eq!(out.code(), 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("node rank 1 is already taken"),
        "{}",
        out.stderr
    );
    one.signal("TERM");
    host.signal("TERM");
    assert_eq!(one.wait(LIMIT).code(), 128 + 15);
    assert_eq!(host.wait(LIMIT).code(), 128 + 15);
}

#[test]
fn an_unreachable_endpoint_is_retried_until_join_timeout() {
    let dir = scratch("unreachable");
    // Leased, so nothing listens there for the whole test.
    let nobody = Port::lease();
    let endpoint = nobody.loopback();
    let started = std::time::Instant::now();
    let out = AgentCmd::c10d_no_local_addr(&endpoint, "x")
        .nnodes(2)
        .conf("join_timeout=2")
        .conf("is_host=false")
        .no_python("true", &[])
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "kept retrying until join_timeout"
    );
    assert!(
        out.stderr.contains("waiting for the rendezvous"),
        "prints what it waits for: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&endpoint),
        "names the endpoint: {}",
        out.stderr
    );
}
