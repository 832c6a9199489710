//! Environment contract and rank layout in each rendezvous mode.

use std::time::Duration;

use accel_tests::{record_script, records, scratch, Agent, AgentCmd, Port, Server};

use crate::check_layout;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn standalone_one_node_two_workers() {
    let dir = scratch("standalone");
    let out = AgentCmd::new()
        .nproc(2)
        .record_env(&dir, "only")
        .program(record_script(), &["--out=o${local_rank}", "plain"])
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let recs = records(&dir);
    check_layout(&recs, 1, 2, 0, 0);
    assert_eq!(recs[0].var("MASTER_ADDR"), "127.0.0.1");
    assert_eq!(recs[0].argv, ["--out=o0", "plain"]);
    assert_eq!(recs[1].argv, ["--out=o1", "plain"]);
    // A standalone run gets a fresh UUID run id.
    assert_eq!(recs[0].var("TORCHELASTIC_RUN_ID").len(), 36);
}

#[test]
fn static_three_nodes_ranks_follow_node_rank() {
    let dir = scratch("static");
    let port = Port::lease();
    // Start the non-zero ranks first: they wait for node rank 0 to serve.
    let agents: Vec<Agent> = [2, 1, 0]
        .iter()
        .map(|rank: &u32| {
            let tag = format!("node{rank}");
            // torchrun's underscore spellings, as this test has always given them.
            AgentCmd::new()
                .nnodes(3)
                .flag("--nproc_per_node", 2)
                .flag("--node_rank", rank)
                .flag("--master_addr", "127.0.0.1")
                .flag("--master_port", &port)
                .flag("--rdzv-id", "static-job")
                .recording(&dir, &tag)
                .start(&dir, &tag)
        })
        .collect();
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    check_layout(&recs, 3, 2, 0, 0);
    for r in &recs {
        assert_eq!(
            r.var("AGENT_TAG"),
            format!("node{}", r.var("GROUP_RANK")),
            "static node ranks are the given ones"
        );
        assert_eq!(r.var("TORCHELASTIC_RUN_ID"), "static-job");
        assert_eq!(r.var("MASTER_ADDR"), "127.0.0.1");
    }
}

#[test]
fn c10d_three_agents_on_rdzv_server() {
    let server = Server::start();
    let dir = scratch("c10d");
    let job = AgentCmd::c10d(&server.addr, "c10d-job").nnodes(3).nproc(2);
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let tag = format!("agent{i}");
            job.clone().recording(&dir, &tag).start(&dir, &tag)
        })
        .collect();
    for a in agents {
        let out = a.wait(LIMIT);
        assert_eq!(out.code(), 0, "{}", out.stderr);
    }
    let recs = records(&dir);
    check_layout(&recs, 3, 2, 0, 0);
    assert_eq!(recs[0].var("TORCHELASTIC_RUN_ID"), "c10d-job");
    assert_eq!(
        recs[0].var("MASTER_ADDR"),
        "127.0.0.1",
        "--local-addr of the node-rank-0 agent"
    );
}

#[test]
fn pet_environment_fallbacks_and_no_python() {
    let dir = scratch("pet");
    let script = record_script();
    // PET_NPROC_PER_NODE supplies --nproc-per-node; PET_NO_PYTHON runs the program directly.
    let out = AgentCmd::new()
        .program("python3", &["-u", script.to_str().expect("path")])
        .record_env(&dir, "t")
        .env("PET_NPROC_PER_NODE", "3")
        .env("PET_NO_PYTHON", "1")
        .run(&dir, "agent", LIMIT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    check_layout(&records(&dir), 1, 3, 0, 0);
}

#[test]
fn the_agent_raises_its_open_file_limit_for_the_store() {
    let dir = scratch("nofile");
    let out = AgentCmd::new()
        .no_python("sh", &["-c", "ulimit -Sn; ulimit -Hn"])
        .command_with(&["sh", "-c", "ulimit -Sn 256 && exec \"$0\" \"$@\""])
        .current_dir(&dir)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let limits: Vec<&str> = text.lines().collect();
    assert_eq!(limits.len(), 2, "{text}");
    assert_eq!(
        limits[0], limits[1],
        "soft limit raised to the hard limit: {text}"
    );
    assert_ne!(limits[0], "256");
}
